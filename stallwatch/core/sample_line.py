"""One sample line of Prometheus' text format: its name, its label set and its value.

`split_sample` reads a line a parse has chosen; a line that is not a sample raises
`MalformedLine`, which the parse counts and skips. Spaces or tabs may stand between a name and
its `{`, between labels, and before the value; in a label value a backslash escapes the
character after it (`n`: a newline).
"""

from __future__ import annotations

import re


class MalformedLine(ValueError):
    """A sample line that is not one: the message says what is wrong with it."""


# One label without a backslash in its value, as the loop below reads it: separators skipped,
# not the set's end, the name up to the first "=", a quoted value.
_PLAIN_LABEL = re.compile(r'[ \t,]*+(?!\})([^=]*)="([^"\\]*)"')


def parse_labels(text: str, start: int, *, plain_first: bool = True) -> tuple[dict[str, str], int]:
    """Parse `{a="x",b="y"}` starting at the `{`; return the labels and the index after `}`.
    The labels without a backslash are matched in C first (unless not `plain_first`), the
    rest read character by character."""
    labels: dict[str, str] = {}
    position = start + 1
    length = len(text)
    while plain_first and (plain := _PLAIN_LABEL.match(text, position)) is not None:
        labels[plain[1].strip()] = plain[2]
        position = plain.end()
    while True:
        while position < length and text[position] in " \t,":
            position += 1
        if position >= length:
            raise MalformedLine("unterminated label set")
        if text[position] == "}":
            return labels, position + 1
        equals = text.find("=", position)
        if equals < 0 or equals + 1 >= length or text[equals + 1] != '"':
            raise MalformedLine("label without a quoted value")
        name = text[position:equals].strip()
        position = equals + 2
        value_chars: list[str] = []
        while True:
            if position >= length:
                raise MalformedLine("unterminated label value")
            char = text[position]
            if char == "\\" and position + 1 < length:
                escaped = text[position + 1]
                value_chars.append("\n" if escaped == "n" else escaped)
                position += 2
                continue
            if char == '"':
                position += 1
                break
            value_chars.append(char)
            position += 1
        labels[name] = "".join(value_chars)


def parse_value(text: str) -> float:
    """A sample's value from the text after its name and labels (a timestamp after it is
    ignored)."""
    try:
        return float(text)  # the value alone, blanks around it (float strips what split cuts)
    except ValueError:
        pass
    fields = text.split()
    if not fields:
        raise MalformedLine("no value")
    try:
        return float(fields[0])
    except ValueError as error:
        raise MalformedLine(f"bad value {fields[0]!r}") from error


# Where a sample's name ends, as Prometheus' text format reads it: at "{" or a blank (space or
# tab); blanks may stand between the name and "{", and between the labels and the value.
NAME_END = re.compile(r"[{ \t]")
_BLANKS = re.compile(r"[ \t]*")


# A sample's name and labels by its line's text up to the label set's "}": a server's lines
# come back at every read with only their values changed, so each label set is parsed once.
# The label dicts kept here are shared: nothing changes them once parsed.
KNOWN_HEADS: dict[str, tuple[str, dict[str, str]]] = {}
MAX_KNOWN_HEADS = 16384


def split_sample(line: str) -> tuple[str, dict[str, str], float]:
    """A stripped sample line's name, labels and value."""
    close = line.rfind("}")
    if close >= 0 and (known := KNOWN_HEADS.get(line[: close + 1])) is not None:
        return known[0], known[1], parse_value(line[close + 1 :])
    end = NAME_END.search(line)
    if end is None:
        raise MalformedLine("no value")
    name = line[: end.start()]
    brace = _BLANKS.match(line, end.start()).end()  # type: ignore[union-attr]
    if brace < len(line) and line[brace] == "{":
        labels, after = parse_labels(line, brace)
        value = parse_value(line[after:])
        if after == close + 1:  # the last "}" closes the label set: the head is known now
            if len(KNOWN_HEADS) >= MAX_KNOWN_HEADS:
                KNOWN_HEADS.clear()
            KNOWN_HEADS[line[:after]] = (name, labels)
        return name, labels, value
    return name, {}, parse_value(line[end.start() :])
