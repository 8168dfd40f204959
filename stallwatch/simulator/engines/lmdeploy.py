"""LMDeploy 0.18.0 (`api_server --enable-metrics`): its families, the cached `/health`, and its
traps.

What moves when (lmdeploy/metrics/loggers.py, serve/openai/api_server.py, serve/core/health.py):

- the schedule gauges (`num_requests_running`, `num_requests_waiting`, ...) and the cumulative
  `num_requests_succeeded` / `num_requests_failed` gauges are refreshed every 10 s;
- `prompt_tokens_total` moves when a request's first token arrives (the whole prompt at once),
  `generation_tokens_total` and `iteration_tokens_total` per output delivered to a request,
  `request_success_total{finished_reason}` at request end: nothing moves during a prefill;
- default registry: `process_start_time_seconds` is there, `_created` samples are disabled;
- `/health` is a cached snapshot: unhealthy (503) when requests are dispatched and the scheduler
  tick has not moved for 90 s; it never runs a generation.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from stallwatch.simulator.engine import StepRecord
from stallwatch.simulator.engine_stats import Histogram
from stallwatch.simulator.engines.base import (
    PROMETHEUS_CONTENT_TYPE,
    FamilyDump,
    Flavour,
    HistogramSeries,
    MetricsResponse,
    Series,
    prometheus_client_text,
)
from stallwatch.simulator.metrics import render_process_families

REFRESH_SECONDS = 10.0
UNHEALTHY_AFTER_SECONDS = 90.0
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

SCHEDULE_GAUGES = (
    ("lmdeploy:num_requests_succeeded", "Number of current succeeded requests."),
    ("lmdeploy:num_requests_failed", "Number of current failed requests."),
    ("lmdeploy:num_api_requests_routed", "Number of requests routed to request handles."),
    ("lmdeploy:num_api_requests_waiting", "Number of requests waiting for free request handles."),
    ("lmdeploy:num_requests_running", "Number of requests in model execution batches."),
    ("lmdeploy:num_requests_waiting", "Number of requests waiting to be processed."),
    ("lmdeploy:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage."),
    (
        "lmdeploy:prefix_cache_hit_rate",
        "Prefix-cache hit rate. 1 means 100 percent of queried prefix tokens hit.",
    ),
)
PROMPT_TOKENS = ("lmdeploy:prompt_tokens", "Number of prefill tokens processed.")
GENERATION_TOKENS = ("lmdeploy:generation_tokens", "Number of generation tokens processed.")
SUCCESS = ("lmdeploy:request_success", "Count of successfully processed requests.")
ITERATION_TOKENS = (
    "lmdeploy:iteration_tokens_total",
    "Histogram of number of tokens per engine_step.",
)


class LmdeployFlavour(Flavour):
    """A simulated `lmdeploy serve api_server --enable-metrics` (one engine, DP rank 0)."""

    name = "lmdeploy"
    models_owner = "lmdeploy"  # lmdeploy/serve/openai/protocol.py ModelCard

    def reset(self, now: float) -> None:
        super().reset(now)
        self.start_time = now
        self.gauges = {name: 0.0 for name, _ in SCHEDULE_GAUGES}
        self.prompt_tokens = 0.0
        self.generation_tokens = float(self.server.config.initial_decodes)
        self.success: dict[str, float] = {}
        self.iteration = Histogram(tuple(float(b) for b in ITERATION_BUCKETS))
        self.succeeded = 0
        self.last_refresh = now
        self.last_step = now
        self.health_calls = 0

    def on_step(self, record: StepRecord) -> None:
        self.last_step = record.end
        outputs = [r for r in (*record.running, *record.finished) if r.last_token_at == record.end]
        for request in outputs:
            first = request.generated == 1
            if first:
                self.prompt_tokens += request.prompt_tokens
            self.generation_tokens += 1
            self.iteration.observe((request.prompt_tokens if first else 0) + 1)
        for request in record.finished:
            reason = request.finish_reason or "length"
            self.success[reason] = self.success.get(reason, 0.0) + 1
            self.succeeded += 1

    def tick(self, now: float) -> None:
        if now - self.last_refresh < REFRESH_SECONDS:
            return
        self.last_refresh = now
        running = sum(len(engine.running) for engine in self.engines)
        used = sum(r.kv_tokens for engine in self.engines for r in engine.running)
        self.gauges.update(
            {
                "lmdeploy:num_requests_succeeded": float(self.succeeded),
                "lmdeploy:num_api_requests_routed": float(running + self.waiting()),
                "lmdeploy:num_requests_running": float(running),
                "lmdeploy:num_requests_waiting": float(self.waiting()),
                "lmdeploy:gpu_cache_usage_perc": used / max(self.server.config.kv_cache_tokens, 1),
            }
        )

    def add_routes(self, router: web.UrlDispatcher) -> None:
        super().add_routes(router)
        router.add_get("/health", self.handle_health)

    def render(self) -> MetricsResponse:
        return MetricsResponse(
            render_process_families(self.start_time) + prometheus_client_text(self._families()),
            PROMETHEUS_CONTENT_TYPE,
        )

    def _families(self) -> list[FamilyDump]:
        labels = {"model_name": self.server.config.model, "engine": "0"}
        families = [
            FamilyDump(name, "gauge", help_text, [Series(labels, self.gauges[name])])
            for name, help_text in SCHEDULE_GAUGES
        ]
        for (name, help_text), value in (
            (PROMPT_TOKENS, self.prompt_tokens),
            (GENERATION_TOKENS, self.generation_tokens),
        ):
            families.append(FamilyDump(name, "counter", help_text, [Series(labels, value)]))
        success = [
            Series({**labels, "finished_reason": reason}, value)
            for reason, value in sorted(self.success.items())
        ]
        families.append(FamilyDump(SUCCESS[0], "counter", SUCCESS[1], success))
        histogram = HistogramSeries(
            labels,
            self.iteration.bounds,
            self.iteration.cumulative(),
            self.iteration.count,
            self.iteration.total,
        )
        name, help_text = ITERATION_TOKENS
        families.append(FamilyDump(name, "histogram", help_text, [histogram]))
        return families

    async def handle_health(self, request: web.Request) -> web.Response:
        self.health_calls += 1
        if self.unavailable():
            status = {"status": "unhealthy", "message": "engine is not running"}
            return web.json_response(status, status=503)
        if any(engine.sleep_level for engine in self.engines):
            return web.json_response({"status": "sleeping", "message": ""})
        busy = any(engine.has_work() for engine in self.engines)
        if busy and self.server.clock() - self.last_step > UNHEALTHY_AFTER_SECONDS:
            message = f"scheduler tick has not advanced for {UNHEALTHY_AFTER_SECONDS:.0f} s"
            return web.json_response({"status": "unhealthy", "message": message}, status=503)
        return web.json_response({"status": "healthy", "message": ""})

    def stats(self) -> dict[str, Any]:
        return {"health_calls": self.health_calls}
