"""The per-target record the exporter keeps between polls."""

from __future__ import annotations

from stallwatch.core.classify import State, Verdict, down
from stallwatch.core.history import PollOutcome, TargetHistory
from stallwatch.core.reading import Reading


def outcome(
    verdict: Verdict,
    at: float,
    *,
    reading: Reading | None = None,
    probes: int = 0,
    failed: int = 0,
    error: str | None = None,
) -> PollOutcome:
    return PollOutcome(
        verdict=verdict,
        reading=reading,
        finished_at=at,
        duration_seconds=0.01,
        test_requests_sent=probes,
        test_requests_failed=failed,
        error_reason=error,
    )


STALLED = Verdict(State.STALLED, "no progress", running=2.0)
BUSY = Verdict(State.BUSY, "moving", running=2.0, progressed=True)


def test_consecutive_polls_in_one_state_are_counted_and_reset_on_change() -> None:
    """state_polls counts a run of one state and starts again at 1 when the state changes."""
    history = TargetHistory()
    for at, verdict, expected in [
        (1, BUSY, 1),
        (2, STALLED, 1),
        (3, STALLED, 2),
        (4, STALLED, 3),
        (5, BUSY, 1),
        (6, STALLED, 1),
    ]:
        history = history.advance(outcome(verdict, at))
        assert history.state_polls == expected, at


def test_a_down_poll_keeps_the_baseline_reading() -> None:
    """A failed read does not replace the last good reading, so a restart is still seen."""
    reading = Reading(taken_at=1.0, process_start_time=100.0)
    history = TargetHistory().advance(outcome(BUSY, 1, reading=reading))
    history = history.advance(outcome(down("refused"), 2, error="connection"))
    assert history.baseline is reading
    assert history.state == State.DOWN
    assert dict(history.poll_errors) == {"connection": 1}


def test_progress_time_moves_only_with_progress_or_proven_idle() -> None:
    """last_progress_at is set by progress or proven idleness, never by a stall."""
    history = TargetHistory().advance(outcome(BUSY, 10))
    history = history.advance(outcome(STALLED, 20))
    assert history.last_progress_at == 10
    idle = Verdict(State.IDLE, "answered")
    history = history.advance(outcome(idle, 30, probes=1))
    assert history.last_progress_at == 30
    pending = Verdict(State.IDLE, "waiting for a test request", test_request_needed=True)
    history = history.advance(outcome(pending, 40))
    assert history.last_progress_at == 30


def test_counters_add_up() -> None:
    """Polls, test requests, failures and restarts accumulate."""
    restarted = Verdict(State.RESTARTED, "new process", restart_detected=True)
    history = TargetHistory()
    history = history.advance(outcome(Verdict(State.UNRESPONSIVE, "x"), 1, probes=1, failed=1))
    history = history.advance(outcome(restarted, 2))
    history = history.advance(outcome(Verdict(State.IDLE, "ok"), 3, probes=1))
    assert (history.polls, history.test_requests, history.test_request_failures) == (3, 2, 1)
    assert history.restarts_detected == 1


UNRESPONSIVE = Verdict(State.UNRESPONSIVE, "test request failed")
RESTARTED = Verdict(State.RESTARTED, "new process", restart_detected=True, test_request_needed=True)


def test_proof_of_life_is_an_answered_test_request_or_counters_that_moved() -> None:
    """Proof of life: when an answered test request was sent, or the read before progress."""
    idle = Verdict(State.IDLE, "idle: answered")
    history = TargetHistory()
    assert history.last_proven_alive_at is None
    history = history.advance(outcome(idle, 100.0, reading=Reading(taken_at=99.5), probes=1))
    assert history.last_proven_alive_at == 100.0 - 0.01  # the poll's start, when it was sent
    history = history.advance(
        outcome(UNRESPONSIVE, 115.0, reading=Reading(taken_at=115.0), probes=1, failed=1)
    )
    assert history.last_proven_alive_at == 100.0 - 0.01  # a failed test request proves nothing
    history = history.advance(outcome(BUSY, 130.0, reading=Reading(taken_at=130.0)))
    assert history.last_proven_alive_at == 115.0  # progress since the previous read
    deferred = Verdict(State.IDLE, "proven alive 15 s ago")
    history = history.advance(
        PollOutcome(deferred, Reading(taken_at=145.0), 145.0, 0.01, test_request_deferred=True)
    )
    assert history.last_proven_alive_at == 115.0
    history = history.advance(
        outcome(RESTARTED, 160.0, reading=Reading(taken_at=160.0), probes=1, failed=1)
    )
    assert history.last_proven_alive_at is None  # the proof was of the old process


def test_a_new_process_proven_by_its_test_request_keeps_that_proof() -> None:
    """A restart whose test request answered is proven alive from that poll on."""
    history = TargetHistory().advance(outcome(BUSY, 10.0, reading=Reading(taken_at=10.0)))
    history = history.advance(outcome(RESTARTED, 25.0, reading=Reading(taken_at=25.0), probes=1))
    assert history.last_proven_alive_at == 25.0 - 0.01


def test_a_deferred_poll_does_not_move_the_progress_time() -> None:
    """An idle poll whose test request was held back leaves last_progress_at on the last proof."""
    answered = Verdict(State.IDLE, "idle: answered")
    history = TargetHistory().advance(outcome(answered, 30.0, probes=1))
    deferred = Verdict(State.IDLE, "proven alive 15 s ago")
    history = history.advance(PollOutcome(deferred, None, 45.0, 0.01, test_request_deferred=True))
    assert history.last_progress_at == 30.0
    assert history.state == State.IDLE
    assert history.state_polls == 2


HUNG = Verdict(State.HUNG, "connected, no answer")
RESTARTED = Verdict(State.RESTARTED, "new start time", restart_detected=True)


def polls(*steps: tuple[float, Verdict]) -> TargetHistory:
    """A history advanced by one poll per step, each with a reading taken at its time."""
    history = TargetHistory()
    for at, verdict in steps:
        reading = None if verdict.state == State.HUNG else Reading(taken_at=at - 0.01)
        history = history.advance(outcome(verdict, at, reading=reading))
    return history


def test_a_stall_is_measured_from_the_read_before_it() -> None:
    """stall_seconds counts from the last read before the first stalled poll, through a hang."""
    history = polls((0, BUSY), (15, STALLED), (30, STALLED), (45, HUNG))
    assert history.stall_since is not None
    assert round(history.stall_seconds) == 45
    assert history.recovered_stalls == 0


def test_a_stall_that_ends_by_itself_is_a_recovered_stall() -> None:
    """A stall ended by progress counts once, with its length kept as the latest and longest."""
    history = polls((0, BUSY), (15, STALLED), (30, STALLED), (45, STALLED), (60, BUSY))
    assert history.stall_seconds == 0.0
    assert history.stall_since is None
    assert history.recovered_stalls == 1
    assert round(history.last_recovered_stall_seconds or 0) == 45
    history = polls((0, BUSY), (15, STALLED), (30, BUSY), (45, STALLED), (60, STALLED), (75, BUSY))
    assert history.recovered_stalls == 2
    assert round(history.last_recovered_stall_seconds or 0) == 30
    assert round(history.longest_recovered_stall_seconds) == 30


def test_a_restart_ends_a_stall_without_a_recovery() -> None:
    """A stall ended by a new process is no near miss: it was restarted, not recovered."""
    history = polls((0, BUSY), (15, STALLED), (30, STALLED), (45, RESTARTED), (60, BUSY))
    assert history.recovered_stalls == 0
    assert history.last_recovered_stall_seconds is None
