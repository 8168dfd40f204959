"""`/probe` under a hostile client, against real servers on loopback: bounded memory per server."""

from __future__ import annotations

import aiohttp

from stallwatch.exporter.multitarget import MAX_SPELLINGS_RENDERED
from stallwatch.simulator.server import SimConfig
from stallwatch.simulator.testing import running_simulator

from .test_probe_mode import config, exporter, probe, value


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
