"""Restart alerts refused only because restarts were paused or the breaker was open, held to be
judged again as soon as neither refuses any more.

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
# Alertmanager has re-sent an alert still firing by then (`repeat_interval` 1 h shipped, 4 h
# by default), so an older hold would only repeat its delivery.
HOLD_SECONDS = 4 * 3600.0


@dataclass(frozen=True)
class HeldAlert:
    alert: Alert  # as Alertmanager sent it (before a pod rule renamed its target)
    notification: Notification  # where it came from (receiver, external URL)
    held_at: float


class HeldAlerts:
    """The latest held delivery of each alert (by fingerprint)."""

    def __init__(self) -> None:
        self._held: dict[str, HeldAlert] = {}

    def __len__(self) -> int:
        return len(self._held)

    def note(
        self, alert: Alert, decision: Decision | None, notification: Notification, now: float
    ) -> None:
        """Hold `alert` if the fleet rules refused it; otherwise (judged, resolved) let it go."""
        if decision is not None and decision.reason in HELD_REASONS:
            self._held[alert.fingerprint] = HeldAlert(alert, notification, now)
        else:
            self._held.pop(alert.fingerprint, None)

    def take(self, now: float) -> Notification | None:
        """Every alert held less than HOLD_SECONDS, as one notification; none are held after."""
        fresh = [held for held in self._held.values() if now - held.held_at < HOLD_SECONDS]
        self._held = {}
        if not fresh:
            return None
        latest = max(fresh, key=lambda held: held.held_at).notification
        return replace(latest, alerts=tuple(held.alert for held in fresh), group_key="")
