"""The day's degraded periods: a server that goes on working, badly, for a while.

Drawn once from the seed, inside batch phases (slowness matters to a server with work) and away
from the real hangs, each of one kind: `throughput` (decode at `degraded_factor` of its speed, a
slow band), `admission` (a waiting request admitted only into an empty batch, the running ones
decoding at that speed: slow non-preemptible loads) or `preemption` (a KV cache of
`degraded_kv_fraction` of its size: requests preempted over and over). Nothing here restarts
anything; a restart during one of a server neither hung nor in a legitimate silence is a false
restart it caused.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from stallwatch.replay.config import ReplayConfig

DegradedMode = Literal["throughput", "admission", "preemption"]
MODES: tuple[DegradedMode, ...] = ("throughput", "admission", "preemption")
# A degraded period keeps this far from a real hang, so that the hang's restart is its own.
HANG_MARGIN_SECONDS = 900.0


@dataclass(frozen=True)
class DegradedPeriod:
    start: float
    end: float
    mode: DegradedMode

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def holds(self, when: float) -> bool:
        return self.start <= when < self.end


@dataclass
class DegradedAlert:
    """One firing episode of a degradation alert (for people): when it fired and resolved."""

    alertname: str
    fired_at: float
    resolved_at: float | None = None


def overlap_seconds(
    periods: tuple[DegradedPeriod, ...], alerts: list[DegradedAlert], end: float
) -> float:
    """How long some degradation alert fired inside the periods (overlapping alerts once)."""
    total = 0.0
    for period in periods:
        spans = sorted(
            (max(period.start, a.fired_at), min(period.end, a.resolved_at or end)) for a in alerts
        )
        reach = period.start
        for begin, finish in spans:
            begin = max(begin, reach)
            if finish > begin:
                total += finish - begin
                reach = finish
    return total


def false_alerts(periods: tuple[DegradedPeriod, ...], alerts: list[DegradedAlert]) -> int:
    """Degradation alerts that fired outside every period."""
    return sum(1 for alert in alerts if not any(p.holds(alert.fired_at) for p in periods))


def plan_degraded(
    config: ReplayConfig,
    batch_phases: tuple[tuple[float, float, int], ...],
    hang_times: tuple[float, ...],
) -> tuple[DegradedPeriod, ...]:
    """The day's degraded periods, in time order."""
    count = round(config.degraded_per_day * config.hours / 24.0)
    if count <= 0:
        return ()
    rng = random.Random(f"stallwatch-replay-degraded-{config.seed}")
    shortest, longest = config.degraded_seconds
    candidates = [(s, e) for s, e, _c in batch_phases if e - s >= shortest + 600.0]
    rng.shuffle(candidates)
    periods: list[DegradedPeriod] = []
    for start, end in candidates:
        if len(periods) == count:
            break
        begin = start + rng.uniform(300.0, 600.0)
        finish = min(end - 60.0, begin + rng.uniform(shortest, longest))
        if finish - begin < shortest / 2:
            continue
        if any(
            begin - HANG_MARGIN_SECONDS <= hang <= finish + HANG_MARGIN_SECONDS
            for hang in hang_times
        ):
            continue
        periods.append(DegradedPeriod(begin, finish, MODES[len(periods) % len(MODES)]))
    return tuple(sorted(periods, key=lambda period: period.start))
