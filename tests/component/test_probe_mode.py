"""`/probe` mode against real servers on loopback: reads, memory, refusals, the test request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from stallwatch import USER_AGENT
from stallwatch.common.allowlist import parse_target
from stallwatch.common.exporter_config import ExporterConfig
from stallwatch.exporter.multitarget import FORGET_SWEEP_SECONDS
from stallwatch.simulator.server import SimConfig
from stallwatch.simulator.testing import running_simulator
from tests.support.exporter import target, wait_until
from tests.support.probe import config, exporter, probe, samples, value


async def test_probe_answers_the_target_series_with_the_target_label() -> None:
    """`/probe` reads the server and answers the `/metrics` series, `target` = the parameter."""
    async with running_simulator(SimConfig()) as sim:
        address = sim.url.removeprefix("http://")
        # A read bound far above a loopback read on a loaded machine: the proof is the answer.
        cfg = config({"m": {"allow": ["127.0.0.1"], "interval": "5s", "timeout": "5s"}})
        async with exporter(cfg) as (_service, url), aiohttp.ClientSession() as session:
            status, body = await probe(session, url, address)
    assert status == 200
    assert value(body, "stallwatch_target_state", target=address, state="idle") == 1.0
    assert value(body, "stallwatch_polls_total", target=address) == 1.0
    assert value(body, "stallwatch_target_interval_seconds", target=address) == 5.0
    info = value(body, "stallwatch_target_info", target=address, url=sim.url, kind="auto")
    assert info is None  # the info series carries the engine too:
    names = {name for name, _ in samples(body)}
    assert "stallwatch_target_info" in names
    assert "stallwatch_build_info" not in names  # the process' own series stay on /metrics


async def test_static_targets_and_probe_together() -> None:
    """With both on, `/metrics` keeps the static targets and `/probe` serves another server."""
    async with running_simulator(SimConfig()) as a, running_simulator(SimConfig()) as b:
        cfg = config({"m": {"allow": ["127.0.0.1"]}})
        cfg = ExporterConfig(
            targets=(target("static-a", a.url),), listen_port=0, modules=cfg.modules
        )
        async with exporter(cfg) as (service, url), aiohttp.ClientSession() as session:
            status, body = await probe(session, url, b.url)
            await wait_until(lambda: service.histories["static-a"].polls >= 1, what="a static poll")
            async with session.get(f"{url}/metrics") as response:
                metrics = await response.text()
    assert status == 200
    assert value(body, "stallwatch_polls_total", target=b.url) == 1.0
    assert value(metrics, "stallwatch_polls_total", target="static-a")
    assert value(metrics, "stallwatch_polls_total", target=b.url) is None
    assert value(metrics, "stallwatch_probe_targets", module="m") == 1.0


async def test_probes_within_the_interval_answer_from_memory() -> None:
    """Ten `/probe`s inside one interval read the server once; polls and state_polls stay 1."""
    async with running_simulator(SimConfig()) as sim:
        cfg = config({"m": {"allow": ["127.0.0.1"], "interval": "1h", "timeout": "1s"}})
        async with exporter(cfg) as (_service, url), aiohttp.ClientSession() as session:
            bodies = [(await probe(session, url, sim.url))[1] for _ in range(10)]
            async with session.get(f"{url}/metrics") as response:
                metrics = await response.text()
    for body in bodies:
        assert value(body, "stallwatch_polls_total", target=sim.url) == 1.0
        assert value(body, "stallwatch_target_state_polls", target=sim.url) == 1.0
    assert value(metrics, "stallwatch_probe_reads_total") == 1.0
    assert value(metrics, "stallwatch_probe_answers_from_memory_total") == 9.0


class SlowMetrics:
    """A server whose `/metrics` answers after a delay, counting the requests it gets."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.requests = 0

    async def handle(self, _request: web.Request) -> web.Response:
        self.requests += 1
        await asyncio.sleep(self.delay)
        return web.Response(text="# nothing\n")


@contextlib.asynccontextmanager
async def slow_server(delay: float) -> AsyncIterator[tuple[SlowMetrics, str]]:
    server = SlowMetrics(delay)
    app = web.Application()
    app.router.add_get("/metrics", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield server, f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_concurrent_probes_share_one_read() -> None:
    """Five `/probe`s of one target at once send one request to the server."""
    async with slow_server(0.3) as (server, address):
        cfg = config({"m": {"allow": ["127.0.0.1"], "interval": "1h", "timeout": "2s"}})
        async with exporter(cfg) as (_service, url), aiohttp.ClientSession() as session:
            answers = await asyncio.gather(*(probe(session, url, address) for _ in range(5)))
    assert [status for status, _ in answers] == [200] * 5
    assert server.requests == 1
    assert {value(body, "stallwatch_polls_total", target=address) for _, body in answers} == {1}


async def test_a_scrape_that_gives_up_does_not_cancel_the_shared_read() -> None:
    """A `/probe` whose client disconnects mid-read leaves the read to finish for the others."""
    async with slow_server(0.4) as (server, address):
        cfg = config({"m": {"allow": ["127.0.0.1"], "interval": "1h", "timeout": "2s"}})
        async with exporter(cfg) as (service, url), aiohttp.ClientSession() as session:
            with contextlib.suppress(TimeoutError):
                async with session.get(
                    f"{url}/probe",
                    params={"target": address, "module": "m"},
                    timeout=aiohttp.ClientTimeout(total=0.1),
                ):
                    pass
            status, body = await probe(session, url, address)
            assert service.probes is not None
    assert status == 200
    assert server.requests == 1
    assert value(body, "stallwatch_polls_total", target=address) == 1.0


class ConnectionCounter(asyncio.Protocol):
    connections = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ConnectionCounter.connections += 1
        transport.close()


@pytest.mark.parametrize(
    ("module", "target_of", "status", "reason"),
    [
        ("m", lambda port: f"127.0.0.1:{port}", 400, "not_allowed"),  # port not allowed
        ("m", lambda port: f"http://localhost:{port}", 400, "not_allowed"),  # a name, not the IP
        ("m", lambda port: f"ftp://127.0.0.1:{port}", 400, "bad_target"),
        ("nope", lambda port: f"127.0.0.1:{port}", 400, "unknown_module"),
    ],
)
async def test_refused_probes_send_nothing(
    module: str, target_of: Any, status: int, reason: str
) -> None:
    """A refused `/probe` gets its status and a counted reason; the socket sees no connection."""
    loop = asyncio.get_running_loop()
    ConnectionCounter.connections = 0
    listener = await loop.create_server(ConnectionCounter, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        cfg = config({"m": {"allow": ["127.0.0.1:1"], "test_request": {"enabled": True}}})
        async with exporter(cfg) as (_service, url), aiohttp.ClientSession() as session:
            answer_status, text = await probe(session, url, target_of(port), module)
            async with session.get(f"{url}/metrics") as response:
                metrics = await response.text()
    finally:
        listener.close()
        await listener.wait_closed()
    assert answer_status == status
    assert text.startswith("probe refused:")
    counted_module = "" if reason == "unknown_module" else module
    assert value(metrics, "stallwatch_probe_refused_total", module=counted_module, reason=reason)
    assert ConnectionCounter.connections == 0


async def test_the_target_table_is_bounded() -> None:
    """Beyond the maximum a new target gets 503 and is not read; known ones are still served."""
    async with running_simulator(SimConfig()) as a, running_simulator(SimConfig()) as b:
        cfg = config({"m": {"allow": ["127.0.0.1"], "interval": "1h", "timeout": "1s"}})
        async with exporter(cfg) as (service, url), aiohttp.ClientSession() as session:
            assert service.probes is not None
            service.probes.max_targets = 1
            first = await probe(session, url, a.url)
            second = await probe(session, url, b.url)
            again = await probe(session, url, a.url)
    assert (first[0], second[0], again[0]) == (200, 503, 200)


async def test_targets_not_probed_for_a_while_are_forgotten() -> None:
    """After forget_after without a `/probe`, the target's history is dropped and starts anew."""
    async with running_simulator(SimConfig()) as sim:
        cfg = config({"m": {"allow": ["127.0.0.1"], "interval": "50ms", "forget_after": "200ms"}})
        async with exporter(cfg) as (_service, url), aiohttp.ClientSession() as session:
            await probe(session, url, sim.url)
            await asyncio.sleep(0.06)
            _, body = await probe(session, url, sim.url)
            assert value(body, "stallwatch_polls_total", target=sim.url) == 2.0
            await asyncio.sleep(0.3)
            _, body = await probe(session, url, sim.url)
            async with session.get(f"{url}/metrics") as response:
                metrics = await response.text()
    assert value(body, "stallwatch_polls_total", target=sim.url) == 1.0
    assert value(metrics, "stallwatch_probe_targets_forgotten_total") == 1.0


async def test_a_target_nobody_asks_for_is_forgotten_by_the_next_sweep() -> None:
    """A target no `/probe` asks for again is dropped within FORGET_SWEEP_SECONDS of its
    forget_after, at the next `/probe` of any target (the sweep walks the table once a second,
    not at every scrape)."""
    async with running_simulator(SimConfig()) as a, running_simulator(SimConfig()) as b:
        cfg = config({"m": {"allow": ["127.0.0.1"], "interval": "50ms", "forget_after": "200ms"}})
        async with exporter(cfg) as (service, url), aiohttp.ClientSession() as session:
            assert service.probes is not None
            await probe(session, url, a.url)
            await probe(session, url, b.url)
            remembered_both = len(service.probes.entries)
            await asyncio.sleep(0.2 + FORGET_SWEEP_SECONDS)
            await probe(session, url, a.url)
            remembered_after = [key[1] for key in service.probes.entries]
    assert remembered_both == 2
    assert remembered_after == [parse_target(a.url).url]


async def test_the_sweep_finds_an_idle_target_behind_one_asked_again() -> None:
    """The table is walked in the order of the last ask: a target asked for again moves behind
    the idle one, which the sweep still forgets, stopping at the recent one."""
    async with running_simulator(SimConfig()) as a, running_simulator(SimConfig()) as b:
        cfg = config({"m": {"allow": ["127.0.0.1"], "interval": "50ms", "forget_after": "800ms"}})
        async with exporter(cfg) as (service, url), aiohttp.ClientSession() as session:
            assert service.probes is not None
            await probe(session, url, a.url)
            await probe(session, url, b.url)
            await asyncio.sleep(0.5)
            await probe(session, url, a.url)
            await asyncio.sleep(FORGET_SWEEP_SECONDS - 0.45)
            await probe(session, url, a.url)
            remembered = [key[1] for key in service.probes.entries]
    assert remembered == [parse_target(a.url).url]


async def test_a_short_forget_after_is_kept_behind_a_longer_one() -> None:
    """With modules of different forget_after, an entry old only for the shortest one does
    not end the sweep: the idle target of the short module behind it is forgotten."""
    async with running_simulator(SimConfig()) as a, running_simulator(SimConfig()) as b:
        cfg = config(
            {
                "long": {"allow": ["127.0.0.1"], "interval": "50ms", "forget_after": "1h"},
                "short": {"allow": ["127.0.0.1"], "interval": "50ms", "forget_after": "200ms"},
            }
        )
        async with exporter(cfg) as (service, url), aiohttp.ClientSession() as session:
            assert service.probes is not None
            await probe(session, url, a.url, "long")
            await probe(session, url, b.url, "short")
            await asyncio.sleep(0.2 + FORGET_SWEEP_SECONDS)
            await probe(session, url, b.url, "long")
            remembered = list(service.probes.entries)
    assert remembered == [("long", parse_target(a.url).url), ("long", parse_target(b.url).url)]


@pytest.mark.parametrize(("enabled", "expected"), [(False, 0), (True, 1)])
async def test_the_test_request_goes_only_to_modules_that_enable_it(
    enabled: bool, expected: int
) -> None:
    """An idle server probed under a module without the test request gets no generation."""
    async with running_simulator(SimConfig()) as sim:
        cfg = config(
            {
                "m": {
                    "allow": ["127.0.0.1"],
                    # Reads a second apart, each bounded by a second: never a timeout on a
                    # loaded machine, which would read the idle server as down.
                    "interval": "1s",
                    "timeout": "1s",
                    "test_request": {"enabled": enabled, "timeout": "1s"},
                }
            }
        )
        async with exporter(cfg) as (_service, url), aiohttp.ClientSession() as session:
            for _ in range(3):
                await probe(session, url, sim.url)
                await asyncio.sleep(1.05)
        sent = sim.stats()["completions_by_user_agent"].get(USER_AGENT, 0)
    assert sent == expected


async def test_a_reload_keeps_unchanged_modules_and_forgets_changed_ones() -> None:
    """After a reload, servers of an unchanged module keep their history; of a changed one, not."""
    async with running_simulator(SimConfig()) as sim:
        modules = {
            "kept": {"allow": ["127.0.0.1"], "interval": "1h", "timeout": "1s"},
            "changed": {"allow": ["127.0.0.1"], "interval": "1h", "timeout": "1s"},
        }
        cfg = config(modules)
        async with exporter(cfg) as (service, url), aiohttp.ClientSession() as session:
            await probe(session, url, sim.url, "kept")
            await probe(session, url, sim.url, "changed")
            modules["changed"] = {**modules["changed"], "timeout": "2s"}
            await service.apply(config(modules))
            assert service.probes is not None
            remembered = sorted(module for module, _ in service.probes.entries)
            await probe(session, url, sim.url, "changed")
            await probe(session, url, sim.url, "kept")
            reads = service.probes.reads
    assert remembered == ["kept"]
    assert reads == 3  # kept once; changed once before the reload and once after
