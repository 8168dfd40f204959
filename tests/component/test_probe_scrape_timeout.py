"""`/probe` within Prometheus' scrape timeout, and `?debug=true`: a real exporter on loopback
against a real simulator and a real server that never answers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from stallwatch.common.exporter_config import ExporterConfig, exporter_config_from_mapping
from stallwatch.core.classify import State
from stallwatch.exporter.app import SCRAPE_TIMEOUT_HEADER, running_exporter
from stallwatch.exporter.service import ExporterService
from stallwatch.simulator.testing import running_simulator
from tests.support.alerting_stack import poll


def config(**module: Any) -> ExporterConfig:
    modules = {"m": {"allow": ["127.0.0.1"], "interval": "1h", **module}}
    return exporter_config_from_mapping({"modules": modules}, "exporter.yml")


@contextlib.asynccontextmanager
async def exporter(cfg: ExporterConfig) -> AsyncIterator[tuple[ExporterService, str]]:
    async with running_exporter(cfg, Path("exporter.yml"), port=0) as running:
        yield running


def value(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


async def get(
    session: aiohttp.ClientSession,
    url: str,
    target: str,
    *,
    scrape_timeout: str | None = None,
    debug: bool = False,
) -> tuple[int, str]:
    params = {"target": target, "module": "m", **({"debug": "true"} if debug else {})}
    headers = {SCRAPE_TIMEOUT_HEADER: scrape_timeout} if scrape_timeout is not None else {}
    async with session.get(f"{url}/probe", params=params, headers=headers) as response:
        return response.status, await response.text()


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[str]:
    """A server that accepts `/metrics` and never answers until the test ends."""
    released = asyncio.Event()

    async def handle(_request: web.Request) -> web.Response:
        await released.wait()
        return web.Response(text="# nothing\n")

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        released.set()
        await runner.cleanup()


async def test_a_read_times_out_within_the_scrape_not_the_modules_timeout() -> None:
    """With a 1 s scrape timeout, a read of a server that never answers gives up at 0.45 s
    (within the scrape less its offset), not at the module's 30 s, and reads hung."""
    async with silent_server() as address:
        cfg = config(kind="vllm", timeout="30s")
        async with exporter(cfg) as (service, url), aiohttp.ClientSession() as session:
            status, body = await get(session, url, address, scrape_timeout="1")
            assert service.probes is not None
            (entry,) = service.probes.entries.values()
    assert status == 200
    assert value(body, "stallwatch_target_state", target=address, state="hung") == 1.0
    assert entry.history.verdict is not None
    assert entry.history.state == State.HUNG
    assert "connected, no answer within 0.45 s" in entry.history.verdict.reason


async def test_a_read_still_waiting_for_its_test_request_is_cut_at_the_scrapes_end() -> None:
    """A hung idle engine holds the idle test request (30 s timeout) open; with a 2 s scrape the
    read is cut at 1.5 s with no verdict, counted, and the scrape is answered."""
    async with running_simulator() as sim:
        sim.apply_fault("hang")
        cfg = config(kind="vllm", timeout="1s", test_request={"enabled": True, "timeout": "30s"})
        async with exporter(cfg) as (service, url), aiohttp.ClientSession() as session:
            status, body = await get(session, url, sim.url, scrape_timeout="2")

            # The answer and the cut are both due at the scrape's deadline: on a loaded
            # machine either may come first, so the count is waited for (bounded).
            async def cut_counted() -> str | None:
                async with session.get(f"{url}/metrics") as response:
                    text = await response.text()
                return text if value(text, "stallwatch_probe_reads_cut_total") else None

            metrics = await poll(cut_counted, 5, "the cut read counted")
            assert service.probes is not None
            (entry,) = service.probes.entries.values()
    assert status == 200
    assert entry.history.polls == 0  # no verdict: nothing judged from a read cut short
    assert value(body, "stallwatch_polls_total", target=sim.url) in (None, 0.0)
    assert value(metrics, "stallwatch_probe_reads_cut_total") == 1.0
    assert value(metrics, "stallwatch_probe_reads_total") == 0.0


async def test_a_scrape_timeout_that_is_no_number_is_refused() -> None:
    """A malformed X-Prometheus-Scrape-Timeout-Seconds is a 400 that reads nothing."""
    async with (
        running_simulator() as sim,
        exporter(config()) as (service, url),
        aiohttp.ClientSession() as session,
    ):
        status, text = await get(session, url, sim.url, scrape_timeout="ten")
        assert service.probes is not None
        remembered = len(service.probes.entries)
    assert status == 400
    assert f"{SCRAPE_TIMEOUT_HEADER}: expected a number of seconds, got 'ten'" in text
    assert remembered == 0


async def test_debug_shows_what_was_read_the_reading_and_the_decision() -> None:
    """`?debug=true` answers plain text: each request and its answer, the engines' samples, the
    decision and the series, and leaves no entry and no history behind."""
    async with (
        running_simulator() as sim,
        exporter(config()) as (service, url),
        aiohttp.ClientSession() as session,
    ):
        status, text = await get(session, url, sim.url, scrape_timeout="10", debug=True)
        assert service.probes is not None
        remembered = len(service.probes.entries)
        _, body = await get(session, url, sim.url)
    assert status == 200
    lines = text.splitlines()
    assert lines[0] == f"debug poll of {sim.url} (module m): {sim.url}, kind auto"
    assert lines[1] == "scrape timeout 10 s: each request at most 5 s, the poll at most 9.5 s"
    assert lines[2] == "baseline: none (no earlier reading of this target)"
    steps = [line.split("  ", 2)[2] for line in lines[lines.index("steps:") + 1 : _end(lines)]]
    assert steps[:4] == [  # kind auto: the engine is asked first, then its metrics are read
        f"GET {sim.url}/v1/models (which engine is it?)",
        "  -> status 200, owned_by: vllm",
        f"GET {sim.url}/metrics",
        "  -> a reading: " + steps[3].split("a reading: ", 1)[1],
    ]
    assert steps[3].endswith(" bytes, 1 engine(s)")
    assert any(line.startswith("  vllm engine '0' of ") and "running 0" in line for line in lines)
    assert any(line.startswith("decision: idle (") for line in lines)
    series = text.split("series this poll would answer:\n", 1)[1]
    assert value(series, "stallwatch_target_state", target=sim.url, state="idle") == 1.0
    assert remembered == 0
    assert value(body, "stallwatch_polls_total", target=sim.url) == 1.0  # the debug poll left none


def _end(lines: list[str]) -> int:
    """Where the steps end: at the reading, or at the decision."""
    return next(i for i, line in enumerate(lines) if line.startswith(("reading:", "decision:")))


async def test_debug_stops_where_a_poll_would_send_the_test_request() -> None:
    """With the module's test request on, an idle server's debug poll shows the test request it
    would send, sends none (the server counts no request), and decides nothing."""
    async with (
        running_simulator() as sim,
        exporter(config(test_request={"enabled": True})) as (_service, url),
        aiohttp.ClientSession() as session,
    ):
        status, text = await get(session, url, sim.url, debug=True)
        requests = sim.stats()["requests_total"]
    assert status == 200
    lines = text.splitlines()
    steps = [line.split("  ", 2)[2] for line in lines[lines.index("steps:") + 1 : _end(lines)]]
    assert steps[-1] == "the idle test request: completions, model 'tiny', timeout 10 s"
    assert any(
        line.startswith("decision: none yet: a poll sends the idle test request") for line in lines
    )
    assert requests == 0


async def test_debug_of_a_target_outside_the_allow_list_is_refused() -> None:
    """A debug `/probe` is checked like any other: a target outside the allow list gets 400."""
    async with running_simulator() as sim:
        port = sim.url.rsplit(":", 1)[1]
        cfg = config(allow=["127.0.0.1:1"])
        async with exporter(cfg) as (_service, url), aiohttp.ClientSession() as session:
            status, text = await get(session, url, f"127.0.0.1:{port}", debug=True)
        requests = sim.stats()["requests_total"]
    assert status == 400
    assert text.startswith("probe refused: ")
    assert requests == 0


async def test_a_cut_read_leaves_the_slot_to_the_next_scrape() -> None:
    """A read cut at a short scrape's deadline is not the interval's read: the next /probe of
    the same slot (module interval 1h) reads the server and judges it, instead of answering
    the verdict from before the cut."""
    async with running_simulator() as sim:
        sim.apply_fault("hang")
        cfg = config(kind="vllm", timeout="1s", test_request={"enabled": True, "timeout": "30s"})
        async with exporter(cfg) as (service, url), aiohttp.ClientSession() as session:
            status, _ = await get(session, url, sim.url, scrape_timeout="1")
            assert status == 200
            assert service.probes is not None
            (entry,) = service.probes.entries.values()
            assert entry.history.polls == 0
            sim.apply_fault("recover")
            status, body = await get(session, url, sim.url, scrape_timeout="10")
            reads, cut = service.probes.reads, service.probes.reads_cut
    assert status == 200
    assert (reads, cut) == (1, 1)
    assert entry.history.polls == 1
    assert value(body, "stallwatch_polls_total", target=sim.url) == 1.0


async def test_a_scrape_timeout_too_short_or_not_ascii_is_refused_and_reads_nothing() -> None:
    """`1e-9` (too short to serve a read) and Arabic-Indic digits are 400s that take no read
    slot and remember no target."""
    async with (
        running_simulator() as sim,
        exporter(config()) as (service, url),
        aiohttp.ClientSession() as session,
    ):
        answers = [
            await get(session, url, sim.url, scrape_timeout=header)
            for header in ("1e-9", "\u0661\u0660")
        ]
        assert service.probes is not None
        remembered = len(service.probes.entries)
    assert [status for status, _ in answers] == [400, 400]
    assert "too short to serve a read" in answers[0][1]
    assert "expected a number of seconds" in answers[1][1]
    assert remembered == 0
    assert sim.stats()["requests_by_path"].get("/metrics", 0) == 0


@contextlib.asynccontextmanager
async def held_servers(count: int, release: asyncio.Event) -> AsyncIterator[list[str]]:
    """`count` servers whose `/metrics` and `/v1/models` answer only once `release` is set."""

    async def handle(_request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="# nothing\n")

    runners = []
    addresses = []
    try:
        for _ in range(count):
            app = web.Application()
            app.router.add_get("/{tail:.*}", handle)
            runner = web.AppRunner(app, shutdown_timeout=1)
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            addresses.append(f"127.0.0.1:{port}")
        yield addresses
    finally:
        release.set()
        for runner in runners:
            await runner.cleanup()


async def test_debug_polls_of_one_server_are_rate_limited() -> None:
    """A second `?debug=true` of one server within 5 s is refused 429 and sends it nothing
    (200 of them made 600 requests to one server); another server is polled."""
    async with (
        running_simulator() as one,
        running_simulator() as other,
        exporter(config()) as (service, url),
        aiohttp.ClientSession() as session,
    ):
        first = await get(session, url, one.url, scrape_timeout="10", debug=True)
        sent = one.stats()["requests_total"]
        again = [await get(session, url, one.url, debug=True) for _ in range(20)]
        sent_after = one.stats()["requests_total"]
        elsewhere = await get(session, url, other.url, debug=True)
        assert service.probes is not None
        refused = service.probes.refused[("m", "debug_too_soon")]
    assert first[0] == 200
    assert {status for status, _ in again} == {429}
    assert "polled for debug less than 5 s ago" in again[0][1]
    assert sent_after == sent
    assert elsewhere[0] == 200
    assert refused == 20


async def test_debug_polls_have_their_own_bound_at_once() -> None:
    """With two debug polls under way (their servers not answering), a third, of another
    server, is refused 503 at once: debug polls cannot fill the parse pool
    the static targets share."""
    release = asyncio.Event()
    async with (
        held_servers(3, release) as (a, b, c),
        exporter(config(timeout="30s")) as (service, url),
        aiohttp.ClientSession() as session,
    ):
        assert service.probes is not None
        probes = service.probes
        running = [asyncio.create_task(get(session, url, x, debug=True)) for x in (a, b)]
        for _ in range(600):
            if probes.debug_running == 2:
                break
            await asyncio.sleep(0.02)
        assert probes.debug_running == 2
        status, text = await get(session, url, c, debug=True)
        release.set()
        answers = await asyncio.gather(*running)
        assert probes.debug_running == 0
    assert status == 503
    assert "2 debug polls are under way already" in text
    assert [answer[0] for answer in answers] == [200, 200]
