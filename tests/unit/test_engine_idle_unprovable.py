"""Work gauges that lag the work never send a test request: trtllm-serve, SGLang with a
generation request in flight at its HTTP layer, TGI with a forward in flight."""

from __future__ import annotations

import pytest

from stallwatch.core.classify import State, classify
from stallwatch.engines import PROFILES, profile_for
from tests.unit.engine_support import drop, payload, read, set_sample

TRT_IDLE = payload("trtllm-idle.txt")
TRT_BUSY_2 = payload("trtllm-busy-2.txt")
TRT_SUCCESS = (
    'trtllm_request_success_total{engine_type="undefined",model_name="undefined",'
    'finished_reason="stop"}'
)
SG_IDLE = payload("sglang-0.5.23-idle.txt")
SCHED = 'engine_type="unified",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
SG_IDLE_SECONDS = "sglang:scheduler_idle_seconds_total{" + SCHED + "}"
SG_GENERATING = (
    'sglang:http_requests_active{endpoint="/v1/chat/completions",method="POST",'
    'engine_type="unified",model_name="qwen"}'
)


def test_trtllm_idle_to_busy_with_gauges_still_zero_sends_no_test_request() -> None:
    """Idle, then three requests in flight that moved nothing: unknown, no test request."""
    # The iteration stats behind the gauges are drained only at a completion: three new
    # requests in flight leave the payload exactly as it was while idle.
    verdict = classify(read(TRT_IDLE, 0.0), read(TRT_IDLE, 15.0))
    assert verdict.state == State.UNKNOWN, verdict.reason
    assert not verdict.test_request_needed
    assert "idle is unprovable" in verdict.reason


def test_trtllm_first_read_without_work_sends_no_test_request() -> None:
    """The first read of a trtllm-serve with gauges at 0 is unknown, never idle by a test."""
    verdict = classify(None, read(TRT_IDLE, 0.0))
    assert verdict.state == State.UNKNOWN, verdict.reason
    assert not verdict.test_request_needed


def test_trtllm_restart_without_work_sends_no_test_request() -> None:
    """A new trtllm-serve process shows its start-up gauges (0): restarted, no test request."""
    restarted = set_sample(TRT_IDLE, TRT_SUCCESS, "1.0")
    verdict = classify(read(TRT_IDLE, 0.0), read(restarted, 15.0))
    assert verdict.state == State.RESTARTED
    assert not verdict.test_request_needed
    assert "no test request" in verdict.reason


def test_trtllm_requests_completed_with_no_work_is_idle_by_real_traffic() -> None:
    """Completions with gauges at 0 are idle, proven by traffic, and ask for no test request."""
    completed = set_sample(TRT_IDLE, TRT_SUCCESS, "19.0")
    verdict = classify(read(TRT_IDLE, 0.0), read(completed, 15.0))
    assert verdict.state == State.IDLE
    assert verdict.progressed
    assert not verdict.test_request_needed


def test_sglang_generation_in_flight_with_gauges_zero_and_nothing_moved_reads_stalled() -> None:
    """SGLang: gauges 0, nothing moved, one generation in flight, the idle loop still: stalled
    (a scheduler frozen in a long prefill), and no test request."""
    # The log-point gauges are 0 during a chunked prefill; no pass between the two reads and an
    # idle loop that did not turn: the scheduler neither forwards nor idles, as in a decode stall.
    busy = set_sample(SG_IDLE, SG_GENERATING, "1.0")
    verdict = classify(read(SG_IDLE, 0.0), read(busy, 15.0))
    assert verdict.state == State.STALLED, verdict.reason
    assert not verdict.test_request_needed
    assert "in flight at the HTTP layer" in verdict.reason


def test_sglang_generation_in_flight_without_an_idle_loop_counter_sends_no_test_request() -> None:
    """SGLang without `scheduler_idle_seconds_total`: gauges 0, nothing moved, one generation
    in flight: unknown, never a test request (nothing tells a frozen loop from a lagging one)."""
    idle = drop(SG_IDLE, SG_IDLE_SECONDS.split("{")[0])
    busy = set_sample(idle, SG_GENERATING, "1.0")
    verdict = classify(read(idle, 0.0), read(busy, 15.0))
    assert verdict.state == State.UNKNOWN, verdict.reason
    assert not verdict.test_request_needed
    assert "in flight at the HTTP layer" in verdict.reason


def test_sglang_in_flight_request_with_the_idle_loop_turning_lets_the_test_decide() -> None:
    """SGLang: a request held at the HTTP layer while the scheduler idles: a test may decide."""
    before = set_sample(SG_IDLE, SG_GENERATING, "1.0")
    after = set_sample(before, SG_IDLE_SECONDS, "1826.204")
    verdict = classify(read(before, 0.0), read(after, 15.0))
    assert verdict.state == State.IDLE, verdict.reason
    assert verdict.test_request_needed


def test_sglang_nothing_in_flight_and_gauges_zero_still_asks_for_the_test_request() -> None:
    """SGLang: gauges 0 and no generation in flight: idle, the test request decides."""
    verdict = classify(read(SG_IDLE, 0.0), read(SG_IDLE, 15.0))
    assert verdict.state == State.IDLE
    assert verdict.test_request_needed


@pytest.mark.parametrize("kind", sorted(PROFILES))
def test_every_profile_says_whether_its_gauges_can_prove_idleness(kind: str) -> None:
    """Only trtllm-serve is idle-unprovable by profile; SGLang covers its lag with fresh data."""
    profile = profile_for(kind)
    assert bool(profile.idle_unprovable) == (kind == "trtllm"), kind
    if profile.work_gauge_lag_seconds and not profile.idle_unprovable and kind == "sglang":
        assert profile.inflight is not None


def test_a_busy_trtllm_that_moved_nothing_stays_unknown() -> None:
    """Work reported (stale from the last completion) and nothing moved: unknown, no test."""
    verdict = classify(read(TRT_BUSY_2, 0.0), read(TRT_BUSY_2, 15.0))
    assert verdict.state == State.UNKNOWN
    assert not verdict.test_request_needed


TGI_IDLE = payload("tgi-3.3.7-idle.txt")
TGI_PREFILLS = 'tgi_batch_inference_count{method="prefill"}'


def test_tgi_first_prefill_from_idle_is_work_though_its_gauges_read_zero() -> None:
    """TGI: a prefill begun from idle (count ahead of success) is busy, never a test request."""
    # The batch was taken from the queue (tgi_queue_size 0) and decoding has not begun
    # (tgi_batch_current_size 0): only the forward counted before its call shows the work.
    started = set_sample(TGI_IDLE, TGI_PREFILLS, "13")
    verdict = classify(read(TGI_IDLE, 0.0), read(started, 15.0))
    assert verdict.state == State.BUSY, verdict.reason
    assert not verdict.test_request_needed
    assert "a forward in flight" in verdict.reason


def test_tgi_prefill_longer_than_the_interval_reads_as_work_without_progress() -> None:
    """TGI: the same forward still in flight a read later is stalled, as with gauges above 0."""
    started = set_sample(TGI_IDLE, TGI_PREFILLS, "13")
    verdict = classify(read(started, 0.0), read(started, 15.0))
    assert verdict.state == State.STALLED, verdict.reason
    assert not verdict.test_request_needed


def test_tgi_idle_with_every_forward_ended_still_asks_for_the_test_request() -> None:
    """TGI: gauges 0 and every forward counted ended: idle, the test request decides."""
    verdict = classify(read(TGI_IDLE, 0.0), read(TGI_IDLE, 15.0))
    assert verdict.state == State.IDLE
    assert verdict.test_request_needed
