"""The real exporter, polling every second, reads a real vLLM server right in every scenario."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
import pytest

from stallwatch.core.classify import State
from stallwatch.exporter.check_cli import EXIT_OK, EXIT_STUCK, run_check
from stallwatch.simulator.config import SimConfig
from stallwatch.simulator.testing import running_simulator
from tests.real.scenario_support import (
    CONCURRENT_GENERATIONS,
    QUEUED_GENERATIONS,
    REAL_INTERVAL,
    PollRecord,
    ServerCounters,
    cancel_all,
    engine_values,
    finish_sustained,
    http_session,
    judged_polls,
    prefill_interval,
    real_target,
    record_polls,
    server_counters,
    starved,
    sustained_generations,
    sustained_lengths,
    wait_for_running,
)
from tests.real.vllm_server import (
    RealVllmServer,
    complete,
    fetch_metrics,
    has_metric,
    word_prompt,
)
from tests.support.exporter import exporter_for, history, scrape, wait_for_state

# Long enough to prefill for several polls at an interval of four times its slowest KV block,
# on an idle fast machine as on a loaded one (the session server's max-model-len is 32 768).
LONG_PROMPT_WORDS = 30_000
# A prefill that ended before its polls did was not observed: tried again, up to this often.
PREFILL_ATTEMPTS = 3
LOADED_INTERVAL = 2.0
NAME = "real"
TARGET_LABELS = (("target", NAME),)


async def test_batch_load_reads_busy_every_poll_and_gets_no_test_request(
    real_vllm: RealVllmServer,
) -> None:
    """Four long generations read busy at every poll that compares two reads; no test request
    is sent."""
    async with http_session() as session:
        before = await server_counters(session, real_vllm.base_url)
        enough = asyncio.Event()
        load = sustained_generations(session, real_vllm.base_url, enough)
        try:
            await wait_for_running(session, real_vllm.base_url, CONCURRENT_GENERATIONS)
            async with exporter_for(real_target(NAME, real_vllm.base_url)) as (service, url):
                polls = await record_polls(service, NAME, until=lambda h: h.polls >= 6, timeout=60)
                metrics = await scrape(url)
            # The exporter is gone: anything the server counts from here on is the load's.
            per_loop = await finish_sustained(load, enough)
        finally:
            await cancel_all(load)
        counted = (await server_counters(session, real_vllm.base_url)).since(before)
    print(f"default server tree peak RSS: {real_vllm.tree_peak_rss_bytes() / 2**20:.0f} MiB")

    assert polls[0].state == State.UNKNOWN or starved(polls[0]), polls[0]
    judged = judged_polls(polls)
    assert len(judged) >= 3, polls
    assert [poll.state for poll in judged] == [State.BUSY] * len(judged), polls
    assert all((poll.steps_per_second or 0) > 0 for poll in judged)
    assert metrics[("stallwatch_test_requests_total", TARGET_LABELS)] == 0
    assert metrics[("stallwatch_target_state", (("state", "busy"), *TARGET_LABELS))] == 1
    answers = [answer for answers_of_loop in per_loop for answer in answers_of_loop]
    assert all(per_loop), per_loop
    for length, answers_of_loop in zip(sustained_lengths(), per_loop, strict=True):
        assert {answer["usage"]["completion_tokens"] for answer in answers_of_loop} == {length}
    prompt_tokens = sum(answer["usage"]["prompt_tokens"] for answer in answers)
    assert counted == ServerCounters(
        requests_completed=len(answers),
        prompt_tokens=prompt_tokens,
        completion_calls=len(answers),
    )


async def test_long_chunked_prefill_is_never_stalled_and_check_says_healthy(
    real_vllm: RealVllmServer,
) -> None:
    """A 30 000-token prompt prefilled 16 tokens a step reads busy, never stalled; check exits 0."""
    async with http_session() as session:
        for attempt in range(1, PREFILL_ATTEMPTS + 1):
            before = await server_counters(session, real_vllm.base_url)
            prefill = asyncio.create_task(
                complete(session, real_vllm.base_url, word_prompt(LONG_PROMPT_WORDS), 1)
            )
            try:
                await wait_for_running(session, real_vllm.base_url, 1)
                interval = await prefill_interval(session, real_vllm.base_url)
                async with exporter_for(real_target(NAME, real_vllm.base_url, interval)) as (
                    service,
                    _,
                ):
                    check = asyncio.create_task(
                        run_check(real_target("check", real_vllm.base_url, interval))
                    )
                    polls = await record_polls(
                        service, NAME, until=lambda h: h.polls >= 4, timeout=60 + 4 * interval
                    )
                    result = await check
                still_prefilling = not prefill.done()
                answer = await prefill
            finally:
                await cancel_all([prefill])
            counted = (await server_counters(session, real_vllm.base_url)).since(before)
            print(
                f"attempt {attempt}: long prefill polled every {interval:.1f} s (from the time "
                f"one KV block takes); still prefilling after the polls: {still_prefilling}"
            )
            if still_prefilling:
                break  # observed; a prefill that ended first says nothing either way

    assert State.STALLED not in [poll.state for poll in polls], polls
    judged = judged_polls(polls)
    assert len(judged) >= 2, polls
    assert [poll.state for poll in judged] == [State.BUSY] * len(judged), polls
    assert still_prefilling
    # The prefill really spanned the polls: no output step, KV cache filling at every read.
    read = [poll for poll in polls if not starved(poll)]
    steps = [engine_values(poll.reading, "steps") for poll in read]
    kv_usage = [engine_values(poll.reading, "kv_cache_usage") for poll in read]
    assert len(set(steps)) == 1, steps
    assert all(later > earlier for earlier, later in itertools.pairwise(kv_usage)), kv_usage  # type: ignore[operator]
    assert all("kv_cache_usage_perc" in poll.reason for poll in judged), polls
    assert result.exit_code == EXIT_OK, result.as_json()
    assert result.as_json()["state"] == "busy"
    assert result.history.test_requests == 0
    assert answer["usage"]["prompt_tokens"] == LONG_PROMPT_WORDS
    assert counted.prompt_tokens == LONG_PROMPT_WORDS
    assert counted.completion_calls == 1  # neither the exporter nor check sent a request


async def test_idle_server_gets_at_most_one_answered_test_request_per_poll(
    real_vllm: RealVllmServer,
) -> None:
    """An idle server reads idle; at most one tiny test request per poll, each answered."""
    async with http_session() as session:
        before = await server_counters(session, real_vllm.base_url)
        async with exporter_for(real_target(NAME, real_vllm.base_url)) as (service, url):
            polls = await record_polls(service, NAME, until=lambda h: h.polls >= 6, timeout=60)
            metrics = await scrape(url)
        found = history(service, NAME)
        counted = (await server_counters(session, real_vllm.base_url)).since(before)

    assert {poll.state for poll in polls} == {State.IDLE}, polls
    assert 1 <= found.test_requests <= found.polls
    assert found.test_request_failures == 0
    assert metrics[("stallwatch_test_requests_total", TARGET_LABELS)] == found.test_requests
    assert metrics[("stallwatch_test_request_failures_total", TARGET_LABELS)] == 0
    # The server answered exactly the requests the exporter counted, and nothing else came.
    assert counted.requests_completed == found.test_requests
    assert counted.completion_calls == found.test_requests


async def test_hung_engine_core_reads_stalled_twice_and_check_says_stuck(
    real_vllm: RealVllmServer,
) -> None:
    """A SIGSTOPped engine core with requests in flight reads stalled twice; check exits 1."""
    async with http_session() as session:
        load = sustained_generations(session, real_vllm.base_url, asyncio.Event())
        try:
            await wait_for_running(session, real_vllm.base_url, CONCURRENT_GENERATIONS)
            async with exporter_for(real_target(NAME, real_vllm.base_url)) as (service, url):
                await wait_for_state(service, NAME, State.BUSY, timeout=30)
                real_vllm.sigstop_engine()
                try:
                    stalled = await wait_for_state(
                        service, NAME, State.STALLED, polls=2, timeout=30
                    )
                    metrics = await scrape(url)
                    result = await run_check(real_target("check", real_vllm.base_url))
                    health_status = (await session.get(f"{real_vllm.base_url}/health")).status
                finally:
                    real_vllm.sigcont_engine()
                resumed = await wait_for_state(service, NAME, State.BUSY, timeout=30)
        finally:
            await cancel_all(load)

    assert stalled.test_requests == 0
    assert stalled.verdict is not None
    assert (stalled.verdict.running or 0) > 0
    assert metrics[("stallwatch_target_state_polls", TARGET_LABELS)] >= 2
    assert metrics[("stallwatch_target_up", TARGET_LABELS)] == 1
    assert result.exit_code == EXIT_STUCK, result.as_json()
    assert result.as_json()["stuck"] is True
    assert result.history.test_requests == 0
    assert health_status == 200  # the server's own health check sees nothing wrong
    assert resumed.test_requests == 0


async def test_killed_engine_core_reads_down_and_its_restart_reads_restarted(
    real_vllm: RealVllmServer,
) -> None:
    """A killed engine core takes the API server down within seconds (the target reads down);
    the restart is read restarted by its new start time, with no rate across the processes."""
    async with http_session() as session:
        for words in (4, 5):  # counters of the old process are not zero
            await complete(session, real_vllm.base_url, word_prompt(words), 8)
        async with exporter_for(real_target(NAME, real_vllm.base_url)) as (service, url):
            await wait_for_state(service, NAME, State.IDLE, timeout=30)
            old_start = history(service, NAME).baseline
            real_vllm.sigkill_engine()
            killed_at = time.monotonic()
            down = await wait_for_state(service, NAME, State.DOWN, timeout=60)
            seconds_to_down = time.monotonic() - killed_at
            down_metrics = await scrape(url)
            exit_code = await asyncio.to_thread(real_vllm.wait_exit, 30.0)
            restart = asyncio.create_task(asyncio.to_thread(real_vllm.restart))
            polls = await record_polls(
                service,
                NAME,
                until=lambda h: restart.done() and h.restarts_detected >= 1,
                timeout=300,
            )
            await restart
            after = await wait_for_state(service, NAME, State.IDLE, timeout=30)
            metrics = await scrape(url)
    print(f"engine core killed -> target down after {seconds_to_down:.1f} s")

    assert exit_code is not None  # the API server itself exited
    assert down.poll_errors.get("connection", 0) >= 1
    assert down_metrics[("stallwatch_target_up", TARGET_LABELS)] == 0
    assert down_metrics[("stallwatch_target_state", (("state", "down"), *TARGET_LABELS))] == 1
    (restarted,) = [poll for poll in polls if poll.state == State.RESTARTED]
    assert old_start is not None
    assert restarted.reading is not None
    assert restarted.reading.process_start_time != old_start.process_start_time
    assert "process start time changed" in restarted.reason
    assert restarted.steps_per_second is None
    assert after.restarts_detected == 1
    assert metrics[("stallwatch_restarts_detected_total", TARGET_LABELS)] == 1


async def test_two_api_servers_restart_is_detected_by_a_counter_going_down(
    real_vllm_two_api_servers: RealVllmServer,
) -> None:
    """With --api-server-count 2 (no start time) a restart reads restarted: a counter went down."""
    server = real_vllm_two_api_servers
    async with exporter_for(real_target(NAME, server.base_url)) as (service, _):
        # The first reads come before any request, while some gauges have no sample yet.
        first = await record_polls(service, NAME, until=lambda h: h.polls >= 2, timeout=30)
        async with http_session() as session:
            text = await fetch_metrics(session, server.base_url)
            for words in (4, 5, 6):
                await complete(session, server.base_url, word_prompt(words), 8)
        await wait_for_state(service, NAME, State.IDLE, timeout=30)
        restart = asyncio.create_task(asyncio.to_thread(server.restart))
        polls = await record_polls(
            service,
            NAME,
            until=lambda h: restart.done() and h.restarts_detected >= 1,
            timeout=300,
        )
        await restart
        after = await wait_for_state(service, NAME, State.IDLE, timeout=30)
    print(f"two-API-server tree peak RSS: {server.tree_peak_rss_bytes() / 2**20:.0f} MiB")

    assert first[0].reading is not None
    assert first[0].reading.running is None
    assert not has_metric(text, "process_start_time_seconds")
    assert [poll.state for poll in first] == [State.IDLE, State.IDLE], first
    assert all(poll.reading is not None and poll.reading.has_engines for poll in first)
    (restarted,) = [poll for poll in polls if poll.state == State.RESTARTED]
    assert "went down" in restarted.reason, restarted
    assert restarted.steps_per_second is None
    assert after.restarts_detected == 1
    assert after.poll_errors.get("parse", 0) == 0


# --- the same scenarios on the simulator and on the real server ---------------------------------

# The simulator configured like the session server (`--max-num-seqs 4 --max-num-batched-tokens 16
# --max-model-len 32768`), at speeds measured on the real one on a shared 2-core machine: four
# generations decode 200-1000 tokens/s together, a long prompt prefills at 500-2000 tokens/s.
SIMULATOR_LIKE_REAL = SimConfig(
    max_num_seqs=4,
    max_num_batched_tokens=16,
    max_model_len=32_768,
    tokens_per_second=400.0,
    prefill_tokens_per_second=1_000.0,
)


@dataclass
class ServerUnderTest:
    """What the parity test needs from either server: where it is, and how to hang it."""

    url: str
    hang: Callable[[], object]
    resume: Callable[[], object]


@contextlib.asynccontextmanager
async def server_under_test(
    kind: str, request: pytest.FixtureRequest
) -> AsyncIterator[ServerUnderTest]:
    if kind == "real":
        real: RealVllmServer = request.getfixturevalue("real_vllm")
        yield ServerUnderTest(real.base_url, real.sigstop_engine, real.sigcont_engine)
        return
    async with running_simulator(SIMULATOR_LIKE_REAL) as sim:
        yield ServerUnderTest(
            sim.url, lambda: sim.apply_fault("hang"), lambda: sim.apply_fault("recover")
        )


async def _states_over_polls(
    url: str, polls: int, interval: float = REAL_INTERVAL
) -> tuple[list[PollRecord], int]:
    """(every poll, test requests sent) of a fresh exporter reading `url` every `interval`
    seconds for `polls` polls."""
    async with exporter_for(real_target(NAME, url, interval)) as (service, _):
        records = await record_polls(
            service, NAME, until=lambda h: h.polls >= polls, timeout=60 + polls * interval
        )
        return records, history(service, NAME).test_requests


def _judged_busy(polls: list[PollRecord]) -> object:
    """What a run of polls of a working server must show, whatever the timing: the first poll
    recorded is the exporter's first read (unknown: nothing to compare with yet) or, when the
    recorder starts a poll late on a loaded machine, already busy; every later poll is busy.
    Anything else is returned with each poll's reason and work gauges, so the assertion shows it."""
    first, *later = [poll.state for poll in polls]
    if first in (State.UNKNOWN, State.BUSY) and later and all(s == State.BUSY for s in later):
        return "busy after the first read"
    return [
        (
            poll.state,
            poll.reason,
            None if poll.reading is None else (poll.reading.running, poll.reading.waiting),
        )
        for poll in polls
    ]


async def _prefill_verdicts(session: aiohttp.ClientSession, url: str) -> dict[str, object]:
    """What four polls of a long prefill read. The poll interval comes from the time one KV
    block took, so a stall of the machine while it was measured can stretch the polls past the
    prefill's end: such a run says nothing either way and is tried again with a new prefill
    (PREFILL_ATTEMPTS in all)."""
    verdicts: dict[str, object] = {}
    for attempt in range(1, PREFILL_ATTEMPTS + 1):
        prefill = asyncio.create_task(complete(session, url, word_prompt(LONG_PROMPT_WORDS), 1))
        try:
            await wait_for_running(session, url, 1)
            interval = await prefill_interval(session, url)
            prefilling, _ = await _states_over_polls(url, 4, interval)
            still_prefilling = not prefill.done()
        finally:
            await cancel_all([prefill])
        print(
            f"prefill attempt {attempt}: polled every {interval:.1f} s; still prefilling after "
            f"the polls: {still_prefilling}"
        )
        verdicts = {
            "prefill still running": still_prefilling,
            "prefill": _judged_busy(prefilling),
            "prefill steps flat": (
                len({engine_values(poll.reading, "steps") for poll in prefilling}) == 1
            ),
        }
        if still_prefilling:
            break
    return verdicts


@pytest.mark.parametrize("server", ["simulator", "real"])
async def test_simulator_and_real_server_get_the_same_verdicts(
    server: str, request: pytest.FixtureRequest
) -> None:
    """Idle, batch load, hang and long prefill read the same on the simulator and on real vLLM."""
    verdicts: dict[str, object] = {}
    async with server_under_test(server, request) as under_test, http_session() as session:
        idle, idle_probes = await _states_over_polls(under_test.url, 4)
        verdicts["idle"] = sorted({str(poll.state) for poll in idle})
        verdicts["idle probes within one per poll"] = 1 <= idle_probes <= len(idle)

        load = sustained_generations(
            session,
            under_test.url,
            asyncio.Event(),
            count=CONCURRENT_GENERATIONS + QUEUED_GENERATIONS,
        )
        try:
            await wait_for_running(session, under_test.url, CONCURRENT_GENERATIONS)
            # Reads given two seconds under the batch load: on two shared cores a saturated
            # CPU vLLM once took over a second to answer /metrics (read hung, CI).
            loaded = real_target(NAME, under_test.url, LOADED_INTERVAL, timeout=LOADED_INTERVAL)
            async with exporter_for(loaded) as (service, _):
                busy = await record_polls(service, NAME, until=lambda h: h.polls >= 4, timeout=60)
                under_test.hang()
                try:
                    stalled = await wait_for_state(
                        service, NAME, State.STALLED, polls=2, timeout=30
                    )
                    check = await run_check(real_target("check", under_test.url))
                finally:
                    under_test.resume()
            verdicts["busy"] = _judged_busy(busy)
            verdicts["hang"] = (stalled.state, stalled.state_polls >= 2, check.exit_code)
            verdicts["test requests under load"] = stalled.test_requests
        finally:
            await cancel_all(load)

        verdicts.update(await _prefill_verdicts(session, under_test.url))
    print(f"{server}: {verdicts}")

    assert verdicts == {
        "idle": ["idle"],
        "idle probes within one per poll": True,
        "busy": "busy after the first read",
        "hang": (State.STALLED, True, EXIT_STUCK),
        "test requests under load": 0,
        "prefill still running": True,
        "prefill": "busy after the first read",
        "prefill steps flat": True,
    }
