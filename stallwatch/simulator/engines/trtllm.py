"""TensorRT-LLM `trtllm-serve` (PyTorch backend) and Triton with the TRT-LLM backend.

trtllm-serve (tensorrt_llm/metrics/collector.py, serve/openai_server.py): `/prometheus/metrics`
is multiprocess (no `process_*`; gauges carry a `pid` label); every family, the running and
waiting gauges included, moves only when a request completes (the iteration-stats task is woken
by a completion), so a long generation and a hung engine look the same. `/metrics` is a
destructive JSON read of the same stats queue; `/health` reads a flag; `/health_generate` runs
a generation.

Triton (`:8002/metrics`, here on the server's port; custom_metrics_reporter.cc): per-request
`nv_inference_*` counters, and gauges from the executor's iteration stats, among them
`nv_trt_llm_general_metrics{general_type="iteration_counter"}`, the engine's iteration number,
updated at every iteration. `/v2/health/live` and `/v2/health/ready` are state checks.
"""

from __future__ import annotations

import os
from typing import Any

from aiohttp import web

from stallwatch.simulator.api import RequestFailed
from stallwatch.simulator.engine import BLOCK_SIZE, StepRecord
from stallwatch.simulator.engines.base import (
    PROMETHEUS_CONTENT_TYPE,
    FamilyDump,
    Flavour,
    MetricsResponse,
    Series,
    plain_number,
    prometheus_client_text,
)

TRTLLM_LABELS = {"model_name": "undefined", "engine_type": "undefined"}
TRTLLM_COUNTERS = (
    ("trtllm_prompt_tokens", "Cumulative number of prompt (input) tokens processed."),
    ("trtllm_generation_tokens", "Cumulative number of generation (output) tokens produced."),
    ("trtllm_num_requests_completed", "Total number of completed requests across iterations"),
)
TRTLLM_SUCCESS = ("trtllm_request_success", "Count of successfully processed requests.")
TRTLLM_GAUGES = (
    ("trtllm_kv_cache_utilization", "KV cache utilization"),
    ("trtllm_num_requests_running", "Number of active requests"),
    ("trtllm_num_requests_waiting", "Number of queued requests"),
)


class TrtllmFlavour(Flavour):
    """A simulated `trtllm-serve` with `return_perf_metrics` and `enable_iter_perf_stats`."""

    name = "trtllm"
    metrics_path = "/prometheus/metrics"
    models_owner = "tensorrt_llm"  # tensorrt_llm/serve/openai_protocol.py ModelCard

    def reset(self, now: float) -> None:
        super().reset(now)
        self.counters = {name: 0.0 for name, _ in TRTLLM_COUNTERS}
        self.counters["trtllm_generation_tokens"] = float(self.server.config.initial_decodes)
        self.success: dict[str, float] = {}
        self.gauges = {name: 0.0 for name, _ in TRTLLM_GAUGES}  # the start-up stats
        self.pending_stats: list[dict[str, Any]] = []
        self.health_generations = 0

    def on_step(self, record: StepRecord) -> None:
        self.pending_stats.append(
            {"iter": len(self.pending_stats), "numActiveRequests": len(record.running)}
        )
        del self.pending_stats[:-1000]
        if not record.finished:
            return  # nothing is published until a request completes
        for request in record.finished:
            self.counters["trtllm_prompt_tokens"] += request.prompt_tokens
            self.counters["trtllm_generation_tokens"] += request.generated
            self.counters["trtllm_num_requests_completed"] += 1
            reason = request.finish_reason or "length"
            self.success[reason] = self.success.get(reason, 0.0) + 1
        used = sum(r.kv_tokens for r in record.running)
        self.gauges["trtllm_num_requests_running"] = float(len(record.running))
        self.gauges["trtllm_num_requests_waiting"] = float(record.waiting)
        self.gauges["trtllm_kv_cache_utilization"] = used / max(
            self.server.config.kv_cache_tokens, 1
        )

    def add_routes(self, router: web.UrlDispatcher) -> None:
        super().add_routes(router)
        router.add_get("/metrics", self.handle_json_metrics)
        router.add_get("/health", self.handle_health)
        router.add_get("/health_generate", self.handle_health_generate)

    def render(self) -> MetricsResponse:
        gauge_labels = {**TRTLLM_LABELS, "pid": str(os.getpid())}
        families = [
            FamilyDump(name, "counter", help_text, [Series(TRTLLM_LABELS, self.counters[name])])
            for name, help_text in TRTLLM_COUNTERS
        ]
        success = [
            Series({**TRTLLM_LABELS, "finished_reason": reason}, value)
            for reason, value in sorted(self.success.items())
        ]
        success_name, success_help = TRTLLM_SUCCESS
        families.append(FamilyDump(success_name, "counter", success_help, success))
        families.extend(
            FamilyDump(name, "gauge", help_text, [Series(gauge_labels, self.gauges[name])])
            for name, help_text in TRTLLM_GAUGES
        )
        return MetricsResponse(prometheus_client_text(families), PROMETHEUS_CONTENT_TYPE)

    async def handle_json_metrics(self, request: web.Request) -> web.Response:
        """The legacy endpoint: drains the iteration stats it returns."""
        drained, self.pending_stats = self.pending_stats, []
        return web.json_response(drained)

    async def handle_health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.unavailable() else 200)

    async def handle_health_generate(self, request: web.Request) -> web.Response:
        if self.unavailable():
            return web.Response(status=503)
        self.health_generations += 1
        try:
            await self.server.generate(1, 1, False, None)
        except RequestFailed:
            return web.Response(status=503)
        return web.Response(status=200)

    def stats(self) -> dict[str, Any]:
        return {"health_generations": self.health_generations}


TRITON_LABELS = {"model": "tensorrt_llm", "version": "1"}
TRITON_COUNTERS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)"),
    (
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
    ),
)
TRITON_PENDING = (
    "nv_inference_pending_request_count",
    "Instantaneous number of pending requests awaiting execution per-model.",
)
# family, HELP, category label, category values (custom_metrics_reporter.cc)
TRITON_GROUPS = (
    (
        "nv_trt_llm_request_metrics",
        "TRT LLM request metrics",
        "request_type",
        ("active", "max", "scheduled", "context"),
    ),
    (
        "nv_trt_llm_kv_cache_block_metrics",
        "TRT LLM KV cache block metrics",
        "kv_cache_block_type",
        ("max", "free", "used", "tokens_per"),
    ),
    (
        "nv_trt_llm_general_metrics",
        "General TRT LLM metrics",
        "general_type",
        ("timestamp", "iteration_counter"),
    ),
)


class TritonFlavour(Flavour):
    """A simulated Triton Inference Server serving the `tensorrt_llm` model (inflight batcher)."""

    name = "triton"
    serves_models = False  # the metrics port (8002) serves only /metrics

    def reset(self, now: float) -> None:
        super().reset(now)
        self.counters = {name: 0.0 for name, _ in TRITON_COUNTERS}
        blocks = self.server.config.kv_cache_tokens // BLOCK_SIZE
        self.groups: dict[str, dict[str, float]] = {
            "nv_trt_llm_request_metrics": {
                "active": 0.0,
                "max": float(self.server.config.max_num_seqs),
                "scheduled": 0.0,
                "context": 0.0,
            },
            "nv_trt_llm_kv_cache_block_metrics": {
                "max": float(blocks),
                "free": float(blocks),
                "used": 0.0,
                "tokens_per": float(BLOCK_SIZE),
            },
            "nv_trt_llm_general_metrics": {
                "timestamp": float(int(now)),
                "iteration_counter": float(self.server.config.initial_decodes),
            },
        }

    def on_step(self, record: StepRecord) -> None:
        blocks = self.groups["nv_trt_llm_kv_cache_block_metrics"]
        used = sum(-(-r.kv_tokens // BLOCK_SIZE) for r in record.running)
        blocks["used"] = float(used)
        blocks["free"] = blocks["max"] - used
        requests = self.groups["nv_trt_llm_request_metrics"]
        requests["active"] = float(len(record.running))
        requests["scheduled"] = float(len(record.running) + len(record.finished))
        requests["context"] = float(sum(1 for r in record.running if r.prefilling))
        general = self.groups["nv_trt_llm_general_metrics"]
        general["iteration_counter"] += 1
        general["timestamp"] = float(int(record.end))
        for _ in record.finished:
            for name in ("nv_inference_request_success", "nv_inference_count"):
                self.counters[name] += 1
            self.counters["nv_inference_exec_count"] += 1

    def add_routes(self, router: web.UrlDispatcher) -> None:
        super().add_routes(router)
        router.add_get("/v2/health/live", self.handle_live)
        router.add_get("/v2/health/ready", self.handle_live)

    def render(self) -> MetricsResponse:
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
            lines.extend(f"{name}{{{labels}}} {plain_number(value)}\n" for labels, value in samples)

        def labels(**extra: str) -> str:
            pairs = sorted({**TRITON_LABELS, **extra}.items())  # prometheus-cpp sorts them
            return ",".join(f'{key}="{value}"' for key, value in pairs)

        for name, help_text in TRITON_COUNTERS:
            family(name, "counter", help_text, [(labels(), self.counters[name])])
        pending_name, pending_help = TRITON_PENDING
        family(pending_name, "gauge", pending_help, [(labels(), float(self.waiting()))])
        for name, help_text, category, values in TRITON_GROUPS:
            samples = [
                (labels(**{category: value}), self.groups[name][value])
                for value in reversed(values)
            ]
            family(name, "gauge", help_text, samples)
        return MetricsResponse("".join(lines), "text/plain; charset=utf-8")

    async def handle_live(self, request: web.Request) -> web.Response:
        return web.Response(status=400 if self.unavailable() else 200)
