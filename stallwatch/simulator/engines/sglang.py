"""SGLang 0.5.23 (`--enable-metrics`): its scheduler and tokenizer families, `/health`, `/ping`,
`/ready`, and its traps.

What moves when (sglang/srt/observability/metrics_collector.py, scheduler_components/
metrics_reporter.py):

- `cuda_graph_passes_total{mode}` +1 per prefill batch (each chunk) and per decode batch;
- the work gauges (`num_running_reqs`, `num_queue_reqs`, `token_usage`, ...) are published after
  every prefill batch (the new requests are not in the running batch yet), only every
  `decode_log_interval` (40) decode steps, and when idle as soon as they are stale;
- `scheduler_process_cpu_seconds_total` / `scheduler_idle_seconds_total` are flushed from the
  scheduler loop at most once a second, idle too, and freeze when the loop is stuck;
- `prompt_tokens_total`, `generation_tokens_total`, `num_requests_total` move at request end;
- metrics are multiprocess (a fresh directory per start): no `process_*`, no `_created`;
- `http_requests_active{endpoint}` (the HTTP layer's own gauge) is live: during a chunked
  prefill it is the only series that shows the request while both work gauges read 0;
- after a restart, until its own warm-up request has run, `/metrics` holds only the startup
  series (`startup_time_seconds`, `max_total_num_tokens`) and zeroed scheduler counters;
- `/health` and `/health_generate` run a 1-token generation on an idle server, and on a busy one
  wait for the next batch result (503 after 20 s); `/ping` and `/ready` read a flag.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from stallwatch.simulator.api import RequestFailed
from stallwatch.simulator.engine import StepRecord
from stallwatch.simulator.engines.base import (
    PROMETHEUS_CONTENT_TYPE,
    FamilyDump,
    Flavour,
    MetricsResponse,
    Series,
    prometheus_client_text,
)

DECODE_LOG_INTERVAL = 40
HEALTH_CHECK_TIMEOUT = 20.0
FLUSH_SECONDS = 1.0
IDLE_CPU_SHARE = 0.05  # the idle loop polls its sockets: a little CPU per second
PREFILL_MODE = "prefill_none"
DECODE_MODE = "decode_cuda_graph"

# (name as declared, type, HELP) of the families simulated, as declared in 0.5.23.
SCHEDULER_GAUGES = (
    ("sglang:num_running_reqs", "The number of running requests."),
    ("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
    ("sglang:gen_throughput", "The generation throughput (token/s)."),
    ("sglang:token_usage", "The token usage."),
    ("sglang:num_used_tokens", "The number of used tokens."),
)
PASSES = ("sglang:cuda_graph_passes", "Total number of forward passes categorized by CUDA graph.")
REALTIME = (
    "sglang:realtime_tokens",
    "Total number of tokens processed (updated on each log interval). mode: prefill_compute, "
    "prefill_cache, decode.",
)
IDLE_SECONDS = (
    "sglang:scheduler_idle_seconds",
    "Total wall time while the scheduler has no runnable or queued work.",
)
CPU_SECONDS = (
    "sglang:scheduler_process_cpu_seconds",
    "Total CPU time consumed by the scheduler process across all threads.",
)
HTTP_ACTIVE = ("sglang:http_requests_active", "Number of currently active HTTP requests")
STARTUP = (
    "sglang:startup_time_seconds",
    "Engine startup duration by phase in seconds.",
)
MAX_TOTAL_TOKENS = (
    "sglang:max_total_num_tokens",
    "Maximum total number of tokens in the KV cache pool.",
)
# What a restarted server's startup phases took (seconds), as the real CPU server published them.
STARTUP_PHASES = (
    ("load_weight", 0.13),
    ("kv_cache_allocation", 1.42),
    ("scheduler_e2e", 3.09),
    ("tokenizer_e2e", 13.38),
)
# A restarted server loads for this long before its warm-up request has run.
RESTART_LOADING_SECONDS = 1.0
FINISHED_COUNTERS = (
    ("sglang:prompt_tokens", "Number of prefill tokens processed."),
    ("sglang:generation_tokens", "Number of generation tokens processed."),
    ("sglang:num_requests", "Number of requests processed."),
)


class SglangFlavour(Flavour):
    """A simulated `sglang.launch_server --enable-metrics` (one scheduler, TP 1)."""

    name = "sglang"
    models_owner = "sglang"  # sglang/srt/entrypoints/openai/protocol.py ModelCard

    def reset(self, now: float) -> None:
        restarted = hasattr(self, "published")
        super().reset(now)
        initial = float(self.server.config.initial_decodes)
        self.published = {name: 0.0 for name, _ in SCHEDULER_GAUGES}
        self.passes: dict[str, float] = {DECODE_MODE: initial} if initial else {}
        self.realtime: dict[str, float] = {}
        self.finished = {name: 0.0 for name, _ in FINISHED_COUNTERS}
        self.any_finished = False
        self.decode_steps = 0
        self.cpu_seconds = 0.0
        self.idle_seconds = 0.0
        self.unflushed_cpu = 0.0
        self.unflushed_idle = 0.0
        self.last_tick = now
        self.last_flush = now
        # The simulator starts loaded; a `restart` loads again, as a new process would.
        self.loading_until = now + RESTART_LOADING_SECONDS if restarted else now
        self.healthy = True
        self.health_generations = 0
        self.health_calls = 0
        self._step_event = asyncio.Event()

    # --- engine model --------------------------------------------------------------------

    def on_step(self, record: StepRecord) -> None:
        if record.prefill_tokens:
            self.passes[PREFILL_MODE] = self.passes.get(PREFILL_MODE, 0.0) + 1
            self._add_realtime("prefill_compute", record.prefill_tokens)
            # The prefill batch is not in the running batch yet when its stats are reported.
            decoding = [r for r in record.running if r.generated > 1]
            self._publish(len(decoding), record.waiting, record.running)
        else:
            self.passes[DECODE_MODE] = self.passes.get(DECODE_MODE, 0.0) + 1
            self.decode_steps += 1
            if self.decode_steps % DECODE_LOG_INTERVAL == 0:
                self._publish(len(record.running), record.waiting, record.running)
        if record.decode_tokens:
            self._add_realtime("decode", record.decode_tokens)
        for request in record.finished:
            self.any_finished = True
            self.finished["sglang:prompt_tokens"] += request.prompt_tokens
            self.finished["sglang:generation_tokens"] += request.generated
            self.finished["sglang:num_requests"] += 1
        self._step_event.set()
        self._step_event = asyncio.Event()

    def _add_realtime(self, mode: str, tokens: int) -> None:
        self.realtime[mode] = self.realtime.get(mode, 0.0) + tokens

    def _publish(self, running: int, waiting: int, requests: Any) -> None:
        used = sum(r.kv_tokens for r in requests)
        self.published["sglang:num_running_reqs"] = float(running)
        self.published["sglang:num_queue_reqs"] = float(waiting)
        self.published["sglang:num_used_tokens"] = float(used)
        self.published["sglang:token_usage"] = used / max(self.server.config.kv_cache_tokens, 1)

    def tick(self, now: float) -> None:
        elapsed = max(now - self.last_tick, 0.0)
        self.last_tick = now
        busy = any(engine.has_work() for engine in self.engines)
        self.unflushed_cpu += elapsed * (1.0 if busy else IDLE_CPU_SHARE)
        if not busy:
            self.unflushed_idle += elapsed
            if self.published["sglang:num_running_reqs"] != self.running():
                self._publish(0, self.waiting(), ())
        if now - self.last_flush >= FLUSH_SECONDS:
            self.cpu_seconds += self.unflushed_cpu
            self.idle_seconds += self.unflushed_idle
            self.unflushed_cpu = self.unflushed_idle = 0.0
            self.last_flush = now

    # --- endpoints -----------------------------------------------------------------------

    def add_routes(self, router: web.UrlDispatcher) -> None:
        super().add_routes(router)
        router.add_get("/health", self.handle_health)
        router.add_get("/health_generate", self.handle_health)
        router.add_get("/ping", self.handle_ping)
        router.add_get("/ready", self.handle_ping)

    def render(self) -> MetricsResponse:
        if self.server.clock() < self.loading_until:
            return self._render_loading()
        scheduler = {
            "model_name": self.server.config.model,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        tokenizer = {"model_name": self.server.config.model, "engine_type": "unified"}
        families = [
            FamilyDump(name, "gauge", help_text, [Series(scheduler, self.published[name])])
            for name, help_text in SCHEDULER_GAUGES
        ]
        families.append(self._labelled(PASSES, scheduler, "mode", self.passes))
        families.append(self._labelled(REALTIME, scheduler, "mode", self.realtime))
        for (name, help_text), value in (
            (IDLE_SECONDS, self.idle_seconds),
            (CPU_SECONDS, self.cpu_seconds),
        ):
            families.append(FamilyDump(name, "counter", help_text, [Series(scheduler, value)]))
        http = [Series({"endpoint": "/metrics", "method": "GET"}, 1.0)]
        if in_flight := self.server.in_flight_count():
            labels = {"endpoint": "/v1/completions", "method": "POST"}
            http.append(Series(labels, float(in_flight)))
        families.append(FamilyDump(HTTP_ACTIVE[0], "gauge", HTTP_ACTIVE[1], http))
        for name, help_text in FINISHED_COUNTERS:
            series = (
                [Series({**tokenizer, "is_streaming": "false"}, self.finished[name])]
                if self.any_finished
                else []
            )
            families.append(FamilyDump(name, "counter", help_text, series))
        return MetricsResponse(prometheus_client_text(families), PROMETHEUS_CONTENT_TYPE)

    def _render_loading(self) -> MetricsResponse:
        """Before the warm-up request: startup series and zeroed scheduler counters only."""
        model = self.server.config.model
        scheduler = {
            "model_name": model,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        startup = {"model_name": model, "engine_type": "unified"}
        families = [
            FamilyDump(name, "counter", help_text, [Series(scheduler, 0.0)])
            for name, help_text in (IDLE_SECONDS, CPU_SECONDS)
        ]
        tokens = float(self.server.config.kv_cache_tokens)
        families.append(
            FamilyDump(
                *MAX_TOTAL_TOKENS[:1], "gauge", MAX_TOTAL_TOKENS[1], [Series(scheduler, tokens)]
            )
        )
        phases = [Series({**startup, "phase": phase}, took) for phase, took in STARTUP_PHASES]
        families.append(FamilyDump(STARTUP[0], "gauge", STARTUP[1], phases))
        return MetricsResponse(prometheus_client_text(families), PROMETHEUS_CONTENT_TYPE)

    @staticmethod
    def _labelled(
        family: tuple[str, str], labels: dict[str, str], key: str, values: dict[str, float]
    ) -> FamilyDump:
        series = [Series({**labels, key: mode}, value) for mode, value in sorted(values.items())]
        return FamilyDump(family[0], "counter", family[1], series)

    async def handle_ping(self, request: web.Request) -> web.Response:
        ok = self.healthy and not self.unavailable()
        return web.Response(status=200 if ok else 503)

    async def handle_health(self, request: web.Request) -> web.Response:
        """Runs a generation when idle; waits for the next batch result when busy."""
        self.health_calls += 1
        if self.unavailable():
            return web.Response(status=503)
        busy = any(engine.has_work() for engine in self.engines)
        try:
            async with asyncio.timeout(HEALTH_CHECK_TIMEOUT):
                if busy:
                    await self._step_event.wait()
                else:
                    self.health_generations += 1
                    await self.server.generate(1, 1, False, None)
        except (TimeoutError, RequestFailed):
            self.healthy = False
            return web.Response(status=503)
        self.healthy = True
        return web.Response(status=200)

    def stats(self) -> dict[str, Any]:
        return {"health_generations": self.health_generations, "health_calls": self.health_calls}
