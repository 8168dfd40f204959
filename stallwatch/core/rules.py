"""The restart alerts of `prometheus/alerts.yml`, evaluated on the exporter's own figures.

The exporter counts consecutive polls in one state (`TargetHistory.state_polls`, published as
`stallwatch_target_state_polls`); each rule fires while the state is its own and that count has
reached `POLLS_TO_FIRE`. A unit test holds the rule file to these constants.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from stallwatch.core.classify import State

STUCK_ALERT = "LLMServerStuck"
UNRESPONSIVE_ALERT = "LLMServerUnresponsive"
HUNG_ALERT = "LLMServerHung"
# The state each restart alert watches, in the order of the rule file.
RESTART_ALERT_STATES: Mapping[str, State] = MappingProxyType(
    {STUCK_ALERT: State.STALLED, UNRESPONSIVE_ALERT: State.UNRESPONSIVE, HUNG_ALERT: State.HUNG}
)
# Slow, not stuck (stallwatch.core.degraded): alerts for people only, never a restart. The
# restarter refuses them even where its config lists them.
DEGRADED_ALERT = "LLMServerDegraded"
ADMISSION_STALLED_ALERT = "LLMServerAdmissionStalled"
DEGRADATION_ALERTS: frozenset[str] = frozenset({DEGRADED_ALERT, ADMISSION_STALLED_ALERT})
# "Two consecutive polls": never on one poll alone.
POLLS_TO_FIRE = 2
# What each restart rule adds to its condition: no alert for a target whose hold runs.
HOLD_CLAUSE = "unless on(target) (stallwatch_restarter_hold_expiry_timestamp_seconds > time())"


def restart_alert_fires(
    alertname: str, state: State | None, state_polls: int, *, held: bool = False
) -> bool:
    """Whether the rule `alertname` fires for a target in `state` for `state_polls` polls
    (`held`: the target's hold runs)."""
    return state == RESTART_ALERT_STATES[alertname] and state_polls >= POLLS_TO_FIRE and not held


def restart_alerts(state: State | None, state_polls: int, *, held: bool = False) -> dict[str, bool]:
    """Every restart alert, in rule-file order, and whether it fires."""
    return {
        name: restart_alert_fires(name, state, state_polls, held=held)
        for name in RESTART_ALERT_STATES
    }
