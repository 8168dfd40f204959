"""What every benchmark shares: the real payloads, timing statistics, markdown tables."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
REAL_METRICS = REPO / "tests" / "testdata" / "real-metrics"
VLLM_PAYLOAD = "vllm-0.32.0-cpu-busy-1.txt"


def real_payload(name: str = VLLM_PAYLOAD) -> str:
    """A captured real `/metrics` payload (fails loudly if the fixtures are missing)."""
    path = REAL_METRICS / name
    if not path.is_file():
        raise FileNotFoundError(
            f"real payload {name} not found in {REAL_METRICS}: the benchmarks read the "
            "captured payloads kept in tests/testdata/real-metrics"
        )
    return path.read_text(encoding="utf-8")


@dataclass
class Section:
    """One benchmark's result: a title, a markdown table, the method, and raw figures."""

    title: str
    command: str
    headers: list[str]
    rows: list[list[str]]
    method: list[str]
    figures: dict[str, Any] = field(default_factory=dict)

    def markdown(self) -> str:
        lines = [f"## {self.title}", "", f"`{self.command}`", ""]
        lines.append("| " + " | ".join(self.headers) + " |")
        lines.append("|" + "|".join("---" for _ in self.headers) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        lines.append("")
        lines += [f"- {line}" for line in self.method]
        return "\n".join(lines) + "\n"


def percentile(values: list[float], fraction: float) -> float:
    """The value below which `fraction` of `values` fall (nearest rank)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fmt_seconds(seconds: float) -> str:
    """A duration with a unit that keeps three significant figures."""
    if seconds != seconds:  # NaN
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    return f"{seconds / 60:.3g} min"
