"""The exporter against the simulator: busy is never probed, stalls and faults read right."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import shutil
import subprocess
from pathlib import Path

import aiohttp

from stallwatch import USER_AGENT
from stallwatch.common.exporter_config import (
    ExporterConfig,
    IdleTestRequestConfig,
    exporter_config_from_mapping,
)
from stallwatch.core.classify import State
from stallwatch.core.history import PollOutcome, TargetHistory
from stallwatch.core.idle_test_request import ON_TIME_SHARE_OF_INTERVAL
from stallwatch.demo import configs as demo_configs
from stallwatch.exporter.app import running_exporter
from stallwatch.exporter.service import ExporterService
from stallwatch.simulator.load import run_load
from stallwatch.simulator.proxy import running_proxy
from stallwatch.simulator.testing import running_simulator
from tests.support.exporter import (
    FAST_INTERVAL,
    TEST_REQUEST_TIMEOUT,
    exporter_for,
    history,
    record_states,
    scrape,
    target,
    wait_for_state,
    wait_until,
)

# What the test-request timeout tests judge: a test request unanswered this long has failed.
TEST_REQUEST_FAILS_AFTER = IdleTestRequestConfig(timeout_seconds=0.5)


async def test_batch_load_reads_busy_and_gets_no_test_request() -> None:
    """Across a long batch-job load the target reads busy every poll and gets zero test requests."""
    async with running_simulator(max_num_seqs=2, tokens_per_second=40) as sim:
        load = asyncio.create_task(
            run_load(sim.url, concurrency=4, prompt_tokens=50, max_tokens=1_900, duration=4.0)
        )
        await wait_until(lambda: sim.stats()["running"] == 2, what="load running")
        async with exporter_for(target("gpu", sim.url)) as (service, url):
            states = await record_states(service, "gpu", 3.0)
            metrics = await scrape(url)
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
        assert len(states) >= 8
        assert states[0][0] == State.UNKNOWN  # first read: nothing to compare with
        assert {state for state, _ in states[1:]} == {State.BUSY}
        assert metrics[("stallwatch_test_requests_total", (("target", "gpu"),))] == 0
        assert USER_AGENT not in sim.stats()["completions_by_user_agent"]


async def test_long_prefill_is_busy_never_stalled() -> None:
    """A prompt prefilled in small chunks for many polls reads busy, never stalled."""
    async with running_simulator(
        max_num_batched_tokens=16, prefill_tokens_per_second=4000, max_model_len=40_000
    ) as sim:
        prompt = " ".join(f"w{i % 1000 + 3}" for i in range(12_000))  # about 3 s of prefill
        async with aiohttp.ClientSession() as session:
            request = asyncio.create_task(
                session.post(
                    sim.url + "/v1/completions",
                    json={"model": "tiny", "prompt": prompt, "max_tokens": 1},
                )
            )
            await wait_until(lambda: sim.stats()["running"] == 1, what="prefill started")
            steps_before = sim.stats()["engines"][0]["output_steps"]
            async with exporter_for(target("gpu", sim.url)) as (service, _):
                states = await record_states(service, "gpu", 2.0)
            assert sim.stats()["engines"][0]["output_steps"] == steps_before  # still prefilling
            response = await request
            response.release()
        assert State.STALLED not in {state for state, _ in states}
        assert {state for state, _ in states[1:]} == {State.BUSY}


async def test_hang_reads_stalled_in_consecutive_polls() -> None:
    """A hung engine with work reads stalled, poll after poll, and gets no test request."""
    async with running_simulator(max_num_seqs=2, tokens_per_second=40) as sim:
        load = asyncio.create_task(
            run_load(sim.url, concurrency=2, prompt_tokens=10, max_tokens=1_900, duration=30)
        )
        await wait_until(lambda: sim.stats()["running"] == 2, what="load running")
        async with exporter_for(target("gpu", sim.url)) as (service, url):
            await wait_for_state(service, "gpu", State.BUSY)
            sim.apply_fault("hang")
            stalled = await wait_for_state(service, "gpu", State.STALLED, polls=2)
            metrics = await scrape(url)
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
    assert stalled.test_requests == 0
    key = (("state", "stalled"), ("target", "gpu"))
    assert metrics[("stallwatch_target_state", key)] == 1
    assert metrics[("stallwatch_target_state_polls", (("target", "gpu"),))] >= 2
    assert metrics[("stallwatch_target_up", (("target", "gpu"),))] == 1


async def test_hang_before_update_reads_unresponsive() -> None:
    """A hang that froze running at 0 is caught by the idle test request failing."""
    async with running_simulator() as sim:
        sim.apply_fault("hang_before_update")
        gpu = target("gpu", sim.url, test_request=TEST_REQUEST_FAILS_AFTER)
        async with exporter_for(gpu) as (service, _):
            found = await wait_for_state(service, "gpu", State.UNRESPONSIVE, polls=2)
    assert found.test_request_failures >= 2
    assert sim.stats()["completions_by_user_agent"].get(USER_AGENT, 0) >= 2


async def test_test_request_counters_are_published_under_both_names_until_0_3() -> None:
    """The idle test request's counters carry their new names and, until 0.3, their old ones."""
    async with running_simulator() as sim:
        sim.apply_fault("hang_before_update")
        gpu = target("gpu", sim.url, test_request=TEST_REQUEST_FAILS_AFTER)
        async with exporter_for(gpu) as (service, url):
            await wait_for_state(service, "gpu", State.UNRESPONSIVE, polls=2)
            metrics = await scrape(url)
    labels = (("target", "gpu"),)
    sent = metrics[("stallwatch_test_requests_total", labels)]
    failed = metrics[("stallwatch_test_request_failures_total", labels)]
    assert sent >= 2
    assert failed >= 2
    assert metrics[("stallwatch_probe_requests_total", labels)] == sent
    assert metrics[("stallwatch_probe_failures_total", labels)] == failed


async def test_idle_server_gets_at_most_one_test_request_per_poll() -> None:
    """An idle server is proven idle by test requests, never more than one per poll."""
    every_poll = IdleTestRequestConfig(timeout_seconds=TEST_REQUEST_TIMEOUT, min_interval_seconds=0)
    async with (
        running_simulator() as sim,
        exporter_for(target("gpu", sim.url, test_request=every_poll)) as (service, _),
    ):
        await wait_until(lambda: history(service, "gpu").polls >= 6, what="six polls")
        found = history(service, "gpu")
    assert found.state == State.IDLE
    assert 1 <= found.test_requests <= found.polls
    assert found.test_request_failures == 0
    assert sim.stats()["completions_by_user_agent"][USER_AGENT] == found.test_requests


async def test_crash_reads_down() -> None:
    """A server whose port closed reads down with up 0."""
    async with running_simulator() as sim, exporter_for(target("gpu", sim.url)) as (service, url):
        await wait_for_state(service, "gpu", State.IDLE)
        sim.apply_fault("crash")
        found = await wait_for_state(service, "gpu", State.DOWN)
        metrics = await scrape(url)
    assert found.poll_errors.get("connection", 0) >= 1
    assert metrics[("stallwatch_target_up", (("target", "gpu"),))] == 0


async def test_restart_reads_restarted_then_the_new_process_state() -> None:
    """A restart is detected once, then the new process is judged on its own counters."""
    async with running_simulator(max_num_seqs=2, tokens_per_second=40) as sim:
        load = asyncio.create_task(
            run_load(sim.url, concurrency=2, prompt_tokens=10, max_tokens=1_900, duration=30)
        )
        await wait_until(lambda: sim.stats()["running"] == 2, what="load running")
        async with exporter_for(target("gpu", sim.url)) as (service, url):
            await wait_for_state(service, "gpu", State.BUSY)
            sim.apply_fault("restart")
            await wait_for_state(service, "gpu", State.RESTARTED)
            # The load generator refills the slots of the new process: busy again.
            after = await wait_for_state(service, "gpu", State.BUSY)
            metrics = await scrape(url)
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
    assert after.restarts_detected == 1
    assert metrics[("stallwatch_restarts_detected_total", (("target", "gpu"),))] == 1


async def test_restart_without_start_time_is_detected_by_counters() -> None:
    """With several API servers (no process_ series) a restart shows as counters going down."""
    async with running_simulator(api_server_count=2, max_num_seqs=2, tokens_per_second=40) as sim:
        load = asyncio.create_task(
            run_load(sim.url, concurrency=2, prompt_tokens=10, max_tokens=1_900, duration=30)
        )
        await wait_until(lambda: sim.stats()["running"] == 2, what="load running")
        async with exporter_for(target("gpu", sim.url)) as (service, _):
            await wait_for_state(service, "gpu", State.BUSY, polls=2)
            sim.apply_fault("restart")
            found = await wait_for_state(service, "gpu", State.RESTARTED)
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
    assert found.verdict is not None
    assert "went down" in found.verdict.reason


async def test_proxy_is_read_through_models_only() -> None:
    """A proxy target is checked via /v1/models: no test request ever goes through it."""
    async with (
        running_simulator() as first,
        running_simulator() as second,
        running_proxy([first.url, second.url]) as (proxy_url, _),
        exporter_for(target("gateway", proxy_url, kind="proxy")) as (service, _),
    ):
        await wait_until(lambda: history(service, "gateway").polls >= 4, what="four polls")
        found = history(service, "gateway")
        for backend in (first, second):
            assert USER_AGENT not in backend.stats()["completions_by_user_agent"]
    assert found.state == State.NO_METRICS
    assert found.test_requests == 0


async def test_one_dead_target_does_not_delay_another() -> None:
    """Each target polls on its own schedule: a target that never answers holds up nothing."""
    async with (
        running_simulator() as sim,
        exporter_for(
            target("gpu", sim.url),
            target("blackhole", "http://127.0.0.1:9", timeout_seconds=0.25),
        ) as (service, _),
    ):
        await wait_until(lambda: history(service, "gpu").polls >= 6, what="six polls")
        assert history(service, "blackhole").state == State.DOWN


async def test_exporter_metrics_pass_promtool_lint() -> None:
    """The exporter's own /metrics follows Prometheus naming conventions (promtool lint)."""

    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make test` installs Debian's prometheus package"
    async with running_simulator() as sim, exporter_for(target("gpu", sim.url)) as (service, url):
        await wait_for_state(service, "gpu", State.IDLE)
        async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as response:
            text = await response.text()
    own = "\n".join(
        line
        for line in text.splitlines()
        if "stallwatch_" in line  # the process and python collectors are the client library's
    )
    completed = subprocess.run(  # noqa: ASYNC221 - the servers are closed by now
        [promtool, "check", "metrics"],
        input=own + "\n",
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "HELP stallwatch_target_state " in text
    assert "Refreshed every poll interval" in text


async def test_oversized_payload_reads_down_with_reason_too_large() -> None:
    """A /metrics body over the cap is refused, counted as too_large, and the target is down."""
    async with running_simulator() as sim:
        config = ExporterConfig(
            targets=(target("gpu", sim.url),),
            listen_host="127.0.0.1",
            listen_port=0,
            max_payload_bytes=1024,
        )
        async with running_exporter(config, Path("unused.yml"), port=0) as (service, _):
            found = await wait_for_state(service, "gpu", State.DOWN)
    assert found.poll_errors.get("too_large", 0) >= 1


class PollLog:
    """Every outcome of one target's polls, with the history after it, none missed."""

    def __init__(self, service: ExporterService, name: str) -> None:
        self.polls: list[tuple[PollOutcome, TargetHistory]] = []
        self._name = name
        self.stop = service.subscribe(self._on_poll)

    def _on_poll(self, target: str, updated: TargetHistory, outcome: PollOutcome) -> None:
        if target == self._name:
            self.polls.append((outcome, updated))

    def probe_times(self) -> list[float]:
        return [outcome.started_at for outcome, _ in self.polls if outcome.test_requests_sent]


async def test_an_idle_server_gets_one_test_request_per_min_interval() -> None:
    """Test requests to an idle server come min_interval apart; the polls between read idle."""
    min_interval = 1.0
    # A failed test request is sent again on the next poll: only answered ones keep the spacing.
    probe = IdleTestRequestConfig(
        timeout_seconds=TEST_REQUEST_TIMEOUT, min_interval_seconds=min_interval
    )
    async with running_simulator() as sim:
        async with exporter_for(target("gpu", sim.url, test_request=probe)) as (service, _):
            log = PollLog(service, "gpu")
            await wait_until(lambda: len(log.probe_times()) >= 3, what="three test requests")
            log.stop()
        sent = sim.stats()["completions_by_user_agent"][USER_AGENT]
    times = log.probe_times()
    on_time = min_interval - FAST_INTERVAL * ON_TIME_SHARE_OF_INTERVAL
    assert all(later - earlier >= on_time - 0.001 for earlier, later in itertools.pairwise(times))
    held_back = [outcome for outcome, _ in log.polls if outcome.test_request_deferred]
    assert held_back
    assert all(outcome.verdict.state == State.IDLE for outcome in held_back)
    assert all("proven alive" in outcome.verdict.reason for outcome in held_back)
    assert sent == history(service, "gpu").test_requests


async def test_the_demo_config_catches_a_hang_with_running_frozen_at_0() -> None:
    """With the demo's min_interval, a server hung idle after a proof of life is still caught.

    The hang comes right after a test request answered: the next polls read idle on that
    proof, then the due test request fails, the next poll sends another at once, and the
    second failure in a row makes LLMServerUnresponsive fire.
    """
    config = exporter_config_from_mapping(
        demo_configs.exporter_config("127.0.0.1:9732", {"gpu-b": "http://x"}, "http://y"),
        "demo",
    )
    demo_target = config.targets[0]
    assert demo_target.test_request.min_interval_seconds > demo_target.interval_seconds
    async with running_simulator() as sim:
        gpu = dataclasses.replace(demo_target, url=sim.url)
        async with exporter_for(gpu) as (service, _):
            await wait_until(lambda: history(service, "gpu-b").test_requests >= 1, what="probe")
            log = PollLog(service, "gpu-b")
            sim.apply_fault("hang_before_update")
            caught = await wait_for_state(
                service, "gpu-b", State.UNRESPONSIVE, polls=2, timeout=30.0
            )
            log.stop()
    assert caught.test_request_failures == 2
    outcomes = [outcome for outcome, _ in log.polls]
    first_failure = next(i for i, outcome in enumerate(outcomes) if outcome.test_requests_failed)
    assert any(outcome.test_request_deferred for outcome in outcomes[:first_failure])
    assert outcomes[first_failure + 1].test_requests_failed == 1  # retried on the very next poll


async def test_the_index_page_lists_each_target_with_its_state_and_reason() -> None:
    """`/` shows every configured target: a judged one with its state and reason, one not yet
    read as such, names and URLs escaped."""
    silent = await asyncio.start_server(lambda _r, _w: None, "127.0.0.1", 0)
    silent_url = f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    async with silent, running_simulator() as sim:
        judged = target("gpu-<a>", sim.url)
        # Its first read waits for an answer that never comes: not judged while the page is read.
        unread = target("gpu-b", silent_url, interval_seconds=60.0, timeout_seconds=60.0)
        async with exporter_for(judged, unread) as (service, url):
            verdict = (await wait_for_state(service, "gpu-<a>", State.IDLE)).verdict
            assert verdict is not None
            async with aiohttp.ClientSession() as session, session.get(url + "/") as response:
                page = await response.text()
    assert "<td>gpu-&lt;a&gt;</td>" in page
    assert f"<td>idle</td><td>{verdict.reason}</td>" in page.replace("&#x27;", "'")
    assert f"<td>gpu-b</td><td>{silent_url}</td><td>not polled yet</td>" in page
