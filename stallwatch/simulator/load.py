"""Batch-job style load: keep N completions in flight against a server for a while."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from stallwatch import __version__

DEFAULT_USER_AGENT = f"stallwatch-sim-load/{__version__}"


@dataclass(frozen=True)
class LoadSummary:
    """What a load run did. `failed_by_status` keys are HTTP codes or "connection_error"."""

    sent: int
    ok: int
    failed_by_status: dict[str, int] = field(default_factory=dict)
    unfinished: int = 0
    completion_tokens: int = 0
    duration_seconds: float = 0.0

    @property
    def failed(self) -> int:
        return sum(self.failed_by_status.values())

    def format(self) -> str:
        failures = ", ".join(f"{k}: {v}" for k, v in sorted(self.failed_by_status.items()))
        return (
            f"sent {self.sent}, ok {self.ok}, failed {self.failed}"
            f"{' (' + failures + ')' if failures else ''}, unfinished {self.unfinished}, "
            f"completion tokens {self.completion_tokens}, {self.duration_seconds:.1f} s"
        )


async def run_load(
    url: str,
    *,
    concurrency: int,
    prompt_tokens: int,
    max_tokens: int,
    duration: float,
    model: str = "tiny",
    user_agent: str = DEFAULT_USER_AGENT,
    wait_for_in_flight: bool = False,
    request_timeout: float = 600.0,
    stop: asyncio.Event | None = None,
) -> LoadSummary:
    """Keep `concurrency` `/v1/completions` requests (`ignore_eos`) in flight for `duration` s.

    At the end, requests still in flight are cancelled (counted as `unfinished`) unless
    `wait_for_in_flight` is true. Setting `stop` ends the run early, the same way.
    `url` is the server's base URL.
    """
    if concurrency < 1 or prompt_tokens < 1 or max_tokens < 1 or duration < 0:
        raise ValueError("concurrency, prompt_tokens and max_tokens must be >= 1, duration >= 0")
    endpoint = url.rstrip("/") + "/v1/completions"
    payload = {
        "model": model,
        "prompt": " ".join(["hello"] * prompt_tokens),
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    counts: Counter[str] = Counter()
    tokens = 0
    started = time.monotonic()
    deadline = started + duration
    timeout = aiohttp.ClientTimeout(total=request_timeout)

    def should_send() -> bool:
        return time.monotonic() < deadline and not (stop is not None and stop.is_set())

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal tokens
        while should_send():
            counts["sent"] += 1
            try:
                async with session.post(endpoint, json=payload) as response:
                    body = await response.read()
                    if response.status == 200:
                        counts["ok"] += 1
                        with contextlib.suppress(ValueError, KeyError, TypeError):
                            tokens += int(json.loads(body)["usage"]["completion_tokens"])
                    else:
                        counts[str(response.status)] += 1
            except (aiohttp.ClientError, TimeoutError):
                counts["connection_error"] += 1
                await asyncio.sleep(0.05)

    async with aiohttp.ClientSession(
        headers={"User-Agent": user_agent}, timeout=timeout
    ) as session:
        workers = [asyncio.create_task(worker(session)) for _ in range(concurrency)]
        stopped = asyncio.create_task(stop.wait()) if stop is not None else None
        try:
            if wait_for_in_flight:
                await asyncio.gather(*workers)
            else:
                # Ends at the deadline, on `stop`, or when every worker has ended by itself.
                ending = asyncio.create_task(asyncio.wait(workers))
                watched: list[asyncio.Future[Any]] = [ending]
                if stopped is not None:
                    watched.append(stopped)
                try:
                    await asyncio.wait(
                        watched, timeout=max(0.0, duration), return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    ending.cancel()
        finally:
            # Also when run_load itself is cancelled: no worker may outlive the session.
            if stopped is not None:
                stopped.cancel()
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
    ok = counts.pop("ok", 0)
    sent = counts.pop("sent", 0)
    failed = dict(counts)
    unfinished = sent - ok - sum(failed.values())
    return LoadSummary(
        sent=sent,
        ok=ok,
        failed_by_status=failed,
        unfinished=unfinished,
        completion_tokens=tokens,
        duration_seconds=time.monotonic() - started,
    )
