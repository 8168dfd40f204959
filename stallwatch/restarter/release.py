"""Releasing the held alerts: judged again once no pause and no open breaker refuses them, or
once the time they wait for (a restart window's end, a hold's end) has come.

`held.py` keeps the alerts; a resume over HTTP releases them at once, and a check every
RELEASE_CHECK_SECONDS sees a resume from the command line or a pause running out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection

from stallwatch.core.alerts import Notification
from stallwatch.core.fleet import Controls
from stallwatch.restarter.held import HeldAlerts
from stallwatch.restarter.journal_reader import JournalError

log = logging.getLogger("stallwatch.restarter")

# How often the held alerts are looked at (a resume from the command line, a pause running out,
# a restart window's or a hold's end is seen within this; a resume over HTTP at once).
RELEASE_CHECK_SECONDS = 1.0


class HeldRelease:
    """Hands the held alerts back to `judge` when nothing refuses them and this replica acts."""

    def __init__(
        self,
        held: HeldAlerts,
        controls: Callable[[float], Controls],
        clock: Callable[[], float],
        *,
        judge: Callable[[Notification], Awaitable[object]],
        acts: Callable[[], bool],
        held_targets: Callable[[float], Collection[str]] = lambda now: (),
    ) -> None:
        self.held = held
        self.controls = controls
        self.clock = clock
        self.judge = judge
        self.acts = acts
        self.held_targets = held_targets
        self._task: asyncio.Task[None] | None = None

    async def release(self) -> int:
        """Judge the held alerts again if no pause and no open breaker refuses them now (and
        this replica acts); how many were judged."""
        if not self.held or not self.acts():
            return 0
        now = self.clock()
        controls_allow = False
        if self.held.waiting_for_controls():
            controls = self.controls(now)
            controls_allow = not (controls.breaker_open or controls.paused(now))
        waiting_on_holds = self.held.waiting_for_holds()
        if waiting_on_holds:  # a hold released early (`unhold`) frees its alerts at once
            still_held = set(self.held_targets(now))
            for target in waiting_on_holds - still_held:
                self.held.expedite(target, now)
        notification = self.held.take(now, controls_allow)
        if notification is None:
            return 0
        log.info(
            "judging again %d restart alert(s) held by a pause, the breaker, a restart "
            "window or a hold",
            len(notification.alerts),
        )
        await self.judge(notification)
        return len(notification.alerts)

    def start(self) -> None:
        """Check every RELEASE_CHECK_SECONDS from now on."""
        self._task = asyncio.create_task(self._release_periodically(), name="release")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _release_periodically(self) -> None:
        while True:
            await asyncio.sleep(RELEASE_CHECK_SECONDS)
            try:
                await self.release()
            except JournalError as error:
                log.error("held alerts not judged again: %s", error)
            except Exception:  # a bug in one release must not end the checks
                log.exception("held alerts not judged again")
