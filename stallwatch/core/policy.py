"""Whether a firing alert may restart its target: the restart policy, as pure code.

`decide` runs the cheap checks in order (restart alert, target label, allow-list, duplicate,
pause, breaker, mass stall, cooldown, budget, fleet limits) against a `History` read from the
journal. Only when they all pass does the caller spend two reads of the target on a
confirmation, then `decide_confirmed` runs the checks again and `with_confirmation` turns
the reads into the final decision (confirmed, then dry run).
No I/O and no clock: `now` is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, get_args

from stallwatch.common.restarter_config import RestarterConfig, Target
from stallwatch.core.alerts import Alert
from stallwatch.core.confirmation import Confirmation
from stallwatch.core.fleet import Controls, cooldown_seconds, longest_cooldown, mass_stall
from stallwatch.core.holds import NO_HOLDS, Hold
from stallwatch.core.rules import DEGRADATION_ALERTS

SkipReason = Literal[
    "degradation_alert",
    "not_restart_alert",
    "no_target_label",
    "unknown_target",
    "duplicate",
    "on_hold",
    "paused",
    "breaker_open",
    "mass_stall",
    "cooldown",
    "budget_exhausted",
    "fleet_in_flight",
    "fleet_window",
    "not_confirmed_progress",
    "not_confirmed_idle",
    "not_confirmed_down",
    "not_confirmed_error",
    "restart_window",
    "recovered_in_window",
    "dry_run",
    "invalid_pod_name",
]
# Refusals the restarter adds: a target's action still running, a decision the journal could
# not record, and the Kubernetes allow-rules' refusals of a pod (`core/pod_rules.py`).
DriverSkipReason = Literal[
    "action_in_progress",
    "journal_unwritable",
    "no_rule",
    "pod_not_found",
    "pod_not_allowed",
    "no_pod_ip",
    "no_metrics_port",
    "kubernetes_error",
]
# Every reason a restart is not done: the labels of `stallwatch_restarter_skips_total`.
AnySkipReason = SkipReason | DriverSkipReason
SKIP_REASONS: tuple[AnySkipReason, ...] = (*get_args(SkipReason), *get_args(DriverSkipReason))
Reason = AnySkipReason | Literal["checks_passed", "confirmed"]
NOT_CONFIRMED: frozenset[str] = frozenset(
    r for r in get_args(SkipReason) if r.startswith("not_confirmed")
)

_REFUSAL_REASONS: dict[str, SkipReason] = {
    "progress": "not_confirmed_progress",
    "idle": "not_confirmed_idle",
    "down": "not_confirmed_down",
    # Two reads that connected and got no answer, for an alert whose stall that is not.
    "no_answer": "not_confirmed_down",
    "error": "not_confirmed_error",
}

# The reason of a restart decision whose cheap checks passed, before the confirmation.
CHECKS_PASSED: Literal["checks_passed"] = "checks_passed"
CONFIRMED: Literal["confirmed"] = "confirmed"


@dataclass(frozen=True)
class Decision:
    action: Literal["restart", "skip"]
    reason: Reason
    detail: str

    @property
    def restarts(self) -> bool:
        return self.action == "restart"


@dataclass(frozen=True)
class PastRestart:
    """A restart decided earlier (or, in dry-run mode, one that would have been).

    `blocked`: its action changed nothing because a PodDisruptionBudget refused the eviction;
    such a restart spends no budget and starts no cooldown. `alert`: the alert episode it
    acted on (`alert_key`), so a replica that took over knows a repeat of it as a duplicate.
    """

    target: str
    decided_at: float
    finished_at: float | None = None
    blocked: bool = False
    alert: str = ""

    @property
    def settled_at(self) -> float:
        """When the cooldown starts: the end of the action if known, else the decision."""
        return (
            self.decided_at if self.finished_at is None else max(self.decided_at, self.finished_at)
        )


@dataclass(frozen=True)
class PastDecision:
    """An earlier decision about the same alert episode (same fingerprint and startsAt)."""

    decided_at: float
    action: str
    reason: str
    # A restart whose eviction a PodDisruptionBudget refused: tried again after the cooldown.
    blocked: bool = False


@dataclass(frozen=True)
class History:
    """What the journal knows that the policy needs.

    `restarts`: every target's restarts decided since the longest window the policy looks at.
    `same_alert`: earlier decisions about this alert's fingerprint and startsAt.
    `stalled`: the targets with a firing restart alert now (seen, not resolved).
    `covered`: how many targets the mass-stall percentage is taken of (0: the config's count).
    `controls`: the breaker and the pause switch.
    `load_seconds`: each target's last measured model-load time (for `cooldown: auto`).
    `holds`: the holds in force, by target.
    `acting`: the targets whose restart action is running now.
    """

    restarts: tuple[PastRestart, ...] = ()
    same_alert: tuple[PastDecision, ...] = ()
    stalled: frozenset[str] = frozenset()
    covered: int = 0
    controls: Controls = field(default_factory=Controls)
    load_seconds: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    holds: Mapping[str, Hold] = field(default_factory=lambda: NO_HOLDS)
    acting: frozenset[str] = frozenset()


def alert_key(alert: Alert) -> str:
    """One alert episode: Alertmanager's fingerprint and the episode's startsAt."""
    return f"{alert.fingerprint}@{alert.starts_at}"


def budget_spent(restarts: Iterable[PastRestart], target: Target, now: float) -> int:
    """How many of `target`'s budget restarts its window holds (a blocked one spent none)."""
    since = now - target.budget.window
    return sum(
        1
        for past in restarts
        if past.target == target.name and not past.blocked and past.decided_at > since
    )


def _acted_on(alert: Alert, decided_at: float, now: float) -> Decision:
    return _skip(
        "duplicate",
        f"this alert (fingerprint {alert.fingerprint}, startsAt {alert.starts_at}) "
        f"was already acted on {now - decided_at:.0f} s ago",
    )


def lookback_seconds(config: RestarterConfig) -> float:
    """How far back the journal must be read for `decide` to see everything it uses."""
    spans = [config.fleet_window.window]
    for target in config.targets:
        spans += [longest_cooldown(target), target.budget.window, target.action_timeout]
    return max(spans)


def _skip(reason: SkipReason, detail: str) -> Decision:
    return Decision("skip", reason, detail)


def _in_flight(past: PastRestart, config: RestarterConfig, now: float) -> bool:
    """Still running: no result yet, and younger than its action timeout (a restarter that
    died mid-action left no result; its action cannot outlive the timeout)."""
    if past.finished_at is not None:
        return False
    target = config.target(past.target)
    limit = target.action_timeout if target else max(t.action_timeout for t in config.targets)
    return now - past.decided_at < limit


def decide(alert: Alert, config: RestarterConfig, history: History, now: float) -> Decision:
    """The cheap checks for one firing alert: a skip, or a restart pending confirmation."""
    if alert.alertname in DEGRADATION_ALERTS:
        return _skip(
            "degradation_alert",
            f"alert {alert.alertname!r} says the server is slow, not stuck: it still serves its "
            "requests and a restart would fail them all; it is for people, and routing it to "
            "the restarter is a mistake (see alertmanager/alertmanager.yml)",
        )
    if alert.alertname not in config.restart_alerts:
        return _skip("not_restart_alert", f"alert {alert.alertname!r} is not a restart alert")
    if alert.target is None:
        return _skip("no_target_label", "the alert has no target label")
    target = config.target(alert.target)
    if target is None:
        return _skip("unknown_target", f"target {alert.target!r} is not in the config")
    for past in history.same_alert:
        if past.blocked:
            if now - past.decided_at < target.cooldown:
                return _skip(
                    "duplicate",
                    f"a PodDisruptionBudget refused this alert's restart "
                    f"{now - past.decided_at:.0f} s ago; tried again after the cooldown",
                )
            continue
        if past.action == "restart" or past.reason == "dry_run":
            return _acted_on(alert, past.decided_at, now)
        if past.reason in NOT_CONFIRMED and now - past.decided_at < target.cooldown:
            return _skip(
                "duplicate",
                f"this alert was refused by confirmation ({past.reason}) "
                f"{now - past.decided_at:.0f} s ago; not re-checked within the cooldown",
            )
    key = alert_key(alert)
    for restart in history.restarts:  # restarts a replica that held the Lease before decided
        if restart.alert == key and not restart.blocked:
            return _acted_on(alert, restart.decided_at, now)
    hold = history.holds.get(target.name)
    if hold is not None and hold.active(now):
        return _skip(
            "on_hold",
            f"held for {hold.until - now:.0f} s more ({hold.detail or 'no reason given'}); "
            "judged again when the hold ends",
        )
    fleet_refusal = _fleet_refusal(config, history, now)
    if fleet_refusal is not None:
        return fleet_refusal
    disruptive = [past for past in history.restarts if not past.blocked]
    own = [past for past in disruptive if past.target == target.name]
    if own:
        last = max(own, key=lambda past: past.settled_at)
        remaining = last.settled_at + cooldown_seconds(target, history.load_seconds) - now
        if remaining > 0:
            return _skip(
                "cooldown", f"restarted {now - last.decided_at:.0f} s ago; {remaining:.0f} s left"
            )
    spent = budget_spent(history.restarts, target, now)
    if spent >= target.budget.max_restarts:
        return _skip(
            "budget_exhausted",
            f"{spent} restarts in the last {target.budget.window:g} s "
            f"(budget {target.budget.max_restarts})",
        )
    in_flight = [past for past in history.restarts if _in_flight(past, config, now)]
    if len(in_flight) >= config.max_in_flight:
        running = ", ".join(sorted({past.target for past in in_flight}))
        return _skip(
            "fleet_in_flight",
            f"{len(in_flight)} restart(s) in flight ({running}); limit {config.max_in_flight}",
        )
    window = config.fleet_window
    others = {
        past.target
        for past in disruptive
        if past.decided_at > now - window.window and past.target != target.name
    }
    if len(others) >= window.max_targets:
        return _skip(
            "fleet_window",
            f"{len(others)} other targets restarted in the last {window.window:g} s "
            f"({', '.join(sorted(others))}); limit {window.max_targets}: "
            "a stall on many servers at once points at the network or the exporter",
        )
    return Decision("restart", CHECKS_PASSED, "cheap checks passed; confirmation needed")


def _fleet_refusal(config: RestarterConfig, history: History, now: float) -> Decision | None:
    """Pause, breaker, mass stall: the fleet-wide refusals, whatever the target's own record."""
    controls = history.controls
    paused_until = controls.paused_until
    if paused_until is not None and now < paused_until:
        until = (
            "until resumed" if paused_until == float("inf") else f"{paused_until - now:.0f} s more"
        )
        return _skip("paused", f"restarts are paused ({until}): {controls.pause_detail}")
    opened_at = controls.breaker_opened_at
    if opened_at is not None:
        return _skip(
            "breaker_open",
            f"the breaker opened {now - opened_at:.0f} s ago ({controls.breaker_detail}); "
            "it stays open until an operator resumes",
        )
    why = mass_stall(config, history.stalled, history.covered or len(config.targets))
    if why is not None:
        return _skip("mass_stall", why)
    return None


def with_confirmation(
    decision: Decision, alert: Alert, config: RestarterConfig, confirmation: Confirmation
) -> Decision:
    """The final decision once two fresh reads of the target have been judged."""
    if not decision.restarts:
        return decision
    idle_is_the_stall = (
        confirmation.refusal == "idle" and alert.alertname in config.confirm.idle_confirms
    )
    hang_is_the_stall = (
        confirmation.refusal == "no_answer" and alert.alertname in config.confirm.hung_confirms
    )
    if alert.alertname in config.confirm.hung_confirms and not hang_is_the_stall:
        # A hang is a server that does not answer: one that answered is not hung, whatever
        # its counters say (a stall it shows is LLMServerStuck's to act on).
        refusal = confirmation.refusal or "error"
        detail = confirmation.detail if confirmation.refusal else f"answered: {confirmation.detail}"
        return _skip(_REFUSAL_REASONS.get(refusal, "not_confirmed_error"), detail)
    if not confirmation.confirmed and not idle_is_the_stall and not hang_is_the_stall:
        refusal = confirmation.refusal or "error"
        return _skip(_REFUSAL_REASONS.get(refusal, "not_confirmed_error"), confirmation.detail)
    if config.dry_run:
        return _skip("dry_run", f"would restart: {confirmation.detail}")
    return Decision("restart", CONFIRMED, confirmation.detail)


def decide_confirmed(
    alert: Alert,
    config: RestarterConfig,
    history: History,
    now: float,
    confirmation: Confirmation,
) -> Decision:
    """The final decision once the confirmation reads are back: `decide` again, then judge them.

    The reads take seconds, so the cheap checks run again on a `history` read at `now`: another
    restart decided meanwhile (for this target or the fleet) must still stop this one.
    """
    return with_confirmation(decide(alert, config, history, now), alert, config, confirmation)
