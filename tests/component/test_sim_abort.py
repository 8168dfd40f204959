"""A client that goes away aborts its request, as in vLLM: slot and queue place freed, counted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from stallwatch.simulator.testing import SimHandle, engine_sample, parse_samples, running_simulator

TIMEOUT = aiohttp.ClientTimeout(total=10)
SHORT = aiohttp.ClientTimeout(total=0.3)
LONG = {"prompt": "hello", "max_tokens": 1500, "ignore_eos": True}
RUNNING = engine_sample("vllm:num_requests_running")
WAITING = engine_sample("vllm:num_requests_waiting")
KV = engine_sample("vllm:kv_cache_usage_perc")
ABORTED = "vllm:request_success_total{engine=0,finished_reason=abort,model_name=tiny}"


async def wait_until(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def metrics_now(sim: SimHandle) -> dict[str, float]:
    """The simulator's /metrics samples, read in-process."""
    return parse_samples(sim.server.render_metrics())


async def abandon(sim: SimHandle, payload: dict[str, Any]) -> None:
    """Post a long completion with a 0.3 s client timeout: the client gives up and disconnects."""
    async with aiohttp.ClientSession(timeout=SHORT) as session:
        with pytest.raises(TimeoutError):
            async with session.post(sim.url + "/v1/completions", json=payload) as response:
                await response.read()


async def test_client_timeout_aborts_its_running_request() -> None:
    """A non-streaming request whose client timed out leaves its slot; abort is counted."""
    async with running_simulator(tokens_per_second=50) as sim:
        await abandon(sim, LONG)
        await wait_until(lambda: sim.stats()["running"] == 0, "the slot to be freed")
        metrics = metrics_now(sim)
        assert metrics[ABORTED] == 1
        assert metrics[RUNNING] == 0
        assert metrics[KV] == 0
        assert sim.stats()["in_flight"] == 0


async def test_closed_stream_aborts_its_request_and_others_go_on() -> None:
    """A client closing a stream aborts only its own request; the other keeps running."""
    async with (
        running_simulator(tokens_per_second=50) as sim,
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        kept = asyncio.create_task(session.post(sim.url + "/v1/completions", json=LONG))
        async with session.post(
            sim.url + "/v1/completions", json={**LONG, "stream": True}
        ) as response:
            await response.content.readline()
            await wait_until(lambda: sim.stats()["running"] == 2, "both requests running")
            response.close()
        await wait_until(lambda: metrics_now(sim).get(ABORTED) == 1, "the abort")
        await wait_until(lambda: metrics_now(sim)[RUNNING] == 1, "the gauge to drop")
        assert sim.stats()["running"] == 1
        assert not kept.done()
        kept.cancel()
        await asyncio.gather(kept, return_exceptions=True)


async def test_client_timeout_aborts_a_request_still_waiting() -> None:
    """A request given up while still queued leaves the queue; the running one is untouched."""
    async with (
        running_simulator(tokens_per_second=50, max_num_seqs=1) as sim,
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        kept = asyncio.create_task(session.post(sim.url + "/v1/completions", json=LONG))
        await wait_until(lambda: sim.stats()["running"] == 1, "the first request running")
        await abandon(sim, {**LONG, "stream": True})
        await wait_until(lambda: metrics_now(sim).get(ABORTED) == 1, "the abort")
        await wait_until(lambda: metrics_now(sim)[WAITING] == 0, "the waiting gauge to drop")
        assert sim.stats()["waiting"] == 0
        assert metrics_now(sim)[RUNNING] == 1
        assert not kept.done()
        kept.cancel()
        await asyncio.gather(kept, return_exceptions=True)


async def test_hung_engine_processes_the_abort_only_once_it_recovers() -> None:
    """A hung engine core keeps an abandoned request (frozen stats) until it recovers."""
    async with running_simulator(tokens_per_second=50) as sim:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            request = asyncio.create_task(session.post(sim.url + "/v1/completions", json=LONG))
            await wait_until(lambda: sim.stats()["running"] == 1, "the request running")
            sim.apply_fault("hang")
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)
        await wait_until(lambda: sim.stats()["in_flight"] == 0, "the handler to end")
        await asyncio.sleep(0.1)  # several ticks of the hung engine
        assert sim.stats()["running"] == 1
        assert metrics_now(sim).get(ABORTED) == 0
        sim.apply_fault("recover")
        await wait_until(lambda: sim.stats()["running"] == 0, "the abort after recovery")
        assert metrics_now(sim)[ABORTED] == 1
        assert metrics_now(sim)[RUNNING] == 0
