"""Idle connections piling up on the exporter's port, under a low open-files limit: its own
polls keep their file descriptors (a real exporter process, a real server, loopback only)."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import sys
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from stallwatch.localstack.processes import free_port
from stallwatch.simulator.testing import running_simulator

# The exporter process runs with this soft limit of open files; more idle connections than
# that are opened to its port (systemd's default is 1 024, with 1 100 connections).
OPEN_FILES = 256
IDLE_CONNECTIONS = 400
FLOOD_SECONDS = 3.0
# The target's polls: a read has a second (a connection half of it), far above a loopback read
# on a loaded machine, so that a poll that fails to connect is the open-files limit's doing.
INTERVAL_SECONDS = 1.0


def low_open_files() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, hard))


def poll_counts(text: str) -> tuple[float, float]:
    """The target's polls, and its poll errors that a lack of file descriptors gives (every
    reason but a read's timeout: a lack of descriptors fails a read at once, never times it
    out)."""
    polls = errors = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "stallwatch_polls_total":
                polls += sample.value
            elif (
                sample.name == "stallwatch_poll_errors_total"
                and sample.labels.get("reason") != "timeout"
            ):
                errors += sample.value
    return polls, errors


async def scrape(url: str) -> str:
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"{url}/metrics") as response,
    ):
        assert response.status == 200
        return await response.text()


async def test_idle_connections_beyond_the_open_files_limit_leave_polls_working(
    tmp_path: Path,
) -> None:
    """400 idle connections to an exporter limited to 256 open files: the excess is refused at
    the door and no poll of its target meanwhile fails to connect (none fails with EMFILE)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "exporter.yml"
    interval = f"{INTERVAL_SECONDS:g}s"
    async with running_simulator() as sim:
        config.write_text(
            f"listen: 127.0.0.1:{port}\ninterval: {interval}\ntimeout: {interval}\n"
            f"test_request: {{enabled: false}}\ntargets:\n  - name: healthy\n    url: {sim.url}\n"
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "stallwatch", "exporter", "--config", str(config),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            preexec_fn=low_open_files,
        )  # fmt: skip
        idle: list[asyncio.StreamWriter] = []
        try:
            assert process.stdout is not None
            await asyncio.wait_for(process.stdout.readline(), 20)
            polls_before, errors_before = poll_counts(await scrape(url))
            for _ in range(IDLE_CONNECTIONS):
                with contextlib.suppress(OSError, TimeoutError):
                    opening = asyncio.open_connection("127.0.0.1", port)
                    _reader, writer = await asyncio.wait_for(opening, 2)
                    idle.append(writer)
            await asyncio.sleep(FLOOD_SECONDS)
            for writer in idle:
                writer.close()
            idle.clear()
            await asyncio.sleep(0.5)
            polls_after, errors_after = poll_counts(await scrape(url))
        finally:
            for writer in idle:
                writer.close()
            process.terminate()
            _, stderr = await asyncio.wait_for(process.communicate(), 20)
    assert errors_after == errors_before, stderr.decode()[-2000:]
    assert polls_after - polls_before >= FLOOD_SECONDS / INTERVAL_SECONDS / 2  # polls went on
    assert "Too many open files" not in stderr.decode()
