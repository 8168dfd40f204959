"""llama.cpp's decision table on b10434 payloads: the start header and 6-digit counters."""

from __future__ import annotations

import pytest

from stallwatch.core.classify import State, classify
from stallwatch.engines import profile_for
from tests.support.real_payloads import real_payload
from tests.unit.engine_support import Case, check, payload, read, set_sample

IDLE = payload("llamacpp-b10434-idle.txt")
BUSY_1 = payload("llamacpp-b10434-busy-1.txt")
BUSY_2 = payload("llamacpp-b10434-busy-2.txt")
HIGH_1 = payload("llamacpp-b10434-high-busy-1.txt")
HIGH_2 = payload("llamacpp-b10434-high-busy-2.txt")
HIGH_PREFILL = payload("llamacpp-b10434-high-prefill-1.txt")
# Monotonic microseconds since boot, as the header carries them (not Unix time).
MARKER = "1323807837"


def one_prefill_batch(text: str) -> str:
    """One slot prefilling a long prompt: one more decode call, nothing else moves."""
    edited = set_sample(text, "llamacpp:n_decode_total", "599")
    return set_sample(edited, "llamacpp:requests_processing", "1")


CASES = [
    Case("busy: decode calls moved", BUSY_1, BUSY_2, State.BUSY, reason="n_decode_total"),
    Case(
        "long prefill: one batch since the last read", BUSY_2, one_prefill_batch(BUSY_2), State.BUSY
    ),
    Case("stalled: work and no decode call", BUSY_2, BUSY_2, State.STALLED),
    Case("idle: the test request decides", IDLE, IDLE, State.IDLE, test_request_needed=True),
    Case(
        "restart: counters went down",
        BUSY_2,
        BUSY_1.replace("llamacpp:n_decode_total 457", "llamacpp:n_decode_total 12"),
        State.RESTARTED,
        restart=True,
    ),
    Case("trap: counters past 1e6 still show a busy server", HIGH_1, HIGH_2, State.BUSY),
    Case(
        "trap: a flat counter at 1.2e7 is no proof of a stall",
        HIGH_2,
        HIGH_2,
        State.UNKNOWN,
        reason="6 significant digits: increases under 100 do not show",
    ),
    Case(
        "trap: a long prefill at 1.2e7 is not stuck",
        HIGH_2,
        HIGH_PREFILL,
        State.UNKNOWN,
        reason="no proof of a stall",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_llamacpp_decision_table(case: Case) -> None:
    """Each llama.cpp pair lands in its row of the decision table."""
    check(case)


def test_header_marker_changed_is_a_restart() -> None:
    """A new Process-Start-Time-Unix value is a new process, with the counters still growing."""
    verdict = classify(read(BUSY_1, 0.0, marker=MARKER), read(BUSY_2, 15.0, marker="1400000000"))
    assert verdict.state == State.RESTARTED
    assert "marker" in verdict.reason


def test_header_marker_is_compared_for_equality_only() -> None:
    """The same monotonic value, far below any Unix time, is the same process."""
    verdict = classify(read(BUSY_1, 0.0, marker=MARKER), read(BUSY_2, 15.0, marker=MARKER))
    assert verdict.state == State.BUSY
    assert not verdict.restart_detected


def test_predicted_tokens_moving_only_at_request_end_is_no_stall_evidence() -> None:
    """tokens_predicted_total stays 0 during decoding; n_decode_total alone shows the work."""
    previous, current = read(BUSY_1, 0.0), read(BUSY_2, 15.0)
    assert previous.engines[0].generation_tokens == current.engines[0].generation_tokens == 0
    assert classify(previous, current).state == State.BUSY


def test_real_payload_of_an_older_build_is_read() -> None:
    """The captured 0c1e57098 payloads are read as llama.cpp and their pair as busy."""
    first = read(real_payload("llamacpp-0c1e57098-cpu-busy-1.txt"), 0.0)
    second = read(real_payload("llamacpp-0c1e57098-cpu-busy-2.txt"), 1.0)
    assert first.engine_kind == "llamacpp"
    assert classify(first, second).state == State.BUSY


def test_slots_is_never_called_and_props_is_the_sleep_check() -> None:
    """/slots wakes a sleeping server: unsafe; sleep is read from /props, which does not."""
    profile = profile_for("llamacpp")
    assert "/slots" in {endpoint.path for endpoint in profile.unsafe_endpoints}
    assert "/slots" not in profile.safe_paths
    assert profile.sleep_check is not None
    assert profile.sleep_check.path == "/props"
    assert "/props" in profile.safe_paths
