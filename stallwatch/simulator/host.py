"""What the engine flavours, the routes and the faults use of the simulated server they serve.

`simulator.server.SimServer` builds all three and hands itself to them; they see it only
through these Protocols, so none of them imports the server module.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from stallwatch.simulator.api import RequestFailed
from stallwatch.simulator.config import SimConfig
from stallwatch.simulator.engine import Engine, SimRequest, TokenEvent


class FlavourHost(Protocol):
    """What an engine flavour (`simulator.engines`) uses of its server."""

    @property
    def config(self) -> SimConfig: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def engines(self) -> list[Engine]: ...

    def unavailable(self) -> bool: ...

    def in_flight_count(self) -> int: ...

    async def generate(
        self, prompt_tokens: int, max_tokens: int, ignore_eos: bool, user_agent: str | None
    ) -> int: ...


class ServedFace(Protocol):
    """What the OpenAI routes use of the server's flavour, when it is not vLLM."""

    @property
    def serves_models(self) -> bool: ...

    @property
    def models_owner(self) -> str: ...

    def before_generation(self) -> None: ...


class VllmRouteHost(Protocol):
    """What vLLM's own endpoints (`simulator.vllm_routes`) use of the server."""

    @property
    def config(self) -> SimConfig: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def engines(self) -> list[Engine]: ...

    @property
    def engine_status(self) -> str: ...

    def unavailable(self) -> bool: ...

    def in_flight_count(self) -> int: ...

    def render_metrics(self) -> str: ...


class OpenAiRouteHost(Protocol):
    """What the OpenAI-compatible endpoints (`simulator.openai_routes`) use of the server."""

    requests_total: int

    @property
    def config(self) -> SimConfig: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def engines(self) -> list[Engine]: ...

    @property
    def flavour(self) -> ServedFace | None: ...

    @property
    def completions_by_user_agent(self) -> Counter[str]: ...

    def unavailable(self) -> bool: ...

    def submitted(
        self, request: SimRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[TokenEvent]]: ...


class FaultHost(Protocol):
    """What injecting a fault (`simulator.faults`) reads and changes of the server."""

    hung: bool
    dead: bool
    fault: str | None
    engine_status: str
    down_until: float

    @property
    def config(self) -> SimConfig: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def engines(self) -> list[Engine]: ...

    @property
    def api_answers(self) -> asyncio.Event: ...

    def boot(self) -> None: ...

    def freeze(self) -> None: ...

    def thaw(self) -> None: ...

    def fail_all(self, failure: RequestFailed) -> None: ...

    def in_background(self, coroutine: Coroutine[Any, Any, None]) -> None: ...

    async def close_socket(self) -> None: ...

    async def close_port_for(self, seconds: float) -> None: ...
