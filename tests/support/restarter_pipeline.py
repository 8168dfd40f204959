"""The whole chain up to the real restarter: an alerting stack whose restart webhook is the
restarter's port, a simulator process that the restart script replaces, the restarter as a
process, and long requests kept in flight."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import textwrap
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from stallwatch.core.classify import State
from stallwatch.exporter.service import ExporterService
from stallwatch.simulator.load import LoadSummary, run_load
from stallwatch.simulator.testing import SimProcess, start_simulator_process
from tests.support.alerting_stack import (
    WEBHOOK_PATH,
    AlertingStack,
    RecordingReceiver,
    poll,
    running_stack,
)
from tests.support.exporter import wait_for_state
from tests.support.pipeline import (
    TIMEOUT,
    Restarter,
    restarter_process,
    seen_in_state,
)

REPO = Path(__file__).resolve().parents[2]
SIM_ARGS = ("--max-num-seqs", "2", "--tokens-per-second", "40")
HTTP = aiohttp.ClientTimeout(total=5)


RESTART_SCRIPT = textwrap.dedent(
    '''\
    """Restart the simulator: kill the process in PIDFILE, start a new one on PORT."""
    import os, signal, socket, subprocess, sys, time, urllib.request

    pidfile, port, log, *sim_args = sys.argv[1:]
    os.kill(int(open(pidfile).read()), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until the old process has released the port
        try:
            socket.create_connection(("127.0.0.1", int(port)), timeout=0.2).close()
        except OSError:
            break
        time.sleep(0.02)
    with open(log, "ab") as output:
        new = subprocess.Popen(
            [sys.executable, "-m", "stallwatch.simulator", "--port", port, *sim_args],
            stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    with open(pidfile, "w") as file:
        file.write(str(new.pid))
    while time.monotonic() < deadline + 20:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=0.5).close()
            print(f"simulator restarted as pid {new.pid}")
            sys.exit(0)
        except OSError:
            time.sleep(0.05)
    sys.exit("the new simulator did not answer /health")
    '''
)


class RestarterAddress(RecordingReceiver):
    """Gives Alertmanager the real restarter's webhook URL instead of the recording server's."""

    def __init__(self, token: str, url: str) -> None:
        super().__init__(token)
        self._restarter_url = url

    @property
    def url(self) -> str:
        return self._restarter_url


class RestarterStack(AlertingStack):
    """The harness' stack, with Alertmanager's restarter webhook at 127.0.0.1:restarter_port."""

    def __init__(self, workdir: Path, repo: Path) -> None:
        super().__init__(workdir, repo)
        self.receiver = RestarterAddress(
            self.token, f"http://{self.restarter_address}{WEBHOOK_PATH}"
        )


@pytest.fixture(scope="module")
def restarter_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestarterStack]:
    """Prometheus and Alertmanager whose restart alerts go to the real restarter's port."""
    with running_stack(RestarterStack(tmp_path_factory.mktemp("restarter-stack"), REPO)) as stack:
        yield stack


@dataclass
class Simulator:
    """The simulator process the restart script replaces; the current PID is in `pidfile`."""

    first: SimProcess
    pidfile: Path
    args: tuple[str, ...] = SIM_ARGS

    @property
    def url(self) -> str:
        return self.first.url

    @property
    def port(self) -> int:
        port = urllib.parse.urlsplit(self.url).port
        assert port is not None
        return port

    @property
    def pid(self) -> int:
        return int(self.pidfile.read_text())

    async def stats(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        async with session.get(self.url + "/sim/stats") as response:
            stats: dict[str, Any] = await response.json()
            return stats

    async def fault(self, session: aiohttp.ClientSession, fault: str) -> None:
        async with session.post(self.url + "/sim/fault", json={"fault": fault}) as response:
            assert response.status == 200, await response.text()


@contextlib.contextmanager
def simulator(tmp_path: Path, args: tuple[str, ...] = SIM_ARGS) -> Iterator[Simulator]:
    """A simulator process; every process that held its port is killed at the end."""
    first = start_simulator_process(args)
    pidfile = tmp_path / "simulator.pid"
    pidfile.write_text(str(first.process.pid))
    try:
        yield Simulator(first, pidfile, args)
    finally:
        first.stop()
        current = int(pidfile.read_text())
        if current != first.process.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(current, 9)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(current, 0)  # not our child: nothing to reap, but be sure


@contextlib.asynccontextmanager
async def restarter_for(
    stack: RestarterStack,
    tmp_path: Path,
    name: str,
    sim: Simulator,
    *,
    restart_after: str | None = "0s",
    gap: str = "1s",
) -> AsyncIterator[Restarter]:
    """`stallwatch restarter --config FILE` on the stack's restarter port, stopped at the end.

    `restart_after` None leaves the shipped default window (5m); by default there is none."""
    script = tmp_path / "restart_simulator.py"
    script.write_text(RESTART_SCRIPT)
    token_file = tmp_path / "restarter.token"
    token_file.write_text(stack.token + "\n")
    token_file.chmod(0o600)  # the restarter refuses a token others can read
    config = {
        "listen": stack.restarter_address,
        "token_file": str(token_file),
        "journal": str(tmp_path / "journal.sqlite"),
        "confirm": {"gap": gap, "timeout": "1s"},
        **({} if restart_after is None else {"restart_after": restart_after}),
        "targets": [
            {
                "name": name,
                "url": sim.url,
                "action": {
                    "kind": "command",
                    "argv": [
                        sys.executable,
                        str(script),
                        str(sim.pidfile),
                        str(sim.port),
                        str(tmp_path / "simulator-restarted.log"),
                        *sim.args,
                    ],
                },
                "cooldown": "1m",
                "action_timeout": "30s",
            }
        ],
    }
    async with restarter_process(
        config,
        tmp_path,
        url=f"http://{stack.restarter_address}",
        token=stack.token,
        timeout=TIMEOUT,
    ) as restarter:
        yield restarter


@contextlib.asynccontextmanager
async def loaded(
    sim: Simulator, session: aiohttp.ClientSession, concurrency: int
) -> AsyncIterator[asyncio.Task[LoadSummary]]:
    """Long requests kept in flight (retrying through a restart), cancelled at the end."""
    load = asyncio.create_task(
        run_load(sim.url, concurrency=concurrency, prompt_tokens=10, max_tokens=1_900, duration=120)
    )
    try:

        async def two_running() -> bool | None:
            return (await sim.stats(session))["running"] == 2 or None

        await poll(two_running, TIMEOUT, "the load to run")
        yield load
    finally:
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)


def rows(entries: list[dict[str, Any]], name: str, decision: str) -> list[dict[str, Any]]:
    return [e for e in entries if e["target"] == name and e["decision"] == decision]


async def wait_until_busy(
    stack: RestarterStack, service: ExporterService, name: str, interval: float = 0.5
) -> None:
    await wait_for_state(service, name, State.BUSY, polls=2, timeout=3 * interval + TIMEOUT)
    await seen_in_state(stack, name, "busy")
    await stack.wait_for_query('up{job="stallwatch-restarter"} == 1', TIMEOUT)
