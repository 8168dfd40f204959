"""Text from outside (labels, target spellings, details) made safe to log or print."""

from __future__ import annotations


def printable(text: str) -> str:
    """`text` with control and invisible characters escaped, safe for a log or a terminal
    (a label holding ESC or a newline could otherwise forge lines)."""
    if text.isprintable():
        return text
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in text
    )
