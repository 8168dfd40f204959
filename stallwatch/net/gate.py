"""Admit connections to a listening port (the restarter's, the exporter's): a cap on how many,
a deadline for the headers, and one throttled line for a malformed request.

An unauthenticated client can open connections and send nothing, or half a request; each
holds a file descriptor. The gate refuses connections beyond a total and a per-address cap
(with a 503, so a real sender backs off and retries) and closes a connection whose first
request's headers have not all arrived in time. Between requests on a kept-alive connection
aiohttp's own keep-alive timer does the same. The exporter's own polls need descriptors too:
its cap is half the process's open-files limit (`cap_for_open_files`), so connections piling
up on its port cannot take the ones its polls open.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.log import server_logger

from stallwatch.common.config import quoted
from stallwatch.core.address_throttle import AddressThrottle

# The restarter's caps. Well below the usual limit of 1 024 open files, which the journal and
# actions share.
MAX_CONNECTIONS = 256
# Alertmanager needs a few connections per instance; one address cannot take all the room.
MAX_CONNECTIONS_PER_ADDRESS = 32
# The exporter's cap never goes below this, whatever the open-files limit says.
MIN_CONNECTIONS = 64
HEADER_READ_TIMEOUT_SECONDS = 10.0
IDLE_KEEPALIVE_SECONDS = 15.0
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 5\r\n"
    b"Connection: close\r\n\r\n"
)


class RequestsSeen:
    """The connections (by transport) that have sent the headers of at least one request."""

    def __init__(self) -> None:
        self.transports: weakref.WeakSet[asyncio.BaseTransport] = weakref.WeakSet()

    @web.middleware
    async def middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        if request.transport is not None:
            self.transports.add(request.transport)
        return await handler(request)


def _address(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)


def cap_for_open_files(limit: int | None = None) -> int:
    """Half the open-files limit (`limit`, or the process's soft RLIMIT_NOFILE), at least
    MIN_CONNECTIONS: the other half stays for outgoing connections and files."""
    if limit is None:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = soft if soft != resource.RLIM_INFINITY else 1 << 20
    return max(MIN_CONNECTIONS, limit // 2)


class ConnectionGate:
    """A protocol factory for `loop.create_server` in front of aiohttp's own."""

    def __init__(
        self,
        server: web.Server,
        seen: RequestsSeen,
        *,
        max_connections: int | None = None,
        max_per_address: int | None = None,
    ) -> None:
        """Without caps, the restarter's (MAX_CONNECTIONS, MAX_CONNECTIONS_PER_ADDRESS)."""
        self._server = server
        self._seen = seen
        self.max_connections = max_connections or MAX_CONNECTIONS
        self.max_per_address = max_per_address or MAX_CONNECTIONS_PER_ADDRESS
        self.refused = 0

    def protocol(self) -> asyncio.Protocol:
        return _Gatekeeper(self)

    def admits(self, address: str) -> bool:
        open_now = [h.transport for h in self._server.connections if h.transport is not None]
        if len(open_now) >= self.max_connections:
            return False
        if self.max_per_address >= self.max_connections:
            return True
        same = sum(1 for transport in open_now if _address(transport) == address)
        return same < self.max_per_address

    def hand_over(self, transport: asyncio.Transport) -> None:
        handler = self._server()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        loop = asyncio.get_running_loop()
        loop.call_later(HEADER_READ_TIMEOUT_SECONDS, self._expire, transport)

    def _expire(self, transport: asyncio.Transport) -> None:
        if transport not in self._seen.transports and not transport.is_closing():
            transport.close()


class _Gatekeeper(asyncio.Protocol):
    def __init__(self, gate: ConnectionGate) -> None:
        self._gate = gate

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's are not subclasses of asyncio.Transport.
        transport = cast(asyncio.Transport, base)
        if self._gate.admits(_address(transport)):
            self._gate.hand_over(transport)
            return
        self._gate.refused += 1
        transport.write(_BUSY)
        transport.close()


class MalformedRequestLog(logging.Logger):
    """aiohttp's server logger for one port (`web.AppRunner(..., logger=...)`).

    aiohttp logs every request it cannot parse as an ERROR with a traceback: one client sending
    garbage could write hundreds a second. Here such a request is one warning on `log`, at most
    one per client address a minute (AddressThrottle) with how many were not logged, and
    never a traceback. Everything else aiohttp's server logs (a handler's own failure) goes to
    its usual logger unchanged.
    """

    def __init__(
        self,
        log: logging.Logger,
        *,
        throttle: AddressThrottle | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(server_logger.name)
        self._warn_to = log
        self._throttle = throttle if throttle is not None else AddressThrottle()
        self._clock = clock

    def isEnabledFor(self, level: int) -> bool:
        return server_logger.isEnabledFor(level)

    def handle(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            server_logger.handle(record)
            return
        if record.levelno < logging.WARNING:  # aiohttp's own debug line for a non-HTTP client
            return
        client = str(record.args[0]) if isinstance(record.args, tuple) and record.args else "?"
        unlogged = self._throttle.failure(client, self._clock())
        if unlogged is None:
            return
        more = f" ({unlogged} more from it not logged)" if unlogged else ""
        self._warn_to.warning(
            "malformed HTTP request from %s: %d %s%s; at most one line a minute per address",
            client,
            error.code,
            quoted(" ".join(str(error.message).split())),
            more,
        )
