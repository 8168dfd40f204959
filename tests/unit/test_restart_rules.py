"""The restart alerts' condition as the core evaluates it, held to `prometheus/alerts.yml`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stallwatch.core.classify import State
from stallwatch.core.rules import (
    HOLD_CLAUSE,
    HUNG_ALERT,
    POLLS_TO_FIRE,
    RESTART_ALERT_STATES,
    STUCK_ALERT,
    UNRESPONSIVE_ALERT,
    restart_alert_fires,
    restart_alerts,
)

ALERTS_FILE = Path(__file__).resolve().parents[2] / "prometheus" / "alerts.yml"

# (case, state, consecutive polls in that state, alerts that fire)
CASES: list[tuple[str, State | None, int, set[str]]] = [
    ("no poll yet", None, 0, set()),
    ("one stalled poll", State.STALLED, 1, set()),
    ("two stalled polls", State.STALLED, 2, {STUCK_ALERT}),
    ("ten stalled polls", State.STALLED, 10, {STUCK_ALERT}),
    ("one unresponsive poll", State.UNRESPONSIVE, 1, set()),
    ("two unresponsive polls", State.UNRESPONSIVE, 2, {UNRESPONSIVE_ALERT}),
    ("busy for an hour", State.BUSY, 240, set()),
    ("idle for an hour", State.IDLE, 240, set()),
    ("down for an hour", State.DOWN, 240, set()),
    ("one hung poll", State.HUNG, 1, set()),
    ("two hung polls", State.HUNG, 2, {HUNG_ALERT}),
    ("hung for an hour", State.HUNG, 240, {HUNG_ALERT}),
    ("restarted twice in a row", State.RESTARTED, 2, set()),
    ("unknown twice in a row", State.UNKNOWN, 2, set()),
]


@pytest.mark.parametrize(("case", "state", "polls", "firing"), CASES, ids=[c[0] for c in CASES])
def test_restart_alerts(case: str, state: State | None, polls: int, firing: set[str]) -> None:
    """A restart alert fires on the second consecutive poll in its own state, never sooner."""
    result = restart_alerts(state, polls)
    assert list(result) == [STUCK_ALERT, UNRESPONSIVE_ALERT, HUNG_ALERT], case
    assert {name for name, fires in result.items() if fires} == firing, case
    for name in RESTART_ALERT_STATES:
        assert restart_alert_fires(name, state, polls) == (name in firing), case


def rule_expressions() -> dict[str, str]:
    document = yaml.safe_load(ALERTS_FILE.read_text(encoding="utf-8"))
    return {
        rule["alert"]: " ".join(rule["expr"].split())
        for group in document["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


@pytest.mark.parametrize("alertname", list(RESTART_ALERT_STATES))
def test_the_rule_file_says_what_the_core_evaluates(alertname: str) -> None:
    """Each restart rule in alerts.yml is its state's flag and the poll count the core uses."""
    expected = (
        f"stallwatch_target_state_polls >= {POLLS_TO_FIRE} and ignoring(state) "
        f'stallwatch_target_state{{state="{RESTART_ALERT_STATES[alertname]}"}} == 1 '
        f"{HOLD_CLAUSE}"
    )
    assert rule_expressions()[alertname] == expected


def test_a_hold_keeps_every_restart_alert_quiet() -> None:
    """While a target's hold runs, no restart alert fires for it, whatever its state."""
    for name, state in RESTART_ALERT_STATES.items():
        assert restart_alert_fires(name, state, POLLS_TO_FIRE)
        assert not restart_alert_fires(name, state, POLLS_TO_FIRE, held=True)
