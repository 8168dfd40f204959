"""Fleet safety as tables: the breaker and pause state from control rows, what trips the
breaker, and the auto cooldown."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from stallwatch.common.restart_limits import CooldownAuto
from stallwatch.common.restarter_config import (
    Breaker,
    CommandAction,
    RestarterConfig,
    Target,
)
from stallwatch.core.fleet import (
    ControlEvent,
    Controls,
    breaker_trip,
    cooldown_seconds,
    current_controls,
)

NOW = 1_800_000_000.0


def target(name: str, auto: CooldownAuto | None = None) -> Target:
    return Target(
        name=name,
        metrics_url=f"http://{name}:8000/metrics",
        action=CommandAction(argv=("true",)),
        cooldown=600.0 if auto is None else auto.floor,
        cooldown_auto=auto,
    )


CONFIG = RestarterConfig(
    targets=tuple(target(f"gpu{i}") for i in range(8)), journal="j", insecure_no_auth=True
)

CONTROL_CASES: list[tuple[str, list[ControlEvent], Controls]] = [
    ("nothing journaled", [], Controls()),
    (
        "the breaker opened and stays open",
        [ControlEvent("breaker_open", NOW - 86400, "mass stall")],
        Controls(breaker_opened_at=NOW - 86400, breaker_detail="mass stall"),
    ),
    (
        "a second trip keeps the first opening time",
        [ControlEvent("breaker_open", NOW - 600, "a"), ControlEvent("breaker_open", NOW - 60, "b")],
        Controls(breaker_opened_at=NOW - 600, breaker_detail="a"),
    ),
    (
        "resume closes the breaker",
        [ControlEvent("breaker_open", NOW - 600, "a"), ControlEvent("resumed", NOW - 60)],
        Controls(),
    ),
    (
        "a pause for two hours, one hour in",
        [ControlEvent("paused", NOW - 3600, "upgrade", 7200.0)],
        Controls(paused_until=NOW + 3600, pause_detail="upgrade"),
    ),
    (
        "a pause that has ended",
        [ControlEvent("paused", NOW - 7200, "upgrade", 3600.0)],
        Controls(),
    ),
    (
        "a pause with no end lasts until resumed",
        [ControlEvent("paused", NOW - 86400, "rack move")],
        Controls(paused_until=math.inf, pause_detail="rack move"),
    ),
    (
        "resume ends a pause and the breaker together",
        [
            ControlEvent("paused", NOW - 600),
            ControlEvent("breaker_open", NOW - 300, "x"),
            ControlEvent("resumed", NOW - 10),
        ],
        Controls(),
    ),
    (
        "a pause after a trip keeps the breaker open",
        [ControlEvent("breaker_open", NOW - 600, "x"), ControlEvent("paused", NOW - 10, "", 60.0)],
        Controls(breaker_opened_at=NOW - 600, breaker_detail="x", paused_until=NOW + 50),
    ),
]


@pytest.mark.parametrize(
    ("case", "events", "expected"), CONTROL_CASES, ids=[c[0] for c in CONTROL_CASES]
)
def test_controls_fold_the_journal_rows(
    case: str, events: list[ControlEvent], expected: Controls
) -> None:
    """The breaker latches until resumed; a pause ends at its end or at resume."""
    assert current_controls(events, NOW) == expected, case


STALLED_5 = frozenset(f"gpu{i}" for i in range(5))
STALLED_4 = frozenset(f"gpu{i}" for i in range(4))
TRIP_CASES: list[tuple[str, RestarterConfig, frozenset[str], int, str | None]] = [
    ("5 of 8 stalled: mass stall", CONFIG, STALLED_5, 0, "mass stall"),
    ("4 of 8 stalled: not more than half", CONFIG, STALLED_4, 0, None),
    (
        "5 of 8 with the breaker not latching on mass stalls",
        replace(CONFIG, breaker=Breaker(on_mass_stall=False)),
        STALLED_5,
        0,
        None,
    ),
    ("3 failed actions in a row", CONFIG, frozenset(), 3, "failed in a row"),
    ("2 failed actions in a row", CONFIG, frozenset(), 2, None),
    (
        "failed actions never trip with failed_actions 0",
        replace(CONFIG, breaker=Breaker(failed_actions=0)),
        frozenset(),
        50,
        None,
    ),
]


@pytest.mark.parametrize(
    ("case", "config", "stalled", "failed", "why"), TRIP_CASES, ids=[c[0] for c in TRIP_CASES]
)
def test_what_trips_the_breaker(
    case: str, config: RestarterConfig, stalled: frozenset[str], failed: int, why: str | None
) -> None:
    """A mass stall or N failed actions in a row open the breaker; less does not."""
    reason = breaker_trip(config, stalled, len(config.targets), failed)
    if why is None:
        assert reason is None, case
    else:
        assert reason is not None, case
        assert why in reason, case


AUTO = CooldownAuto(floor=300.0, factor=3.0, max=3600.0)


@pytest.mark.parametrize(
    ("case", "the_target", "load", "expected"),
    [
        ("fixed cooldown ignores load times", target("a"), 900.0, 600.0),
        ("auto, no measurement yet: the floor", target("a", AUTO), None, 300.0),
        ("auto, short load: the floor", target("a", AUTO), 60.0, 300.0),
        ("auto, 5 min load: 15 min", target("a", AUTO), 300.0, 900.0),
        ("auto, 30 min load: capped at max", target("a", AUTO), 1800.0, 3600.0),
    ],
)
def test_cooldown_follows_the_measured_load_time(
    case: str, the_target: Target, load: float | None, expected: float
) -> None:
    """`cooldown: auto` is factor x the last load time, within floor and max."""
    loads = {} if load is None else {"a": load}
    assert cooldown_seconds(the_target, loads) == expected, case
