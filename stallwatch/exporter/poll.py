"""One poll of one target, driven: the core's plan (`core/poll_plan.py`) decides every step and
the outcome; this module performs each step over HTTP and times the whole. Work on a big
payload (classifying it, settling a test request on it) runs off the event loop."""

from __future__ import annotations

import time
from typing import Protocol, assert_never

import aiohttp

from stallwatch.common.exporter_config import TargetConfig
from stallwatch.core.history import PollOutcome
from stallwatch.core.poll_plan import (
    AskFaults,
    AskModels,
    AskSleeps,
    Plan,
    PollResult,
    ReadMetrics,
    SendTestRequest,
    Step,
    advance,
    poll_plan,
)
from stallwatch.core.reading import Reading
from stallwatch.core.reads import (
    ReadResult,
)
from stallwatch.net.fetch import (
    ask_models,
    engine_faults,
    engine_sleeps,
    read_metrics,
    send_test_request,
)
from stallwatch.net.offload import run_sized


async def perform(
    session: aiohttp.ClientSession, target: TargetConfig, step: Step, *, max_payload_bytes: int
) -> object:
    """Do what `step` asks of `target`; the answer the plan expects for it."""
    timeout = target.timeout_seconds
    match step:
        case AskModels():
            return await ask_models(session, target.url, timeout=timeout)
        case ReadMetrics(url=url):
            return await read_metrics(
                session, url, timeout=timeout, max_bytes=max_payload_bytes, kind=target.kind
            )
        case AskFaults(engine_kind=kind):
            return await engine_faults(session, target.url, kind, timeout=timeout)
        case AskSleeps(engine_kind=kind):
            return await engine_sleeps(session, target.url, kind, timeout=timeout)
        case SendTestRequest(model=model, endpoint=endpoint, timeout_seconds=test_request_timeout):
            return await send_test_request(
                session, target.url, model=model, endpoint=endpoint, timeout=test_request_timeout
            )
        case _:
            assert_never(step)


class StepWatcher(Protocol):
    """Sees each step of a driven poll (the `/probe?debug=true` view)."""

    def before(self, target: TargetConfig, step: Step) -> bool:
        """Whether to perform `step`; False ends the poll there, without an outcome."""
        ...

    def after(self, answer: object) -> None:
        """What the step just performed answered."""
        ...


async def drive(
    session: aiohttp.ClientSession,
    target: TargetConfig,
    plan: Plan,
    *,
    max_payload_bytes: int,
    watcher: StepWatcher | None = None,
) -> PollResult | None:
    """Perform the plan's steps until it gives its result (None: the watcher ended it)."""
    payload_bytes = 0
    answer: object = None
    while not isinstance(step := await run_sized(payload_bytes, advance, plan, answer), PollResult):
        if watcher is not None and not watcher.before(target, step):
            plan.close()
            return None
        answer = await perform(session, target, step, max_payload_bytes=max_payload_bytes)
        if watcher is not None:
            watcher.after(answer)
        if isinstance(answer, ReadResult):
            payload_bytes = max(payload_bytes, answer.payload_bytes)
    return step


def outcome_of(result: PollResult, started: float) -> PollOutcome:
    """The poll's outcome, `started` its `time.monotonic()` start."""
    return PollOutcome(
        verdict=result.verdict,
        reading=result.reading,
        finished_at=time.time(),
        duration_seconds=time.monotonic() - started,
        test_requests_sent=result.test_requests_sent,
        test_requests_failed=result.test_requests_failed,
        error_reason=result.error_reason,
        test_request_deferred=result.test_request_deferred,
    )


async def poll_once(
    session: aiohttp.ClientSession,
    target: TargetConfig,
    baseline: Reading | None,
    *,
    max_payload_bytes: int,
    last_proven_alive_at: float | None = None,
) -> PollOutcome:
    """Read the target once and decide its state; never raises for a misbehaving server."""
    started = time.monotonic()
    plan = poll_plan(target, baseline, time.time(), last_proven_alive_at=last_proven_alive_at)
    result = await drive(session, target, plan, max_payload_bytes=max_payload_bytes)
    assert result is not None  # no watcher ends it
    return outcome_of(result, started)
