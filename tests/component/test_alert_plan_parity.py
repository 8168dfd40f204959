"""The same alerts through the running restarter and through the replays' virtual-time driver give
the same decisions and the same routing changes: the replays' figures are the restarter's."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from stallwatch.common.restarter_config import RestarterConfig, Target
from stallwatch.core.alerts import Alert, Notification, parse_notification
from stallwatch.core.confirmation import (
    Confirmation,
    FailedRead,
    ReadAttempt,
    judge_attempts,
    worth_a_second_read,
)
from stallwatch.core.policy import History
from stallwatch.core.reading import parse_reading
from stallwatch.replay.clock import Scheduler
from stallwatch.replay.restarter import VirtualRestarter
from stallwatch.restarter.service import Restarter
from tests.support.restarter import METRICS_TEMPLATE, alert, marker_argv, payload, write_config

START = 1_800_000_000.0
# After the script: gpu1's window (confirmed at 51 s) ends at 151 s, gpu0's second (81 s) at 181 s.
DUE_TIMES = (152.0, 182.0)
EARLY = "2026-11-30T05:29:50Z"
LATER = "2026-11-30T05:40:50Z"


class ScriptedServer:
    """A vLLM-like server whose counters move only when the script says (`tick`)."""

    def __init__(self) -> None:
        self.steps = 690.0
        self.restarts = 0

    def tick(self) -> None:
        self.steps += 7

    def text(self) -> str:
        return METRICS_TEMPLATE.format(running="4.0", generated=2000 + self.steps, steps=self.steps)

    def attempt(self, now: float) -> ReadAttempt:
        return parse_reading(self.text(), taken_at=now)


@contextlib.asynccontextmanager
async def serving(server: ScriptedServer) -> AsyncIterator[str]:
    """`server`'s /metrics on a loopback port; its URL."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=server.text(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    test_server = TestServer(app, host="127.0.0.1")
    await test_server.start_server()
    try:
        yield str(test_server.make_url("/metrics"))
    finally:
        await test_server.close()


class ScriptedWorld:
    """The replay driver's world over the same scripted servers."""

    def __init__(self, servers: dict[str, ScriptedServer]) -> None:
        self.servers = servers

    def restarter_history(self, now: float) -> History:
        return History()

    def confirm_first(self, target: Target, now: float) -> object:
        return self.servers[target.name].attempt(now)

    def confirm(self, target: Target, first: object, now: float) -> Confirmation:
        assert not isinstance(first, FailedRead | None)
        assert worth_a_second_read(first)  # type: ignore[arg-type]
        return judge_attempts(first, self.servers[target.name].attempt(now))  # type: ignore[arg-type]

    def fresh_read(self, target: Target, now: float) -> ReadAttempt | None:
        return self.servers[target.name].attempt(now)

    def test_request(self, target: Target, now: float) -> tuple[bool, str]:
        return False, "no answer"

    def restart(self, target: Target, now: float) -> None:
        self.servers[target.name].restarts += 1


def deliveries() -> list[tuple[float, str, dict[str, Any]]]:
    """The script: (time, what happens first, the alert delivered then)."""
    return [
        (0.0, "", alert("gpu0", fingerprint="f0", starts_at=EARLY)),
        (50.0, "", alert("gpu1", fingerprint="f1", starts_at=EARLY)),
        (70.0, "gpu0 moves", alert("gpu0", fingerprint="f0", starts_at=EARLY, status="resolved")),
        (80.0, "", alert("gpu0", fingerprint="f0", starts_at=LATER)),
    ]


def configured(tmp_path: Path, urls: dict[str, str]) -> RestarterConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    marker = tmp_path / "marker"
    targets = [
        {
            "name": name,
            "metrics_url": url,
            "action": {"kind": "command", "argv": marker_argv(marker)},
        }
        for name, url in urls.items()
    ]
    return write_config(
        tmp_path,
        targets,
        restart_after="100s",
        quarantine={"check_interval": "1h", "expire_after": "2h", "test_request": False},
    )


class ManualClock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


async def through_the_restarter(tmp_path: Path) -> tuple[list[tuple[str, str, str]], list[Any]]:
    servers = {"gpu0": ScriptedServer(), "gpu1": ScriptedServer()}
    async with serving(servers["gpu0"]) as url0, serving(servers["gpu1"]) as url1:
        config = configured(tmp_path, {"gpu0": url0, "gpu1": url1})
        clock = ManualClock()
        restarter = Restarter(config, clock=clock)
        await restarter.start()
        try:
            for at, event, body in deliveries():
                clock.now = START + at
                if event == "gpu0 moves":
                    servers["gpu0"].tick()
                await restarter.handle(parse_notification(json.dumps(payload(body)).encode()))
                await restarter.settled()
            for due in DUE_TIMES:  # the restart windows' ends: the waiting alerts are judged again
                clock.now = START + due
                await restarter.release_held()
                await restarter.wait_for_actions()
            rows = [
                (e.target, e.decision, e.reason)
                for e in reversed(restarter.journal.recent(100))
                if e.decision in ("restart", "skip")
            ]
            routing = [
                (e.target, e.reason, e.result)
                for e in reversed(restarter.journal.recent(100))
                if e.decision == "routing"
            ]
        finally:
            await restarter.stop()
    return rows, routing


def through_the_replay(tmp_path: Path, config: RestarterConfig) -> tuple[list[Any], list[Any]]:
    servers = {"gpu0": ScriptedServer(), "gpu1": ScriptedServer()}
    scheduler = Scheduler()
    virtual = VirtualRestarter(
        config, scheduler, ScriptedWorld(servers), confirm_gap=config.confirm.gap, action_seconds=2
    )

    def run_until(when: float) -> None:
        while scheduler.next_time() <= when:
            at, action = scheduler.pop()
            action(at)

    for at, event, body in deliveries():
        run_until(at)
        if event == "gpu0 moves":
            servers["gpu0"].tick()
        notification: Notification = parse_notification(json.dumps(payload(body)).encode())
        for delivered in notification.alerts:
            deliver(virtual, delivered, at)
    run_until(DUE_TIMES[-1])
    rows = [(e.target, e.action, e.reason) for e in virtual.journal]
    routing = [(c.target, c.move, c.reason) for _, c in virtual.routing]
    return rows, routing


def deliver(virtual: VirtualRestarter, delivered: Alert, at: float) -> None:
    if delivered.status == "resolved":
        virtual.resolve(delivered, at)
    else:
        virtual.receive(delivered, at)


async def test_the_restarter_and_the_replay_decide_alike(tmp_path: Path) -> None:
    """One script of deliveries: both drivers journal the same decisions and routing changes."""
    real_rows, real_routing = await through_the_restarter(tmp_path / "real")
    config = configured(
        tmp_path / "virtual", {"gpu0": "http://a/metrics", "gpu1": "http://b/metrics"}
    )
    virtual_rows, virtual_routing = through_the_replay(tmp_path, config)
    assert real_rows == virtual_rows
    assert real_routing == virtual_routing
    assert [(target, reason) for target, _, reason in real_rows] == [
        ("gpu0", "restart_window"),  # confirmed: its window opens and it leaves rotation
        ("gpu1", "restart_window"),  # confirmed: its window opens; the guard keeps it in
        ("gpu0", "recovered_in_window"),  # resolved, and a settling read saw it move: back in
        ("gpu0", "restart_window"),  # stalled again: a new window, out of rotation again
        ("gpu1", "confirmed"),  # its window ended with nothing moved: restarted
        ("gpu0", "confirmed"),  # the same at its second window's end
    ]
