"""Run one replayed day three times: the old way, stallwatch's way with its restart window, and
stallwatch's way with the old two-poll rule (`restart_after` 0); gather what each did."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from stallwatch.replay.clock import Scheduler
from stallwatch.replay.config import ReplayConfig
from stallwatch.replay.degraded import (
    DegradedAlert,
    DegradedPeriod,
    false_alerts,
    overlap_seconds,
    plan_degraded,
)
from stallwatch.replay.old_way import ErrorWatchdog, RequestWatchdog
from stallwatch.replay.server import SimulatedServer
from stallwatch.replay.silences import SilenceOutcome, SilencePlan, plan_silences
from stallwatch.replay.stallwatch_way import Stallwatch
from stallwatch.replay.traffic import Traffic, TrafficPlan, plan_traffic

# "with_work": the frozen gauges show requests, so the server reads stalled (LLMServerStuck);
# "running_at_0": it hung idle, gauges frozen at 0, and only a failing test request shows it
# (LLMServerUnresponsive), like the simulator's `hang_before_update`.
HangKind = Literal["with_work", "running_at_0"]


@dataclass(frozen=True)
class HangOutcome:
    """One real engine hang: when it began, and how long it lasted until a restart ended it."""

    started_at: float
    caught_after: float | None  # None: still hung at the end of the day
    lasted: float
    kind: HangKind = "with_work"


@dataclass(frozen=True)
class WayResult:
    """What one way of watching did to the server over the day."""

    name: str
    restarts: int
    false_restarts: int
    true_restarts: int
    failed_500: int
    refused_while_loading: int
    test_requests: int
    test_requests_to_busy_server: int
    minutes_loading: float
    minutes_hung: float
    hangs: tuple[HangOutcome, ...]
    completed_requests: int
    restarts_by: dict[str, int]
    restarter_skips: dict[str, int]
    # False restarts of a server in a legitimate silence (it would have gone on by itself).
    restarts_in_silence: int = 0
    silences: tuple[SilenceOutcome, ...] = ()
    # Near misses: confirmed stalls that recovered inside their restart window (the
    # restarter's `recovered_in_window`), and stalls that ended by themselves as the exporter
    # counts them (`recovered_stalls`, every stall however short).
    recovered_in_window: int = 0
    exporter_recovered_stalls: int = 0
    longest_recovered_stall_seconds: float = 0.0
    restart_after: float | None = None  # stallwatch's restart window (None: the old way)
    # Test requests sent while the engine was in a silence (an idle weight sync: the gauges
    # read 0, so an idle poll's test request goes out and waits for the sync to end).
    test_requests_in_silence: int = 0
    # Degraded periods (slow, not stuck): the degradation alerts people got (stallwatch only;
    # the old way has none), how much of the periods they covered, those outside every period,
    # and the restarts of a server that was degraded and not hung (what degradation caused).
    degraded_alerts: tuple[DegradedAlert, ...] = ()
    degraded_minutes_noticed: float = 0.0
    false_degraded_alerts: int = 0
    restarts_in_degraded: int = 0

    @property
    def minutes_down(self) -> float:
        return self.minutes_loading + self.minutes_hung

    @property
    def hangs_caught(self) -> int:
        return sum(1 for hang in self.hangs if hang.caught_after is not None)

    @property
    def catch_seconds(self) -> list[float]:
        return [hang.caught_after for hang in self.hangs if hang.caught_after is not None]


@dataclass(frozen=True)
class ReplayResult:
    """One day, three ways: `old` (watchdogs), `new` (stallwatch with its restart window), and
    `two_poll` (stallwatch with `restart_after` 0, acting at the first confirmation)."""

    config: ReplayConfig
    old: WayResult
    new: WayResult
    hang_times: tuple[float, ...]
    batch_phases: tuple[tuple[float, float, int], ...]
    two_poll: WayResult | None = None
    silence_plan: SilencePlan | None = None
    degraded_periods: tuple[DegradedPeriod, ...] = ()

    @property
    def degraded_minutes(self) -> float:
        return sum(period.seconds for period in self.degraded_periods) / 60.0


def _degrade(server: SimulatedServer, period: DegradedPeriod) -> Callable[[float], None]:
    return lambda _now: server.degrade(period)


def _run_way(
    config: ReplayConfig,
    plan: TrafficPlan,
    silence_plan: SilencePlan,
    way: str,
    degraded: tuple[DegradedPeriod, ...] = (),
) -> WayResult:
    scheduler = Scheduler()
    server = SimulatedServer(config, scheduler, silence_plan)
    Traffic(plan, server, scheduler, silence_plan).start()
    for period in degraded:
        scheduler.at(period.start, _degrade(server, period))
        scheduler.at(period.end, server.end_degraded)
    rng = random.Random(f"stallwatch-replay-phases-{config.seed}")
    stallwatch: Stallwatch | None = None
    if way == "old":
        RequestWatchdog(
            "chat watchdog",
            server,
            scheduler,
            interval=config.chat_check_interval,
            timeout=config.chat_check_timeout,
            failures=config.chat_check_failures,
            phase=rng.uniform(0, config.chat_check_interval),
            skip_when_busy_flag=False,
        )
        for interval in config.timer_intervals:
            RequestWatchdog(
                f"{interval / 60:g}-minute timer",
                server,
                scheduler,
                interval=interval,
                timeout=config.timer_check_timeout,
                failures=config.timer_check_failures,
                phase=rng.uniform(0, interval),
                skip_when_busy_flag=True,
            )
        ErrorWatchdog(server, scheduler, rng.uniform(0, config.error_check_interval))
    else:
        stallwatch = Stallwatch(server, scheduler, rng)

    end = config.duration
    while True:
        next_event = scheduler.next_time()
        now = min(next_event, server.next_step_at(next_event))
        if now > end:
            break
        server.advance_to(now)
        while scheduler.next_time() <= now:
            when, action = scheduler.pop()
            action(when)
    server.finish(end)

    hangs = tuple(
        HangOutcome(
            started_at=start,
            caught_after=None if stop is None else stop - start,
            lasted=(end if stop is None else stop) - start,
            kind="running_at_0" if at_zero else "with_work",
        )
        for (start, stop), at_zero in zip(server.hangs, server.hangs_frozen_at_zero, strict=True)
    )
    true_restarts = sum(1 for _t, _by, was_hung, _silent in server.restarts if was_hung)
    history = stallwatch.history if stallwatch is not None else None
    return WayResult(
        name=way,
        restarts=len(server.restarts),
        false_restarts=len(server.restarts) - true_restarts,
        true_restarts=true_restarts,
        failed_500=server.failed_500,
        refused_while_loading=server.refused,
        test_requests=server.test_requests,
        test_requests_to_busy_server=server.test_requests_to_busy,
        minutes_loading=server.loading_seconds / 60.0,
        minutes_hung=sum(hang.lasted for hang in hangs) / 60.0,
        hangs=hangs,
        completed_requests=server.completed,
        restarts_by=dict(Counter(by for _t, by, _hung, _silent in server.restarts)),
        restarter_skips=dict(sorted(stallwatch.skips.items())) if stallwatch is not None else {},
        restarts_in_silence=sum(1 for *_rest, silent in server.restarts if silent),
        silences=tuple(sorted(server.silences, key=lambda silence: silence.started_at)),
        recovered_in_window=len(stallwatch.near_misses) if stallwatch is not None else 0,
        exporter_recovered_stalls=0 if history is None else history.recovered_stalls,
        longest_recovered_stall_seconds=(
            0.0 if history is None else history.longest_recovered_stall_seconds
        ),
        restart_after=config.restart_after if way == "new" else None,
        test_requests_in_silence=server.test_requests_in_silence,
        degraded_alerts=() if stallwatch is None else tuple(stallwatch.degraded_alerts),
        degraded_minutes_noticed=0.0
        if stallwatch is None
        else overlap_seconds(degraded, stallwatch.degraded_alerts, end) / 60.0,
        false_degraded_alerts=0
        if stallwatch is None
        else false_alerts(degraded, stallwatch.degraded_alerts),
        restarts_in_degraded=len(server.restarts_in_degraded),
    )


def run_replay(config: ReplayConfig) -> ReplayResult:
    """Replay the same day the old way, stallwatch's way with `config.restart_after`, and
    stallwatch's way with the old two-poll rule (`restart_after` 0); deterministic for a
    given config. With `restart_after` already 0 the last two are the same run, done once."""
    if config.hours <= 0 or config.load < 0 or config.tokens_per_step < 1:
        raise ValueError("hours must be > 0, load >= 0 and tokens_per_step >= 1")
    plan = plan_traffic(config)
    silence_plan = plan_silences(config)
    degraded = plan_degraded(config, plan.batch_phases, plan.hang_times)
    new = _run_way(config, plan, silence_plan, "new", degraded)
    two_poll = (
        new
        if config.restart_after <= 0
        else _run_way(replace(config, restart_after=0.0), plan, silence_plan, "new", degraded)
    )
    return ReplayResult(
        config=config,
        old=_run_way(config, plan, silence_plan, "old", degraded),
        new=new,
        hang_times=plan.hang_times,
        batch_phases=plan.batch_phases,
        two_poll=two_poll,
        silence_plan=silence_plan,
        degraded_periods=degraded,
    )
