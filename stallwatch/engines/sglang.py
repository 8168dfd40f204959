"""SGLang (0.5.10 to 0.5.23, `--enable-metrics`): per-forward progress and work gauges that lag.

Read in `sglang/srt/observability/metrics_collector.py` and
`scheduler_components/metrics_reporter.py` of 0.5.23: `cuda_graph_passes_total{mode}` gains
one per prefill batch (each chunk) and one per decode batch; the work gauges are set after every
prefill batch, every 40th decode step and, when idle, at most every 30 s; the registry is
multiprocess only (no `process_start_time_seconds`; a fresh directory per start).
"""

from __future__ import annotations

from types import MappingProxyType

from stallwatch.engines.profile import (
    ADMISSION_STALLED,
    OPENAI_TEST_PATHS,
    PREEMPTION_STORM,
    QUEUE_TIME,
    Endpoint,
    EngineProfile,
    InflightSeries,
    Series,
    series,
)

_DEGRADED_UNJUDGED = MappingProxyType(
    {
        ADMISSION_STALLED: (
            "SGLang counts prompt tokens and requests only when a request ends, and its work "
            "gauges lag by up to 40 steps: a queue behind long generations looks the same"
        ),
        PREEMPTION_STORM: (
            "retractions are read, but KV usage (`sglang:token_usage`) is not: a retraction "
            "rate alone is not judged"
        ),
        QUEUE_TIME: "its queue-time histogram is not read",
    }
)

# Endpoints whose in-flight requests are not generation work.
_NOT_WORK = frozenset(
    {
        "/metrics",
        "/health",
        "/health_generate",
        "/ping",
        "/ready",
        "/v1/models",
        "/model_info",
        "/get_model_info",
        "/server_info",
        "/get_server_info",
        "/v1/loads",
        "/get_load",
        "/version",
    }
)

PROFILE = EngineProfile(
    kind="sglang",
    title="SGLang",
    series=series(
        {
            "sglang:num_running_reqs": Series("running"),
            "sglang:num_queue_reqs": Series("waiting", summed=True),
            "sglang:num_grammar_queue_reqs": Series("waiting", summed=True),
            "sglang:cuda_graph_passes_total": Series("steps", summed=True),
            "sglang:realtime_tokens_total": Series("forward_tokens", summed=True),
            "sglang:generation_tokens_total": Series("generation_tokens", summed=True),
            "sglang:prompt_tokens_total": Series("prompt_tokens", summed=True),
            "sglang:num_requests_total": Series("requests_completed", summed=True),
            "sglang:num_retracted_requests_total": Series("preemptions", summed=True),
            "sglang:scheduler_idle_seconds_total": Series("idle_loop"),
        }
    ),
    engine_labels=("dp_rank",),
    # With priority scheduling every scheduler family has one series per priority beside its
    # total under `priority=""` (metrics_collector.py): summing them all counted twice.
    split_label="priority",
    stall_evidence=("steps",),
    work_gauge_lag_seconds=30.0,
    work_gauge_lag=(
        "SGLang's work gauges are refreshed every 40 decode steps and, once idle, only every 30 s"
    ),
    # scheduler_components/metrics_reporter.py: CPU and idle seconds flushed at most once a second.
    idle_loop_flush_seconds=1.0,
    counters_vanish_on_restart=True,
    # Before its own warm-up request has run, /metrics holds the startup and memory gauges and
    # zeroed scheduler counters, but no work gauge and no pass counter yet.
    loaded_when=("running", "waiting", "steps"),
    loading=(
        "still loading: /metrics holds only SGLang's startup series (no work gauge or pass "
        "counter before its own warm-up request)"
    ),
    inflight=InflightSeries("sglang:http_requests_active", "endpoint", _NOT_WORK),
    test_paths=OPENAI_TEST_PATHS,
    # sglang/srt/entrypoints/openai/protocol.py (0.5.23): `ModelCard.owned_by = "sglang"`.
    owned_by=frozenset({"sglang"}),
    safe_endpoints=(
        Endpoint("GET", "/metrics", "read-only (multiprocess registry)"),
        Endpoint("GET", "/ping", "flag only: 200 while the server status is Up"),
        Endpoint("GET", "/ready", "flag only; 503 while generation is paused"),
        Endpoint("GET", "/v1/models", "tokenizer manager only"),
        Endpoint("POST", "/v1/completions", "the idle test request only (max_tokens 1)"),
    ),
    unsafe_endpoints=(
        Endpoint(
            "GET",
            "/health",
            "runs a 1-token generation; on a stuck server 503 after 20 s, and /ready and /ping "
            "then answer 503 for everyone",
        ),
        Endpoint("GET", "/health_generate", "as /health"),
        Endpoint("GET", "/server_info", "an RPC to every scheduler: hangs while one is stuck"),
        Endpoint("GET", "/get_server_info", "as /server_info"),
    ),
    flat_while_legit="a single forward longer than the interval; /pause_generation",
    restart_signal="a counter went down or vanished (no start time: fresh multiprocess directory)",
    throughput_role="steps",
    degraded_unjudged=_DEGRADED_UNJUDGED,
)
