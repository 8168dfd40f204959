"""`/probe?debug=true`: one read of a target, step by step, as plain text.

What was read (each request and its answer, traced by the process's one session), the reading,
and the decision, then the series the read would answer. A debug read leaves the target's
history as it was and never sends the idle test request.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from types import SimpleNamespace

import aiohttp

from stallwatch.common.exporter_config import TargetConfig
from stallwatch.core.history import PollOutcome, TargetHistory
from stallwatch.core.probe_schedule import ReadBudget
from stallwatch.core.reading import EngineSample, Reading


@dataclass
class Steps:
    """The requests of one debug read, in order, with when each began and ended."""

    started: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        self.lines.append(f"  +{time.monotonic() - self.started:.3f} s  {text}")


# Set only inside a debug read's own task; every other request of the session skips the trace.
_STEPS: ContextVar[Steps | None] = ContextVar("stallwatch_probe_debug_steps", default=None)


def recording() -> Steps:
    """Record the requests of the current task (a debug read) from now on."""
    steps = Steps()
    _STEPS.set(steps)
    return steps


async def _on_start(
    _session: aiohttp.ClientSession, _ctx: SimpleNamespace, params: aiohttp.TraceRequestStartParams
) -> None:
    steps = _STEPS.get()
    if steps is not None:
        steps.add(f"{params.method} {params.url}")


async def _on_end(
    _session: aiohttp.ClientSession, _ctx: SimpleNamespace, params: aiohttp.TraceRequestEndParams
) -> None:
    steps = _STEPS.get()
    if steps is not None:
        response = params.response
        length = response.headers.get("Content-Length", "?")
        steps.add(f"{params.method} {params.url}: {response.status} (Content-Length {length})")


async def _on_exception(
    _session: aiohttp.ClientSession,
    _ctx: SimpleNamespace,
    params: aiohttp.TraceRequestExceptionParams,
) -> None:
    steps = _STEPS.get()
    if steps is not None:
        error = params.exception
        steps.add(f"{params.method} {params.url}: {type(error).__name__} {error}".rstrip())


def trace_config() -> aiohttp.TraceConfig:
    """The trace the exporter's session carries, for the debug reads' steps."""
    config = aiohttp.TraceConfig()
    config.on_request_start.append(_on_start)
    config.on_request_end.append(_on_end)
    config.on_request_exception.append(_on_exception)
    return config


def _sample_text(sample: EngineSample) -> str:
    shown = [
        f"{item.name} {getattr(sample, item.name):g}"
        for item in fields(sample)
        if isinstance(getattr(sample, item.name), float)
    ]
    return f"{sample.kind} engine {sample.engine!r} of {sample.model_name!r}: " + ", ".join(shown)


def _reading_lines(reading: Reading | None) -> Iterator[str]:
    if reading is None:
        yield "reading: none"
        return
    yield (
        f"reading: {len(reading.engines)} engine(s), process start "
        f"{reading.process_start_time if reading.process_start_time is not None else 'absent'}"
        + (f", {reading.malformed_lines} malformed lines" if reading.malformed_lines else "")
    )
    for sample in reading.engines:
        yield f"  {_sample_text(sample)}"


def debug_text(
    module: str,
    target: TargetConfig,
    history: TargetHistory,
    budget: ReadBudget | None,
    steps: Steps,
    outcome: PollOutcome | None,
    body: bytes,
    now: float,
) -> str:
    """The debug view of one read; `outcome` None: the read was cut at the scrape's deadline."""
    lines = [f"debug read of {target.name} (module {module}): {target.url}, kind {target.kind}"]
    if budget is None:
        lines.append(f"no scrape timeout given: each request at most {target.timeout_seconds:g} s")
    else:
        lines.append(
            f"scrape timeout {budget.scrape_timeout:g} s: each request at most "
            f"{min(budget.requests, target.timeout_seconds):.3g} s, the read at most "
            f"{budget.read:.3g} s"
        )
    baseline = history.baseline
    if baseline is None:
        lines.append("baseline: none (no earlier reading of this target)")
    else:
        lines.append(f"baseline: the reading of {max(0.0, now - baseline.taken_at):.1f} s ago")
    lines.append("steps:")
    lines.extend(steps.lines or ["  (no request was traced)"])
    if outcome is None:
        lines.append("decision: none: the read was cut at the scrape's deadline")
    else:
        lines.extend(_reading_lines(outcome.reading))
        lines.append(f"decision: {outcome.verdict.state} ({outcome.verdict.reason})")
        if outcome.error_reason is not None:
            lines.append(f"error: {outcome.error_reason}")
        lines.append(f"duration: {outcome.duration_seconds:.3f} s")
    lines.append(
        "a debug read sends no idle test request and leaves the target's history as it was"
    )
    lines.append("")
    lines.append("series this read would answer:")
    return "\n".join(lines) + "\n" + body.decode()
