"""LMDeploy (0.14 to 0.18, `--enable-metrics`): gauges refreshed every 10 s, no per-forward counter.

Read in `lmdeploy/metrics/loggers.py`, `stats.py` and `serve/openai/api_server.py` of 0.18.0:
the scheduler gauges are set every 10 s; `prompt_tokens_total` moves when a request's first
token arrives and `generation_tokens_total` per output, so no counter moves during a prefill.
"""

from __future__ import annotations

from types import MappingProxyType

from stallwatch.engines.profile import (
    OPENAI_TEST_PATHS,
    PREEMPTION_STORM,
    QUEUE_TIME,
    Endpoint,
    EngineProfile,
    Series,
    SleepCheck,
    series,
)

PROFILE = EngineProfile(
    kind="lmdeploy",
    title="LMDeploy",
    series=series(
        {
            "lmdeploy:num_requests_running": Series("running"),
            "lmdeploy:num_requests_waiting": Series("waiting", summed=True),
            "lmdeploy:num_api_requests_waiting": Series("waiting", summed=True),
            "lmdeploy:gpu_cache_usage_perc": Series("kv_cache_usage"),
            "lmdeploy:generation_tokens_total": Series("generation_tokens"),
            "lmdeploy:prompt_tokens_total": Series("prompt_tokens"),
            "lmdeploy:request_success_total": Series("requests_completed", summed=True),
        }
    ),
    engine_labels=("engine",),
    stall_evidence=("generation_tokens",),
    stall_unprovable=(
        "LMDeploy moves no counter during a whole prefill and refreshes its work gauges every "
        "10 s: its metrics cannot tell a long prefill from a stall (its own /health checks the "
        "scheduler tick)"
    ),
    work_gauge_lag_seconds=10.0,
    work_gauge_lag="LMDeploy's work gauges are refreshed every 10 s",
    test_paths=OPENAI_TEST_PATHS,
    # lmdeploy/serve/openai/protocol.py (0.18.0): `ModelCard.owned_by = 'lmdeploy'`.
    owned_by=frozenset({"lmdeploy"}),
    sleep_check=SleepCheck("/health", "status", equals="sleeping"),
    safe_endpoints=(
        Endpoint("GET", "/metrics", "read-only"),
        Endpoint("GET", "/health", "a cached monitor snapshot; at most one bounded probe inline"),
        Endpoint("GET", "/v1/models", "API server only"),
        Endpoint("POST", "/v1/completions", "the idle test request only (max_tokens 1)"),
    ),
    unsafe_endpoints=(),
    flat_while_legit="a whole prefill (no counter moves until the first token)",
    restart_signal="process_start_time_seconds changed; else a counter went down",
    # Prompt tokens move with a request's first token; the gauges' 10 s lag is far below the
    # degradation windows.
    admission_evidence=("prompt_tokens", "requests_completed"),
    throughput_role="generation_tokens",
    degraded_unjudged=MappingProxyType(
        {
            PREEMPTION_STORM: "LMDeploy publishes KV usage but no preemption counter",
            QUEUE_TIME: "LMDeploy publishes no queue-time histogram",
        }
    ),
)
