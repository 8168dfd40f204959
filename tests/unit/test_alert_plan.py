"""The alert plan and the quarantine, as pure decisions: tables of cases, `now` passed in."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stallwatch.common.quarantine_config import QuarantineSettings
from stallwatch.common.restarter_config import CommandAction, RestarterConfig, Target
from stallwatch.core.alert_plan import (
    AlertMemory,
    AlertOutcome,
    AskClock,
    AskHistory,
    AskMemory,
    AskPool,
    AskTestRequest,
    Confirm,
    FreshRead,
    Plan,
    Waiting,
    advance,
    due_waiting,
    firing_plan,
    look_plan,
    resolved_plan,
    settle_plan,
)
from stallwatch.core.alerts import Alert
from stallwatch.core.confirmation import Confirmation, FailedRead, ReadAttempt
from stallwatch.core.policy import History, alert_key
from stallwatch.core.quarantine import Quarantine, look, quarantine_refusal
from stallwatch.core.reading import EngineSample, Reading
from stallwatch.core.restart_window import RestartWindow

NOW = 1_800_000_000.0


def target(name: str, pool: str = "default", restart_after: float = 300.0) -> Target:
    return Target(
        name=name,
        metrics_url=f"http://{name}:8000/metrics",
        action=CommandAction(argv=("true",)),
        restart_after=restart_after,
        pool=pool,
    )


def config(*names: str, restart_after: float = 300.0) -> RestarterConfig:
    return RestarterConfig(
        targets=tuple(target(n, restart_after=restart_after) for n in names),
        journal="unit",
        insecure_no_auth=True,
    )


def stuck(name: str, starts_at: str = "2026-11-30T05:29:50Z", status: str = "firing") -> Alert:
    labels = {"alertname": "LLMServerStuck", "target": name}
    return Alert(status=status, labels=labels, fingerprint=f"f-{name}", starts_at=starts_at)


def reading(steps: float, running: float = 4.0, start: float = 1.0) -> Reading:
    sample = EngineSample("tiny", "0", running=running, waiting=0.0, steps=steps)
    return Reading(taken_at=NOW, engines=(sample,), process_start_time=start)


STALLED = Confirmation(True, None, "running 4, nothing moved", reading=reading(10))


def drive(
    plan: Plan,
    memory: AlertMemory,
    *,
    now: float = NOW,
    members: tuple[str, ...] = ("gpu0", "gpu1"),
    confirmation: Confirmation = STALLED,
    read: ReadAttempt | None = None,
    test: tuple[bool, str] = (True, "answered"),
    history: Callable[[float], History] = lambda now: History(),
) -> AlertOutcome:
    """Answer every step as a driver would, at a fixed `now`."""
    step = advance(plan, None)
    while not isinstance(step, AlertOutcome):
        match step:
            case AskClock():
                answer: object = now
            case AskHistory(now=at):
                answer = history(at)
            case AskMemory():
                answer = memory
            case AskPool():
                answer = members
            case Confirm():
                answer = confirmation
            case FreshRead():
                answer = read
            case AskTestRequest():
                answer = test
        step = advance(plan, answer)
    return step


SETTINGS = QuarantineSettings()


def test_a_confirmed_stall_opens_its_window_and_leaves_rotation() -> None:
    """The first confirmation waits for the window and takes the target out of rotation."""
    outcome = drive(firing_plan(stuck("gpu0"), config("gpu0", "gpu1"), SETTINGS), AlertMemory())
    memory = outcome.applied(AlertMemory(), NOW)
    assert outcome.decision is not None
    assert outcome.decision.reason == "restart_window"
    assert [c.move for c in outcome.routing] == ["quarantined"]
    assert memory.quarantines["gpu0"].reason == "stalled"
    assert memory.windows["gpu0"].due_at == NOW + 300
    assert memory.waiting[alert_key(stuck("gpu0"))].until == NOW + 300


def test_at_the_window_end_it_restarts_and_stays_out_until_it_serves() -> None:
    """A stall still there at the window's end is restarted; the quarantine turns to restarting."""
    cfg = config("gpu0", "gpu1")
    memory = drive(firing_plan(stuck("gpu0"), cfg, SETTINGS), AlertMemory()).applied(
        AlertMemory(), NOW
    )
    later = NOW + 301
    outcome = drive(firing_plan(stuck("gpu0"), cfg, SETTINGS), memory, now=later)
    assert outcome.decision is not None
    assert outcome.decision.restarts
    after = outcome.applied(memory, later)
    assert after.quarantines["gpu0"].reason == "restarting"
    assert "gpu0" not in after.windows


@pytest.mark.parametrize(
    ("members", "out", "max_share", "refusal"),
    [
        (("gpu0",), (), 50, "last_in_pool"),
        (("gpu0", "gpu1"), ("gpu1",), 100, "last_in_pool"),
        (("gpu0", "gpu1", "gpu2", "gpu3"), ("gpu1",), 50, None),
        (("gpu0", "gpu1", "gpu2", "gpu3"), ("gpu1", "gpu2"), 50, "pool_share"),
        (("gpu0", "gpu1", "gpu2"), ("gpu1",), 50, "pool_share"),
        (("gpu0", "gpu1", "gpu2"), ("gpu1",), 70, None),
    ],
)
def test_guards_never_take_out_the_last_replica_or_more_than_the_share(
    members: tuple[str, ...], out: tuple[str, ...], max_share: int, refusal: str | None
) -> None:
    """The last routable target of a pool, and more than max_share % of it, stay in rotation."""
    quarantines = {name: Quarantine(name, "default", NOW, "stalled", "", NOW) for name in out}
    refused = quarantine_refusal("gpu0", members, quarantines, max_share)
    assert (refused[0] if refused else None) == refusal


def test_a_refused_quarantine_is_said_and_the_window_still_opens() -> None:
    """A guard's refusal is a routing change of its own; the restart window opens all the same."""
    memory = AlertMemory().with_quarantine(
        "gpu1", Quarantine("gpu1", "default", NOW, "stalled", "", NOW)
    )
    outcome = drive(firing_plan(stuck("gpu0"), config("gpu0", "gpu1"), SETTINGS), memory)
    assert [(c.move, c.reason) for c in outcome.routing] == [("refused", "last_in_pool")]
    assert outcome.decision is not None
    assert outcome.decision.reason == "restart_window"
    assert "gpu0" not in outcome.applied(memory, NOW).quarantines


def test_a_target_alone_in_its_pool_is_never_quarantined_and_nothing_is_said() -> None:
    """Alone in its pool a target has nowhere to send users: no quarantine, no refusal row."""
    outcome = drive(
        firing_plan(stuck("gpu0"), config("gpu0"), SETTINGS), AlertMemory(), members=("gpu0",)
    )
    assert outcome.routing == ()


def opened(memory: AlertMemory, name: str = "gpu0") -> AlertMemory:
    window = RestartWindow(alert_key(stuck(name)), name, NOW, 300.0, reading(10))
    return memory.with_window(name, window)


@pytest.mark.parametrize(
    ("read", "closes", "reason"),
    [
        (FailedRead("no_answer", "connected, no answer within 3 s"), False, "restart_window"),
        (reading(10), False, "restart_window"),
        (reading(25), True, "recovered_in_window"),
        (FailedRead("unreachable", "connection refused"), True, "recovered_in_window"),
    ],
)
def test_a_settling_read_judges_the_open_window(
    read: ReadAttempt, closes: bool, reason: str
) -> None:
    """A resolved alert's settling read: no answer is the hang itself (the window stays open),
    frozen counters keep it open, movement closes it as a near miss."""
    memory = opened(AlertMemory())
    outcome = drive(settle_plan(target("gpu0")), memory, now=NOW + 60, read=read)
    assert outcome.settled is not None
    assert outcome.settled.reason == reason
    assert ("gpu0" not in outcome.applied(memory, NOW + 60).windows) is closes


def test_a_late_resolve_of_an_earlier_episode_leaves_the_current_one_waiting() -> None:
    """Waiting alerts are kept by episode: the resolve of an older startsAt drops nothing else."""
    current = stuck("gpu0", "2026-11-30T06:00:00Z")
    memory = AlertMemory().with_waiting(
        alert_key(current), Waiting(current, "restart_window", NOW, NOW + 300)
    )
    late = stuck("gpu0", "2026-11-30T05:00:00Z", status="resolved")
    outcome = drive(resolved_plan(late, config("gpu0")), memory)
    assert alert_key(current) in outcome.applied(memory, NOW).waiting


def test_a_later_episode_replaces_an_earlier_one_and_not_the_other_way() -> None:
    """An episode that waits ends the wait of its alert's earlier episodes; a late delivery of an
    earlier episode does not replace a later one."""
    early, late = stuck("gpu0", "2026-11-30T05:00:00Z"), stuck("gpu0", "2026-11-30T06:00:00Z")
    memory = AlertMemory().with_waiting(alert_key(early), Waiting(early, "paused", NOW))
    memory = memory.with_waiting(alert_key(late), Waiting(late, "paused", NOW))
    assert list(memory.waiting) == [alert_key(late)]
    again = memory.with_waiting(alert_key(early), Waiting(early, "paused", NOW + 1))
    assert list(again.waiting) == [alert_key(late)]


def test_waiting_alerts_are_due_on_resume_or_at_their_time() -> None:
    """A paused alert is due once controls allow; a window's alert once its time has come."""
    paused, windowed = stuck("gpu0"), stuck("gpu1")
    memory = AlertMemory().with_waiting(alert_key(paused), Waiting(paused, "paused", NOW))
    memory = memory.with_waiting(
        alert_key(windowed), Waiting(windowed, "restart_window", NOW, NOW + 300)
    )
    due, kept = due_waiting(memory, NOW + 10, controls_allow=False)
    assert due == ()
    assert len(kept.waiting) == 2
    due, kept = due_waiting(memory, NOW + 10, controls_allow=True)
    assert [w.alert for w in due] == [paused]
    due, kept = due_waiting(kept, NOW + 300, controls_allow=False)
    assert [w.alert for w in due] == [windowed]
    assert not kept.waiting


QUARANTINED = Quarantine("gpu0", "default", NOW, "stalled", "", NOW, reading(10))


@pytest.mark.parametrize(
    ("read", "step", "release"),
    [
        (reading(11), "release", "progress"),
        (reading(10), "keep", None),
        (reading(10, running=0.0), "test_request", None),
        (reading(3, start=2.0), "keep", None),
        (FailedRead("no_answer", "no answer"), "keep", None),
    ],
)
def test_a_look_at_a_quarantined_target(read: ReadAttempt, step: str, release: str | None) -> None:
    """Movement releases; frozen work keeps it out; nothing running asks for a test request; a
    new process stays out until it proves it serves."""
    judged = look(QUARANTINED, read, NOW + 5, expire_after=900.0)
    assert (judged.step, judged.release) == (step, release)


def test_a_quarantine_no_read_confirms_expires_and_fails_open() -> None:
    """Reads that neither confirm nor clear keep it out until expire_after, then it returns."""
    unreachable = FailedRead("unreachable", "connection refused")
    assert look(QUARANTINED, unreachable, NOW + 899, expire_after=900.0).step == "keep"
    judged = look(QUARANTINED, unreachable, NOW + 900, expire_after=900.0)
    assert (judged.step, judged.release) == ("release", "expired")


@pytest.mark.parametrize(("passed", "back"), [(True, True), (False, False)])
def test_a_look_sends_one_test_request_to_an_idle_quarantined_target(
    passed: bool, back: bool
) -> None:
    """Hung with nothing running fails the test request and stays out; idle passes and returns."""
    memory = AlertMemory().with_quarantine("gpu0", QUARANTINED)
    outcome = drive(
        look_plan(target("gpu0"), SETTINGS),
        memory,
        now=NOW + 5,
        read=reading(10, running=0.0),
        test=(passed, "answered" if passed else "no answer within 10 s"),
    )
    assert ("gpu0" not in outcome.applied(memory, NOW + 5).quarantines) is back


def test_progress_seen_by_a_look_closes_the_window_as_a_near_miss() -> None:
    """A quarantined target that moves by itself returns and its window closes, not restarted."""
    memory = opened(AlertMemory()).with_quarantine("gpu0", QUARANTINED)
    outcome = drive(look_plan(target("gpu0"), SETTINGS), memory, now=NOW + 70, read=reading(30))
    after = outcome.applied(memory, NOW + 70)
    assert "gpu0" not in after.quarantines
    assert "gpu0" not in after.windows
    assert outcome.near_miss is not None
    assert outcome.settled is not None
    assert outcome.settled.reason == "recovered_in_window"


def test_a_counter_that_turns_nan_in_a_window_is_not_nothing_moved() -> None:
    """A counter that was a number at the window's first look and is NaN at its end leaves no
    evidence of a stall: the window does not act on it."""
    from stallwatch.core.restart_window import moved_since

    first = reading(10)
    nan = EngineSample("tiny", "0", running=4.0, waiting=0.0, steps=float("nan"))
    last = Reading(taken_at=NOW, engines=(nan,), process_start_time=1.0)
    assert moved_since(first, reading(10)) is None
    moved = moved_since(first, last)
    assert moved is not None
    assert "NaN" in moved


def test_a_reload_moves_the_open_window_and_its_waiting_alert() -> None:
    """A longer restart_after after a reload applies to the open window and its waiting alert."""
    from stallwatch.core.alert_plan import followed_config

    memory = opened(AlertMemory())
    memory = memory.with_waiting(
        alert_key(stuck("gpu0")), Waiting(stuck("gpu0"), "restart_window", NOW, NOW + 300)
    )
    after = followed_config(memory, config("gpu0", restart_after=900.0))
    assert after.windows["gpu0"].due_at == NOW + 900
    assert after.waiting[alert_key(stuck("gpu0"))].until == NOW + 900
    assert followed_config(memory, config("gpu0")) == memory


def test_a_hung_window_acts_at_its_end_when_no_look_saw_it_answer() -> None:
    """Documented: a hung server's window (no first reading) acts at its end on two unanswered
    reads; an answer with engine series seen in between would have been movement."""
    from stallwatch.core.restart_window import judge_window, moved_since

    window = RestartWindow("k", "gpu0", NOW, 300.0, None)
    hung = Confirmation(False, "no_answer", "connected, no answer", reading=None)
    judged = judge_window(
        window, alert="k", target="gpu0", restart_after=300.0, confirmation=hung, now=NOW + 300
    )
    assert judged.step == "act"
    assert moved_since(None, reading(10)) == "the server answers again"
