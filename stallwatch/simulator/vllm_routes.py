"""vLLM's own endpoints on the simulated server: health, metrics, version, load and sleep mode."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from stallwatch.simulator.api import VLLM_VERSION, error_response
from stallwatch.simulator.metrics import CONTENT_TYPE

if TYPE_CHECKING:
    from stallwatch.simulator.host import VllmRouteHost


class VllmRoutes:
    """The routes a vLLM 0.32 server has beside the OpenAI API (the simulator's default face)."""

    def __init__(self, server: VllmRouteHost) -> None:
        self.server = server

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/health", self.handle_health)
        router.add_get("/ping", self.handle_health)
        router.add_get("/metrics", self.handle_metrics)
        # vLLM mounts its metrics app at /metrics: every path under it, with any method,
        # answers metrics (so a base URL ending in /metrics sends test requests there).
        router.add_route("*", "/metrics/{tail:.*}", self.handle_metrics)
        router.add_get("/version", self.handle_version)
        router.add_get("/load", self.handle_load)
        router.add_post("/sleep", self.handle_sleep)
        router.add_post("/wake_up", self.handle_wake_up)
        router.add_get("/is_sleeping", self.handle_is_sleeping)
        if self.server.config.fault_tolerance:
            router.add_get("/fault_tolerance/status", self.handle_fault_tolerance_status)

    async def handle_fault_tolerance_status(self, request: web.Request) -> web.Response:
        """vLLM 0.33 `--enable-fault-tolerance`: the API server's cached status per engine."""
        engines: list[dict[str, object]] = []
        for index in range(len(self.server.engines)):
            entry: dict[str, object] = {"id": index, "status": self.server.engine_status}
            if self.server.engine_status != "healthy":
                entry["fault_info"] = "RuntimeError"
            engines.append(entry)
        return web.json_response(
            {"schema_version": 1, "total_engines": len(engines), "engines": engines}
        )

    async def handle_health(self, request: web.Request) -> web.Response:
        if self.server.unavailable():
            return web.Response(status=503)
        return web.Response(status=200)

    async def handle_metrics(self, request: web.Request) -> web.Response:
        response = web.Response(body=self.server.render_metrics().encode("utf-8"))
        response.headers["Content-Type"] = CONTENT_TYPE
        return response

    async def handle_version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def handle_load(self, request: web.Request) -> web.Response:
        return web.json_response({"server_load": self.server.in_flight_count()})

    async def handle_sleep(self, request: web.Request) -> web.Response:
        try:
            level = int(request.query.get("level", "1"))
        except ValueError:
            return error_response("level must be 1 or 2", "BadRequestError", 400, "level")
        if level not in (1, 2):
            return error_response("level must be 1 or 2", "BadRequestError", 400, "level")
        for engine in self.server.engines:
            engine.sleep_level = level
        return web.Response(status=200)

    async def handle_wake_up(self, request: web.Request) -> web.Response:
        now = self.server.clock()
        for engine in self.server.engines:
            engine.sleep_level = 0
            engine.next_step_at = max(engine.next_step_at, now)
        return web.Response(status=200)

    async def handle_is_sleeping(self, request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": any(e.sleep_level for e in self.server.engines)})
