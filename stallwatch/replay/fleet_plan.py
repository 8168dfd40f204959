"""The fleet replay's settings and seeded plan: traffic, independent hangs, correlated faults."""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass

DAY = 86400.0


@dataclass(frozen=True)
class FleetConfig:
    """The fleet, its faults and the four ways of watching it. Times in seconds."""

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
    # Stallwatch.
    exporter_interval: float = 15.0
    group_wait: float = 30.0
    repeat_interval: float = 3600.0
    confirm_gap: float = 5.0
    cooldown: float = 600.0
    operator_resume_seconds: float = 1800.0  # a paged operator resumes the breaker
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
class FleetPlan:
    """What happens to the fleet, the same for every way of watching it."""

    config: FleetConfig
    toggles: tuple[tuple[float, ...], ...]  # per server: times busy/idle flips, idle first
    hangs: tuple[tuple[float, int, str], ...]  # (time, server, cause), time order
    blips: tuple[Blip, ...]
    exporter_restarts: tuple[float, ...]

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
    return FleetPlan(
        config, tuple(toggles), tuple(sorted(hangs)), tuple(blips), tuple(exporter_restarts)
    )
