"""Fleet mode with real Prometheus and Alertmanager: discovery, an HA pair, two shards.

Prometheus runs the shipped `/probe` jobs (`prometheus/probe-file-sd.yml`,
`prometheus/probe-sharded.yml`, see fleet_support), discovering simulators from files; the
restart alerts go through real Alertmanager to the real restarter, whose config names each
server by the `target` label `/probe` gives it: the `host:port` that discovery found.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from stallwatch import USER_AGENT
from stallwatch.simulator.load import run_load
from stallwatch.simulator.server import SimConfig
from stallwatch.simulator.testing import running_simulator
from tests.support.alerting_stack import poll, running_stack
from tests.support.pipeline import TIMEOUT, restarter_process
from tests.support.restarter_pipeline import (
    RESTART_SCRIPT,
    SIM_ARGS,
    Simulator,
    loaded,
    rows,
    simulator,
)

from .fleet_support import (
    PROBE_JOB,
    SHARD_JOBS,
    FleetStack,
    fleet_exporter,
    wait_gone,
    write_sd,
)

# Three Prometheus stacks in one module, about 70 s in all: started first (tests/conftest.py).
pytestmark = [pytest.mark.e2e, pytest.mark.long_wait]

REPO = Path(__file__).resolve().parents[2]
HTTP = aiohttp.ClientTimeout(total=5)


@pytest.fixture(scope="module")
def fleet_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetStack]:
    """Prometheus (with the shipped /probe jobs) and Alertmanager, webhook to the restarter."""
    with running_stack(FleetStack(tmp_path_factory.mktemp("fleet-stack"), REPO)) as stack:
        yield stack


def address(url: str) -> str:
    return url.removeprefix("http://")


def restarter_config(stack: FleetStack, tmp_path: Path, sim: Simulator) -> dict[str, Any]:
    script = tmp_path / "restart_simulator.py"
    script.write_text(RESTART_SCRIPT)
    token_file = tmp_path / "restarter.token"
    token_file.write_text(stack.token + "\n")
    token_file.chmod(0o600)
    return {
        "listen": stack.restarter_address,
        "token_file": str(token_file),
        "journal": str(tmp_path / "journal.sqlite"),
        "confirm": {"gap": "1s", "timeout": "1s"},
        "restart_after": "0s",
        "targets": [
            {
                # The `target` label of /probe: the host:port discovery found.
                "name": address(sim.url),
                "url": sim.url,
                "action": {
                    "kind": "command",
                    "argv": [
                        sys.executable,
                        str(script),
                        str(sim.pidfile),
                        str(sim.port),
                        str(tmp_path / "simulator-restarted.log"),
                        *SIM_ARGS,
                    ],
                },
                "cooldown": "5m",
                "action_timeout": "30s",
            }
        ],
    }


def watched(job: str, target: str) -> str:
    return f'stallwatch_polls_total{{job="{job}",target="{target}"}} > 0'


def alerts_about(stack: FleetStack, server: str) -> list[dict[str, Any]]:
    """Every alert, pending or firing, that named the server in the last two minutes."""
    return stack.query(
        f'max_over_time(ALERTS{{target="{server}"}}[2m])'
        f' or max_over_time(ALERTS{{instance="{server}"}}[2m])'
    )


async def test_file_sd_watches_restarts_adds_and_forgets(
    fleet_stack: FleetStack, tmp_path: Path
) -> None:
    """Three servers from a file: the hung one is restarted once; one added is watched, one
    removed goes away with no alert."""
    stack = fleet_stack
    with simulator(tmp_path) as hung:
        async with (
            running_simulator(SimConfig()) as calm,
            running_simulator(SimConfig()) as leaving,
            running_simulator(SimConfig()) as joining,
            aiohttp.ClientSession(timeout=HTTP) as session,
            restarter_process(
                restarter_config(stack, tmp_path, hung),
                tmp_path,
                url=f"http://{stack.restarter_address}",
                token=stack.token,
                timeout=TIMEOUT,
            ) as restarter,
            loaded(hung, session, concurrency=2),
            fleet_exporter(stack.exporter_port),
        ):
            servers = [address(s.url) for s in (hung, calm, leaving)]
            write_sd(stack.sd_file, servers)
            for server in servers:
                await stack.wait_for_query(watched(PROBE_JOB, server), TIMEOUT)
            await stack.wait_for_query(
                f'stallwatch_target_state{{target="{servers[0]}",state="busy"}} == 1', TIMEOUT
            )

            # The hung server: LLMServerStuck, through Alertmanager, one restart.
            await hung.fault(session, "hang")

            async def restarted() -> list[dict[str, Any]] | None:
                entries = await restarter.journal(session)
                return entries if rows(entries, servers[0], "action_result") else None

            entries = await poll(restarted, 60, f"a restart\n{restarter.log_tail()}")

            # A server added to the file is watched within one refresh.
            added_at = time.monotonic()
            write_sd(stack.sd_file, [*servers, address(joining.url)])
            await stack.wait_for_query(watched(PROBE_JOB, address(joining.url)), TIMEOUT)
            added_after = time.monotonic() - added_at

            # A server removed from the file: its series go away, and no alert names it.
            write_sd(stack.sd_file, [servers[0], servers[1], address(joining.url)])
            await wait_gone(stack, f'stallwatch_target_state{{target="{servers[2]}"}}', TIMEOUT)
            await asyncio.sleep(8)  # longer than LLMServerDown's 3 s and ExporterDown's 2 s
            leaving_alerts = alerts_about(stack, servers[2])
            calm_alerts = alerts_about(stack, servers[1])
            stuck = stack.query(
                f'max_over_time(ALERTS{{alertname="LLMServerStuck",target="{servers[0]}"}}[5m])'
            )
            entries = await restarter.journal(session)

    assert len(rows(entries, servers[0], "restart")) == 1, entries
    assert rows(entries, servers[0], "restart")[0]["alertname"] == "LLMServerStuck"
    assert {e["target"] for e in entries} == {servers[0]}
    assert stuck, "LLMServerStuck never fired for the hung server"
    assert added_after < 5 + 3, added_after  # the file refresh (5 s) and a scrape or two
    assert leaving_alerts == [], leaving_alerts
    assert calm_alerts == [], calm_alerts


async def test_an_ha_pair_reads_each_server_as_one_prometheus(fleet_stack: FleetStack) -> None:
    """A second Prometheus scraping the same /probe doubles the scrapes, not the reads: polls,
    test requests and the stuck count grow at one per interval, as with one Prometheus."""
    stack = fleet_stack
    window = 8.0
    test_request = {"enabled": True, "min_interval": "2s", "timeout": "1s"}
    async with (
        running_simulator(SimConfig()) as idle,
        fleet_exporter(stack.exporter_port, test_request=test_request) as service,
    ):
        server = address(idle.url)
        write_sd(stack.sd_file, [server])
        await stack.wait_for_query(watched(PROBE_JOB, server), TIMEOUT)
        assert service.probes is not None
        probes = service.probes

        def counts() -> tuple[int, int, int]:
            sent = idle.stats()["completions_by_user_agent"].get(USER_AGENT, 0)
            return probes.reads, probes.answers_from_memory, sent

        await asyncio.sleep(2)
        one_before = counts()
        await asyncio.sleep(window)
        one_after = counts()

        await asyncio.to_thread(stack.start_second_prometheus)

        async def second_scrapes() -> bool | None:
            result = await asyncio.to_thread(
                stack.query_second, f'up{{job="{PROBE_JOB}",instance="{server}"}} == 1'
            )
            return bool(result) or None

        await poll(second_scrapes, TIMEOUT, "the second Prometheus to scrape /probe")
        await asyncio.sleep(2)
        two_before = counts()
        await asyncio.sleep(window)
        two_after = counts()
        polls_on_second = stack.query_second(f'stallwatch_target_state_polls{{target="{server}"}}')
        polls_on_first = stack.query(f'stallwatch_target_state_polls{{target="{server}"}}')

    one = [after - before for before, after in zip(one_before, one_after, strict=True)]
    two = [after - before for before, after in zip(two_before, two_after, strict=True)]
    print(f"one Prometheus: reads, from memory, test requests = {one}; two: {two}")
    # Reads: one per 1 s interval with one Prometheus and with two.
    assert abs(two[0] - one[0]) <= 1, (one, two)
    assert two[0] <= window + 1, two
    # The second Prometheus' scrapes were answered from memory.
    assert two[1] >= window - 2, two
    # Test requests (min_interval 2 s) to the idle server: the same with two readers.
    assert abs(two[2] - one[2]) <= 1, (one, two)
    # Both Prometheus see one count of consecutive polls, growing at one per interval.
    first = float(polls_on_first[0]["value"][1])
    second = float(polls_on_second[0]["value"][1])
    assert abs(first - second) <= 1, (first, second)


async def test_two_shards_split_the_servers_and_one_lost_fires_exporter_down(
    fleet_stack: FleetStack,
) -> None:
    """hashmod sends each server to exactly one exporter; a stuck server alerts from its shard;
    losing that exporter fires StallwatchExporterDown for every server it watched."""
    stack = fleet_stack
    async with contextlib.AsyncExitStack() as running:
        handles = [
            await running.enter_async_context(running_simulator(SimConfig(max_num_seqs=2)))
            for _ in range(6)
        ]
        servers = {address(h.url): h for h in handles}
        shard0 = await running.enter_async_context(fleet_exporter(stack.shard_ports[0]))
        shard1_context = fleet_exporter(stack.shard_ports[1])
        shard1 = await shard1_context.__aenter__()
        try:
            write_sd(stack.shard_sd_file, servers)
            shards = "|".join(SHARD_JOBS)
            for server in servers:
                await stack.wait_for_query(
                    f'stallwatch_polls_total{{job=~"{shards}",target="{server}"}} > 0', TIMEOUT
                )
            assert shard0.probes is not None
            assert shard1.probes is not None
            on0 = {address(url) for _, url in shard0.probes.entries}
            on1 = {address(url) for _, url in shard1.probes.entries}
            victim = sorted(on1)[0]
            load = asyncio.create_task(
                run_load(
                    servers[victim].url,
                    concurrency=2,
                    prompt_tokens=10,
                    max_tokens=1_900,
                    duration=60,
                )
            )
            running.callback(load.cancel)
            await poll(lambda: _running(servers[victim]), TIMEOUT, "the load to run on the victim")
            servers[victim].apply_fault("hang")
            await stack.wait_for_alert("LLMServerStuck", victim, timeout=TIMEOUT)
        finally:
            await shard1_context.__aexit__(None, None, None)

        async def shard_down() -> set[str] | None:
            firing = {
                alert["labels"].get("instance", "")
                for alert in await asyncio.to_thread(stack.alerts)
                if alert["labels"]["alertname"] == "StallwatchExporterDown"
                and alert["labels"].get("job") == SHARD_JOBS[1]
                and alert["state"] == "firing"
            }
            return firing if firing == on1 else None

        down = await poll(shard_down, TIMEOUT, "StallwatchExporterDown for shard 1's servers")
        still = stack.query(f'stallwatch_polls_total{{job="{SHARD_JOBS[0]}"}}')
        stuck_now = [
            a
            for a in stack.alerts()
            if a["labels"]["alertname"] == "LLMServerStuck" and a["labels"]["target"] == victim
        ]

    assert on0 | on1 == set(servers)
    assert not on0 & on1  # each server watched by exactly one exporter
    assert on0  # six servers: both shards have some
    assert on1
    assert down == on1
    assert victim in down  # its stuck alert resolved, and this alert names it
    assert stuck_now == []
    assert {series["metric"]["target"] for series in still} == on0


async def _running(handle: Any) -> bool | None:
    return handle.stats()["running"] == 2 or None
