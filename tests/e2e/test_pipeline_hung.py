"""A hung server through the whole chain: simulator -> exporter -> Prometheus -> Alertmanager ->
the real restarter -> one restart of the simulator process.

The simulator keeps accepting connections and never answers: a vLLM API server with a blocked
event loop (its `api_hang` fault), or a `llama-server` stopped with SIGSTOP (the simulator's
llama.cpp mode with its `freeze` fault). Alive to any supervisor, hung to stallwatch. The stack,
the restarter and its restart script are those of `test_pipeline_restarter.py`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from stallwatch.core.classify import State
from tests.support.alerting_stack import poll
from tests.support.exporter import history, wait_for_state, wait_until
from tests.support.pipeline import (
    TIMEOUT,
    exporter_on_stack,
    rules_evaluated_after,
    seen_in_state,
    target,
    unique,
)
from tests.support.restarter_pipeline import (
    HTTP,
    SIM_ARGS,
    RestarterStack,
    restarter_for,
    restarter_stack,
    rows,
    simulator,
)

pytestmark = pytest.mark.e2e

__all__ = ["restarter_stack"]  # the module-scoped stack fixture, used by name


@pytest.mark.parametrize(
    ("engine", "sim_args", "fault"),
    [
        ("vllm", SIM_ARGS, "api_hang"),
        ("llamacpp", ("--engine", "llamacpp", *SIM_ARGS), "freeze"),
    ],
)
async def test_a_hung_server_is_restarted_once_through_the_whole_chain(
    restarter_stack: RestarterStack,
    tmp_path: Path,
    engine: str,
    sim_args: tuple[str, ...],
    fault: str,
) -> None:
    """A server that connects and never answers (vLLM's blocked API server, a stopped
    llama-server): hung in two polls, LLMServerHung fires, the real restarter confirms it with
    two unanswered reads and restarts the server once; the alert resolves."""
    stack, name = restarter_stack, unique(f"{engine}-hung")
    with simulator(tmp_path, sim_args) as sim:
        first_pid = sim.pid
        async with (
            aiohttp.ClientSession(timeout=HTTP) as session,
            restarter_for(stack, tmp_path, name, sim) as restarter,
            exporter_on_stack(stack, target(name, sim.url)) as service,
        ):
            await wait_for_state(service, name, State.IDLE, polls=2, timeout=TIMEOUT)
            await seen_in_state(stack, name, "idle")
            await stack.wait_for_query('up{job="stallwatch-restarter"} == 1', TIMEOUT)

            hung_at = time.time()
            await sim.fault(session, fault)
            await wait_for_state(service, name, State.HUNG, polls=2, timeout=TIMEOUT)

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

            await wait_until(
                lambda: history(service, name).restarts_detected == 1,
                timeout=TIMEOUT,
                what="the exporter to see the restart",
            )
            back = await wait_for_state(service, name, State.IDLE, polls=2, timeout=TIMEOUT)

            async def resolved() -> list[dict[str, Any]] | None:
                entries = await restarter.journal(session)
                return entries if rows(entries, name, "resolved") else None

            await poll(resolved, TIMEOUT, "the resolved notification")
            await rules_evaluated_after(stack, time.time())
            fired = stack.query(f'max_over_time(ALERTS{{target="{name}",alertstate="firing"}}[5m])')
            entries = await restarter.journal(session)

        assert first_pid != sim.pid
        assert sim.first.process.poll() is not None  # the hung process is gone

    decisions = [(e["decision"], e["reason"]) for e in entries if e["decision"] != "skip"]
    # The alert may resolve (the killed server reads down) before the action has finished.
    assert decisions[0] == ("restart", "confirmed"), entries
    assert sorted(decisions[1:]) == [("action_result", "success"), ("resolved", "resolved")]
    assert {e["target"] for e in entries} == {name}
    assert restart["alertname"] == "LLMServerHung"
    assert "connected, no answer, twice" in restart["detail"], restart
    assert result["result"] == "success"
    assert "simulator restarted as pid" in result["detail"]
    assert back.restarts_detected == 1
    # Of the restart alerts only LLMServerHung fired: a hung server is neither stuck nor
    # unresponsive. (LLMServerDown may fire too: the harness shortens its `for:` below the
    # seconds the killed simulator was down.)
    restart_alerts = {"LLMServerStuck", "LLMServerUnresponsive", "LLMServerHung"}
    fired_names = {series["metric"]["alertname"] for series in fired}
    assert fired_names & restart_alerts == {"LLMServerHung"}, fired
