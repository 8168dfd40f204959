"""TGI's decision table on payloads faithful to the v3 router (db931fc, after v3.3.7)."""

from __future__ import annotations

import pytest

from stallwatch.core.classify import State
from stallwatch.core.engines import profile_for
from tests.unit.engine_support import Case, check, drop, payload, read, set_sample

IDLE = payload("tgi-3.3.7-idle.txt")
BUSY_1 = payload("tgi-3.3.7-busy-1.txt")
BUSY_2 = payload("tgi-3.3.7-busy-2.txt")
SUCCESS = 'tgi_batch_inference_success{method="%s"}'

CASES = [
    Case("busy: decode calls succeeded", BUSY_1, BUSY_2, State.BUSY, reason="inference_success"),
    Case(
        "long chunked prefill: one prefill call",
        BUSY_1,
        set_sample(BUSY_1, SUCCESS % "prefill", "17"),
        State.BUSY,
    ),
    Case("stalled: work and no call finished", BUSY_2, BUSY_2, State.STALLED),
    Case("idle: the test request decides", IDLE, IDLE, State.IDLE, probe_needed=True),
    Case(
        "restart: batch counter went down (no start time)",
        BUSY_2,
        set_sample(BUSY_2, SUCCESS % "decode", "20"),
        State.RESTARTED,
        restart=True,
        reason="went down",
    ),
    Case(
        "restart: the batch counter vanished (series appear at their first update)",
        BUSY_2,
        drop(BUSY_2, "tgi_batch_inference_success"),
        State.RESTARTED,
        restart=True,
        reason="vanished",
    ),
    Case(
        "trap: no batch counter yet proves no stall",
        drop(BUSY_2, "tgi_batch_inference_success"),
        drop(BUSY_2, "tgi_batch_inference_success"),
        State.UNKNOWN,
        reason="no progress counter",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_tgi_decision_table(case: Case) -> None:
    """Each TGI pair lands in its row of the decision table."""
    check(case)


def test_progress_is_summed_over_method() -> None:
    """`tgi_batch_inference_success` counts prefill and decode calls together."""
    [engine] = read(BUSY_2, 0.0).engines
    assert engine.kind == "tgi"
    assert engine.steps == 16 + 1850
    assert engine.work == 4


def test_health_is_never_safe() -> None:
    """TGI's /health (and / and /ping, the same handler) wait for the shard: unsafe."""
    profile = profile_for("tgi")
    unsafe = {endpoint.path for endpoint in profile.unsafe_endpoints}
    assert {"/health", "/", "/ping"} <= unsafe
    assert not unsafe & profile.safe_paths
