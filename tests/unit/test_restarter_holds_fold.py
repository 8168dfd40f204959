"""Holds folded a few rows at a time (as the restarter follows the journal) are the holds folded
from every row at once."""

from __future__ import annotations

import pytest

from stallwatch.core.holds import NO_HOLDS, Hold, HoldEvent, current_holds, folded, in_force

EVENTS = (
    HoldEvent("hold", "gpu1", 100.0, 600.0, "weight sync"),
    HoldEvent("hold", "gpu2", 110.0, 60.0, "maintenance"),
    HoldEvent("hold_released", "gpu1", 200.0),
    HoldEvent("hold", "gpu1", 300.0, 120.0, "second sync"),
    HoldEvent("hold_released", "gpu3", 310.0),  # a release of nothing changes nothing
)


@pytest.mark.parametrize("split", range(len(EVENTS) + 1))
def test_folding_in_two_looks_equals_folding_at_once(split: int) -> None:
    """Rows read before and after any split point fold to the same holds as all rows at once."""
    followed = folded(folded(NO_HOLDS, EVENTS[:split]), EVENTS[split:])
    for now in (105.0, 150.0, 250.0, 350.0, 500.0):
        assert in_force(followed, now) == current_holds(EVENTS, now), now


@pytest.mark.parametrize(
    ("now", "held"),
    [
        (
            150.0,
            {
                "gpu1": Hold("gpu1", 100.0, 700.0, "weight sync"),
                "gpu2": Hold("gpu2", 110.0, 170.0, "maintenance"),
            },
        ),
        (180.0, {"gpu1": Hold("gpu1", 100.0, 700.0, "weight sync")}),  # gpu2's ran out
        (250.0, {}),  # gpu1's released early
        (350.0, {"gpu1": Hold("gpu1", 300.0, 420.0, "second sync")}),
        (420.0, {}),  # the end of a hold is not in it
    ],
)
def test_holds_in_force(now: float, held: dict[str, Hold]) -> None:
    """A hold is in force from its row until its duration has passed or a release came."""
    written = [event for event in EVENTS if event.time <= now]  # the rows there are at `now`
    assert dict(current_holds(written, now)) == held
