"""What every benchmark shares: the real payloads, timing statistics, markdown tables."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
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
    # Below 999.5 of a unit, three significant figures stay in that unit (not "1e+03 µs").
    if seconds < 0.9995e-3:
        return f"{seconds * 1e6:.3g} µs"
    if seconds < 0.9995:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    return f"{seconds / 60:.3g} min"


@contextlib.contextmanager
def baseline_tree(ref: str | None) -> Iterator[Path | None]:
    """The project as it was at git `ref`, extracted to a temporary directory, for a benchmark
    that runs the code before a change beside the code after it; None without a `ref`."""
    if ref is None:
        yield None
        return
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", ref], check=True, capture_output=True
    ).stdout
    with tempfile.TemporaryDirectory(prefix="stallwatch-baseline-") as directory:
        subprocess.run(["tar", "-x", "-C", directory], input=archive, check=True)
        yield Path(directory)


@contextlib.contextmanager
def exporter_child(
    config: Mapping[str, object],
    workdir: Path,
    source: Path | None = None,
    workers: int = 1,
    arguments: Sequence[str] = (),
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`stallwatch exporter` with `config` as a child process (this checkout's code, or
    `source`'s; `workers` worker processes; more `arguments`); yields it and its base URL, and
    stops it."""
    path = workdir / "exporter.yml"
    path.write_text(json.dumps(config))
    argv = [sys.executable, "-m", "stallwatch", "exporter", "--config", str(path), *arguments]
    if workers > 1:
        argv.append(f"--workers={workers}")
    with listening_child(argv, "the exporter", python_environment(source), source) as running:
        yield running


@contextlib.contextmanager
def listening_child(
    argv: list[str], what: str, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A child process that prints `listening on URL` once it serves; yields it and the URL,
    and stops it."""
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=cwd,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"{what} did not start")
        yield process, line.removeprefix("listening on ").strip()
    finally:
        stop_child(process)


def stop_child(process: subprocess.Popen[str]) -> None:
    """Stop a child process: SIGTERM, then SIGKILL if it is still there after 10 s."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
    if process.stdout is not None:
        process.stdout.close()


def python_environment(source: Path | None) -> dict[str, str]:
    """The environment of a `python -m stallwatch` child that runs the code in `source` (a
    `baseline_tree`) instead of this checkout's; this process's own environment without one."""
    if source is None:
        return dict(os.environ)
    return dict(os.environ, PYTHONPATH=str(source))


def git_describe(ref: str) -> str:
    """`ref` as a short commit name, for the tables."""
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", ref],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
