"""Clients that keep a simulated server busy (a batch job, user traffic) and count requests."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from stallwatch.demo.configs import MODEL


class KeepBusy:
    """`concurrency` completions (`ignore_eos`) in flight against one URL until `stop()`.

    Plays a batch job or user traffic, and counts what happened to its requests: a false
    restart would show here as failures.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        *,
        concurrency: int,
        prompt_tokens: int,
        max_tokens: int,
        user_agent: str,
        timeout: float = 600.0,
    ) -> None:
        self.session = session
        self.url = url
        self.concurrency = concurrency
        self.payload = {
            "model": MODEL,
            "prompt": " ".join(["hello"] * prompt_tokens),
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
        self.user_agent = user_agent
        self.timeout = timeout
        self.sent = 0
        self.completed = 0
        self.failed: dict[str, int] = {}  # reached the server, then failed
        self.refused = 0  # no connection: the server was not listening
        self._workers: list[asyncio.Task[None]] = []

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())

    def start(self) -> None:
        self._workers = [asyncio.create_task(self._work()) for _ in range(self.concurrency)]

    async def stop(self) -> None:
        """Stop sending; requests still in flight are abandoned (neither done nor failed)."""
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []

    def as_json(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "completed": self.completed,
            "failed": dict(self.failed),
            "refused": self.refused,
        }

    async def _work(self) -> None:
        while True:
            self.sent += 1
            try:
                async with self.session.post(
                    f"{self.url}/v1/completions",
                    json=self.payload,
                    headers={"User-Agent": self.user_agent},
                    timeout=aiohttp.ClientTimeout(total=self.timeout),
                ) as response:
                    await response.read()
                    if response.status == 200:
                        self.completed += 1
                        continue
                    reason = f"HTTP {response.status}"
            except aiohttp.ClientConnectorError:
                self.refused += 1
                await asyncio.sleep(0.5)
                continue
            except (aiohttp.ClientError, TimeoutError) as error:
                reason = type(error).__name__
            self.failed[reason] = self.failed.get(reason, 0) + 1
            await asyncio.sleep(0.2)
