"""The fleet replay's request-sending watchdogs: a kubelet `/health` probe and a canary on idle."""

from __future__ import annotations

import random

from stallwatch.replay.fleet_plan import FleetPlan
from stallwatch.replay.fleet_state import FleetState, WayTally


def kubelet_probe(plan: FleetPlan) -> WayTally:
    """A liveness probe on `/health` (timeout 1 s, `failureThreshold` 3).

    vLLM's `/health` answers 200 while the engine is hung, so a hang never fails it. A busy
    server's event loop can miss the 1 s timeout: each check of a busy server fails with
    `probe_busy_timeout_probability`; three in a row restart the pod.
    """
    config = plan.config
    rng = random.Random(f"kubelet-{config.seed}")
    fleet = FleetState(plan)
    failures = [0] * config.servers
    now = 0.0
    while now < config.duration:
        fleet.advance(now)
        for server in range(config.servers):
            if fleet.loading(server, now):
                failures[server] = 0  # the startup probe holds liveness off while loading
                continue
            timed_out = (
                fleet.busy(server, now) and rng.random() < config.probe_busy_timeout_probability
            )
            failures[server] = failures[server] + 1 if timed_out else 0
            if failures[server] >= config.probe_failure_threshold:
                failures[server] = 0
                fleet.restart(server, now)
        now += config.probe_period
    return fleet.tally("kubelet /health probe")


def canary_on_idle(plan: FleetPlan) -> WayTally:
    """A Dynamo-style canary: a test request to each worker whose running gauge reads 0.

    A worker that froze while idle still reads 0, looks idle, gets the canary, fails it and is
    restarted (`failureThreshold` 1), a hang and a weight sync alike (ai-dynamo/dynamo#14703).
    A worker that froze while busy keeps its running gauge above 0, never looks idle and is
    never checked.
    """
    config = plan.config
    fleet = FleetState(plan)
    failures = [0] * config.servers
    now = 0.0
    while now < config.duration:
        fleet.advance(now)
        for server in range(config.servers):
            if fleet.loading(server, now):
                continue
            hang = fleet.hang[server]
            silence = fleet.silent(server, now)
            if hang is not None:
                reads_idle = not hang.running_at_hang
            elif silence is not None:  # frozen gauges: what they read when it began
                reads_idle = not silence.running_at_start
            else:
                reads_idle = not plan.busy(server, now)
            if not reads_idle:
                continue
            frozen = hang is not None or silence is not None  # the canary gets no answer
            failures[server] = failures[server] + 1 if frozen else 0
            if failures[server] >= config.canary_failure_threshold:
                failures[server] = 0
                fleet.restart(server, now)
        now += config.canary_period
    return fleet.tally("canary on idle (Dynamo-style)")
