"""Slow, not stuck, through the real exporter: the simulator's `degrade` fault under each flavour
that publishes the signals reads degraded with its reason, never a restart state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import pytest

from stallwatch.common.exporter_config import DegradedConfig
from stallwatch.core.classify import State
from stallwatch.core.history import STALL_STATES, TargetHistory
from stallwatch.engines import PROFILES
from stallwatch.engines.profile import (
    ADMISSION_STALLED,
    PREEMPTION_STORM,
    THROUGHPUT_COLLAPSE,
)
from stallwatch.simulator.testing import SimHandle, running_simulator
from tests.support.exporter import exporter_for, record_histories, scrape, target

TIMEOUT = aiohttp.ClientTimeout(total=60)
INTERVAL = 0.25
# Windows of a few polls: what is judged is the same as with the shipped minutes.
DEGRADED = DegradedConfig(
    admission_window_seconds=1.5,
    collapse_window_seconds=1.5,
    baseline_samples=40,
    baseline_min_samples=6,
    preemption_window_seconds=1.5,
    # The simulator's KV usage under thrash swings with the requests' lengths.
    kv_cache_full=0.6,
)
SIMULATED = ("vllm", "sglang", "tgi", "llamacpp")


def simulator(kind: str, **overrides: Any) -> Any:
    """A fast simulator whose requests are long enough to outlast the test."""
    settings: dict[str, Any] = {"tokens_per_second": 2000, "max_num_seqs": 4}
    settings.update(overrides)
    return running_simulator(engine=kind, max_model_len=1_000_000, **settings)


def long_request(tokens: int = 100_000) -> dict[str, Any]:
    return {"prompt": "hello " * 50, "max_tokens": tokens, "ignore_eos": True}


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client:
        yield client


def send(
    session: aiohttp.ClientSession, sim: SimHandle, count: int, tokens: int = 100_000
) -> list[asyncio.Task[Any]]:
    async def one() -> None:
        async with session.post(sim.url + "/v1/completions", json=long_request(tokens)) as r:
            await r.read()

    return [asyncio.create_task(one()) for _ in range(count)]


async def degrade(session: aiohttp.ClientSession, sim: SimHandle, **body: Any) -> None:
    async with session.post(sim.url + "/sim/fault", json={"fault": "degrade", **body}) as r:
        assert r.status == 200, await r.text()


def learned(history: TargetHistory) -> bool:
    return history.degradation.measures.baseline_rate_per_request is not None


async def watch(
    session: aiohttp.ClientSession,
    sim: SimHandle,
    kind: str,
    fault: dict[str, Any],
    reason: str,
    *,
    before_fault: int,
    after_fault: int = 0,
    ended_after_fault: int = 0,
    degraded: DegradedConfig = DEGRADED,
) -> tuple[list[TargetHistory], dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """Load the server, let the exporter learn it, degrade it; its histories until degraded."""
    tasks = send(session, sim, before_fault)
    try:
        async with exporter_for(
            target("gpu-d", sim.url, kind=kind, interval_seconds=INTERVAL, degraded=degraded)
        ) as (service, url):
            healthy = await record_histories(service, "gpu-d", until=learned, timeout=60)
            await degrade(session, sim, **fault)
            for task in tasks[:ended_after_fault]:
                task.cancel()  # its client goes away: the server aborts it, a slot comes free
            tasks += send(session, sim, after_fault)
            seen = await record_histories(
                service,
                "gpu-d",
                until=lambda h: reason in h.degradation.reasons,
                timeout=60,
            )
            samples = await scrape(url)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert not any(h.degradation.degraded for h in healthy)
    return seen, samples


def degraded_sample(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], reason: str
) -> float:
    labels = (("reason", reason), ("target", "gpu-d"))
    return samples[("stallwatch_target_degraded", labels)]


def never_a_restart_state(seen: list[TargetHistory]) -> None:
    assert seen[-1].state == State.BUSY
    assert not any(h.state in STALL_STATES for h in seen[-3:])


@pytest.mark.parametrize("kind", SIMULATED)
async def test_a_throughput_cut_reads_collapse_under_each_flavour(
    session: aiohttp.ClientSession, kind: str
) -> None:
    """Degrade to a tenth of the speed: collapse against the baseline the exporter learned,
    published with the rate and baseline behind it."""
    assert PROFILES[kind].judges(THROUGHPUT_COLLAPSE)
    async with simulator(kind) as sim:
        seen, samples = await watch(
            session,
            sim,
            kind,
            {"mode": "throughput", "factor": 0.1},
            THROUGHPUT_COLLAPSE,
            before_fault=4,
        )
    never_a_restart_state(seen)
    measures = seen[-1].degradation.measures
    assert measures.rate_per_request is not None
    assert measures.baseline_rate_per_request is not None
    assert measures.rate_per_request < DEGRADED.collapse_factor * measures.baseline_rate_per_request
    assert degraded_sample(samples, THROUGHPUT_COLLAPSE) == 1
    baseline = samples[
        ("stallwatch_generation_tokens_per_second_per_request_baseline", (("target", "gpu-d"),))
    ]
    assert baseline == pytest.approx(measures.baseline_rate_per_request)


@pytest.mark.parametrize("kind", ["vllm", "llamacpp"])
async def test_admission_stopped_reads_admission_stalled(
    session: aiohttp.ClientSession, kind: str
) -> None:
    """Admission stopped, three of the four running requests ended and three more queued
    (`Running: 1, Waiting: 3` on a server that ran four): it stays busy and reads
    admission_stalled."""
    assert PROFILES[kind].judges(ADMISSION_STALLED)
    async with simulator(kind) as sim:
        seen, samples = await watch(
            session,
            sim,
            kind,
            {"mode": "admission"},
            ADMISSION_STALLED,
            before_fault=4,
            after_fault=3,
            ended_after_fault=3,
        )
    never_a_restart_state(seen)
    assert "3 requests waiting" in seen[-1].degradation.details[ADMISSION_STALLED]
    assert degraded_sample(samples, ADMISSION_STALLED) == 1


async def test_a_kv_cache_too_small_reads_a_preemption_storm(
    session: aiohttp.ClientSession,
) -> None:
    """vLLM with its KV cache shrunk to 32 blocks under 24 long requests: preempted over and
    over with the cache nearly full, published as preemption_storm with the rate behind it."""
    assert PROFILES["vllm"].judges(PREEMPTION_STORM)
    kv_tokens = 1_048_576
    async with simulator("vllm", max_num_seqs=16, kv_cache_tokens=kv_tokens) as sim:
        seen, samples = await watch(
            session,
            sim,
            "vllm",
            {"mode": "preemption", "factor": 4096 / kv_tokens},
            PREEMPTION_STORM,
            before_fault=24,
            # Keeps the test about preemption: the storm's KV swings leave slots free at times.
            degraded=replace(DEGRADED, admission_window_seconds=3600.0),
        )
    never_a_restart_state(seen)
    measures = seen[-1].degradation.measures
    assert measures.preemptions_per_second is not None
    assert measures.preemptions_per_second > DEGRADED.preemptions_per_second
    assert degraded_sample(samples, PREEMPTION_STORM) == 1
    rate = samples[("stallwatch_preemptions_per_second", (("target", "gpu-d"),))]
    assert rate == pytest.approx(measures.preemptions_per_second)


async def test_a_flavour_that_cannot_show_it_never_reads_degraded(
    session: aiohttp.ClientSession,
) -> None:
    """trtllm-serve's counters move only at completion: a throughput cut is never judged, and
    no degraded series is published for it."""
    assert not any(
        PROFILES["trtllm"].judges(reason) for reason in PROFILES["trtllm"].degraded_unjudged
    )
    async with simulator("trtllm") as sim:
        tasks = send(session, sim, 4, tokens=200)
        try:
            async with exporter_for(
                target(
                    "gpu-t", sim.url, kind="trtllm", interval_seconds=INTERVAL, degraded=DEGRADED
                )
            ) as (service, url):
                await record_histories(service, "gpu-t", until=lambda h: h.polls >= 4, timeout=60)
                await degrade(session, sim, mode="throughput", factor=0.1)
                seen = await record_histories(
                    service, "gpu-t", until=lambda h: h.polls >= 16, timeout=60
                )
                samples = await scrape(url)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    assert not any(h.degradation.degraded for h in seen)
    assert not [key for key in samples if key[0] == "stallwatch_target_degraded"]
