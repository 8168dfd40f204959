"""The restarter's routing verdict on the wire: `GET /routable` (by ?target= and by the Host
header, text and JSON, no token) and the agent-check port (its answers and its bounds)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from stallwatch.common.restarter_config import RestarterConfig
from stallwatch.core.quarantine import Quarantine
from stallwatch.restarter.agent import AgentResponder
from stallwatch.restarter.app import AGENT_KEY, ConfigReloader
from stallwatch.restarter.service import Restarter
from tests.support.restarter import (
    AUTH,
    alert,
    fake_vllm,
    marker_argv,
    payload,
    post_alerts,
    running_restarter,
    target_entry,
    write_config,
)

DETAIL = "work present and no progress signal moved"
# These tests set the verdict themselves: the restarter's periodic look at quarantined targets
# stays out of the way.
SET_BY_THE_TEST = {"check_interval": "1h", "expire_after": "2h"}


def quarantine(restarter: Restarter, name: str, since: float) -> None:
    out = Quarantine(name, "default", since, "stalled", DETAIL, since)
    restarter.memory = restarter.memory.with_quarantine(name, out)


def one_target(tmp_path: Path, url: str) -> RestarterConfig:
    """A restarter of one target, gpu-a, whose verdict the test sets."""
    action = {"kind": "command", "argv": ["true"]}
    return write_config(tmp_path, [target_entry("gpu-a", url, action)], quarantine=SET_BY_THE_TEST)


async def routable(client: TestClient[Any, Any], path: str, **headers: str) -> tuple[int, str]:
    response = await client.get(path, headers=headers)
    return response.status, await response.text()


async def test_routable_answers_by_target_parameter_without_a_token(tmp_path: Path) -> None:
    """200 `routable`, then 503 with reason, detail and time out once quarantined, then 200
    again once released; no bearer token is asked (the restarter has one)."""
    async with fake_vllm("stalled") as fake:
        targets = [
            target_entry(name, fake.url, {"kind": "command", "argv": marker_argv(tmp_path / "m")})
            for name in ("gpu-a", "gpu-b")
        ]
        config = write_config(tmp_path, targets, quarantine=SET_BY_THE_TEST)
        assert config.token is not None
        async with running_restarter(config) as (client, restarter):
            assert await routable(client, "/routable?target=gpu-a") == (200, "routable\n")
            quarantine(restarter, "gpu-a", restarter.clock() - 30)
            status, text = await routable(client, "/routable?target=gpu-a")
            assert status == 503
            assert text.startswith(f"not routable: stalled: {DETAIL} (out of rotation for 3")
            assert text.count("\n") == 1
            assert await routable(client, "/routable?target=gpu-b") == (200, "routable\n")
            restarter.memory = restarter.memory.with_quarantine("gpu-a", None)
            assert await routable(client, "/routable?target=gpu-a") == (200, "routable\n")
            assert fake.reads == 0  # answering reads no server


async def test_routable_is_keyed_by_the_host_header_as_envoy_sends_it(tmp_path: Path) -> None:
    """Without ?target=, the Host header (port stripped) names the target: Envoy's per-endpoint
    health check with `hostname` works unchanged."""
    async with fake_vllm("stalled") as fake:
        config = one_target(tmp_path, fake.url)
        async with running_restarter(config) as (client, restarter):
            quarantine(restarter, "gpu-a", restarter.clock())
            status, text = await routable(client, "/routable", Host="gpu-a")
            assert status == 503
            assert text.startswith("not routable: stalled:")
            status, _ = await routable(client, "/routable", Host="gpu-a:9733")
            assert status == 503


async def test_routable_answers_json_when_asked(tmp_path: Path) -> None:
    """`Accept: application/json` gets the verdict as a document, with the same status."""
    async with fake_vllm("stalled") as fake:
        config = one_target(tmp_path, fake.url)
        async with running_restarter(config) as (client, restarter):
            since = restarter.clock() - 10
            quarantine(restarter, "gpu-a", since)
            response = await client.get(
                "/routable?target=gpu-a", headers={"Accept": "application/json"}
            )
            assert response.status == 503
            document = await response.json()
            assert document["routable"] is False
            assert document["known"] is True
            assert (document["reason"], document["detail"], document["since"]) == (
                "stalled",
                DETAIL,
                since,
            )
            assert document["out_for_seconds"] >= 10
            assert response.headers["Cache-Control"] == "no-store"


async def test_an_unknown_target_is_routable_and_said_to_be_unknown(tmp_path: Path) -> None:
    """Fail-open: a name the restarter does not know gets 200, saying so; a bad name gets 400."""
    async with fake_vllm("stalled") as fake:
        config = one_target(tmp_path, fake.url)
        async with running_restarter(config) as (client, _):
            assert await routable(client, "/routable?target=nope") == (
                200,
                "routable: unknown target 'nope' (fail-open)\n",
            )
            response = await client.get(
                "/routable?target=nope", headers={"Accept": "application/json"}
            )
            assert (await response.json())["known"] is False
            status, _ = await routable(client, "/routable?target=" + "x" * 300)
            assert status == 400
            status, _ = await routable(client, "/routable?target=", **AUTH)
            assert status == 400


async def ask(port: int, line: bytes) -> bytes:
    """One agent-check exchange as HAProxy makes it: send the line, read until closed (a reset,
    from closing with the line unread, is no answer too)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(line)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


async def test_the_agent_answers_down_for_a_quarantined_target_and_up_otherwise(
    tmp_path: Path,
) -> None:
    """On `quarantine.agent_listen`: `down #...` for a quarantined target (by `backend/server`
    or by its whole name), `up` once released, and `up` for a name nobody knows."""
    async with fake_vllm("stalled") as fake:
        config = write_config(
            tmp_path,
            [target_entry("gpu-a", fake.url, {"kind": "command", "argv": ["true"]})],
            quarantine={**SET_BY_THE_TEST, "agent_listen": "127.0.0.1:0"},
        )
        async with running_restarter(config) as (client, restarter):
            port = client.app[AGENT_KEY].port
            assert await ask(port, b"llm/gpu-a\n") == b"up\n"
            quarantine(restarter, "gpu-a", restarter.clock())
            down = f"down #stallwatch: stalled: {DETAIL}\n".encode()
            assert await ask(port, b"llm/gpu-a\n") == down
            assert await ask(port, b"gpu-a\r\n") == down
            assert await ask(port, b"llm/unknown\n") == b"up\n"
            restarter.memory = restarter.memory.with_quarantine("gpu-a", None)
            assert await ask(port, b"llm/gpu-a\n") == b"up\n"


async def test_the_agent_port_is_off_without_agent_listen(tmp_path: Path) -> None:
    """No `quarantine.agent_listen`: no responder is started."""
    async with fake_vllm("stalled") as fake:
        config = one_target(tmp_path, fake.url)
        async with running_restarter(config) as (client, _):
            assert AGENT_KEY not in client.app


async def test_the_agent_closes_a_line_too_long_and_a_silent_connection_unanswered() -> None:
    """A line over the limit, or none within the timeout, is closed with no answer; a good
    line on the same port is still answered."""
    agent = AgentResponder(lambda line: f"up #{line}\n", max_line=16, line_timeout=0.5)
    await agent.start("127.0.0.1:0")
    try:
        assert await ask(agent.port, b"x" * 17 + b"\n") == b""
        assert await ask(agent.port, b"x" * 40) == b""  # no newline, ever
        reader, writer = await asyncio.open_connection("127.0.0.1", agent.port)
        assert await asyncio.wait_for(reader.read(), 10) == b""  # silent: closed by the agent
        writer.close()
        assert await ask(agent.port, b"x" * 16 + b"\n") == b"up #" + b"x" * 16 + b"\n"
        assert agent.refused == 3
    finally:
        await agent.stop()


async def test_the_agent_caps_connections_at_once() -> None:
    """Past `max_connections` open at once, a new connection is closed unanswered; those
    within the cap are still answered."""
    agent = AgentResponder(lambda line: "up\n", max_connections=2, line_timeout=30)
    await agent.start("127.0.0.1:0")
    held = []
    try:
        for _ in range(2):
            held.append(await asyncio.open_connection("127.0.0.1", agent.port))
        assert await ask(agent.port, b"gpu-a\n") == b""
        for reader, writer in held:
            writer.write(b"gpu-a\n")
            assert await asyncio.wait_for(reader.read(), 10) == b"up\n"
        assert await ask(agent.port, b"gpu-a\n") == b"up\n"  # the held ones are done
    finally:
        for _, writer in held:
            writer.close()
        await agent.stop()


async def test_a_restarted_restarter_answers_down_at_once_for_a_quarantine_it_journaled(
    tmp_path: Path,
) -> None:
    """A stall confirmed by one restarter takes gpu-a out; a new restarter on the same journal
    answers `down` on its agent port from its first answer (an `up` would put it back)."""
    async with fake_vllm("stalled") as stalled, fake_vllm("progress") as moving:
        action = {"kind": "command", "argv": marker_argv(tmp_path / "m")}
        config = write_config(
            tmp_path,
            [target_entry("gpu-a", stalled.url, action), target_entry("gpu-b", moving.url, action)],
            restart_after="10m",
            quarantine={**SET_BY_THE_TEST, "agent_listen": "127.0.0.1:0"},
        )
        async with running_restarter(config) as (client, restarter):
            await post_alerts(client, payload(alert("gpu-a")))
            assert not restarter.verdict("gpu-a").routable
        async with running_restarter(config) as (client, _):
            reply = await ask(client.app[AGENT_KEY].port, b"llm/gpu-a\n")
            assert reply.startswith(b"down #stallwatch: stalled: ")
            assert await ask(client.app[AGENT_KEY].port, b"llm/gpu-b\n") == b"up\n"


async def test_a_reload_keeps_the_agent_port_until_the_next_start(tmp_path: Path) -> None:
    """A reload that changes `quarantine.agent_listen` keeps the running port, takes the rest
    of `quarantine:`, and the agent goes on answering on its port."""
    async with fake_vllm("stalled") as fake:
        action = {"kind": "command", "argv": ["true"]}
        entry = [target_entry("gpu-a", fake.url, action)]
        config = write_config(
            tmp_path, entry, quarantine={**SET_BY_THE_TEST, "agent_listen": "127.0.0.1:0"}
        )
        async with running_restarter(config) as (client, restarter):
            port = client.app[AGENT_KEY].port
            changed = {**SET_BY_THE_TEST, "agent_listen": "127.0.0.1:1", "max_share": 40}
            write_config(tmp_path, entry, quarantine=changed)
            reloader = ConfigReloader(restarter, tmp_path / "restarter.yml", restarter.clock)
            assert reloader.reload() is None
            assert restarter.config.quarantine.agent_listen == "127.0.0.1:0"
            assert restarter.config.quarantine.max_share == 40  # the rest is reloaded
            assert await ask(port, b"llm/gpu-a\n") == b"up\n"
