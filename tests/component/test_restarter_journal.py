"""The journal: limits that survive a restart of the restarter, fleet limits, and the CLI."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from stallwatch.cli import main
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


def episode(number: int) -> str:
    """A distinct startsAt: a new episode of the alert (not a duplicate)."""
    return f"2026-11-30T0{number}:00:00Z"


def marker_target(name: str, url: str, marker: Path, **extra: Any) -> dict[str, Any]:
    return target_entry(name, url, {"kind": "command", "argv": marker_argv(marker)}, **extra)


async def test_cooldown_and_duplicates_survive_a_restart_of_the_restarter(tmp_path: Path) -> None:
    """A new restarter on the same journal still sees the cooldown and the acted-on alert."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [marker_target("gpu1", fake.url, marker)])
        async with running_restarter(config) as (client, restarter):
            await post_alerts(client, payload(alert(starts_at=episode(1))))
            await settle(restarter)
        async with running_restarter(config) as (client, _):
            same = await post_alerts(client, payload(alert(starts_at=episode(1))))
            new = await post_alerts(client, payload(alert(starts_at=episode(2))))
    assert same["decisions"][0]["reason"] == "duplicate"
    assert new["decisions"][0]["reason"] == "cooldown"
    assert marker_lines(marker) == ["gpu1"]


async def test_budget_survives_a_restart_of_the_restarter(tmp_path: Path) -> None:
    """Restarts spent before a restart of the restarter still count against the budget."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(
            tmp_path,
            [
                marker_target(
                    "gpu1",
                    fake.url,
                    marker,
                    cooldown="0s",
                    budget={"max_restarts": 2, "window": "1h"},
                )
            ],
        )
        async with running_restarter(config) as (client, restarter):
            for number in (1, 2):
                answer = await post_alerts(client, payload(alert(starts_at=episode(number))))
                assert answer["decisions"][0]["reason"] == "confirmed"
                await settle(restarter)
        async with running_restarter(config) as (client, _):
            before = await (await client.get("/metrics")).text()
            third = await post_alerts(client, payload(alert(starts_at=episode(3))))
    assert third["decisions"][0]["reason"] == "budget_exhausted"
    assert 'stallwatch_restarter_budget_exhausted{target="gpu1"} 1.0' in before
    assert 'stallwatch_restarter_last_restart_timestamp_seconds{target="gpu1"}' in before
    assert marker_lines(marker) == ["gpu1", "gpu1"]


async def test_fleet_in_flight_limit(tmp_path: Path) -> None:
    """While one target's restart runs, another target's stall is not acted on."""
    release = tmp_path / "release"
    slow = [
        sys.executable,
        "-c",
        "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.02)\n",
        str(release),
    ]
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(
            tmp_path,
            [
                target_entry("gpu1", fake.url, {"kind": "command", "argv": slow}),
                marker_target("gpu2", fake.url, marker),
            ],
        )
        async with running_restarter(config) as (client, restarter):
            first = await post_alerts(client, payload(alert("gpu1", fingerprint="a")))
            second = await post_alerts(client, payload(alert("gpu2", fingerprint="b")))
            release.write_text("go")
            await settle(restarter)
            metrics = await (await client.get("/metrics")).text()
    assert first["decisions"][0]["reason"] == "confirmed"
    assert second["decisions"][0]["reason"] == "fleet_in_flight"
    assert 'stallwatch_restarter_skips_total{reason="fleet_in_flight",target="gpu2"} 1.0' in metrics
    assert not marker.exists()


async def test_fleet_window_limit(tmp_path: Path) -> None:
    """After max_targets distinct targets restarted within the window, the next one is paged."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(
            tmp_path,
            [marker_target(f"gpu{n}", fake.url, marker) for n in (1, 2, 3)],
            fleet_window={"max_targets": 2, "window": "15m"},
            max_in_flight=3,
            # Three of three stalled unresolved is a mass stall; this test is about the window.
            mass_stall={"max_percent": 100},
        )
        async with running_restarter(config) as (client, restarter):
            reasons = []
            for name in ("gpu1", "gpu2", "gpu3"):
                answer = await post_alerts(client, payload(alert(name, fingerprint=name)))
                reasons.append(answer["decisions"][0]["reason"])
                await settle(restarter)
    assert reasons == ["confirmed", "confirmed", "fleet_window"]
    assert marker_lines(marker) == ["gpu1", "gpu2"]


async def test_journal_command_prints_recent_decisions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`stallwatch restarter journal` reads the SQLite file and prints a readable table."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [marker_target("gpu1", fake.url, marker)])
        async with running_restarter(config) as (client, restarter):
            await post_alerts(client, payload(alert()))
            await settle(restarter)
            await post_alerts(client, payload(alert("gpu9", fingerprint="x")))
    config_file = str(tmp_path / "restarter.yml")
    assert main(["restarter", "journal", "--config", config_file, "--limit", "10"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["time", "(UTC)", "target", "alert", "decision", "reason", "detail"]
    decisions = [line.split()[4:6] for line in lines[1:]]
    assert decisions == [
        ["skip", "unknown_target"],
        ["action_result", "success"],
        ["restart", "confirmed"],
    ]
    assert main(["restarter", "journal", "--config", config_file, "--limit", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_config_check_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--config.check` exits 0 for a valid file and 1, naming the field, for a bad one."""
    write_config(tmp_path, [marker_target("gpu1", "http://127.0.0.1:1/metrics", tmp_path / "m")])
    config_file = str(tmp_path / "restarter.yml")
    assert main(["restarter", "--config", config_file, "--config.check"]) == 0
    assert "valid, 1 targets" in capsys.readouterr().out
    (tmp_path / "restarter.yml").write_text(
        (tmp_path / "restarter.yml").read_text().replace("name: gpu1", "name: gpu1\n  colour: red")
    )
    assert main(["restarter", "--config", config_file, "--config.check"]) == 1
    assert "restarter.yml: targets[0].colour: unknown key" in capsys.readouterr().err
