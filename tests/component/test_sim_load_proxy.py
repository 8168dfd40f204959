"""The load generator and the least-connection proxy work against real simulators."""

from __future__ import annotations

import asyncio

import aiohttp

from simulator.load import run_load
from simulator.proxy import running_proxy
from simulator.testing import running_simulator

TIMEOUT = aiohttp.ClientTimeout(total=10)


async def test_load_generator_summary_counts_ok_and_user_agent() -> None:
    """run_load keeps requests in flight and reports them; the server sees its User-Agent."""
    async with running_simulator(tokens_per_second=2000, max_num_seqs=4) as sim:
        summary = await run_load(
            sim.url,
            concurrency=3,
            prompt_tokens=8,
            max_tokens=10,
            duration=0.5,
            user_agent="batch-job/1",
            wait_for_in_flight=True,
        )
        stats = sim.stats()
    assert summary.ok > 3
    assert summary.failed == 0
    assert summary.sent == summary.ok
    assert summary.completion_tokens == 10 * summary.ok
    assert stats["completions_by_user_agent"] == {"batch-job/1": summary.sent}
    assert "sent" in summary.format()


async def test_load_generator_counts_failures_by_status() -> None:
    """Requests the server rejects are counted under their HTTP status."""
    async with running_simulator() as sim:
        summary = await run_load(
            sim.url,
            concurrency=1,
            prompt_tokens=1,
            max_tokens=1,
            duration=0.2,
            model="nope",
            wait_for_in_flight=True,
        )
    assert summary.ok == 0
    assert summary.failed_by_status.get("404", 0) == summary.sent > 0


async def test_proxy_spreads_requests_over_two_backends() -> None:
    """The proxy sends concurrent completions and successive /metrics reads to both backends."""
    async with (
        running_simulator(tokens_per_second=200) as first,
        running_simulator(tokens_per_second=200) as second,
        running_proxy([first.url, second.url]) as (url, proxy),
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        payload = {"prompt": "x", "max_tokens": 20, "ignore_eos": True}
        responses = await asyncio.gather(
            *(session.post(url + "/v1/completions", json=payload) for _ in range(4))
        )
        assert [r.status for r in responses] == [200] * 4
        start_times = set()
        for _ in range(2):
            async with session.get(url + "/metrics") as response:
                text = await response.text()
                line = next(
                    ln for ln in text.splitlines() if ln.startswith("process_start_time_seconds")
                )
                start_times.add(line)
        assert len(start_times) == 2, "both /metrics reads came from the same backend"
        assert first.stats()["requests_total"] == 2
        assert second.stats()["requests_total"] == 2
        assert proxy.forwarded[first.url] == proxy.forwarded[second.url] == 3


async def test_proxy_streams_sse_through() -> None:
    """A streamed completion arrives through the proxy intact, ending with [DONE]."""
    async with (
        running_simulator(tokens_per_second=500) as sim,
        running_proxy([sim.url]) as (url, _proxy),
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
        session.post(
            url + "/v1/completions", json={"prompt": "x", "max_tokens": 3, "stream": True}
        ) as response,
    ):
        assert response.headers["Content-Type"].startswith("text/event-stream")
        text = await response.text()
    assert text.rstrip().endswith("data: [DONE]")
    assert text.count("data: ") == 4
