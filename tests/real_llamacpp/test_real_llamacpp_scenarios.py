"""The real exporter, polling every second, reads a real llama-server right; the simulator's
llama.cpp mode gets the same verdicts.

Scenarios: idle (at most one test request per poll), four slots decoding (busy, no test
request), a long prefill (never stalled), `kill -STOP` (every endpoint connects and never
answers: not busy, not idle), and a restart (seen by the `Process-Start-Time-Unix` header).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from stallwatch.common.exporter_config import IdleTestRequestConfig, TargetConfig
from stallwatch.core.classify import State
from stallwatch.exporter.check_cli import EXIT_STUCK, run_check
from stallwatch.simulator.config import SimConfig
from stallwatch.simulator.testing import running_simulator
from tests.real_llamacpp.llamacpp_server import RealLlamaServer, complete
from tests.support.exporter import exporter_for, history, record_histories

NAME = "llama"
INTERVAL = 1.0
SLOTS = 4
GENERATION_TOKENS = 2000
LONG_PROMPT_CHARS = 12_000

# The simulator configured like the real server (`-np 4 -b 128`), at speeds seen on a shared
# 2-core machine: four slots decode about 200 tokens/s together; its prompt counts words, so the
# long prompt is about 2 400 tokens there, prefilled at 300 tokens/s.
SIMULATOR_LIKE_REAL = SimConfig(
    engine="llamacpp",
    max_num_seqs=SLOTS,
    max_num_batched_tokens=128,
    max_model_len=16_384,
    tokens_per_second=200.0,
    prefill_tokens_per_second=300.0,
)


def llama_target(name: str, url: str) -> TargetConfig:
    return TargetConfig(
        name=name,
        url=url,
        interval_seconds=INTERVAL,
        timeout_seconds=INTERVAL,
        test_request=IdleTestRequestConfig(timeout_seconds=10.0),
    )


@dataclass
class ServerUnderTest:
    url: str
    stop: Callable[[], object]
    resume: Callable[[], object]
    restart: Callable[[], object]


@contextlib.asynccontextmanager
async def server_under_test(
    kind: str, request: pytest.FixtureRequest
) -> AsyncIterator[ServerUnderTest]:
    if kind == "real":
        real: RealLlamaServer = request.getfixturevalue("real_llamacpp")
        yield ServerUnderTest(real.base_url, real.sigstop, real.sigcont, real.restart)
        return
    async with running_simulator(SIMULATOR_LIKE_REAL) as sim:
        yield ServerUnderTest(
            sim.url,
            lambda: sim.apply_fault("freeze"),
            lambda: sim.apply_fault("recover"),
            lambda: sim.apply_fault("restart"),
        )


async def _polls(url: str, count: int) -> tuple[list[Any], int]:
    async with exporter_for(llama_target(NAME, url)) as (service, _):
        polls = await record_histories(service, NAME, until=lambda h: h.polls >= count, timeout=90)
        return polls, history(service, NAME).test_requests


def _busy_after_first(states: list[State | None]) -> object:
    first, *later = states
    if first in (State.UNKNOWN, State.BUSY) and later and all(s == State.BUSY for s in later):
        return "busy after the first read"
    return states


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("server", ["simulator", "real"])
async def test_simulator_and_real_llamacpp_get_the_same_verdicts(
    server: str, request: pytest.FixtureRequest
) -> None:
    """Idle, four busy slots, a long prefill, SIGSTOP and a restart read alike on both."""
    verdicts: dict[str, object] = {}
    seen: dict[str, object] = {}
    timeout = aiohttp.ClientTimeout(total=600)
    async with (
        server_under_test(server, request) as under,
        aiohttp.ClientSession(timeout=timeout) as session,
    ):
        idle, probes = await _polls(under.url, 4)
        verdicts["idle"] = sorted({str(poll.state) for poll in idle})
        verdicts["idle test requests within one per poll"] = 1 <= probes <= len(idle)

        load = [
            asyncio.create_task(complete(session, under.url, 200, GENERATION_TOKENS))
            for _ in range(SLOTS)
        ]
        try:
            await asyncio.sleep(2.0)
            async with exporter_for(llama_target(NAME, under.url)) as (service, _):
                busy = await record_histories(
                    service, NAME, until=lambda h: h.polls >= 4, timeout=60
                )
                under.stop()
                try:
                    stopped = await record_histories(
                        service, NAME, until=lambda h: h.polls >= 8, timeout=60
                    )
                finally:
                    under.resume()
            verdicts["busy"] = _busy_after_first([poll.state for poll in busy])
            verdicts["test requests under load"] = busy[-1].test_requests
            after_stop = [poll.state for poll in stopped if poll.polls > busy[-1].polls + 1]
            seen["stopped"] = [
                (str(poll.state), poll.verdict.reason if poll.verdict else "") for poll in stopped
            ]
            verdicts["stopped reads neither busy nor idle"] = bool(after_stop) and all(
                state not in (State.BUSY, State.IDLE) for state in after_stop
            )
        finally:
            await _cancel(load)

        prefill = asyncio.create_task(complete(session, under.url, LONG_PROMPT_CHARS, 4))
        try:
            await asyncio.sleep(1.5)
            async with exporter_for(llama_target(NAME, under.url)) as (service, _):
                check = asyncio.create_task(run_check(llama_target("check", under.url)))
                prefilling = await record_histories(
                    service, NAME, until=lambda h: h.polls >= 4, timeout=60
                )
                checked = await check
            verdicts["prefill still running"] = not prefill.done()
        finally:
            await _cancel([prefill])
        states = [poll.state for poll in prefilling]
        verdicts["prefill never stalled"] = State.STALLED not in states
        verdicts["prefill"] = _busy_after_first(states)
        verdicts["check during prefill not stuck"] = checked.exit_code != EXIT_STUCK

        async with exporter_for(llama_target(NAME, under.url)) as (service, _):
            await record_histories(service, NAME, until=lambda h: h.polls >= 2, timeout=30)
            await asyncio.to_thread(under.restart)
            restarted = await record_histories(
                service, NAME, until=lambda h: h.restarts_detected >= 1, timeout=60
            )
        reasons = [poll.verdict.reason for poll in restarted if poll.state == State.RESTARTED]
        verdicts["restart seen by the start header"] = any(
            "start marker changed" in reason for reason in reasons
        )
    print(f"{server}: {verdicts}\n{server} under SIGSTOP: {seen['stopped']}")

    assert verdicts == {
        "idle": ["idle"],
        "idle test requests within one per poll": True,
        "busy": "busy after the first read",
        "test requests under load": 0,
        "stopped reads neither busy nor idle": True,
        "prefill still running": True,
        "prefill never stalled": True,
        "prefill": "busy after the first read",
        "check during prefill not stuck": True,
        "restart seen by the start header": True,
    }
