"""Confirm a stall with two fresh reads of the server's `/metrics`, judged by the core."""

from __future__ import annotations

import asyncio

import aiohttp

from stallwatch.core.confirmation import (
    Confirmation,
    FailedRead,
    ReadAttempt,
    ReadFailure,
    judge_attempts,
    worth_a_second_read,
)
from stallwatch.core.poll_plan import ReadResult
from stallwatch.exporter.fetch import read_metrics


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
    """Read `metrics_url` twice, `gap_seconds` apart, and judge the pair."""
    first = attempt(await read_metrics(session, metrics_url, timeout=timeout))
    if not worth_a_second_read(first):
        return judge_attempts(first, None)
    await asyncio.sleep(gap_seconds)
    second = attempt(await read_metrics(session, metrics_url, timeout=timeout))
    return judge_attempts(first, second)
