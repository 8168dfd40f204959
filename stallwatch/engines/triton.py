"""Triton Inference Server with the TensorRT-LLM backend: the per-iteration counter.

Read in triton-inference-server/tensorrtllm_backend
`inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc`: gauges fed from
the executor's iteration stats, among them `nv_trt_llm_general_metrics{general_type=
"iteration_counter"}`, the engine's iteration number. Metrics are on Triton's metrics port
(8002 by default); Triton has no OpenAI endpoint, so no idle test request is sent.
"""

from __future__ import annotations

from types import MappingProxyType

from stallwatch.engines.profile import (
    ADMISSION_STALLED,
    PREEMPTION_STORM,
    QUEUE_TIME,
    Endpoint,
    EngineProfile,
    Series,
    series,
)

PROFILE = EngineProfile(
    kind="triton",
    title="Triton + TensorRT-LLM backend",
    series=series(
        {
            "nv_trt_llm_request_metrics": (
                Series("running", label="request_type", values=frozenset({"active"})),
                Series("waiting", label="request_type", values=frozenset({"waiting"})),
            ),
            "nv_trt_llm_general_metrics": Series(
                "steps", label="general_type", values=frozenset({"iteration_counter"})
            ),
            "nv_inference_request_success": Series("requests_completed"),
        }
    ),
    signature=frozenset({"nv_trt_llm_request_metrics", "nv_trt_llm_general_metrics"}),
    model_label="model",
    engine_labels=("version",),
    stall_evidence=("steps",),
    safe_endpoints=(
        Endpoint("GET", "/metrics", "metrics port (8002): read-only"),
        Endpoint("GET", "/v2/health/live", "server state only"),
        Endpoint("GET", "/v2/health/ready", "server state only"),
    ),
    unsafe_endpoints=(
        Endpoint("POST", "/v2/models/{model}/generate", "a generation: never sent by stallwatch"),
    ),
    flat_while_legit=(
        "one iteration longer than the interval; whether stats come while idle is unverified"
    ),
    restart_signal="a counter went down (the iteration counter starts again)",
    throughput_role="steps",
    degraded_unjudged=MappingProxyType(
        {
            ADMISSION_STALLED: (
                "no prompt-token counter is read, and completions alone cannot tell a queue "
                "behind long generations from one that is never admitted"
            ),
            PREEMPTION_STORM: "no preemption counter or KV usage is read",
            QUEUE_TIME: "no queue-time histogram is read",
        }
    ),
)
