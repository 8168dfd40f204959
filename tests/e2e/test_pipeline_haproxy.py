"""The whole chain to a real router: simulator -> exporter -> Prometheus -> Alertmanager ->
restarter -> HAProxy's agent-check. A server that hangs under load leaves HAProxy's rotation
on its alert, gets no user request while out, and returns once it moves again, unrestarted.

The stack is the restart pipeline's own (Alertmanager calls the real restarter on the port
Prometheus scrapes); HAProxy (Debian's package) runs in front of both simulated servers with
its agent-check on the restarter's `quarantine.agent_listen`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from stallwatch.localstack.processes import free_port
from stallwatch.simulator.load import run_load
from stallwatch.simulator.testing import SimHandle, running_simulator
from tests.support.alerting_stack import poll, running_stack
from tests.support.haproxy import HAProxy, running_haproxy, wait_for
from tests.support.pipeline import TIMEOUT, exporter_on_stack, restarter_process, target, unique
from tests.support.quarantine_chain import SHIPPED, freeze_through_haproxy
from tests.support.restarter import marker_argv
from tests.support.restarter_pipeline import REPO, RestarterStack, rows, wait_until_busy

pytestmark = pytest.mark.e2e

USER_AGENT = "haproxy-user/1.0"
REQUESTS = 20
# From the hang to HAProxy's DOWN: two stalled polls, the rule, Alertmanager, two fresh reads
# 1 s apart, one agent check. Far more than that is a broken chain, not a slow machine.
CHAIN_TIMEOUT = 90.0


@pytest.fixture(scope="module")
def haproxy_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestarterStack]:
    """Prometheus and Alertmanager whose restart alerts go to the real restarter's port."""
    with running_stack(RestarterStack(tmp_path_factory.mktemp("haproxy-stack"), REPO)) as stack:
        yield stack


def user_requests(sim: SimHandle) -> int:
    """Users' completions the server itself received (through HAProxy, by their User-Agent)."""
    return int(sim.stats()["completions_by_user_agent"].get(USER_AGENT, 0))


async def users(proxy: HAProxy, session: aiohttp.ClientSession, count: int) -> None:
    """`count` small completions through HAProxy, one after another; each must succeed."""
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 2}
    for _ in range(count):
        async with session.post(
            proxy.url + "/v1/completions", json=body, headers={"User-Agent": USER_AGENT}
        ) as response:
            assert response.status == 200, await response.text()


def restarter_config(
    stack: RestarterStack, tmp_path: Path, agent_port: int, servers: dict[str, str]
) -> dict[str, Any]:
    token_file = tmp_path / "restarter.token"
    token_file.write_text(stack.token + "\n")
    token_file.chmod(0o600)
    action = {"kind": "command", "argv": marker_argv(tmp_path / "restarted")}
    return {
        "listen": stack.restarter_address,
        "token_file": str(token_file),
        "journal": str(tmp_path / "journal.sqlite"),
        "confirm": {"gap": "1s", "timeout": "1s"},
        "restart_after": "10m",  # the quarantine acts; no restart within the test
        "quarantine": {"agent_listen": f"127.0.0.1:{agent_port}", "check_interval": "1s"},
        "targets": [{"name": n, "url": u, "action": action} for n, u in servers.items()],
    }


async def test_a_hung_server_leaves_haproxy_through_the_whole_chain_and_returns(
    haproxy_stack: RestarterStack, tmp_path: Path
) -> None:
    """gpu-a hangs with work in flight: LLMServerStuck reaches the restarter through real
    Prometheus and Alertmanager, HAProxy marks gpu-a DOWN by its agent, and no user request
    reaches it (all succeed on gpu-b); when gpu-a moves again the restarter releases it, HAProxy
    puts it back, users reach it again, and nothing was restarted."""
    stack = haproxy_stack
    a_name, b_name = unique("gpu-a"), unique("gpu-b")
    agent_port = free_port()
    async with (
        running_simulator(tokens_per_second=200) as gpu_a,
        running_simulator(tokens_per_second=200) as gpu_b,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
    ):
        config = restarter_config(
            stack, tmp_path, agent_port, {a_name: gpu_a.url, b_name: gpu_b.url}
        )
        load = asyncio.create_task(
            run_load(gpu_a.url, concurrency=2, prompt_tokens=10, max_tokens=1_900, duration=300)
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
                    stack, target(a_name, gpu_a.url), target(b_name, gpu_b.url)
                ) as service,
            ):
                servers = [(a_name, gpu_a.url[7:]), (b_name, gpu_b.url[7:])]
                with running_haproxy(tmp_path, servers, agent_port) as proxy:
                    await wait_for(
                        "both servers UP",
                        lambda: all(proxy.status(name) == "UP" for name, _ in servers),
                        proxy,
                    )
                    await wait_until_busy(stack, service, a_name)
                    await users(proxy, session, REQUESTS)
                    assert user_requests(gpu_a) > 0

                    hung_at = time.monotonic()
                    gpu_a.apply_fault("hang")
                    await wait_for(
                        f"{a_name} DOWN by the agent\n{restarter.log_tail()}",
                        lambda: proxy.status(a_name) == "DOWN (agent)",
                        proxy,
                        timeout=CHAIN_TIMEOUT,
                    )
                    print(f"hang -> out of HAProxy's rotation: {time.monotonic() - hung_at:.1f} s")
                    before_a, before_b = user_requests(gpu_a), user_requests(gpu_b)
                    await users(proxy, session, REQUESTS)
                    assert user_requests(gpu_a) == before_a
                    assert user_requests(gpu_b) == before_b + REQUESTS

                    moved_at = time.monotonic()
                    gpu_a.apply_fault("recover")
                    await wait_for(
                        f"{a_name} UP again\n{restarter.log_tail()}",
                        lambda: proxy.status(a_name) == "UP",
                        proxy,
                        timeout=CHAIN_TIMEOUT,
                    )
                    print(f"moving again -> back in rotation: {time.monotonic() - moved_at:.1f} s")
                    await users(proxy, session, REQUESTS)
                    assert user_requests(gpu_a) > before_a

                    async def released() -> list[dict[str, Any]] | None:
                        entries = await restarter.journal(session)
                        return entries if rows(entries, a_name, "routing") else None

                    entries = await poll(released, TIMEOUT, "the routing rows")
        finally:
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
    moves = [(e["reason"], e["result"]) for e in rows(entries, a_name, "routing")]
    assert moves[0] == ("quarantined", "stalled"), entries
    assert moves[-1][0] == "released", entries
    assert not rows(entries, a_name, "action_result")
    assert not (tmp_path / "restarted").exists()


async def test_a_70_s_freeze_at_the_shipped_defaults_leaves_rotation_and_returns_unrestarted(
    haproxy_stack: RestarterStack, tmp_path: Path
) -> None:
    """At the shipped exporter, confirmation and look timings (Prometheus and Alertmanager at the
    harness' 1 s), a server frozen for 70 s with work in flight leaves HAProxy's rotation while
    frozen, gets no user request while out, comes back once it moves, and is never restarted."""
    run = await freeze_through_haproxy(haproxy_stack, tmp_path, SHIPPED, freeze_seconds=70.0)
    print(
        f"freeze -> out of rotation {run.freeze_to_out:.1f} s; moving again -> back "
        f"{run.end_to_back:.1f} s; users' requests to the frozen server: "
        f"{run.to_frozen_before_out} before it left, {run.to_frozen_while_out} while out"
    )
    assert run.routing[0] == ("quarantined", "stalled")
    assert run.routing[-1][0] == "released"
    assert run.to_frozen_while_out == 0
    assert not run.restarted
