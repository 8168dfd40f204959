"""The real-vLLM infrastructure works, and the facts about vLLM that the design rests on hold."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.real.scenario_support import (
    CONCURRENT_GENERATIONS,
    QUEUED_GENERATIONS,
    finish_sustained,
    sustained_generations,
    sustained_lengths,
)
from tests.real.vllm_server import (
    RealVllmServer,
    complete,
    fetch_metrics,
    has_metric,
    metric_sum,
    wait_for_metric,
    word_prompt,
)

STEPS = "vllm:iteration_tokens_total_count"
RUNNING = "vllm:num_requests_running"
START_TIME = "process_start_time_seconds"
# A running engine's step count moves within milliseconds on a quiet machine; a loaded one may
# not run the engine for seconds.
STEP_MOVE_TIMEOUT_S = 30.0
STEP_READ_GAP_S = 0.1


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


async def _steps_over_one_second(
    session: aiohttp.ClientSession, server: RealVllmServer
) -> tuple[float, float, float]:
    """(step count, step count 1 s later, running at the second read)."""
    first = await fetch_metrics(session, server.base_url)
    await asyncio.sleep(1.0)
    second = await fetch_metrics(session, server.base_url)
    return (
        metric_sum(first, STEPS) or 0.0,
        metric_sum(second, STEPS) or 0.0,
        metric_sum(second, RUNNING) or 0.0,
    )


async def _steps_move(
    session: aiohttp.ClientSession, server: RealVllmServer
) -> tuple[float, float, float]:
    """(step count, the first different step count read after it, running at that read), read
    every STEP_READ_GAP_S for at most STEP_MOVE_TIMEOUT_S: how soon it moves is the CPU's."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STEP_MOVE_TIMEOUT_S
    before = metric_sum(await fetch_metrics(session, server.base_url), STEPS) or 0.0
    while True:
        await asyncio.sleep(STEP_READ_GAP_S)
        text = await fetch_metrics(session, server.base_url)
        after = metric_sum(text, STEPS) or 0.0
        if after != before or loop.time() > deadline:
            return before, after, metric_sum(text, RUNNING) or 0.0


async def test_default_server_publishes_the_series_the_exporter_reads(
    real_vllm: RealVllmServer, http: aiohttp.ClientSession
) -> None:
    """An idle default server's /metrics has the running gauge, step count and start time."""
    text = await fetch_metrics(http, real_vllm.base_url)

    assert has_metric(text, RUNNING)
    assert has_metric(text, STEPS)
    assert has_metric(text, START_TIME)


async def test_step_count_moves_while_long_generations_run(
    real_vllm: RealVllmServer, http: aiohttp.ClientSession
) -> None:
    """Four concurrent long generations move the step count while running > 0."""
    until = asyncio.Event()
    tasks = sustained_generations(http, real_vllm.base_url, until)
    try:
        await wait_for_metric(http, real_vllm.base_url, RUNNING, lambda value: (value or 0) > 0)
        before, after, running = await _steps_move(http, real_vllm)

        assert after > before
        assert running > 0
    finally:
        answers = await finish_sustained(tasks, until)
    assert [{answer["usage"]["completion_tokens"] for answer in loop} for loop in answers] == [
        {length} for length in sustained_lengths()
    ]


async def test_sigstopped_engine_core_freezes_the_step_count_but_not_health(
    real_vllm: RealVllmServer, http: aiohttp.ClientSession
) -> None:
    """A SIGSTOPped engine core freezes the step count, /health stays 200; SIGCONT resumes."""
    # Generations that end before the SIGSTOP would leave nothing running to freeze: on a fast
    # CPU four of one length can all end between two reads, so the load lasts until it is let go,
    # with some queued so that one starts in the step where another ends.
    until = asyncio.Event()
    tasks = sustained_generations(
        http, real_vllm.base_url, until, count=CONCURRENT_GENERATIONS + QUEUED_GENERATIONS
    )
    try:
        await wait_for_metric(http, real_vllm.base_url, RUNNING, lambda value: (value or 0) > 0)
        moving_before, moving_after, _ = await _steps_move(http, real_vllm)
        assert moving_after > moving_before

        real_vllm.sigstop_engine()
        try:
            # Outputs already on their way to the API server still land: let them.
            await asyncio.sleep(0.5)
            frozen_before, frozen_after, frozen_running = await _steps_over_one_second(
                http, real_vllm
            )
            async with http.get(f"{real_vllm.base_url}/health") as health:
                health_status = health.status
        finally:
            real_vllm.sigcont_engine()

        assert frozen_after == frozen_before
        assert frozen_running > 0
        assert health_status == 200

        resumed_before, resumed_after, _ = await _steps_move(http, real_vllm)
        assert resumed_after > resumed_before
    finally:
        answers = await finish_sustained(tasks, until)
    assert all(answers), "every loop is answered at least once"


async def test_two_api_servers_publish_no_process_start_time(
    real_vllm_two_api_servers: RealVllmServer, http: aiohttp.ClientSession
) -> None:
    """With --api-server-count 2 (multiprocess metrics) there is no process_start_time_seconds."""
    server = real_vllm_two_api_servers
    await complete(http, server.base_url, word_prompt(4), 2)

    text = await wait_for_metric(
        http, server.base_url, STEPS, lambda value: value is not None and value > 0
    )

    assert has_metric(text, RUNNING)
    assert not has_metric(text, START_TIME)
