"""The restarter's last step: the cheap checks again after the reads, then the confirmation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stallwatch.common.restart_limits import Budget
from stallwatch.common.restarter_config import CommandAction, RestarterConfig, Target
from stallwatch.core.alerts import Alert
from stallwatch.core.confirmation import Confirmation
from stallwatch.core.policy import (
    CONFIRMED,
    History,
    PastDecision,
    PastRestart,
    decide,
    decide_confirmed,
    with_confirmation,
)

NOW = 1_800_000_000.0
CONFIG = RestarterConfig(
    targets=tuple(
        Target(
            name=name,
            metrics_url=f"http://{name}:8000/metrics",
            action=CommandAction(argv=("true",)),
            cooldown=600.0,
            budget=Budget(max_restarts=3, window=3600.0),
        )
        for name in ("gpu1", "gpu2")
    ),
    journal="journal.sqlite",
    insecure_no_auth=True,
)


def alert(alertname: str) -> Alert:
    labels = {"alertname": alertname, "target": "gpu1", "severity": "critical"}
    return Alert(status="firing", labels=labels, fingerprint="f1", starts_at="2026-11-30T05:29:50Z")


def running(target: str, since: float) -> PastRestart:
    """A restart of `target` decided `since` seconds ago, its action still running."""
    return PastRestart(target=target, decided_at=NOW - since)


STALLED = Confirmation(True, None, "work present and no progress signal moved")
BUSY = Confirmation(False, "progress", "busy: moved")
IDLE = Confirmation(False, "idle", "idle: no work")

# (case, alertname, history at the second decision, confirmation, config, action, reason)
CASES: list[tuple[str, str, History, Confirmation, RestarterConfig, str, str]] = [
    (
        "confirmed stall restarts",
        "LLMServerStuck",
        History(),
        STALLED,
        CONFIG,
        "restart",
        CONFIRMED,
    ),
    (
        "progress in the reads vetoes",
        "LLMServerStuck",
        History(),
        BUSY,
        CONFIG,
        "skip",
        "not_confirmed_progress",
    ),
    (
        "idle confirms unresponsive",
        "LLMServerUnresponsive",
        History(),
        IDLE,
        CONFIG,
        "restart",
        CONFIRMED,
    ),
    ("idle vetoes stuck", "LLMServerStuck", History(), IDLE, CONFIG, "skip", "not_confirmed_idle"),
    (
        "dry run",
        "LLMServerStuck",
        History(),
        STALLED,
        replace(CONFIG, dry_run=True),
        "skip",
        "dry_run",
    ),
    (
        "this target restarted during the reads",
        "LLMServerStuck",
        History(restarts=(running("gpu1", 3),)),
        STALLED,
        CONFIG,
        "skip",
        "cooldown",
    ),
    (
        "another target's restart began during the reads",
        "LLMServerStuck",
        History(restarts=(running("gpu2", 3),)),
        STALLED,
        CONFIG,
        "skip",
        "fleet_in_flight",
    ),
    (
        "the same alert was acted on during the reads",
        "LLMServerStuck",
        History(same_alert=(PastDecision(NOW - 3, "restart", CONFIRMED),)),
        STALLED,
        CONFIG,
        "skip",
        "duplicate",
    ),
    (
        "a check failing after the reads outranks their veto",
        "LLMServerStuck",
        History(restarts=(running("gpu1", 3),)),
        BUSY,
        CONFIG,
        "skip",
        "cooldown",
    ),
]


@pytest.mark.parametrize(
    ("case", "alertname", "history", "confirmation", "config", "action", "reason"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_decide_confirmed(
    case: str,
    alertname: str,
    history: History,
    confirmation: Confirmation,
    config: RestarterConfig,
    action: str,
    reason: str,
) -> None:
    """What changed while the reads ran can still stop a restart; else the reads decide."""
    decision = decide_confirmed(alert(alertname), config, history, NOW, confirmation)
    assert (decision.action, decision.reason) == (action, reason), case


def test_it_is_decide_then_with_confirmation() -> None:
    """The helper is exactly the restarter's sequence, so live code and replay agree."""
    for case, alertname, history, confirmation, config, _action, _reason in CASES:
        the_alert = alert(alertname)
        expected = with_confirmation(
            decide(the_alert, config, history, NOW), the_alert, config, confirmation
        )
        assert decide_confirmed(the_alert, config, history, NOW, confirmation) == expected, case
