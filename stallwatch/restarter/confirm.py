"""Confirm a stall with two fresh reads of the server's `/metrics`, judged by the core."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Protocol

import aiohttp

from stallwatch.common.restarter_config import ConfirmSettings, Target
from stallwatch.core.confirmation import (
    Confirmation,
    FailedRead,
    ReadAttempt,
    ReadFailure,
    judge_attempts,
    worth_a_second_read,
)
from stallwatch.core.reads import (
    ReadResult,
)
from stallwatch.net.fetch import read_metrics
from stallwatch.net.offload import run_sized


def attempt(result: ReadResult) -> ReadAttempt:
    """A read as the core judges it: its reading, or why there is none."""
    if result.reading is not None:
        return result.reading
    failure: ReadFailure
    if result.error_reason == "timeout":
        failure = "no_answer"
    elif result.error_reason == "connection":
        failure = "unreachable"
    else:
        failure = "unusable"
    return FailedRead(failure, result.detail)


async def confirm_stall(
    session: aiohttp.ClientSession,
    metrics_url: str,
    *,
    gap_seconds: float,
    timeout: float,
) -> Confirmation:
    """Read `metrics_url` twice, `gap_seconds` apart, and judge the pair.

    Each read is parsed, and the pair judged, off the event loop when its payload is big
    (`net/offload`), as the exporter's polls are: a confirmation of a server with megabytes of
    series does not hold up the webhook, another target's confirmation or `/-/healthy`."""
    read = await read_metrics(session, metrics_url, timeout=timeout)
    first = attempt(read)
    if not worth_a_second_read(first):
        return await run_sized(read.payload_bytes, judge_attempts, first, None)
    await asyncio.sleep(gap_seconds)
    again = await read_metrics(session, metrics_url, timeout=timeout)
    second = attempt(again)
    size = max(read.payload_bytes, again.payload_bytes)
    return await run_sized(size, judge_attempts, first, second)


class Confirmer(Protocol):
    def __call__(
        self,
        session: aiohttp.ClientSession,
        metrics_url: str,
        *,
        gap_seconds: float,
        timeout: float,
    ) -> Awaitable[Confirmation]: ...


class Confirmations:
    """Each target's latest confirmation, shared by the alerts that asked before it ended: a
    burst of alerts about one target costs one confirmation, not one each."""

    def __init__(self, confirmer: Confirmer = confirm_stall) -> None:
        self.confirmer = confirmer
        self._latest: dict[str, tuple[float, Confirmation]] = {}  # finished at (monotonic)

    async def confirm(
        self,
        session: aiohttp.ClientSession,
        target: Target,
        settings: ConfirmSettings,
        asked_at: float,
    ) -> Confirmation:
        """Two fresh reads of the target; reads that ended after `asked_at` (monotonic) are
        fresh enough."""
        latest = self._latest.get(target.name)
        if latest is not None and latest[0] >= asked_at:
            return latest[1]
        confirmation = await self.confirmer(
            session, target.metrics_url, gap_seconds=settings.gap, timeout=settings.timeout
        )
        self._latest[target.name] = (time.monotonic(), confirmation)
        return confirmation
