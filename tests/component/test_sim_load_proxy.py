"""The load generator and the least-connection proxy work against real simulators."""

from __future__ import annotations

import asyncio

import aiohttp

from stallwatch.simulator.load import run_load
from stallwatch.simulator.proxy import running_proxy
from stallwatch.simulator.testing import SimHandle, running_simulator

TIMEOUT = aiohttp.ClientTimeout(total=10)


async def running_at_least(sim: SimHandle, count: int, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while sim.stats()["running"] < count:
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {count} requests running")
        await asyncio.sleep(0.02)


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


async def test_proxy_skips_a_stopped_backend() -> None:
    """With one of two backends stopped, every request through the proxy still succeeds."""
    async with (
        running_simulator(tokens_per_second=2000) as stopped,
        running_simulator(tokens_per_second=2000) as alive,
    ):
        await stopped.server.stop()  # its port now refuses connections
        async with (
            running_proxy([stopped.url, alive.url], failure_backoff_seconds=60) as (url, proxy),
            aiohttp.ClientSession(timeout=TIMEOUT) as session,
        ):
            statuses = []
            for _ in range(3):
                async with session.get(url + "/v1/models") as response:
                    statuses.append(response.status)
                    assert (await response.json())["data"][0]["id"] == "tiny"
            payload = {"prompt": "x", "max_tokens": 5, "ignore_eos": True}
            responses = await asyncio.gather(
                *(session.post(url + "/v1/completions", json=payload) for _ in range(4))
            )
            statuses += [r.status for r in responses]
            for response in responses:
                response.release()
        assert statuses == [200] * 7
        assert alive.stats()["requests_total"] == 4
        # Tried once, then avoided while marked failing.
        assert proxy.connect_failures == {stopped.url: 1, alive.url: 0}
        assert proxy.forwarded == {stopped.url: 0, alive.url: 7}
        assert proxy.in_flight == {stopped.url: 0, alive.url: 0}


async def test_proxy_answers_502_when_no_backend_accepts() -> None:
    """When every backend refuses the connection, the proxy answers 502 naming them."""
    async with running_simulator() as first, running_simulator() as second:
        await first.server.stop()
        await second.server.stop()
        async with (
            running_proxy([first.url, second.url]) as (url, proxy),
            aiohttp.ClientSession(timeout=TIMEOUT) as session,
            session.post(url + "/v1/completions", json={"prompt": "x"}) as response,
        ):
            assert response.status == 502
            error = (await response.json())["error"]
    assert error["code"] == 502
    assert first.url in error["message"]
    assert second.url in error["message"]
    assert proxy.connect_failures == {first.url: 1, second.url: 1}


async def test_load_generator_stops_on_cue() -> None:
    """Setting `stop` ends a long run early; requests in flight are cancelled as unfinished."""
    async with running_simulator(tokens_per_second=50, max_num_seqs=4) as sim:
        stop = asyncio.Event()
        load = asyncio.create_task(
            run_load(
                sim.url, concurrency=2, prompt_tokens=4, max_tokens=1_000, duration=600, stop=stop
            )
        )
        await running_at_least(sim, 2)
        stop.set()
        summary = await asyncio.wait_for(load, timeout=10)
    assert summary.sent == 2
    assert summary.unfinished == 2
    assert summary.ok == 0
    assert summary.failed == 0


async def test_load_generator_stop_lets_requests_finish_when_waiting() -> None:
    """With wait_for_in_flight, `stop` sends nothing new but lets requests in flight finish."""
    async with running_simulator(tokens_per_second=200, max_num_seqs=4) as sim:
        stop = asyncio.Event()
        load = asyncio.create_task(
            run_load(
                sim.url,
                concurrency=2,
                prompt_tokens=4,
                max_tokens=40,
                duration=600,
                stop=stop,
                wait_for_in_flight=True,
            )
        )
        await running_at_least(sim, 2)
        stop.set()
        summary = await asyncio.wait_for(load, timeout=10)
    assert summary.unfinished == 0
    assert summary.ok == summary.sent >= 2
    assert summary.completion_tokens == 40 * summary.ok
