"""Fleet safety through the running restarter: a mass stall restarts none and latches the
breaker, pause and resume over HTTP and from the CLI, failed actions in a row, and the measured
load time behind `cooldown: auto`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stallwatch.core.alerts import Alert
from stallwatch.core.policy import Decision
from stallwatch.restarter import waiting
from stallwatch.restarter.cli import run_control
from stallwatch.restarter.journal import Journal
from tests.support.restarter import (
    AUTH,
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


def targets(url: str, marker: Path, count: int, **extra: Any) -> list[dict[str, Any]]:
    action = {"kind": "command", "argv": marker_argv(marker)}
    return [target_entry(f"gpu{i}", url, action, **extra) for i in range(count)]


def stuck(name: str, status: str = "firing") -> dict[str, Any]:
    return alert(name, fingerprint=f"fp-{name}", status=status)


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def test_a_mass_stall_of_5_of_8_restarts_none_and_latches_the_breaker(
    tmp_path: Path,
) -> None:
    """Five of eight targets stuck at once (one notification each, as Alertmanager groups them)
    restart nothing, open the breaker in the journal and its gauge, and count each refusal;
    only a resume lets a stall be restarted: the one still firing is judged again at once."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(
            tmp_path, targets(fake.url, marker, 8), fleet_window={"max_targets": 8}
        )
        async with running_restarter(config) as (client, restarter):
            answers = await asyncio.gather(
                *(post_alerts(client, payload(stuck(f"gpu{i}"))) for i in range(5))
            )
            await settle(restarter)
            reasons = [answer["decisions"][0]["reason"] for answer in answers]
            assert reasons == ["breaker_open"] * 5
            assert marker_lines(marker) == []
            assert restarter.journal.count(decision="control", reason="breaker_open") == 1
            text = await (await client.get("/metrics")).text()
            assert metric(text, "stallwatch_restarter_breaker_open") == 1.0
            assert metric(text, "stallwatch_restarter_stalled_targets") == 5.0
            assert 'skips_total{reason="breaker_open",target="gpu0"} 1.0' in text
            for i in range(5):
                await post_alerts(client, payload(stuck(f"gpu{i}", "resolved")))
            still_open = await post_alerts(client, payload(stuck("gpu6")))
            assert still_open["decisions"][0]["reason"] == "breaker_open"
            assert (await client.post("/-/resume")).status == 401
            resumed = await client.post("/-/resume", headers=AUTH)
            assert (await resumed.json())["judged_again"] == 1
            await settle(restarter)
            assert marker_lines(marker) == ["gpu6"]  # held behind the breaker, still firing
            after = await post_alerts(client, payload(alert("gpu7", fingerprint="fp-new")))
            await settle(restarter)
            assert after["decisions"][0]["reason"] == "confirmed"
            assert marker_lines(marker) == ["gpu6", "gpu7"]


async def test_the_stalled_count_survives_a_restart_and_ends_per_alert(tmp_path: Path) -> None:
    """Firing restart alerts are read back from the journal by a restarted restarter; a target
    stays stalled until every one of its alerts resolves."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, targets(fake.url, marker, 8), mass_stall={"min_stalled": 8})
        async with running_restarter(config) as (client, _restarter):
            assert (await client.post("/-/pause", headers=AUTH)).status == 200
            for name in ("gpu0", "gpu1", "gpu2"):
                await post_alerts(client, payload(stuck(name)))
            hung = alert("gpu2", fingerprint="fp-gpu2-hung", alertname="LLMServerHung")
            await post_alerts(client, payload(hung))
        async with running_restarter(config) as (client, _restarter):
            text = await (await client.get("/metrics")).text()
            assert metric(text, "stallwatch_restarter_stalled_targets") == 3.0
            await post_alerts(client, payload(stuck("gpu0", "resolved")))
            await post_alerts(client, payload(stuck("gpu2", "resolved")))
            text = await (await client.get("/metrics")).text()
            assert metric(text, "stallwatch_restarter_stalled_targets") == 2.0
    assert marker_lines(marker) == []


async def test_pause_over_http_holds_restarts_and_survives_a_restart(tmp_path: Path) -> None:
    """`POST /-/pause` stops every restart with reason `paused`, is kept in the journal across
    a restart of the restarter, and `POST /-/resume` ends it and judges the held alert again."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, targets(fake.url, marker, 2))
        async with running_restarter(config) as (client, _restarter):
            assert (await client.post("/-/pause", params={"for": "2h"})).status == 401
            bad = await client.post("/-/pause", params={"for": "two hours"}, headers=AUTH)
            assert bad.status == 400
            paused = await client.post(
                "/-/pause", params={"for": "2h", "reason": "driver upgrade"}, headers=AUTH
            )
            assert (await paused.json())["for_seconds"] == 7200.0
        async with running_restarter(config) as (client, restarter):
            text = await (await client.get("/metrics")).text()
            assert metric(text, "stallwatch_restarter_paused") == 1.0
            answer = await post_alerts(client, payload(stuck("gpu0")))
            assert answer["decisions"][0]["reason"] == "paused"
            text = await (await client.get("/metrics")).text()
            assert metric(text, "stallwatch_restarter_held_alerts") == 1.0
            resumed = await client.post("/-/resume", headers=AUTH)
            assert (await resumed.json())["judged_again"] == 1
            await settle(restarter)
            text = await (await client.get("/metrics")).text()
            assert metric(text, "stallwatch_restarter_held_alerts") == 0.0
            answer = await post_alerts(client, payload(alert("gpu1", fingerprint="other")))
            await settle(restarter)
            assert answer["decisions"][0]["reason"] == "confirmed"
    assert marker_lines(marker) == ["gpu0", "gpu1"]


async def test_pause_and_resume_from_the_cli_reach_the_running_restarter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stallwatch restarter pause` writes the journal the running restarter reads at once;
    `resume` ends the pause, and the alert refused meanwhile is judged again without a new
    delivery."""
    monkeypatch.setattr(waiting, "RELEASE_CHECK_SECONDS", 0.05)
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, targets(fake.url, marker, 1))
        path = tmp_path / "restarter.yml"
        async with running_restarter(config) as (client, restarter):
            args = argparse.Namespace(
                control_config=path,
                config=None,
                restarter_command="pause",
                control="paused",
                pause_for="30m",
                reason="rack move",
            )
            assert run_control(args) == 0
            answer = await post_alerts(client, payload(stuck("gpu0")))
            assert answer["decisions"][0]["reason"] == "paused"
            await asyncio.sleep(0.3)
            assert marker_lines(marker) == []  # still paused: held, not judged again
            resume = argparse.Namespace(
                control_config=path,
                config=None,
                restarter_command="resume",
                control="resumed",
                pause_for=None,
                reason="",
            )
            assert run_control(resume) == 0
            await wait_for(lambda: restarter.journal.count(reason="confirmed") == 1)
            await settle(restarter)
    assert marker_lines(marker) == ["gpu0"]


async def test_an_alert_held_by_a_pause_is_judged_again_when_the_pause_runs_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pause `for` a while ends on its own; the stall refused during it is then restarted,
    and a stall resolved during it is not."""
    monkeypatch.setattr(waiting, "RELEASE_CHECK_SECONDS", 0.05)
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, targets(fake.url, marker, 2))
        async with running_restarter(config) as (client, restarter):
            paused = await client.post("/-/pause", params={"for": "3s"}, headers=AUTH)
            assert paused.status == 200
            for name in ("gpu0", "gpu1"):
                answer = await post_alerts(client, payload(stuck(name)))
                assert answer["decisions"][0]["reason"] == "paused"
            await post_alerts(client, payload(stuck("gpu1", "resolved")))
            await wait_for(lambda: restarter.journal.count(reason="confirmed") == 1)
            await settle(restarter)
            assert len(restarter.memory.waiting) == 0
    assert marker_lines(marker) == ["gpu0"]


async def wait_for(condition: Callable[[], bool], seconds: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_three_failed_actions_in_a_row_open_the_breaker(tmp_path: Path) -> None:
    """Three failed actions, on three targets, open the breaker: the fourth stall is refused."""
    async with fake_vllm("stalled") as fake:
        failing = {"kind": "command", "argv": [sys.executable, "-c", "raise SystemExit(1)"]}
        entries = [target_entry(f"gpu{i}", fake.url, failing) for i in range(8)]
        config = write_config(tmp_path, entries, fleet_window={"max_targets": 8}, max_in_flight=8)
        async with running_restarter(config) as (client, restarter):
            for i in range(3):
                answer = await post_alerts(client, payload(stuck(f"gpu{i}")))
                assert answer["decisions"][0]["reason"] == "confirmed"
                await settle(restarter)
            answer = await post_alerts(client, payload(stuck("gpu3")))
            assert answer["decisions"][0]["reason"] == "breaker_open"


def test_failed_actions_count_from_the_last_success_and_the_last_resume(tmp_path: Path) -> None:
    """Failures in a row stop at a success and at a resume; interrupted actions and evictions a
    PodDisruptionBudget refused do not count."""
    journal = Journal.open(tmp_path / "j.sqlite")

    def restart_then(result: str, at: float) -> None:
        row = journal.record_decision(
            Alert("firing", {"alertname": "LLMServerStuck", "target": "a"}, "f", f"s{at}"),
            Decision("restart", "confirmed", ""),
            at,
        )
        journal.record_action_result(row, result, "", 1.0, at + 1)

    restart_then("failure", 1)
    restart_then("success", 10)
    restart_then("failure", 20)
    restart_then("interrupted", 30)
    restart_then("pdb_blocked", 35)
    restart_then("timeout", 40)
    restart_then("pdb_blocked", 45)
    assert journal.failed_actions_in_a_row(10) == 2
    journal.record_control("resumed", "", 50)
    assert journal.failed_actions_in_a_row(10) == 0
    journal.close()


async def test_cooldown_auto_measures_the_load_time_after_a_restart(tmp_path: Path) -> None:
    """After a restart of a `cooldown: auto` target, the restarter reads it until it serves
    engine metrics and journals and exports that load time."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, targets(fake.url, marker, 1, cooldown="auto"))
        async with running_restarter(config) as (client, restarter):
            answer = await post_alerts(client, payload(stuck("gpu0")))
            assert answer["decisions"][0]["reason"] == "confirmed"
            await settle(restarter)
            assert restarter.journal.count(decision="load_measured", target="gpu0") == 1
            assert set(restarter.journal.load_times()) == {"gpu0"}
            text = await (await client.get("/metrics")).text()
            assert 'stallwatch_restarter_model_load_seconds{target="gpu0"}' in text


async def test_a_late_resolved_notice_of_an_earlier_episode_keeps_the_stall_counted(
    tmp_path: Path,
) -> None:
    """A resolved notice about an earlier episode of an alert (older startsAt) does not end the
    stall of the current one, so a mass stall cannot slip past the cap through it."""
    async with fake_vllm("stalled") as fake:
        config = write_config(
            tmp_path, [target_entry("gpu1", fake.url, {"kind": "command", "argv": ["true"]})]
        )
        async with running_restarter(config) as (client, restarter):
            current = alert(starts_at="2026-11-30T06:00:00.5Z")
            await post_alerts(client, payload(current))
            assert restarter.fleet.stalled(restarter.clock()) == {"gpu1"}
            earlier = alert(status="resolved", starts_at="2026-11-30T05:29:50.914142978Z")
            await post_alerts(client, payload(earlier))
            assert restarter.fleet.stalled(restarter.clock()) == {"gpu1"}
            ended = alert(status="resolved", starts_at="2026-11-30T06:00:00.5Z")
            await post_alerts(client, payload(ended))
            assert restarter.fleet.stalled(restarter.clock()) == frozenset()
