"""The real exporter reads a real SGLang server right with the Rust HTTP frontend, and with an
idle scheduler that busy-polls a core.

- `SGLANG_RUST_SERVER=1`: the listener is in the scheduler process, so a frozen scheduler
  freezes `/metrics` too (TCP connects, no byte comes back): hung, twice in a row, and `check`
  says stuck. There is no `http_requests_*` family at all.
- The default Python frontend without `--sleep-on-idle`: the idle scheduler burns a core, which
  is no progress; the server reads idle.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from stallwatch.core.classify import State
from stallwatch.exporter.check_cli import EXIT_STUCK, run_check
from tests.real_sglang.scenario_support import (
    NAME,
    SLOTS,
    cancel,
    client,
    keep_generating,
    reasons,
    sglang_target,
    states,
    wait_for_decoding,
)
from tests.real_sglang.sglang_server import (
    RUST_FRONTEND,
    SLEEP_ON_IDLE,
    RealSglangServer,
    metrics_text,
    total,
)
from tests.support.exporter import exporter_for, history, record_histories

# Without an in-flight count, an idle test request's own passes are told from work by the idle
# loop's counter having moved since; it is flushed at most once a second, so the reads of the
# idle server are spaced a few flushes apart (a production interval is longer still).
IDLE_INTERVAL = 3.0
# The busy-polling scheduler takes a whole core when it can; a loaded 2-core machine still gives
# it a good part of one.
BUSY_POLL_SHARE = 0.2


@pytest.fixture(scope="module")
def rust_sglang(real_sglang_environment: Path) -> Iterator[RealSglangServer]:
    """A real SGLang server with the Rust HTTP frontend."""
    server = RealSglangServer(real_sglang_environment, SLEEP_ON_IDLE, RUST_FRONTEND)
    try:
        server.start()
        yield server
    finally:
        server.stop()


async def test_rust_frontend_idle_then_busy_without_an_http_family(
    rust_sglang: RealSglangServer,
) -> None:
    """With the Rust frontend (no `http_requests_*` family) an idle server reads idle, its own
    test requests included, and four generations read busy after the first poll, with no test
    request under load."""
    async with client() as session:
        text = await metrics_text(session, rust_sglang.base_url)
        assert "sglang:http_requests_" not in text
        idle_target = sglang_target(rust_sglang.base_url, interval=IDLE_INTERVAL)
        async with exporter_for(idle_target) as (service, _):
            idle = await record_histories(service, NAME, until=lambda h: h.polls >= 3, timeout=90)
        done = asyncio.Event()
        load = [
            asyncio.create_task(keep_generating(session, rust_sglang.base_url, done))
            for _ in range(SLOTS)
        ]
        try:
            await wait_for_decoding(session, rust_sglang.base_url)
            async with exporter_for(sglang_target(rust_sglang.base_url)) as (service, _):
                busy = await record_histories(
                    service, NAME, until=lambda h: h.polls >= 4, timeout=60
                )
        finally:
            done.set()
            await cancel(load)
    assert set(states(idle)) == {"idle"}, reasons(idle)
    assert set(states(busy[1:])) == {"busy"}, reasons(busy)
    assert busy[-1].test_requests == 0


async def test_rust_frontend_frozen_scheduler_reads_hung_and_check_says_stuck(
    rust_sglang: RealSglangServer,
) -> None:
    """SIGSTOP of the scheduler that also serves HTTP: /metrics connects and never answers;
    the exporter reads hung twice in a row, never busy or idle, and `check` exits stuck."""
    async with client() as session:
        done = asyncio.Event()
        load = [
            asyncio.create_task(keep_generating(session, rust_sglang.base_url, done))
            for _ in range(SLOTS)
        ]
        try:
            await wait_for_decoding(session, rust_sglang.base_url)
            async with exporter_for(sglang_target(rust_sglang.base_url)) as (service, _):
                await record_histories(service, NAME, until=lambda h: h.polls >= 2, timeout=60)
                rust_sglang.freeze_scheduler()
                try:
                    frozen = await record_histories(
                        service,
                        NAME,
                        until=lambda h: h.state == State.HUNG and h.state_polls >= 2,
                        timeout=120,
                    )
                    checked = await run_check(sglang_target(rust_sglang.base_url, "check"))
                finally:
                    rust_sglang.resume_scheduler()
                probes = history(service, NAME).test_requests
        finally:
            done.set()
            await cancel(load)
    after_freeze = [poll for poll in frozen if poll.polls > 3]
    assert not {"busy", "idle"} & set(states(after_freeze)), reasons(frozen)
    assert checked.exit_code == EXIT_STUCK, checked.as_json()
    assert probes == 0


async def test_idle_scheduler_burning_a_core_reads_idle(real_sglang_environment: Path) -> None:
    """Without `--sleep-on-idle` the idle scheduler's CPU counter climbs about a second per
    second; CPU is no progress: the server reads idle at every poll."""
    server = RealSglangServer(real_sglang_environment, extra_args=())
    try:
        server.start()
        async with client() as session:
            cpu = "sglang:scheduler_process_cpu_seconds_total"
            loop = asyncio.get_running_loop()
            started = loop.time()
            before = total(await metrics_text(session, server.base_url), cpu)
            async with exporter_for(sglang_target(server.base_url)) as (service, _):
                polls = await record_histories(
                    service, NAME, until=lambda h: h.polls >= 4, timeout=60
                )
            after = total(await metrics_text(session, server.base_url), cpu)
            wall = loop.time() - started
    finally:
        server.stop()
    assert before is not None
    assert after is not None
    # A share of a core, not a speed: --sleep-on-idle keeps it near 0.01 CPU-s a second.
    assert after - before > BUSY_POLL_SHARE * wall, (before, after, wall)
    assert set(states(polls)) == {"idle"}, reasons(polls)
