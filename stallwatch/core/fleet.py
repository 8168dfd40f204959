"""Fleet safety that knows model servers: mass stall, latched breaker, pause, load-time cooldown.

Pure decisions with `now` passed in. The restarter's edge reads the journal into these values
(`Controls` from its control rows, the stalled targets from the restart alerts it has seen, the
measured load times) and journals what they decide (a breaker that opens).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from stallwatch.common.restarter_config import RestarterConfig, Target

ControlKind = Literal["breaker_open", "paused", "resumed"]
CONTROL_KINDS: tuple[ControlKind, ...] = ("breaker_open", "paused", "resumed")


@dataclass(frozen=True)
class ControlEvent:
    """One control row of the journal: the breaker opened, a pause began, or an operator resumed.

    `duration`: a pause's length in seconds (None: until resumed).
    """

    kind: ControlKind
    time: float
    detail: str = ""
    duration: float | None = None


@dataclass(frozen=True)
class Controls:
    """The breaker and the pause switch as they stand now."""

    breaker_opened_at: float | None = None
    breaker_detail: str = ""
    paused_until: float | None = None  # math.inf: until resumed
    pause_detail: str = ""

    @property
    def breaker_open(self) -> bool:
        return self.breaker_opened_at is not None

    def paused(self, now: float) -> bool:
        return self.paused_until is not None and now < self.paused_until


def current_controls(events: Iterable[ControlEvent], now: float) -> Controls:
    """Fold the control rows (oldest first) into the state now: `resumed` closes both; the
    breaker stays open until then; a pause ends at its end or at `resumed`."""
    controls = Controls()
    for event in events:
        if event.kind == "resumed":
            controls = Controls()
        elif event.kind == "breaker_open" and not controls.breaker_open:
            controls = Controls(
                event.time, event.detail, controls.paused_until, controls.pause_detail
            )
        elif event.kind == "paused":
            until = math.inf if event.duration is None else event.time + event.duration
            controls = Controls(
                controls.breaker_opened_at, controls.breaker_detail, until, event.detail
            )
    if controls.paused_until is not None and now >= controls.paused_until:
        controls = Controls(controls.breaker_opened_at, controls.breaker_detail)
    return controls


def mass_stall(config: RestarterConfig, stalled: frozenset[str], covered: int) -> str | None:
    """Why this is a mass stall (more than `max_percent` % of the `covered` targets stalled at
    once, and at least `min_stalled`), or None. A shared cause (network, exporter, a bad node,
    storage) looks like this; restarting the servers cannot fix it."""
    rule = config.mass_stall
    if covered <= 0 or len(stalled) < rule.min_stalled:
        return None
    if len(stalled) * 100 <= rule.max_percent * covered:
        return None
    names = ", ".join(sorted(stalled)[:8]) + (", ..." if len(stalled) > 8 else "")
    return (
        f"{len(stalled)} of {covered} targets stalled at once ({names}): more than "
        f"{rule.max_percent} %, a shared cause (network, exporter, node, storage) is likelier "
        "than that many servers failing; restarting none"
    )


def breaker_trip(
    config: RestarterConfig, stalled: frozenset[str], covered: int, failed_in_a_row: int
) -> str | None:
    """Why the latched breaker must open now, or None."""
    if config.breaker.on_mass_stall:
        why = mass_stall(config, stalled, covered)
        if why is not None:
            return f"mass stall: {why}"
    limit = config.breaker.failed_actions
    if limit > 0 and failed_in_a_row >= limit:
        return (
            f"{failed_in_a_row} restart actions failed in a row: the way restarts are done "
            "is broken (socket, permissions, API), not the servers"
        )
    return None


def cooldown_seconds(target: Target, load_seconds: Mapping[str, float]) -> float:
    """The target's cooldown: fixed, or with `cooldown: auto` factor x its last measured load
    time (restart to the first read with engine metrics), within floor and max. With no
    measurement yet, the floor."""
    auto = target.cooldown_auto
    if auto is None:
        return target.cooldown
    measured = load_seconds.get(target.name)
    if measured is None:
        return auto.floor
    return max(auto.floor, min(auto.max, auto.factor * measured))


def longest_cooldown(target: Target) -> float:
    """The longest cooldown the target can have (how far back the journal must be read)."""
    return target.cooldown if target.cooldown_auto is None else target.cooldown_auto.max
