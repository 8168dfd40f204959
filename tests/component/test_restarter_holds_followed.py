"""The running restarter follows the holds in memory: the journal's hold rows are read once per
notification (only those written since the last look), and a hold or an unhold written by the
command line, from another process's connection, is still seen."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

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


async def restarted(marker: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if marker_lines(marker) or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.1)


def command_target(url: str, marker: Path) -> dict[str, Any]:
    return target_entry("gpu1", url, {"kind": "command", "argv": marker_argv(marker)})


async def test_one_notification_reads_the_hold_rows_once(tmp_path: Path) -> None:
    """Twenty alerts in one notification are judged on one read of the hold rows, not twenty."""
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target(fake.url, tmp_path / "marker")])
        async with running_restarter(config) as (client, restarter):
            statements: list[str] = []
            restarter.journal._db.set_trace_callback(statements.append)
            alerts = [
                alert(f"gpu{n}", fingerprint=f"{n:016x}") for n in range(2, 22)
            ]  # not configured: each is judged at once, none confirmed
            answer = await post_alerts(client, payload(*alerts))
            restarter.journal._db.set_trace_callback(None)
    assert [d["reason"] for d in answer["decisions"]] == ["unknown_target"] * 20
    hold_reads = [s for s in statements if "decision = 'hold'" in s and s.startswith("SELECT")]
    assert len(hold_reads) == 1, hold_reads


async def test_a_hold_from_the_command_line_holds_the_next_alert(tmp_path: Path) -> None:
    """`stallwatch restarter hold` writes through its own connection; the running restarter's
    next notification sees it and journals the alert on_hold, restarting nothing."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target(fake.url, marker)])
        async with running_restarter(config) as (client, _):
            config_file = str(tmp_path / "restarter.yml")
            assert main(["restarter", "hold", "gpu1", "--for", "1h", "--config", config_file]) == 0
            answer = await post_alerts(client, payload(alert()))
    assert answer["decisions"][0]["reason"] == "on_hold"
    assert marker_lines(marker) == []


async def test_an_unhold_from_the_command_line_frees_the_held_alert(tmp_path: Path) -> None:
    """An alert held on a hold is judged again, and restarted, once `stallwatch restarter
    unhold` ends the hold from another process: the release checks follow the journal."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target(fake.url, marker)])
        async with running_restarter(config) as (client, restarter):
            config_file = str(tmp_path / "restarter.yml")
            assert main(["restarter", "hold", "gpu1", "--for", "1h", "--config", config_file]) == 0
            answer = await post_alerts(client, payload(alert()))
            assert answer["decisions"][0]["reason"] == "on_hold"
            assert main(["restarter", "unhold", "gpu1", "--config", config_file]) == 0
            await restarted(marker)
            await settle(restarter)
    assert marker_lines(marker) == ["gpu1"]
