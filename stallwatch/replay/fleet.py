"""The fleet replay: N servers over D days, watched five ways, on the same seeded plan: stallwatch
with its fleet rules (restart window at the plan's `restart_after`), the same with the two-poll
rule (`restart_after` 0), stallwatch without fleet rules, a kubelet probe, a canary on idle."""

from __future__ import annotations

from dataclasses import dataclass

from stallwatch.replay.fleet_plan import FleetConfig, FleetPlan, plan_fleet
from stallwatch.replay.fleet_probes import canary_on_idle, kubelet_probe
from stallwatch.replay.fleet_stallwatch import FleetStallwatch
from stallwatch.replay.fleet_state import WayTally


@dataclass(frozen=True)
class FleetResult:
    """The plan, and what each way did with it (stallwatch with fleet rules first, then the same
    with the two-poll rule)."""

    plan: FleetPlan
    ways: tuple[WayTally, ...]
    breaker_openings: int


def run_fleet(config: FleetConfig) -> FleetResult:
    """Replay the plan under each way of watching the fleet."""
    plan = plan_fleet(config)
    with_rules = FleetStallwatch(plan, fleet_rules=True)
    ways = (
        with_rules.run(),
        FleetStallwatch(plan, fleet_rules=True, restart_after=0.0).run(),
        FleetStallwatch(plan, fleet_rules=False).run(),
        kubelet_probe(plan),
        canary_on_idle(plan),
    )
    return FleetResult(plan, ways, with_rules.breaker_openings)
