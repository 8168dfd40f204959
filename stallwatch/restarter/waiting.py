"""The alerts that wait to be judged again: refused only by a pause or the open breaker (judged
again once neither refuses), or waiting for their restart window's or their hold's end (judged
again once it has come). Which alerts wait, and until when, the core's alert plan decides
(`AlertMemory.waiting`, by alert episode); this module keeps each one's delivery and hands the
due ones back to the restarter.

Without this, a server that hung during a pause or behind an open breaker waits for
Alertmanager's next delivery of its alert (hourly with the shipped routing) after the operator
resumes. Judging one again runs the whole plan and a fresh confirmation, so a server that
recovered meanwhile is not restarted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

from stallwatch.core.alert_plan import AlertMemory, AlertOutcome, due_waiting, expedite_holds
from stallwatch.core.alerts import Alert, Notification
from stallwatch.core.fleet import Controls
from stallwatch.core.holds import Hold
from stallwatch.core.policy import alert_key
from stallwatch.restarter.journal_reader import JournalError

log = logging.getLogger("stallwatch.restarter")

# How often the waiting alerts are looked at (a resume from the command line, a pause running
# out, a restart window's or a hold's end is seen within this; a resume over HTTP at once).
RELEASE_CHECK_SECONDS = 1.0


class _Fleet(Protocol):
    def controls(self, now: float) -> Controls: ...


class _Holds(Protocol):
    def follow(self, now: float) -> Mapping[str, Hold]: ...


class Judge(Protocol):
    """What of the restarter the waiting alerts use."""

    memory: AlertMemory

    @property
    def fleet(self) -> _Fleet: ...

    @property
    def holds(self) -> _Holds: ...

    @property
    def leads(self) -> bool: ...

    def clock(self) -> float: ...

    async def handle(self, notification: Notification) -> list[dict[str, str]]: ...


class WaitingAlerts:
    """Each waiting alert's delivery (the alert as Alertmanager sent it, before a pod rule
    renamed its target, and where it came from), and the periodic release."""

    def __init__(self, judge: Judge) -> None:
        self.judge = judge
        self._deliveries: dict[str, tuple[Alert, Notification]] = {}
        self._task: asyncio.Task[None] | None = None

    def remember(self, given: Alert, outcome: AlertOutcome, notification: Notification) -> None:
        """Keep the delivery of an alert the outcome left waiting; forget one no longer so."""
        key = outcome.alert
        if key is None:
            return
        if key in self.judge.memory.waiting:
            self._deliveries[key] = (given, notification)
        else:
            self._deliveries.pop(key, None)

    async def release(self) -> int:
        """Judge the waiting alerts again if their time has come or no pause and no open
        breaker refuses them now (and this replica acts); how many were judged."""
        judge = self.judge
        if not judge.memory.waiting or not judge.leads:
            return 0
        now = judge.clock()
        controls = judge.fleet.controls(now)
        controls_allow = not (controls.breaker_open or controls.paused(now))
        if any(w.reason == "on_hold" for w in judge.memory.waiting.values()):
            judge.memory = expedite_holds(judge.memory, set(judge.holds.follow(now)), now)
        due, judge.memory = due_waiting(judge.memory, now, controls_allow)
        deliveries = [self._deliveries.pop(alert_key(w.alert), (w.alert, None)) for w in due]
        self._deliveries = {
            key: delivery
            for key, delivery in self._deliveries.items()
            if key in judge.memory.waiting
        }
        if not deliveries:
            return 0
        latest = next((n for _, n in reversed(deliveries) if n is not None), None)
        alerts = tuple(alert for alert, _ in deliveries)
        notification = (
            Notification(alerts=alerts)
            if latest is None
            else replace(latest, alerts=alerts, group_key="")
        )
        log.info(
            "judging again %d restart alert(s) held by a pause, the breaker, a restart "
            "window or a hold",
            len(alerts),
        )
        await judge.handle(notification)
        return len(alerts)

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
