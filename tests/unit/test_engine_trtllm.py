"""trtllm-serve's decision table: counters that move only at completion never prove a stall."""

from __future__ import annotations

import pytest

from stallwatch.core.classify import State
from stallwatch.engines import profile_for
from tests.unit.engine_support import Case, check, payload, set_sample

IDLE = payload("trtllm-idle.txt")
BUSY_1 = payload("trtllm-busy-1.txt")
BUSY_2 = payload("trtllm-busy-2.txt")
SUCCESS = (
    'trtllm_request_success_total{engine_type="undefined",model_name="undefined",'
    'finished_reason="stop"}'
)

CASES = [
    Case("busy: a request completed", BUSY_1, BUSY_2, State.BUSY, reason="request_success"),
    Case(
        "long request: nothing moves until it completes, never stalled",
        BUSY_1,
        BUSY_1,
        State.UNKNOWN,
        reason="only when a request completes",
    ),
    Case("a stuck server reads unknown, never stalled", BUSY_2, BUSY_2, State.UNKNOWN, gap=900.0),
    Case(
        "gauges 0, nothing moved: idle unprovable, unknown, no test request",
        IDLE,
        IDLE,
        State.UNKNOWN,
        reason="idle is unprovable",
    ),
    Case(
        "restart: a counter went down (multiprocess, no start time)",
        BUSY_2,
        set_sample(BUSY_2, SUCCESS, "1.0"),
        State.RESTARTED,
        restart=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_trtllm_decision_table(case: Case) -> None:
    """Each trtllm-serve pair lands in its row of the decision table."""
    check(case)


def test_metrics_are_read_from_the_prometheus_path_not_the_destructive_json() -> None:
    """`/metrics` drains the stats queue: unsafe; the profile reads `/prometheus/metrics`."""
    profile = profile_for("trtllm")
    assert profile.metrics_path == "/prometheus/metrics"
    assert "/metrics" in {endpoint.path for endpoint in profile.unsafe_endpoints}
    assert "/health_generate" not in profile.safe_paths
