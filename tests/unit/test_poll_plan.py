"""The poll plan: one row per branch, each driven with scripted answers and no I/O."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from stallwatch.common.exporter_config import IdleTestRequestConfig, TargetConfig
from stallwatch.core.classify import State
from stallwatch.core.poll_plan import (
    AskFaults,
    AskModels,
    AskSleeps,
    PollResult,
    ReadMetrics,
    SendTestRequest,
    Step,
    advance,
    poll_plan,
)
from stallwatch.core.reading import EngineSample, Reading
from stallwatch.core.reads import (
    ModelsAnswer,
    ReadResult,
    TestRequestResult,
)

NOW = 10_000.0
URL = "http://10.0.0.1:8000"


def sample(kind: str = "vllm", *, steps: float = 100.0, running: float = 0.0) -> EngineSample:
    return EngineSample(
        model_name="m",
        engine="0",
        running=running,
        waiting=0.0,
        kv_cache_usage=0.0,
        awake=1.0,
        steps=steps,
        generation_tokens=steps * 8,
        prompt_tokens=steps * 4,
        requests_completed=10.0,
        preemptions=0.0,
        kind=kind,
    )


def reading(at: float, kind: str = "vllm", **values: float) -> Reading:
    return Reading(taken_at=at, engines=(sample(kind, **values),), process_start_time=1.0)


BASELINE = reading(NOW - 15.0)
IDLE = ReadResult(reading(NOW))
BUSY = ReadResult(reading(NOW, steps=150.0, running=2.0))
STALLED = ReadResult(reading(NOW, running=2.0))
LISTED = ModelsAnswer(200, ("vllm",), listed=True, detail="HTTP 200")
TARGET = TargetConfig(
    name="t", url=URL, kind="vllm", test_request=IdleTestRequestConfig(min_interval_seconds=0)
)


@dataclass(frozen=True)
class Row:
    case: str
    answers: tuple[object, ...]  # in the order the plan asks
    state: State
    steps: tuple[type[Step], ...]
    target: TargetConfig = TARGET
    baseline: Reading | None = BASELINE
    proven_at: float | None = None
    expect: dict[str, object] = field(default_factory=dict)


def drive(row: Row) -> tuple[list[Step], PollResult]:
    plan = poll_plan(row.target, row.baseline, NOW, last_proven_alive_at=row.proven_at)
    answers = iter(row.answers)
    taken: list[Step] = []
    answer: object = None
    while not isinstance(step := advance(plan, answer), PollResult):
        taken.append(step)
        answer = next(answers)
    assert next(answers, "none left") == "none left", "the plan ended before its answers did"
    return taken, step


AUTO = replace(TARGET, kind="auto")
ROWS = [
    Row(
        "proxy answering: no metrics of its own",
        (LISTED,),
        State.NO_METRICS,
        (AskModels,),
        target=replace(TARGET, kind="proxy"),
    ),
    Row(
        "proxy silent: down",
        (ModelsAnswer(error_reason="connection", detail="refused"),),
        State.DOWN,
        (AskModels,),
        target=replace(TARGET, kind="proxy"),
        expect={"error_reason": "connection"},
    ),
    Row(
        "auto, unknown engine, /v1/models times out: hung, nothing else read",
        (ModelsAnswer(error_reason="timeout", detail="no answer"),),
        State.HUNG,
        (AskModels,),
        target=AUTO,
        baseline=None,
        expect={"error_reason": "timeout"},
    ),
    Row(
        "auto, unknown engine, /v1/models refused: down",
        (ModelsAnswer(error_reason="connection", detail="refused"),),
        State.DOWN,
        (AskModels,),
        target=AUTO,
        baseline=None,
        expect={"error_reason": "connection"},
    ),
    Row(
        "auto, engine known from the last read: no /v1/models",
        (BUSY,),
        State.BUSY,
        (ReadMetrics,),
        target=AUTO,
    ),
    Row(
        "metrics path 404, /v1/models lists models: no metrics, never restarted",
        (ReadResult(None, "http_status", "HTTP 404", status=404), LISTED),
        State.NO_METRICS,
        (ReadMetrics, AskModels),
    ),
    Row(
        "metrics read timed out: hung",
        (ReadResult(None, "timeout", "no answer"),),
        State.HUNG,
        (ReadMetrics,),
        expect={"error_reason": "timeout"},
    ),
    Row(
        "metrics read refused: down",
        (ReadResult(None, "connection", "refused"),),
        State.DOWN,
        (ReadMetrics,),
        expect={"error_reason": "connection"},
    ),
    Row(
        "no engine series, /v1/models silent: down",
        (ReadResult(Reading(taken_at=NOW)), ModelsAnswer(status=502, detail="HTTP 502")),
        State.DOWN,
        (ReadMetrics, AskModels),
    ),
    Row(
        "busy: no test request, nothing else asked",
        (BUSY,),
        State.BUSY,
        (ReadMetrics,),
    ),
    Row(
        "stalled, the engine's fault tolerance holds it: unknown, no test request",
        (STALLED, ("0",)),
        State.UNKNOWN,
        (ReadMetrics, AskFaults),
    ),
    Row(
        "stalled, no fault held: stalled",
        (STALLED, ()),
        State.STALLED,
        (ReadMetrics, AskFaults),
    ),
    Row(
        "idle llama.cpp that says it sleeps: sleeping, no test request",
        (ReadResult(reading(NOW, "llamacpp")), True),
        State.SLEEPING,
        (ReadMetrics, AskSleeps),
        baseline=reading(NOW - 15.0, "llamacpp"),
    ),
    Row(
        "idle, test request disabled: idle by its counters",
        (IDLE, ()),
        State.IDLE,
        (ReadMetrics, AskFaults),
        target=replace(TARGET, test_request=IdleTestRequestConfig(enabled=False)),
    ),
    Row(
        "idle Triton: no safe test request, idle by its counters",
        (ReadResult(reading(NOW, "triton")),),
        State.IDLE,
        (ReadMetrics,),
        baseline=reading(NOW - 15.0, "triton"),
    ),
    Row(
        "idle, proven alive a moment ago: test request held back",
        (IDLE, ()),
        State.IDLE,
        (ReadMetrics, AskFaults),
        target=replace(TARGET, test_request=IdleTestRequestConfig(min_interval_seconds=300)),
        proven_at=NOW - 30.0,
        expect={"test_request_deferred": True, "test_requests_sent": 0},
    ),
    Row(
        "idle, test request due and answered: idle",
        (IDLE, (), TestRequestResult(True, "answered")),
        State.IDLE,
        (ReadMetrics, AskFaults, SendTestRequest),
        expect={"test_requests_sent": 1, "test_requests_failed": 0},
    ),
    Row(
        "idle, test request failed, the fresh read unchanged: unresponsive",
        (IDLE, (), TestRequestResult(False, "no answer"), IDLE),
        State.UNRESPONSIVE,
        (ReadMetrics, AskFaults, SendTestRequest, ReadMetrics),
        expect={"test_requests_sent": 1, "test_requests_failed": 1},
    ),
    Row(
        "idle, test request failed while work arrived: busy on the fresh read",
        (IDLE, (), TestRequestResult(False, "no answer"), BUSY),
        State.BUSY,
        (ReadMetrics, AskFaults, SendTestRequest, ReadMetrics),
        expect={"test_requests_sent": 1, "test_requests_failed": 1},
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[row.case for row in ROWS])
def test_each_branch_asks_what_it_needs_and_ends_in_its_state(row: Row) -> None:
    """Each branch asks exactly its steps, in order, and ends in its state."""
    taken, result = drive(row)
    assert [type(step) for step in taken] == list(row.steps)
    assert result.verdict.state == row.state, result.verdict
    for name, value in row.expect.items():
        assert getattr(result, name) == value, (name, result)


def test_auto_never_reads_a_path_the_named_engine_marks_unsafe() -> None:
    """`kind: auto` on a server naming trtllm-serve reads its profile's path, not `/metrics`."""
    plan = poll_plan(AUTO, None, NOW)
    assert isinstance(advance(plan, None), AskModels)
    step = advance(plan, ModelsAnswer(200, ("tensorrt_llm",), listed=True))
    assert isinstance(step, ReadMetrics)
    assert step.url == f"{URL}/prometheus/metrics"


def test_the_test_request_carries_the_model_the_metrics_name() -> None:
    """The test request names the model the server's own metrics carry, with the set timeout."""
    plan = poll_plan(TARGET, BASELINE, NOW)
    advance(plan, None)
    advance(plan, IDLE)
    step = advance(plan, ())
    assert step == SendTestRequest("m", "completions", TARGET.test_request.timeout_seconds)


def test_the_fresh_read_after_a_failed_test_request_is_marked() -> None:
    """The read after a failed test request is the same URL, marked as the second read."""
    plan = poll_plan(TARGET, BASELINE, NOW)
    first = advance(plan, None)
    advance(plan, IDLE)
    advance(plan, ())
    again = advance(plan, TestRequestResult(False, "no answer"))
    assert first == ReadMetrics(TARGET.metrics_url)
    assert again == ReadMetrics(TARGET.metrics_url, again=True)


def test_only_the_core_decides_a_poll() -> None:
    """The test-request decisions and allows_test_request are called only in the core."""
    package = Path(__file__).resolve().parents[2] / "stallwatch"
    decisions = {
        "idle_test_request_due",
        "deferred_verdict",
        "settle_idle_test_request",
        "allows_test_request",
        "classify",
    }
    callers = set()
    for path in package.rglob("*.py"):
        if path.is_relative_to(package / "core"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                if name in decisions - {"classify"} or (
                    name == "classify" and path.parent.name in ("exporter", "replay")
                ):
                    callers.add(f"{path.relative_to(package)}: {name}")
    assert callers == set()


def test_an_answer_of_the_wrong_kind_is_refused() -> None:
    """A driver that answers a step with the wrong type gets a TypeError naming the step."""
    plan = poll_plan(TARGET, BASELINE, NOW)
    advance(plan, None)
    with pytest.raises(TypeError, match="ReadMetrics answered with ModelsAnswer"):
        advance(plan, LISTED)
