"""`stallwatch exporter --workers 2` as a user runs it: one address, two worker processes, each
target's history in one of them, `/metrics` of both, a dead worker started again, reloads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.support.bounded import terminate
from tests.support.probe import value

REPO = Path(__file__).resolve().parents[2]
PAYLOAD = sorted((REPO / "tests" / "testdata" / "real-metrics").glob("vllm-*.txt"))[0]
MODULE = {"allow": ["127.0.0.1"], "interval": "1s", "timeout": "1s"}
FAST = {"interval": "500ms", "timeout": "500ms"}
# Enough new connections that each worker accepts some: the kernel hands each to either.
MAX_SCRAPES = 400

pytestmark = pytest.mark.timeout(120)


@contextlib.asynccontextmanager
async def counting_server() -> AsyncIterator[tuple[str, list[int]]]:
    """A server answering a real vLLM payload on /metrics; yields its address and [reads]."""
    reads = [0]
    body = PAYLOAD.read_bytes()

    async def metrics(_: web.Request) -> web.Response:
        reads[0] += 1
        return web.Response(body=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert isinstance(server, asyncio.base_events.Server)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{port}", reads
    finally:
        await runner.cleanup()


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@contextlib.contextmanager
def exporter_with_workers(config_path: Path, workers: int = 2) -> Iterator[tuple[int, str]]:
    """`stallwatch exporter --workers N` on a free port; yields its pid and base URL; stops
    it and checks that its workers went with it."""
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "stallwatch", "exporter", "--config", str(config_path)),
            *(f"--workers={workers}", "--log.level=warning"),
        ],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )
    worker_pids: list[int] = []
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening on "), line
        worker_pids = children(process.pid)
        assert len(worker_pids) == workers
        yield process.pid, line.split()[-1]
    finally:
        terminate(process)
        for pid in children(process.pid) + worker_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def write_config(path: Path, modules: dict[str, object]) -> Path:
    path.write_text(json.dumps({"listen": "127.0.0.1:0", "modules": modules}))
    return path


async def scrape(url: str, path: str) -> tuple[int, str]:
    """One GET on a new connection: the kernel gives it to either worker."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(url + path) as response,
    ):
        return response.status, await response.text()


async def post_reload(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.post(url + "/-/reload") as response:
        return response.status


async def metrics(url: str) -> str:
    status, text = await scrape(url, "/metrics")
    assert status == 200
    return text


async def test_a_target_scraped_through_both_workers_has_one_history_and_one_read_a_interval(
    tmp_path: Path,
) -> None:
    """Scrapes land on both workers (some handed to the owner, some not); every answer comes
    from one history, and the server is read once per interval, never twice."""
    config = write_config(tmp_path / "exporter.yml", {"vllm": MODULE})
    async with counting_server() as (address, reads):
        with exporter_with_workers(config) as (_, url):
            polls_seen: list[float] = []
            handed_over = 0.0
            for scraped in range(1, MAX_SCRAPES + 1):
                status, body = await scrape(url, f"/probe?module=vllm&target={address}")
                assert status == 200, body
                polls = value(body, "stallwatch_polls_total", target=address)
                assert polls is not None
                polls_seen.append(polls)
                await asyncio.sleep(0.01)
                if scraped % 20 == 0:
                    handed_over = (
                        value(await metrics(url), "stallwatch_exporter_probes_handed_over_total")
                        or 0.0
                    )
                    if 0 < handed_over < scraped and len(set(polls_seen)) >= 3:
                        break
            final = await metrics(url)
    assert 0 < handed_over < len(polls_seen), "both workers answered some scrapes"
    assert polls_seen == sorted(polls_seen), "one history: its poll count never goes back"
    assert reads[0] == max(polls_seen) == value(final, "stallwatch_probe_reads_total")
    assert value(final, "stallwatch_probe_targets", module="vllm") == 1.0
    assert value(final, "stallwatch_exporter_workers_answering") == 2.0


async def test_refusals_on_either_worker_are_counted_once_in_metrics(tmp_path: Path) -> None:
    """Refused `/probe`s, whichever worker receives them, add up exactly in `/metrics`."""
    config = write_config(tmp_path / "exporter.yml", {"vllm": MODULE})
    with exporter_with_workers(config) as (_, url):
        for n in range(30):
            status, _ = await scrape(url, f"/probe?module=vllm&target=10.0.0.{n}:8000")
            assert status == 400
        for _ in range(5):
            status, _ = await scrape(url, "/probe?module=nope&target=127.0.0.1:1")
            assert status == 400
        text = await metrics(url)
    assert value(text, "stallwatch_probe_refused_total", module="vllm", reason="not_allowed") == 30
    assert value(text, "stallwatch_probe_refused_total", module="", reason="unknown_module") == 5
    assert value(text, "stallwatch_exporter_workers") == 2.0
    assert value(text, "stallwatch_probe_targets_max", module="vllm") == 10_000


async def test_a_killed_worker_is_started_again_counted_and_its_targets_start_anew(
    tmp_path: Path,
) -> None:
    """SIGKILL to every worker: the supervisor starts each again, counts it, and the target
    they owned is read anew (its poll count starts over)."""
    config = write_config(tmp_path / "exporter.yml", {"vllm": MODULE})
    async with counting_server() as (address, _):
        with exporter_with_workers(config) as (pid, url):
            probe = f"/probe?module=vllm&target={address}"
            for _ in range(3):
                _, body = await scrape(url, probe)
                await asyncio.sleep(0.6)
            before = value(body, "stallwatch_polls_total", target=address)
            assert before is not None
            assert before >= 2
            for worker in children(pid):
                os.kill(worker, signal.SIGKILL)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            restarts = None
            while loop.time() < deadline:
                with contextlib.suppress(aiohttp.ClientError):
                    text = await metrics(url)
                    restarts = value(text, "stallwatch_exporter_worker_restarts_total")
                    if restarts == 2 and value(text, "stallwatch_exporter_workers_answering") == 2:
                        break
                await asyncio.sleep(0.2)
            assert restarts == 2
            status, body = await scrape(url, probe)
            assert len(children(pid)) == 2
    assert status == 200
    assert value(body, "stallwatch_polls_total", target=address) == 1.0


async def test_a_reload_reaches_every_worker_and_a_bad_file_is_refused_by_all(
    tmp_path: Path,
) -> None:
    """SIGHUP to the supervisor and POST /-/reload to either worker: every worker takes the
    new module; a bad file is refused and every worker keeps the running config."""
    config = write_config(tmp_path / "exporter.yml", {"vllm": MODULE})
    async with counting_server() as (address, _):
        with exporter_with_workers(config) as (pid, url):
            write_config(config, {"vllm": MODULE, "added": MODULE})
            os.kill(pid, signal.SIGHUP)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            statuses: list[int] = []
            while loop.time() < deadline:
                statuses = [
                    (await scrape(url, f"/probe?module=added&target={address}"))[0]
                    for _ in range(20)
                ]
                if statuses == [200] * 20:
                    break
                await asyncio.sleep(0.2)
            assert statuses == [200] * 20
            config.write_text("modules: [not, a, mapping]\n")
            refused = await post_reload(url)
            kept = [
                (await scrape(url, f"/probe?module=added&target={address}"))[0] for _ in range(20)
            ]
            write_config(config, {"vllm": MODULE})
            reloaded = await post_reload(url)
            removed = [
                (await scrape(url, f"/probe?module=added&target={address}"))[0] for _ in range(20)
            ]
            text = await metrics(url)
    assert refused == 400
    assert kept == [200] * 20
    assert reloaded == 200
    assert removed == [400] * 20
    assert value(text, "stallwatch_config_last_reload_successful") == 1.0


async def test_configured_targets_are_polled_by_one_worker_each_and_published_once(
    tmp_path: Path,
) -> None:
    """Configured targets are shared out: each server is polled by one worker (its reads match
    its poll count); `/metrics`, from either worker, has each target's series once, and `/`
    every target's state."""
    async with contextlib.AsyncExitStack() as stack:
        servers = [await stack.enter_async_context(counting_server()) for _ in range(6)]
        targets = [
            {"name": f"gpu-{n}", "url": f"http://{address}"} | FAST
            for n, (address, _) in enumerate(servers)
        ]
        config = tmp_path / "exporter.yml"
        config.write_text(json.dumps({"listen": "127.0.0.1:0", "targets": targets}))
        with exporter_with_workers(config) as (_, url):
            await asyncio.sleep(2.0)
            texts = [await metrics(url) for _ in range(10)]
            reads = [count[0] for _, count in servers]
            pages = [(await scrape(url, "/"))[1] for _ in range(10)]
    for page in pages:
        assert all(f"<td>gpu-{n}</td>" in page for n in range(6)), page
        assert "not polled yet" not in page, page
    for text in texts:
        for n in range(6):
            info = [
                line
                for line in text.splitlines()
                if line.startswith("stallwatch_target_info{") and f'target="gpu-{n}"' in line
            ]
            assert len(info) == 1, (n, info)
    last = texts[-1]
    for n, count in enumerate(reads):
        polls = value(last, "stallwatch_polls_total", target=f"gpu-{n}")
        assert polls is not None
        assert polls >= 2
        # Read by one worker: its reads are its polls (one more may be under way).
        assert polls <= count <= polls + 2, (n, polls, count)
