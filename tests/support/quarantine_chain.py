"""A legitimate freeze through the whole chain to a real router, at given timings: two simulated
servers behind HAProxy, users sending through it, the exporter, real Prometheus and
Alertmanager, the restarter process with its agent-check port. One server freezes with work in
flight and goes on by itself after `freeze_seconds`. Used by the e2e test at the shipped defaults
and by `python -m benchmarks --only quarantine`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from stallwatch.core.classify import State
from stallwatch.localstack.haproxy import in_rotation
from stallwatch.localstack.processes import free_port
from stallwatch.simulator.load import run_load
from stallwatch.simulator.testing import SimHandle, running_simulator
from tests.support.alerting_stack import AlertingStack, poll
from tests.support.exporter import wait_for_state
from tests.support.haproxy import HAProxy, running_haproxy, wait_for
from tests.support.pipeline import TIMEOUT, exporter_on_stack, restarter_process, target, unique
from tests.support.restarter import marker_argv

USER_AGENT = "haproxy-user/1.0"
USERS = 4  # closed-loop clients through HAProxy
USER_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class Timings:
    """The stallwatch settings of one run: the exporter's poll, the confirmation's gap, the
    quarantine's look, HAProxy's agent-inter."""

    interval: float
    gap: str
    check_interval: str
    agent_inter: str


SHIPPED = Timings(interval=15.0, gap="5s", check_interval="5s", agent_inter="2s")


@dataclass(frozen=True)
class FreezeRun:
    """What one freeze did: seconds from the freeze to HAProxy's `DOWN (agent)` and from its end
    back to `UP`; users' requests the frozen server received before it left and while it was out,
    the other server's while it was out, and whether users reached the frozen one once it was
    back; the journal's routing rows."""

    freeze_to_out: float
    end_to_back: float
    to_frozen_before_out: int
    to_frozen_while_out: int
    to_others_while_out: int
    reached_after_back: bool
    users_completed: int
    routing: list[tuple[str, str]]
    restarted: bool


def _user_requests(sim: SimHandle) -> int:
    return int(sim.stats()["completions_by_user_agent"].get(USER_AGENT, 0))


async def _user(proxy: HAProxy, session: aiohttp.ClientSession, stop: asyncio.Event) -> int:
    """One closed-loop client: a small completion after another until `stop`; how many ended."""
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 2}
    done = 0
    timeout = aiohttp.ClientTimeout(total=USER_TIMEOUT_SECONDS)
    while not stop.is_set():
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.post(
                proxy.url + "/v1/completions",
                json=body,
                headers={"User-Agent": USER_AGENT},
                timeout=timeout,
            ) as response:
                await response.read()
                done += response.status == 200
        await asyncio.sleep(0.05)
    return done


async def _reached(sim: SimHandle, before: int, timeout: float) -> bool:
    """Whether users' requests to `sim` pass `before` within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while _user_requests(sim) <= before:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def _config(
    stack: AlertingStack,
    tmp_path: Path,
    token: str,
    agent_port: int,
    timings: Timings,
    servers: dict[str, str],
) -> dict[str, Any]:
    token_file = tmp_path / "restarter.token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    action = {"kind": "command", "argv": marker_argv(tmp_path / "restarted")}
    return {
        "listen": stack.restarter_address,
        "token_file": str(token_file),
        "journal": str(tmp_path / "journal.sqlite"),
        "confirm": {"gap": timings.gap, "timeout": "3s"},
        "quarantine": {
            "agent_listen": f"127.0.0.1:{agent_port}",
            "check_interval": timings.check_interval,
        },
        "targets": [
            {"name": name, "url": url, "action": action, "pool": "tiny"}
            for name, url in servers.items()
        ],
    }


async def freeze_through_haproxy(
    stack: AlertingStack, tmp_path: Path, timings: Timings, freeze_seconds: float
) -> FreezeRun:
    """Run one legitimate freeze of `freeze_seconds` through the whole chain (see the module)."""
    a_name, b_name = unique("gpu-a"), unique("gpu-b")
    agent_port = free_port()
    stop = asyncio.Event()
    async with (
        running_simulator(tokens_per_second=200) as gpu_a,
        running_simulator(tokens_per_second=200) as gpu_b,
        aiohttp.ClientSession() as session,
    ):
        config = _config(
            stack,
            tmp_path,
            stack.token,
            agent_port,
            timings,
            {a_name: gpu_a.url, b_name: gpu_b.url},
        )
        load = asyncio.create_task(
            run_load(gpu_a.url, concurrency=2, prompt_tokens=10, max_tokens=1_900, duration=900)
        )
        try:
            async with (
                restarter_process(
                    config,
                    tmp_path,
                    url=f"http://{stack.restarter_address}",
                    token=stack.token,
                    timeout=TIMEOUT,
                ) as restarter,
                exporter_on_stack(
                    stack,
                    target(a_name, gpu_a.url, interval=timings.interval),
                    target(b_name, gpu_b.url, interval=timings.interval),
                ) as service,
            ):
                servers = [(a_name, gpu_a.url[7:]), (b_name, gpu_b.url[7:])]
                with running_haproxy(
                    tmp_path, servers, agent_port, agent_inter=timings.agent_inter
                ) as proxy:
                    await wait_for(
                        "both servers UP",
                        lambda: all(proxy.status(name) == "UP" for name, _ in servers),
                        proxy,
                    )
                    await wait_for_state(
                        service, a_name, State.BUSY, polls=2, timeout=4 * timings.interval + 30
                    )
                    users = [asyncio.create_task(_user(proxy, session, stop)) for _ in range(USERS)]
                    await asyncio.sleep(timings.interval)
                    frozen_at = time.monotonic()
                    at_freeze = _user_requests(gpu_a)
                    gpu_a.apply_fault("hang")
                    await wait_for(
                        f"{a_name} DOWN by the agent\n{restarter.log_tail()}",
                        lambda: proxy.status(a_name) == "DOWN (agent)",
                        proxy,
                        timeout=freeze_seconds + 6 * timings.interval + 60,
                    )
                    out_at = time.monotonic()
                    at_out, others_at_out = _user_requests(gpu_a), _user_requests(gpu_b)
                    await asyncio.sleep(max(0.0, frozen_at + freeze_seconds - time.monotonic()))
                    at_end, others_at_end = _user_requests(gpu_a), _user_requests(gpu_b)
                    ended_at = time.monotonic()
                    gpu_a.apply_fault("recover")
                    await wait_for(
                        f"{a_name} UP again\n{restarter.log_tail()}",
                        lambda: in_rotation(proxy.status(a_name)),
                        proxy,
                        timeout=4 * timings.interval + 60,
                    )
                    back_at = time.monotonic()
                    reached_after_back = await _reached(gpu_a, at_end, USER_TIMEOUT_SECONDS)
                    stop.set()
                    completed = sum(await asyncio.gather(*users))

                    async def released() -> list[dict[str, Any]] | None:
                        entries: list[dict[str, Any]] = await restarter.journal(session)
                        moves = [e for e in entries if e["decision"] == "routing"]
                        return entries if any(e["reason"] == "released" for e in moves) else None

                    entries = await poll(released, TIMEOUT, "the routing rows")
        finally:
            stop.set()
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
    routing = [
        (str(e["reason"]), str(e["result"]))
        for e in entries
        if e["target"] == a_name and e["decision"] == "routing"
    ]
    return FreezeRun(
        freeze_to_out=out_at - frozen_at,
        end_to_back=back_at - ended_at,
        to_frozen_before_out=at_out - at_freeze,
        to_frozen_while_out=at_end - at_out,
        to_others_while_out=others_at_end - others_at_out,
        reached_after_back=reached_after_back,
        users_completed=completed,
        routing=routing,
        restarted=(tmp_path / "restarted").exists()
        or any(e["decision"] == "restart" for e in entries if e["target"] == a_name),
    )
