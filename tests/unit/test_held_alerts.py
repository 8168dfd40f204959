"""Which alerts the restarter holds to judge again, and how alert episodes are ordered."""

from __future__ import annotations

import pytest

from stallwatch.core.alerts import Alert, Notification, episode_before
from stallwatch.core.policy import Decision
from stallwatch.restarter.held import HOLD_SECONDS, HeldAlerts

NOW = 1_800_000_000.0


def stuck(target: str, fingerprint: str, starts_at: str = "2026-11-30T05:29:50Z") -> Alert:
    labels = {"alertname": "LLMServerStuck", "target": target}
    return Alert(status="firing", labels=labels, fingerprint=fingerprint, starts_at=starts_at)


def delivery(*alerts: Alert, receiver: str = "stallwatch-restarter") -> Notification:
    return Notification(alerts=alerts, receiver=receiver, external_url="http://am:9093")


def skip(reason: str) -> Decision:
    return Decision("skip", reason, "")


def test_paused_and_breaker_refusals_are_held_and_taken_once() -> None:
    """Alerts refused by a pause or the breaker come back once, as one notification."""
    held = HeldAlerts()
    a, b = stuck("gpu0", "fa"), stuck("gpu1", "fb")
    held.note(a, skip("paused"), delivery(a), NOW)
    held.note(b, skip("breaker_open"), delivery(b, receiver="other"), NOW + 1)
    taken = held.take(NOW + 2)
    assert taken is not None
    assert taken.alerts == (a, b)
    assert taken.receiver == "other"  # the latest delivery's
    assert held.take(NOW + 3) is None


def test_any_other_outcome_lets_the_alert_go() -> None:
    """A resolved alert, a restart or another refusal of the same alert ends its hold."""
    for outcome in (None, Decision("restart", "confirmed", ""), skip("cooldown")):
        held = HeldAlerts()
        alert = stuck("gpu0", "fa")
        held.note(alert, skip("paused"), delivery(alert), NOW)
        held.note(alert, outcome, delivery(alert), NOW + 1)
        assert len(held) == 0, outcome


def test_other_refusals_are_not_held() -> None:
    """Refusals that no operator or timer ends (mass stall, cooldown, budget) are not held."""
    held = HeldAlerts()
    for reason in ("mass_stall", "cooldown", "budget_exhausted", "not_confirmed_progress"):
        alert = stuck("gpu0", reason)
        held.note(alert, skip(reason), delivery(alert), NOW)
    assert len(held) == 0


def test_the_latest_delivery_of_an_alert_is_held_and_old_ones_expire() -> None:
    """A later delivery replaces an earlier one; a hold older than HOLD_SECONDS is dropped."""
    held = HeldAlerts()
    first, later = stuck("gpu0", "fa", "2026-11-30T05:00:00Z"), stuck("gpu0", "fa")
    held.note(first, skip("paused"), delivery(first), NOW)
    held.note(later, skip("paused"), delivery(later), NOW + 10)
    old = stuck("gpu1", "fb")
    held.note(old, skip("paused"), delivery(old), NOW - HOLD_SECONDS)
    taken = held.take(NOW + 10)
    assert taken is not None
    assert taken.alerts == (later,)


EPISODE_CASES = [
    # (case, starts_at, other, before)
    ("nanoseconds against microseconds", "2026-11-30T05:29:50.914142978Z",
     "2026-11-30T05:29:50.9142Z", True),
    ("a later second", "2026-11-30T05:31:00Z", "2026-11-30T05:30:00.1Z", False),
    ("the same instant", "2026-11-30T05:30:00.100Z", "2026-11-30T05:30:00.1Z", False),
    ("another zone", "2026-11-30T06:29:50+01:00", "2026-11-30T05:30:00Z", True),
    ("unreadable: never before", "junk", "2026-11-30T05:30:00Z", False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "starts_at", "other", "before"), EPISODE_CASES, ids=[c[0] for c in EPISODE_CASES]
)
def test_episode_order(case: str, starts_at: str, other: str, before: bool) -> None:
    """Alertmanager's startsAt values are ordered as instants, nanoseconds and zones included."""
    assert episode_before(starts_at, other) is before, case
