"""A real vLLM made to preempt (a KV cache of a few blocks, more long requests than fit): its
preemption counter moves, and the exporter reads it busy and degraded by a preemption storm."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp

from stallwatch.common.exporter_config import DegradedConfig
from stallwatch.core.classify import State
from stallwatch.core.history import STALL_STATES
from stallwatch.engines.profile import PREEMPTION_STORM
from tests.real.scenario_support import (
    cancel_all,
    http_session,
    real_target,
    wait_for_running,
)
from tests.real.vllm_server import (
    RealVllmFactory,
    complete,
    fetch_metrics,
    metric_sum,
    word_prompt,
)
from tests.support.exporter import exporter_for, record_histories, scrape

NAME = "real-preempt"
# Four KV blocks hold a few hundred tokens (eight held under 900 by vLLM's own estimate at
# start-up): four requests of 8 prompt and 240 output tokens need about 1 000, so the scheduler
# preempts while they run. Each client sends its next request as soon as one is answered, so the
# load lasts as long as the test needs it, whatever the CPU.
SMALL_KV = ("--num-gpu-blocks-override", "4", "--max-model-len", "256")
OUTPUT_TOKENS = 240
CLIENTS = 6
# Polls far enough apart that a read between two preemptions still sees a step: at 2 s a
# thrashing server on a loaded machine read stalled twice in a row.
INTERVAL = 5.0
# The shipped thresholds, with a window of a few polls and no rate threshold worth speaking of:
# what is judged (preemptions moving with the KV cache nearly full) is what the shipped
# 5 minutes judge.
STORM = DegradedConfig(
    preemption_window_seconds=3 * INTERVAL,
    preemptions_per_second=0.001,
    kv_cache_full=0.5,
    admission_window_seconds=3600.0,
)


async def keep_generating(
    session: aiohttp.ClientSession, base_url: str, until: asyncio.Event
) -> None:
    while not until.is_set():
        await complete(session, base_url, word_prompt(8), OUTPUT_TOKENS)


async def test_a_kv_cache_too_small_preempts_and_reads_a_preemption_storm(
    real_vllm_factory: RealVllmFactory,
) -> None:
    """Six clients of 248-token requests on 4 KV blocks: vllm:num_preemptions_total moves, the
    exporter reads the server busy (never a restart state) and degraded with preemption_storm,
    and publishes the preemption rate behind it."""
    server = real_vllm_factory(*SMALL_KV, name="small-kv")
    async with http_session(total_timeout=900.0) as session:
        before = metric_sum(
            await fetch_metrics(session, server.base_url), "vllm:num_preemptions_total"
        )
        done = asyncio.Event()
        generations = [
            asyncio.create_task(keep_generating(session, server.base_url, done))
            for _ in range(CLIENTS)
        ]
        try:
            await wait_for_running(session, server.base_url, 1)
            target = replace(real_target(NAME, server.base_url, INTERVAL), degraded=STORM)
            async with exporter_for(target) as (service, url):
                seen = await record_histories(
                    service,
                    NAME,
                    until=lambda h: PREEMPTION_STORM in h.degradation.reasons,
                    timeout=600.0,
                )
                samples = await scrape(url)
            after = metric_sum(
                await fetch_metrics(session, server.base_url), "vllm:num_preemptions_total"
            )
        finally:
            done.set()
            await cancel_all(generations)
    measures = seen[-1].degradation.measures
    print(
        f"preemptions {before} -> {after} over {len(seen)} polls every {INTERVAL:g} s; last read: "
        f"{measures.preemptions_per_second} preemptions/s, KV cache {measures.kv_cache_usage}, "
        f"states {[h.state.value if h.state else None for h in seen]}"
    )
    assert before is not None
    assert after is not None
    assert after > before, (before, after)
    assert seen[-1].state == State.BUSY
    assert not any(h.state in STALL_STATES and h.state_polls >= 2 for h in seen)
    assert measures.preemptions_per_second is not None
    assert measures.preemptions_per_second > 0
    assert measures.kv_cache_usage is not None
    assert measures.kv_cache_usage >= STORM.kv_cache_full
    labels = (("reason", PREEMPTION_STORM), ("target", NAME))
    assert samples[("stallwatch_target_degraded", labels)] == 1
    assert samples[("stallwatch_preemptions_per_second", (("target", NAME),))] > 0
