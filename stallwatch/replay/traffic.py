"""The day's traffic: drawn once from the seed, then replayed identically for both ways."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass

from stallwatch.replay.clock import Scheduler
from stallwatch.replay.config import ReplayConfig
from stallwatch.replay.server import SimulatedServer
from stallwatch.replay.silences import NO_SILENCES, SilencePlan, WeightSync


@dataclass(frozen=True)
class TrafficPlan:
    batch_phases: tuple[tuple[float, float, int], ...]  # (start, end, concurrency)
    interactive: tuple[tuple[float, int, int], ...]  # (arrival, prompt tokens, max tokens)
    hang_times: tuple[float, ...]
    batch_sizes: tuple[tuple[int, int], ...]  # (prompt, max tokens), taken in order


def plan_traffic(config: ReplayConfig) -> TrafficPlan:
    """The day's batch phases, interactive arrivals and hang times, from `config.seed`."""
    rng = random.Random(f"stallwatch-replay-{config.seed}")
    end = config.duration
    phases: list[tuple[float, float, int]] = []
    busy = min(0.95, config.batch_busy_fraction * config.load)
    if busy > 0:
        t = rng.uniform(0, 1800)
        while t < end:
            length = rng.uniform(1800, 7200)
            base = rng.choice((2, 3, 4))
            concurrency = min(config.max_num_seqs, max(1, round(base * config.load)))
            phases.append((t, min(end, t + length), concurrency))
            mean_gap = length * (1 - busy) / busy
            t += length + rng.uniform(0.5, 1.5) * mean_gap
    interactive: list[tuple[float, int, int]] = []
    if config.interactive_per_hour > 0:
        t = rng.expovariate(config.interactive_per_hour / 3600.0)
        while t < end:
            interactive.append(
                (
                    t,
                    rng.randint(*config.interactive_prompt_tokens),
                    rng.randint(*config.interactive_max_tokens),
                )
            )
            t += rng.expovariate(config.interactive_per_hour / 3600.0)
    hangs: list[float] = []
    count = max(1, round(config.hangs_per_day * config.hours / 24.0))
    earliest, latest = 1800.0, end - 1800.0
    for _ in range(200):
        if len(hangs) == count or latest <= earliest:
            break
        candidate = rng.uniform(earliest, latest)
        if all(abs(candidate - other) >= config.min_hang_spacing_seconds for other in hangs):
            hangs.append(candidate)
    sizes = tuple(
        (rng.randint(*config.batch_prompt_tokens), rng.randint(*config.batch_max_tokens))
        for _ in range(4096)
    )
    return TrafficPlan(tuple(phases), tuple(interactive), tuple(sorted(hangs)), sizes)


class Traffic:
    """The batch job (keeps N long requests in flight in each phase), interactive users, the
    hangs, and the planned silences: compiles of unseen shapes and the trainer's weight syncs."""

    def __init__(
        self,
        plan: TrafficPlan,
        server: SimulatedServer,
        scheduler: Scheduler,
        silences: SilencePlan = NO_SILENCES,
    ) -> None:
        self.plan = plan
        self.silences = silences
        self.server = server
        self.scheduler = scheduler
        self._sizes = itertools.cycle(plan.batch_sizes)

    def start(self) -> None:
        for start, end, concurrency in self.plan.batch_phases:
            for _ in range(concurrency):
                self.scheduler.at(start, self._batch_worker(end))
        for arrival, prompt, max_tokens in self.plan.interactive:
            self.scheduler.at(arrival, self._interactive(prompt, max_tokens))
        for when in self.plan.hang_times:
            self.scheduler.at(when, self._hang)
        for when, seconds in self.silences.compile_times:
            self.scheduler.at(when, self._compile(seconds))
        for sync in self.silences.weight_syncs:
            self.scheduler.at(sync.at, self._weight_sync(sync))

    def _compile(self, seconds: float) -> Callable[[float], None]:
        def compile_now(now: float) -> None:
            # A shape the traffic model does not draw: it compiles only if work is present.
            if self.server.is_busy(now):
                self.server.fall_silent(now, seconds, "compile")

        return compile_now

    def _weight_sync(self, sync: WeightSync) -> Callable[[float], None]:
        def push_weights(now: float) -> None:
            self.server.weight_sync(now, sync.seconds, sync.held)

        return push_weights

    def _batch_worker(self, phase_end: float) -> Callable[[float], None]:
        def send(now: float) -> None:
            if now >= phase_end:
                return
            if not self.server.is_up(now):  # the job waits for the server to come back
                self.scheduler.at(self.server.up_at + self.server.config.batch_retry_seconds, send)
                return
            prompt, max_tokens = next(self._sizes)
            self.server.submit("batch", prompt, max_tokens, now, done)

        def done(now: float, status: int) -> None:
            if status == 200:
                self.scheduler.at(now, send)
            else:
                self.scheduler.at(now + self.server.config.batch_retry_seconds, send)

        return send

    def _interactive(self, prompt: int, max_tokens: int) -> Callable[[float], None]:
        def send(now: float) -> None:
            self.server.submit("interactive", prompt, max_tokens, now, lambda _t, _s: None)

        return send

    def _hang(self, now: float) -> None:
        # A hang strikes a running process; if the server is loading or already hung, it
        # strikes the next process once that one is up.
        # It waits out a legitimate silence, so every restart is either of a hang or of one.
        if self.server.is_up(now) and not self.server.frozen:
            self.server.hang(now)
        else:
            self.scheduler.at(max(now + 60.0, self.server.up_at + 60.0), self._hang)
