"""When `/probe` reads a target and when it answers from memory, and which targets to forget.

Pure, `now` passed in. Reads are judged by time, never by how many scrapes arrive: the time
after a target's first read is cut into slots one module interval long, and a target is read
at most once per slot. A second Prometheus, a retry or a manual curl in the same slot gets the
last verdict from memory, so the server's load, the comparison window of two reads and the
count of consecutive polls all stay those of one reader at the module's interval.
"""

from __future__ import annotations

import math
import re
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


def after_cut(before: ReadClock | None) -> ReadClock | None:
    """The clock after a read cut at the scrape's deadline: as it was before the read. A cut
    read judged nothing, so it is not the slot's read: the next `/probe` of the slot reads
    (else one scrape with a tiny timeout would leave every other scrape of its slot the verdict
    from before)."""
    return before


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
# A scrape timeout below this cannot serve a read (a read gets half of it, its requests less):
# refused, so that no header, however small, takes a target's read slot for a read cut at once.
MIN_SCRAPE_TIMEOUT_SECONDS = 0.25
# What Prometheus sends (a decimal number of seconds), in ASCII digits only (no Arabic-Indic
# digit, no `1_0`).
_SECONDS = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_WORDS = ("inf", "+inf", "-inf", "infinity", "+infinity", "-infinity", "nan", "+nan", "-nan")


@dataclass(frozen=True)
class ReadBudget:
    """How long one `/probe` read may take, from Prometheus' scrape timeout."""

    scrape_timeout: float
    requests: float  # each request of the read (the idle test request excepted) at most
    read: float  # the whole read at most; then it is cut, with no verdict


def read_budget(header: str | None) -> ReadBudget | None:
    """The budget `X-Prometheus-Scrape-Timeout-Seconds` gives a read (None: no header).

    Raises ValueError for a header that is not a positive number of seconds in ASCII digits,
    or one below MIN_SCRAPE_TIMEOUT_SECONDS.
    """
    if header is None:
        return None
    shown = repr(header[:40] + ("..." if len(header) > 40 else ""))
    if _SECONDS.fullmatch(header) is None and header.lower() not in _WORDS:
        raise ValueError(f"expected a number of seconds, got {shown}")
    scrape_timeout = float(header)
    if not math.isfinite(scrape_timeout) or scrape_timeout <= 0:
        raise ValueError(f"expected a positive number of seconds, got {shown}")
    if scrape_timeout < MIN_SCRAPE_TIMEOUT_SECONDS:
        raise ValueError(
            f"{shown} seconds is too short to serve a read: at least {MIN_SCRAPE_TIMEOUT_SECONDS:g}"
        )
    # A short scrape keeps half its time for the read, whatever the offset.
    read = max(scrape_timeout - SCRAPE_TIMEOUT_OFFSET_SECONDS, scrape_timeout / 2)
    requests = read - min(SCRAPE_TIMEOUT_OFFSET_SECONDS / 2, read / 10)
    return ReadBudget(scrape_timeout=scrape_timeout, requests=requests, read=read)


# `/probe?debug=true` reads a server on every call, bypassing the read slots, and parses what it
# reads in the pool the static targets' big payloads share. Its own budget: at most this many
# debug polls at once in the whole exporter, and one server polled for debug at most once in
# DEBUG_MIN_GAP_SECONDS, so whoever may call `/probe` can neither starve the static targets nor
# aim the exporter at one server again and again.
DEBUG_MAX_AT_ONCE = 2
DEBUG_MIN_GAP_SECONDS = 5.0
# Servers whose last debug poll is remembered at most (older ones are forgotten first).
DEBUG_MAX_REMEMBERED = 4096


def debug_refusal(last_at: float | None, now: float, running: int) -> str:
    """Why a `/probe?debug=true` of a server last polled for debug at `last_at` (None: not
    lately), with `running` debug polls under way, is refused now ("" if it may run)."""
    if running >= DEBUG_MAX_AT_ONCE:
        return "debug_busy"
    if last_at is not None and now - last_at < DEBUG_MIN_GAP_SECONDS:
        return "debug_too_soon"
    return ""


def debug_forgettable(last_debug: Mapping[K, float], now: float) -> list[K]:
    """The servers whose last debug poll no longer limits them, to forget once the table is
    full; if none, the oldest."""
    if len(last_debug) < DEBUG_MAX_REMEMBERED:
        return []
    old = [key for key, at in last_debug.items() if now - at >= DEBUG_MIN_GAP_SECONDS]
    return old or [min(last_debug, key=lambda key: last_debug[key])]
