"""How the Kubernetes API server reads the times in a JSON body, for the fake API.

kube-apiserver v1.32 decodes `metav1.Time` with Go's `time.Parse(time.RFC3339, s)`
(staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/time.go, `Time.UnmarshalJSON`) and
`metav1.MicroTime` with `time.Parse(RFC3339Micro, s)`, RFC3339Micro being
"2006-01-02T15:04:05.000000Z07:00" (.../meta/v1/micro_time.go, `MicroTime.UnmarshalJSON`).
A layout's ".000000" takes exactly six digits: a whole-second time (Python's `isoformat()`
with microsecond 0) is refused. This is Go's parser (src/time/format.go, go1.23, the Go of
v1.32) for these two layouts, with its error messages, so the fake refuses what the real
API refuses and says it the same way.
"""

from __future__ import annotations

import calendar

RFC3339 = "2006-01-02T15:04:05Z07:00"
RFC3339_MICRO = "2006-01-02T15:04:05.000000Z07:00"

# The layouts as Go's nextStdChunk splits them: literals and std elements, in order.
_CHUNKS: dict[str, tuple[tuple[str, str], ...]] = {
    RFC3339: (
        ("std", "2006"),
        ("lit", "-"),
        ("std", "01"),
        ("lit", "-"),
        ("std", "02"),
        ("lit", "T"),
        ("std", "15"),
        ("lit", ":"),
        ("std", "04"),
        ("lit", ":"),
        ("std", "05"),
        ("std", "Z07:00"),
    ),
}
_CHUNKS[RFC3339_MICRO] = (*_CHUNKS[RFC3339][:-1], ("std", ".000000"), ("std", "Z07:00"))


class GoParseError(ValueError):
    """time.ParseError; str() is Go's Error()."""


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _error(layout: str, value: str, layout_elem: str, value_elem: str, message: str = "") -> str:
    if message:
        return f"parsing time {_quote(value)}{message}"
    return (
        f"parsing time {_quote(value)} as {_quote(layout)}: cannot parse "
        f"{_quote(value_elem)} as {_quote(layout_elem)}"
    )


def _digit(text: str, index: int) -> bool:
    return len(text) > index and "0" <= text[index] <= "9"


def _getnum(text: str, fixed: bool) -> tuple[int, str] | None:
    if not _digit(text, 0):
        return None
    if not _digit(text, 1):
        if fixed:
            return None
        return int(text[0]), text[1:]
    return int(text[:2]), text[2:]


def _nanoseconds(text: str, width: int) -> bool:
    """Go's parseNanoseconds: '.' or ',' then digits (atoi of the rest; a sign is accepted)."""
    if text[0] not in ".,":
        return False
    digits = text[1:width][:9]
    if digits[:1] in ("+", "-"):
        digits = digits[1:]
    return digits.isdigit() and digits.isascii()


def go_parse(layout: str, value: str) -> None:
    """Raise GoParseError where Go's time.Parse(layout, value) returns an error."""
    rest = value
    numbers: dict[str, int] = {}
    chunks = _CHUNKS[layout]
    for index, (kind, elem) in enumerate(chunks):
        if kind == "lit":
            if not rest.startswith(elem):
                raise GoParseError(_error(layout, value, elem, rest))
            rest = rest[len(elem) :]
            continue
        hold = rest
        bad = False
        out_of_range = ""
        if elem == "2006":
            if len(rest) < 4 or not _digit(rest, 0) or not rest[:4].isdigit():
                bad = True
            else:
                numbers["year"], rest = int(rest[:4]), rest[4:]
        elif elem in ("01", "02", "15", "04", "05"):
            got = _getnum(rest, fixed=elem != "15")
            if got is None:
                bad = True
            else:
                number, rest = got
                numbers[elem] = number
                limit = {"01": 12, "02": 31, "15": 23, "04": 59, "05": 59}[elem]
                if elem == "01" and not 1 <= number <= 12:
                    out_of_range = "month"
                elif elem != "02" and number > limit:
                    out_of_range = {"15": "hour", "04": "minute", "05": "second"}[elem]
                elif (
                    elem == "05"
                    and len(rest) >= 2
                    and rest[0] in ".,"
                    and _digit(rest, 1)
                    and chunks[index + 1][1] != ".000000"
                ):
                    # No fraction in the layout but one in the value: Go reads it anyway.
                    width = 2
                    while _digit(rest, width):
                        width += 1
                    rest = rest[width:]
        elif elem == ".000000":
            width = 1 + 6
            if len(rest) < width or not _nanoseconds(rest, width):
                bad = True
            else:
                rest = rest[width:]
        elif elem == "Z07:00":
            if rest[:1] == "Z":
                rest = rest[1:]
            elif len(rest) < 6 or rest[3] != ":":
                bad = True
            else:
                sign, hours, minutes = rest[0], rest[1:3], rest[4:6]
                rest = rest[6:]
                if _getnum(hours, True) is None or _getnum(minutes, True) is None:
                    bad = True
                elif int(hours) > 24:
                    out_of_range = "time zone offset hour"
                elif int(minutes) > 60:
                    out_of_range = "time zone offset minute"
                elif sign not in "+-":
                    bad = True
        if out_of_range:
            message = f": {out_of_range} out of range"
            raise GoParseError(_error(layout, value, elem, rest, message))
        if bad:
            raise GoParseError(_error(layout, value, elem, hold))
    if rest:
        raise GoParseError(_error(layout, value, "", rest, f": extra text: {_quote(rest)}"))
    year, month, day = numbers["year"], numbers["01"], numbers["02"]
    if not 1 <= day <= calendar.monthrange(year, month)[1]:
        raise GoParseError(_error(layout, value, "", rest, ": day out of range"))
