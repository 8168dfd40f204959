"""The exporter and `stallwatch check` against every simulated engine: `kind: auto` identifies
the engine before it reads an engine-specific path and never calls an endpoint the engine's
profile marks unsafe; a trtllm-serve whose stale gauges read 0 gets no test request."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from stallwatch import USER_AGENT
from stallwatch.common.exporter_config import IdleTestRequestConfig
from stallwatch.core.classify import State
from stallwatch.engines import PROFILES
from stallwatch.exporter.check_cli import run_check
from stallwatch.simulator.config import SimConfig
from stallwatch.simulator.engines import ENGINES
from stallwatch.simulator.load import run_load
from stallwatch.simulator.server import SimServer
from stallwatch.simulator.testing import running_simulator
from tests.support.exporter import (
    TEST_REQUEST_TIMEOUT,
    exporter_for,
    history,
    record_histories,
    scrape,
    target,
    wait_for_state,
    wait_until,
)

NAME = "engine"
# A test request on every idle poll (no min_interval): the fix, not the schedule, must hold it.
EVERY_POLL = IdleTestRequestConfig(timeout_seconds=TEST_REQUEST_TIMEOUT, min_interval_seconds=0.0)
IDENTIFY = "GET /v1/models"
FIRST_REQUEST = {"model": "tiny", "prompt": "the of and", "max_tokens": 2}


def _calls(endpoints: object) -> set[str]:
    return {f"{e.method} {e.path}" for e in endpoints}  # type: ignore[attr-defined]


@pytest.mark.parametrize("engine", ENGINES)
async def test_auto_mode_never_calls_an_endpoint_the_engine_marks_unsafe(engine: str) -> None:
    """In auto mode the exporter and check call only `/v1/models` and the engine's safe paths."""
    profile = PROFILES[engine]
    async with running_simulator(engine=engine) as sim:
        # One finished request first: TGI publishes no series before its first request.
        async with (
            aiohttp.ClientSession() as session,
            session.post(sim.url + "/v1/completions", json=FIRST_REQUEST) as response,
        ):
            assert response.status == 200
        sim.server.requests_by_path.clear()
        async with exporter_for(target(NAME, sim.url, test_request=EVERY_POLL)) as (service, _):
            polls = await record_histories(service, NAME, until=lambda h: h.polls >= 4, timeout=20)
        check = await run_check(target("check", sim.url, test_request=EVERY_POLL))
        called = set(sim.server.requests_by_path)
    print(f"{engine}: {dict(sim.server.requests_by_path)}; check {check.as_json()['state']}")
    assert not called & _calls(profile.unsafe_endpoints), called
    assert called <= _calls(profile.safe_endpoints) | {IDENTIFY}, called
    assert IDENTIFY in called  # identified before any metrics path was read
    baseline = polls[-1].baseline
    assert baseline is not None
    assert baseline.engine_kind == engine
    assert check.as_json()["engine"] == engine


@pytest.mark.parametrize("kind", ["trtllm", "auto"])
async def test_trtllm_going_from_idle_to_busy_with_gauges_at_zero_gets_no_test_request(
    kind: str,
) -> None:
    """Idle, then three long requests whose gauges stay 0: no test request, counter flat."""
    metrics_path = {"metrics_path": "/prometheus/metrics"} if kind == "trtllm" else {}
    config = target(NAME, "", kind=kind, test_request=EVERY_POLL, **metrics_path)
    # 1 900 tokens at 20 tokens/s: no request completes while the test watches.
    async with running_simulator(engine="trtllm", max_num_seqs=4, tokens_per_second=20) as sim:
        watched = config.__class__(**{**config.__dict__, "url": sim.url})
        async with exporter_for(watched) as (service, url):
            idle = await record_histories(service, NAME, until=lambda h: h.polls >= 3, timeout=20)
            before = await scrape(url)
            load = asyncio.create_task(
                run_load(sim.url, concurrency=3, prompt_tokens=10, max_tokens=1_900, duration=60)
            )
            try:
                await wait_until(lambda: sim.stats()["running"] == 3, what="three in flight")
                start = history(service, NAME).polls
                busy = await record_histories(
                    service, NAME, until=lambda h: h.polls >= start + 4, timeout=20
                )
                after = await scrape(url)
                check = await run_check(
                    target("check", sim.url, kind=kind, test_request=EVERY_POLL, **metrics_path)
                )
                payload = sim.server.flavour.render().body  # type: ignore[union-attr]
            finally:
                load.cancel()
                await asyncio.gather(load, return_exceptions=True)
    probes = ("stallwatch_test_requests_total", (("target", NAME),))
    states = [(h.state, h.verdict.reason if h.verdict else "") for h in (*idle, *busy)]
    print(states)
    assert 'trtllm_num_requests_running{engine_type="undefined"' in payload
    assert "} 0.0" in payload.split("trtllm_num_requests_running{", 1)[1].split("\n", 1)[0]
    assert before[probes] == 0
    assert after[probes] == 0
    assert all(h.test_requests == 0 for h in (*idle, *busy))
    assert USER_AGENT not in sim.stats()["completions_by_user_agent"]
    assert {state for state, _ in states} == {State.UNKNOWN}, states
    assert all("idle is unprovable" in reason for _, reason in states[1:]), states
    assert check.history.test_requests == 0
    assert check.as_json()["state"] == State.UNKNOWN


async def test_a_trtllm_serve_replacing_a_vllm_at_the_same_address_is_identified_again() -> None:
    """After a poll without a reading, auto asks `/v1/models` again: no trtllm `/metrics`."""
    vllm = SimServer(SimConfig())
    url = await vllm.start("127.0.0.1", 0)
    port = vllm.port
    trtllm = SimServer(SimConfig(engine="trtllm"))
    try:
        async with exporter_for(target(NAME, url)) as (service, _):
            first = await record_histories(service, NAME, until=lambda h: h.polls >= 2, timeout=20)
            await vllm.stop()  # the address answers nothing for a while: a poll reads down
            await wait_for_state(service, NAME, State.DOWN)
            await trtllm.start("127.0.0.1", port)
            after = await record_histories(
                service,
                NAME,
                until=lambda h: h.baseline is not None and h.baseline.engine_kind == "trtllm",
                timeout=20,
            )
    finally:
        await vllm.stop()
        await trtllm.stop()
    baseline = first[-1].baseline
    assert baseline is not None
    assert baseline.engine_kind == "vllm"
    assert after[-1].state != State.DOWN
    assert "GET /metrics" not in trtllm.requests_by_path, dict(trtllm.requests_by_path)
    assert trtllm.requests_by_path["GET /v1/models"] >= 1


async def test_a_vllm_engine_held_by_its_fault_tolerance_is_neither_stalled_nor_tested() -> None:
    """A faulted engine waiting for its orchestrator reads unknown, gets no test request."""
    async with running_simulator(fault_tolerance=True, max_num_seqs=2, tokens_per_second=40) as sim:
        load = asyncio.create_task(
            run_load(sim.url, concurrency=2, prompt_tokens=10, max_tokens=1_900, duration=60)
        )
        try:
            await wait_until(lambda: sim.stats()["running"] == 2, what="two in flight")
            async with exporter_for(target(NAME, sim.url, test_request=EVERY_POLL)) as (
                service,
                url,
            ):
                await wait_for_state(service, NAME, State.BUSY)
                sim.server.apply_fault("engine_fault", {})
                start = history(service, NAME).polls
                held = await record_histories(
                    service, NAME, until=lambda h: h.polls >= start + 5, timeout=20
                )
                metrics = await scrape(url)
        finally:
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
    states = [(h.state, h.verdict.reason if h.verdict else "") for h in held]
    print(states, dict(sim.server.requests_by_path))
    assert State.STALLED not in {state for state, _ in states}, states
    assert held[-1].state == State.UNKNOWN
    assert "fault tolerance holds engine 0 unhealthy" in states[-1][1]
    assert metrics[("stallwatch_test_requests_total", (("target", NAME),))] == 0
    assert "GET /fault_tolerance/status" in sim.server.requests_by_path
    assert "POST /fault_tolerance/apply" not in sim.server.requests_by_path
