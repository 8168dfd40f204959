"""Run the real exporter in-process against real servers on loopback, and read what it says."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from stallwatch.common.exporter_config import ExporterConfig, IdleTestRequestConfig, TargetConfig
from stallwatch.core.classify import State
from stallwatch.core.history import PollOutcome, TargetHistory
from stallwatch.exporter.app import running_exporter
from stallwatch.exporter.service import ExporterService

FAST_INTERVAL = 0.25


def target(name: str, url: str, **fields: object) -> TargetConfig:
    defaults: dict[str, object] = {
        "interval_seconds": FAST_INTERVAL,
        "timeout_seconds": FAST_INTERVAL,
        "test_request": IdleTestRequestConfig(timeout_seconds=0.5),
    }
    defaults.update(fields)
    return TargetConfig(name=name, url=url, **defaults)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def exporter_for(
    *targets: TargetConfig, config_path: Path | None = None
) -> AsyncIterator[tuple[ExporterService, str]]:
    config = ExporterConfig(targets=targets, listen_host="127.0.0.1", listen_port=0)
    async with running_exporter(config, config_path or Path("unused.yml"), port=0) as running:
        yield running


async def wait_until(
    condition: Callable[[], bool], *, timeout: float = 10.0, what: str = "condition"
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def history(service: ExporterService, name: str) -> TargetHistory:
    return service.histories.get(name, TargetHistory())


async def wait_for_state(
    service: ExporterService, name: str, state: State, *, polls: int = 1, timeout: float = 10.0
) -> TargetHistory:
    def reached() -> bool:
        h = history(service, name)
        return h.state == state and h.state_polls >= polls

    await wait_until(reached, timeout=timeout, what=f"{name} {state} x{polls}")
    return history(service, name)


async def record_states(
    service: ExporterService, name: str, seconds: float
) -> list[tuple[State | None, int]]:
    """Every (state, poll number) the target goes through during `seconds`, none missed."""
    seen: list[tuple[State | None, int]] = []

    def on_poll(target: str, updated: TargetHistory, _: PollOutcome) -> None:
        if target == name:
            seen.append((updated.state, updated.polls))

    unsubscribe = service.subscribe(on_poll)
    try:
        await asyncio.sleep(seconds)
    finally:
        unsubscribe()
    return seen


async def record_histories(
    service: ExporterService,
    name: str,
    *,
    until: Callable[[TargetHistory], bool],
    timeout: float,
) -> list[TargetHistory]:
    """The target's history after each of its polls, none missed, until `until` holds."""
    current = history(service, name)
    seen = [current] if current.polls else []
    done = asyncio.Event()
    if until(current):
        done.set()

    def on_poll(target: str, updated: TargetHistory, _: PollOutcome) -> None:
        if target == name and not done.is_set():
            seen.append(updated)
            if until(updated):
                done.set()

    unsubscribe = service.subscribe(on_poll)
    try:
        await asyncio.wait_for(done.wait(), timeout)
    except TimeoutError:
        states = [(h.state, h.verdict.reason if h.verdict else "") for h in seen]
        raise AssertionError(f"timed out after {timeout} s; {name} went through {states}") from None
    finally:
        unsubscribe()
    return seen


async def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The exporter's /metrics as {(sample name, sorted labels): value}."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as response:
        assert response.status == 200
        text = await response.text()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


@contextlib.asynccontextmanager
async def big_metrics_server(
    body: bytes, seen: list[dict[str, str]] | None = None
) -> AsyncIterator[str]:
    """aiohttp serving `body` at /metrics; yields its base URL. Each request's headers (names in
    lower case) are appended to `seen` when given."""

    async def metrics(request: web.Request) -> web.Response:
        if seen is not None:
            seen.append({name.lower(): value for name, value in request.headers.items()})
        return web.Response(body=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
