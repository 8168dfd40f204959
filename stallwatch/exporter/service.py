"""The running exporter: one task per target, the latest history of each, and config reloads."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace

import aiohttp

from stallwatch.common.exporter_config import ExporterConfig, TargetConfig
from stallwatch.core.history import PollOutcome, TargetHistory
from stallwatch.exporter.multitarget import ProbeService
from stallwatch.exporter.poll import poll_once
from stallwatch.exporter.reload import ReloadStatus

log = logging.getLogger("stallwatch.exporter")

# Told about every poll as it is recorded: the target's name, its updated history, the outcome.
PollListener = Callable[[str, TargetHistory, PollOutcome], None]


class ExporterService:
    """Polls every configured target on its own schedule; one slow target delays no other."""

    def __init__(
        self,
        config: ExporterConfig,
        session: aiohttp.ClientSession,
        *,
        owns: Callable[[str], bool] | None = None,
        workers: int = 1,
    ) -> None:
        self.config = config
        # With several workers: whether this one polls the configured target of that name.
        self._owns = owns
        self.session = session
        self.histories: dict[str, TargetHistory] = {}
        self.reload_status = ReloadStatus()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()
        self._listeners: list[PollListener] = []
        # The `/probe` side: the targets Prometheus names, read on demand; this service owns it.
        self.probes = ProbeService(config, session, workers=workers)

    def polls(self, target: TargetConfig) -> bool:
        """Whether this process polls the configured target (each has one worker)."""
        return self._owns is None or self._owns(target.name)

    def polled_config(self) -> ExporterConfig:
        """The config with only the targets this process polls (all of them, but with workers)."""
        if self._owns is None:
            return self.config
        return replace(self.config, targets=tuple(filter(self.polls, self.config.targets)))

    def subscribe(self, listener: PollListener) -> Callable[[], None]:
        """Call `listener` after every poll of every target; returns the unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def start(self) -> None:
        for target in self.config.targets:
            if self.polls(target):
                self._start_target(target)

    def _start_target(self, target: TargetConfig) -> None:
        self.histories.setdefault(target.name, TargetHistory())
        self._tasks[target.name] = asyncio.create_task(
            self._run_target(target), name=f"poll:{target.name}"
        )

    async def _run_target(self, target: TargetConfig) -> None:
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        while True:
            history = self.histories.get(target.name, TargetHistory())
            try:
                outcome = await poll_once(
                    self.session,
                    target,
                    history.baseline,
                    max_payload_bytes=self.config.max_payload_bytes,
                    last_proven_alive_at=history.last_proven_alive_at,
                )
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one poll must not end the target's schedule
                log.exception("poll of %s failed", target.name)
            else:
                updated = history.advance(outcome, target.degraded)
                self.histories[target.name] = updated
                for listener in list(self._listeners):
                    listener(target.name, updated, outcome)
                if history.state != updated.state:
                    log.info(
                        "target=%s state=%s reason=%s",
                        target.name,
                        updated.state,
                        outcome.verdict.reason,
                    )
            next_tick += target.interval_seconds
            now = loop.time()
            if next_tick < now:  # a poll overran: skip the missed ticks, keep the phase
                missed = int((now - next_tick) // target.interval_seconds) + 1
                next_tick += missed * target.interval_seconds
            await asyncio.sleep(next_tick - now)

    async def apply(self, new_config: ExporterConfig) -> None:
        """Swap in an already validated config; unchanged targets keep their history."""
        async with self._lock:
            old_targets = {t.name: t for t in self.config.targets}
            new_targets = {t.name: t for t in new_config.targets}
            for name, old in old_targets.items():
                new = new_targets.get(name)
                if new == old:
                    continue
                await self._stop_target(name)
                if new is None or new.url != old.url or new.kind != old.kind:
                    self.histories.pop(name, None)
            self.config = new_config
            self.probes.apply(new_config)
            for name, target in new_targets.items():
                if name not in self._tasks and self.polls(target):
                    self._start_target(target)

    async def _stop_target(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def stop(self) -> None:
        for name in list(self._tasks):
            await self._stop_target(name)
        await self.probes.stop()
