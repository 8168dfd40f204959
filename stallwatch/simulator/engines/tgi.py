"""Hugging Face TGI v3 (router `metrics-exporter-prometheus`): its batch and request families,
`/health`, `/info`, and its traps.

What moves when (backends/v3/src/backend.rs, queue.rs, router/src/server.rs):

- `tgi_batch_inference_count{method}` before and `tgi_batch_inference_success{method}` after each
  prefill or decode call to the shard: one per forward;
- `tgi_batch_current_size` is set at each decode iteration and 0 when the loop leaves a batch;
  `tgi_queue_size` at each enqueue and batch; `tgi_request_success` at request end;
- names carry no `_total`; a series appears only after its first update, so before its first
  request a TGI's `/metrics` is an empty 200; no start time;
- `/health` (= `/` = `/ping`) asks every shard for its health, which the shard answers only
  between two forwards: on a busy server it waits for the current forward, on a hung one it
  never answers.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from stallwatch.simulator.engine import StepRecord
from stallwatch.simulator.engines.base import Flavour, MetricsResponse, plain_number

CONTENT_TYPE = "text/plain; charset=utf-8"
VERSION = "3.3.7"

# name -> (type, HELP or None: metrics without a describe_* call print no HELP line).
FAMILIES: dict[str, tuple[str, str | None]] = {
    "tgi_batch_inference_count": ("counter", "Inference calls per method (prefill or decode)"),
    "tgi_batch_inference_success": (
        "counter",
        "Number of successful inference calls per method (prefill or decode)",
    ),
    "tgi_request_count": ("counter", "Total number of requests"),
    "tgi_request_success": ("counter", "Number of successful requests"),
    "tgi_batch_current_max_tokens": ("gauge", "Maximum tokens for the current batch"),
    "tgi_batch_current_size": ("gauge", "Current batch size"),
    "tgi_queue_size": ("gauge", "Current queue size"),
}


class TgiFlavour(Flavour):
    """A simulated `text-generation-launcher` (one shard, chunked prefill)."""

    name = "tgi"
    models_owner = ""  # router/src/server.rs: `owned_by` is the model id

    def reset(self, now: float) -> None:
        super().reset(now)
        initial = float(self.server.config.initial_decodes)
        # Nothing before the first request: every series is created at its first update, and
        # `tgi_batch_max_total_tokens` is set at warmup, before the router installs its recorder
        # (backends/v3/src/main.rs calls connect_backend before server::run), so never published.
        self.values: dict[str, dict[str, float]] = {}
        if initial:
            for name in ("tgi_batch_inference_count", "tgi_batch_inference_success"):
                self.values[name] = {"decode": initial}
        self.health_calls = 0
        self._step_event = asyncio.Event()

    def _add(self, name: str, key: str, amount: float) -> None:
        series = self.values.setdefault(name, {})
        series[key] = series.get(key, 0.0) + amount

    def _set(self, name: str, value: float) -> None:
        self.values[name] = {"": value}

    def on_step(self, record: StepRecord) -> None:
        method = "prefill" if record.prefill_tokens else "decode"
        self._add("tgi_batch_inference_count", method, 1)
        self._add("tgi_batch_inference_success", method, 1)
        self._set("tgi_queue_size", float(record.waiting))
        if record.running:
            self._set("tgi_batch_current_size", float(len(record.running)))
            self._set(
                "tgi_batch_current_max_tokens",
                float(sum(r.prompt_tokens + r.max_tokens for r in record.running)),
            )
        else:
            self._set("tgi_batch_current_size", 0.0)
            self._set("tgi_batch_current_max_tokens", 0.0)
        if record.finished:
            self._add("tgi_request_success", "", len(record.finished))
        self._step_event.set()
        self._step_event = asyncio.Event()

    def before_generation(self) -> None:
        self._add("tgi_request_count", "", 1)
        self._set("tgi_queue_size", float(self.waiting() + 1))

    def add_routes(self, router: web.UrlDispatcher) -> None:
        super().add_routes(router)
        router.add_get("/", self.handle_health)
        router.add_get("/health", self.handle_health)
        router.add_get("/ping", self.handle_health)
        router.add_get("/info", self.handle_info)

    def render(self) -> MetricsResponse:
        blocks: list[str] = []
        for kind in ("counter", "gauge"):
            for name in sorted(FAMILIES):
                family_kind, help_text = FAMILIES[name]
                if family_kind != kind or name not in self.values:
                    continue
                lines = [f"# HELP {name} {help_text}\n"] if help_text else []
                lines.append(f"# TYPE {name} {kind}\n")
                for key, value in sorted(self.values[name].items()):
                    labels = f'{{method="{key}"}}' if key else ""
                    lines.append(f"{name}{labels} {plain_number(value)}\n")
                blocks.append("".join(lines) + "\n")
        return MetricsResponse("".join(blocks), CONTENT_TYPE)

    async def handle_health(self, request: web.Request) -> web.Response:
        self.health_calls += 1
        if self.unavailable():
            return web.json_response(
                {"error": "unhealthy", "error_type": "healthcheck"}, status=503
            )
        if any(engine.has_work() for engine in self.engines):
            await self._step_event.wait()  # the shard answers between two forwards
        return web.Response(status=200)

    async def handle_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_id": self.server.config.model,
                "max_concurrent_requests": 128,
                "max_input_tokens": self.server.config.max_model_len - 1,
                "max_total_tokens": self.server.config.max_model_len,
                "router": "text-generation-router",
                "version": VERSION,
            }
        )

    def stats(self) -> dict[str, Any]:
        return {"health_calls": self.health_calls}
