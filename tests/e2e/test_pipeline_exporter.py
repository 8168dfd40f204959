"""The real exporter against the simulator, scraped by real Prometheus running the project's rules.

Each test runs the simulator and the exporter in this event loop, the exporter on the port
the shared stack scrapes (one exporter at a time, stopped at the end of the test), with its
own target name. When an exporter stops, its series go stale on the next failed scrape, so
nothing of one test is left for the next; unique target names make sure of it anyway.

The scenarios that must fire nothing check, before they conclude, that the scenario really
happened (the exporter's per-poll states, and Prometheus' own samples of them), wait until the
rules were evaluated after the last scrape, and then read every restart alert of the target
over the whole test window with `max_over_time(ALERTS{...}[2m])`, so an alert that was
pending or firing for a moment is caught too.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from stallwatch.core.classify import State
from stallwatch.simulator.config import SimConfig
from stallwatch.simulator.load import LoadSummary, run_load
from stallwatch.simulator.testing import SimHandle, running_simulator
from tests.support.alerting_stack import AlertingStack, poll
from tests.support.exporter import history, wait_for_state, wait_until
from tests.support.pipeline import (
    POLL_INTERVAL,
    TIMEOUT,
    exporter_on_stack,
    notifications_about,
    record_polls,
    restart_alerts_over_window,
    rules_evaluated_after,
    seen_in_state,
    state_samples,
    target,
    unique,
)

pytestmark = pytest.mark.e2e

# Two requests running, two waiting: every poll sees work, and decode makes progress each step.
BUSY_SERVER = SimConfig(max_num_seqs=2, tokens_per_second=40.0)


@contextlib.asynccontextmanager
async def loaded(sim: SimHandle, concurrency: int = 2) -> AsyncIterator[asyncio.Task[LoadSummary]]:
    """A batch-job load on `sim` (long requests), cancelled when the block ends."""
    load: asyncio.Task[LoadSummary] = asyncio.create_task(
        run_load(sim.url, concurrency=concurrency, prompt_tokens=10, max_tokens=1_900, duration=120)
    )
    try:
        await wait_until(lambda: sim.stats()["running"] == 2, what="load running")
        yield load
    finally:
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)


async def assert_no_restart_alert(stack: AlertingStack, name: str) -> None:
    """After the rules have seen the last scrape: no restart alert ever, nowhere."""
    await rules_evaluated_after(stack, time.time())
    assert restart_alerts_over_window(stack, name) == []
    assert notifications_about(stack, name) == []
    assert [a for a in stack.am_alerts() if a["labels"].get("target") == name] == []


async def test_a_hang_under_load_fires_llm_server_stuck_at_the_restarter(
    alerting_stack: AlertingStack,
) -> None:
    """A hung engine with requests in flight reaches the restarter as Stuck, then resolves."""
    stack, name = alerting_stack, unique("hang")
    async with (
        running_simulator(BUSY_SERVER) as sim,
        loaded(sim),
        exporter_on_stack(stack, target(name, sim.url)) as service,
    ):
        await wait_for_state(service, name, State.BUSY, polls=2)
        await seen_in_state(stack, name, "busy")
        assert stack.receiver.find("LLMServerStuck", name) is None

        hung_at = time.monotonic()
        sim.apply_fault("hang")
        notification = await stack.receiver.wait_for("LLMServerStuck", name, timeout=TIMEOUT)
        print(
            f"hang -> LLMServerStuck webhook: {notification.received_monotonic - hung_at:.2f} s "
            f"(exporter poll {POLL_INTERVAL} s, scrape and evaluation 1 s, group_wait 0 s)"
        )
        stalled = history(service, name)

        recovered_at = time.monotonic()
        sim.apply_fault("recover")
        resolved = await stack.receiver.wait_for("LLMServerStuck", name, "resolved", TIMEOUT)
        print(f"recover -> resolved webhook: {resolved.received_monotonic - recovered_at:.2f} s")

    assert stalled.state == State.STALLED
    assert stalled.state_polls >= 2
    assert stalled.test_requests == 0  # a busy or stalled server never gets a test request
    (alert,) = notification.payload["alerts"]
    assert alert["labels"]["target"] == name
    assert alert["labels"]["severity"] == "critical"
    assert notification.payload["receiver"] == "stallwatch-restarter"
    assert notification.authorization == f"Bearer {stack.token}"
    assert stack.receiver.find("LLMServerUnresponsive", name) is None


async def test_a_long_batch_load_fires_nothing(alerting_stack: AlertingStack) -> None:
    """Thirty-odd polls of a server busy with a batch job: busy every poll, no alert, no probe."""
    stack, name = alerting_stack, unique("batch")
    async with (
        running_simulator(BUSY_SERVER) as sim,
        loaded(sim, concurrency=4),
        exporter_on_stack(stack, target(name, sim.url)) as service,
    ):
        polls = await record_polls(service, name, lambda h: h.polls >= 32, timeout=60)
        await seen_in_state(stack, name, "busy")
        final = history(service, name)
        await assert_no_restart_alert(stack, name)
        busy_scrapes = state_samples(stack, name, "busy")

    assert polls[0][0] == State.UNKNOWN  # the first read has nothing to compare with
    assert {state for state, _ in polls[1:]} == {State.BUSY}, polls
    assert len(polls) >= 32
    assert final.test_requests == 0
    assert busy_scrapes >= 10
    assert state_samples(stack, name, "stalled") == 0


async def test_a_long_prefill_fires_nothing(alerting_stack: AlertingStack) -> None:
    """A prompt prefilled in 16-token chunks over many polls (no output step) fires nothing."""
    stack, name = alerting_stack, unique("prefill")
    prompt = " ".join(f"w{i % 1000 + 3}" for i in range(16_000))  # about 4 s of prefill
    async with (
        running_simulator(
            max_num_batched_tokens=16, prefill_tokens_per_second=4000, max_model_len=40_000
        ) as sim,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
    ):
        request = asyncio.create_task(
            session.post(
                sim.url + "/v1/completions",
                json={"model": "tiny", "prompt": prompt, "max_tokens": 1},
            )
        )
        try:
            await wait_until(lambda: sim.stats()["running"] == 1, what="prefill started")
            steps_before = sim.stats()["engines"][0]["output_steps"]
            async with exporter_on_stack(stack, target(name, sim.url)) as service:
                polls = await record_polls(service, name, lambda h: h.polls >= 5, timeout=30)
                steps_after = sim.stats()["engines"][0]["output_steps"]
                await seen_in_state(stack, name, "busy")
                response = await request
                response.release()
                await wait_for_state(service, name, State.IDLE)
                await assert_no_restart_alert(stack, name)
                busy_scrapes = state_samples(stack, name, "busy")
        finally:
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)

    assert steps_after == steps_before  # still in prefill after five polls: no output step yet
    assert [state for state, _ in polls] == [State.UNKNOWN] + [State.BUSY] * 4
    assert busy_scrapes >= 1
    assert state_samples(stack, name, "stalled") == 0


async def test_a_one_poll_pause_fires_nothing(alerting_stack: AlertingStack) -> None:
    """A pause seen by exactly one stalled poll (and scraped) recovers without any alert.

    A pause shorter than one poll interval cannot read stalled at all (every pair of reads
    spans some progress), so the test holds the hang until one stalled poll has been read and
    scraped, and recovers before the next poll: the longest pause that must not fire. The
    target polls every 2 s so that Prometheus (1 s scrapes) sees the single stalled poll.
    """
    stack, name = alerting_stack, unique("pause")
    async with (
        running_simulator(BUSY_SERVER) as sim,
        loaded(sim),
        exporter_on_stack(stack, target(name, sim.url, interval=2.0)) as service,
    ):
        await wait_for_state(service, name, State.BUSY)
        sim.apply_fault("hang")
        await wait_for_state(service, name, State.STALLED)
        await seen_in_state(stack, name, "stalled")
        sim.apply_fault("recover")
        paused = history(service, name)
        after = await record_polls(service, name, lambda h: h.state == State.BUSY, timeout=10)
        await seen_in_state(stack, name, "busy")
        await assert_no_restart_alert(stack, name)

    assert (paused.state, paused.state_polls) == (State.STALLED, 1), "recovered too late"
    assert after[-1] == (State.BUSY, 1)
    assert state_samples(stack, name, "stalled") >= 1  # Prometheus saw the stalled poll


async def test_a_restart_under_load_fires_nothing(alerting_stack: AlertingStack) -> None:
    """A server restarted with requests in flight reads restarted once, then busy: no alert."""
    stack, name = alerting_stack, unique("restart")
    async with (
        running_simulator(BUSY_SERVER) as sim,
        loaded(sim),
        exporter_on_stack(stack, target(name, sim.url)) as service,
    ):
        await wait_for_state(service, name, State.BUSY, polls=2)
        await seen_in_state(stack, name, "busy")
        sim.apply_fault("restart")
        polls = await record_polls(
            service,
            name,
            lambda h: h.restarts_detected == 1 and h.state == State.BUSY and h.state_polls >= 4,
            timeout=20,
        )
        await stack.wait_for_query(
            f'stallwatch_restarts_detected_total{{target="{name}"}} == 1 and on(target) '
            f'stallwatch_target_state{{target="{name}",state="busy"}} == 1',
            TIMEOUT,
        )
        await assert_no_restart_alert(stack, name)

    states = [state for state, _ in polls]
    assert states.count(State.RESTARTED) == 1
    assert State.STALLED not in states
    assert state_samples(stack, name, "stalled") == 0


async def test_an_unresponsive_idle_server_fires_llm_server_unresponsive(
    alerting_stack: AlertingStack,
) -> None:
    """A server hung with running frozen at 0 fails the idle test request: LLMServerUnresponsive."""
    stack, name = alerting_stack, unique("unresponsive")
    async with running_simulator() as sim:
        sim.apply_fault("hang_before_update")
        async with exporter_on_stack(stack, target(name, sim.url)) as service:
            notification = await stack.receiver.wait_for(
                "LLMServerUnresponsive", name, timeout=TIMEOUT
            )
            found = history(service, name)

    assert found.state == State.UNRESPONSIVE
    assert found.test_request_failures >= 2
    (alert,) = notification.payload["alerts"]
    assert alert["labels"]["target"] == name
    assert stack.receiver.find("LLMServerStuck", name) is None


def _unix(rfc3339: str) -> float:
    return datetime.datetime.fromisoformat(rfc3339).timestamp()


async def test_stopping_the_exporter_fires_stallwatch_exporter_down(
    alerting_stack: AlertingStack,
) -> None:
    """The real exporter stopping fires StallwatchExporterDown, and its targets' series go stale."""
    stack, name = alerting_stack, unique("watched")

    async def exporter_down_resolved() -> bool | None:
        alerts = await asyncio.to_thread(stack.alerts)
        active = any(a["labels"]["alertname"] == "StallwatchExporterDown" for a in alerts)
        return None if active else True

    async with running_simulator() as sim:
        async with exporter_on_stack(stack, target(name, sim.url)):
            await seen_in_state(stack, name, "idle")
            # A gap between two earlier tests may have fired it; wait until it has resolved.
            await poll(exporter_down_resolved, TIMEOUT, "StallwatchExporterDown to resolve")
        stopped_at = time.time()
        alert = await stack.wait_for_alert("StallwatchExporterDown", "stallwatch-exporter")
        am_alert = await stack.wait_for_am_alert("StallwatchExporterDown", "stallwatch-exporter")

    assert _unix(alert["activeAt"]) >= stopped_at - 0.1
    assert alert["labels"]["severity"] == "critical"
    assert [receiver["name"] for receiver in am_alert["receivers"]] == ["default"]
    assert stack.query(f'stallwatch_target_state{{target="{name}"}}') == []
