"""The idle test request: when one is due, and settling a verdict from its answer or failure."""

from __future__ import annotations

import pytest

from stallwatch.core.classify import State, Verdict, classify
from stallwatch.core.history import PollOutcome, TargetHistory
from stallwatch.core.idle_test_request import (
    deferred_verdict,
    idle_test_request_due,
    settle_idle_test_request,
)
from stallwatch.core.reading import EngineSample, Reading
from stallwatch.core.rules import UNRESPONSIVE_ALERT, restart_alert_fires

START = 1_000.0


def read(
    at: float,
    *,
    steps: float = 100.0,
    running: float = 0.0,
    completed: float = 10.0,
    started: float = START,
) -> Reading:
    sample = EngineSample(
        model_name="m",
        engine="0",
        running=running,
        waiting=0.0,
        kv_cache_usage=0.0,
        awake=1.0,
        steps=steps,
        generation_tokens=steps * 8,
        prompt_tokens=steps * 4,
        requests_completed=completed,
        preemptions=0.0,
    )
    return Reading(taken_at=at, engines=(sample,), process_start_time=started)


BASELINE = read(0.0)
IDLE_READ = read(15.0)
IDLE_VERDICT = classify(BASELINE, IDLE_READ)
RESTARTED_IDLE_VERDICT = classify(BASELINE, read(15.0, steps=0.0, completed=0.0, started=2_000.0))

# (case, answered, reread, state, which reading the outcome keeps, probes failed)
CASES: list[tuple[str, bool, Reading | None, State, str, int]] = [
    ("answered: idle", True, None, State.IDLE, "first", 0),
    ("answered: a reread is ignored", True, read(25.0, steps=120.0), State.IDLE, "first", 0),
    ("failed, no reread: unresponsive", False, None, State.UNRESPONSIVE, "first", 1),
    ("failed, reread unchanged: unresponsive", False, read(25.0), State.UNRESPONSIVE, "first", 1),
    (
        "failed, reread with no engines",
        False,
        Reading(taken_at=25.0),
        State.UNRESPONSIVE,
        "first",
        1,
    ),
    (
        "failed, engine stepping again: busy",
        False,
        read(25.0, steps=120.0, running=1.0),
        State.BUSY,
        "reread",
        1,
    ),
    (
        "failed, requests completed meanwhile: idle",
        False,
        read(25.0, steps=120.0, completed=12.0),
        State.IDLE,
        "reread",
        1,
    ),
    (
        "failed, stalled work meanwhile",
        False,
        read(25.0, running=1.0),
        State.UNRESPONSIVE,
        "first",
        1,
    ),
    (
        "failed, new process in the reread",
        False,
        read(25.0, steps=5.0, started=2_000.0),
        State.UNRESPONSIVE,
        "first",
        1,
    ),
]


@pytest.mark.parametrize(
    ("case", "answered", "reread", "state", "kept", "failed"), CASES, ids=[c[0] for c in CASES]
)
def test_settle_probe(
    case: str, answered: bool, reread: Reading | None, state: State, kept: str, failed: int
) -> None:
    """The test request decides idle vs unresponsive unless a reread shows the engine moving."""
    settled = settle_idle_test_request(
        IDLE_VERDICT, IDLE_READ, answered=answered, detail="why", reread=reread
    )
    assert settled.verdict.state == state, case
    assert not settled.verdict.test_request_needed, case
    assert settled.reading is (IDLE_READ if kept == "first" else reread), case
    assert settled.test_requests_failed == failed, case


def test_the_detail_goes_into_the_reason() -> None:
    """The test request's own detail (status, timeout) is kept in the verdict's reason."""
    answered = settle_idle_test_request(IDLE_VERDICT, IDLE_READ, answered=True, detail="HTTP 200")
    failed = settle_idle_test_request(
        IDLE_VERDICT, IDLE_READ, answered=False, detail="timed out after 10 s"
    )
    assert answered.verdict.reason == "idle: HTTP 200"
    assert failed.verdict.reason.endswith("the test request failed: timed out after 10 s")


def test_a_restarted_server_stays_restarted_whatever_the_test_request_says() -> None:
    """A new process is reported as restarted; the test request only adds to the reason."""
    for answered in (True, False):
        settled = settle_idle_test_request(
            RESTARTED_IDLE_VERDICT, IDLE_READ, answered=answered, detail="x", reread=None
        )
        assert settled.verdict.state == State.RESTARTED
        assert settled.verdict.reason.endswith("test request: x")


MIN_INTERVAL = 60.0
POLL_INTERVAL = 15.0
NOW = 10_000.0
BUSY_VERDICT = Verdict(State.BUSY, "moving", running=1.0, progressed=True)
# Two engines: one finished requests since the last read, the other did nothing.
ENGINE_COMPLETED_VERDICT = Verdict(
    State.IDLE, "one engine idle", progressed=True, test_request_needed=True
)

# (case, verdict, seconds since the last proof of life (None: never), min_interval, due)
DUE_CASES: list[tuple[str, Verdict, float | None, float, bool]] = [
    ("work present: never", BUSY_VERDICT, None, MIN_INTERVAL, False),
    ("never proven alive", IDLE_VERDICT, None, MIN_INTERVAL, True),
    ("proven one poll ago", IDLE_VERDICT, 15.0, MIN_INTERVAL, False),
    ("proven three polls ago", IDLE_VERDICT, 45.0, MIN_INTERVAL, False),
    ("proven 58 s ago: more than a tenth of a poll early", IDLE_VERDICT, 58.0, MIN_INTERVAL, False),
    ("proven 59.9 s ago: a poll starting a bit early", IDLE_VERDICT, 59.9, MIN_INTERVAL, True),
    ("proven exactly min_interval ago", IDLE_VERDICT, 60.0, MIN_INTERVAL, True),
    ("proven long ago", IDLE_VERDICT, 3_600.0, MIN_INTERVAL, True),
    ("proof in the future: the clock went back", IDLE_VERDICT, -30.0, MIN_INTERVAL, True),
    ("a new process proves nothing yet", RESTARTED_IDLE_VERDICT, 5.0, MIN_INTERVAL, True),
    ("an engine completed requests", ENGINE_COMPLETED_VERDICT, None, MIN_INTERVAL, False),
    ("min_interval 0: every idle poll", IDLE_VERDICT, 0.5, 0.0, True),
]


@pytest.mark.parametrize(
    ("case", "verdict", "age", "min_interval", "due"), DUE_CASES, ids=[c[0] for c in DUE_CASES]
)
def test_probe_due(
    case: str, verdict: Verdict, age: float | None, min_interval: float, due: bool
) -> None:
    """A test request goes only to an idle server not proven alive within min_interval."""
    proven_at = None if age is None else NOW - age
    found = idle_test_request_due(
        verdict, proven_at, NOW, min_interval=min_interval, poll_interval=POLL_INTERVAL
    )
    assert found is due, case


def test_a_deferred_poll_reads_idle_and_says_when_the_server_was_last_proven_alive() -> None:
    """Between test requests an idle server reads idle, on its last proof, with its figures."""
    deferred = deferred_verdict(IDLE_VERDICT, NOW - 35.0, NOW, min_interval=MIN_INTERVAL)
    assert deferred.state == State.IDLE
    assert not deferred.test_request_needed
    assert deferred.reason == (
        "no work and nothing completed; proven alive 35 s ago, next test request in 25 s"
    )
    assert (deferred.running, deferred.engines) == (IDLE_VERDICT.running, IDLE_VERDICT.engines)


def test_a_deferred_poll_needs_a_proof_to_lean_on() -> None:
    """Holding back the test request of a server never proven alive is refused."""
    with pytest.raises(ValueError, match="due"):
        deferred_verdict(IDLE_VERDICT, None, NOW, min_interval=MIN_INTERVAL)


def _poll(history: TargetHistory, at: float, answers: bool) -> TargetHistory:
    """One idle poll of a server whose counters never move, as the exporter runs it."""
    reading = read(at)
    verdict = classify(history.baseline, reading)
    proven_at = history.last_proven_alive_at
    if not idle_test_request_due(
        verdict, proven_at, at, min_interval=MIN_INTERVAL, poll_interval=POLL_INTERVAL
    ):
        deferred = deferred_verdict(verdict, proven_at, at, min_interval=MIN_INTERVAL)
        return history.advance(PollOutcome(deferred, reading, at, 0.0, test_request_deferred=True))
    settled = settle_idle_test_request(
        verdict, reading, answered=answers, detail="test", reread=read(at)
    )
    outcome = PollOutcome(
        settled.verdict,
        settled.reading,
        at,
        0.0,
        test_requests_sent=1,
        test_requests_failed=settled.test_requests_failed,
    )
    return history.advance(outcome)


def test_two_failed_test_requests_in_a_row_still_fire_llm_server_unresponsive() -> None:
    """After a failed test request the next idle poll sends another, so the alert still fires."""
    history = TargetHistory()
    sent: list[float] = []
    for poll in range(10):  # answers at first, then hangs with its counters frozen at 0
        at = poll * POLL_INTERVAL
        before = history.test_requests
        history = _poll(history, at, answers=at < 50)
        if history.test_requests > before:
            sent.append(at)
        if restart_alert_fires(UNRESPONSIVE_ALERT, history.state, history.state_polls):
            break
    assert sent == [0.0, 60.0, 75.0]  # one per min_interval while it answers, then every poll
    assert (history.state, history.state_polls, history.test_request_failures) == (
        State.UNRESPONSIVE,
        2,
        2,
    )
