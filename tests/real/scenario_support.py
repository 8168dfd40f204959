"""Helpers for the scenarios on a real vLLM server: the exporter's targets, load, counters.

The exporter runs in the test's event loop (see tests/support/exporter.py) and polls
the real server about once a second, as a production exporter would every 15 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from stallwatch.common.exporter_config import IdleTestRequestConfig, TargetConfig
from stallwatch.core.classify import State
from stallwatch.core.history import TargetHistory
from stallwatch.core.reading import Reading
from stallwatch.exporter.service import ExporterService
from tests.real.vllm_server import complete, fetch_metrics, metric_samples, metric_sum, word_prompt
from tests.support.exporter import record_histories

REAL_INTERVAL = 1.0
# A real server's /metrics answers in milliseconds even with a hung engine core; the test
# request of an idle CPU server takes tens of milliseconds. Both get room for a busy machine.
REAL_TIMEOUT = 1.0
REAL_TEST_REQUEST_TIMEOUT = 10.0
COMPLETIONS_HANDLER = "/v1/completions"
LONG_GENERATION_TOKENS = 1500
CONCURRENT_GENERATIONS = 4
# Sustained loops beyond the session server's --max-num-seqs wait in its queue, and one starts in
# the step where another ends: the server's work then does not depend on this process re-sending
# in time. Four loops of 1 200-1 500 tokens on a fast CPU all end within a second of each other,
# and a test process not scheduled in that second left nothing running at a read (CI).
QUEUED_GENERATIONS = 2


def real_target(
    name: str, url: str, interval: float = REAL_INTERVAL, *, timeout: float | None = None
) -> TargetConfig:
    """A target polled every `interval` seconds (each read given `timeout`, at most the
    interval), with room for a slow test request."""
    return TargetConfig(
        name=name,
        url=url,
        interval_seconds=interval,
        timeout_seconds=min(REAL_TIMEOUT if timeout is None else timeout, interval),
        test_request=IdleTestRequestConfig(timeout_seconds=REAL_TEST_REQUEST_TIMEOUT),
    )


@dataclass(frozen=True)
class ServerCounters:
    """What the server itself counted: completions finished, prompt tokens, HTTP requests."""

    requests_completed: float
    prompt_tokens: float
    completion_calls: float

    @classmethod
    def parse(cls, text: str) -> ServerCounters:
        calls = sum(
            value
            for labels, value in metric_samples(text, "http_requests_total")
            if labels.get("handler") == COMPLETIONS_HANDLER
        )
        return cls(
            requests_completed=metric_sum(text, "vllm:request_success_total") or 0.0,
            prompt_tokens=metric_sum(text, "vllm:prompt_tokens_total") or 0.0,
            completion_calls=calls,
        )

    def since(self, earlier: ServerCounters) -> ServerCounters:
        return ServerCounters(
            self.requests_completed - earlier.requests_completed,
            self.prompt_tokens - earlier.prompt_tokens,
            self.completion_calls - earlier.completion_calls,
        )


async def server_counters(session: aiohttp.ClientSession, base_url: str) -> ServerCounters:
    return ServerCounters.parse(await fetch_metrics(session, base_url))


async def keep_generating(
    session: aiohttp.ClientSession,
    base_url: str,
    until: asyncio.Event,
    *,
    max_tokens: int = LONG_GENERATION_TOKENS,
) -> list[dict[str, Any]]:
    """One generation after another, each sent as soon as the last is answered, until `until`
    is set; the answers. A fixed generation ends sooner on a faster CPU: this load lasts as
    long as the test needs it, whatever the CPU."""
    answers: list[dict[str, Any]] = []
    while not until.is_set():
        answers.append(await complete(session, base_url, word_prompt(8), max_tokens))
    return answers


# Each sustained loop asks this many tokens fewer than the one before it: loops that asked the
# same length would finish on the same step, every time, and a read between their answers and
# their next requests would find nothing running.
SUSTAINED_STAGGER_TOKENS = 100


def sustained_lengths(count: int = CONCURRENT_GENERATIONS) -> list[int]:
    """The generation length of each of `count` sustained loops."""
    return [LONG_GENERATION_TOKENS - index * SUSTAINED_STAGGER_TOKENS for index in range(count)]


def sustained_generations(
    session: aiohttp.ClientSession,
    base_url: str,
    until: asyncio.Event,
    *,
    count: int = CONCURRENT_GENERATIONS,
) -> list[asyncio.Task[list[dict[str, Any]]]]:
    """`count` concurrent `keep_generating` loops of staggered lengths (`sustained_lengths`):
    `count` requests in flight until `until`, never all ending at once."""
    return [
        asyncio.create_task(keep_generating(session, base_url, until, max_tokens=length))
        for length in sustained_lengths(count)
    ]


async def finish_sustained(
    tasks: Sequence[asyncio.Task[list[dict[str, Any]]]], until: asyncio.Event
) -> list[list[dict[str, Any]]]:
    """Set `until`, let each loop's generation in flight end, and return each loop's answers."""
    until.set()
    return list(await asyncio.gather(*tasks))


# vLLM's KV cache usage moves one block at a time (128 tokens on the CPU backend: 8 steps of the
# session server's 16-token chunks), so a long prefill reads busy only when it fills a block in
# every interval; how long a block takes depends on the CPU and on what else runs on it.
PREFILL_BLOCKS_MEASURED = 8
PREFILL_INTERVAL_MARGIN = 4.0
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"


async def prefill_interval(
    session: aiohttp.ClientSession, base_url: str, *, timeout: float = 120.0
) -> float:
    """A poll interval for the long prefill now running on `base_url`: REAL_INTERVAL, or
    PREFILL_INTERVAL_MARGIN times the longest the server took to fill one KV block of it
    (its KV cache usage moved) over PREFILL_BLOCKS_MEASURED blocks, whichever is longer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: float | None = None
    moved_at: float | None = None
    gaps: list[float] = []
    while len(gaps) < PREFILL_BLOCKS_MEASURED:
        if loop.time() > deadline:
            raise AssertionError(f"{KV_CACHE_USAGE} moved only {len(gaps)} times in {timeout} s")
        usage = metric_sum(await fetch_metrics(session, base_url), KV_CACHE_USAGE)
        now = loop.time()
        if last is not None and usage != last:
            if moved_at is not None:
                gaps.append(now - moved_at)
            moved_at = now
        last = usage
        await asyncio.sleep(0.05)
    return max(REAL_INTERVAL, PREFILL_INTERVAL_MARGIN * max(gaps))


async def wait_for_polls(
    service: ExporterService, name: str, state: State, *, polls: int, timeout: float
) -> TargetHistory:
    """Until `name` has read `state` `polls` times in a row; a timeout says every state it
    went through meanwhile (with its reason)."""
    seen = await record_histories(
        service,
        name,
        until=lambda h: h.state == state and h.state_polls >= polls,
        timeout=timeout,
    )
    return seen[-1]


async def cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel client requests (the server aborts them) and wait until they are gone."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def wait_for_running(
    session: aiohttp.ClientSession, base_url: str, at_least: float, timeout: float = 120.0
) -> None:
    """Until the server's own running gauge reads at least `at_least`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    running: float | None = None
    while loop.time() < deadline:
        running = metric_sum(await fetch_metrics(session, base_url), "vllm:num_requests_running")
        if running is not None and running >= at_least:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"running never reached {at_least} in {timeout} s (last {running})")


@dataclass(frozen=True)
class PollRecord:
    """One poll of the exporter, as the test saw it."""

    state: State | None
    state_polls: int
    polls: int
    reason: str
    reading: Reading | None
    steps_per_second: float | None
    test_requests: int


def _record(current: TargetHistory) -> PollRecord:
    assert current.verdict is not None
    return PollRecord(
        state=current.state,
        state_polls=current.state_polls,
        polls=current.polls,
        reason=current.verdict.reason,
        reading=current.baseline,
        steps_per_second=current.verdict.steps_per_second,
        test_requests=current.test_requests,
    )


# A loopback connect the exporter could not make within its share of the timeout: only its own
# event loop, starved on a loaded test machine, causes that; it says nothing of the server.
# Under `kind: auto` the poll after a failed read asks /v1/models first, so either path may say it.
STARVED_CONNECT = ("/metrics: not connected within", "/v1/models: not connected within")


def starved(poll: PollRecord) -> bool:
    return poll.state is State.DOWN and poll.reason.startswith(STARVED_CONNECT)


def judged_polls(polls: Sequence[PollRecord]) -> list[PollRecord]:
    """The polls that compared two reads of the server: each right after a poll that read it
    (the first poll, a starved one and the one after it have nothing to compare)."""
    return [
        poll
        for previous, poll in itertools.pairwise(polls)
        if not starved(previous) and not starved(poll)
    ]


async def record_polls(
    service: ExporterService,
    name: str,
    *,
    until: Any,
    timeout: float,
) -> list[PollRecord]:
    """Every poll of `name` (with its reading) until `until(history)` holds; none is missed."""
    polls = await record_histories(service, name, until=until, timeout=timeout)
    return [_record(current) for current in polls]


def engine_values(reading: Reading | None, field: str) -> float | None:
    """The sum of one EngineSample field over the reading's engines (None when unknown)."""
    if reading is None:
        return None
    values = [getattr(engine, field) for engine in reading.engines]
    known = [value for value in values if value is not None]
    return sum(known) if known else None


@contextlib.asynccontextmanager
async def http_session(total_timeout: float = 30.0) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=total_timeout)) as session:
        yield session
