"""Faults injected over HTTP behave like the real failures of a vLLM server."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from stallwatch.simulator.faults import RESTART_MESSAGE
from stallwatch.simulator.testing import SimHandle, engine_sample, read_metrics, running_simulator

TIMEOUT = aiohttp.ClientTimeout(total=10)
RUNNING = engine_sample("vllm:num_requests_running")
WAITING = engine_sample("vllm:num_requests_waiting")
STEP_COUNT = engine_sample("vllm:iteration_tokens_total_count")
TOKENS = engine_sample("vllm:generation_tokens_total")
LONG = {"prompt": "hello", "max_tokens": 1500, "ignore_eos": True}


async def inject(session: aiohttp.ClientSession, sim: SimHandle, **body: Any) -> None:
    async with session.post(sim.url + "/sim/fault", json=body) as response:
        assert response.status == 200, await response.text()


def engine_series(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith("vllm:")}


async def start_requests(
    session: aiohttp.ClientSession, sim: SimHandle, count: int
) -> list[asyncio.Task[aiohttp.ClientResponse]]:
    tasks = [
        asyncio.create_task(session.post(sim.url + "/v1/completions", json=LONG))
        for _ in range(count)
    ]
    await asyncio.sleep(0.2)
    return tasks


async def test_hang_freezes_metrics_but_health_stays_ok() -> None:
    """hang: /health 200, /metrics answers with the same frozen values, running > 0."""
    async with (
        running_simulator(tokens_per_second=500) as sim,
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
    ):
        tasks = await start_requests(s, sim, 2)
        await inject(s, sim, fault="hang")
        first = await read_metrics(s, sim.url)
        await asyncio.sleep(0.3)
        second = await read_metrics(s, sim.url)
        async with s.get(sim.url + "/health") as response:
            assert response.status == 200
        assert engine_series(first) == engine_series(second)
        assert second[RUNNING] == 2.0
        assert not any(task.done() for task in tasks)
        for task in tasks:
            task.cancel()


async def test_hang_before_update_reads_zero_and_never_serves() -> None:
    """hang_before_update: running and waiting read 0 and a new completion never finishes."""
    async with (
        running_simulator(tokens_per_second=500) as sim,
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
    ):
        await inject(s, sim, fault="hang_before_update")
        with pytest.raises(TimeoutError):
            async with s.post(
                sim.url + "/v1/completions",
                json={"prompt": "x", "max_tokens": 1},
                timeout=aiohttp.ClientTimeout(total=0.5),
            ):
                pass
        metrics = await read_metrics(s, sim.url)
        assert metrics[RUNNING] == 0.0
        assert metrics[WAITING] == 0.0
        assert sim.stats()["requests_total"] == 1


async def test_crash_closes_the_port() -> None:
    """crash: in-flight requests fail, then the listening socket closes (connection refused)."""
    async with (
        running_simulator(tokens_per_second=500) as sim,
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
    ):
        tasks = await start_requests(s, sim, 1)
        await inject(s, sim, fault="crash")
        response = await tasks[0]
        assert response.status == 500
        await asyncio.wait_for(sim.server.crashed.wait(), timeout=5)
        with pytest.raises(aiohttp.ClientConnectorError):
            async with aiohttp.ClientSession(timeout=TIMEOUT) as fresh:
                await fresh.get(sim.url + "/health")


async def test_restart_fails_in_flight_and_resets_counters() -> None:
    """restart: in-flight requests get vLLM's 500, counters start from 0, new start time."""
    async with (
        running_simulator(tokens_per_second=500) as sim,
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
    ):
        tasks = await start_requests(s, sim, 2)
        before = await read_metrics(s, sim.url)
        assert before[TOKENS] > 0
        await inject(s, sim, fault="restart")
        for task in tasks:
            response = await task
            assert response.status == 500
            body = await response.json()
            assert body["error"]["message"] == RESTART_MESSAGE
            assert body["error"]["type"] == "InternalServerError"
        after = await read_metrics(s, sim.url)
        assert after[TOKENS] == 0.0
        assert after[STEP_COUNT] == 0.0
        assert after["process_start_time_seconds{}"] > before["process_start_time_seconds{}"]


async def test_restart_with_downtime_refuses_then_returns() -> None:
    """restart with downtime_seconds: the port refuses connections, then serves again."""
    async with running_simulator() as sim, aiohttp.ClientSession(timeout=TIMEOUT) as s:
        await inject(s, sim, fault="restart", downtime_seconds=0.5)
        await asyncio.sleep(0.2)
        with pytest.raises(aiohttp.ClientConnectorError):
            async with aiohttp.ClientSession(timeout=TIMEOUT) as fresh:
                await fresh.get(sim.url + "/health")
        await asyncio.sleep(0.6)
        async with (
            aiohttp.ClientSession(timeout=TIMEOUT) as fresh,
            fresh.get(sim.url + "/health") as response,
        ):
            assert response.status == 200


async def test_slow_then_recover_changes_generation_rate() -> None:
    """slow lowers the token rate, recover restores it; hang then recover resumes stepping."""
    async with (
        running_simulator(tokens_per_second=2000) as sim,
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
    ):
        tasks = await start_requests(s, sim, 2)

        async def tokens_per_second(seconds: float) -> float:
            first, started = await read_metrics(s, sim.url), time.monotonic()
            await asyncio.sleep(seconds)
            second = await read_metrics(s, sim.url)
            return (second[TOKENS] - first[TOKENS]) / (time.monotonic() - started)

        # A loaded machine may admit the requests late: measure once they generate.
        for _ in range(400):
            if (await read_metrics(s, sim.url))[TOKENS] > 0:
                break
            await asyncio.sleep(0.05)
        fast = await tokens_per_second(0.5)
        await inject(s, sim, fault="slow", tokens_per_second=20)
        slow = await tokens_per_second(1.5)
        assert sim.stats()["fault"] == "slow"
        await inject(s, sim, fault="hang")
        hung = await tokens_per_second(0.3)
        await inject(s, sim, fault="recover")
        recovered = await tokens_per_second(0.5)
        for task in tasks:
            task.cancel()
        rates = f"fast {fast}, slow {slow}, hung {hung}, recovered {recovered}"
        assert hung == 0, rates
        assert 0 < slow < fast / 5, rates
        assert recovered > slow * 5, rates
        assert sim.stats()["fault"] is None


async def test_bad_fault_options_are_rejected() -> None:
    """A slow fault without a positive speed is a 400 that names the field."""
    async with running_simulator() as sim, aiohttp.ClientSession(timeout=TIMEOUT) as s:
        async with s.post(sim.url + "/sim/fault", json={"fault": "slow"}) as response:
            assert response.status == 400
            assert "tokens_per_second" in (await response.json())["error"]["message"]
        assert sim.stats()["fault"] is None


async def test_degrade_checks_its_options_and_recover_undoes_every_mode() -> None:
    """A degrade with an unknown mode or a factor outside (0, 1] is a 400 naming it; each mode
    changes its engine knob, and recover puts speed, admission and KV cache back."""
    async with running_simulator() as sim, aiohttp.ClientSession(timeout=TIMEOUT) as s:
        for body, word in (
            ({"fault": "degrade", "mode": "sideways"}, "mode"),
            ({"fault": "degrade", "factor": 0}, "factor"),
            ({"fault": "degrade", "factor": 2}, "factor"),
        ):
            async with s.post(sim.url + "/sim/fault", json=body) as response:
                assert response.status == 400
                assert word in (await response.json())["error"]["message"]
        engine = sim.engine
        await inject(s, sim, fault="degrade", mode="throughput", factor=0.5)
        assert engine.tokens_per_second == sim.server.config.tokens_per_second * 0.5
        await inject(s, sim, fault="degrade", mode="admission")
        assert engine.admitting is False
        await inject(s, sim, fault="degrade", mode="preemption", factor=0.25)
        assert engine.kv_cache_tokens == sim.server.config.kv_cache_tokens // 4
        assert sim.stats()["fault"] == "degrade:preemption"
        await inject(s, sim, fault="recover")
        assert engine.tokens_per_second == sim.server.config.tokens_per_second
        assert engine.admitting is True
        assert engine.kv_cache_tokens == sim.server.config.kv_cache_tokens
        assert sim.stats()["fault"] is None
