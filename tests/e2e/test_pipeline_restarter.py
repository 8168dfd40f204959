"""The whole chain: simulator -> exporter -> Prometheus -> Alertmanager -> restarter -> restart.

Why a stack of its own: the shared `alerting_stack` sends the restart alerts to a recording
stand-in. Here Alertmanager must call the real restarter, so this module starts its own
Prometheus and Alertmanager (module scope) through the same harness, with the restarter
receiver's webhook URL pointed at `restarter_port`: the port where each test runs the real
`stallwatch restarter` as a subprocess, and where Prometheus already scrapes job
stallwatch-restarter. As in production, one listen address serves both `POST /alerts` and
`GET /metrics`, and nothing in the test relays or rewrites a notification. (The harness has no
parameter for the webhook URL, so the module swaps in a receiver whose `url` is the
restarter's; a `webhook_url` argument to `AlertingStack` would make this one line.)

The simulator runs as a real process. The restarter's action is a `command`: a small script
that kills the simulator process by its PID (SIGKILL, as a hung engine may not stop on
SIGTERM), starts a new one on the same port and waits for its /health. The same chain at the
shipped timings (a 70 s freeze) is `test_pipeline_freeze_restarter.py`, a module of its own.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from stallwatch.core.classify import State
from tests.support.alerting_stack import (
    poll,
)
from tests.support.exporter import history, wait_until
from tests.support.pipeline import (
    TIMEOUT,
    exporter_on_stack,
    record_polls,
    rules_evaluated_after,
    target,
    unique,
)
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

# The shipped 5 m window over 15 s polls, scaled to the test's 0.5 s polls (20 polls).
SCALED_WINDOW = "6s"


async def test_a_hang_is_restarted_once_and_the_server_comes_back(
    restarter_stack: RestarterStack, tmp_path: Path
) -> None:
    """A hung simulator is restarted exactly once by the real restarter, and the alert resolves."""
    stack, name = restarter_stack, unique("gpu-hang")
    with simulator(tmp_path) as sim:
        first_pid = sim.pid
        async with (
            aiohttp.ClientSession(timeout=HTTP) as session,
            restarter_for(stack, tmp_path, name, sim) as restarter,
            loaded(sim, session, concurrency=2),
            exporter_on_stack(stack, target(name, sim.url)) as service,
        ):
            await wait_until_busy(stack, service, name)

            hung_at = time.time()
            await sim.fault(session, "hang")

            async def restarted() -> list[dict[str, Any]] | None:
                entries = await restarter.journal(session)
                return entries if rows(entries, name, "action_result") else None

            entries = await poll(restarted, 60, f"a restart of {name}\n{restarter.log_tail()}")
            (restart,) = rows(entries, name, "restart")
            (result,) = rows(entries, name, "action_result")
            print(
                f"hang -> restart decision: {restart['time'] - hung_at:.2f} s; "
                f"hang -> action finished: {result['time'] - hung_at:.2f} s "
                f"(action {result['duration_seconds']:.2f} s)"
            )

            # The new process is read as restarted, then busy again as the load refills it.
            await wait_until(
                lambda: history(service, name).restarts_detected == 1,
                timeout=TIMEOUT,
                what="the exporter to see the restart",
            )
            after = await record_polls(
                service, name, lambda h: h.state == State.BUSY and h.state_polls >= 2, TIMEOUT
            )

            async def resolved() -> list[dict[str, Any]] | None:
                entries = await restarter.journal(session)
                return entries if rows(entries, name, "resolved") else None

            entries = await poll(resolved, TIMEOUT, "the resolved notification")
            await stack.wait_for_query(
                f'stallwatch_restarter_restarts_total{{target="{name}",result="success"}} == 1',
                TIMEOUT,
            )
            await rules_evaluated_after(stack, time.time())
            entries = await restarter.journal(session)
            metrics = await restarter.metrics(session)

        assert first_pid != sim.pid
        assert sim.first.process.poll() is not None  # the hung process is gone

    decisions = [(e["decision"], e["reason"]) for e in entries if e["decision"] != "skip"]
    # The alert may resolve (the killed server reads down) before the action has finished.
    assert decisions[0] == ("restart", "confirmed"), entries
    assert sorted(decisions[1:]) == [("action_result", "success"), ("resolved", "resolved")]
    assert {e["target"] for e in entries} == {name}
    assert restart["alertname"] == "LLMServerStuck"
    assert result["result"] == "success"
    assert "simulator restarted as pid" in result["detail"]
    assert State.STALLED not in [state for state, _ in after]
    assert f'stallwatch_restarter_restarts_total{{result="success",target="{name}"}} 1.0' in metrics
    assert f'stallwatch_restarter_restarts_total{{result="failure",target="{name}"}} 0.0' in metrics


async def test_a_hang_outlasting_its_window_is_restarted_once_after_it(
    restarter_stack: RestarterStack, tmp_path: Path
) -> None:
    """A real hang is still restarted: the restarter waits out its window with no second
    delivery, then restarts once (the shipped 5 m window scaled to the test's 0.5 s polls)."""
    stack, name = restarter_stack, unique("gpu-hang-window")
    with simulator(tmp_path) as sim:
        first_pid = sim.pid
        async with (
            aiohttp.ClientSession(timeout=HTTP) as session,
            restarter_for(stack, tmp_path, name, sim, restart_after=SCALED_WINDOW) as restarter,
            loaded(sim, session, concurrency=2),
            exporter_on_stack(stack, target(name, sim.url)) as service,
        ):
            await wait_until_busy(stack, service, name)
            hung_at = time.time()
            await sim.fault(session, "hang")

            async def restarted() -> list[dict[str, Any]] | None:
                entries = await restarter.journal(session)
                return entries if rows(entries, name, "action_result") else None

            await poll(restarted, 60, f"a restart of {name}\n{restarter.log_tail()}")

            async def resolved() -> list[dict[str, Any]] | None:
                entries = await restarter.journal(session)
                return entries if rows(entries, name, "resolved") else None

            # Its resolved notice must reach this restarter, not the next test's on the same port.
            entries = await poll(resolved, TIMEOUT, "the resolved notification")
        assert first_pid != sim.pid
    waiting = [e for e in entries if e["reason"] == "restart_window"]
    (restart,) = rows(entries, name, "restart")
    assert waiting
    assert restart["time"] - min(e["time"] for e in waiting) >= 6.0
    print(
        f"hang -> window opened: {min(e['time'] for e in waiting) - hung_at:.1f} s; "
        f"hang -> restart decision: {restart['time'] - hung_at:.1f} s (window {SCALED_WINDOW})"
    )


async def test_a_batch_load_is_never_restarted(
    restarter_stack: RestarterStack, tmp_path: Path
) -> None:
    """Thirty-odd busy polls: the restarter gets no notification and restarts nothing."""
    stack, name = restarter_stack, unique("gpu-batch")
    with simulator(tmp_path) as sim:
        first_pid = sim.pid
        async with (
            aiohttp.ClientSession(timeout=HTTP) as session,
            restarter_for(stack, tmp_path, name, sim) as restarter,
            loaded(sim, session, concurrency=4),
            exporter_on_stack(stack, target(name, sim.url)) as service,
        ):
            await wait_until_busy(stack, service, name)
            polls = await record_polls(service, name, lambda h: h.polls >= 32, timeout=60)
            await rules_evaluated_after(stack, time.time())
            scraped = stack.query(
                f'stallwatch_restarter_restarts_total{{target="{name}",job="stallwatch-restarter"}}'
            )
            entries = await restarter.journal(session)
            metrics = await restarter.metrics(session)

        assert sim.pid == first_pid
        assert sim.first.process.poll() is None  # still the same, running process

    assert {state for state, _ in polls} == {State.BUSY}, polls
    assert polls[-1][1] >= 31  # 31 consecutive busy polls or more
    assert entries == [], [(e["decision"], e["reason"], e["detail"]) for e in entries]
    assert "stallwatch_restarter_webhook_requests_total{" not in metrics  # no notification
    # Prometheus scrapes the restarter: the target's restart counters, all zero.
    assert sorted((series["metric"]["result"], series["value"][1]) for series in scraped) == [
        ("failure", "0"),
        ("success", "0"),
        ("timeout", "0"),
    ]
