"""The whole chain on a real vLLM server: Prometheus and Alertmanager with this repository's rules,
the real restarter whose restart script asks the test to restart the server, the exporter."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from stallwatch.common.exporter_config import ExporterConfig
from stallwatch.exporter.app import running_exporter
from stallwatch.exporter.service import ExporterService
from stallwatch.localstack.processes import free_port
from stallwatch.localstack.rewrite import ScrapeTargets, Webhook
from stallwatch.localstack.stack import LocalStack
from tests.real.scenario_support import (
    real_target,
)
from tests.real.vllm_server import RealVllmServer
from tests.support.alerting_stack import running_stack
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
