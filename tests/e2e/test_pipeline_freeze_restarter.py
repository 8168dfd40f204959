"""A 70 s freeze at the shipped defaults, through the whole chain to the real restarter.

The same chain as `test_pipeline_restarter.py` (simulator process, exporter, Prometheus,
Alertmanager, the real `stallwatch restarter` with a command action), at the shipped timings:
15 s polls, a 5 s gap, the 5 m restart window. It takes about two minutes, so it has a module
(and a stack) of its own: the tier hands out whole files, and this one runs beside the others.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from stallwatch.core.classify import State
from tests.support.alerting_stack import poll
from tests.support.exporter import history
from tests.support.pipeline import TIMEOUT, exporter_on_stack, record_polls, target, unique
from tests.support.restarter_pipeline import (
    HTTP,
    RestarterStack,
    loaded,
    restarter_for,
    rows,
    simulator,
    wait_until_busy,
)

pytestmark = pytest.mark.e2e

# The exporter's shipped poll interval, and a silence of the length vLLM's JIT compiles take.
DEFAULT_INTERVAL = 15.0
FREEZE_SECONDS = 70.0


@pytest.mark.long_wait
async def test_a_70_s_freeze_that_ends_by_itself_is_never_restarted_at_the_defaults(
    restarter_stack: RestarterStack, tmp_path: Path
) -> None:
    """At the shipped defaults (15 s polls, 5 s gap, 5 m window) a busy server frozen for 70 s
    (a JIT compile) tells people, is never restarted, and is counted and journaled a near miss."""
    stack, name = restarter_stack, unique("gpu-jit")
    with simulator(tmp_path) as sim:
        first_pid = sim.pid
        async with (
            aiohttp.ClientSession(timeout=HTTP) as session,
            restarter_for(stack, tmp_path, name, sim, restart_after=None, gap="5s") as restarter,
            loaded(sim, session, concurrency=2),
            exporter_on_stack(stack, target(name, sim.url, interval=DEFAULT_INTERVAL)) as service,
        ):
            await wait_until_busy(stack, service, name, DEFAULT_INTERVAL)
            frozen_at = time.time()
            await sim.fault(session, "hang")
            states = await record_polls(
                service,
                name,
                lambda h: h.state == State.STALLED and h.state_polls >= 2,
                3 * DEFAULT_INTERVAL + TIMEOUT,
            )
            await stack.wait_for_query(
                f'ALERTS{{alertname="LLMServerStuck",alertstate="firing",target="{name}"}}',
                TIMEOUT,
            )
            told_at = time.time()

            async def window_opened() -> list[dict[str, Any]] | None:
                entries = await restarter.journal(session)
                waiting = [e for e in entries if e["reason"] == "restart_window"]
                return entries if waiting else None

            await poll(window_opened, TIMEOUT, f"the restart window\n{restarter.log_tail()}")
            await asyncio.sleep(max(0.0, frozen_at + FREEZE_SECONDS - time.time()))
            await sim.fault(session, "recover")

            async def near_miss() -> list[dict[str, Any]] | None:
                entries = await restarter.journal(session)
                reasons = {e["reason"] for e in entries}
                return entries if {"recovered_in_window", "resolved"} <= reasons else None

            entries = await poll(
                near_miss, 2 * DEFAULT_INTERVAL + TIMEOUT, f"the recovery\n{restarter.log_tail()}"
            )
            recorded = history(service, name)
            metrics = await restarter.metrics(session)
        assert sim.pid == first_pid  # never restarted
    print(f"freeze -> people told: {told_at - frozen_at:.1f} s; recovered after {FREEZE_SECONDS} s")
    assert not rows(entries, name, "restart")
    assert not rows(entries, name, "action_result")
    assert states[-1] == (State.STALLED, 2), states
    assert recorded.recovered_stalls == 1
    assert (recorded.last_recovered_stall_seconds or 0) >= FREEZE_SECONDS - 2 * DEFAULT_INTERVAL
    assert f'stallwatch_restarter_recovered_in_window_total{{target="{name}"}} 1.0' in metrics
