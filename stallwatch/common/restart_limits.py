"""What limits a target's restarts, for a fixed target and a pod rule alike: the budget (so many
restarts in a window), `cooldown: auto`, and the restart window (`restart_after`)."""

from __future__ import annotations

from dataclasses import dataclass

from stallwatch.common.config import Section, quoted

BUDGET_KEYS = ("max_restarts", "window")

# How long the restarter itself must see a server make no progress before it restarts it.
# Healthy servers fall silent for longer than two polls: a JIT compile of a new prompt shape
# (30-70 s), an autotune (206 s), a graph capture; 5 minutes covers every mid-traffic silence
# reported (docs/restarter.md#the-restart-window has the table and its sources). A planned
# longer silence (a weight sync) takes a hold instead.
DEFAULT_RESTART_AFTER = 300.0
# The longest hold an operator may ask for unless the config allows more.
DEFAULT_MAX_HOLD = 3600.0


@dataclass(frozen=True)
class Budget:
    max_restarts: int = 3
    window: float = 3600.0


def budget_from(section: Section) -> Budget:
    """The figures of a `budget` section (taken, and its keys checked, by the caller)."""
    return Budget(
        max_restarts=section.integer("max_restarts", 3, minimum=1),
        window=section.duration("window", 3600.0),
    )


@dataclass(frozen=True)
class CooldownAuto:
    """`cooldown: auto`: factor x the target's last measured load time, within floor and max."""

    floor: float = 600.0
    factor: float = 3.0
    max: float = 7200.0


def cooldown_auto_from(section: Section) -> CooldownAuto | None:
    """`cooldown: auto` (with optional `cooldown_auto: {floor, factor, max}`), else None."""
    auto = section.section("cooldown_auto", ("floor", "factor", "max"))
    if section.raw("cooldown") != "auto":
        if section.has("cooldown_auto"):
            section.report("cooldown_auto", "only goes with cooldown: auto")
        return None
    floor = auto.duration("floor", 600.0, zero=True)
    ceiling = auto.duration("max", 7200.0)
    if ceiling < floor:
        auto.report("max", "must not be shorter than floor")
    factor = auto.raw("factor", 3.0)
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 1 <= factor <= 100:
        auto.report("factor", f"expected a number from 1 to 100, got {quoted(factor)}")
        factor = 3.0
    return CooldownAuto(floor=floor, factor=float(factor), max=ceiling)


def restart_after_from(section: Section, default: float) -> float:
    """A `restart_after` (zero: restart at the first confirmation, the old two-poll rule)."""
    return section.duration("restart_after", default, zero=True)
