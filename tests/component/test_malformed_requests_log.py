"""A flood of malformed HTTP requests is one throttled warning per address on both components'
ports, never aiohttp's ERROR traceback each; a handler's own failure is still logged in full."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from stallwatch.common.exporter_config import ExporterConfig
from stallwatch.core.address_throttle import AddressThrottle
from stallwatch.exporter.app import running_exporter
from stallwatch.localstack.processes import free_port
from stallwatch.net.gate import MalformedRequestLog
from stallwatch.restarter.app import serve
from tests.support.restarter import command_target, write_config

GARBAGE = (
    b"GET / HTTP/1.1\r\nHost: x\r\nno colon in this header\r\n\r\n",
    b"GET /\x00\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
)


async def _send_garbage(port: int, rounds: int) -> list[bytes]:
    """Send each malformed request `rounds` times, one connection each; the status lines."""
    statuses = []
    for _ in range(rounds):
        for request in GARBAGE:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            await writer.drain()
            statuses.append(await reader.readline())
            writer.close()
            await writer.wait_closed()
    return statuses


def _check_log(caplog: pytest.LogCaptureFixture, logger: str) -> None:
    tracebacks = [r for r in caplog.records if r.exc_info and r.exc_info[0] is not None]
    assert tracebacks == [], [r.getMessage() for r in tracebacks[:2]]
    lines = [r for r in caplog.records if "malformed HTTP request" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].name == logger
    assert lines[0].levelno == logging.WARNING
    assert lines[0].getMessage().startswith("malformed HTTP request from 127.0.0.1: 400 ")


async def test_the_exporter_logs_a_flood_of_malformed_requests_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """40 malformed requests to the exporter: each answered 400, one warning line, no traceback."""
    caplog.set_level(logging.DEBUG)
    async with running_exporter(
        ExporterConfig(targets=()), Path("unused.yml"), host="127.0.0.1", port=0
    ) as (_, url):
        statuses = await _send_garbage(int(url.rsplit(":", 1)[1]), 10)
    assert {status.split(b" ")[1] for status in statuses} == {b"400"}
    _check_log(caplog, "stallwatch.exporter")


async def test_the_restarter_logs_a_flood_of_malformed_requests_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """40 malformed requests to the restarter: each answered 400, one warning line, no
    traceback."""
    caplog.set_level(logging.DEBUG)
    port = free_port()
    config = write_config(
        tmp_path,
        [command_target("gpu1", "http://127.0.0.1:1/m", tmp_path / "m")],
        listen=f"127.0.0.1:{port}",
    )
    stop = asyncio.Event()
    task = asyncio.create_task(serve(config, stop=stop))
    try:
        for _ in range(600):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            break
        statuses = await _send_garbage(port, 10)
    finally:
        stop.set()
        await task
    assert {status.split(b" ")[1] for status in statuses} == {b"400"}
    _check_log(caplog, "stallwatch.restarter")


def test_each_address_is_logged_again_after_the_interval_with_the_count() -> None:
    """The second line for one address comes after the interval and says how many were not
    logged; another address has its own line; other errors pass through with their traceback."""
    target = logging.getLogger("stallwatch.test-malformed")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep()
    target.addHandler(keep)
    server = logging.getLogger("aiohttp.server")
    server.addHandler(keep)
    now = [1000.0]
    log = MalformedRequestLog(target, throttle=AddressThrottle(interval=60), clock=lambda: now[0])
    from aiohttp.http_exceptions import BadHttpMessage

    try:
        for address, at in (("10.0.0.1", 1000.0), ("10.0.0.1", 1010.0), ("10.0.0.1", 1020.0)):
            now[0] = at
            log.exception("Error handling request from %s", address, exc_info=BadHttpMessage("x"))
        now[0] = 1061.0
        log.exception("Error handling request from %s", "10.0.0.1", exc_info=BadHttpMessage("x"))
        log.exception("Error handling request from %s", "10.0.0.2", exc_info=BadHttpMessage("x"))
        log.exception("Unhandled exception", exc_info=RuntimeError("a bug"))
    finally:
        target.removeHandler(keep)
        server.removeHandler(keep)
    lines = [r.getMessage() for r in records if r.name == target.name]
    assert len(lines) == 3
    assert "(2 more from it not logged)" in lines[1]
    assert lines[2].startswith("malformed HTTP request from 10.0.0.2")
    passed = [r for r in records if r.name == "aiohttp.server"]
    assert [r.getMessage() for r in passed] == ["Unhandled exception"]
    assert passed[0].exc_info is not None
