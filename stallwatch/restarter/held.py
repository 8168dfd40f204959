"""Restart alerts refused only because restarts were paused or the breaker was open, held to be
judged again as soon as neither refuses any more; and alerts waiting for a time (their restart
window's end, their target's hold's end), judged again once it has come.

Without this, a server that hung during a pause or behind an open breaker waits for
Alertmanager's next delivery of its alert (hourly with the shipped routing) after the operator
resumes. Held alerts live in memory only: after a restart of the restarter, Alertmanager's
deliveries bring them back. Judging one again runs the whole policy and a fresh confirmation,
so a server that recovered meanwhile is not restarted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stallwatch.core.alerts import Alert, Notification
from stallwatch.core.policy import Decision

# The refusals an operator or a timer ends; any other decision about the alert lets it go.
HELD_REASONS = frozenset({"paused", "breaker_open"})
# The decisions that wait for a time of their own: judged again once it has come.
WAITING_REASONS = frozenset({"restart_window", "on_hold"})
# Alertmanager has re-sent an alert still firing by then (`repeat_interval` 1 h shipped, 4 h
# by default), so an older hold would only repeat its delivery.
HOLD_SECONDS = 4 * 3600.0


@dataclass(frozen=True)
class HeldAlert:
    alert: Alert  # as Alertmanager sent it (before a pod rule renamed its target)
    notification: Notification  # where it came from (receiver, external URL)
    held_at: float
    # When to judge it again (None: once no pause and no open breaker refuses it).
    until: float | None = None
    # What it waits for: the refusal that held it.
    reason: str = ""

    def due(self, now: float, controls_allow: bool) -> bool:
        if self.until is None:
            return controls_allow and now - self.held_at < HOLD_SECONDS
        return now >= self.until


class HeldAlerts:
    """The latest held delivery of each alert (by fingerprint)."""

    def __init__(self) -> None:
        self._held: dict[str, HeldAlert] = {}

    def __len__(self) -> int:
        return len(self._held)

    def note(
        self,
        alert: Alert,
        decision: Decision | None,
        notification: Notification,
        now: float,
        until: float | None = None,
    ) -> None:
        """Hold `alert` if the fleet rules refused it, or until `until` if it waits for a time
        (a restart window, a hold); otherwise (judged, resolved) let it go."""
        if decision is not None and decision.reason in HELD_REASONS:
            self._held[alert.fingerprint] = HeldAlert(alert, notification, now)
        elif decision is not None and decision.reason in WAITING_REASONS and until is not None:
            self._held[alert.fingerprint] = HeldAlert(
                alert, notification, now, until, decision.reason
            )
        else:
            self._held.pop(alert.fingerprint, None)

    def expedite(self, target: str, now: float) -> None:
        """Make the alerts of `target` that wait for its hold due now (the hold was released)."""
        for key, held in self._held.items():
            if held.alert.target == target and held.reason == "on_hold":
                self._held[key] = replace(held, until=now)

    def waiting_for_holds(self) -> set[str]:
        """The targets some alert waits on the hold of."""
        return {
            held.alert.target
            for held in self._held.values()
            if held.reason == "on_hold" and held.alert.target is not None
        }

    def waiting_for_controls(self) -> bool:
        """Whether any alert waits for a resume (rather than for a time)."""
        return any(held.until is None for held in self._held.values())

    def take(self, now: float, controls_allow: bool = True) -> Notification | None:
        """The alerts due now, as one notification; they are no longer held. An alert refused
        by the pause or the breaker is due once `controls_allow` (and dropped after
        HOLD_SECONDS); one that waits for a time, once that time has come."""
        due = [held for held in self._held.values() if held.due(now, controls_allow)]
        self._held = {
            key: held
            for key, held in self._held.items()
            if not held.due(now, controls_allow)
            and not (held.until is None and now - held.held_at >= HOLD_SECONDS)
        }
        if not due:
            return None
        latest = max(due, key=lambda held: held.held_at).notification
        return replace(latest, alerts=tuple(held.alert for held in due), group_key="")
