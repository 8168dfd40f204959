"""A hung real vLLM API server (SIGSTOPped: its port still accepts, nothing answers) reads hung
and is restarted once; a real vLLM under the heaviest load this machine can give it never does.

The API server is the server's main process, the one listening on its port (checked through
/proc before it is stopped); the engine core is its child and keeps running.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from stallwatch.common.exporter_config import DEFAULT_TIMEOUT_SECONDS
from stallwatch.core.classify import State
from stallwatch.core.history import PollOutcome, TargetHistory
from stallwatch.exporter.check_cli import EXIT_STUCK, run_check
from stallwatch.exporter.service import ExporterService
from tests.real.pipeline_support import (
    HTTP,
    NAME,
    RESTART_WAIT_S,
    STEP_TIMEOUT_S,
    PipelineStack,
    decisions,
    exporter_on,
    pipeline_stack,
    running_restarter,
    supervise,
    wait_for_query,
)
from tests.real.scenario_support import (
    CONCURRENT_GENERATIONS,
    LONG_GENERATION_TOKENS,
    cancel_all,
    http_session,
    real_target,
    wait_for_running,
)
from tests.real.vllm_server import (
    ENGINE_CORE_MARKER,
    RealVllmServer,
    complete,
    process_title,
    process_tree,
    word_prompt,
)
from tests.support.exporter import (
    exporter_for,
    history,
    scrape,
    wait_for_state,
    wait_until,
)

__all__ = ["pipeline_stack"]  # the module-scoped stack fixture, used by name

TARGET_LABELS = (("target", "real"),)
# Reads under load: about one a second, longer than the long prefill takes on a quiet machine.
LOADED_POLLS = 40
# Under load each read gets the shipped timeout, which no interval may be shorter than: that
# many targets on the same server, started a second apart, read it about once a second.
READ_SPACING_S = 1.0
READERS = math.ceil(DEFAULT_TIMEOUT_SECONDS / READ_SPACING_S)
LONG_PROMPT_WORDS = 16_000
# More generations than the server has slots (4): the rest wait, so the queue is never empty.
QUEUED_GENERATIONS = 4
LISTEN_STATE = "0A"


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port == port and fields[3] == LISTEN_STATE:
                    inodes.add(fields[9])
    return inodes


def listening_pids(server: RealVllmServer) -> list[int]:
    """The processes of the server's tree that hold its listening socket."""
    sockets = {f"socket:[{inode}]" for inode in _listening_inodes(server.port)}
    holders = []
    for pid in process_tree(server.pid):
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in sockets:
                        holders.append(pid)
                        break
    return holders


def api_server_pid(server: RealVllmServer) -> int:
    """The API server's pid: the main process, which must hold the listening socket."""
    pid = server.pid
    holders = listening_pids(server)
    assert pid in holders, (
        f"the main process {pid} does not hold port {server.port}: "
        f"{ {p: process_title(p) for p in holders} }"
    )
    assert ENGINE_CORE_MARKER not in process_title(pid), process_title(pid)
    assert pid not in server.engine_core_pids()
    return pid


@contextlib.contextmanager
def api_server_stopped(server: RealVllmServer) -> Iterator[int]:
    """SIGSTOP the API server (not the engine core) for the block; SIGCONT it after."""
    pid = api_server_pid(server)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


async def test_stopped_api_server_reads_hung_twice_and_check_says_stuck(
    real_vllm: RealVllmServer,
) -> None:
    """SIGSTOPped API server: connections are accepted, nothing answers; the exporter reads
    hung twice (not down), check exits 1, and after SIGCONT the same process answers again."""
    async with exporter_for(real_target("real", real_vllm.base_url)) as (service, url):
        await wait_for_state(service, "real", State.IDLE, timeout=60)
        engine_core = real_vllm.engine_core_pid()
        with api_server_stopped(real_vllm):
            hung = await wait_for_state(service, "real", State.HUNG, polls=2, timeout=30)
            metrics = await scrape(url)
            result = await run_check(real_target("check", real_vllm.base_url))
            engine_core_runs = not real_vllm.engine_is_stopped()
        await wait_until(
            lambda: history(service, "real").state not in (State.HUNG, State.DOWN),
            timeout=60,
            what="the resumed server to answer",
        )
        resumed = history(service, "real")

    assert hung.verdict is not None
    assert "connected, no answer" in hung.verdict.reason, hung.verdict.reason
    assert hung.poll_errors.get("connection", 0) == 0  # never read down
    assert metrics[("stallwatch_target_up", TARGET_LABELS)] == 0
    assert metrics[("stallwatch_target_state", (("state", "hung"), *TARGET_LABELS))] == 1
    assert result.exit_code == EXIT_STUCK, result.as_json()
    assert result.history.state == State.HUNG
    assert result.history.state_polls == 2
    assert engine_core_runs  # only the API server was stopped
    assert real_vllm.engine_core_pid() == engine_core
    assert resumed.restarts_detected == 0  # the same process, answering again


@contextlib.asynccontextmanager
async def supervisor(
    server: RealVllmServer, tmp_path: Path, restarts: list[int]
) -> AsyncIterator[None]:
    task = asyncio.create_task(
        supervise(server, tmp_path / "restart.request", tmp_path / "restart.done", restarts)
    )
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_stopped_api_server_is_restarted_once_through_the_whole_chain(
    real_vllm: RealVllmServer, pipeline_stack: PipelineStack, tmp_path: Path
) -> None:
    """SIGSTOPped API server: LLMServerHung fires, the real restarter confirms it with two
    unanswered reads and restarts the server once; the new process answers."""
    stack = pipeline_stack.stack
    restarts: list[int] = []
    first_pid = real_vllm.pid
    starts_before = real_vllm.starts
    async with (
        supervisor(real_vllm, tmp_path, restarts),
        aiohttp.ClientSession(timeout=HTTP) as session,
        running_restarter(pipeline_stack, tmp_path, real_vllm) as restarter,
        exporter_on(pipeline_stack, real_vllm) as service,
    ):
        await wait_for_state(service, NAME, State.IDLE, timeout=STEP_TIMEOUT_S)
        await wait_for_query(
            stack, f'stallwatch_target_state{{target="{NAME}",state="idle"}} == 1', STEP_TIMEOUT_S
        )
        await wait_for_query(stack, 'up{job="stallwatch-restarter"} == 1', STEP_TIMEOUT_S)

        hung_at = time.time()
        with api_server_stopped(real_vllm):
            await wait_for_state(service, NAME, State.HUNG, polls=2, timeout=STEP_TIMEOUT_S)
            firing = await wait_for_query(
                stack,
                f'ALERTS{{alertname="LLMServerHung",target="{NAME}",alertstate="firing"}}',
                STEP_TIMEOUT_S,
            )
            loop = asyncio.get_running_loop()
            deadline = loop.time() + RESTART_WAIT_S
            # The restart stops the old process group (the stopped server gets SIGCONT too).
            while not decisions(entries := await restarter.journal(session), "action_result"):
                assert loop.time() < deadline, f"no restart:\n{restarter.log_tail()}"
                await asyncio.sleep(0.5)

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
        entries = await restarter.journal(session)

    restart_rows = decisions(entries, "restart")
    results = decisions(entries, "action_result")
    assert len(restart_rows) == 1, entries
    (restart,) = restart_rows
    assert (restart["alertname"], restart["reason"]) == ("LLMServerHung", "confirmed"), restart
    assert "connected, no answer, twice" in restart["detail"], restart
    assert [row["result"] for row in results] == ["success"], entries
    resolved = decisions(entries, "resolved")
    assert "LLMServerHung" in {row["alertname"] for row in resolved}, entries
    print(
        "API server stopped -> LLMServerHung firing: "
        f"{float(firing[0]['value'][0]) - hung_at:.1f} s; "
        f"-> restart decision: {restart['time'] - hung_at:.1f} s; "
        f"action (restart of the real server): {results[0]['duration_seconds']:.1f} s"
    )
    assert len(restarts) == 1
    assert real_vllm.starts == starts_before + 1
    assert real_vllm.pid != first_pid
    assert back.state == State.IDLE  # the new server answered the exporter's test request


async def _again_and_again(request: Callable[[], Awaitable[Any]]) -> None:
    """Send `request` again as soon as it is answered, until cancelled."""
    while True:
        await request()


async def _reads_under_load(
    service: ExporterService, url: str, count: int, timeout: float
) -> list[tuple[str, TargetHistory]]:
    """Start READERS targets on `url`, READ_SPACING_S apart, each reading it at the shipped
    timeout; every (target, history) after each read, none missed, until `count` reads."""
    reads: list[tuple[str, TargetHistory]] = []
    enough = asyncio.Event()

    def on_poll(target: str, updated: TargetHistory, _: PollOutcome) -> None:
        if not enough.is_set():
            reads.append((target, updated))
            if len(reads) >= count:
                enough.set()

    unsubscribe = service.subscribe(on_poll)
    try:
        for index in range(READERS):
            reader = real_target(
                f"real-{index}", url, DEFAULT_TIMEOUT_SECONDS, timeout=DEFAULT_TIMEOUT_SECONDS
            )
            await service.apply(replace(service.config, targets=(*service.config.targets, reader)))
            await asyncio.sleep(READ_SPACING_S)
        await asyncio.wait_for(enough.wait(), timeout)
    except TimeoutError:
        seen = [(name, h.state, h.verdict.reason if h.verdict else "") for name, h in reads]
        raise AssertionError(f"{len(reads)} reads in {timeout} s: {seen}") from None
    finally:
        unsubscribe()
    return reads


async def test_heaviest_load_never_reads_hung(real_vllm: RealVllmServer) -> None:
    """Four long generations running, four more queued and a 16 000-token prefill, each sent
    again as soon as it ends, read about once a second for 40 reads at the shipped timeout:
    /metrics always answers in time; never hung (nor down)."""
    url = real_vllm.base_url
    async with http_session(total_timeout=600.0) as session:

        def generation() -> Awaitable[Any]:
            return complete(session, url, word_prompt(8), LONG_GENERATION_TOKENS)

        def prefill() -> Awaitable[Any]:
            return complete(session, url, word_prompt(LONG_PROMPT_WORDS), 1)

        load = [
            asyncio.create_task(_again_and_again(generation)) for _ in range(CONCURRENT_GENERATIONS)
        ]
        try:
            await wait_for_running(session, url, CONCURRENT_GENERATIONS)
            load += [
                asyncio.create_task(_again_and_again(generation)) for _ in range(QUEUED_GENERATIONS)
            ]
            load.append(asyncio.create_task(_again_and_again(prefill)))
            async with exporter_for() as (service, _url):
                reads = await _reads_under_load(service, url, LOADED_POLLS, timeout=240)
                last = {name: history(service, name) for name in service.histories}
        finally:
            await cancel_all(load)
        failed = [task for task in load if not task.cancelled() and task.exception()]

    polls = [poll for _, poll in reads]
    states = [poll.state for poll in polls]
    durations = sorted(poll.last_poll_duration_seconds or 0.0 for poll in polls)
    p99 = statistics.quantiles(durations, n=100, method="inclusive")[98]
    print(
        f"under load: {len(polls)} reads at a {DEFAULT_TIMEOUT_SECONDS:g} s timeout, "
        f"poll duration p50 {statistics.median(durations):.3f} s, p99 {p99:.3f} s, "
        f"max {durations[-1]:.3f} s; states {set(states)}"
    )
    readings = [(name, p.state, p.verdict.reason if p.verdict else "") for name, p in reads]
    assert failed == [], [task.exception() for task in failed]
    assert len(polls) >= LOADED_POLLS
    assert {name for name, _ in reads} == {f"real-{index}" for index in range(READERS)}, readings
    assert State.HUNG not in states, readings
    assert State.DOWN not in states, readings
    assert all(dict(h.poll_errors) == {} for h in last.values()), last
    # The load was there at every read: requests running or waiting.
    assert all(p.verdict is not None and p.verdict.has_work for p in polls), readings
