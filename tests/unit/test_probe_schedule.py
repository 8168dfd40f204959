"""`/probe` reads at most once per module interval, judged by time; idle targets are forgotten."""

from __future__ import annotations

import itertools

import pytest

from stallwatch.core.probe_schedule import (
    DEBUG_MAX_AT_ONCE,
    DEBUG_MAX_REMEMBERED,
    DEBUG_MIN_GAP_SECONDS,
    EARLY_SHARE_OF_INTERVAL,
    ReadClock,
    after_read,
    debug_forgettable,
    debug_refusal,
    forgotten,
    no_room,
    read_due,
    sweep_due,
)

INTERVAL = 15.0


def reads_of(arrivals: list[float], interval: float = INTERVAL) -> list[float]:
    """The arrival times, in order, that read the server (the others answer from memory)."""
    clock: ReadClock | None = None
    reads = []
    for now in sorted(arrivals):
        if read_due(clock, now, interval):
            clock = after_read(clock, now, interval)
            reads.append(now)
    return reads


def scrapes(offset: float, count: int, jitter: tuple[float, ...] = (0.0,)) -> list[float]:
    return [1000.0 + offset + k * INTERVAL + jitter[k % len(jitter)] for k in range(count)]


@pytest.mark.parametrize(
    ("name", "arrivals", "expected_reads"),
    [
        ("one Prometheus on time", scrapes(0, 8), 8),
        ("one Prometheus, a few ms early or late", scrapes(0, 8, (0.0, -0.004, 0.003)), 8),
        ("two Prometheus 7 s apart", scrapes(0, 8) + scrapes(7, 8), 8),
        # The later reader spans 0..119.9 s: one read per 15 s slot of that span.
        ("two Prometheus 14.9 s apart", scrapes(0, 8) + scrapes(14.9, 8), 9),
        ("two Prometheus at the same moment", scrapes(0, 8) + scrapes(0.001, 8), 8),
        ("a retry 1 s after each scrape", scrapes(0, 8) + scrapes(1, 8), 8),
        (
            "a manual curl every second",
            scrapes(0, 8) + [1000.0 + s for s in range(0, 120)],
            9,  # 0..119 s: one read per slot of the span, not 120
        ),
        ("one Prometheus every 30 s reads every time", scrapes(0, 8)[::2], 4),
    ],
)
def test_reads_per_interval(name: str, arrivals: list[float], expected_reads: int) -> None:
    """However many scrapes arrive, the server is read once per module interval."""
    reads = reads_of(arrivals)
    assert len(reads) == expected_reads, name
    span = max(arrivals) - min(arrivals)
    assert len(reads) <= (span + INTERVAL * EARLY_SHARE_OF_INTERVAL) // INTERVAL + 1


@pytest.mark.parametrize("offset", [0.001, 3.0, 7.5, 13.4, 13.6, 14.9])
def test_reads_are_never_closer_than_the_early_share(offset: float) -> None:
    """Two readers at any phase never make two reads closer than 90 % of the interval."""
    reads = reads_of(scrapes(0, 20) + scrapes(offset, 20))
    gaps = [b - a for a, b in itertools.pairwise(reads)]
    assert min(gaps) >= INTERVAL * (1 - EARLY_SHARE_OF_INTERVAL)
    assert len(reads) in (20, 21)


def test_a_second_reader_in_the_same_slot_answers_from_memory() -> None:
    """After a read at t, a /probe at t+1 reads nothing; one a full interval later reads."""
    clock = after_read(None, 100.0, INTERVAL)
    assert not read_due(clock, 101.0, INTERVAL)
    assert not read_due(clock, 100.0 + INTERVAL * 0.85, INTERVAL)
    assert read_due(clock, 100.0 + INTERVAL - 0.01, INTERVAL)  # a scrape a hair early
    assert read_due(clock, 100.0 + INTERVAL, INTERVAL)


@pytest.mark.parametrize(
    ("clock", "now", "interval", "due"),
    [
        (None, 5.0, 15.0, True),  # never read
        (ReadClock(origin=100.0, interval=15.0, last_slot=0), 99.0, 15.0, True),  # clock back
        (ReadClock(origin=100.0, interval=15.0, last_slot=0), 105.0, 30.0, True),  # reloaded
        (ReadClock(origin=100.0, interval=15.0, last_slot=3), 150.0, 15.0, False),
        (ReadClock(origin=100.0, interval=15.0, last_slot=3), 160.0, 15.0, True),
    ],
)
def test_read_due_edges(clock: ReadClock | None, now: float, interval: float, due: bool) -> None:
    """A first read, a clock that went back and a changed interval read at once."""
    assert read_due(clock, now, interval) is due


def test_a_late_reader_skips_slots_without_catching_up() -> None:
    """After a gap of several intervals the next read happens once, not once per missed slot."""
    clock = after_read(None, 0.0, INTERVAL)
    clock = after_read(clock, 100.0, INTERVAL)
    assert not read_due(clock, 101.0, INTERVAL)


@pytest.mark.parametrize(
    ("asked", "now", "expected"),
    [
        ({"a": (0.0, 600.0), "b": (500.0, 600.0)}, 601.0, ["a"]),
        ({"a": (0.0, 600.0)}, 600.0, []),  # exactly the TTL: kept
        ({"a": (0.0, 60.0), "b": (0.0, 600.0)}, 61.0, ["a"]),  # each its module's TTL
        ({}, 1e9, []),
    ],
)
def test_targets_not_asked_for_are_forgotten(
    asked: dict[str, tuple[float, float]], now: float, expected: list[str]
) -> None:
    """A target is forgotten once no /probe asked for it in longer than its forget_after."""
    assert forgotten(asked, now) == expected


@pytest.mark.parametrize(
    ("remembered", "in_module", "reason"),
    [
        (0, 0, ""),
        (5, 1, ""),
        (5, 2, "module_full"),  # the module's own cap, whatever room the table has
        (10, 1, "too_many_targets"),
        (10, 2, "module_full"),
    ],
)
def test_a_module_that_remembers_its_maximum_refuses_new_targets(
    remembered: int, in_module: int, reason: str
) -> None:
    """A module at its own cap refuses a new target before the whole table is full."""
    assert no_room(remembered, in_module, max_targets=10, module_max=2) == reason


@pytest.mark.parametrize(
    ("next_sweep_at", "now", "due"),
    [(None, 5.0, True), (10.0, 9.5, False), (10.0, 10.0, True), (10.0, 8.9, True)],
    ids=["first", "within the second", "a second later", "clock went back"],
)
def test_the_forget_sweep_runs_once_a_second_or_when_the_clock_went_back(
    next_sweep_at: float | None, now: float, due: bool
) -> None:
    """The table is walked the first time, a second after the last walk, or after a clock jump."""
    assert sweep_due(next_sweep_at, now, 1.0) is due


@pytest.mark.parametrize(
    ("last_at", "now", "running", "refusal"),
    [
        (None, 100.0, 0, ""),
        (None, 100.0, DEBUG_MAX_AT_ONCE - 1, ""),
        (None, 100.0, DEBUG_MAX_AT_ONCE, "debug_busy"),
        (99.0, 100.0, 0, "debug_too_soon"),
        (100.0 - DEBUG_MIN_GAP_SECONDS, 100.0, 0, ""),
        (99.0, 100.0, DEBUG_MAX_AT_ONCE, "debug_busy"),
    ],
)
def test_debug_polls_are_bounded_at_once_and_per_server(
    last_at: float | None, now: float, running: int, refusal: str
) -> None:
    """A debug poll is refused while DEBUG_MAX_AT_ONCE run, or within DEBUG_MIN_GAP_SECONDS of
    the same server's last one."""
    assert debug_refusal(last_at, now, running) == refusal


def test_the_debug_table_forgets_only_when_full() -> None:
    """Below DEBUG_MAX_REMEMBERED nothing is forgotten; when full, servers past the gap, or
    else the oldest."""
    assert debug_forgettable({"a": 0.0}, 100.0) == []
    full = {f"s{i}": 100.0 for i in range(DEBUG_MAX_REMEMBERED)}
    assert debug_forgettable(full, 101.0) == ["s0"]
    full["s7"] = 90.0
    assert debug_forgettable(full, 101.0) == ["s7"]
