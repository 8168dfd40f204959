"""The read of `/metrics` over plain HTTP (`net.plain_get`), against real servers on loopback.

Servers that answer well (aiohttp, the captured real vLLM payload) and servers that do not (a
raw asyncio server writing exactly the bytes a test gives it): the plain read and aiohttp's
client, reading the same server, give the same result; what the plain read cannot take goes
through aiohttp.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest

from stallwatch.core.reads import ReadResult
from stallwatch.net.fetch import IDENTITY_HEADERS, read_metrics
from stallwatch.net.plain_get import plain_request
from tests.support.exporter import big_metrics_server
from tests.support.real_payloads import real_payload

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[int]:
    """A loopback TCP server running `handler` per connection; yields its port."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


def answering(data: bytes, *, then_hang: bool = False) -> Handler:
    """A handler that reads the request's head, writes `data`, then closes (or hangs)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(data)
            await writer.drain()
            if then_hang:
                await asyncio.sleep(30)
        finally:
            writer.close()

    return handle


async def read(url: str, *, timeout: float = 5.0, max_bytes: int = 1 << 20) -> ReadResult:
    async with aiohttp.ClientSession() as session:
        return await read_metrics(session, url, timeout=timeout, max_bytes=max_bytes, kind="vllm")


def test_plain_and_aiohttp_reads_of_one_server_give_the_same_reading() -> None:
    """The real vLLM payload read plainly (by address) and through aiohttp (by name) gives the
    same reading; the plain request asks for the payload as it is and closes the connection."""
    payload = real_payload("vllm-0.32.0-cpu-chunked-prefill-2.txt").encode()

    async def both() -> tuple[ReadResult, ReadResult, list[dict[str, str]]]:
        seen: list[dict[str, str]] = []
        async with big_metrics_server(payload, seen) as url:
            plain = await read(f"{url}/metrics")
            through = await read(f"{url.replace('127.0.0.1', 'localhost')}/metrics")
            return plain, through, seen

    plain, through, seen = asyncio.run(both())
    assert plain.reading is not None
    assert through.reading is not None
    assert plain.payload_bytes == through.payload_bytes == len(payload)
    assert plain.reading.engines == through.reading.engines
    assert seen[0]["accept-encoding"] == "identity"
    assert seen[0]["connection"] == "close"
    assert seen[0]["host"].startswith("127.0.0.1:")


@pytest.mark.parametrize(
    ("url", "plain"),
    [
        ("http://127.0.0.1:8000/metrics", True),
        ("http://[::1]:8000/metrics", True),
        ("http://10.0.0.7/metrics?name=vllm%3Arunning", True),
        ("http://localhost:8000/metrics", False),
        ("https://127.0.0.1:8000/metrics", False),
        ("http://user:secret@127.0.0.1:8000/metrics", False),
        ("http://127.0.0.1:8000/met rics", False),
        ("http://127.0.0.1:99999/metrics", False),
    ],
)
def test_only_plain_http_to_an_address_takes_the_plain_read(url: str, plain: bool) -> None:
    """A name to resolve, TLS, credentials or a target needing encoding go through aiohttp."""
    request = plain_request(url, IDENTITY_HEADERS)
    assert (request is not None) is plain
    if request is not None:
        assert request.request.startswith(b"GET /metrics")
        assert b"\r\nConnection: close\r\n\r\n" in request.request


@pytest.mark.parametrize(
    ("answer", "reason", "says"),
    [
        (
            b"HTTP/1.1 301 Moved\r\nLocation: http://elsewhere/metrics\r\n"
            b"Content-Length: 0\r\n\r\n",
            "http_status",
            "HTTP 301 redirect to http://elsewhere/metrics, not followed",
        ),
        (b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy", "http_status", "HTTP 503"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 900\r\n\r\nvllm:", "connection", "body ended"),
        (b"not http at all\r\n\r\n", "connection", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5000000\r\n\r\n", "too_large", "larger than"),
    ],
)
def test_a_misbehaving_server_gives_a_failed_read_that_says_why(
    answer: bytes, reason: str, says: str
) -> None:
    """Redirects, errors, a body cut short, bytes that are not HTTP, an oversized body: each a
    failed read with its reason, never an exception."""

    async def go() -> ReadResult:
        async with raw_server(answering(answer)) as port:
            return await read(f"http://127.0.0.1:{port}/metrics")

    result = asyncio.run(go())
    assert result.reading is None
    assert result.error_reason == reason
    assert says in result.detail


def test_a_chunked_answer_and_one_ended_by_closing_are_read_whole() -> None:
    """Bodies framed by chunks or by the server closing are read as the whole payload."""
    payload = real_payload("vllm-0.32.0-cpu-chunked-prefill-2.txt").encode()
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(payload[i : i + 4000]), payload[i : i + 4000])
        for i in range(0, len(payload), 4000)
    )
    by_chunks = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    by_close = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + payload

    async def go() -> list[ReadResult]:
        results = []
        for answer in (by_chunks, by_close):
            async with raw_server(answering(answer)) as port:
                results.append(await read(f"http://127.0.0.1:{port}/metrics"))
        return results

    for result in asyncio.run(go()):
        assert result.reading is not None, result.detail
        assert result.payload_bytes == len(payload)


def test_a_server_that_stops_mid_answer_is_a_timeout_and_one_not_listening_is_down() -> None:
    """Connected and no whole answer in time: `timeout` (hung) within the read's bound; a port
    nobody listens on: `connection` (down)."""

    async def go() -> tuple[ReadResult, float, ReadResult]:
        half = b"HTTP/1.1 200 OK\r\nContent-Length: 900\r\n\r\nvllm:"
        async with raw_server(answering(half, then_hang=True)) as port:
            started = asyncio.get_running_loop().time()
            hung = await read(f"http://127.0.0.1:{port}/metrics", timeout=1.0)
            took = asyncio.get_running_loop().time() - started
        async with raw_server(answering(b"")) as port:
            pass  # closed: nothing listens on it now
        down = await read(f"http://127.0.0.1:{port}/metrics", timeout=1.0)
        return hung, took, down

    hung, took, down = asyncio.run(go())
    assert hung.error_reason == "timeout"
    assert "connected, no answer within 1 s" in hung.detail
    assert 0.9 <= took < 5.0
    assert down.error_reason == "connection"
    assert "ConnectionRefusedError" in down.detail
