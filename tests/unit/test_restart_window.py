"""The restart window and holds as tables: when a confirmed stall may be restarted."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stallwatch.common.restarter_config import Target
from stallwatch.core.confirmation import Confirmation
from stallwatch.core.holds import HoldEvent, current_holds, hold_refusal
from stallwatch.core.policy import CHECKS_PASSED, Decision
from stallwatch.core.restart_window import RestartWindow, judge_window, moved_since, with_window
from tests.unit.restart_window_cases import (
    BUSY_1,
    BUSY_2,
    FROZEN_LATER,
    KEY,
    NOW,
    PROGRESS,
    TARGET,
    WINDOW_CASES,
    opened,
    stall,
)


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
