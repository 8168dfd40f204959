"""A restart window survives a restart of the restarter: the new one goes on with the silence."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from stallwatch.common.restarter_config import RestarterConfig
from stallwatch.core.alerts import parse_notification
from stallwatch.restarter.service import Restarter
from tests.support.restarter import (
    alert,
    fake_vllm,
    marker_argv,
    marker_lines,
    payload,
    settle,
    write_config,
)

START = 1_800_000_000.0


class ManualClock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def config_for(tmp_path: Path, url: str, argv: list[str]) -> RestarterConfig:
    """One target, gpu1, with a 60 s restart window and the command action `argv`."""
    target = {"name": "gpu1", "metrics_url": url, "action": {"kind": "command", "argv": argv}}
    return write_config(tmp_path, [target], restart_after="60s")


async def first_delivery(
    config: RestarterConfig,
    clock: ManualClock,
    before: Callable[[Restarter], None] = lambda _: None,
) -> tuple[str, Restarter]:
    """A restarter started, `before` done to it, gpu1's alert delivered once, then stopped: the
    reason it decided, and the stopped restarter (its memory as it was)."""
    first = Restarter(config, clock=clock)
    await first.start()
    try:
        before(first)
        body = json.dumps(payload(alert("gpu1"))).encode()
        [decision] = await first.handle(parse_notification(body))
    finally:
        await first.stop()
    return str(decision["reason"]), first


async def test_a_window_read_back_from_the_journal_restarts_at_its_end(tmp_path: Path) -> None:
    """Stopped mid-window, a new restarter judges the alert again at the window's end by itself
    (no new delivery), takes one confirmation as its first look, and restarts on the next."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = config_for(tmp_path, fake.url, marker_argv(marker))
        clock = ManualClock()
        reason, _ = await first_delivery(config, clock)
        assert reason == "restart_window"
        clock.now = START + 30
        second = Restarter(config, clock=clock)
        await second.start()
        try:
            assert "gpu1" in second.memory.windows
            assert second.memory.windows["gpu1"].opened_at == START
            clock.now = START + 61
            assert await second.release_held() == 1  # read back: this look is its first
            assert marker_lines(marker) == []
            clock.now = START + 62
            assert await second.release_held() == 1  # nothing moved since: restarted
            await settle(second)
            reasons = [
                e.reason
                for e in reversed(second.journal.recent(20))
                if e.decision in ("skip", "restart")
            ]
        finally:
            await second.stop()
    assert marker_lines(marker) == ["gpu1"]
    assert reasons == ["restart_window", "restart_window", "confirmed"]


async def test_without_the_window_rows_a_new_restarter_starts_over(tmp_path: Path) -> None:
    """A journal with no open window (closed by a recovery) restores nothing."""
    async with fake_vllm("progress") as fake:
        config = config_for(tmp_path, fake.url, ["true"])
        clock = ManualClock()
        reason, _ = await first_delivery(config, clock)
        assert reason == "not_confirmed_progress"
        second = Restarter(config, clock=clock)
        try:
            assert second.memory.windows == {}
            assert second.memory.waiting == {}
        finally:
            second.journal.close()


async def test_an_alert_held_by_a_pause_is_not_read_back(tmp_path: Path) -> None:
    """Documented: alerts held by a pause or the breaker live in memory only; a restarted
    restarter waits for Alertmanager's next delivery of them (its window rows are all it reads)."""
    async with fake_vllm("stalled") as fake:
        config = config_for(tmp_path, fake.url, ["true"])
        clock = ManualClock()
        reason, first = await first_delivery(
            config, clock, before=lambda r: r.fleet.pause(None, "maintenance")
        )
        assert reason == "paused"
        assert len(first.memory.waiting) == 1
        second = Restarter(config, clock=clock)
        try:
            assert second.memory.waiting == {}
        finally:
            second.journal.close()
