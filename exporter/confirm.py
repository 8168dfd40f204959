"""Confirm a stall with two fresh reads: the restarter's last look before it acts."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

import aiohttp

from exporter.classify import State, Verdict, classify
from exporter.fetch import read_metrics

Refusal = Literal["progress", "idle", "down", "error"]


@dataclass(frozen=True)
class Confirmation:
    confirmed: bool
    refusal: Refusal | None
    detail: str
    verdict: Verdict | None = None


def judge_confirmation(verdict: Verdict) -> Confirmation:
    """Whether a verdict from two fresh reads shows a server that is really stuck."""
    if verdict.state == State.STALLED:
        return Confirmation(True, None, verdict.reason, verdict)
    if verdict.state == State.DOWN:
        return Confirmation(False, "down", verdict.reason, verdict)
    if verdict.has_work or verdict.progressed or verdict.state == State.RESTARTED:
        return Confirmation(False, "progress", f"{verdict.state}: {verdict.reason}", verdict)
    if verdict.state in (State.IDLE, State.SLEEPING):
        # An idle server whose test request failed is the exporter's call to make, through
        # LLMServerUnresponsive; here an idle read with no work is not a stall.
        return Confirmation(False, "idle", f"{verdict.state}: {verdict.reason}", verdict)
    return Confirmation(False, "error", f"{verdict.state}: {verdict.reason}", verdict)


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
    return judge_confirmation(classify(first.reading, second.reading))
