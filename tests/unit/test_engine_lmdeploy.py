"""LMDeploy's decision table on payloads faithful to 0.18.0: no counter during a prefill."""

from __future__ import annotations

import pytest

from stallwatch.core.classify import State
from stallwatch.engines import profile_for
from tests.unit.engine_support import Case, check, payload, set_sample

IDLE = payload("lmdeploy-0.18.0-idle.txt")
BUSY_1 = payload("lmdeploy-0.18.0-busy-1.txt")
BUSY_2 = payload("lmdeploy-0.18.0-busy-2.txt")
RUNNING = 'lmdeploy:num_requests_running{engine="0",model_name="internlm"}'

CASES = [
    Case("busy: tokens generated", BUSY_1, BUSY_2, State.BUSY, reason="generation_tokens"),
    Case(
        "long prefill: nothing moves, never stalled",
        BUSY_2,
        BUSY_2,
        State.UNKNOWN,
        reason="no counter during a whole prefill",
    ),
    Case(
        "a stuck engine reads unknown too, with the reason",
        BUSY_2,
        BUSY_2,
        State.UNKNOWN,
        gap=600.0,
    ),
    Case("idle: the test request decides", IDLE, IDLE, State.IDLE, test_request_needed=True),
    Case(
        "restart: a new start time",
        BUSY_2,
        set_sample(BUSY_1, "process_start_time_seconds", "1.7646e+09"),
        State.RESTARTED,
        restart=True,
        reason="start time",
    ),
    Case(
        "trap: running 0 (10 s refresh) while tokens move is busy",
        set_sample(BUSY_1, RUNNING, "0.0"),
        set_sample(BUSY_2, RUNNING, "0.0"),
        State.BUSY,
        reason="every 10 s",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_lmdeploy_decision_table(case: Case) -> None:
    """Each LMDeploy pair lands in its row of the decision table."""
    check(case)


def test_sleep_is_read_from_health_which_is_safe() -> None:
    """LMDeploy's /health is a cached snapshot that says `sleeping`: the sleep check."""
    profile = profile_for("lmdeploy")
    assert profile.sleep_check is not None
    assert (profile.sleep_check.path, profile.sleep_check.equals) == ("/health", "sleeping")
    assert "/health" in profile.safe_paths
