"""The replayed day's settings: the server, the traffic, and both ways of watching it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stallwatch.common.exporter_config import DEFAULT_TEST_REQUEST_MIN_INTERVAL_SECONDS
from stallwatch.common.restart_limits import DEFAULT_RESTART_AFTER

# Which of the day's weight syncs the trainer takes a hold before.
SyncHolds = Literal["always", "never", "alternate"]


@dataclass(frozen=True)
class ReplayConfig:
    """The server, the traffic, and both ways of watching it. Times in seconds."""

    seed: int = 1
    hours: float = 24.0
    load: float = 1.0  # batch intensity: 1.0 = two to four long requests, most of the day
    # The server: ~8 tokens/s for one request, decode speed shared by the running requests.
    tokens_per_second: float = 8.0
    prefill_tokens_per_second: float = 1500.0
    max_num_seqs: int = 4
    restart_load_seconds: float = 360.0  # ~19 GB of weights to load
    tokens_per_step: int = 8
    # The traffic.
    batch_busy_fraction: float = 0.5
    batch_prompt_tokens: tuple[int, int] = (1500, 3000)
    batch_max_tokens: tuple[int, int] = (1500, 3000)
    batch_retry_seconds: float = 30.0
    interactive_per_hour: float = 20.0
    interactive_prompt_tokens: tuple[int, int] = (100, 800)
    interactive_max_tokens: tuple[int, int] = (50, 400)
    hangs_per_day: float = 3.0
    min_hang_spacing_seconds: float = 2700.0
    # Legitimate silences: the engine freezes with work present and goes on by itself.
    # JIT compiles of a prompt shape (its prompt length in `compile_shape_tokens` buckets) the
    # server has not seen: each new shape compiles with this probability (the kernel cache is
    # on disk, so a restart forgets no shape); and shapes the traffic model does not draw
    # (sampling settings, batch mixes), this many an hour, whenever work is present.
    legitimate_silences: bool = True
    compile_probability: float = 0.25
    compile_shape_tokens: int = 128
    compiles_per_hour: float = 0.25
    compile_seconds: tuple[float, float] = (30.0, 70.0)
    # An RL trainer pushing weights into the serving engine, on a schedule; before the syncs
    # `weight_sync_holds` says, it holds the target for `weight_sync_hold_seconds` and releases
    # the hold when the sync ends.
    weight_sync_every_hours: float = 6.0
    weight_sync_seconds: tuple[float, float] = (120.0, 300.0)
    weight_sync_holds: SyncHolds = "alternate"
    weight_sync_hold_seconds: float = 600.0
    # Kernel autotune and CUDA-graph capture on every start after a restart. vLLM opens its
    # port only once they are done (`start_autotune_port_open` False: the read is `down`, never
    # restarted); True models a server that answers /metrics meanwhile with frozen counters.
    start_autotune_seconds: tuple[float, float] = (206.0, 363.0)
    start_autotune_port_open: bool = False
    # Degraded periods (slow, not stuck): this many a day, inside batch phases, cycling through
    # a throughput cut, admission stopped (with the same cut) and a KV cache far too small.
    degraded_per_day: float = 3.0
    degraded_seconds: tuple[float, float] = (1800.0, 3600.0)
    degraded_factor: float = 0.2
    degraded_kv_fraction: float = 0.008
    # The old way.
    chat_check_interval: float = 300.0
    chat_check_timeout: float = 45.0
    chat_check_failures: int = 5
    check_max_tokens: int = 32
    timer_intervals: tuple[float, ...] = (300.0, 600.0, 900.0, 1800.0)
    timer_check_timeout: float = 60.0
    timer_check_failures: int = 3
    busy_flag_set: bool = False  # the batch job never sets it
    error_check_interval: float = 60.0
    error_window: float = 600.0
    error_pressure: float = 20.0  # restart after ceil(pressure / errors) checks with errors
    # The new way.
    exporter_interval: float = 15.0
    test_request_timeout: float = 10.0
    test_request_min_interval: float = DEFAULT_TEST_REQUEST_MIN_INTERVAL_SECONDS
    scrape_interval: float = 15.0
    evaluation_interval: float = 15.0
    group_wait: float = 5.0
    group_interval: float = 60.0
    repeat_interval: float = 3600.0
    confirm_gap: float = 5.0
    cooldown: float = 600.0
    budget_max_restarts: int = 3
    budget_window: float = 3600.0
    action_seconds: float = 2.0
    # The restarter's restart window (0: the old two-poll rule, act at the first confirmation).
    restart_after: float = DEFAULT_RESTART_AFTER
    # Whether the restart alerts carry the hold clause (`restart_alerts(..., held=...)`); the
    # restarter's own `on_hold` check holds either way.
    rules_hold_clause: bool = True
    # How often a restarter looks at the alerts that wait for a hold to end (RELEASE_CHECK_SECONDS).
    release_check_seconds: float = 1.0

    @property
    def duration(self) -> float:
        return self.hours * 3600.0
