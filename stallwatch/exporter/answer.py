"""A `/probe` answer: one target's series, written from the family table with what stays the
same between reads written once.

Every read of a target changes its values, not its names or labels: the families' HELP and TYPE
lines are the same for every target, and a sample's name and labels the same for every read of
one target (a new engine, a new state's label, add one). `AnswerWriter` keeps those strings for
its target and, at each read, writes only the values. Its bytes are what `generate_latest`
writes for the same families (a test holds the three writers equal).
"""

from __future__ import annotations

from stallwatch.common.exporter_config import TargetConfig
from stallwatch.core.history import TargetHistory
from stallwatch.exporter.collector import TARGET_FAMILIES, target_samples
from stallwatch.exporter.exposition import escaped_label_value, go_float, header

# Each family's HELP and TYPE lines, and the name its samples are written with.
_HEADERS: tuple[tuple[str, str], ...] = tuple(
    header(family.name, family.type, family.help) for family in TARGET_FAMILIES
)
# A target answered with more distinct sample names than this (a label value that keeps
# changing) starts its cache over rather than growing it.
MAX_SAMPLE_NAMES = 1024


class AnswerWriter:
    """Writes one target's `/probe` answer; keeps each sample's name and labels, written."""

    def __init__(self, target: TargetConfig) -> None:
        self.target = target
        # The target's own labels, with `target`: sorted by name when a sample is written.
        self._labels = {
            "target": escaped_label_value(target.name),
            **{name: escaped_label_value(value) for name, value in target.labels.items()},
        }
        self._names: dict[tuple[int, tuple[str, ...]], str] = {}

    def _sample_name(self, family: int, own: tuple[str, ...]) -> str:
        """`name{labels} `: the sample's name and labels, labels sorted, values escaped."""
        labels = dict(self._labels)
        for name, value in zip(TARGET_FAMILIES[family].labels, own, strict=True):
            labels[name] = escaped_label_value(value)
        written = ",".join(f'{name}="{labels[name]}"' for name in sorted(labels))
        if len(self._names) >= MAX_SAMPLE_NAMES:
            self._names.clear()
        name = self._names[(family, own)] = f"{_HEADERS[family][1]}{{{written}}} "
        return name

    def write(self, history: TargetHistory) -> bytes:
        """The answer for the target with this history: every family, in the table's order."""
        by_family: list[list[str]] = [[] for _ in TARGET_FAMILIES]
        names = self._names
        for family, own, value in target_samples(self.target, history):
            name = names.get((family, own)) or self._sample_name(family, own)
            by_family[family].append(f"{name}{go_float(value)}\n")
        parts: list[str] = []
        for (lines_before, _), samples in zip(_HEADERS, by_family, strict=True):
            parts.append(lines_before)
            parts.extend(samples)
        return "".join(parts).encode("utf-8")
