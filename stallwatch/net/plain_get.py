"""One GET over plain HTTP to a server addressed by its IP: the exporter's read of `/metrics`.

The read every poll makes, at every target, every interval, is one GET on a new connection (a
server closes an idle one within seconds: uvicorn after 5 s, against reads 15 s apart). Through
aiohttp's client that read costs more of the exporter's CPU than parsing and judging what it
reads: a request object, a response object, a connector, a pool, timers, a stream. Here it is
one protocol object, one write and the bytes fed to `http_answer.AnswerParser` as they arrive.

It takes only what it can do plainly: `http://` to an IP address (Prometheus' service
discovery names pods and nodes by address). A name to resolve, `https://`, or a URL this
module would have to re-encode goes through aiohttp (`plain_request` says None).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

from stallwatch.net.http_answer import Answer, AnswerParser, MalformedAnswer

# What may stand in a request's target as sent (RFC 3986's characters, already encoded).
_SAFE_TARGET = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~:/?#[]@!$&'()*+,;=%"
)


@dataclass(frozen=True)
class PlainRequest:
    """Where to connect and the request's bytes, ready to write."""

    host: str
    port: int
    request: bytes


class ConnectTimeout(TimeoutError):
    """Not connected within the connect timeout."""


@functools.lru_cache(maxsize=16384)
def plain_request(url: str, header_lines: tuple[tuple[str, str], ...]) -> PlainRequest | None:
    """The GET of `url` with these headers, or None when it is not a plain one (see above)."""
    try:
        parts = urlsplit(url)
        port = parts.port
        host = parts.hostname
    except ValueError:
        return None
    if parts.scheme != "http" or host is None or parts.username is not None:
        return None
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not set(target) <= _SAFE_TARGET or "#" in target:
        return None
    lines = [f"GET {target} HTTP/1.1", f"Host: {parts.netloc}"]
    lines += [f"{name}: {value}" for name, value in header_lines]
    lines.append("Connection: close")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return PlainRequest(host, port if port is not None else 80, request)


class _Get(asyncio.Protocol):
    def __init__(self, request: bytes, parser: AnswerParser, done: asyncio.Future[Answer]) -> None:
        self._request = request
        self._parser = parser
        self._done = done
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not subclasses of asyncio.Transport).
        self._transport = cast(asyncio.Transport, transport)
        self._transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        if self._done.done():
            return
        try:
            complete = self._parser.feed(data)
        except MalformedAnswer as error:
            self._settle(error)
            return
        if complete:
            assert self._parser.answer is not None
            self._settle(self._parser.answer)

    def eof_received(self) -> bool:
        self._closed(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed(exc)

    def _closed(self, exc: Exception | None) -> None:
        if self._done.done():
            return
        if exc is not None:
            self._settle(exc)
            return
        try:
            self._settle(self._parser.closed())
        except MalformedAnswer as error:
            self._settle(error)

    def _settle(self, result: Answer | Exception) -> None:
        if not self._done.done():
            if isinstance(result, Exception):
                self._done.set_exception(result)
            else:
                self._done.set_result(result)
        if self._transport is not None:
            self._transport.close()


async def plain_get(
    request: PlainRequest, *, timeout: float, connect_timeout: float, max_body_bytes: int
) -> Answer:
    """Send `request` on a new connection and read the whole answer.

    Raises `ConnectTimeout` when not connected within `connect_timeout`, `TimeoutError` when
    the answer is not complete within `timeout` (from the start), `OSError` when the connection
    fails or is lost, `MalformedAnswer` for bytes that are no HTTP answer.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Answer] = loop.create_future()
    started = loop.time()
    transport: asyncio.BaseTransport | None = None
    try:
        async with asyncio.timeout(started + connect_timeout) as deadline:
            transport, _ = await loop.create_connection(
                lambda: _Get(request.request, AnswerParser(max_body_bytes), done),
                request.host,
                request.port,
            )
            deadline.reschedule(started + timeout)
            return await done
    except TimeoutError:
        if transport is None:
            raise ConnectTimeout() from None
        raise
    finally:
        if not done.done():
            done.cancel()  # what the connection does after this is no one's answer
        if transport is not None:
            transport.close()
