"""The restart window: a confirmed stall is restarted only once the restarter itself has seen it
last `restart_after`, with nothing moving from its first look to its last.

Telling people and restarting are two moments. The restart alerts fire after two polls; a
healthy server can be silent far longer (a JIT compile, an autotune, a weight sync), so the
restarter opens a window at its first confirmation and acts only when a confirmation at the
window's end still shows the stall and nothing moved since the first one. Pure: `now` passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from stallwatch.common.restarter_config import Target
from stallwatch.core.classify import classify
from stallwatch.core.confirmation import Confirmation
from stallwatch.core.policy import CONFIRMED, Decision
from stallwatch.core.reading import Reading

# Refusals of a confirmation that show the server moving: a window open for the alert closes as
# recovered (a near miss).
RECOVERY_REFUSALS = frozenset({"not_confirmed_progress", "not_confirmed_idle"})

WindowStep = Literal["act", "wait"]


@dataclass(frozen=True)
class RestartWindow:
    """A target's window, opened at the first confirmation of a stall by the alert episode
    `alert`; the target's later alerts go on in it.

    `first`: the later reading of that confirmation (None when the server gave none: hung).
    `restored`: read back from the journal after a restart of the restarter; its first reading
    is gone, so the next confirmation's reading becomes it (never taken for movement).
    """

    alert: str
    target: str
    opened_at: float
    restart_after: float
    first: Reading | None = None
    restored: bool = False

    @property
    def due_at(self) -> float:
        return self.opened_at + self.restart_after

    def remaining(self, now: float) -> float:
        return max(0.0, self.due_at - now)


@dataclass(frozen=True)
class WindowJudgement:
    """What a confirmed stall leads to: act now, or wait for the window (kept in `window`)."""

    step: WindowStep
    window: RestartWindow | None
    detail: str


def moved_since(first: Reading | None, last: Reading | None) -> str | None:
    """What moved between the window's first reading and its last (None: nothing, or no two
    readings to compare). A new process counts as movement: it is not the stall we saw."""
    if last is None:
        return None
    if first is None:
        return "the server answers again" if last.has_engines else None
    vanished = _vanished_evidence(first, last)
    if vanished is not None:
        return vanished
    verdict = classify(first, last)
    if verdict.restart_detected:
        return f"the server restarted ({verdict.reason})"
    if verdict.progressed:
        return verdict.reason
    return None


def _vanished_evidence(first: Reading, last: Reading) -> str | None:
    """A counter the window's first reading had as a number that the last has no longer (gone,
    or NaN): the evidence of "nothing moved" vanished, which is no evidence of a stall."""
    now = last.engine_map()
    for key, engine in first.engine_map().items():
        later = now.get(key)
        for name, value in engine.counters().items():
            if value is None or math.isnan(value):
                continue
            again = None if later is None else later.counters().get(name)
            if again is None or math.isnan(again):
                return f"{name} of {key[0]}/{key[1]} vanished or turned NaN: no evidence left"
    return None


def judge_window(
    window: RestartWindow | None,
    *,
    alert: str,
    target: str,
    restart_after: float,
    confirmation: Confirmation,
    now: float,
) -> WindowJudgement:
    """For an alert whose stall `confirmation` has just confirmed: act, or (keep) wait.

    The first confirmation opens the window; one before its end keeps it; one at its end acts
    if nothing moved since the first. The window is the target's, not one alert episode's: an
    alert that resolves and fires again while nothing moves (a stall read `hung` for one slow
    poll, then `stalled` again) goes on in the same window. A stall that moved in between and
    stalled again starts a new window: the server showed life, so the silence is counted from
    the new stall.
    """
    if restart_after <= 0:
        return WindowJudgement("act", None, "no restart window")
    if window is None:
        opened = RestartWindow(alert, target, now, restart_after, confirmation.reading)
        return WindowJudgement(
            "wait",
            opened,
            f"stall confirmed; restart only if it lasts {restart_after:g} s "
            "(restart_after) with nothing moving",
        )
    if window.restored:
        rebased = replace(window, first=confirmation.reading, restored=False)
        return WindowJudgement(
            "wait",
            rebased,
            f"window read back from the journal {now - window.opened_at:.0f} s into its "
            f"{restart_after:g} s; this confirmation is its first look since, and the restart "
            "waits for one more that shows nothing moved",
        )
    moved = moved_since(window.first, confirmation.reading)
    if moved is not None:
        reopened = RestartWindow(alert, target, now, restart_after, confirmation.reading)
        return WindowJudgement(
            "wait",
            reopened,
            f"moved since the window opened {now - window.opened_at:.0f} s ago ({moved}), "
            f"then stalled again; a new {restart_after:g} s window from now",
        )
    if now < window.due_at:
        return WindowJudgement(
            "wait",
            window,
            f"no progress for {now - window.opened_at:.0f} s of its {restart_after:g} s "
            f"window; {window.remaining(now):.0f} s left",
        )
    return WindowJudgement(
        "act",
        None,
        f"no progress for {now - window.opened_at:.0f} s (restart_after {restart_after:g} s)",
    )


@dataclass(frozen=True)
class Windowed:
    """A decision once the restart window has had its say.

    `window`: the window to keep for the alert (None: none open any more). `recovered`: the
    window this decision closed because the server moved (a near miss), if any.
    """

    decision: Decision
    window: RestartWindow | None
    recovered: RestartWindow | None = None


def with_window(
    decision: Decision,
    window: RestartWindow | None,
    *,
    alert: str,
    target: Target,
    confirmation: Confirmation,
    now: float,
) -> Windowed:
    """The final decision about a confirmed alert: a restart (or dry run) the window allows, a
    wait, or a recovery that closes the window; any other decision passes unchanged."""
    confirmed = decision.reason in (CONFIRMED, "dry_run")
    if confirmed:
        judged = judge_window(
            window,
            alert=alert,
            target=target.name,
            restart_after=target.restart_after,
            confirmation=confirmation,
            now=now,
        )
        if judged.step == "act":
            detail = (
                decision.detail
                if target.restart_after <= 0
                else f"{judged.detail}; {decision.detail}"
            )
            return Windowed(Decision(decision.action, decision.reason, detail), None)
        return Windowed(
            Decision("skip", "restart_window", f"{judged.detail}: {confirmation.detail}"),
            judged.window,
        )
    if window is not None and decision.reason in RECOVERY_REFUSALS:
        return Windowed(
            Decision(
                "skip",
                "recovered_in_window",
                f"recovered {now - window.opened_at:.0f} s into its {window.restart_after:g} s "
                f"restart window, not restarted: {decision.detail}",
            ),
            None,
            window,
        )
    return Windowed(decision, window)
