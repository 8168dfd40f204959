"""A least-connection HTTP proxy in front of several backends (like a simple load balancer).

Every path is forwarded, so consecutive `/metrics` reads through it can come from different
backends, as with a real proxy. Responses are streamed through as they arrive.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Sequence

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
    """Picks the backend with the fewest requests in flight; ties go round-robin."""

    def __init__(self, backends: Sequence[str], timeout_seconds: float = 600.0) -> None:
        if not backends:
            raise ValueError("at least one backend is needed")
        self.backends = [b.rstrip("/") for b in backends]
        self.in_flight = dict.fromkeys(self.backends, 0)
        self.forwarded = dict.fromkeys(self.backends, 0)
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

    def pick(self) -> str:
        """The backend to use next."""
        fewest = min(self.in_flight.values())
        candidates = [b for b in self.backends if self.in_flight[b] == fewest]
        return candidates[next(self._turn) % len(candidates)]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        backend = self.pick()
        self.in_flight[backend] += 1
        self.forwarded[backend] += 1
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
            body = await request.read()
            try:
                async with self._session.request(
                    request.method,
                    backend + request.path_qs,
                    headers=headers,
                    data=body if body else None,
                    allow_redirects=False,
                ) as upstream:
                    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                    for key, value in upstream.headers.items():
                        if key.lower() not in HOP_BY_HOP:
                            response.headers.add(key, value)
                    await response.prepare(request)
                    async for chunk in upstream.content.iter_any():
                        await response.write(chunk)
                    await response.write_eof()
                    return response
            except (aiohttp.ClientError, TimeoutError) as error:
                return web.json_response(
                    {"error": f"backend {backend} failed: {error.__class__.__name__}"}, status=502
                )
        finally:
            self.in_flight[backend] -= 1


@contextlib.asynccontextmanager
async def running_proxy(
    backends: Sequence[str], host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[tuple[str, LeastConnectionProxy]]:
    """Run a proxy for the duration of the block; yields (base URL, proxy)."""
    proxy = LeastConnectionProxy(backends)
    runner = web.AppRunner(proxy.app, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = next(a for a in runner.addresses if isinstance(a, tuple))
    try:
        yield f"http://{host}:{bound[1]}", proxy
    finally:
        await runner.cleanup()
