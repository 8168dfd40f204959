"""How a simulated server is configured: `SimConfig` mirrors `vllm serve` flags where they exist."""

from __future__ import annotations

from dataclasses import dataclass

from stallwatch.simulator.engine import EngineConfig


@dataclass(frozen=True)
class SimConfig:
    """How the simulated server is configured (mirrors `vllm serve` flags where they exist)."""

    model: str = "tiny"
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048
    tokens_per_second: float = 200.0
    prefill_tokens_per_second: float = 100_000.0
    max_model_len: int = 2048
    kv_cache_tokens: int = 1_048_576
    api_server_count: int = 1
    data_parallel_size: int = 1
    metrics_enabled: bool = True
    seed: int = 0
    tick_seconds: float = 0.005
    eos_probability: float = 0.0
    # Which server to look like: "vllm" (the default) or another of `simulator.engines.ENGINES`
    # (building the server refuses any other).
    engine: str = "vllm"
    # Where the engine's per-step counter starts (e.g. llama.cpp `n_decode_total`), to reproduce
    # a long-running server whose counters are printed at reduced precision.
    initial_decodes: int = 0
    # llama.cpp `--sleep-idle-seconds` (< 0: never sleeps).
    sleep_idle_seconds: float = -1.0
    # vLLM `--enable-fault-tolerance`: `/fault_tolerance/status`, and the `engine_fault` fault
    # holds the engine faulted (requests aborted, engine waiting) instead of killing it.
    fault_tolerance: bool = False

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            tokens_per_second=self.tokens_per_second,
            prefill_tokens_per_second=self.prefill_tokens_per_second,
            kv_cache_tokens=self.kv_cache_tokens,
            eos_probability=self.eos_probability,
            max_model_len=self.max_model_len,
        )
