"""The exporter and `stallwatch check` reading the simulator's llama.cpp mode."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from stallwatch.core.classify import State
from stallwatch.exporter.check_cli import EXIT_STUCK, run_check
from stallwatch.simulator.testing import running_simulator
from tests.support.exporter import exporter_for, record_histories, target

NAME = "llama"
SLOTS = 4
# Four slots decoding at 40 tokens/s together: 10 llama_decode calls a second, so between two
# polls 0.25 s apart n_decode_total grows by 2 or 3; above 1e7 that is below the last digit.
SLOW_DECODE = 40.0


async def _decode_forever(session: aiohttp.ClientSession, url: str) -> list[asyncio.Task[object]]:
    body = {"prompt": "the of and", "n_predict": 100_000, "ignore_eos": True}

    async def one() -> object:
        async with session.post(url + "/completion", json=body) as response:
            return await response.read()

    return [asyncio.create_task(one()) for _ in range(SLOTS)]


@pytest.mark.parametrize("initial_decodes", [0, 12_000_000])
async def test_llamacpp_decoding_with_counters_above_ten_million_never_reads_stuck(
    initial_decodes: int,
) -> None:
    """Four decoding slots never read stalled and check never says stuck, even at 1.2e7."""
    async with (
        running_simulator(
            engine="llamacpp",
            max_num_seqs=SLOTS,
            tokens_per_second=SLOW_DECODE,
            initial_decodes=initial_decodes,
        ) as sim,
        aiohttp.ClientSession() as session,
    ):
        load = await _decode_forever(session, sim.url)
        try:
            await asyncio.sleep(0.3)
            assert sim.stats()["running"] == SLOTS
            async with exporter_for(target(NAME, sim.url)) as (service, _):
                polls = await record_histories(
                    service, NAME, until=lambda h: h.polls >= 8, timeout=30
                )
                check = await run_check(target("check", sim.url))
            decodes = sim.server.flavour.stats()["n_decode_exact"]  # type: ignore[union-attr]
        finally:
            for task in load:
                task.cancel()
            await asyncio.gather(*load, return_exceptions=True)

    states = [poll.state for poll in polls]
    reasons = [poll.verdict.reason for poll in polls if poll.verdict is not None]
    print(f"initial {initial_decodes}: {states}; check {check.as_json()['state']}")
    assert decodes > initial_decodes + 8
    assert State.STALLED not in states, reasons
    assert check.exit_code != EXIT_STUCK, check.as_json()
    assert all(poll.test_requests == 0 for poll in polls)
    if initial_decodes == 0:
        # Exact counters: every poll after the first sees the decodes.
        assert states[1:] == [State.BUSY] * (len(states) - 1), reasons
    else:
        # Reduced precision: polls that saw nothing move say so instead of "stalled".
        assert set(states[1:]) <= {State.BUSY, State.UNKNOWN}, reasons
        assert any("significant digits" in reason for reason in reasons), reasons


async def test_llamacpp_simulator_is_recognised_as_llamacpp() -> None:
    """With kind auto the exporter recognises the simulated llama.cpp and reads it idle."""
    async with (
        running_simulator(engine="llamacpp") as sim,
        exporter_for(target(NAME, sim.url)) as (service, _),
    ):
        polls = await record_histories(service, NAME, until=lambda h: h.polls >= 3, timeout=20)

    last = polls[-1]
    assert last.baseline is not None
    assert last.baseline.engine_kind == "llamacpp"
    assert {poll.state for poll in polls} == {State.IDLE}
