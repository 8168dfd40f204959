"""TensorRT-LLM `trtllm-serve` (PyTorch backend): counters that move only when a request ends.

Read in NVIDIA/TensorRT-LLM `tensorrt_llm/metrics/collector.py` and `serve/openai_server.py`:
the iteration stats behind every gauge are drained only when a request completes, the
per-request counters move at completion, and `/prometheus/metrics` is multiprocess (no start
time). Metrics alone cannot tell a long request from a stuck one: never `stalled`. Nor can they
prove it idle: a server that goes from idle to busy keeps its gauges at 0 until the first of its
new requests completes, so no test request is ever sent on them.
"""

from __future__ import annotations

from types import MappingProxyType

from stallwatch.engines.profile import (
    ADMISSION_STALLED,
    OPENAI_TEST_PATHS,
    PREEMPTION_STORM,
    QUEUE_TIME,
    THROUGHPUT_COLLAPSE,
    Endpoint,
    EngineProfile,
    Series,
    series,
)

_AT_COMPLETION = (
    "trtllm-serve's counters and gauges move only when a request completes: a rate between "
    "two reads says nothing about the requests still running"
)

PROFILE = EngineProfile(
    kind="trtllm",
    title="TensorRT-LLM (trtllm-serve)",
    series=series(
        {
            "trtllm_num_requests_running": Series("running"),
            "trtllm_num_requests_waiting": Series("waiting"),
            "trtllm_generation_tokens_total": Series("generation_tokens"),
            "trtllm_prompt_tokens_total": Series("prompt_tokens"),
            "trtllm_request_success_total": Series("requests_completed", summed=True),
        }
    ),
    metrics_path="/prometheus/metrics",
    stall_evidence=("requests_completed",),
    stall_unprovable=(
        "trtllm-serve's counters and gauges move only when a request completes: its metrics "
        "cannot tell a long request from a stuck one (read Triton's iteration counter instead)"
    ),
    idle_unprovable=(
        "trtllm-serve's work gauges lag its work: they are drained from the iteration stats only "
        "when a request completes, so 0 running and 0 waiting with nothing moved can be a busy "
        "server; idle is unprovable from its metrics"
    ),
    counters_vanish_on_restart=True,
    test_paths=OPENAI_TEST_PATHS,
    # tensorrt_llm/serve/openai_protocol.py (0076e93): `ModelCard.owned_by = "tensorrt_llm"`;
    # openai_server.py (0005772) `get_model` lists `ModelCard(id=self.model)`, with no auth.
    owned_by=frozenset({"tensorrt_llm"}),
    safe_endpoints=(
        Endpoint("GET", "/prometheus/metrics", "read-only (needs return_perf_metrics)"),
        Endpoint("GET", "/health", "an executor-state flag"),
        Endpoint("GET", "/v1/models", "API server only"),
        Endpoint("POST", "/v1/completions", "the idle test request only (max_tokens 1)"),
    ),
    unsafe_endpoints=(
        Endpoint("GET", "/metrics", "a destructive JSON read of the iteration-stats queue"),
        Endpoint("GET", "/health_generate", "runs a 1-token generation"),
    ),
    flat_while_legit="every request until it completes",
    restart_signal="a counter went down or vanished (multiprocess: no start time)",
    degraded_unjudged=MappingProxyType(
        {
            ADMISSION_STALLED: _AT_COMPLETION,
            THROUGHPUT_COLLAPSE: _AT_COMPLETION,
            PREEMPTION_STORM: "trtllm-serve publishes no preemption counter",
            QUEUE_TIME: "trtllm-serve's queue time is not read",
        }
    ),
)
