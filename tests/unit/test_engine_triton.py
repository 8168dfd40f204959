"""Triton with the TensorRT-LLM backend: the per-iteration counter proves progress."""

from __future__ import annotations

import pytest

from stallwatch.core.classify import State
from stallwatch.core.poll_plan import allows_test_request
from stallwatch.core.reading import parse_reading
from tests.unit.engine_support import Case, check, drop, payload, set_sample

IDLE = payload("triton-trtllm-idle.txt")
BUSY_1 = payload("triton-trtllm-busy-1.txt")
BUSY_2 = payload("triton-trtllm-busy-2.txt")
ITERATION = (
    'nv_trt_llm_general_metrics{model="tensorrt_llm",version="1",general_type="iteration_counter"}'
)

CASES = [
    Case("busy: iterations moved", BUSY_1, BUSY_2, State.BUSY, reason="nv_trt_llm_general_metrics"),
    Case(
        "long context phase: one iteration",
        BUSY_1,
        set_sample(BUSY_1, ITERATION, "20612"),
        State.BUSY,
    ),
    Case("stalled: active requests, iteration counter still", BUSY_2, BUSY_2, State.STALLED),
    Case("idle: no work, nothing moved", IDLE, IDLE, State.IDLE, test_request_needed=True),
    Case(
        "restart: the iteration counter started again",
        BUSY_2,
        set_sample(BUSY_2, ITERATION, "12"),
        State.RESTARTED,
        restart=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_triton_decision_table(case: Case) -> None:
    """Each Triton pair lands in its row of the decision table."""
    check(case)


def test_triton_without_the_trtllm_backend_is_not_an_engine() -> None:
    """Triton's core families alone (any model) are not read as an LLM engine."""
    reading = parse_reading(drop(BUSY_2, "nv_trt_llm_"), taken_at=0.0)
    assert not reading.has_engines


def test_triton_gets_no_test_request() -> None:
    """Triton has no OpenAI endpoint: no idle test request is allowed."""
    assert not allows_test_request("triton", "completions")
    assert allows_test_request("vllm", "completions")
