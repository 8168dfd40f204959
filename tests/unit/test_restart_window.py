"""The restart window and holds as tables: when a confirmed stall may be restarted."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stallwatch.common.restarter_config import CommandAction, Target
from stallwatch.core.confirmation import Confirmation
from stallwatch.core.holds import HoldEvent, current_holds, hold_refusal
from stallwatch.core.policy import CHECKS_PASSED, CONFIRMED, Decision
from stallwatch.core.reading import Reading, parse_reading
from stallwatch.core.restart_window import RestartWindow, judge_window, moved_since, with_window
from tests.support.real_payloads import real_payload

NOW = 1_800_000_000.0
KEY = "f1@2026-11-30T05:29:50Z"
TARGET = Target(
    name="gpu1",
    metrics_url="http://gpu1:8000/metrics",
    action=CommandAction(argv=("true",)),
    restart_after=300.0,
)
NO_WINDOW_TARGET = replace(TARGET, restart_after=0.0)


def reading(name: str, at: float) -> Reading:
    return parse_reading(real_payload(name), taken_at=at)


# Two reads of one busy real server, a few steps apart: counters moved between them.
BUSY_1 = reading("vllm-0.32.0-cpu-busy-1.txt", NOW - 200)
BUSY_2 = reading("vllm-0.32.0-cpu-busy-2.txt", NOW)
FROZEN_LATER = reading("vllm-0.32.0-cpu-busy-1.txt", NOW)
CONFIRMED_STALL = Decision("restart", CONFIRMED, "stalled: work present, nothing moved")
DRY_RUN = Decision("skip", "dry_run", "would restart: stalled")
PROGRESS = Decision("skip", "not_confirmed_progress", "busy: moved")
COOLDOWN = Decision("skip", "cooldown", "restarted 5 s ago")


def stall(read: Reading | None) -> Confirmation:
    return Confirmation(True, None, "stalled", reading=read)


def opened(ago: float, first: Reading | None = BUSY_1) -> RestartWindow:
    return RestartWindow(KEY, "gpu1", NOW - ago, 300.0, first)


WINDOW_CASES: list[
    tuple[str, Target, Decision, RestartWindow | None, Confirmation, str, str]
] = [
    # (case, target, decision, open window, confirmation, action, reason)
    ("no window configured: the old two-poll rule acts at once", NO_WINDOW_TARGET,
     CONFIRMED_STALL, None, stall(FROZEN_LATER), "restart", CONFIRMED),
    ("first confirmation opens the window and waits", TARGET, CONFIRMED_STALL, None,
     stall(FROZEN_LATER), "skip", "restart_window"),
    ("inside the window, nothing moved: still waits", TARGET, CONFIRMED_STALL, opened(100),
     stall(FROZEN_LATER), "skip", "restart_window"),
    ("window over and nothing moved since its first read: restart", TARGET, CONFIRMED_STALL,
     opened(300), stall(FROZEN_LATER), "restart", CONFIRMED),
    ("window over but counters moved since its first read: a new window", TARGET,
     CONFIRMED_STALL, opened(300), stall(BUSY_2), "skip", "restart_window"),
    ("hung: no readings to compare, the window's end acts on the end reads", TARGET,
     CONFIRMED_STALL, opened(301, first=None), stall(None), "restart", CONFIRMED),
    ("dry run waits out the window too", TARGET, DRY_RUN, None, stall(FROZEN_LATER), "skip",
     "restart_window"),
    ("dry run at the window's end says what it would do", TARGET, DRY_RUN, opened(300),
     stall(FROZEN_LATER), "skip", "dry_run"),
    ("progress while the window is open: recovered, not restarted", TARGET, PROGRESS,
     opened(100), Confirmation(False, "progress", "busy"), "skip", "recovered_in_window"),
    ("progress with no window open is the confirmation's refusal", TARGET, PROGRESS, None,
     Confirmation(False, "progress", "busy"), "skip", "not_confirmed_progress"),
    ("another refusal keeps the window open", TARGET, COOLDOWN, opened(100),
     Confirmation(True, None, "stalled"), "skip", "cooldown"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "target", "decision", "window", "confirmation", "action", "reason"),
    WINDOW_CASES,
    ids=[c[0] for c in WINDOW_CASES],
)
def test_window_step(
    case: str,
    target: Target,
    decision: Decision,
    window: RestartWindow | None,
    confirmation: Confirmation,
    action: str,
    reason: str,
) -> None:
    """Each row: what a confirmed (or refused) stall becomes once the window has its say."""
    windowed = with_window(
        decision, window, alert=KEY, target=target, confirmation=confirmation, now=NOW
    )
    assert (windowed.decision.action, windowed.decision.reason) == (action, reason), case


def test_a_window_keeps_its_first_reading_and_opening_time() -> None:
    """Waiting inside a window never moves its start: the silence counts from the first look."""
    first = judge_window(
        None, alert=KEY, target="gpu1", restart_after=300, confirmation=stall(BUSY_1), now=NOW
    )
    assert first.window is not None
    later = judge_window(
        first.window,
        alert=KEY,
        target="gpu1",
        restart_after=300,
        confirmation=stall(BUSY_1),
        now=NOW + 120,
    )
    assert later.step == "wait"
    assert later.window == first.window
    assert later.window is not None
    assert later.window.remaining(NOW + 120) == 180


def test_a_recovery_closes_the_window_as_a_near_miss() -> None:
    """The window a recovery closes is handed back, so it is counted and journaled."""
    window = opened(100)
    windowed = with_window(
        PROGRESS,
        window,
        alert=KEY,
        target=TARGET,
        confirmation=Confirmation(False, "progress", "busy"),
        now=NOW,
    )
    assert windowed.window is None
    assert windowed.recovered == window
    assert "100 s into its 300 s restart window" in windowed.decision.detail


def test_a_new_episode_of_the_target_goes_on_in_its_window() -> None:
    """An alert that resolved and fired again while nothing moved (a flap between states) does
    not start the silence over: the target's window acts at its end."""
    old = replace(opened(300), alert="f1@2026-11-30T04:00:00Z")
    judged = judge_window(
        old, alert=KEY, target="gpu1", restart_after=300, confirmation=stall(FROZEN_LATER), now=NOW
    )
    assert judged.step == "act"


def test_moved_since_sees_progress_and_a_new_process() -> None:
    """Counters that moved, or a restart, between the window's reads are movement; frozen not."""
    assert moved_since(BUSY_1, BUSY_2) is not None
    assert moved_since(BUSY_1, FROZEN_LATER) is None
    assert moved_since(None, BUSY_2) == "the server answers again"  # a hang that answers
    assert moved_since(BUSY_1, None) is None


def test_a_pending_decision_passes_the_window_unchanged() -> None:
    """Only a confirmed decision meets the window; the cheap checks' verdict is not touched."""
    pending = Decision("restart", CHECKS_PASSED, "")
    windowed = with_window(
        pending, None, alert=KEY, target=TARGET, confirmation=stall(BUSY_1), now=NOW
    )
    assert windowed.decision == pending


HOLD_CASES = [
    # (case, events, now, held targets)
    ("a hold is in force until its end", [HoldEvent("hold", "gpu1", NOW - 10, 60)], NOW,
     {"gpu1"}),
    ("a hold ends by itself", [HoldEvent("hold", "gpu1", NOW - 61, 60)], NOW, set()),
    ("a release ends it early", [HoldEvent("hold", "gpu1", NOW - 10, 60),
     HoldEvent("hold_released", "gpu1", NOW - 5)], NOW, set()),
    ("a later hold replaces an earlier one", [HoldEvent("hold", "gpu1", NOW - 100, 60),
     HoldEvent("hold", "gpu1", NOW - 10, 60)], NOW, {"gpu1"}),
    ("holds are per target", [HoldEvent("hold", "gpu1", NOW - 10, 60),
     HoldEvent("hold_released", "gpu2", NOW - 5)], NOW, {"gpu1"}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "events", "now", "held"), HOLD_CASES, ids=[c[0] for c in HOLD_CASES]
)
def test_current_holds(case: str, events: list[HoldEvent], now: float, held: set[str]) -> None:
    """Each row: which targets the journal's hold rows leave held at `now`."""
    assert set(current_holds(events, now)) == held, case


def test_a_hold_is_bounded() -> None:
    """A hold longer than max_hold, or of no length, is refused with the reason."""
    assert hold_refusal(300, 3600) is None
    refusal = hold_refusal(7200, 3600)
    assert refusal is not None
    assert "max_hold" in refusal
    assert hold_refusal(0, 3600) == "must be longer than zero"
