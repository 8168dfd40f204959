"""What the real SGLang scenarios share: the target, a client, generations kept running, and the
states and reasons a run of polls read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from stallwatch.common.exporter_config import IdleTestRequestConfig, TargetConfig
from stallwatch.core.history import TargetHistory
from tests.real_sglang.sglang_server import (
    generate,
    metrics_text,
    total,
)

NAME = "sglang"
INTERVAL = 1.0
SLOTS = 4
GENERATION_TOKENS = 1500


def sglang_target(url: str, name: str = NAME, interval: float = INTERVAL) -> TargetConfig:
    """`kind: auto`, as a user writes it: the engine is identified from `/v1/models`."""
    return TargetConfig(
        name=name,
        url=url,
        interval_seconds=interval,
        timeout_seconds=INTERVAL,
        test_request=IdleTestRequestConfig(timeout_seconds=10.0),
    )


@contextlib.asynccontextmanager
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        yield session


async def cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def keep_generating(session: aiohttp.ClientSession, url: str, until: asyncio.Event) -> None:
    """One generation after another until `until`: the load lasts as long as the test needs."""
    while not until.is_set():
        await generate(session, url, 8, GENERATION_TOKENS)


async def wait_for_decoding(session: aiohttp.ClientSession, url: str) -> None:
    """Until the server's own decode pass counter moves (the generations are in the batch)."""
    first = total(await metrics_text(session, url), "sglang:cuda_graph_passes_total", "decode")
    for _ in range(600):
        await asyncio.sleep(0.1)
        now = total(await metrics_text(session, url), "sglang:cuda_graph_passes_total", "decode")
        if now is not None and first is not None and now > first + SLOTS:
            return
    raise AssertionError("the decode pass counter never moved")


def states(polls: list[TargetHistory]) -> list[str]:
    return [str(poll.state) for poll in polls]


def reasons(polls: list[TargetHistory]) -> list[tuple[str, str]]:
    return [(str(p.state), p.verdict.reason if p.verdict else "") for p in polls]
