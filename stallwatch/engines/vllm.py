"""vLLM V1 (0.9 to 0.33): the families the decision reads and the endpoints stallwatch may call."""

from __future__ import annotations

from stallwatch.engines.profile import (
    OPENAI_TEST_PATHS,
    Endpoint,
    EngineProfile,
    FaultStatus,
    Series,
    series,
)

PROFILE = EngineProfile(
    kind="vllm",
    title="vLLM",
    series=series(
        {
            "vllm:num_requests_running": Series("running"),
            "vllm:num_requests_waiting": Series("waiting"),
            "vllm:kv_cache_usage_perc": Series("kv_cache_usage"),
            "vllm:engine_sleep_state": Series(
                "awake", label="sleep_state", values=frozenset({"awake"})
            ),
            "vllm:iteration_tokens_total_count": Series("steps"),
            "vllm:generation_tokens_total": Series("generation_tokens"),
            "vllm:prompt_tokens_total": Series("prompt_tokens"),
            "vllm:request_success_total": Series("requests_completed", summed=True),
            "vllm:num_preemptions_total": Series("preemptions"),
            "vllm:request_queue_time_seconds_sum": Series("queue_time_sum"),
            "vllm:request_queue_time_seconds_count": Series("queue_time_count"),
        }
    ),
    # vLLM V1 counts a request's prompt tokens on the step that ends its prefill.
    admission_evidence=("prompt_tokens", "requests_completed"),
    throughput_role="generation_tokens",
    engine_labels=("engine",),
    stall_evidence=("steps", "generation_tokens"),
    test_paths=OPENAI_TEST_PATHS,
    # vllm/entrypoints/openai/protocol.py (0.32, 0.33): `ModelCard.owned_by = "vllm"`.
    owned_by=frozenset({"vllm"}),
    safe_endpoints=(
        Endpoint("GET", "/metrics", "read-only; no engine involvement"),
        Endpoint("GET", "/v1/models", "API server only"),
        Endpoint("GET", "/health", "API server and engine-alive flag; runs no generation"),
        Endpoint("GET", "/version", "API server only"),
        Endpoint(
            "GET",
            "/fault_tolerance/status",
            "with --enable-fault-tolerance: the API server's cached status of each engine",
        ),
        Endpoint("POST", "/v1/completions", "the idle test request only (max_tokens 1)"),
    ),
    unsafe_endpoints=(
        Endpoint("POST", "/sleep", "puts the engine to sleep"),
        Endpoint("POST", "/pause", "dev mode: freezes or aborts requests"),
        Endpoint("POST", "/fault_tolerance/apply", "starts a recovery of a faulted engine"),
    ),
    # vllm 0.33 entrypoints/serve/fault_tolerance/api_router.py and v1/engine/core_client.py:
    # with --enable-fault-tolerance, GET /fault_tolerance/status answers from the API server's
    # cache (`engines: [{id, status: healthy|unhealthy|dead, fault_info}]`); an unhealthy
    # engine has aborted its requests and waits up to engine_recovery_timeout_sec (120 s) for
    # its orchestrator's `retry`, then the engine core exits.
    fault_status=FaultStatus("/fault_tolerance/status"),
    flat_while_legit=(
        "a long chunked prefill with prefix-cache hits or tiny chunks (KV usage may not move); "
        "a dev-mode pause with mode=keep"
    ),
    restart_signal="process_start_time_seconds changed; else any counter went down",
)
