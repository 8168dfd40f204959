"""The real exporter, polling every second, reads a real SGLang server (Python frontend) right.

One server for the module (`--sleep-on-idle`, 4 slots, 16-token prefill chunks): idle, four
generations, a long chunked prefill, the stale gauges after work, a frozen scheduler (decoding,
then in a prefill), and last a restart read from its loading on. After every case, no one called
the endpoints that run a generation or ask the scheduler (`/health`, `/server_info`, ...).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from stallwatch.core.classify import State, still_loading
from stallwatch.core.history import PollOutcome, TargetHistory
from stallwatch.exporter.check_cli import EXIT_STUCK, run_check
from stallwatch.exporter.poll import poll_once
from stallwatch.net.fetch import DEFAULT_MAX_BYTES, default_headers
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
    START_TIMEOUT_S,
    RealSglangServer,
    generate,
    metrics_text,
    total,
)
from tests.support.exporter import exporter_for, history, record_histories

# At 16 tokens a chunk, a few hundred prefill passes: tens of seconds here. A prefill that ended
# before its polls did was not observed, and is tried again with a prompt twice as long.
PREFILL_WORDS = 4000
PREFILL_ATTEMPTS = 3
PREFILL_POLLS = 4
RESTART_ATTEMPTS = 2
# Reads of a restart, close enough to catch its loading window (about a second here) often.
RESTART_POLL_SPACING = 0.1

LIMITS = {"max_payload_bytes": DEFAULT_MAX_BYTES}
# Endpoints that run a generation or wait on the scheduler: a prober must never call them.
UNSAFE = ('"/health"', '"/health_generate"', '"/server_info"', '"/get_server_info"')


# Prefill passes a long prefill must have run before it counts as inside its chunks.
PREFILL_PASSES_SEEN = 3


async def start_prefill(
    session: aiohttp.ClientSession, url: str, words: int
) -> asyncio.Task[dict[str, Any]]:
    """A prefill of `words` tokens, returned once the server runs it: its own prefill pass
    counter (cumulative over the session's server, so counted from before the request) moved
    by more than PREFILL_PASSES_SEEN and the request is in flight at its HTTP layer."""
    passes = "sglang:cuda_graph_passes_total"
    before = total(await metrics_text(session, url), passes, "prefill") or 0.0
    prefill = asyncio.create_task(generate(session, url, words, 1))
    for _ in range(600):
        text = await metrics_text(session, url)
        ran = (total(text, passes, "prefill") or 0.0) - before
        in_flight = total(text, "sglang:http_requests_active", '"/generate"') or 0.0
        if ran > PREFILL_PASSES_SEEN and in_flight >= 1:
            return prefill
        if prefill.done():
            break
        await asyncio.sleep(0.1)
    await cancel([prefill])
    raise AssertionError(f"the prefill never ran {PREFILL_PASSES_SEEN} passes in flight")


async def assert_no_unsafe_calls(session: aiohttp.ClientSession, url: str) -> None:
    text = await metrics_text(session, url)
    called = {endpoint: total(text, "sglang:http_requests_total", endpoint) for endpoint in UNSAFE}
    assert all(count is None for count in called.values()), called


async def test_idle_server_reads_idle_with_at_most_one_test_request_per_poll(
    real_sglang: RealSglangServer,
) -> None:
    """An idle server reads idle at every poll; its test requests (at most one a poll) go to
    /v1/completions, never to /health."""
    async with client() as session:
        before = await metrics_text(session, real_sglang.base_url)
        async with exporter_for(sglang_target(real_sglang.base_url)) as (service, _):
            polls = await record_histories(service, NAME, until=lambda h: h.polls >= 4, timeout=120)
        after = await metrics_text(session, real_sglang.base_url)
        assert set(states(polls)) == {"idle"}, reasons(polls)
        assert 1 <= polls[-1].test_requests <= polls[-1].polls
        completions = '"/v1/completions"'
        sent = (total(after, "sglang:http_requests_total", completions) or 0) - (
            total(before, "sglang:http_requests_total", completions) or 0
        )
        assert sent == polls[-1].test_requests
        await assert_no_unsafe_calls(session, real_sglang.base_url)


async def test_the_server_compresses_its_metrics_for_others_not_for_stallwatch(
    real_sglang: RealSglangServer,
) -> None:
    """The real server gzips /metrics for a client offering gzip (an HTTP client's default),
    and sends it as is to stallwatch's reads, which ask for it so."""
    url = real_sglang.base_url + "/metrics"
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        async with session.get(url, headers={"Accept-Encoding": "gzip, deflate"}) as offered:
            assert offered.headers.get("Content-Encoding") == "gzip"
        async with session.get(url, headers=default_headers()) as ours:
            assert "Content-Encoding" not in ours.headers
            assert b"sglang:num_running_reqs" in await ours.read()


async def test_four_generations_read_busy_and_get_no_test_request(
    real_sglang: RealSglangServer,
) -> None:
    """Four generations in flight read busy at every poll after the first; no test request."""
    async with client() as session:
        done = asyncio.Event()
        load = [
            asyncio.create_task(keep_generating(session, real_sglang.base_url, done))
            for _ in range(SLOTS)
        ]
        try:
            await wait_for_decoding(session, real_sglang.base_url)
            async with exporter_for(sglang_target(real_sglang.base_url)) as (service, _):
                polls = await record_histories(
                    service, NAME, until=lambda h: h.polls >= 5, timeout=120
                )
        finally:
            done.set()
            await cancel(load)
        assert set(states(polls[1:])) == {"busy"}, reasons(polls)
        assert polls[-1].test_requests == 0
        await assert_no_unsafe_calls(session, real_sglang.base_url)


async def _observe_prefill(
    session: aiohttp.ClientSession, url: str, words: int
) -> tuple[list[TargetHistory], list[str], bool]:
    """Polls during one prefill of `words` tokens: the polls, what the server's own gauges
    showed meanwhile, and whether the prefill was still running after the last poll."""
    prefill = await start_prefill(session, url, words)
    shown: list[str] = []
    try:
        async with exporter_for(sglang_target(url)) as (service, _):
            polls = await record_histories(
                service, NAME, until=lambda h: h.polls >= PREFILL_POLLS, timeout=120
            )
        text = await metrics_text(session, url)
        for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs"):
            shown.append(f"{name} {total(text, name)}")
        shown.append(
            f"/generate in flight {total(text, 'sglang:http_requests_active', 'generate')}"
        )
        still_running = not prefill.done()
    finally:
        await cancel([prefill])
    return polls, shown, still_running


async def test_long_chunked_prefill_reads_busy_and_gets_no_test_request(
    real_sglang: RealSglangServer,
) -> None:
    """A prefill of thousands of tokens in 16-token chunks, while both work gauges read 0,
    reads busy at every poll after the first and gets no test request."""
    async with client() as session:
        words = PREFILL_WORDS
        for _ in range(PREFILL_ATTEMPTS):
            polls, shown, still_running = await _observe_prefill(
                session, real_sglang.base_url, words
            )
            if still_running:
                break
            words *= 2
        else:
            pytest.fail(f"every prefill ended before {PREFILL_POLLS} polls; last {words} words")
        print(f"prefill of {words} words: {reasons(polls)}; the server showed {shown}")
        assert shown[:2] == ["sglang:num_running_reqs 0.0", "sglang:num_queue_reqs 0.0"], shown
        assert set(states(polls[1:])) == {"busy"}, reasons(polls)
        assert polls[-1].test_requests == 0
        await assert_no_unsafe_calls(session, real_sglang.base_url)


async def test_stale_gauges_after_work_read_idle_never_stalled(
    real_sglang: RealSglangServer,
) -> None:
    """Read from before four short generations end until after: the work gauges keep their
    last snapshot for a while after the work, yet the server never reads stalled and ends idle,
    not busy for ever."""
    async with client() as session:
        async with exporter_for(sglang_target(real_sglang.base_url)) as (service, _):
            await asyncio.gather(
                *(generate(session, real_sglang.base_url, 8, 200) for _ in range(SLOTS))
            )
            ended = history(service, NAME).polls
            polls = await record_histories(
                service, NAME, until=lambda h: h.polls >= ended + 4, timeout=120
            )
        stale = [
            (reading.running, reading.engines[0].idle_loop)
            for poll in polls
            if (reading := poll.baseline) is not None and reading.has_engines
        ]
        print(f"after work, (running, idle loop) read {stale}: {reasons(polls)}")
        assert "stalled" not in states(polls), reasons(polls)
        assert polls[-1].state == State.IDLE, reasons(polls)


async def test_frozen_scheduler_reads_stalled_twice_and_check_says_stuck(
    real_sglang: RealSglangServer,
) -> None:
    """SIGSTOP of the scheduler under four generations: /metrics still answers, with every
    scheduler series frozen; the exporter reads stalled twice in a row (stuck), `check` exits
    stuck, no test request is sent, and /ready stays 200 (nobody ran the default /health)."""
    async with client() as session:
        done = asyncio.Event()
        load = [
            asyncio.create_task(keep_generating(session, real_sglang.base_url, done))
            for _ in range(SLOTS)
        ]
        try:
            await wait_for_decoding(session, real_sglang.base_url)
            async with exporter_for(sglang_target(real_sglang.base_url)) as (service, _):
                await record_histories(service, NAME, until=lambda h: h.polls >= 2, timeout=60)
                real_sglang.freeze_scheduler()
                try:
                    polls = await record_histories(
                        service,
                        NAME,
                        until=lambda h: h.state == State.STALLED and h.state_polls >= 2,
                        timeout=120,
                    )
                    checked = await run_check(sglang_target(real_sglang.base_url, "check"))
                    async with session.get(real_sglang.base_url + "/ready") as ready:
                        ready_status = ready.status
                finally:
                    real_sglang.resume_scheduler()
                probes = history(service, NAME).test_requests
        finally:
            done.set()
            await cancel(load)
        print(f"frozen: {reasons(polls)}")
        assert "idle" not in states(polls), reasons(polls)
        assert checked.exit_code == EXIT_STUCK, checked.as_json()
        assert probes == 0
        assert ready_status == 200
        await assert_no_unsafe_calls(session, real_sglang.base_url)


async def test_scheduler_frozen_in_a_chunked_prefill_reads_stalled_twice(
    real_sglang: RealSglangServer,
) -> None:
    """SIGSTOP of the scheduler in a long chunked prefill, both work gauges at 0 and one
    /generate in flight: stalled twice in a row (stuck), never idle, no test request."""
    async with client() as session:
        prefill = await start_prefill(session, real_sglang.base_url, PREFILL_WORDS)
        try:
            real_sglang.freeze_scheduler()
            try:
                text = await metrics_text(session, real_sglang.base_url)
                async with exporter_for(sglang_target(real_sglang.base_url)) as (service, _):
                    polls = await record_histories(
                        service,
                        NAME,
                        until=lambda h: h.state == State.STALLED and h.state_polls >= 2,
                        timeout=120,
                    )
            finally:
                real_sglang.resume_scheduler()
        finally:
            await cancel([prefill])
        print(f"frozen in a prefill: {reasons(polls)}")
        assert total(text, "sglang:num_running_reqs") == 0.0
        assert total(text, "sglang:num_queue_reqs") == 0.0
        assert total(text, "sglang:http_requests_active", '"/generate"') == 1.0
        assert "idle" not in states(polls), reasons(polls)
        assert polls[-1].test_requests == 0
        await assert_no_unsafe_calls(session, real_sglang.base_url)


async def _poll_through_restart(
    server: RealSglangServer, session: aiohttp.ClientSession
) -> list[PollOutcome]:
    """Restart the server under the exporter's own poll, run every RESTART_POLL_SPACING so
    the loading window (seconds) is read; until the new process is ready and a poll after that
    has read it."""
    target = sglang_target(server.base_url)
    current = TargetHistory()
    for _ in range(2):
        current = current.advance(await poll_once(session, target, current.baseline, **LIMITS))
    await asyncio.to_thread(server.stop)
    server.launch()
    outcomes: list[PollOutcome] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT_S
    ready = asyncio.create_task(asyncio.to_thread(server.wait_ready))
    try:
        while not ready.done() or len(outcomes) < 2 or outcomes[-1].verdict.state == State.DOWN:
            if loop.time() > deadline:
                raise AssertionError(f"no ready read in {START_TIMEOUT_S} s")
            outcome = await poll_once(
                session,
                target,
                current.baseline,
                last_proven_alive_at=current.last_proven_alive_at,
                **LIMITS,
            )
            current = current.advance(outcome)
            outcomes.append(outcome)
            await asyncio.sleep(RESTART_POLL_SPACING)
        await ready
    finally:
        ready.cancel()
    return outcomes


def _loading(outcome: PollOutcome) -> bool:
    reading = outcome.reading
    return reading is not None and reading.has_engines and still_loading(reading.engines[0])


async def test_restart_while_loading_gets_no_test_request_then_reads_restarted(
    real_sglang: RealSglangServer,
) -> None:
    """A restart read by the exporter's poll: while the new process loads (its /metrics holds
    only startup series) no poll reads idle, busy or stalled and none sends a test request;
    the first read of the new process reads restarted, once, and nothing reads a stall."""
    async with client() as session:
        await generate(session, real_sglang.base_url, 8, 50)
        for _ in range(RESTART_ATTEMPTS):
            outcomes = await _poll_through_restart(real_sglang, session)
            loading = [outcome for outcome in outcomes if _loading(outcome)]
            if loading:
                break
        else:
            pytest.fail(f"no poll read the loading server in {RESTART_ATTEMPTS} restarts")
        read = [outcome for outcome in outcomes if outcome.reading is not None]
        seen = [(str(o.verdict.state), o.verdict.reason) for o in read]
        print(f"restart: {len(outcomes)} polls, {len(loading)} of them loading; read {seen}")
        assert all(o.verdict.state in (State.RESTARTED, State.UNKNOWN) for o in loading), seen
        assert sum(o.test_requests_sent for o in loading) == 0
        assert read[0].verdict.state == State.RESTARTED, seen
        assert sum(o.verdict.restart_detected for o in outcomes) == 1, seen
        # Its own warm-up request may read busy; nothing reads stalled or idle before it loaded.
        assert State.STALLED not in {o.verdict.state for o in read}, seen
        assert not any(o.verdict.progressed for o in read if o.verdict.restart_detected), seen
        await assert_no_unsafe_calls(session, real_sglang.base_url)
