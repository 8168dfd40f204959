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

# How often `target()` polls: many polls in a few seconds, so that windows, min_intervals and
# the spacing of polls are measured in seconds of test time.
FAST_INTERVAL = 0.25
# The bound of each read, and of each test request, that `target()` gives: for the tests that
# judge something else than a timeout. A loopback read takes a few milliseconds, but on a loaded
# machine (CI: the tier's xdist workers beside engine builds and a compose stack, 2 cores) the
# event loop of the test process, which runs the exporter and the servers it reads, may not get
# the CPU for more than FAST_INTERVAL: a 0.25 s bound then read a healthy server `hung`
# ("connected, no answer"), or `down` (a connection not made within half of it), and a test
# about counters failed. A test that judges a timeout (hung server, cut reads, a test request
# that times out) passes its own tight bound, stated in the test.
#
# READ_TIMEOUT is longer than FAST_INTERVAL, which a config file cannot say (the loader wants
# timeout <= interval; `stallwatch check` takes the smaller of the two). The exporter does not
# lean on that rule: a read that ends within FAST_INTERVAL (every read on a quiet machine) is
# judged as under a 0.25 s bound, and a slower one is judged on its answer instead of timed
# out, its poll outlasting the interval as a valid config's poll can (a poll is several reads
# and a test request, whose timeout no interval bounds): the poll loop skips the missed ticks
# and keeps its phase (`ExporterService._run_target`); `stallwatch check` sleeps the interval
# after each poll whatever it took.
READ_TIMEOUT = 2.0
TEST_REQUEST_TIMEOUT = 2.0


def target(name: str, url: str, **fields: object) -> TargetConfig:
    """A target polled every FAST_INTERVAL, each read and test request bounded by READ_TIMEOUT
    and TEST_REQUEST_TIMEOUT; `fields` override any of them."""
    defaults: dict[str, object] = {
        "interval_seconds": FAST_INTERVAL,
        "timeout_seconds": READ_TIMEOUT,
        "test_request": IdleTestRequestConfig(timeout_seconds=TEST_REQUEST_TIMEOUT),
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
