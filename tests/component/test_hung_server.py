"""A server that accepts connections and never answers, against the real exporter, check and
restarter on loopback: hung twice is stuck and restarted; refused or not connected is down."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from stallwatch.common.exporter_config import IdleTestRequestConfig, TargetConfig
from stallwatch.core.classify import State
from stallwatch.exporter.check_cli import EXIT_DOWN, EXIT_STUCK, run_check
from stallwatch.restarter.confirm import confirm_stall
from stallwatch.simulator.testing import running_simulator
from tests.support.exporter import exporter_for, target, wait_for_state
from tests.support.restarter import (
    alert,
    fake_vllm,
    marker_argv,
    marker_lines,
    payload,
    post_alerts,
    running_restarter,
    settle,
    target_entry,
    write_config,
)


class SilentServer:
    """Accepts every connection, reads what it is sent, and never answers."""

    def __init__(self) -> None:
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        with contextlib.suppress(ConnectionError):
            while await reader.read(4096):
                pass


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[tuple[SilentServer, str]]:
    silent = SilentServer()
    server = await asyncio.start_server(silent.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield silent, f"http://127.0.0.1:{port}"
    finally:
        server.close()
        for writer in silent.writers:
            writer.close()
        await server.wait_closed()


def closed_port() -> int:
    """A loopback port nothing listens on: connections to it are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def full_backlog() -> Iterator[str]:
    """A listening socket that never accepts, its backlog already full: the kernel no longer
    completes handshakes, so a connection is never made (as for a stopped server with a full
    accept queue)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers: list[socket.socket] = []
    try:
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield f"http://127.0.0.1:{port}"
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


# The read bound these tests judge (hung: connected, no answer within it; down: not connected
# within half of it), tight and stated here: tests/support/exporter.py's `target()` gives the
# tests that judge something else a generous one.
HUNG_AFTER = 0.3


def check_target(url: str) -> TargetConfig:
    return TargetConfig(
        name="check",
        url=url,
        interval_seconds=HUNG_AFTER,
        timeout_seconds=HUNG_AFTER,
        test_request=IdleTestRequestConfig(timeout_seconds=0.5),
    )


async def test_check_reads_a_silent_server_hung_twice_and_exits_stuck() -> None:
    """Connected and no answer, twice in a row: hung in two polls, exit 1, no test request."""
    async with silent_server() as (silent, url):
        result = await run_check(check_target(url))
    assert result.exit_code == EXIT_STUCK
    assert result.history.state == State.HUNG
    assert (result.history.state_polls, result.history.polls) == (2, 2)
    assert result.history.test_requests == 0
    assert result.history.poll_errors == {"timeout": 2}
    assert "connected, no answer" in result.as_json()["reason"]
    assert silent.connections >= 2


async def test_check_reads_a_refused_port_down_never_hung() -> None:
    """A refused connection is down: exit 2, never hung."""
    result = await run_check(check_target(f"http://127.0.0.1:{closed_port()}"))
    assert result.exit_code == EXIT_DOWN
    assert result.history.state == State.DOWN
    assert result.history.poll_errors == {"connection": 1}


async def test_a_connection_not_made_in_time_is_down_not_hung() -> None:
    """A handshake that never completes (full backlog) is down, read as not connected."""
    with full_backlog() as url:
        result = await run_check(check_target(url))
    assert result.exit_code == EXIT_DOWN
    assert result.history.state == State.DOWN
    assert "not connected within" in result.as_json()["reason"]


def run_check_command(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stallwatch", "check", url, "--interval", "300ms"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_the_check_command_exits_one_on_a_silent_server() -> None:
    """`stallwatch check` on a server that never answers prints STUCK and exits 1."""
    async with silent_server() as (_silent, url):
        completed = await asyncio.to_thread(run_check_command, url)
    assert completed.returncode == EXIT_STUCK, completed.stdout + completed.stderr
    # `kind: auto` asks /v1/models first, to identify the engine: that is the read that hangs.
    assert completed.stdout.startswith("STUCK: /v1/models: connected, no answer"), completed.stdout


async def scrape(url: str) -> dict[tuple[str, str], float]:
    """The exporter's samples of target `sim`, by (sample name, state or reason label)."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as response:
        text = await response.text()
    return {
        (sample.name, sample.labels.get("state") or sample.labels.get("reason", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("target") == "sim"
    }


async def test_the_simulator_api_hang_reads_hung_twice_and_recovers() -> None:
    """api_hang: /metrics connects and never answers, the exporter publishes hung (up 0); after
    recover it answers again."""
    async with running_simulator() as sim:
        judged = target(
            "sim",
            sim.url,
            interval_seconds=HUNG_AFTER,
            timeout_seconds=HUNG_AFTER,
            test_request=IdleTestRequestConfig(enabled=False),
        )
        async with exporter_for(judged) as (service, url):
            await wait_for_state(service, "sim", State.IDLE, polls=2)
            sim.apply_fault("api_hang")
            hung = await wait_for_state(service, "sim", State.HUNG, polls=2)
            samples = await scrape(url)
            sim.apply_fault("recover")
            back = await wait_for_state(service, "sim", State.IDLE, polls=1)
    assert "connected, no answer" in (hung.verdict.reason if hung.verdict else "")
    assert samples[("stallwatch_target_state", "hung")] == 1
    assert samples[("stallwatch_target_state", "down")] == 0
    assert samples[("stallwatch_target_up", "")] == 0
    assert samples[("stallwatch_target_state_polls", "")] >= 2
    assert samples[("stallwatch_poll_errors_total", "timeout")] >= 2
    assert samples[("stallwatch_poll_errors_total", "connection")] == 0
    assert back.restarts_detected == 0  # the same process, answering again


async def test_confirmation_of_a_silent_server_is_two_unanswered_reads() -> None:
    """Both confirmation reads connect and get no answer: refusal no_answer, two connections."""
    async with silent_server() as (silent, url), aiohttp.ClientSession() as session:
        confirmation = await confirm_stall(session, url + "/metrics", gap_seconds=0.1, timeout=0.3)
    assert confirmation.refusal == "no_answer", confirmation
    assert not confirmation.confirmed
    assert silent.connections == 2


async def test_confirmation_of_a_refused_port_is_down_after_one_read() -> None:
    """A refused first read settles it: down."""
    async with aiohttp.ClientSession() as session:
        confirmation = await confirm_stall(
            session,
            f"http://127.0.0.1:{closed_port()}/metrics",
            gap_seconds=0.1,
            timeout=0.3,
        )
    assert confirmation.refusal == "down", confirmation


def hung_target(name: str, url: str, marker: Path) -> dict[str, Any]:
    return target_entry(name, url, {"kind": "command", "argv": marker_argv(marker)})


CONFIRM = {"gap": "1s", "timeout": "300ms"}


async def test_the_restarter_restarts_a_silent_server_for_the_hung_alert_only(
    tmp_path: Path,
) -> None:
    """LLMServerHung on a server that never answers is confirmed and restarted once;
    LLMServerStuck about the same server is refused as down."""
    marker = tmp_path / "marker"
    async with silent_server() as (_silent, url):
        config = write_config(
            tmp_path, [hung_target("gpu1", url + "/metrics", marker)], confirm=CONFIRM
        )
        async with running_restarter(config) as (client, restarter):
            stuck = await post_alerts(client, payload(alert(fingerprint="s1")))
            hung = await post_alerts(
                client, payload(alert(alertname="LLMServerHung", fingerprint="h1"))
            )
            await settle(restarter)
    assert stuck["decisions"][0]["reason"] == "not_confirmed_down"
    assert hung["decisions"][0]["decision"] == "restart"
    assert hung["decisions"][0]["reason"] == "confirmed"
    assert marker_lines(marker) == ["gpu1"]


async def test_the_restarter_refuses_the_hung_alert_for_a_refused_or_an_answering_server(
    tmp_path: Path,
) -> None:
    """LLMServerHung: a refused connection is down, a server that answers (even stalled) is
    not hung; nothing is restarted."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        refused_url = f"http://127.0.0.1:{closed_port()}/metrics"
        config = write_config(
            tmp_path,
            [hung_target("gpu1", refused_url, marker), hung_target("gpu2", fake.url, marker)],
            confirm=CONFIRM,
        )
        async with running_restarter(config) as (client, restarter):
            answer = await post_alerts(
                client,
                payload(
                    alert("gpu1", alertname="LLMServerHung", fingerprint="h1"),
                    alert("gpu2", alertname="LLMServerHung", fingerprint="h2"),
                ),
            )
            await settle(restarter)
    reasons = {d["target"]: d["reason"] for d in answer["decisions"]}
    assert reasons == {"gpu1": "not_confirmed_down", "gpu2": "not_confirmed_error"}
    assert fake.reads == 2
    assert not marker.exists()
