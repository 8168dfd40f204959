"""The exporter reading the simulator's TGI mode before and after its first request."""

from __future__ import annotations

import aiohttp
import pytest

from stallwatch import USER_AGENT
from stallwatch.core.classify import State
from stallwatch.simulator.testing import running_simulator
from tests.support.exporter import exporter_for, record_histories, target

NAME = "tgi"


@pytest.mark.parametrize("kind", ["auto", "tgi"])
async def test_fresh_tgi_reads_no_metrics_until_its_first_request(kind: str) -> None:
    """A TGI that has served nothing publishes an empty /metrics: no_metrics saying no request
    was seen, no test request; after one request it is read as TGI, idle."""
    async with (
        running_simulator(engine="tgi") as sim,
        aiohttp.ClientSession() as session,
    ):
        empty = await (await session.get(sim.url + "/metrics")).text()
        async with exporter_for(target(NAME, sim.url, kind=kind)) as (service, _):
            fresh = await record_histories(service, NAME, until=lambda h: h.polls >= 3, timeout=20)
            sent = sim.stats()["completions_by_user_agent"].get(USER_AGENT, 0)
            body = {"prompt": "a b c", "max_tokens": 4}
            async with session.post(sim.url + "/v1/completions", json=body) as answer:
                assert answer.status == 200
            served = await record_histories(
                service, NAME, until=lambda h: h.polls >= fresh[-1].polls + 3, timeout=20
            )

    reasons = [poll.verdict.reason for poll in fresh if poll.verdict is not None]
    assert empty == ""
    assert {poll.state for poll in fresh} == {State.NO_METRICS}, reasons
    assert all("no request seen yet" in reason for reason in reasons), reasons
    assert all(poll.test_requests == 0 for poll in fresh)
    assert sent == 0
    assert served[-1].state == State.IDLE, [poll.state for poll in served]
    assert served[-1].baseline is not None
    assert served[-1].baseline.engine_kind == "tgi"
