"""A least-connection HTTP proxy in front of several backends (like a simple load balancer).

Every path is forwarded, so consecutive `/metrics` reads through it can come from different
backends, as with a real proxy. Responses are streamed through as they arrive. A backend that
refuses the connection is skipped for a short while and the request goes to another one; when
none accepts it, the answer is a 502 with a JSON error.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence

import aiohttp
from aiohttp import web

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


class LeastConnectionProxy:
    """Picks the backend with the fewest requests in flight; ties go round-robin.

    A backend that refuses or drops the connection before answering is marked as failing for
    `failure_backoff_seconds` and the request is sent again (same body) to another backend, as
    a proxy with passive health checks does. Once a response has started, nothing is retried.
    """

    def __init__(
        self,
        backends: Sequence[str],
        timeout_seconds: float = 600.0,
        failure_backoff_seconds: float = 1.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not backends:
            raise ValueError("at least one backend is needed")
        self.backends = [b.rstrip("/") for b in backends]
        self.in_flight = dict.fromkeys(self.backends, 0)
        self.forwarded = dict.fromkeys(self.backends, 0)
        self.connect_failures = dict.fromkeys(self.backends, 0)
        self.failure_backoff_seconds = failure_backoff_seconds
        self._failing_until = dict.fromkeys(self.backends, float("-inf"))
        self._clock = clock
        self._turn = itertools.count()
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None
        self.app = web.Application()
        self.app.router.add_route("*", "/{path:.*}", self.handle)
        self.app.cleanup_ctx.append(self._session_ctx)

    async def _session_ctx(self, app: web.Application) -> AsyncIterator[None]:
        self._session = aiohttp.ClientSession(timeout=self._timeout, auto_decompress=False)
        yield
        await self._session.close()

    def failing(self, backend: str) -> bool:
        """Whether `backend` failed to connect within the last `failure_backoff_seconds`."""
        return self._clock() < self._failing_until[backend]

    def pick(self, exclude: Collection[str] = ()) -> str:
        """The backend to use next, not one of `exclude`; failing backends only as a last resort."""
        candidates = [b for b in self.backends if b not in exclude]
        if not candidates:
            raise LookupError("every backend is excluded")
        pool = [b for b in candidates if not self.failing(b)] or candidates
        fewest = min(self.in_flight[b] for b in pool)
        tied = [b for b in pool if self.in_flight[b] == fewest]
        return tied[next(self._turn) % len(tied)]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await request.read()  # read once, so it can be sent again to another backend
        refused: list[str] = []
        while len(refused) < len(self.backends):
            backend = self.pick(exclude=refused)
            self.in_flight[backend] += 1
            try:
                return await self._forward(request, backend, headers, body)
            except _NotConnected as error:
                refused.append(f"{backend} ({error.cause.__class__.__name__})")
                self.connect_failures[backend] += 1
                self._failing_until[backend] = self._clock() + self.failure_backoff_seconds
            except (aiohttp.ClientError, TimeoutError) as error:
                # The backend may be working on the request: sending it again could run it twice.
                return _bad_gateway(f"backend {backend} failed: {error.__class__.__name__}")
            finally:
                self.in_flight[backend] -= 1
        return _bad_gateway("no backend accepted the connection: " + ", ".join(refused))

    async def _forward(
        self, request: web.Request, backend: str, headers: dict[str, str], body: bytes
    ) -> web.StreamResponse:
        assert self._session is not None
        try:
            upstream = await self._session.request(
                request.method,
                backend + request.path_qs,
                headers=headers,
                data=body if body else None,
                allow_redirects=False,
            )
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as error:
            # Refused, reset or closed before any response: safe to send elsewhere.
            raise _NotConnected(error) from error
        self.forwarded[backend] += 1
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    response.headers.add(key, value)
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except (aiohttp.ClientError, TimeoutError) as error:
                # The response has started: it cannot become a 502 any more, so the client's
                # connection breaks as the backend's did.
                raise ConnectionResetError(f"backend {backend} broke off its response") from error
            await response.write_eof()
            return response


class _NotConnected(Exception):
    """The backend refused or dropped the connection before sending any response."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _bad_gateway(message: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "BadGateway", "param": None, "code": 502}},
        status=502,
    )


@contextlib.asynccontextmanager
async def running_proxy(
    backends: Sequence[str],
    host: str = "127.0.0.1",
    port: int = 0,
    failure_backoff_seconds: float = 1.5,
) -> AsyncIterator[tuple[str, LeastConnectionProxy]]:
    """Run a proxy for the duration of the block; yields (base URL, proxy)."""
    proxy = LeastConnectionProxy(backends, failure_backoff_seconds=failure_backoff_seconds)
    # handler_cancellation: a client that goes away closes the backend connection too, so the
    # backend aborts the request, as behind a real proxy.
    runner = web.AppRunner(proxy.app, shutdown_timeout=2.0, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = next(a for a in runner.addresses if isinstance(a, tuple))
    try:
        yield f"http://{host}:{bound[1]}", proxy
    finally:
        await runner.cleanup()
