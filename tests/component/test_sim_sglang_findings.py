"""What a real SGLang 0.5.23 server showed (tests/real_sglang), kept by the simulator's SGLang
mode and the real exporter, so the fast tiers hold every finding without the real server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp

from stallwatch.common.exporter_config import TargetConfig
from stallwatch.core.classify import State
from stallwatch.core.history import TargetHistory
from stallwatch.simulator.config import SimConfig
from stallwatch.simulator.testing import SimHandle, read_metrics, running_simulator
from tests.support.exporter import exporter_for, record_histories, target

NAME = "sglang"
# Like the real tier's server: 4 slots, 16-token prefill chunks, and the pass counter already
# moved by SGLang's own warm-up request (8 tokens) before it serves.
LIKE_REAL = SimConfig(
    engine="sglang",
    initial_decodes=8,
    max_num_seqs=4,
    max_num_batched_tokens=16,
    max_model_len=32_768,
    tokens_per_second=100.0,
    prefill_tokens_per_second=400.0,
)
# At 400 tokens a second, a prefill that outlasts every poll of these tests many times over.
LONG_PROMPT_WORDS = 30_000
# An in-flight request with the idle loop flat is work only over reads at least the idle loop's
# flush period (1 s) apart.
STALL_INTERVAL = 1.0
SCHEDULER = "engine_type=unified,model_name=tiny,moe_ep_rank=0,pp_rank=0,tp_rank=0"
PREFILL_PASSES = f"sglang:cuda_graph_passes_total{{{SCHEDULER},mode=prefill_none}}"
RUNNING = f"sglang:num_running_reqs{{{SCHEDULER}}}"
QUEUED = f"sglang:num_queue_reqs{{{SCHEDULER}}}"


def states(polls: list[TargetHistory]) -> list[str]:
    return [str(poll.state) for poll in polls]


def reasons(polls: list[TargetHistory]) -> list[tuple[str, str]]:
    return [(str(p.state), p.verdict.reason if p.verdict else "") for p in polls]


@contextlib.asynccontextmanager
async def prefilling(sim: SimHandle) -> AsyncIterator[aiohttp.ClientSession]:
    """One request with a long prompt in its chunked prefill, for the duration of the block."""
    async with aiohttp.ClientSession() as session:
        body = {"prompt": " ".join(["w"] * LONG_PROMPT_WORDS), "max_tokens": 1}
        request = asyncio.create_task(session.post(f"{sim.url}/v1/completions", json=body))
        try:
            for _ in range(500):
                if (await read_metrics(session, sim.url)).get(PREFILL_PASSES, 0.0) > 1:
                    break
                await asyncio.sleep(0.01)
            yield session
        finally:
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)


async def polls_of(config: TargetConfig, count: int) -> list[TargetHistory]:
    """`count` polls of `config` (from `target()`: what these tests judge is the engine's
    counters, and each read and test request has the generous bounds of
    tests/support/exporter.py)."""
    async with exporter_for(config) as (service, _):
        return await record_histories(service, NAME, until=lambda h: h.polls >= count, timeout=30)


async def test_long_chunked_prefill_with_both_gauges_at_zero_reads_busy_no_test_request() -> None:
    """A long chunked prefill, both work gauges at 0: busy after the first read, no test
    request (only the prefill passes and the HTTP in-flight gauge show the work)."""
    async with running_simulator(LIKE_REAL) as sim, prefilling(sim) as session:
        polls = await polls_of(target(NAME, sim.url), 5)
        samples = await read_metrics(session, sim.url)
    assert (samples[RUNNING], samples[QUEUED]) == (0.0, 0.0)
    assert set(states(polls[1:])) == {"busy"}, reasons(polls)
    assert polls[-1].test_requests == 0


async def test_engine_hung_in_a_chunked_prefill_reads_stalled_twice() -> None:
    """The scheduler hung in a long prefill (gauges 0, one request in flight, passes and the
    idle loop flat): stalled twice in a row, never idle, no test request."""
    async with running_simulator(LIKE_REAL) as sim, prefilling(sim):
        sim.apply_fault("hang")
        config = target(NAME, sim.url, interval_seconds=STALL_INTERVAL)
        async with exporter_for(config) as (service, _):
            polls = await record_histories(
                service,
                NAME,
                until=lambda h: h.state == State.STALLED and h.state_polls >= 2,
                timeout=30,
            )
    assert "idle" not in states(polls), reasons(polls)
    assert polls[-1].test_requests == 0


async def test_idle_server_reads_idle_after_its_own_test_request() -> None:
    """The passes of the exporter's own test request, with nothing in flight after it, read
    idle on the next poll, not busy."""
    async with running_simulator(LIKE_REAL) as sim:
        polls = await polls_of(target(NAME, sim.url), 6)
    assert set(states(polls)) == {"idle"}, reasons(polls)
    assert polls[-1].test_requests >= 1


async def test_restart_loads_without_a_test_request_then_reads_restarted_once() -> None:
    """After a restart the server loads for a while (startup series only): no read idle,
    busy or stalled, no test request meanwhile, and one restart detected."""
    async with (
        running_simulator(LIKE_REAL) as sim,
        exporter_for(target(NAME, sim.url)) as (service, _),
    ):
        await record_histories(service, NAME, until=lambda h: h.polls >= 2, timeout=30)
        probes_before = service.histories[NAME].test_requests
        sim.apply_fault("restart")
        loading = await record_histories(
            service, NAME, until=lambda h: h.restarts_detected >= 1, timeout=30
        )
        during = await record_histories(
            service, NAME, until=lambda h: h.polls >= loading[-1].polls + 2, timeout=30
        )
        after = await record_histories(
            service, NAME, until=lambda h: h.state == State.IDLE, timeout=30
        )
    assert loading[-1].state == State.RESTARTED, reasons(loading)
    assert "still loading" in reasons(loading)[-1][1]
    assert not {"idle", "busy", "stalled"} & set(states(during)), reasons(during)
    assert during[-1].test_requests == probes_before
    assert after[-1].restarts_detected == 1
