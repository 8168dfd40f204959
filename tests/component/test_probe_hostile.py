"""`/probe` under a hostile client, against real servers on loopback: bounded memory per server."""

from __future__ import annotations

import aiohttp

from stallwatch.exporter.multitarget import MAX_SPELLINGS_RENDERED
from stallwatch.simulator.server import SimConfig
from stallwatch.simulator.testing import running_simulator
from tests.support.probe import config, exporter, probe, value


async def test_many_spellings_of_one_server_keep_one_entry_and_bounded_answers() -> None:
    """400 spellings of one server (trailing slashes) keep one entry, read once, and at most
    MAX_SPELLINGS_RENDERED rendered answers; each still answers with its own `target` label."""
    async with running_simulator(SimConfig()) as sim:
        cfg = config({"m": {"allow": ["127.0.0.1"], "interval": "1h", "timeout": "1s"}})
        async with exporter(cfg) as (service, url), aiohttp.ClientSession() as session:
            bodies = []
            for slashes in range(1, 401):
                status, body = await probe(session, url, sim.url + "/" * slashes)
                assert status == 200
                bodies.append(body)
            assert service.probes is not None
            entries = list(service.probes.entries.values())
            reads = service.probes.reads
    assert len(entries) == 1
    assert reads == 1
    assert len(entries[0].rendered) <= MAX_SPELLINGS_RENDERED
    last = sim.url + "/" * 400
    assert value(bodies[-1], "stallwatch_polls_total", target=last) == 1.0


async def test_a_flood_in_one_module_leaves_the_other_modules_their_room() -> None:
    """Distinct targets flooding one module fill only its share (503, `module_full`); a new
    server of another module is still read."""
    async with running_simulator(SimConfig()) as sim:
        module = {"allow": ["127.0.0.1"], "interval": "1h", "timeout": "1s"}
        cfg = config({"flood": module, "real": module})
        async with exporter(cfg) as (service, url), aiohttp.ClientSession() as session:
            assert service.probes is not None
            service.probes.max_targets = 4  # two per module
            flood = [(await probe(session, url, f"{sim.url}/f{n}", "flood"))[0] for n in range(5)]
            real, _ = await probe(session, url, sim.url, "real")
            async with session.get(f"{url}/metrics") as response:
                metrics = await response.text()
    assert flood == [200, 200, 503, 503, 503]
    assert real == 200
    refused = value(metrics, "stallwatch_probe_refused_total", module="flood", reason="module_full")
    assert refused == 3.0
    assert value(metrics, "stallwatch_probe_targets", module="flood") == 2.0
    assert value(metrics, "stallwatch_probe_targets_max", module="real") == 2.0
