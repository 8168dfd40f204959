"""Thousands of held alerts: `POST /-/resume` judges them all inside the request, promptly, and
the fleet's count of stalled targets (read for every alert judged) stays right.

Before, every alert judged counted the stalled targets again over every firing alert and every
configured target: 6 000 held alerts on 50 targets took 130 s to resume on a loaded 2-core machine.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from stallwatch.restarter.app import RESTARTER_KEY, build_app
from tests.support.restarter import (
    AUTH,
    alert,
    marker_argv,
    payload,
    post_alerts,
    running_restarter,
    target_entry,
    write_config,
)

TARGETS = 50


def targets(tmp_path: Path, count: int = TARGETS) -> list[dict[str, Any]]:
    # Nothing listens on port 9: each confirmation is refused at once (not_confirmed_down).
    action = {"kind": "command", "argv": marker_argv(tmp_path / "marker")}
    return [target_entry(f"gpu{i}", "http://127.0.0.1:9/metrics", action) for i in range(count)]


async def test_resuming_thousands_of_held_alerts_answers_promptly(tmp_path: Path) -> None:
    """3 000 alerts held by a pause over 50 targets are all judged again by one resume, inside
    the request (its speed is measured by the restarter benchmark, not asserted here)."""
    config = write_config(
        tmp_path, targets(tmp_path), mass_stall={"max_percent": 100, "min_stalled": 1000}
    )
    alerts = [alert(f"gpu{i % TARGETS}", fingerprint=f"{i:016x}") for i in range(3000)]
    async with running_restarter(config) as (client, restarter):
        assert (await client.post("/-/pause", headers=AUTH)).status == 200
        for start in range(0, len(alerts), 1000):
            await post_alerts(client, payload(*alerts[start : start + 1000]))
        assert len(restarter.memory.waiting) == 3000
        resumed = await client.post("/-/resume", headers=AUTH)
        answer = await resumed.json()
        assert len(restarter.memory.waiting) == 0
    assert answer["judged_again"] == 3000


class Clock:
    def __init__(self) -> None:
        self.now = 1_796_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_the_stalled_targets_follow_the_window_new_alerts_and_a_reload(
    tmp_path: Path,
) -> None:
    """The stalled targets, kept between alerts, still change when an alert grows older than
    mass_stall.window, when a notification brings or resolves one, and when the config does."""
    config = write_config(tmp_path, targets(tmp_path, 3), mass_stall={"window": "10m"})
    clock = Clock()
    client: TestClient[Any, Any] = TestClient(
        TestServer(build_app(config, clock=clock), host="127.0.0.1")
    )
    await client.start_server()
    try:
        restarter = client.app[RESTARTER_KEY]
        fleet = restarter.fleet
        assert (await client.post("/-/pause", headers=AUTH)).status == 200
        start = clock.now
        await post_alerts(client, payload(alert("gpu0", fingerprint="a0")))
        assert fleet.stalled(clock.now) == {"gpu0"}
        clock.now = start + 300
        await post_alerts(client, payload(alert("gpu1", fingerprint="a1")))
        assert fleet.stalled(clock.now) == {"gpu0", "gpu1"}
        assert fleet.stalled(start + 599) == {"gpu0", "gpu1"}
        assert fleet.stalled(start + 600) == {"gpu1"}  # gpu0's alert left the window
        clock.now = start + 601
        await post_alerts(client, payload(alert("gpu1", fingerprint="a1", status="resolved")))
        assert fleet.stalled(clock.now) == frozenset()
        await post_alerts(client, payload(alert("gpu2", fingerprint="a2")))
        assert fleet.stalled(clock.now) == {"gpu2"}
        restarter.apply(dataclasses.replace(restarter.config, targets=restarter.config.targets[:2]))
        assert fleet.stalled(clock.now) == frozenset()  # gpu2 is no target any more
    finally:
        await client.close()
