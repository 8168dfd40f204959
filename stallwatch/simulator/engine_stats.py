"""What one engine core exports: its gauges, counters and histograms, keyed by vLLM metric
family name, and vLLM's bucket rule for the token-count histograms."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# vLLM sizes these token-count histograms with build_1_2_5_buckets(max_model_len).
MODEL_LEN_BUCKET_FAMILIES = frozenset(
    {
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:request_max_num_generation_tokens",
        "vllm:request_params_max_tokens",
        "vllm:request_prefill_kv_computed_tokens",
    }
)


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to and including max_value (vLLM's bucket rule)."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(buckets)
            buckets.append(float(value))
        exponent += 1


@dataclass
class Histogram:
    """Cumulative histogram with fixed upper bounds (+Inf implied)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.bounds, value)
        if index < len(self.bounds):
            self.counts[index] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[int]:
        """Counts per bound, cumulative, without the +Inf bucket (that one is `count`)."""
        result: list[int] = []
        running = 0
        for count in self.counts:
            running += count
            result.append(running)
        return result


@dataclass
class EngineStats:
    """Everything the engine exports; plain numbers keyed by metric family name."""

    created: float
    gauges: dict[str, float | None]
    counters: dict[str, float]
    labelled_counters: dict[str, dict[str, float]]
    histograms: dict[str, Histogram]


def _histogram_bounds(
    families: list[dict[str, object]], max_model_len: int
) -> dict[str, tuple[float, ...]]:
    bounds: dict[str, tuple[float, ...]] = {}
    for family in families:
        name = str(family["name"])
        if family["type"] != "histogram":
            continue
        if name in MODEL_LEN_BUCKET_FAMILIES:
            bounds[name] = build_1_2_5_buckets(max_model_len)
        else:
            buckets = family["buckets"]
            assert isinstance(buckets, list)
            bounds[name] = tuple(float(b) for b in buckets)
    return bounds


def zeroed_stats(families: list[dict[str, object]], max_model_len: int, now: float) -> EngineStats:
    """A new engine's stats: idle gauges, every counter of `families` at zero, empty histograms."""
    stats = EngineStats(
        created=now,
        gauges={
            "vllm:num_requests_running": 0.0,
            "vllm:num_requests_waiting": 0.0,
            "vllm:kv_cache_usage_perc": 0.0,
        },
        counters={},
        labelled_counters={},
        histograms={
            name: Histogram(bounds)
            for name, bounds in _histogram_bounds(families, max_model_len).items()
        },
    )
    for family in families:
        name = str(family["name"])
        if family["type"] != "counter":
            continue
        if family["extra_label"]:
            values = family["extra_values"]
            assert isinstance(values, list)
            stats.labelled_counters[name] = {str(v): 0.0 for v in values}
        else:
            stats.counters[name] = 0.0
    return stats
