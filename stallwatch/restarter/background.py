"""Restart actions in the background, one per target at a time, each journaling its result.

An action runs after its restart decision is journaled and answered; its result is logged,
counted and journaled when it finishes. The actions a previous run started and never saw
finish are journaled interrupted when the restarter opens its journal.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import aiohttp

from stallwatch.common.restarter_config import Target
from stallwatch.common.text import printable
from stallwatch.restarter.actions import ActionOutcome, ActionRunner
from stallwatch.restarter.fleet import FleetGuard
from stallwatch.restarter.journal import Journal
from stallwatch.restarter.journal_reader import (
    INTERRUPTED,
    JournalError,
)
from stallwatch.restarter.metrics import RestarterMetrics

if TYPE_CHECKING:
    from stallwatch.restarter.platform import Platform

log = logging.getLogger("stallwatch.restarter")

# On shutdown, running actions get this long to finish before they are interrupted.
SHUTDOWN_GRACE_SECONDS = 5.0


class BackgroundActions:
    """The restart actions running now, and the targets they restart."""

    def __init__(
        self,
        journal: Journal,
        metrics: RestarterMetrics,
        fleet: FleetGuard,
        clock: Callable[[], float],
    ) -> None:
        self.journal = journal
        self.metrics = metrics
        self.fleet = fleet
        self.clock = clock
        self.tasks: set[asyncio.Task[None]] = set()
        # Targets whose restart action is running now: one action per target at a time.
        self.acting: set[str] = set()
        self._session: aiohttp.ClientSession | None = None
        self._runner: ActionRunner | None = None
        self._platform: Platform | None = None

    def close_interrupted(self) -> None:
        """Journal as interrupted the actions a previous run started and never saw finish."""
        for entry in self.journal.unfinished_restarts():
            detail = (
                "the restarter stopped while this action ran (killed?); "
                "whether the action finished is unknown"
            )
            self.journal.record_action_result(entry.id, INTERRUPTED, detail, None, self.clock())
            log.warning(
                "action_result target=%s result=%s (restart decided at journal row %d): %s",
                printable(entry.target),
                INTERRUPTED,
                entry.id,
                detail,
            )

    def start(self, session: aiohttp.ClientSession, platform: Platform) -> None:
        """Run actions with `session` (and the platform's pod actor, if it has one) from now
        on."""
        self._session = session
        self._platform = platform
        self._runner = ActionRunner(session, kube=platform.actor)

    def launch(self, restart_id: int, target: Target) -> None:
        """Run `target`'s action in the background for the restart journaled at `restart_id`."""
        self.acting.add(target.name)
        task = asyncio.create_task(self._act(restart_id, target))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def wait(self) -> None:
        """Wait until every action has finished and journaled its result."""
        while self.tasks:
            await asyncio.gather(*set(self.tasks), return_exceptions=True)

    async def finish(self) -> None:
        """Give the running actions SHUTDOWN_GRACE_SECONDS to finish, then interrupt them."""
        if self.tasks:
            _, pending = await asyncio.wait(set(self.tasks), timeout=SHUTDOWN_GRACE_SECONDS)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.close()

    async def _act(self, restart_id: int, target: Target) -> None:
        if self._runner is None or self._session is None:
            raise RuntimeError("the restarter is not started")
        started = time.monotonic()
        started_at = self.clock()
        try:
            outcome = await self._runner.run(target)
        except asyncio.CancelledError:
            outcome = ActionOutcome(
                "failure", "interrupted: the restarter stopped", time.monotonic() - started
            )
            self._record_outcome(restart_id, target, outcome)
            raise
        finally:
            self.acting.discard(target.name)
        self._record_outcome(restart_id, target, outcome)
        if outcome.result == "success" and target.cooldown_auto is not None:
            await self.fleet.measure_load(self._session, restart_id, target, started_at)

    def _record_outcome(self, restart_id: int, target: Target, outcome: ActionOutcome) -> None:
        if self._platform is not None:
            self._platform.on_outcome(target, outcome.result, outcome.detail)
        self.metrics.restarts.labels(target=target.name, result=outcome.result).inc()
        self.metrics.action_duration.labels(target=target.name).observe(outcome.duration)
        level = logging.INFO if outcome.result == "success" else logging.WARNING
        log.log(
            level,
            "action_result target=%s result=%s duration=%.2fs: %s",
            printable(target.name),
            outcome.result,
            outcome.duration,
            printable(outcome.detail),
            extra={
                "decision": "action_result",
                "target": target.name,
                "result": outcome.result,
                "duration_seconds": round(outcome.duration, 3),
                "restart_row": restart_id,
            },
        )
        try:
            self.journal.record_action_result(
                restart_id, outcome.result, outcome.detail, outcome.duration, self.clock()
            )
        except JournalError as error:
            # The restart is counted and logged above; the next start journals it interrupted.
            self.metrics.journal_errors.inc()
            log.error("the result of journal row %d was not journaled: %s", restart_id, error)
            return
        try:
            self.fleet.check_breaker()
        except JournalError as error:
            log.error("breaker not checked after journal row %d: %s", restart_id, error)
