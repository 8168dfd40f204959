"""Settling an idle poll's verdict from its test request and the fresh read after a failure."""

from __future__ import annotations

import pytest

from stallwatch.core.classify import State, classify
from stallwatch.core.probe import settle_probe
from stallwatch.core.reading import EngineSample, Reading

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
    settled = settle_probe(IDLE_VERDICT, IDLE_READ, answered=answered, detail="why", reread=reread)
    assert settled.verdict.state == state, case
    assert not settled.verdict.probe_needed, case
    assert settled.reading is (IDLE_READ if kept == "first" else reread), case
    assert settled.probes_failed == failed, case


def test_the_detail_goes_into_the_reason() -> None:
    """The test request's own detail (status, timeout) is kept in the verdict's reason."""
    answered = settle_probe(IDLE_VERDICT, IDLE_READ, answered=True, detail="HTTP 200")
    failed = settle_probe(IDLE_VERDICT, IDLE_READ, answered=False, detail="timed out after 10 s")
    assert answered.verdict.reason == "idle: HTTP 200"
    assert failed.verdict.reason.endswith("the test request failed: timed out after 10 s")


def test_a_restarted_server_stays_restarted_whatever_the_test_request_says() -> None:
    """A new process is reported as restarted; the test request only adds to the reason."""
    for answered in (True, False):
        settled = settle_probe(
            RESTARTED_IDLE_VERDICT, IDLE_READ, answered=answered, detail="x", reread=None
        )
        assert settled.verdict.state == State.RESTARTED
        assert settled.verdict.reason.endswith("test request: x")
