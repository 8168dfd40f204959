"""The restarter's port against slow, silent and vanishing clients (the real `serve`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from stallwatch.localstack.processes import free_port
from stallwatch.net import gate
from stallwatch.restarter import app as restarter_app
from tests.support.restarter import (
    AUTH,
    alert,
    fake_vllm,
    marker_argv,
    payload,
    target_entry,
    write_config,
)


@contextlib.asynccontextmanager
async def served(tmp_path: Path, metrics_url: str) -> AsyncIterator[str]:
    """The restarter's `serve` on a loopback port; yields its base URL; stopped afterwards."""
    port = free_port()
    config = write_config(
        tmp_path,
        [
            target_entry(
                "gpu1", metrics_url, {"kind": "command", "argv": marker_argv(tmp_path / "m")}
            )
        ],
        listen=f"127.0.0.1:{port}",
    )
    stop = asyncio.Event()
    task = asyncio.create_task(restarter_app.serve(config, stop=stop))
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{base}/-/healthy") as response:
                    if response.status == 200:
                        break
            await asyncio.sleep(0.05)
    try:
        yield base
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    return await asyncio.wait_for(reader.read(), 30)


async def connect(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    port = int(base.rsplit(":", 1)[1])
    return await asyncio.open_connection("127.0.0.1", port)


async def metrics_text(base: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"{base}/metrics") as response:
        return await response.text()


async def test_silent_and_half_sent_connections_are_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection that sends nothing, or half its headers, is closed by the server."""
    monkeypatch.setattr(gate, "HEADER_READ_TIMEOUT_SECONDS", 0.3)
    async with fake_vllm("stalled") as fake, served(tmp_path, fake.url) as base:
        silent = await connect(base)
        half = await connect(base)
        half[1].write(b"POST /alerts HTTP/1.1\r\nHost: restarter\r\nContent-Le")
        assert await closed_by_server(silent[0]) == b""
        assert await closed_by_server(half[0]) == b""
        for _, writer in (silent, half):
            writer.close()


async def test_connections_beyond_the_cap_are_refused_and_real_webhooks_still_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the per-address cap a new connection gets 503 and is closed; once the idle ones
    are gone a real webhook is served."""
    monkeypatch.setattr(gate, "MAX_CONNECTIONS_PER_ADDRESS", 3)
    async with fake_vllm("stalled") as fake, served(tmp_path, fake.url) as base:
        idle = [await connect(base) for _ in range(3)]
        refused_reader, refused_writer = await connect(base)
        assert (await closed_by_server(refused_reader)).startswith(b"HTTP/1.1 503")
        refused_writer.close()
        for _, writer in idle:
            writer.close()
            await writer.wait_closed()
        body = payload(alert("gpu9"))
        async with aiohttp.ClientSession() as session:
            for _ in range(100):  # the server sees the closes a moment later
                async with session.post(f"{base}/alerts", json=body, headers=AUTH) as response:
                    if response.status != 503:
                        break
                await asyncio.sleep(0.05)
            assert response.status == 200


async def test_a_body_that_never_finishes_gets_408(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Headers promising 1 000 bytes and then 10 of them: 408, not a connection held open."""
    monkeypatch.setattr(restarter_app, "BODY_READ_TIMEOUT_SECONDS", 0.3)
    async with fake_vllm("stalled") as fake, served(tmp_path, fake.url) as base:
        reader, writer = await connect(base)
        writer.write(
            b"POST /alerts HTTP/1.1\r\nHost: r\r\nAuthorization: "
            + AUTH["Authorization"].encode()
            + b'\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"versio'
        )
        answer = await closed_by_server(reader)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer


async def test_a_client_gone_mid_body_is_not_a_server_error(tmp_path: Path) -> None:
    """A client that disconnects mid-body is counted as 499 (client closed), never as 500."""
    async with fake_vllm("stalled") as fake, served(tmp_path, fake.url) as base:
        _reader, writer = await connect(base)
        writer.write(
            b"POST /alerts HTTP/1.1\r\nHost: r\r\nAuthorization: "
            + AUTH["Authorization"].encode()
            + b"\r\nContent-Length: 1000\r\n\r\n"
            + json.dumps({"version": "4"}).encode()
        )
        await writer.drain()
        await asyncio.sleep(0.2)  # let the handler start reading the body
        writer.close()
        for _ in range(100):
            text = await metrics_text(base)
            if "webhook_requests_total{" in text:
                break
            await asyncio.sleep(0.05)
    assert 'webhook_requests_total{code="499"} 1.0' in text
    assert 'code="500"' not in text
