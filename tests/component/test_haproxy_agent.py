"""Two simulated vLLM servers behind a real HAProxy whose agent-check asks the restarter: a
quarantined server gets no request, and gets traffic again once it is routable."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from stallwatch.core.quarantine import Quarantine
from stallwatch.restarter.agent import AgentResponder
from stallwatch.restarter.app import AGENT_KEY
from stallwatch.restarter.service import Restarter
from stallwatch.simulator.testing import SimHandle, running_simulator
from tests.support.haproxy import BACKEND, HAProxy, running_haproxy, wait_for
from tests.support.restarter import (
    alert,
    marker_argv,
    payload,
    post_alerts,
    running_restarter,
    write_config,
)

REQUESTS = 20
# The tests that set the verdict themselves keep the restarter's own periodic look at
# quarantined targets from running meanwhile (it would release an idle server).
SET_BY_THE_TEST = {"agent_listen": "127.0.0.1:0", "check_interval": "1h", "expire_after": "2h"}
COMPLETION = {"model": "tiny", "prompt": "hello", "max_tokens": 2}


def completions(sim: SimHandle) -> int:
    """Completions the simulated server itself received."""
    return int(sim.stats()["requests_by_path"].get("POST /v1/completions", 0))


def target(name: str, sim: SimHandle, marker: Path) -> dict[str, Any]:
    return {
        "name": name,
        "url": sim.url,
        "action": {"kind": "command", "argv": marker_argv(marker)},
    }


async def send(proxy: HAProxy, count: int) -> None:
    """`count` completions through HAProxy, one after another; every one must succeed."""
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            async with session.post(proxy.url + "/v1/completions", json=COMPLETION) as response:
                assert response.status == 200, await response.text()


def quarantine(restarter: Restarter, name: str) -> None:
    now = restarter.clock()
    out = Quarantine(name, "default", now, "stalled", "no progress signal moved", now)
    restarter.memory = restarter.memory.with_quarantine(name, out)


def release(restarter: Restarter, name: str) -> None:
    restarter.memory = restarter.memory.with_quarantine(name, None)


async def test_a_quarantined_server_gets_no_request_through_haproxy_until_it_is_routable(
    tmp_path: Path,
) -> None:
    """After the verdict no request reaches gpu-a (all go to gpu-b, all succeed); once the
    verdict is routable again, HAProxy puts it back and it gets requests again."""
    marker = tmp_path / "marker"
    async with (
        running_simulator(tokens_per_second=2000) as gpu_a,
        running_simulator(tokens_per_second=2000) as gpu_b,
    ):
        config = write_config(
            tmp_path,
            [target("gpu-a", gpu_a, marker), target("gpu-b", gpu_b, marker)],
            quarantine=SET_BY_THE_TEST,
        )
        async with running_restarter(config) as (client, restarter):
            agent: AgentResponder = client.app[AGENT_KEY]
            servers = [("gpu-a", gpu_a.url.removeprefix("http://")), ("gpu-b", gpu_b.url[7:])]
            with running_haproxy(tmp_path, servers, agent.port) as proxy:
                await wait_for(
                    "both servers UP",
                    lambda: all(proxy.status(name) == "UP" for name, _ in servers),
                    proxy,
                )
                await send(proxy, REQUESTS)
                assert completions(gpu_a) > 0
                assert completions(gpu_b) > 0

                quarantine(restarter, "gpu-a")
                await wait_for(
                    "gpu-a DOWN by the agent",
                    lambda: proxy.status("gpu-a") == "DOWN (agent)",
                    proxy,
                )
                said = proxy.servers()["gpu-a"]["last_agt"]
                assert said == "via agent : down (stallwatch: stalled: no progress signal moved)"
                before_a, before_b = completions(gpu_a), completions(gpu_b)
                await send(proxy, REQUESTS)
                assert completions(gpu_a) == before_a
                assert completions(gpu_b) == before_b + REQUESTS

                release(restarter, "gpu-a")
                await wait_for("gpu-a UP again", lambda: proxy.status("gpu-a") == "UP", proxy)
                await send(proxy, REQUESTS)
                assert completions(gpu_a) > before_a
    assert not marker.exists()  # nothing was restarted


async def test_the_agents_up_leaves_an_operators_maintenance_alone(tmp_path: Path) -> None:
    """A server an operator put in MAINT through HAProxy's CLI stays there while the agent keeps
    answering `up` (the agent never says `ready`, which would cancel the operator's MAINT)."""
    marker = tmp_path / "marker"
    async with (
        running_simulator(tokens_per_second=2000) as gpu_a,
        running_simulator(tokens_per_second=2000) as gpu_b,
    ):
        config = write_config(
            tmp_path,
            [target("gpu-a", gpu_a, marker), target("gpu-b", gpu_b, marker)],
            quarantine=SET_BY_THE_TEST,
        )
        async with running_restarter(config) as (client, _):
            agent: AgentResponder = client.app[AGENT_KEY]
            servers = [("gpu-a", gpu_a.url[7:]), ("gpu-b", gpu_b.url[7:])]
            with running_haproxy(tmp_path, servers, agent.port, agent_inter="200ms") as proxy:
                await wait_for(
                    "both servers UP",
                    lambda: all(proxy.status(name) == "UP" for name, _ in servers),
                    proxy,
                )
                proxy.command(f"set server {BACKEND}/gpu-b state maint")
                await wait_for("gpu-b in MAINT", lambda: proxy.status("gpu-b") == "MAINT", proxy)
                asked: list[str] = []
                real_answer = agent.answer

                def recording(line: str) -> str:
                    asked.append(line)
                    return real_answer(line)

                agent.answer = recording
                await wait_for(
                    "HAProxy asks about gpu-b in MAINT three times",
                    lambda: asked.count(f"{BACKEND}/gpu-b") >= 3,
                    proxy,
                )
                assert proxy.status("gpu-b") == "MAINT"
                assert proxy.servers()["gpu-b"]["last_agt"] == "via agent : up"


async def test_a_hung_server_leaves_haproxy_on_the_alert_and_returns_when_it_moves(
    tmp_path: Path,
) -> None:
    """The real flow: gpu-a's engine hangs with requests in flight, LLMServerStuck reaches the
    restarter, which confirms it and quarantines gpu-a (its restart window still open); HAProxy
    marks it DOWN and no user request reaches it; gpu-a moves again, the restarter's own look
    sees progress and releases it, HAProxy puts it back, and it serves again. No restart."""
    marker = tmp_path / "marker"
    async with (
        running_simulator(tokens_per_second=200) as gpu_a,
        running_simulator(tokens_per_second=200) as gpu_b,
    ):
        config = write_config(
            tmp_path,
            [target("gpu-a", gpu_a, marker), target("gpu-b", gpu_b, marker)],
            restart_after="10m",
            quarantine={"agent_listen": "127.0.0.1:0", "check_interval": "1s"},
        )
        async with running_restarter(config) as (client, restarter):
            agent: AgentResponder = client.app[AGENT_KEY]
            servers = [("gpu-a", gpu_a.url[7:]), ("gpu-b", gpu_b.url[7:])]
            with running_haproxy(tmp_path, servers, agent.port) as proxy:
                await wait_for(
                    "both servers UP",
                    lambda: all(proxy.status(name) == "UP" for name, _ in servers),
                    proxy,
                )
                async with aiohttp.ClientSession() as session:
                    # Work in flight on gpu-a (sent to it directly), then its engine hangs.
                    long_request = {"model": "tiny", "prompt": "x", "max_tokens": 1500}
                    in_flight = [
                        asyncio.create_task(
                            session.post(gpu_a.url + "/v1/completions", json=long_request)
                        )
                        for _ in range(2)
                    ]
                    await wait_for(
                        "2 requests running on gpu-a", lambda: gpu_a.stats()["running"] == 2, proxy
                    )
                    gpu_a.apply_fault("hang")
                    answer = await post_alerts(client, payload(alert("gpu-a")))
                    assert [d["reason"] for d in answer["decisions"]] == ["restart_window"]
                    assert not restarter.verdict("gpu-a").routable

                    await wait_for(
                        "gpu-a DOWN by the agent",
                        lambda: proxy.status("gpu-a") == "DOWN (agent)",
                        proxy,
                    )
                    before_a, before_b = completions(gpu_a), completions(gpu_b)
                    await send(proxy, REQUESTS)
                    assert completions(gpu_a) == before_a
                    assert completions(gpu_b) == before_b + REQUESTS

                    gpu_a.apply_fault("recover")
                    await wait_for(
                        "gpu-a back UP after the restarter saw it move",
                        lambda: proxy.status("gpu-a") == "UP",
                        proxy,
                    )
                    assert restarter.verdict("gpu-a").routable
                    rows = restarter.journal.routing_events(0)
                    assert [(row.kind, row.target, row.reason) for row in rows] == [
                        ("quarantined", "gpu-a", "stalled"),
                        ("released", "gpu-a", "progress"),
                    ]
                    await send(proxy, REQUESTS)
                    assert completions(gpu_a) > before_a
                    for task in in_flight:
                        task.cancel()
                    await asyncio.gather(*in_flight, return_exceptions=True)
    assert not marker.exists()  # released, never restarted


async def test_haproxy_keeps_the_agents_last_word_while_the_agent_is_away(tmp_path: Path) -> None:
    """What docs/routing.md says of a restarter that is down: HAProxy takes a refused agent
    connection as no news (L4CON), so a server the agent said `down` about stays DOWN and one
    it said `up` about stays UP until the agent answers again."""
    words = {f"{BACKEND}/gpu-a": "down #stallwatch: stalled: test\n", f"{BACKEND}/gpu-b": "up\n"}
    agent = AgentResponder(lambda line: words[line])
    await agent.start("127.0.0.1:0")
    port = agent.port
    try:
        async with (
            running_simulator(tokens_per_second=2000) as gpu_a,
            running_simulator(tokens_per_second=2000) as gpu_b,
        ):
            servers = [("gpu-a", gpu_a.url[7:]), ("gpu-b", gpu_b.url[7:])]
            with running_haproxy(tmp_path, servers, port, agent_inter="200ms") as proxy:
                await wait_for(
                    "gpu-a DOWN by the agent, gpu-b UP",
                    lambda: (
                        (proxy.status("gpu-a"), proxy.status("gpu-b")) == ("DOWN (agent)", "UP")
                    ),
                    proxy,
                )
                await agent.stop()
                await wait_for(
                    "both agent checks refused",
                    lambda: all(row["agent_status"] == "L4CON" for row in proxy.servers().values()),
                    proxy,
                )
                assert proxy.status("gpu-a") == "DOWN (agent)"
                assert proxy.status("gpu-b") == "UP"
                words[f"{BACKEND}/gpu-a"] = "up\n"
                await agent.start(f"127.0.0.1:{port}")
                await wait_for("gpu-a UP again", lambda: proxy.status("gpu-a") == "UP", proxy)
    finally:
        await agent.stop()
