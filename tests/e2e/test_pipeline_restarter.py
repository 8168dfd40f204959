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
SIGTERM), starts a new one on the same port and waits for its /health.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import textwrap
import time
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
from tests.support.exporter import history, wait_for_state, wait_until
from tests.support.pipeline import (
    TIMEOUT,
    Restarter,
    exporter_on_stack,
    record_polls,
    restarter_process,
    rules_evaluated_after,
    seen_in_state,
    target,
    unique,
)

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SIM_ARGS = ("--max-num-seqs", "2", "--tokens-per-second", "40")
HTTP = aiohttp.ClientTimeout(total=5)
# The exporter's shipped poll interval, and a silence of the length vLLM's JIT compiles take.
DEFAULT_INTERVAL = 15.0
FREEZE_SECONDS = 70.0
# The shipped 5 m window over 15 s polls, scaled to the test's 0.5 s polls (20 polls).
SCALED_WINDOW = "6s"

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


async def wait_until_busy(
    stack: RestarterStack, service: ExporterService, name: str, interval: float = 0.5
) -> None:
    await wait_for_state(service, name, State.BUSY, polls=2, timeout=3 * interval + TIMEOUT)
    await seen_in_state(stack, name, "busy")
    await stack.wait_for_query('up{job="stallwatch-restarter"} == 1', TIMEOUT)


def rows(entries: list[dict[str, Any]], name: str, decision: str) -> list[dict[str, Any]]:
    return [e for e in entries if e["target"] == name and e["decision"] == decision]


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
