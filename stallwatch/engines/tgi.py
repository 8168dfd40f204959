"""Hugging Face TGI v3: per-forward progress from the router's batch counters, no start time.

Read in huggingface/text-generation-inference `backends/v3/src/backend.rs` and `queue.rs`
(db931fc, after v3.3.7): `tgi_batch_inference_success{method}` gains one after every Prefill or
Decode call; metrics-rs prints counters without `_total` and a series appears at its first update.
`tgi_batch_inference_count` gains one before each call: while the first prefill of a batch runs,
`tgi_queue_size` has been reset and `tgi_batch_current_size` is not set yet, so the forward in
flight (count minus success minus failure) is the work the gauges do not show.
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
    Series,
    series,
)

PROFILE = EngineProfile(
    kind="tgi",
    title="TGI",
    series=series(
        {
            "tgi_batch_current_size": Series("running"),
            "tgi_queue_size": Series("waiting"),
            "tgi_batch_inference_success": Series("steps", summed=True),
            # Incremented before every Prefill or Decode call, success or failure after it
            # (backends/v3/src/backend.rs `prefill`, `decode`): the difference is the forward in
            # flight, which the gauges miss during a batch's first prefill.
            "tgi_batch_inference_count": Series("forwards_started", summed=True),
            "tgi_batch_inference_failure": Series("forwards_failed", summed=True),
            "tgi_request_success": Series("requests_completed"),
            "tgi_request_generated_tokens_sum": Series("generation_tokens"),
            "tgi_request_input_length_sum": Series("prompt_tokens"),
        }
    ),
    stall_evidence=("steps",),
    counters_vanish_on_restart=True,
    test_paths=OPENAI_TEST_PATHS,
    safe_endpoints=(
        Endpoint("GET", "/metrics", "router only"),
        Endpoint("GET", "/info", "router only"),
        Endpoint("GET", "/v1/models", "router only"),
        Endpoint("POST", "/v1/completions", "the idle test request only (max_tokens 1)"),
    ),
    unsafe_endpoints=(
        Endpoint(
            "GET",
            "/health",
            "waits for the shard (one forward); after an error runs a dummy prefill",
        ),
        Endpoint("GET", "/", "same handler as /health"),
        Endpoint("GET", "/ping", "same handler as /health"),
    ),
    flat_while_legit="one huge prefill the model cannot chunk (a single gRPC call)",
    restart_signal="a counter went down or vanished (no start time)",
    throughput_role="steps",
    degraded_unjudged=MappingProxyType(
        {
            ADMISSION_STALLED: (
                "TGI's token and request counters are request histograms, not shown to move "
                "when a queued request is admitted"
            ),
            PREEMPTION_STORM: "TGI publishes no preemption counter",
            QUEUE_TIME: "its queue-duration histogram is not read",
        }
    ),
)
