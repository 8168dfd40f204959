"""`/probe?debug=true`: one poll of a target, step by step, as plain text.

The core's poll plan (`core/poll_plan.py`) is driven by `poll.py`'s driver, with each
step and its answer written down: what was read or asked and why, what it answered, the
reading, and the decision; then the series the poll would answer. A debug poll keeps nothing
(the caller leaves the target's history as it was) and never sends the idle test request: when
the plan asks for one, the view says so and stops there.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields

import aiohttp

from stallwatch.common.exporter_config import TargetConfig
from stallwatch.core.history import PollOutcome, TargetHistory
from stallwatch.core.poll_plan import (
    AskFaults,
    AskModels,
    AskSleeps,
    ReadMetrics,
    SendTestRequest,
    Step,
    poll_plan,
)
from stallwatch.core.probe_schedule import ReadBudget
from stallwatch.core.reading import EngineSample, Reading
from stallwatch.core.reads import (
    ModelsAnswer,
    ReadResult,
)
from stallwatch.exporter.poll import drive, outcome_of


@dataclass
class DebugPoll:
    """One debug poll as it went: its steps (text), and its outcome once the plan gave one."""

    started: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)
    outcome: PollOutcome | None = None
    # The test request the plan asked for, not sent (the poll stopped there).
    test_request: SendTestRequest | None = None
    reading: Reading | None = None  # the last reading taken

    def add(self, text: str) -> None:
        self.lines.append(f"  +{time.monotonic() - self.started:.3f} s  {text}")

    def before(self, target: TargetConfig, step: Step) -> bool:
        self.add(_step_text(target, step))
        if isinstance(step, SendTestRequest):
            self.test_request = step
            return False
        return True

    def after(self, answer: object) -> None:
        self.add(f"  -> {_answer_text(answer)}")
        if isinstance(answer, ReadResult):
            self.reading = answer.reading or self.reading


def _step_text(target: TargetConfig, step: Step) -> str:
    match step:
        case AskModels():
            return f"GET {target.url.rstrip('/')}/v1/models (which engine is it?)"
        case ReadMetrics(url=url, again=again):
            return f"GET {url}" + (
                " again (the test request failed: did it move?)" if again else ""
            )
        case AskFaults(engine_kind=kind):
            return f"ask {kind}'s own fault tolerance which engines it holds"
        case AskSleeps(engine_kind=kind):
            return f"ask {kind}'s own sleep flag"
        case SendTestRequest(model=model, endpoint=endpoint, timeout_seconds=timeout):
            return f"the idle test request: {endpoint}, model {model!r}, timeout {timeout:g} s"


def _answer_text(answer: object) -> str:
    if isinstance(answer, ReadResult):
        if answer.reading is not None:
            return (
                f"a reading: {answer.payload_bytes} bytes, {len(answer.reading.engines)} engine(s)"
            )
        status = f"status {answer.status}: " if answer.status is not None else ""
        return f"no reading ({answer.error_reason}): {status}{answer.detail}"
    if isinstance(answer, ModelsAnswer):
        if answer.error_reason is not None:
            return f"no answer ({answer.error_reason}): {answer.detail}"
        owners = ", ".join(answer.owners) or "none"
        return f"status {answer.status}, owned_by: {owners}"
    if isinstance(answer, tuple):  # AskFaults
        return f"holds faulted: {', '.join(answer)}" if answer else "holds none faulted"
    if isinstance(answer, bool):  # AskSleeps
        return "asleep" if answer else "awake"
    if answer is None:
        return "nothing to ask (no such check)"
    return repr(answer)


async def debug_poll(
    session: aiohttp.ClientSession,
    target: TargetConfig,
    history: TargetHistory,
    *,
    max_payload_bytes: int,
    into: DebugPoll,
) -> None:
    """Drive one poll of `target` from `history`, writing its steps `into` (so that a poll cut
    at a deadline still shows the steps it took)."""
    plan = poll_plan(
        target, history.baseline, time.time(), last_proven_alive_at=history.last_proven_alive_at
    )
    result = await drive(session, target, plan, max_payload_bytes=max_payload_bytes, watcher=into)
    if result is not None:
        into.outcome = outcome_of(result, into.started)


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
    start = reading.process_start_time
    yield (
        f"reading: {len(reading.engines)} engine(s), process start "
        f"{start if start is not None else 'absent'}"
        + (f", {reading.malformed_lines} malformed lines" if reading.malformed_lines else "")
    )
    for sample in reading.engines:
        yield f"  {_sample_text(sample)}"


def debug_text(
    module: str,
    target: TargetConfig,
    history: TargetHistory,
    budget: ReadBudget | None,
    poll: DebugPoll,
    body: bytes,
    now: float,
) -> str:
    """The debug view of one poll (`body`: the series it would answer)."""
    lines = [f"debug poll of {target.name} (module {module}): {target.url}, kind {target.kind}"]
    if budget is None:
        lines.append(f"no scrape timeout given: each request at most {target.timeout_seconds:g} s")
    else:
        lines.append(
            f"scrape timeout {budget.scrape_timeout:g} s: each request at most "
            f"{target.timeout_seconds:.3g} s, the poll at most {budget.read:.3g} s"
        )
    baseline = history.baseline
    if baseline is None:
        lines.append("baseline: none (no earlier reading of this target)")
    else:
        lines.append(f"baseline: the reading of {max(0.0, now - baseline.taken_at):.1f} s ago")
    lines.append("steps:")
    lines.extend(poll.lines or ["  (none)"])
    outcome = poll.outcome
    if poll.test_request is not None:
        lines.extend(_reading_lines(poll.reading))
        lines.append(
            "decision: none yet: a poll sends the idle test request here and decides on its "
            "answer; a debug poll never sends it"
        )
    elif outcome is None:
        lines.append("decision: none: the poll was cut at the scrape's deadline")
    else:
        lines.extend(_reading_lines(outcome.reading))
        lines.append(f"decision: {outcome.verdict.state} ({outcome.verdict.reason})")
        if outcome.error_reason is not None:
            lines.append(f"error: {outcome.error_reason}")
        lines.append(f"duration: {outcome.duration_seconds:.3f} s")
    lines.append("a debug poll sends no test request and leaves the target's history as it was")
    lines.append("")
    lines.append("series this poll would answer:")
    return "\n".join(lines) + "\n" + body.decode()
