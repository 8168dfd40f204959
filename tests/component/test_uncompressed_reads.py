"""Every read asks the server for its `/metrics` uncompressed.

The server is prometheus_client's own WSGI exposition (the code SGLang's `/metrics` runs, via its
ASGI twin), on loopback in a thread, wrapped to record the Content-Encoding of each answer it
gives: it compresses whenever the request offers gzip, as an HTTP client does by default.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.exposition import make_wsgi_app

from stallwatch.common.exporter_config import TargetConfig
from stallwatch.exporter.poll import poll_once
from stallwatch.net.fetch import read_metrics

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No line on stderr per request."""


def recording(app: WsgiApp, encodings: list[str]) -> WsgiApp:
    """`app`, noting each answer's Content-Encoding ('' for none)."""

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        def start(status: str, headers: list[tuple[str, str]], *rest: Any) -> Any:
            found = [v for k, v in headers if k.lower() == "content-encoding"]
            encodings.append(found[0] if found else "")
            return start_response(status, headers, *rest)

        return app(environ, start)

    return wrapped


@contextmanager
def prometheus_client_server(encodings: list[str]) -> Iterator[str]:
    """A vLLM-named gauge served by prometheus_client's exposition; yields its base URL."""
    registry = CollectorRegistry()
    running = Gauge("vllm:num_requests_running", "Running.", ["model_name"], registry=registry)
    running.labels("m").set(0)
    Gauge("vllm:num_requests_waiting", "Waiting.", ["model_name"], registry=registry).labels(
        "m"
    ).set(0)
    server = make_server(
        "127.0.0.1", 0, recording(make_wsgi_app(registry), encodings), handler_class=Quiet
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_a_default_client_gets_gzip_from_prometheus_client() -> None:
    """The server compresses for a client that offers gzip (aiohttp's default headers)."""
    encodings: list[str] = []

    async def read(url: str) -> bytes:
        async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as answer:
            return await answer.read()

    with prometheus_client_server(encodings) as url:
        body = asyncio.run(read(url))
    assert b"vllm:num_requests_running" in body
    assert encodings == ["gzip"]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_the_exporters_and_the_restarters_reads_ask_for_no_compression(host: str) -> None:
    """read_metrics (the restarter's confirmation) and a whole poll get the payload as is, read
    plainly (an address) or through aiohttp (a name)."""
    encodings: list[str] = []

    async def reads(url: str) -> None:
        async with aiohttp.ClientSession() as session:
            read = await read_metrics(session, url + "/metrics", timeout=5.0)
            assert read.reading is not None
            target = TargetConfig(name="t", url=url, kind="vllm", timeout_seconds=5.0)
            outcome = await poll_once(session, target, None, max_payload_bytes=1 << 20)
            assert outcome.reading is not None

    with prometheus_client_server(encodings) as url:
        asyncio.run(reads(url.replace("127.0.0.1", host)))
    assert encodings
    assert set(encodings) == {""}
