"""llama.cpp `llama-server --metrics` (b10434 and later): `n_decode_total` and a start header.

Read in `tools/server/server-context.cpp` and `server-task.cpp` (llama.cpp build 11434):
`n_decode_total` gains one per `llama_decode` (one `n_batch` chunk of a prompt, or one step of
generation); prompt and predicted token totals move only when a batch has output or a request
ends; every `/metrics` answer carries `Process-Start-Time-Unix`, monotonic microseconds (compare
for equality only); numbers are printed with 6 significant digits.
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

START_HEADER = "Process-Start-Time-Unix"

PROFILE = EngineProfile(
    kind="llamacpp",
    title="llama.cpp",
    series=series(
        {
            "llamacpp:requests_processing": Series("running"),
            "llamacpp:requests_deferred": Series("waiting"),
            "llamacpp:n_decode_total": Series("steps"),
            "llamacpp:tokens_predicted_total": Series("generation_tokens"),
            "llamacpp:prompt_tokens_total": Series("prompt_tokens"),
        }
    ),
    model_label="",
    stall_evidence=("steps",),
    significant_digits=6,
    # tools/server (b10434): every `/v1/models` card says `"owned_by": "llamacpp"`.
    owned_by=frozenset({"llamacpp"}),
    test_paths=OPENAI_TEST_PATHS | {"/completion"},
    sleep_check=SleepCheck("/props", "is_sleeping"),
    safe_endpoints=(
        Endpoint(
            "GET",
            "/metrics",
            "a METRICS task, answered during decode; resets the throughput gauges",
        ),
        Endpoint("GET", "/health", "HTTP thread only"),
        Endpoint("GET", "/props", "HTTP thread only; `is_sleeping` without waking the server"),
        Endpoint("GET", "/v1/models", "HTTP thread only"),
        Endpoint("POST", "/v1/completions", "the idle test request only (max_tokens 1)"),
    ),
    unsafe_endpoints=(
        Endpoint("GET", "/slots", "wakes a sleeping server; hangs with a wedged decode"),
        Endpoint("GET", "/metrics?model=", "router mode: loads the model unless autoload=false"),
    ),
    flat_while_legit=(
        "one llama_decode call (one n_batch chunk of a prompt) longer than the interval"
    ),
    restart_signal="the Process-Start-Time-Unix header changed; else a counter went down",
    # A deferred request takes a slot and its prompt is processed: prompt tokens move.
    admission_evidence=("prompt_tokens",),
    # `tokens_predicted_total` moves when a request ends; one generation step is one
    # llama_decode for every busy slot.
    throughput_role="steps",
    degraded_unjudged=MappingProxyType(
        {
            PREEMPTION_STORM: "llama-server neither preempts nor publishes KV usage",
            QUEUE_TIME: "llama-server publishes no queue time",
        }
    ),
)
