"""The restarter's webhook: answer latency, and a storm of duplicate notifications.

The real restarter app (`restarter.app.build_app`) with its SQLite journal on disk and an
`http` restart action pointed at a counting server; only the confirmation (two reads of the
model server) is replaced by one that always confirms, so every alert reaches the journal and
the policy's full path.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from benchmarks.common import Section, fmt_seconds, percentile
from stallwatch.common.restarter_config import HttpAction, RestarterConfig, Target
from stallwatch.core.confirmation import Confirmation
from stallwatch.restarter.app import RESTARTER_KEY, build_app

TOKEN = "benchmark-token"
TARGET = "gpu-a"
GROUP_KEY = (
    '{}/{alertname=~"LLMServerStuck|LLMServerUnresponsive"}:'
    '{alertname="LLMServerStuck", target="gpu-a"}'
)


async def always_confirmed(
    session: aiohttp.ClientSession, metrics_url: str, *, gap_seconds: float, timeout: float
) -> Confirmation:
    return Confirmation(True, None, "stalled (benchmark confirmer)")


def notification(fingerprint: str, starts_at: str) -> bytes:
    alert = {
        "status": "firing",
        "labels": {"alertname": "LLMServerStuck", "target": TARGET, "severity": "critical"},
        "annotations": {"summary": f"{TARGET} is stuck"},
        "startsAt": starts_at,
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus:9090/graph",
        "fingerprint": fingerprint,
    }
    document: dict[str, Any] = {
        "version": "4",
        "groupKey": GROUP_KEY,
        "status": "firing",
        "receiver": "stallwatch-restarter",
        "groupLabels": {"alertname": "LLMServerStuck", "target": TARGET},
        "commonLabels": alert["labels"],
        "commonAnnotations": alert["annotations"],
        "externalURL": "http://alertmanager:9093",
        "alerts": [alert],
    }
    return json.dumps(document).encode()


class Stack:
    """A counting restart endpoint and the real restarter app, both on loopback."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.restarts = 0
        self.runners: list[web.AppRunner] = []
        self.url = ""
        self.app: web.Application | None = None

    async def _serve(self, app: web.Application) -> str:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.runners.append(runner)
        server = site._server
        assert isinstance(server, asyncio.base_events.Server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        async def restart(_: web.Request) -> web.Response:
            self.restarts += 1
            return web.Response(text="restarted\n")

        action_app = web.Application()
        action_app.router.add_post("/restart", restart)
        action_url = await self._serve(action_app)
        config = RestarterConfig(
            targets=(
                Target(
                    name=TARGET,
                    metrics_url="http://127.0.0.1:9/metrics",
                    action=HttpAction(url=action_url + "/restart"),
                    # The first confirmation acts: what is measured is the webhook, not the wait.
                    restart_after=0.0,
                ),
            ),
            journal=str(self.workdir / "journal.sqlite"),
            token=TOKEN,
        )
        self.app = build_app(config, confirmer=always_confirmed)
        self.url = await self._serve(self.app) + "/alerts"

    async def wait_for_actions(self) -> None:
        assert self.app is not None
        await self.app[RESTARTER_KEY].wait_for_actions()

    async def stop(self) -> None:
        for runner in reversed(self.runners):
            await runner.cleanup()


async def _post(session: aiohttp.ClientSession, url: str, body: bytes) -> int:
    async with session.post(
        url,
        data=body,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    ) as response:
        await response.read()
        return response.status


async def latency(count: int) -> tuple[list[float], int]:
    """Seconds per webhook answer, one at a time, each a new alert episode for the target."""
    with tempfile.TemporaryDirectory(prefix="stallwatch-bench-") as tmp:
        stack = Stack(Path(tmp))
        await stack.start()
        try:
            async with aiohttp.ClientSession() as session:
                timings: list[float] = []
                for index in range(count + 20):
                    body = notification(
                        f"{index:016x}", f"2026-01-01T00:{index // 60 % 60:02d}:{index % 60:02d}Z"
                    )
                    started = time.perf_counter()
                    status = await _post(session, stack.url, body)
                    elapsed = time.perf_counter() - started
                    if status != 200:
                        raise RuntimeError(f"the webhook answered {status}")
                    if index >= 20:  # the first ones warm up connections and the journal
                        timings.append(elapsed)
            await stack.wait_for_actions()
            return timings, stack.restarts
        finally:
            await stack.stop()


async def storm(count: int, concurrency: int = 50) -> tuple[float, int, dict[int, int]]:
    """`count` copies of one notification, `concurrency` at a time: seconds, restarts, statuses."""
    with tempfile.TemporaryDirectory(prefix="stallwatch-bench-") as tmp:
        stack = Stack(Path(tmp))
        await stack.start()
        try:
            body = notification("c0ffee0000000001", "2026-01-01T00:00:00Z")
            statuses: dict[int, int] = {}
            remaining = iter(range(count))
            connector = aiohttp.TCPConnector(limit=concurrency)
            async with aiohttp.ClientSession(connector=connector) as session:

                async def sender() -> None:
                    for _ in remaining:
                        status = await _post(session, stack.url, body)
                        statuses[status] = statuses.get(status, 0) + 1

                started = time.perf_counter()
                await asyncio.gather(*(sender() for _ in range(concurrency)))
                elapsed = time.perf_counter() - started
            await stack.wait_for_actions()
            return elapsed, stack.restarts, statuses
        finally:
            await stack.stop()


def run(quick: bool) -> Section:
    latency_count = 100 if quick else 2000
    storm_count = 1000 if quick else 10_000
    timings, _ = asyncio.run(latency(latency_count))
    elapsed, restarts, statuses = asyncio.run(storm(storm_count))
    p50, p99 = percentile(timings, 0.50), percentile(timings, 0.99)
    answered = ", ".join(f"{count:,} x {status}" for status, count in sorted(statuses.items()))
    rows = [
        [
            "webhook answer, p50",
            fmt_seconds(p50),
            f"{latency_count:,} notifications, one at a time",
        ],
        ["webhook answer, p99", fmt_seconds(p99), "decision journaled to SQLite before the answer"],
        [
            f"storm of {storm_count:,} duplicate notifications",
            f"{fmt_seconds(elapsed)} to absorb ({storm_count / elapsed:,.0f}/s)",
            f"{restarts} restart; answers: {answered}",
        ],
    ]
    return Section(
        title="Restarter: webhook latency and a duplicate storm",
        command="python -m benchmarks --only restarter",
        headers=["what", "measured", "notes"],
        rows=rows,
        method=[
            "The real restarter app with bearer auth, its SQLite journal on disk and an `http` "
            "restart action pointed at a counting server on loopback. The confirmation (two "
            "reads of the model server) is replaced by one that always confirms, so every "
            "notification goes through the full policy; the latency excludes the confirmation "
            "reads, which take `confirm.gap` (5 s) by design.",
            "Latency: each notification is a new alert episode for the same target (the first "
            "restarts, the rest are journaled cooldown skips), sent one at a time; the first 20 "
            "are a warm-up.",
            f"Storm: one notification (same fingerprint and startsAt) sent {storm_count:,} times "
            "over 50 concurrent connections, as Alertmanager retries and HA peers would; the "
            "count of restart actions that reached the counting server is reported.",
        ],
        figures={
            "latency_p50_seconds": p50,
            "latency_p99_seconds": p99,
            "storm_count": storm_count,
            "storm_seconds": elapsed,
            "storm_restarts": restarts,
            "storm_statuses": statuses,
        },
    )
