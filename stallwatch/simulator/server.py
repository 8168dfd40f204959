"""The simulated model server (aiohttp): vLLM 0.32 by default, or another engine's face
(`SimConfig.engine`, see `simulator.engines`), with fault injection.

`SimServer(config)` owns the engines, the HTTP app and (when started with `start`) the
listening socket. `build_app(config)` returns just the application for callers that run it
themselves (then a `crash` fault marks the engine dead but cannot close the socket, and a
client that disconnects aborts its request only if the runner has `handler_cancellation=True`).
The OpenAI-compatible endpoints are in `openai_routes`, vLLM's own in `vllm_routes`.

As in vLLM, a client that goes away (closes its connection or times out) aborts its request:
the engine drops it from its queue or slot, frees its KV cache and counts it in
`vllm:request_success_total{finished_reason="abort"}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from stallwatch.simulator.api import ENGINE_DEAD_MESSAGE, RequestFailed, error_response
from stallwatch.simulator.config import SimConfig
from stallwatch.simulator.engine import Engine, SimRequest, TokenEvent
from stallwatch.simulator.engines import Flavour, make_flavour
from stallwatch.simulator.faults import inject, parse_fault, parse_fault_body
from stallwatch.simulator.metrics import (
    EngineView,
    RenderOptions,
    load_families,
    render_payload,
)
from stallwatch.simulator.openai_routes import OpenAiRoutes
from stallwatch.simulator.vllm_routes import VllmRoutes

log = logging.getLogger(__name__)


@dataclass
class _InFlight:
    engine_index: int
    events: asyncio.Queue[TokenEvent | RequestFailed] = field(default_factory=asyncio.Queue)


class SimServer:
    """A simulated vLLM server: engines, HTTP handlers, faults, and its own listening socket."""

    def __init__(self, config: SimConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.app = web.Application(middlewares=[self._hold_while_api_hangs])
        self.app[SIM_SERVER_KEY] = self
        self.flavour: Flavour | None = make_flavour(config.engine, self)
        self._add_routes()
        self.app.on_startup.append(self._on_startup)
        self.app.on_cleanup.append(self._on_cleanup)
        self._ids = itertools.count(1)
        self._rr = itertools.count()
        self._in_flight: dict[str, _InFlight] = {}
        # (engine index, request id) of requests whose client went away, for the engine core.
        self._pending_aborts: list[tuple[int, str]] = []
        self._ticker: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.crashed = asyncio.Event()
        self.completions_by_user_agent: Counter[str] = Counter()
        # Every request but the simulator's own `/sim/`, by "METHOD /path", kept across reboots:
        # what a test asserts was never called.
        self.requests_by_path: Counter[str] = Counter()
        self.requests_total = 0
        self.fault: str | None = None
        self.hung = False
        self.dead = False
        # vLLM fault tolerance: "healthy", or "unhealthy" while `engine_fault` holds the engine.
        self.engine_status = "healthy"
        self.down_until = 0.0
        self.engines: list[Engine] = []
        self.start_time = 0.0
        # Cleared by the `api_hang` and `freeze` faults: requests are accepted and wait for it.
        self.api_answers = asyncio.Event()
        self.boot()

    # --- lifecycle ----------------------------------------------------------------------

    def boot(self) -> None:
        """(Re)create the engines: every counter starts at zero, a new process start time."""
        now = self.clock()
        self.start_time = now
        families = load_families()
        self.engines = [
            Engine(self.config.engine_config(), families, now, seed=self.config.seed + index)
            for index in range(self.config.data_parallel_size)
        ]
        if self.config.api_server_count > 1:
            # Multiprocess mode: the "mostrecent" gauges have no sample until the first stats.
            for engine in self.engines:
                for name in (
                    "vllm:num_requests_running",
                    "vllm:num_requests_waiting",
                    "vllm:kv_cache_usage_perc",
                ):
                    engine.stats.gauges[name] = None
        self._pending_aborts.clear()
        self.completions_by_user_agent.clear()
        self.requests_total = 0
        self.fault = None
        self.hung = False
        self.engine_status = "healthy"
        self.thaw()
        self.dead = False
        if self.flavour is not None:
            self.flavour.reset(now)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on host:port (0 = a free port); return the base URL."""
        # handler_cancellation: a client that disconnects cancels its handler, which aborts
        # its request (aiohttp leaves handlers running by default).
        self._runner = web.AppRunner(self.app, shutdown_timeout=2.0, handler_cancellation=True)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, host, port)
        await self._site.start()
        self.host = host
        self.port = self._bound_port()
        return self.url

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _bound_port(self) -> int:
        assert self._runner is not None
        for address in self._runner.addresses:
            if isinstance(address, tuple):
                return int(address[1])
        raise RuntimeError("the simulator is not listening on a TCP port")

    async def stop(self) -> None:
        """Stop listening and release everything; safe to call more than once."""
        runner, self._runner, self._site = self._runner, None, None
        # Answer requests in flight first, so shutting down does not wait for them.
        self.fail_all(RequestFailed(500, "InternalServerError", ENGINE_DEAD_MESSAGE))
        if runner is not None:
            await runner.cleanup()
        for task in list(self._background):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _on_startup(self, app: web.Application) -> None:
        self._ticker = asyncio.create_task(self._tick_forever())

    async def _on_cleanup(self, app: web.Application) -> None:
        self.fail_all(RequestFailed(500, "InternalServerError", ENGINE_DEAD_MESSAGE))
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None

    async def _tick_forever(self) -> None:
        while True:
            self.tick(self.clock())
            await asyncio.sleep(self.config.tick_seconds)

    def tick(self, now: float) -> None:
        """Advance every engine to `now` (unless hung, asleep or dead) and deliver outputs."""
        if self.hung or self.dead:
            return  # a stuck engine core does not read its input queue, aborts included
        self._process_aborts()
        for engine in self.engines:
            if engine.sleep_level:
                continue
            for event in engine.advance_to(now):
                in_flight = self._in_flight.get(event.request_id)
                if in_flight is not None:
                    in_flight.events.put_nowait(event)
        if self.flavour is not None:
            self.flavour.tick(now)

    def _process_aborts(self) -> None:
        aborts, self._pending_aborts = self._pending_aborts, []
        for engine_index, request_id in aborts:
            self.engines[engine_index].abort(request_id)

    def fail_all(self, failure: RequestFailed) -> None:
        """Answer every request in flight with `failure`."""
        for in_flight in self._in_flight.values():
            in_flight.events.put_nowait(failure)
        self._in_flight.clear()

    def in_background(self, coroutine: Any) -> None:
        """Run `coroutine` as a task the server cancels when it stops."""
        task: asyncio.Task[None] = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- faults -------------------------------------------------------------------------

    def freeze(self) -> None:
        """Stop the whole process (SIGSTOP): the engines stop and no endpoint answers until
        `thaw`."""
        self.hung = True
        self.api_answers.clear()

    def thaw(self) -> None:
        self.api_answers.set()

    def apply_fault(self, fault: str, options: dict[str, Any]) -> str:
        """Apply a fault by name; returns a short description. Raises ValueError if invalid."""
        return inject(self, parse_fault(fault, options))

    async def close_socket(self) -> None:
        """Stop listening for good, as a crashed process does, and set `crashed`."""
        await asyncio.sleep(0.05)  # let the fault request and failed requests be answered
        runner, self._runner, self._site = self._runner, None, None
        if runner is not None:
            await runner.cleanup()
        self.crashed.set()

    async def close_port_for(self, seconds: float) -> None:
        """Stop listening for `seconds`, as a process that restarts does, then listen again."""
        await asyncio.sleep(0.05)
        if self._site is None or self._runner is None:
            return  # not our socket: /health answers 503 until the downtime ends
        await self._site.stop()
        await asyncio.sleep(seconds)
        if self._runner is not None:
            self._site = web.TCPSite(self._runner, self.host, self.port)
            await self._site.start()

    # --- routes -------------------------------------------------------------------------

    def _add_routes(self) -> None:
        router = self.app.router
        if self.flavour is None:
            VllmRoutes(self).add_routes(router)
        else:
            self.flavour.add_routes(router)
        OpenAiRoutes(self).add_routes(router)
        router.add_post("/sim/fault", self.handle_fault)
        router.add_get("/sim/stats", self.handle_stats)

    @web.middleware
    async def _hold_while_api_hangs(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        """Under `api_hang`, every endpoint but the simulator's own `/sim/` never answers."""
        if not request.path.startswith("/sim/"):
            self.requests_by_path[f"{request.method} {request.path}"] += 1
            await self.api_answers.wait()
        response: web.StreamResponse = await handler(request)
        return response

    def _unavailable(self) -> bool:
        return self.dead or self.clock() < self.down_until

    def unavailable(self) -> bool:
        """Dead, or restarting with its port closed."""
        return self._unavailable()

    def in_flight_count(self) -> int:
        return len(self._in_flight)

    def render_metrics(self) -> str:
        """The `/metrics` body, as the server would answer it now."""
        views = [
            EngineView(str(index), engine.stats, engine.sleep_level, self.config.kv_cache_tokens)
            for index, engine in enumerate(self.engines)
        ]
        options = RenderOptions(
            model_name=self.config.model,
            multiprocess=self.config.api_server_count > 1,
            vllm_metrics=self.config.metrics_enabled,
            process_start_time=self.start_time,
        )
        return render_payload(views, options)

    async def handle_fault(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response("body must be JSON", "BadRequestError", 400)
        try:
            result = inject(self, parse_fault_body(body))
        except ValueError as error:
            return error_response(str(error), "BadRequestError", 400, "fault")
        log.info("fault applied: %s", result)
        return web.json_response({"fault": result})

    def stats(self) -> dict[str, Any]:
        """The `/sim/stats` document (also handy in-process)."""
        extra = self.flavour.stats() if self.flavour is not None else {}
        return {
            "engine": self.config.engine,
            "completions_by_user_agent": dict(self.completions_by_user_agent),
            "requests_by_path": dict(self.requests_by_path),
            "requests_total": self.requests_total,
            "in_flight": len(self._in_flight),
            "running": sum(len(e.running) for e in self.engines),
            "waiting": sum(len(e.waiting) for e in self.engines),
            "fault": self.fault,
            "dead": self.dead,
            "sleeping": any(e.sleep_level for e in self.engines),
            "start_time": self.start_time,
            "engines": [{"steps": e.steps, "output_steps": e.output_steps} for e in self.engines],
            **extra,
        }

    async def handle_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    # --- generation ---------------------------------------------------------------------

    async def generate(
        self, prompt_tokens: int, max_tokens: int, ignore_eos: bool, user_agent: str | None
    ) -> int:
        """Run one generation to its end (an engine's native endpoint or health check); returns
        the tokens generated. A `user_agent` of None is not counted as a client request. Raises
        RequestFailed when the engine fails it."""
        if user_agent is not None:
            self.requests_total += 1
            self.completions_by_user_agent[user_agent] += 1
        request = SimRequest(
            f"gen-{uuid.uuid4().hex}", prompt_tokens, max_tokens, ignore_eos, self.clock()
        )
        generated = 0
        async with self.submitted(request) as events:
            async for event in events:
                generated += event.new_tokens
        return generated

    @contextlib.asynccontextmanager
    async def submitted(self, request: SimRequest) -> AsyncIterator[AsyncIterator[TokenEvent]]:
        """Submit `request` to the next engine (round robin) and yield its events; a request
        still in flight at the end was given up by its client: the engine core drops it on its
        next tick."""
        engine_index = next(self._rr) % len(self.engines)
        in_flight = _InFlight(engine_index)
        self._in_flight[request.request_id] = in_flight
        self.engines[engine_index].submit(request, request.arrival)
        try:
            yield self._events(in_flight)
        finally:
            if self._in_flight.pop(request.request_id, None) is not None:
                self._pending_aborts.append((engine_index, request.request_id))

    async def _events(self, in_flight: _InFlight) -> AsyncIterator[TokenEvent]:
        while True:
            event = await in_flight.events.get()
            if isinstance(event, RequestFailed):
                raise event
            yield event
            if event.finish_reason is not None:
                return


SIM_SERVER_KEY = web.AppKey("sim_server", SimServer)


def build_app(config: SimConfig) -> web.Application:
    """A ready aiohttp application simulating vLLM; `app[SIM_SERVER_KEY]` is its SimServer."""
    return SimServer(config).app
