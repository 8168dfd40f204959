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
import contextlib
import secrets
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from stallwatch.common.exporter_config import ExporterConfig
from stallwatch.core.classify import State
from stallwatch.exporter.app import running_exporter
from stallwatch.exporter.service import ExporterService
from stallwatch.localstack.processes import free_port
from stallwatch.localstack.rewrite import ScrapeTargets, Webhook
from stallwatch.localstack.stack import LocalStack
from tests.real.scenario_support import (
    CONCURRENT_GENERATIONS,
    cancel_all,
    real_target,
    sustained_generations,
    wait_for_polls,
    wait_for_running,
)
from tests.real.vllm_server import RealVllmServer
from tests.support.alerting_stack import running_stack
from tests.support.exporter import history, wait_for_state, wait_until
from tests.support.pipeline import Restarter, restarter_process

NAME = "real-vllm"
HTTP = aiohttp.ClientTimeout(total=5)
# A restart of the real server takes 40-60 s (more on a busy machine): the action waits for it.
ACTION_TIMEOUT_S = 420
RESTART_WAIT_S = ACTION_TIMEOUT_S + 60
STEP_TIMEOUT_S = 60.0

RESTART_SCRIPT = textwrap.dedent(
    '''\
    """Ask the supervisor for a restart; exit 0 once the new server answers /health."""
    import sys, time, urllib.request
    from pathlib import Path

    request, done, health_url, timeout = sys.argv[1:]
    Path(request).write_text(str(time.time()))
    deadline = time.monotonic() + float(timeout)
    while not Path(done).exists():
        if time.monotonic() > deadline:
            sys.exit("the server was not restarted in time")
        time.sleep(0.2)
    with urllib.request.urlopen(health_url, timeout=5) as response:
        print(f"server restarted: {Path(done).read_text()}, /health {response.status}")
    '''
)


@dataclass(frozen=True)
class PipelineStack:
    stack: LocalStack
    exporter_port: int
    restarter_port: int
    token: str


@pytest.fixture(scope="module")
def pipeline_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PipelineStack]:
    """Prometheus + Alertmanager whose restart alerts go to the real restarter's port."""
    exporter_port, restarter_port = free_port(), free_port()
    token = secrets.token_hex(16)
    stack = LocalStack(
        tmp_path_factory.mktemp("real-pipeline-stack"),
        scrape=ScrapeTargets(
            exporter=f"127.0.0.1:{exporter_port}", restarter=f"127.0.0.1:{restarter_port}"
        ),
        webhook=Webhook(url=f"http://127.0.0.1:{restarter_port}/alerts", token=token),
    )
    with running_stack(stack):
        yield PipelineStack(stack, exporter_port, restarter_port, token)


async def wait_for_query(stack: LocalStack, promql: str, timeout: float) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await asyncio.to_thread(stack.query, promql)
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"no result for {promql} in {timeout} s\n{stack.logs()}")
        await asyncio.sleep(0.25)


@contextlib.asynccontextmanager
async def running_restarter(
    pipeline: PipelineStack, tmp_path: Path, server: RealVllmServer
) -> AsyncIterator[Restarter]:
    """`stallwatch restarter` on the stack's restarter port, acting through RESTART_SCRIPT."""
    script = tmp_path / "restart_real_vllm.py"
    script.write_text(RESTART_SCRIPT)
    token_file = tmp_path / "restarter.token"
    token_file.write_text(pipeline.token + "\n")
    token_file.chmod(0o600)  # the restarter refuses a token others can read
    config = {
        "listen": f"127.0.0.1:{pipeline.restarter_port}",
        "token_file": str(token_file),
        "journal": str(tmp_path / "journal.sqlite"),
        "confirm": {"gap": "1s", "timeout": "2s"},
        "restart_after": "0s",
        "targets": [
            {
                "name": NAME,
                "metrics_url": server.base_url + "/metrics",
                "action": {
                    "kind": "command",
                    "argv": [
                        sys.executable,
                        str(script),
                        str(tmp_path / "restart.request"),
                        str(tmp_path / "restart.done"),
                        server.base_url + "/health",
                        str(ACTION_TIMEOUT_S - 10),
                    ],
                },
                "cooldown": "30m",
                "action_timeout": f"{ACTION_TIMEOUT_S}s",
            }
        ],
    }
    async with restarter_process(
        config,
        tmp_path,
        url=f"http://127.0.0.1:{pipeline.restarter_port}",
        token=pipeline.token,
        timeout=30,
    ) as restarter:
        yield restarter


def serve_restart_request(server: RealVllmServer, request: Path, done: Path) -> int | None:
    """Restart the server if the request file is there; the new pid, or None."""
    if not request.exists():
        return None
    request.unlink()
    server.restart()
    done.write_text(f"pid {server.pid}")
    return server.pid


async def supervise(server: RealVllmServer, request: Path, done: Path, restarts: list[int]) -> None:
    """The stand-in for systemd: restarts the server whenever the request file appears."""
    while True:
        new_pid = await asyncio.to_thread(serve_restart_request, server, request, done)
        if new_pid is not None:
            restarts.append(new_pid)
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def exporter_on(
    pipeline: PipelineStack, server: RealVllmServer
) -> AsyncIterator[ExporterService]:
    """The real exporter, polling the server every second, on the port Prometheus scrapes."""
    config = ExporterConfig(
        targets=(real_target(NAME, server.base_url),),
        listen_host="127.0.0.1",
        listen_port=pipeline.exporter_port,
    )
    async with running_exporter(
        config, Path("exporter.yml"), host="127.0.0.1", port=pipeline.exporter_port
    ) as (service, _url):
        yield service


def decisions(entries: list[dict[str, Any]], decision: str) -> list[dict[str, Any]]:
    return [entry for entry in entries if entry["target"] == NAME and entry["decision"] == decision]


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
