"""The OpenAI-compatible endpoints on the simulated server: models, completions and chat
completions, served by the server's engines (every engine's face has them)."""

from __future__ import annotations

import json
import random
import uuid
from typing import TYPE_CHECKING

from aiohttp import web

from stallwatch.simulator.api import (
    ENGINE_DEAD_MESSAGE,
    WORDS,
    ResponseMeta,
    error_response,
    model_list,
    parse_generation,
    respond_stream,
    respond_whole,
)
from stallwatch.simulator.engine import SimRequest

if TYPE_CHECKING:
    from stallwatch.simulator.host import OpenAiRouteHost


class OpenAiRoutes:
    """`/v1/models`, `/v1/completions` and `/v1/chat/completions`, in vLLM's wire format."""

    def __init__(self, server: OpenAiRouteHost) -> None:
        self.server = server
        self._rng = random.Random(server.config.seed)

    def add_routes(self, router: web.UrlDispatcher) -> None:
        flavour = self.server.flavour
        if flavour is None or flavour.serves_models:
            router.add_get("/v1/models", self.handle_models)
        router.add_post("/v1/completions", self.handle_completions)
        router.add_post("/v1/chat/completions", self.handle_chat_completions)

    async def handle_models(self, request: web.Request) -> web.Response:
        config = self.server.config
        flavour = self.server.flavour
        owner = "vllm" if flavour is None else flavour.models_owner or config.model
        body = model_list(config.model, config.max_model_len, int(self.server.clock()), owner)
        return web.json_response(body)

    async def handle_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve_generation(request, chat=False)

    async def handle_chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve_generation(request, chat=True)

    async def _serve_generation(self, http_request: web.Request, chat: bool) -> web.StreamResponse:
        server = self.server
        try:
            body = await http_request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            return error_response(f"Invalid JSON body: {error}", "BadRequestError", 400)
        if not isinstance(body, dict):
            return error_response("Request body must be a JSON object", "BadRequestError", 400)
        if server.flavour is not None:
            body.pop("model", None)  # only vLLM refuses a model name it does not serve
        generation = parse_generation(
            body, chat, model=server.config.model, max_model_len=server.config.max_model_len
        )
        if isinstance(generation, web.Response):
            return generation
        if server.unavailable():
            return error_response(ENGINE_DEAD_MESSAGE, "InternalServerError", 500)
        if server.flavour is not None:
            server.flavour.before_generation()
        if any(engine.sleep_level for engine in server.engines):
            return error_response(
                "The engine is sleeping; call /wake_up before sending requests.",
                "ServiceUnavailableError",
                503,
            )
        server.requests_total += 1
        server.completions_by_user_agent[http_request.headers.get("User-Agent", "")] += 1

        prefix = "chatcmpl" if chat else "cmpl"
        request = SimRequest(
            f"{prefix}-{uuid.uuid4().hex}",
            generation.prompt_tokens,
            generation.max_tokens,
            generation.ignore_eos,
            server.clock(),
        )
        meta = ResponseMeta(
            request.request_id,
            int(request.arrival),
            server.config.model,
            chat,
            generation.prompt_tokens,
        )
        async with server.submitted(request) as events:
            if generation.stream:
                return await respond_stream(
                    http_request, meta, events, self._words, generation.include_usage
                )
            return await respond_whole(meta, events, self._words)

    def _words(self, count: int) -> str:
        return "".join(" " + self._rng.choice(WORDS) for _ in range(count))
