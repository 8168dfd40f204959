"""Confirm a stall with two fresh reads of the server's `/metrics`, judged by the core."""

from __future__ import annotations

import asyncio

import aiohttp

from stallwatch.core.confirmation import Confirmation, judge_reads
from stallwatch.exporter.fetch import read_metrics


async def confirm_stall(
    session: aiohttp.ClientSession,
    metrics_url: str,
    *,
    gap_seconds: float,
    timeout: float,
) -> Confirmation:
    """Read `metrics_url` twice, `gap_seconds` apart, and judge the pair."""
    first = await read_metrics(session, metrics_url, timeout=timeout)
    if first.reading is None:
        return Confirmation(False, "down", first.detail)
    await asyncio.sleep(gap_seconds)
    second = await read_metrics(session, metrics_url, timeout=timeout)
    if second.reading is None:
        return Confirmation(False, "down", second.detail)
    return judge_reads(first.reading, second.reading)
