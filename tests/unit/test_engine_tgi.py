"""TGI's decision table on payloads faithful to the v3 router (db931fc, after v3.3.7)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stallwatch.core.classify import State
from stallwatch.engines import profile_for
from tests.unit.engine_support import Case, check, drop, judge, payload, read, set_sample

IDLE = payload("tgi-3.3.7-idle.txt")
BUSY_1 = payload("tgi-3.3.7-busy-1.txt")
BUSY_2 = payload("tgi-3.3.7-busy-2.txt")
FRESH = payload("tgi-3.3.7-fresh.txt")
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
    Case("idle: the test request decides", IDLE, IDLE, State.IDLE, test_request_needed=True),
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


FRESH_CASES = [
    Case("fresh TGI, first read: nothing published yet", None, FRESH, State.NO_METRICS),
    Case("fresh TGI, read again: still nothing", FRESH, FRESH, State.NO_METRICS),
    Case(
        "a new TGI after a busy one: not judged until it publishes", BUSY_2, FRESH, State.NO_METRICS
    ),
    Case(
        "its first request served: idle, the test request rule as on any first read",
        FRESH,
        IDLE,
        State.IDLE,
        test_request_needed=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_tgi_decision_table(case: Case) -> None:
    """Each TGI pair lands in its row of the decision table."""
    check(case)


@pytest.mark.parametrize("kind", ["auto", "tgi"])
@pytest.mark.parametrize("case", FRESH_CASES, ids=[case.name for case in FRESH_CASES])
def test_fresh_tgi_reads_no_metrics_saying_no_request_was_seen(case: Case, kind: str) -> None:
    """A TGI before its first request (an empty /metrics) reads no_metrics with the reason that
    says so, sends no test request and is never restarted, whether auto-detected or forced."""
    reason = "no request seen yet" if case.current == FRESH else ""
    check(replace(case, reason=reason), kind)


def test_only_a_payload_without_any_sample_is_empty() -> None:
    """Comments alone are empty; one sample of no engine is not, and keeps the generic reason."""
    assert read("# HELP tgi_queue_size Current queue size\n\n", 0.0).empty
    other = read("process_start_time_seconds 1.7e9\n", 0.0)
    assert not other.empty
    verdict = judge(Case("other", None, "process_start_time_seconds 1.7e9\n", State.NO_METRICS))
    assert verdict.reason == "reachable, but no engine series"


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
