"""A base URL ending in /metrics: the simulator answers it as vLLM does; stallwatch refuses it."""

from __future__ import annotations

import asyncio

import aiohttp

from stallwatch.common.cli import EXIT_USAGE
from stallwatch.core.classify import State
from stallwatch.exporter.check_cli import run_check
from stallwatch.simulator.testing import running_simulator
from tests.support.check import check_target, run_cli


async def test_simulator_answers_every_path_under_metrics_with_metrics() -> None:
    """Like vLLM's mounted metrics app: GET or POST /metrics/anything answers the metrics."""
    async with running_simulator() as sim, aiohttp.ClientSession() as session:
        async with session.get(sim.url + "/metrics") as response:
            plain = await response.text()
        async with session.post(sim.url + "/metrics/v1/completions", json={}) as response:
            assert response.status == 200
            under = await response.text()
        async with session.get(sim.url + "/metrics/") as response:
            assert response.status == 200
    assert "vllm:num_requests_running" in plain
    assert "vllm:num_requests_running" in under


async def test_a_base_url_through_metrics_reads_a_healthy_server_as_unresponsive() -> None:
    """The hazard itself: with /metrics in the base URL, the idle test request fails."""
    async with running_simulator() as sim:
        result = await run_check(check_target(sim.url + "/metrics"))
    assert result.history.state == State.UNRESPONSIVE


async def test_check_refuses_a_metrics_url_as_a_usage_error() -> None:
    """`stallwatch check http://HOST:PORT/metrics` exits 64 and names the base URL to give."""
    async with running_simulator() as sim:
        completed = await asyncio.to_thread(
            run_cli, "check", sim.url + "/metrics", "--interval", "300ms", "--timeout", "300ms"
        )
    assert completed.returncode == EXIT_USAGE, completed.stdout
    assert f"give the server's base URL, {sim.url!r}" in completed.stderr
    assert sim.stats()["completions_by_user_agent"] == {}
