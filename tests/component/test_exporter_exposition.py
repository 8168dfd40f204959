"""The exporter's `/metrics`, written by its own writer, is what `generate_latest` would write."""

from __future__ import annotations

from collections.abc import Iterator
from types import MappingProxyType

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from stallwatch.core.classify import State
from stallwatch.exporter.app import build_registry
from stallwatch.exporter.exposition import exposition
from stallwatch.simulator.testing import running_simulator
from tests.support.exporter import exporter_for, target, wait_for_state


class _Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


async def test_the_whole_registry_of_a_running_exporter_is_written_as_the_reference_writes_it() -> (
    None
):
    """Targets, process, platform and GC families of a live exporter: the same bytes both ways."""
    async with running_simulator() as sim:
        plain = target("plain", sim.url)
        labelled = target("labelled", sim.url, labels=MappingProxyType({"zone": 'eu "west"'}))
        async with exporter_for(plain, labelled) as (service, url):
            await wait_for_state(service, "plain", State.IDLE)
            await wait_for_state(service, "labelled", State.IDLE)
            families = list(build_registry(service).collect())
            reference = CollectorRegistry(auto_describe=False)
            reference.register(_Fixed(families))
            async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as answer:
                served = await answer.text()

    assert exposition(families) == generate_latest(reference)
    assert 'stallwatch_target_state{state="idle",target="labelled",zone="eu \\"west\\""} 1.0' in (
        served
    )
