"""When `/probe` reads a target and when it answers from memory, and which targets to forget.

Pure, `now` passed in. Reads are judged by time, never by how many scrapes arrive: the time
after a target's first read is cut into slots one module interval long, and a target is read
at most once per slot. A second Prometheus, a retry or a manual curl in the same slot gets the
last verdict from memory, so the server's load, the comparison window of two reads and the
count of consecutive polls all stay those of one reader at the module's interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K")

# Scrapes of one Prometheus arrive a few milliseconds early or late. The slot grid starts this
# share of an interval before the first read, so a scrape that comes on time but a hair early
# still falls in the next slot instead of being answered from memory (and read a slot later).
EARLY_SHARE_OF_INTERVAL = 0.1


@dataclass(frozen=True)
class ReadClock:
    """The slot grid of one target: where it starts, its width, and the slot last read."""

    origin: float
    interval: float
    last_slot: int

    def slot(self, now: float) -> int:
        return math.floor((now - self.origin) / self.interval)


def read_due(clock: ReadClock | None, now: float, interval: float) -> bool:
    """Whether a `/probe` arriving at `now` reads the server (else: answer from memory)."""
    if clock is None or clock.interval != interval or now < clock.origin:
        return True  # never read, the module's interval changed, or the clock went back
    return clock.slot(now) > clock.last_slot


def after_read(clock: ReadClock | None, now: float, interval: float) -> ReadClock:
    """The grid once a read starts at `now` (a new grid for a first read or a changed one)."""
    if clock is None or clock.interval != interval or now < clock.origin:
        origin = now - interval * EARLY_SHARE_OF_INTERVAL
        return ReadClock(origin=origin, interval=interval, last_slot=0)
    return ReadClock(clock.origin, clock.interval, clock.slot(now))


def forgotten(last_asked: Mapping[K, tuple[float, float]], now: float) -> list[K]:
    """The targets no `/probe` asked for in longer than their own `forget_after`.

    `last_asked` maps each target to (when a `/probe` last asked for it, its forget_after).
    """
    return [key for key, (at, after) in last_asked.items() if asked_too_long_ago(at, after, now)]


def asked_too_long_ago(asked_at: float, forget_after: float, now: float) -> bool:
    """Whether a target last asked for at `asked_at` is to be forgotten at `now`."""
    return now - asked_at > forget_after


def sweep_due(next_sweep_at: float | None, now: float, every: float) -> bool:
    """Whether to walk the table for targets to forget: the first time, once `every` has
    passed since the last walk, or when the clock went back past it."""
    return next_sweep_at is None or not next_sweep_at - every <= now < next_sweep_at


def no_room(remembered: int, in_module: int, *, max_targets: int, module_max: int) -> str:
    """Why a new target of a module cannot be remembered ("" when it can): `module_full` when
    the module remembers its own maximum, `too_many_targets` when the whole table is full."""
    if in_module >= module_max:
        return "module_full"
    if remembered >= max_targets:
        return "too_many_targets"
    return ""


# A `/probe` read ends this long before the scrape's deadline (as blackbox_exporter's
# --timeout-offset), so the answer reaches Prometheus in time; its requests each end half of it
# (a tenth of the read, if less) earlier still, so a server that never answers is judged (hung)
# before the read is cut.
SCRAPE_TIMEOUT_OFFSET_SECONDS = 0.5


@dataclass(frozen=True)
class ReadBudget:
    """How long one `/probe` read may take, from Prometheus' scrape timeout."""

    scrape_timeout: float
    requests: float  # each request of the read (the idle test request excepted) at most
    read: float  # the whole read at most; then it is cut, with no verdict


def read_budget(header: str | None) -> ReadBudget | None:
    """The budget `X-Prometheus-Scrape-Timeout-Seconds` gives a read (None: no header).

    Raises ValueError for a header that is not a positive number of seconds.
    """
    if header is None:
        return None
    try:
        scrape_timeout = float(header)
    except ValueError:
        raise ValueError(f"expected a number of seconds, got {header!r}") from None
    if not math.isfinite(scrape_timeout) or scrape_timeout <= 0:
        raise ValueError(f"expected a positive number of seconds, got {header!r}")
    # A short scrape keeps half its time for the read, whatever the offset.
    read = max(scrape_timeout - SCRAPE_TIMEOUT_OFFSET_SECONDS, scrape_timeout / 2)
    requests = read - min(SCRAPE_TIMEOUT_OFFSET_SECONDS / 2, read / 10)
    return ReadBudget(scrape_timeout=scrape_timeout, requests=requests, read=read)
