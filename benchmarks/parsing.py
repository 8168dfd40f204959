"""Reading a real vLLM `/metrics` payload: stallwatch's parser vs prometheus_client's."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import Section, fmt_seconds, real_payload
from stallwatch.core.reading import parse_reading

ENGINES = 8
MODELS = ("llama-70b", "qwen-72b", "mistral-large", "deepseek-v3", "gemma-27b", "phi-4")


def synthesize_large(payload: str, engines: int = ENGINES, models: tuple[str, ...] = MODELS) -> str:
    """A data-parallel, many-models payload: every engine series repeated per engine and model."""
    out: list[str] = []
    for line in payload.splitlines():
        if 'engine="0"' in line and 'model_name="' in line:
            start = line.index('model_name="') + len('model_name="')
            end = line.index('"', start)
            original = line[start:end]
            for model in models:
                renamed = line.replace(f'model_name="{original}"', f'model_name="{model}"')
                for engine in range(engines):
                    out.append(renamed.replace('engine="0"', f'engine="{engine}"'))
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def _stallwatch(text: str) -> int:
    return len(parse_reading(text, taken_at=0.0).engines)


def _stallwatch_line_by_line(text: str) -> int:
    return len(parse_reading(text, taken_at=0.0, line_by_line=True).engines)


def _prometheus_client(text: str) -> int:
    samples = 0
    for family in text_string_to_metric_families(text):
        samples += len(family.samples)
    return samples


def time_per_call(function: Callable[[str], int], text: str, budget: float) -> float:
    """Seconds per call: the best of 5 rounds, each repeating the call for ~budget/5 s."""
    function(text)
    started = time.perf_counter()
    function(text)
    single = max(time.perf_counter() - started, 1e-7)
    repeats = max(1, int(budget / 5 / single))
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(repeats):
            function(text)
        best = min(best, (time.perf_counter() - started) / repeats)
    return best


def run(quick: bool) -> Section:
    budget = 0.2 if quick else 3.0
    small = real_payload()
    large = synthesize_large(small)
    rows: list[list[str]] = []
    figures: dict[str, float] = {}
    for label, text in (
        ("real vLLM 0.32, one server", small),
        ("synthesized DP=8 x 6 models", large),
    ):
        ours = time_per_call(_stallwatch, text, budget)
        line_by_line = time_per_call(_stallwatch_line_by_line, text, budget)
        theirs = time_per_call(_prometheus_client, text, budget)
        engines = _stallwatch(text)
        key = "small" if text is small else "large"
        figures[f"{key}_bytes"] = len(text.encode())
        figures[f"{key}_stallwatch_seconds"] = ours
        figures[f"{key}_stallwatch_line_by_line_seconds"] = line_by_line
        figures[f"{key}_prometheus_client_seconds"] = theirs
        figures[f"{key}_ratio"] = theirs / ours
        figures[f"{key}_engines"] = engines
        rows.append(
            [
                label,
                f"{len(text.encode()) / 1024:,.0f} KiB",
                str(engines),
                fmt_seconds(line_by_line),
                fmt_seconds(ours),
                fmt_seconds(theirs),
                f"{theirs / ours:.1f}x",
            ]
        )
    return Section(
        title="Reading a real vLLM /metrics payload",
        command="python -m benchmarks --only parsing",
        headers=[
            "payload",
            "size",
            "engines read",
            "stallwatch, line by line (before)",
            "stallwatch `parse_reading` (searched)",
            "prometheus_client parser (fully consumed)",
            "stallwatch is faster by",
        ],
        rows=rows,
        method=[
            "Payload: `vllm-0.32.0-cpu-busy-1.txt`, captured byte for byte from a real vLLM 0.32 "
            "server. The large one repeats every engine series of that payload for "
            f'`engine="0".."{ENGINES - 1}"` and {len(MODELS)} model names, as a data-parallel '
            "server with many models would publish it.",
            "Time per payload: best of 5 rounds, each repeating the parse for a fixed time "
            "budget, in one process; both parsers get the same `str`.",
            "prometheus_client's `text_string_to_metric_families` is consumed fully (every "
            "family and sample), which is what a checker built on it does.",
            "Line by line is the parser before the search (`parse_reading(..., "
            "line_by_line=True)`, still used for payloads with other line breaks): it looks "
            "at every line in Python; searched finds the wanted lines with one prefix-tree "
            "expression and reads plain labels with one match each.",
        ],
        figures=figures,
    )
