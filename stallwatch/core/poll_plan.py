"""One poll of one target as a plan: each step says what to read or send next; the last says
the outcome. No I/O: the exporter (`exporter/poll.py`) and the day replay drive the same plan,
answering each step their own way (HTTP, or a simulated server on a virtual clock).

The sequence: a proxy is asked `/v1/models` only; `kind: auto` asks `/v1/models` first
whenever the last poll gave no reading of a known engine, and never reads a path the named
engine's profile marks unsafe; then the metrics are read and classified. A server that asks for
an idle test request is checked, in order, for its engine's own fault tolerance holding it, its
own sleep flag, a disabled test request, a test request its engine has no safe path for, and a
test request not due yet; only then is the test request sent, and a failed one is followed by a
fresh read that decides whether the server moved meanwhile.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TypeVar

from stallwatch.common.exporter_config import TargetConfig, TestRequestEndpoint
from stallwatch.core.classify import (
    State,
    Verdict,
    classify,
    down,
    held_by_engine_fault_tolerance,
    hung,
    with_test_request_result,
)
from stallwatch.core.idle_test_request import (
    deferred_verdict,
    idle_test_request_due,
    settle_idle_test_request,
)
from stallwatch.core.reading import Reading, known_engine
from stallwatch.core.reads import ModelsAnswer, ReadResult, TestRequestResult
from stallwatch.engines import AUTO, PROFILES, auto_metrics_path, identify

# Statuses of a server that is up but publishes no metrics (Ollama: 404; llama.cpp without
# --metrics: 501).
NO_METRICS_STATUSES = frozenset({404, 501})
TEST_PATHS: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

# The steps.


@dataclass(frozen=True)
class AskModels:
    """`GET /v1/models` of the target (takes no slot on any engine); answer: `ModelsAnswer`."""


@dataclass(frozen=True)
class ReadMetrics:
    """Read `url` (`again`: the fresh read after a failed test request); answer: `ReadResult`."""

    url: str
    again: bool = False


@dataclass(frozen=True)
class AskFaults:
    """Ask the engine's own fault tolerance which engines it holds faulted; answer: a tuple of
    engine names (empty when it says nothing)."""

    engine_kind: str


@dataclass(frozen=True)
class AskSleeps:
    """Ask the engine's own sleep flag (never one that wakes it); answer: `bool | None`."""

    engine_kind: str


@dataclass(frozen=True)
class SendTestRequest:
    """Send the one `max_tokens: 1` test request; answer: `TestRequestResult`."""

    model: str
    endpoint: TestRequestEndpoint
    timeout_seconds: float


Step = AskModels | ReadMetrics | AskFaults | AskSleeps | SendTestRequest


@dataclass(frozen=True)
class PollResult:
    """The poll's outcome, without its timing (the driver knows when it started and ended)."""

    verdict: Verdict
    reading: Reading | None
    test_requests_sent: int = 0
    test_requests_failed: int = 0
    error_reason: str | None = None
    test_request_deferred: bool = False


Plan = Generator[Step, object, PollResult]


def advance(plan: Plan, answer: object) -> Step | PollResult:
    """Give the plan the answer to its last step (None to start it): its next step, or its
    outcome. A plain return value, so a driver may run it in a worker thread."""
    try:
        return plan.send(answer)
    except StopIteration as finished:
        result: PollResult = finished.value
        return result


def join_url(base: str, path: str) -> str:
    return base.rstrip("/") + path


def allows_test_request(engine_kind: str | None, endpoint: TestRequestEndpoint) -> bool:
    """Whether the engine's profile marks the test request's path safe (unknown engine: yes)."""
    profile = PROFILES.get(engine_kind or "")
    return profile is None or TEST_PATHS[endpoint] in profile.test_paths


def unread_verdict(read: ReadResult) -> Verdict:
    """The state of a server whose `/metrics` gave no reading: hung when it connected and got
    no answer in time, down otherwise (not connected, or an answer that is no reading)."""
    if read.error_reason == "timeout":
        return hung(f"/metrics: {read.detail}")
    return down(f"/metrics: {read.detail}")


_Answer = TypeVar("_Answer")


def _expect(answer: object, kind: type[_Answer], step: Step) -> _Answer:
    if not isinstance(answer, kind):
        raise TypeError(f"{type(step).__name__} answered with {type(answer).__name__}")
    return answer


def _ask_models() -> Generator[Step, object, ModelsAnswer]:
    step = AskModels()
    return _expect((yield step), ModelsAnswer, step)


def _read(url: str, *, again: bool = False) -> Generator[Step, object, ReadResult]:
    step = ReadMetrics(url, again)
    return _expect((yield step), ReadResult, step)


def _faulted(engine_kind: str) -> Generator[Step, object, tuple[str, ...]]:
    profile = PROFILES.get(engine_kind)
    if profile is None or profile.fault_status is None:
        return ()
    step = AskFaults(engine_kind)
    return _expect((yield step), tuple, step)


def _asleep(engine_kind: str) -> Generator[Step, object, bool]:
    profile = PROFILES.get(engine_kind)
    if profile is None or profile.sleep_check is None:
        return False
    step = AskSleeps(engine_kind)
    answer = yield step
    if answer is not None and not isinstance(answer, bool):
        raise TypeError(f"AskSleeps answered with {type(answer).__name__}")
    return answer is True


def _send(step: SendTestRequest) -> Generator[Step, object, TestRequestResult]:
    return _expect((yield step), TestRequestResult, step)


def poll_plan(
    target: TargetConfig,
    baseline: Reading | None,
    now: float,
    *,
    last_proven_alive_at: float | None = None,
) -> Plan:
    """The plan of one poll of `target` started at `now` (Unix time), `baseline` the last
    reading. `last_proven_alive_at` (the target's history) holds back a test request that is
    not due yet; without it, every poll that asks for one sends it."""
    if target.kind == "proxy":
        proxy = yield from _ask_models()
        if proxy.listed:
            reason = "proxy: /v1/models answered; backends are read directly"
            return PollResult(Verdict(State.NO_METRICS, reason), None)
        verdict = down(f"proxy: /v1/models did not answer ({proxy.detail})")
        return PollResult(verdict, None, error_reason="connection")

    metrics_url = target.metrics_url
    models: ModelsAnswer | None = None
    if target.kind == AUTO:
        engine = known_engine(baseline, now, target.interval_seconds)
        if engine is None:
            models = yield from _ask_models()
            if models.error_reason == "timeout":
                return PollResult(
                    hung(f"/v1/models: {models.detail}"), None, error_reason="timeout"
                )
            if models.error_reason is not None:
                verdict = down(f"/v1/models: {models.detail}")
                return PollResult(verdict, None, error_reason=models.error_reason)
            engine = identify(models.status, models.owners)
        metrics_url = join_url(target.url, auto_metrics_path(engine, target.metrics_path))

    def models_listed() -> Generator[Step, object, bool]:
        if models is not None:
            return models.listed
        return (yield from _ask_models()).listed

    read = yield from _read(metrics_url)
    if read.status in NO_METRICS_STATUSES and (yield from models_listed()):
        reason = f"reachable, but no metrics (/metrics: {read.detail}); never restarted"
        return PollResult(Verdict(State.NO_METRICS, reason), None)
    if read.reading is None:
        return PollResult(unread_verdict(read), None, error_reason=read.error_reason)
    reading = read.reading
    if not reading.has_engines:
        if (yield from models_listed()):
            verdict = classify(baseline, reading)
        else:
            verdict = down("no engine series in /metrics and /v1/models did not answer")
        parse_error = "parse" if reading.malformed_lines else None
        return PollResult(verdict, reading, error_reason=parse_error)

    kind = reading.engine_kind or ""
    verdict = classify(baseline, reading)
    if verdict.state == State.STALLED or verdict.test_request_needed:
        verdict = held_by_engine_fault_tolerance(verdict, (yield from _faulted(kind)))
    if not verdict.test_request_needed:
        return PollResult(verdict, reading)
    if (yield from _asleep(kind)):
        return PollResult(Verdict(State.SLEEPING, f"{kind} says it sleeps"), reading)
    test_request = target.test_request
    if not test_request.enabled:
        detail = "test request disabled; idle by its counters"
        return PollResult(with_test_request_result(verdict, True, detail), reading)
    if not allows_test_request(reading.engine_kind, test_request.endpoint):
        detail = f"{reading.engine_kind} has no safe test request; idle by its counters"
        return PollResult(with_test_request_result(verdict, True, detail), reading)
    if not idle_test_request_due(
        verdict,
        last_proven_alive_at,
        now,
        min_interval=test_request.min_interval_seconds,
        poll_interval=target.interval_seconds,
    ):
        held = deferred_verdict(
            verdict, last_proven_alive_at, now, min_interval=test_request.min_interval_seconds
        )
        return PollResult(held, reading, test_request_deferred=True)
    model = test_request.model or (reading.model_names[0] if reading.model_names else "")
    answer = yield from _send(
        SendTestRequest(model, test_request.endpoint, test_request.timeout_seconds)
    )
    reread = None if answer.succeeded else (yield from _read(metrics_url, again=True)).reading
    settled = settle_idle_test_request(
        verdict, reading, answered=answer.succeeded, detail=answer.detail, reread=reread
    )
    return PollResult(
        settled.verdict,
        settled.reading,
        test_requests_sent=1,
        test_requests_failed=settled.test_requests_failed,
    )
