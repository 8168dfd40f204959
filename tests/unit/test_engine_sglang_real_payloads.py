"""SGLang's decision table on payloads captured from a real SGLang 0.5.23 server on the CPU
(tests/testdata/real-metrics/sglang-*; nothing edited), read by the exporter's own parser."""

from __future__ import annotations

import pytest

from stallwatch.core.classify import State, Verdict, classify
from stallwatch.core.reading import parse_reading
from tests.support.real_payloads import real_payload

GAP = 3.0


def captured(case: str) -> str:
    return real_payload(f"sglang-0.5.23-cpu-{case}.txt")


def judge(previous: str | None, current: str) -> Verdict:
    before = parse_reading(captured(previous), taken_at=0.0) if previous else None
    return classify(before, parse_reading(captured(current), taken_at=GAP))


def gauge(case: str, name: str) -> float:
    reading = parse_reading(captured(case), taken_at=0.0)
    value = getattr(reading.engines[0], name)
    assert value is not None
    return float(value)


# (previous, current, state, a test request asked for, in the reason)
CASES = [
    ("idle-1", "idle-2", State.IDLE, True, "idle test request"),
    ("busy-1", "busy-2", State.BUSY, False, "cuda_graph_passes_total"),
    ("chunked-prefill-1", "chunked-prefill-2", State.BUSY, False, "in flight"),
    ("frozen-1", "frozen-2", State.STALLED, False, "no progress"),
    # The prefill ended between the two reads: its passes moved, nothing is in flight now.
    ("chunked-prefill-2", "after-prefill-1", State.IDLE, False, "completed"),
    ("busy-2", "after-work-1", State.BUSY, False, "num_requests_total"),
    # Just after the work: the running gauge still shows the four finished requests, nothing
    # is in flight, nothing moved.
    ("after-work-1", "after-work-1", State.IDLE, True, "stale"),
    ("after-work-1", "after-work-2", State.IDLE, True, "idle test request"),
    # The scheduler frozen in a long prefill: every scheduler series as it was, one /generate
    # in flight, both work gauges at 0.
    ("chunked-prefill-2", "chunked-prefill-2", State.STALLED, False, "in flight"),
    (None, "loading-1", State.UNKNOWN, False, "still loading"),
    ("loading-1", "loading-1", State.UNKNOWN, False, "still loading"),
    ("after-work-2", "loading-1", State.RESTARTED, False, "still loading"),
    ("after-work-2", "restarted-1", State.RESTARTED, True, "went down"),
    ("loading-1", "restarted-1", State.IDLE, True, "idle test request"),
    # The Rust HTTP frontend: no http_requests_* family at all.
    ("rust-idle-1", "rust-idle-2", State.IDLE, True, "idle test request"),
    ("rust-busy-1", "rust-busy-2", State.BUSY, False, "cuda_graph_passes_total"),
]


@pytest.mark.parametrize(
    ("previous", "current", "state", "probe", "reason"),
    CASES,
    ids=[f"{previous}->{current}" for previous, current, *_ in CASES],
)
def test_real_sglang_payload_pairs_read_right(
    previous: str | None, current: str, state: State, probe: bool, reason: str
) -> None:
    """Each pair of real payloads reads the state the real server was in, and asks for a test
    request only where the server was idle."""
    verdict = judge(previous, current)
    assert (verdict.state, verdict.test_request_needed) == (state, probe), verdict.reason
    assert reason in verdict.reason


def test_real_chunked_prefill_shows_both_work_gauges_at_zero() -> None:
    """The trap itself, as the real server published it: mid-prefill both work gauges are 0."""
    for case in ("chunked-prefill-1", "chunked-prefill-2"):
        assert gauge(case, "running") == 0.0
        assert gauge(case, "waiting") == 0.0


def test_real_rust_frontend_payloads_have_no_http_family() -> None:
    """With `SGLANG_RUST_SERVER=1` nothing counts requests in flight at the HTTP layer."""
    for case in ("rust-idle-1", "rust-busy-2"):
        assert parse_reading(captured(case), taken_at=0.0).inflight_requests is None
        assert "sglang:http_requests_" not in captured(case)


def test_real_payloads_carry_no_process_start_time() -> None:
    """A restart can only show as counters going down: no payload has a start time."""
    for case in ("idle-1", "busy-1", "loading-1", "restarted-1"):
        assert parse_reading(captured(case), taken_at=0.0).process_start_time is None
