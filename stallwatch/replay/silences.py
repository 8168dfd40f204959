"""Legitimate silences: an engine that freezes with work present and goes on by itself.

Production has them, and a restart during one is a false restart:

- a JIT compile of kernels for a prompt shape the engine has not seen, mid-traffic: 30-70 s
  (ai-dynamo/dynamo#14735);
- an RL trainer's weight sync into the serving engine: minutes, on a schedule
  (ai-dynamo/dynamo#14703, which takes a bounded lease before pausing: here a hold);
- kernel autotune and CUDA-graph capture when the server starts: 206 s and 363 s
  (getainode/ainode#112), before vLLM opens its port.

The plan is drawn once from the seed, on its own random stream (the traffic plan is unchanged
by it), and is the same for every way of watching the server.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from stallwatch.replay.config import ReplayConfig

SilenceCause = Literal["compile", "weight_sync", "start_autotune"]


@dataclass(frozen=True)
class WeightSync:
    """One scheduled weight sync: when, how long, and whether the trainer holds the target."""

    at: float
    seconds: float
    held: bool


@dataclass(frozen=True)
class SilencePlan:
    """The day's legitimate silences, before any way of watching has acted.

    `compiles`: each prompt shape (bucket) that compiles when first seen, and for how long.
    `compile_times`: (time, seconds) of compiles of shapes the traffic model does not draw.
    `autotunes`: the autotune of each start after a restart, in order (cycled).
    """

    compiles: Mapping[int, float]
    compile_times: tuple[tuple[float, float], ...]
    weight_syncs: tuple[WeightSync, ...]
    autotunes: tuple[float, ...]

    def autotune(self, start: int) -> float:
        """The autotune of the `start`-th start after a restart (0 with no silences)."""
        return self.autotunes[start % len(self.autotunes)] if self.autotunes else 0.0


NO_SILENCES = SilencePlan(MappingProxyType({}), (), (), ())


def shape_of(prompt_tokens: int, config: ReplayConfig) -> int:
    """The prompt shape a request compiles for: its prompt length's bucket."""
    return prompt_tokens // max(1, config.compile_shape_tokens)


def _held(index: int, config: ReplayConfig) -> bool:
    if config.weight_sync_holds == "always":
        return True
    if config.weight_sync_holds == "never":
        return False
    return index % 2 == 0


def plan_silences(config: ReplayConfig) -> SilencePlan:
    """The day's legitimate silences, from `config.seed` (none without `legitimate_silences`)."""
    if not config.legitimate_silences:
        return NO_SILENCES
    rng = random.Random(f"stallwatch-replay-silences-{config.seed}")
    low = min(config.batch_prompt_tokens[0], config.interactive_prompt_tokens[0])
    high = max(config.batch_prompt_tokens[1], config.interactive_prompt_tokens[1])
    compiles = {}
    for shape in range(shape_of(low, config), shape_of(high, config) + 1):
        if rng.random() < config.compile_probability:
            compiles[shape] = rng.uniform(*config.compile_seconds)
    compile_times: list[tuple[float, float]] = []
    if config.compiles_per_hour > 0:
        t = rng.expovariate(config.compiles_per_hour / 3600.0)
        while t < config.duration:
            compile_times.append((t, rng.uniform(*config.compile_seconds)))
            t += rng.expovariate(config.compiles_per_hour / 3600.0)
    syncs: list[WeightSync] = []
    if config.weight_sync_every_hours > 0:
        every = config.weight_sync_every_hours * 3600.0
        t = rng.uniform(0.25, 0.75) * every
        while t < config.duration:
            syncs.append(
                WeightSync(t, rng.uniform(*config.weight_sync_seconds), _held(len(syncs), config))
            )
            t += every
    autotunes = tuple(rng.uniform(*config.start_autotune_seconds) for _ in range(64))
    return SilencePlan(MappingProxyType(compiles), tuple(compile_times), tuple(syncs), autotunes)


@dataclass(frozen=True)
class SilenceOutcome:
    """One legitimate silence under one way: when, why, how long it was to last, and whether a
    restart cut it short (a false restart: it would have ended by itself)."""

    started_at: float
    causes: tuple[SilenceCause, ...]
    seconds: float
    held: bool
    restarted_after: float | None  # None: it ended by itself
