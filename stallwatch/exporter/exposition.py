"""The text exposition (format 0.0.4) of the exporter's own gauges and counters, written directly.

prometheus_client's `generate_latest` checks and escapes every metric and label name of every
sample, and formats each sample through several calls: for a `/probe` answer that was most of
the cost of rendering it, once per read of every target. The exporter's names are its own and
its label names are checked when the config is loaded, so this writes what `generate_latest`
writes, byte for byte (a test holds the two equal), checking each family's names once.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
SUFFIXES = {"gauge": "", "counter": "_total"}
# How the reference writes a value (as Go does); typed here, it is not upstream.
_go_float_reference: Callable[[float], str] = floatToGoString
# Most samples of an answer hold a small whole number (a state's 0 or 1, a count): their
# text is looked up, not formatted. Zero is left out: -0.0 equals 0.0 as a key.
_WHOLE_NUMBERS = {float(n): _go_float_reference(float(n)) for n in range(1, 4096)}


def go_float(value: float) -> str:
    """`value` as the reference writes it (as Go does), byte for byte."""
    text = _WHOLE_NUMBERS.get(value)
    if text is not None:
        return text
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    return _go_float_reference(value)


class UnsupportedFamily(ValueError):
    """A family this writer does not write (another type, a timestamp, a name to escape)."""


@functools.lru_cache(maxsize=1024)
def header(name: str, metric_type: str, documentation: str) -> tuple[str, str]:
    """The family's HELP and TYPE lines, and the name its samples must have."""
    if metric_type not in SUFFIXES or not _NAME.match(name):
        raise UnsupportedFamily(f"{metric_type} {name!r}")
    exposed = name + SUFFIXES[metric_type]
    help_text = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {exposed} {help_text}\n# TYPE {exposed} {metric_type}\n", exposed


@functools.lru_cache(maxsize=1024)
def _label_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """The label names in the order they are written; each checked once."""
    for name in names:
        if not _LABEL_NAME.match(name):
            raise UnsupportedFamily(f"label name {name!r}")
    return tuple(sorted(names))


def escaped_label_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def exposition(families: Iterable[Metric]) -> bytes:
    """`generate_latest` of a registry holding exactly `families` (gauges and counters)."""
    lines: list[str] = []
    for family in families:
        lines_before, exposed = header(family.name, family.type, family.documentation)
        lines.append(lines_before)
        for sample in family.samples:
            if sample.name != exposed or sample.timestamp is not None:
                raise UnsupportedFamily(f"sample {sample.name!r} of {family.name!r}")
            value = go_float(sample.value)
            labels = sample.labels
            if not labels:
                lines.append(f"{exposed} {value}\n")
                continue
            written = ",".join(
                f'{name}="{escaped_label_value(labels[name])}"'
                for name in _label_names(tuple(labels))
            )
            lines.append(f"{exposed}{{{written}}} {value}\n")
    return "".join(lines).encode("utf-8")
