"""llama.cpp `llama-server --metrics` (b10434): its 15 families, `/slots`, `/props`, `/health`,
`/completion`, and its traps.

What moves when (tools/server/server-context.cpp, server-task.cpp):

- `n_decode_total` +1 per `llama_decode()` call: each prompt chunk and each generation step;
- prompt tokens are queued per decode and flushed into `prompt_tokens_total` only on a batch that
  produced output or when every slot is idle; `tokens_predicted_total` moves at request end;
- `requests_processing` / `requests_deferred` are read at scrape time;
- every value is printed by a C++ stream with its default precision (`%g`, 6 significant
  digits), so above 999 999 a counter reads `1.23457e+06` and small increases vanish;
- the `Process-Start-Time-Unix` response header of `/metrics` is CLOCK_MONOTONIC microseconds at
  start-up, not Unix time; `/health` answers 200 even when decoding is wedged;
- `/slots` carries exact per-slot counts (`n_prompt_tokens_processed`, `next_token[0].n_decoded`)
  and wakes a sleeping server; `/props` reports `is_sleeping` without waking it.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from stallwatch.simulator.api import RequestFailed, count_prompt_tokens
from stallwatch.simulator.engine import SimRequest, StepRecord
from stallwatch.simulator.engines.base import Flavour, MetricsResponse

CONTENT_TYPE = "text/plain; version=0.0.4"
BUILD_INFO = "b1-7e4c0a9"
LOADING_BODY = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
DEFAULT_N_PREDICT = 16

# (name, HELP) in the order the server prints them (server_task_result_metrics::to_metrics).
COUNTERS = (
    ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "Total time spent processing prompts"),
    ("tokens_predicted_total", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "Total time spent generating tokens"),
    (
        "n_decode_total",
        "Total number of llama_decode() calls, excluding speculative decoding and multimodal "
        "decoding",
    ),
    ("n_tokens_max", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated"),
    (
        "spec_decode_num_accepted_tokens_total",
        "Speculative: Total draft tokens accepted by the target model",
    ),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps"),
)
GAUGES = (
    ("prompt_tokens_seconds", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "Average generation throughput in tokens/s"),
    ("requests_processing", "Number of requests processing"),
    ("requests_deferred", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call"),
)


def cpp_stream_number(value: float) -> str:
    """A double as `std::stringstream << value` prints it: `%g`, 6 significant digits."""
    return format(value, "g")


@dataclass
class _Bucket:
    """The window behind a throughput gauge: reset by every `/metrics` call."""

    tokens: float = 0.0
    seconds: float = 0.0

    def per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class LlamaCppFlavour(Flavour):
    """A simulated `llama-server --metrics -np N` (N = `max_num_seqs`)."""

    name = "llamacpp"
    models_owner = "llamacpp"  # tools/server: every /v1/models card

    def reset(self, now: float) -> None:
        super().reset(now)
        initial = float(self.server.config.initial_decodes)
        # CLOCK_MONOTONIC microseconds at start-up, as ggml_time_us() gives it.
        self.t_start = time.monotonic_ns() // 1000
        self.n_decode = initial
        self.n_busy_slots = initial  # a long-running server averaged about one busy slot
        self.n_tokens_max = 0.0
        self.prompt_tokens = 0.0
        self.prompt_seconds = 0.0
        self.pending_prompt_tokens = 0.0
        self.pending_prompt_seconds = 0.0
        self.predicted_tokens = initial
        self.predicted_seconds = 0.0
        self.prompt_bucket = _Bucket()
        self.predict_bucket = _Bucket()
        self.slot_of: dict[str, int] = {}
        self.task_ids: dict[str, int] = {}
        self._task_counter = itertools.count()
        self.last_slot_task: dict[int, SimRequest] = {}
        self.sleeping = False
        self.idle_since = now
        self.slots_calls = 0
        self.props_calls = 0

    # --- engine model --------------------------------------------------------------------

    def on_step(self, record: StepRecord) -> None:
        self.n_decode += 1
        self.n_busy_slots += len(record.running) + len(record.finished)
        duration = record.end - record.start
        if record.prefill_tokens:
            self.pending_prompt_tokens += record.prefill_tokens
            self.pending_prompt_seconds += duration
        for request in (*record.running, *record.finished):
            self.n_tokens_max = max(self.n_tokens_max, request.kv_tokens)
            self._assign_slot(request)
        if record.generated or not record.running:
            self._flush_prompt()
        for request in record.finished:
            first = request.first_token_at if request.first_token_at is not None else record.end
            self.predicted_tokens += request.generated
            self.predicted_seconds += record.end - first
            self.predict_bucket.tokens += request.generated
            self.predict_bucket.seconds += record.end - first
            self.slot_of.pop(request.request_id, None)

    def _flush_prompt(self) -> None:
        self.prompt_tokens += self.pending_prompt_tokens
        self.prompt_seconds += self.pending_prompt_seconds
        self.prompt_bucket.tokens += self.pending_prompt_tokens
        self.prompt_bucket.seconds += self.pending_prompt_seconds
        self.pending_prompt_tokens = 0.0
        self.pending_prompt_seconds = 0.0

    def _assign_slot(self, request: SimRequest) -> None:
        if request.request_id in self.slot_of:
            return
        self._forget_gone_requests()
        used = set(self.slot_of.values())
        slot = next(i for i in itertools.count() if i not in used)
        self.slot_of[request.request_id] = slot
        self.last_slot_task[slot] = request
        self.task_ids[request.request_id] = next(self._task_counter)

    def _forget_gone_requests(self) -> None:
        live = {r.request_id for engine in self.engines for r in engine.running}
        for request_id in [r for r in self.slot_of if r not in live]:
            del self.slot_of[request_id]

    def slot_count(self) -> int:
        return self.server.config.max_num_seqs * len(self.engines)

    def tick(self, now: float) -> None:
        busy = any(engine.has_work() for engine in self.engines)
        if busy:
            self.idle_since = now
            return
        self._flush_prompt()  # all slots idle
        limit = self.server.config.sleep_idle_seconds
        if limit >= 0 and not self.sleeping and now - self.idle_since >= limit:
            self._set_sleeping(True)

    def _set_sleeping(self, sleeping: bool) -> None:
        self.sleeping = sleeping
        for engine in self.engines:
            engine.sleep_level = 1 if sleeping else 0
            if not sleeping:
                engine.next_step_at = max(engine.next_step_at, self.server.clock())
        self.idle_since = self.server.clock()

    def before_generation(self) -> None:
        if self.sleeping:
            self._set_sleeping(False)

    # --- endpoints -----------------------------------------------------------------------

    def add_routes(self, router: web.UrlDispatcher) -> None:
        super().add_routes(router)
        router.add_get("/health", self.handle_health)
        router.add_get("/v1/health", self.handle_health)
        router.add_get("/slots", self.handle_slots)
        router.add_get("/props", self.handle_props)
        router.add_post("/completion", self.handle_completion)
        router.add_post("/completions", self.handle_completion)

    def render(self) -> MetricsResponse:
        counters = {
            "prompt_tokens_total": self.prompt_tokens,
            "prompt_tokens_cached_total": 0.0,
            "prompt_seconds_total": self.prompt_seconds,
            "tokens_predicted_total": self.predicted_tokens,
            "tokens_predicted_seconds_total": self.predicted_seconds,
            "n_decode_total": self.n_decode,
            "n_tokens_max": self.n_tokens_max,
        }
        gauges = {
            "prompt_tokens_seconds": self.prompt_bucket.per_second(),
            "predicted_tokens_seconds": self.predict_bucket.per_second(),
            "requests_processing": float(self.running()),
            "requests_deferred": float(self.waiting()),
            "n_busy_slots_per_decode": self.n_busy_slots / max(self.n_decode, 1.0),
        }
        lines: list[str] = []
        for kind, items, values in (("counter", COUNTERS, counters), ("gauge", GAUGES, gauges)):
            for name, help_text in items:
                value = cpp_stream_number(values.get(name, 0.0))
                lines.append(f"# HELP llamacpp:{name} {help_text}\n")
                lines.append(f"# TYPE llamacpp:{name} {kind}\n")
                lines.append(f"llamacpp:{name} {value}\n")
        self.prompt_bucket = _Bucket()
        self.predict_bucket = _Bucket()
        return MetricsResponse(
            "".join(lines),
            CONTENT_TYPE,
            (("Server", "llama.cpp"), ("Process-Start-Time-Unix", str(self.t_start))),
        )

    async def handle_health(self, request: web.Request) -> web.Response:
        if self.unavailable():
            return web.json_response(LOADING_BODY, status=503, headers={"Connection": "close"})
        return web.json_response({"status": "ok"})

    async def handle_slots(self, request: web.Request) -> web.Response:
        self.slots_calls += 1
        if self.sleeping:
            self._set_sleeping(False)  # /slots has no sleep bypass: it wakes the server
        self._forget_gone_requests()
        running = {r.request_id: r for engine in self.engines for r in engine.running}
        by_slot = {slot: running[rid] for rid, slot in self.slot_of.items() if rid in running}
        n_ctx = self.server.config.max_model_len
        return web.json_response(
            [self._slot_json(i, by_slot.get(i), n_ctx) for i in range(self.slot_count())]
        )

    def _slot_json(self, slot: int, request: SimRequest | None, n_ctx: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": slot,
            "n_ctx": n_ctx,
            "speculative": False,
            "is_processing": request is not None,
        }
        task = request if request is not None else self.last_slot_task.get(slot)
        if task is not None:
            body["id_task"] = self.task_ids.get(task.request_id, 0)
            body["n_prompt_tokens"] = task.prompt_tokens
            body["n_prompt_tokens_processed"] = task.computed_prompt
            body["n_prompt_tokens_cache"] = 0
            body["next_token"] = [
                {
                    "has_next_token": request is not None,
                    "has_new_line": False,
                    "n_remain": max(task.max_tokens - task.generated, 0),
                    "n_decoded": task.generated,
                }
            ]
        return body

    async def handle_props(self, request: web.Request) -> web.Response:
        self.props_calls += 1
        return web.json_response(
            {
                "default_generation_settings": {"n_ctx": self.server.config.max_model_len},
                "total_slots": self.slot_count(),
                "model_alias": self.server.config.model,
                "endpoint_slots": True,
                "endpoint_props": False,
                "endpoint_metrics": True,
                "build_info": BUILD_INFO,
                "is_sleeping": self.sleeping,
            }
        )

    async def handle_completion(self, request: web.Request) -> web.Response:
        """The native endpoint: `{"prompt", "n_predict", "ignore_eos"}` -> `{"content", ...}`."""
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str | list):
            # llama.cpp answers a missing or invalid body with 500, not 400.
            error = {"code": 500, "message": '"prompt" must be provided', "type": "server_error"}
            return web.json_response({"error": error}, status=500)
        prompt = body["prompt"]
        prompt_tokens = (
            len(prompt) if isinstance(prompt, list) else count_prompt_tokens(str(prompt))
        )
        n_predict = body.get("n_predict", DEFAULT_N_PREDICT)
        if not isinstance(n_predict, int) or n_predict < 1:
            n_predict = DEFAULT_N_PREDICT
        if self.unavailable():
            return web.json_response(LOADING_BODY, status=503)
        self.before_generation()
        user_agent = request.headers.get("User-Agent", "")
        try:
            generated = await self.server.generate(
                prompt_tokens, n_predict, bool(body.get("ignore_eos", False)), user_agent
            )
        except RequestFailed as failure:
            return web.json_response(
                {"error": {"code": 500, "message": failure.message, "type": "server_error"}},
                status=500,
            )
        return web.json_response(
            {
                "content": " token" * generated,
                "tokens_predicted": generated,
                "tokens_evaluated": prompt_tokens,
                "stop": True,
                "stop_type": "limit" if generated >= n_predict else "eos",
                "model": self.server.config.model,
            }
        )

    def stats(self) -> dict[str, Any]:
        return {
            "slots_calls": self.slots_calls,
            "props_calls": self.props_calls,
            "n_decode_exact": self.n_decode,
        }
