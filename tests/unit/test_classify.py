"""The decision table, row by row, on pairs of real vLLM payloads and their edge cases."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from stallwatch.core.classify import (
    State,
    classify,
    down,
    restart_evidence,
    with_test_request_result,
)
from stallwatch.core.reading import Reading, parse_reading
from tests.support.real_payloads import real_payload

IDLE = "vllm-0.32.0-cpu-idle-1.txt"
BUSY_1 = "vllm-0.32.0-cpu-busy-1.txt"
BUSY_2 = "vllm-0.32.0-cpu-busy-2.txt"
PREFILL_1 = "vllm-0.32.0-cpu-chunked-prefill-1.txt"
PREFILL_2 = "vllm-0.32.0-cpu-chunked-prefill-2.txt"
NO_ENGINE = "a payload with no engine's families"


def set_sample(payload: str, sample: str, value: float) -> str:
    """Replace the value of every line that starts with `sample` (name plus labels)."""
    pattern = re.compile(rf"^({re.escape(sample)}) \S+$", re.MULTILINE)
    edited, count = pattern.subn(lambda m: f"{m.group(1)} {value!r}", payload)
    assert count, f"no sample {sample}"
    return edited


def drop_samples(payload: str, prefix: str) -> str:
    return "\n".join(line for line in payload.splitlines() if not line.startswith(prefix))


ENGINE = '{engine="0",model_name="tiny"}'


def sleeping(payload: str) -> str:
    return set_sample(
        payload, 'vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="awake"}', 0.0
    )


def finished(payload: str) -> str:
    """The busy payload after its requests finished: no work, one more completion."""
    edited = set_sample(payload, f"vllm:num_requests_running{ENGINE}", 0.0)
    return set_sample(
        edited,
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"}',
        8.0,
    )


def new_process(payload: str) -> str:
    return set_sample(payload, "process_start_time_seconds", 1.9e9)


def multiprocess(payload: str) -> str:
    """What --api-server-count > 1 gives: no process_ series."""
    return drop_samples(payload, "process_")


def counters_reset(payload: str) -> str:
    return set_sample(payload, f"vllm:iteration_tokens_total_count{ENGINE}", 3.0)


def read(payload: str, at: float) -> Reading:
    return parse_reading(payload, taken_at=at)


@dataclass(frozen=True)
class Case:
    name: str
    previous: str | None
    current: str
    state: State
    test_request_needed: bool = False
    restart_detected: bool = False


def fixture(name: str) -> str:
    if name == NO_ENGINE:
        return multiprocess(real_payload(IDLE)).replace("vllm:", "other:")
    return real_payload(name)


CASES = [
    Case("busy to busy: steps and tokens moved", BUSY_1, BUSY_2, State.BUSY),
    Case("long prefill: only kv usage moved", PREFILL_1, PREFILL_2, State.BUSY),
    Case("frozen busy server", BUSY_2, BUSY_2, State.STALLED),
    Case("frozen prefill", PREFILL_2, PREFILL_2, State.STALLED),
    Case("idle, nothing completed: test request decides", IDLE, IDLE, State.IDLE, True),
    Case("first read with work", None, BUSY_1, State.UNKNOWN),
    Case("first read without work: test request decides", None, IDLE, State.IDLE, True),
    Case("no engine series", BUSY_1, NO_ENGINE, State.NO_METRICS),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_decision_table_on_real_payloads(case: Case) -> None:
    """Each pair of real payloads lands in the row of the decision table it belongs to."""
    previous = read(fixture(case.previous), 0.0) if case.previous else None
    verdict = classify(previous, read(fixture(case.current), 1.0))
    assert verdict.state == case.state, verdict.reason
    assert verdict.test_request_needed == case.test_request_needed
    assert verdict.restart_detected == case.restart_detected


def test_requests_completed_without_work_is_idle_without_a_test_request() -> None:
    """No work and completions since the last read: idle, proven by real traffic."""
    busy = fixture(BUSY_2)
    verdict = classify(read(busy, 0.0), read(finished(busy), 1.0))
    assert verdict.state == State.IDLE
    assert not verdict.test_request_needed


def test_sleeping_engine_is_sleeping() -> None:
    """An engine whose awake state is 0 is sleeping, never probed."""
    idle = fixture(IDLE)
    verdict = classify(read(idle, 0.0), read(sleeping(idle), 1.0))
    assert verdict.state == State.SLEEPING
    assert not verdict.test_request_needed


def test_restart_detected_by_start_time_with_work() -> None:
    """A changed start time is a restart; counters are not compared across processes."""
    verdict = classify(read(fixture(BUSY_2), 0.0), read(new_process(fixture(BUSY_1)), 1.0))
    assert verdict.state == State.RESTARTED
    assert verdict.restart_detected
    assert not verdict.test_request_needed  # the new process has work
    assert verdict.steps_per_second is None


def test_restart_detected_by_start_time_when_idle_asks_for_a_test_request() -> None:
    """A restarted process with no work may get one test request."""
    verdict = classify(read(fixture(BUSY_2), 0.0), read(new_process(fixture(IDLE)), 1.0))
    assert verdict.state == State.RESTARTED
    assert verdict.test_request_needed


def test_restart_detected_by_counter_going_down_without_start_time() -> None:
    """In multiprocess mode (no start time) a counter that went down is a restart."""
    before = multiprocess(fixture(BUSY_2))
    after = counters_reset(multiprocess(fixture(BUSY_2)))
    assert read(after, 1.0).process_start_time is None
    verdict = classify(read(before, 0.0), read(after, 1.0))
    assert verdict.state == State.RESTARTED
    assert "went down" in verdict.reason


def test_same_start_time_and_growing_counters_is_not_a_restart() -> None:
    """Ordinary progress is never mistaken for a restart."""
    assert restart_evidence(read(fixture(BUSY_1), 0), read(fixture(BUSY_2), 1)) is None


def test_multiprocess_gauges_without_samples_do_not_break_the_decision() -> None:
    """Missing gauges read as unknown; a server without them is judged on its counters."""
    payload = drop_samples(multiprocess(fixture(IDLE)), "vllm:num_requests_")
    payload = drop_samples(payload, "vllm:kv_cache_usage_perc")
    verdict = classify(read(payload, 0.0), read(payload, 1.0))
    assert verdict.running is None
    assert verdict.state == State.IDLE
    assert verdict.test_request_needed


def two_engines(steps_0: float, steps_1: float, running: float = 2.0) -> str:
    lines = []
    for engine, steps in (("0", steps_0), ("1", steps_1)):
        labels = f'engine="{engine}",model_name="m"'
        lines += [
            f"vllm:num_requests_running{{{labels}}} {running}",
            f"vllm:num_requests_waiting{{{labels}}} 0",
            f"vllm:iteration_tokens_total_count{{{labels}}} {steps}",
            f"vllm:generation_tokens_total{{{labels}}} {steps}",
        ]
    return "\n".join(lines)


def test_one_of_two_engines_stalls_and_the_server_is_stalled() -> None:
    """Each engine is judged on its own; the server takes the worst state."""
    verdict = classify(read(two_engines(10, 10), 0.0), read(two_engines(20, 10), 1.0))
    assert verdict.state == State.STALLED
    assert "engine 1" in verdict.reason
    assert [e.state for e in verdict.engines] == [State.BUSY, State.STALLED]


def test_both_engines_moving_is_busy_and_rates_add_up() -> None:
    """Rates sum over engines between two reads of the same process."""
    verdict = classify(read(two_engines(10, 10), 0.0), read(two_engines(20, 40), 2.0))
    assert verdict.state == State.BUSY
    assert verdict.steps_per_second == pytest.approx(20.0)
    assert verdict.tokens_per_second == pytest.approx(20.0)


def test_a_server_with_work_is_never_asked_for_a_test_request() -> None:
    """Work on any engine rules out the test request, even if another engine is idle."""
    payload_0 = two_engines(10, 10, running=0.0).replace(
        'vllm:num_requests_running{engine="0",model_name="m"} 0.0',
        'vllm:num_requests_running{engine="0",model_name="m"} 3',
    )
    payload_1 = payload_0.replace(
        'vllm:iteration_tokens_total_count{engine="0",model_name="m"} 10',
        'vllm:iteration_tokens_total_count{engine="0",model_name="m"} 11',
    )
    verdict = classify(read(payload_0, 0.0), read(payload_1, 1.0))
    assert verdict.state == State.BUSY
    assert not verdict.test_request_needed


def test_failed_test_request_makes_an_idle_server_unresponsive() -> None:
    """The idle test request settles the verdict: failure is unresponsive, success idle."""
    idle = read(fixture(IDLE), 0.0)
    pending = classify(idle, read(fixture(IDLE), 1.0))
    assert with_test_request_result(pending, False, "timeout").state == State.UNRESPONSIVE
    settled = with_test_request_result(pending, True, "answered")
    assert settled.state == State.IDLE
    assert not settled.test_request_needed


def test_probe_result_never_changes_a_verdict_that_did_not_ask_for_one() -> None:
    """A busy verdict stays busy whatever a test request would say."""
    busy = classify(read(fixture(BUSY_1), 0.0), read(fixture(BUSY_2), 1.0))
    assert with_test_request_result(busy, False, "timeout") is busy


def test_down_verdict() -> None:
    """An unreachable server is down with the reason kept."""
    verdict = down("connection refused")
    assert verdict.state == State.DOWN
    assert verdict.reason == "connection refused"
