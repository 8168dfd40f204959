"""The fleet replay's settings and seeded plan: traffic, independent hangs, correlated faults,
and legitimate silences (an engine that freezes and goes on by itself)."""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass

from stallwatch.common.restart_limits import DEFAULT_RESTART_AFTER
from stallwatch.replay.config import SyncHolds

DAY = 86400.0


@dataclass(frozen=True)
class FleetConfig:
    """The fleet, its faults and silences, and the ways of watching it. Times in seconds."""

    seed: int = 1
    servers: int = 8
    days: float = 7.0
    servers_per_node: int = 2
    # Traffic: each server alternates busy and idle spells (exponential lengths).
    mean_busy_seconds: float = 2400.0
    mean_idle_seconds: float = 1200.0
    running_when_busy: int = 3  # requests in flight on a busy server
    requests_per_minute_busy: float = 2.0
    requests_per_minute_idle: float = 0.1
    restart_load_seconds: float = 360.0
    person_notices_seconds: float = 4 * 3600.0  # a hang no watchdog catches, found by a person
    # Independent hangs: a vLLM engine that freezes; its API server (and /health) stays up.
    hangs_per_server_day: float = 0.25
    # Correlated faults.
    blips_per_day: float = 1.0
    blip_seconds: tuple[float, float] = (120.0, 300.0)
    blip_fraction: float = 0.75  # of the servers unreadable at once
    exporter_restarts_per_day: float = 0.5
    exporter_restart_seconds: float = 30.0
    bad_nodes_per_week: float = 2.0
    # Legitimate silences (the one-server replay's, `replay.silences`, per server): JIT compiles
    # of shapes not seen before, striking a busy server (about one per server every two days);
    # an RL trainer feeding the first `weight_sync_servers` servers, pushing weights into all
    # of them at once on a schedule, holding them first on the syncs `weight_sync_holds` says;
    # an autotune on every start after a restart, before vLLM opens its port (the server
    # reads down: loading).
    legitimate_silences: bool = True
    compiles_per_server_hour: float = 0.02
    compile_seconds: tuple[float, float] = (30.0, 70.0)
    weight_sync_every_hours: float = 6.0
    weight_sync_seconds: tuple[float, float] = (120.0, 300.0)
    weight_sync_servers: int = 2  # the servers one trainer feeds
    weight_sync_holds: SyncHolds = "alternate"
    weight_sync_hold_seconds: float = 600.0
    start_autotune_seconds: tuple[float, float] = (206.0, 363.0)
    # Stallwatch.
    exporter_interval: float = 15.0
    group_wait: float = 30.0
    repeat_interval: float = 3600.0
    confirm_gap: float = 5.0
    cooldown: float = 600.0
    operator_resume_seconds: float = 1800.0  # a paged operator resumes the breaker
    restart_after: float = DEFAULT_RESTART_AFTER  # the restart window (0: the two-poll rule)
    rules_hold_clause: bool = True  # the restart alerts keep quiet for a held target
    # The kubelet liveness probe on /health.
    probe_period: float = 10.0
    probe_failure_threshold: int = 3
    probe_busy_timeout_probability: float = 0.03  # per check of a busy server (assumed)
    # The canary-on-idle watchdog.
    canary_period: float = 30.0
    canary_failure_threshold: int = 1

    @property
    def duration(self) -> float:
        return self.days * DAY


@dataclass(frozen=True)
class Blip:
    start: float
    end: float
    servers: frozenset[int]


@dataclass(frozen=True)
class PlannedSilence:
    """A legitimate silence planned for one server: it strikes only a server up and not hung."""

    start: float
    server: int
    seconds: float
    cause: str  # compile, weight_sync
    held: bool = False

    @property
    def end(self) -> float:
        return self.start + self.seconds


@dataclass(frozen=True)
class FleetPlan:
    """What happens to the fleet, the same for every way of watching it."""

    config: FleetConfig
    toggles: tuple[tuple[float, ...], ...]  # per server: times busy/idle flips, idle first
    hangs: tuple[tuple[float, int, str], ...]  # (time, server, cause), time order
    blips: tuple[Blip, ...]
    exporter_restarts: tuple[float, ...]
    silences: tuple[PlannedSilence, ...] = ()  # time order
    autotunes: tuple[float, ...] = ()  # each start's autotune after a restart, cycled

    def autotune(self, start: int) -> float:
        return self.autotunes[start % len(self.autotunes)] if self.autotunes else 0.0

    def busy(self, server: int, now: float) -> bool:
        return bisect.bisect_right(self.toggles[server], now) % 2 == 1

    def blipped(self, server: int, now: float) -> bool:
        return any(b.start <= now < b.end and server in b.servers for b in self.blips)

    def in_blip(self, now: float) -> bool:
        return any(b.start <= now < b.end for b in self.blips)


def _times(rng: random.Random, per_second: float, duration: float) -> list[float]:
    """Poisson arrivals over the run, at least one when the rate makes one expected."""
    if per_second <= 0:
        return []
    times: list[float] = []
    t = rng.expovariate(per_second)
    while t < duration:
        times.append(t)
        t += rng.expovariate(per_second)
    if not times and per_second * duration >= 1:
        times.append(rng.uniform(0.1, 0.9) * duration)
    return times


def plan_fleet(config: FleetConfig) -> FleetPlan:
    """The seeded plan of traffic and faults."""
    rng = random.Random(config.seed)
    toggles = []
    for _ in range(config.servers):
        flips, t, busy = [], rng.uniform(0, config.mean_idle_seconds), False
        while t < config.duration:
            flips.append(t)
            busy = not busy
            mean = config.mean_busy_seconds if busy else config.mean_idle_seconds
            t += rng.expovariate(1 / mean)
        toggles.append(tuple(flips))
    hangs = [
        (t, server, "independent")
        for server in range(config.servers)
        for t in _times(rng, config.hangs_per_server_day / DAY, config.duration)
    ]
    nodes = [
        list(range(start, min(start + config.servers_per_node, config.servers)))
        for start in range(0, config.servers, config.servers_per_node)
    ]
    for t in _times(rng, config.bad_nodes_per_week / (7 * DAY), config.duration):
        node = rng.choice(nodes)
        hangs += [(t, server, "bad_node") for server in node]
    blips = []
    count = max(1, round(config.blip_fraction * config.servers))
    for t in _times(rng, config.blips_per_day / DAY, config.duration):
        servers = frozenset(rng.sample(range(config.servers), count))
        blips.append(Blip(t, t + rng.uniform(*config.blip_seconds), servers))
    exporter_restarts = _times(rng, config.exporter_restarts_per_day / DAY, config.duration)
    plan = FleetPlan(
        config, tuple(toggles), tuple(sorted(hangs)), tuple(blips), tuple(exporter_restarts)
    )
    if not config.legitimate_silences:
        return plan
    return plan_silences(plan)


def _held(index: int, config: FleetConfig) -> bool:
    if config.weight_sync_holds == "always":
        return True
    return config.weight_sync_holds == "alternate" and index % 2 == 0


def plan_silences(plan: FleetPlan) -> FleetPlan:
    """`plan` with its legitimate silences, from their own random stream (the rest of the plan
    is the same with or without them)."""
    config = plan.config
    rng = random.Random(f"fleet-silences-{config.seed}")
    silences: list[PlannedSilence] = []
    for server in range(config.servers):
        for t in _times(rng, config.compiles_per_server_hour / 3600.0, config.duration):
            if plan.busy(server, t):  # a new shape comes with work
                silences.append(
                    PlannedSilence(t, server, rng.uniform(*config.compile_seconds), "compile")
                )
    fed = range(min(config.weight_sync_servers, config.servers))
    if config.weight_sync_every_hours > 0 and fed:
        every = config.weight_sync_every_hours * 3600.0
        t = rng.uniform(0.25, 0.75) * every
        index = 0
        while t < config.duration:
            seconds, held = rng.uniform(*config.weight_sync_seconds), _held(index, config)
            silences += [PlannedSilence(t, s, seconds, "weight_sync", held) for s in fed]
            t += every
            index += 1
    autotunes = tuple(rng.uniform(*config.start_autotune_seconds) for _ in range(64))
    return FleetPlan(
        config,
        plan.toggles,
        plan.hangs,
        plan.blips,
        plan.exporter_restarts,
        tuple(sorted(silences, key=lambda silence: (silence.start, silence.server))),
        autotunes,
    )
