"""Who is in users' rotation: the effects of the alert plans' routing changes (a journal row, a
count, a log line, and the routers that listen: pod readiness or a label on Kubernetes), the
periodic look at every quarantined target, and the quarantines a restarted restarter reads back
from its journal. What to do is the core's (`core/alert_plan.py`, `core/quarantine.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from stallwatch.common.restarter_config import RestarterConfig, Target
from stallwatch.common.text import printable
from stallwatch.core.alert_plan import AlertMemory, AlertOutcome, RoutingChange
from stallwatch.core.alerts import Alert, Notification
from stallwatch.core.quarantine import ROUTING_REASONS, ReleaseReason, folded_quarantines
from stallwatch.core.restart_window import RestartWindow
from stallwatch.restarter.journal import Journal
from stallwatch.restarter.journal_reader import (
    JournalError,
)
from stallwatch.restarter.metrics import RestarterMetrics

if TYPE_CHECKING:
    from stallwatch.restarter.platform import Platform

log = logging.getLogger("stallwatch.restarter")


class Owner(Protocol):
    """What of the restarter the rotation uses."""

    memory: AlertMemory
    config: RestarterConfig
    journal: Journal
    metrics: RestarterMetrics
    platform: Platform

    @property
    def leads(self) -> bool: ...

    def clock(self) -> float: ...

    async def look_at(self, target: Target) -> None: ...


class Rotation:
    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self._task: asyncio.Task[None] | None = None
        self._hooks: set[asyncio.Task[None]] = set()
        self._longest: dict[str, float] = {}
        self._shown: set[str] = set()

    def restored(self, memory: AlertMemory) -> AlertMemory:
        """`memory` with the quarantines the journal's routing rows leave in force (those
        confirmed within `expire_after`): their next look reads a new baseline."""
        owner = self.owner
        settings = owner.config.quarantine
        since = owner.clock() - settings.expire_after
        try:
            events = owner.journal.routing_events(since)
        except JournalError as error:
            log.error("quarantines not read back from the journal: %s", error)
            return memory
        for name, quarantine in folded_quarantines(events).items():
            target = owner.config.target(name)
            if target is None or not settings.enabled:
                continue
            memory = memory.with_quarantine(name, replace(quarantine, pool=target.pool))
            log.warning(
                "quarantine target=%s read back from the journal: out of rotation since %.0f",
                printable(name),
                quarantine.since,
            )
        return memory

    def effects(
        self,
        outcome: AlertOutcome,
        alert: Alert | None,
        notification: Notification | None,
        now: float,
    ) -> None:
        """Journal, count and hand to the routers each routing change of `outcome`; count its
        near miss."""
        del alert, notification
        for change in outcome.routing:
            self.record(change, now)
            if self.owner.config.target(change.target) is not None:
                self.refresh_target(change.target, now)
        if outcome.near_miss is not None:
            self._count_recovered(outcome.near_miss, now)

    def record(self, change: RoutingChange, now: float) -> None:
        owner = self.owner
        owner.journal.record_routing(change, now)
        metrics = owner.metrics
        if change.move == "quarantined":
            metrics.quarantines.labels(target=change.target, reason=change.reason).inc()
        elif change.move == "released":
            metrics.releases.labels(target=change.target, reason=change.reason).inc()
        elif change.move == "refused":
            metrics.quarantine_refusals.labels(target=change.target, reason=change.reason).inc()
        log.warning(
            "%s target=%s reason=%s: %s%s",
            change.move,
            printable(change.target),
            change.reason,
            printable(change.detail),
            f" (out of rotation {change.out_for:.0f} s)" if change.move == "released" else "",
            extra={
                "routing": change.move,
                "target": change.target,
                "reason": change.reason,
                "seconds": round(change.out_for, 3),
            },
        )
        target = owner.config.target(change.target)
        if target is not None and change.move != "refused":
            task = asyncio.create_task(owner.platform.on_routing(change, target))
            self._hooks.add(task)
            task.add_done_callback(self._hooks.discard)

    def _count_recovered(self, window: RestartWindow, now: float) -> None:
        lasted = now - window.opened_at
        metrics = self.owner.metrics
        metrics.recovered_in_window.labels(target=window.target).inc()
        if lasted > self._longest.get(window.target, -1.0):
            self._longest[window.target] = lasted
            metrics.longest_recovered.labels(target=window.target).set(lasted)
        log.warning(
            "recovered_in_window target=%s: the stall ended %.0f s into its %g s restart "
            "window (a restart now would have been false)",
            printable(window.target),
            lasted,
            window.restart_after,
            extra={"target": window.target, "seconds": round(lasted, 3)},
        )

    def follow_config(self) -> None:
        """After a reload: targets that left the config, or every target when quarantine was
        switched off, come back into rotation."""
        owner = self.owner
        now = owner.clock()
        enabled = owner.config.quarantine.enabled
        for name, quarantine in list(owner.memory.quarantines.items()):
            if enabled and owner.config.target(name) is not None:
                continue
            why: ReleaseReason = "disabled" if not enabled else "target_removed"
            owner.memory = owner.memory.with_quarantine(name, None)
            detail = "quarantine switched off" if not enabled else "no longer in the config"
            self.record(RoutingChange("released", name, why, detail, quarantine.out_for(now)), now)
        self.refresh_gauges(now)

    def refresh_gauges(self, now: float) -> None:
        """The routable and time-out-of-rotation gauges; series of targets gone are removed."""
        owner = self.owner
        metrics = owner.metrics
        names = {t.name for t in owner.config.targets} | set(owner.memory.quarantines)
        for name in self._shown - names:
            for gauge in (metrics.routable, metrics.quarantine_seconds):
                with contextlib.suppress(KeyError):
                    gauge.remove(name)
            for reason in ROUTING_REASONS:
                with contextlib.suppress(KeyError):
                    metrics.routing.remove(name, reason)
        for name in names:
            self.refresh_target(name, now)
        self._shown = names

    def refresh_target(self, name: str, now: float) -> None:
        """One target's routable, routing-reason and time-out-of-rotation gauges."""
        metrics = self.owner.metrics
        quarantine = self.owner.memory.quarantines.get(name)
        metrics.routable.labels(target=name).set(0 if quarantine else 1)
        current = "in_rotation" if quarantine is None else quarantine.reason
        for reason in ROUTING_REASONS:
            metrics.routing.labels(target=name, reason=reason).set(reason == current)
        seconds = 0.0 if quarantine is None else quarantine.out_for(now)
        metrics.quarantine_seconds.labels(target=name).set(seconds)
        self._shown.add(name)

    def start(self) -> None:
        """Look at every quarantined target every `check_interval` from now on."""
        self._task = asyncio.create_task(self._look_periodically(), name="rotation")

    async def stop(self) -> None:
        tasks = [*self._hooks, *([self._task] if self._task else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def look_once(self) -> None:
        """Look at every quarantined target once (this replica acting), concurrently."""
        owner = self.owner
        if not owner.leads:
            return
        targets = [
            target
            for name in owner.memory.quarantines
            if (target := owner.config.target(name)) is not None
        ]
        await asyncio.gather(*(self._look(target) for target in targets))
        self.refresh_gauges(owner.clock())

    async def _look(self, target: Target) -> None:
        try:
            await self.owner.look_at(target)
        except JournalError as error:
            log.error("quarantine of %s not looked at: %s", printable(target.name), error)
        except Exception:  # a bug in one look must not end the looks
            log.exception("quarantine of %s not looked at", printable(target.name))

    async def _look_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.owner.config.quarantine.check_interval)
            await self.look_once()
