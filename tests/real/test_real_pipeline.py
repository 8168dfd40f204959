"""The whole chain on a real vLLM server: a hung engine core is restarted once, by the restarter.

real vLLM -> exporter -> Prometheus -> Alertmanager -> restarter -> command -> restart

Prometheus and Alertmanager are the real binaries, with the project's own rules and routing
(`stallwatch.localstack`, timings shortened only), and Alertmanager's restarter webhook points at
the real `stallwatch restarter` subprocess. Its action is a `command`: a small script that asks
for the restart through a request file and exits 0 only once the server answers /health again.
The test's supervisor loop sees the request and restarts the session server (`restart()`: stop
its process group, start it on the same port), so the fixture that owns the server keeps owning
it. That is the one piece a deployment does differently (there the command would be
`systemctl restart vllm` or `docker restart`): everything that decides, all the way to running
the command, is the production code.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from stallwatch.core.classify import State
from tests.real.pipeline_support import (
    HTTP,
    NAME,
    RESTART_WAIT_S,
    STEP_TIMEOUT_S,
    PipelineStack,
    decisions,
    exporter_on,
    running_restarter,
    supervise,
    wait_for_query,
)
from tests.real.scenario_support import (
    CONCURRENT_GENERATIONS,
    cancel_all,
    sustained_generations,
    wait_for_polls,
    wait_for_running,
)
from tests.real.vllm_server import RealVllmServer
from tests.support.exporter import history, wait_for_state, wait_until


async def test_hung_real_engine_is_restarted_once_through_the_whole_chain(
    real_vllm: RealVllmServer, pipeline_stack: PipelineStack, tmp_path: Path
) -> None:
    """SIGSTOPped EngineCore: LLMServerStuck fires, the restarter restarts it once, it resolves."""
    stack = pipeline_stack.stack
    restarts: list[int] = []
    first_pid = real_vllm.pid
    starts_before = real_vllm.starts
    supervisor = asyncio.create_task(
        supervise(real_vllm, tmp_path / "restart.request", tmp_path / "restart.done", restarts)
    )
    try:
        async with (
            aiohttp.ClientSession(timeout=HTTP) as session,
            running_restarter(pipeline_stack, tmp_path, real_vllm) as restarter,
            exporter_on(pipeline_stack, real_vllm) as service,
        ):
            # Idle first, its test request answered: a test request sent as the load arrives
            # waits behind it, and the poll with it, for the whole test request timeout.
            await wait_for_polls(service, NAME, State.IDLE, polls=1, timeout=STEP_TIMEOUT_S)
            hung = asyncio.Event()
            load = sustained_generations(session, real_vllm.base_url, hung)
            try:
                await wait_for_running(session, real_vllm.base_url, CONCURRENT_GENERATIONS)
                await wait_for_polls(service, NAME, State.BUSY, polls=2, timeout=STEP_TIMEOUT_S)
                await wait_for_query(
                    stack,
                    f'stallwatch_target_state{{target="{NAME}",state="busy"}} == 1',
                    STEP_TIMEOUT_S,
                )
                await wait_for_query(stack, 'up{job="stallwatch-restarter"} == 1', STEP_TIMEOUT_S)

                hung_at = time.time()
                real_vllm.sigstop_engine()
                hung.set()  # what is in flight now stays in flight: no generation is sent again
                firing = await wait_for_query(
                    stack,
                    f'ALERTS{{alertname="LLMServerStuck",target="{NAME}",alertstate="firing"}}',
                    STEP_TIMEOUT_S,
                )

                loop = asyncio.get_running_loop()
                deadline = loop.time() + RESTART_WAIT_S
                while not decisions(entries := await restarter.journal(session), "action_result"):
                    assert loop.time() < deadline, f"no restart:\n{restarter.log_tail()}"
                    await asyncio.sleep(0.5)
                (restart,) = decisions(entries, "restart")
                (result,) = decisions(entries, "action_result")
            finally:
                await cancel_all(load)  # the restart failed them; nothing is left to cancel

            # The new process: restarted, then idle (the load died with the old process).
            await wait_until(
                lambda: history(service, NAME).restarts_detected == 1,
                timeout=STEP_TIMEOUT_S,
                what="the exporter to see the restart",
            )
            back = await wait_for_state(service, NAME, State.IDLE, polls=2, timeout=STEP_TIMEOUT_S)
            deadline = loop.time() + STEP_TIMEOUT_S
            while not decisions(entries := await restarter.journal(session), "resolved"):
                assert loop.time() < deadline, f"never resolved:\n{restarter.log_tail()}"
                await asyncio.sleep(0.5)
            await wait_for_query(
                stack,
                f'stallwatch_restarter_restarts_total{{target="{NAME}",result="success"}} == 1',
                STEP_TIMEOUT_S,
            )
            still_firing = await asyncio.to_thread(
                stack.query, f'ALERTS{{alertname="LLMServerStuck",target="{NAME}"}}'
            )
            entries = await restarter.journal(session)
    finally:
        supervisor.cancel()
        await asyncio.gather(supervisor, return_exceptions=True)

    print(
        f"hang -> alert firing in Prometheus: "
        f"{float(firing[0]['value'][0]) - hung_at:.1f} s; "
        f"hang -> restart decision: {restart['time'] - hung_at:.1f} s; "
        f"action (restart of the real server): {result['duration_seconds']:.1f} s"
    )
    acted = [(e["decision"], e["reason"]) for e in entries if e["decision"] != "skip"]
    # The alert resolves as soon as the exporter reads the stopped server as down, which is
    # before the action (waiting for the new server to answer) journals its result.
    assert acted[0] == ("restart", "confirmed"), entries
    assert sorted(acted[1:]) == [("action_result", "success"), ("resolved", "resolved")], entries
    assert {e["target"] for e in entries} == {NAME}
    assert restart["alertname"] == "LLMServerStuck"
    assert result["result"] == "success"
    assert "server restarted: pid" in result["detail"]
    assert len(restarts) == 1
    assert real_vllm.starts == starts_before + 1
    assert real_vllm.pid != first_pid
    assert back.state == State.IDLE  # the new server answered the exporter's test request
    assert still_firing == []
