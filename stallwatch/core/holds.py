"""Holds: "this target will be silent for up to N" (a weight sync, maintenance, a planned
reload), bounded, expiring by themselves. Pure: the journal's hold rows folded at `now`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

HoldKind = Literal["hold", "hold_released"]
HOLD_KINDS: tuple[HoldKind, ...] = ("hold", "hold_released")


@dataclass(frozen=True)
class HoldEvent:
    """One hold row of the journal: a hold taken (for `duration` seconds) or released."""

    kind: HoldKind
    target: str
    time: float
    duration: float = 0.0
    detail: str = ""


@dataclass(frozen=True)
class Hold:
    target: str
    since: float
    until: float
    detail: str = ""

    def active(self, now: float) -> bool:
        return self.since <= now < self.until


NO_HOLDS: Mapping[str, Hold] = MappingProxyType({})


def folded(holds: Mapping[str, Hold], events: Iterable[HoldEvent]) -> Mapping[str, Hold]:
    """`holds` with later hold rows applied (oldest first): the latest hold of each target,
    unless a release came after it. Holds that ran out are kept; `in_force` leaves them out."""
    result = dict(holds)
    for event in events:
        if event.kind == "hold_released":
            result.pop(event.target, None)
        else:
            result[event.target] = Hold(
                event.target, event.time, event.time + event.duration, event.detail
            )
    return MappingProxyType(result)


def in_force(holds: Mapping[str, Hold], now: float) -> Mapping[str, Hold]:
    """The holds of `holds` in force at `now`, by target."""
    return MappingProxyType({name: hold for name, hold in holds.items() if hold.active(now)})


def current_holds(events: Iterable[HoldEvent], now: float) -> Mapping[str, Hold]:
    """The holds in force at `now`, by target: the latest hold of each target, unless it ran out
    or a release came after it (events oldest first)."""
    return in_force(folded(NO_HOLDS, events), now)


def hold_refusal(duration: float, max_hold: float) -> str | None:
    """Why a hold of `duration` seconds is refused (None: it is allowed)."""
    if not duration > 0:
        return "must be longer than zero"
    if duration > max_hold:
        return (
            f"{duration:g} s is longer than max_hold ({max_hold:g} s): a hold that long would "
            "hide a real hang; raise max_hold in the restarter's config if you mean it"
        )
    return None
