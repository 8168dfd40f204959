"""The running restarter: it drives the core's alert plans (`core/alert_plan.py`) under its
targets' locks and its journal, and hands restarts to the background.

For each alert of a notification a plan is driven: the steps that need no waiting (the clock,
the journal's history, the memory, a target's pool) are answered at once, and the alerts whose
plans want a confirmation are driven again under their target's lock. Every decision is
journaled before the caller answers; a restart action then runs in a background task
(`background.py`). What changes who is in users' rotation is journaled, counted and handed to
the routers (`rotation.py`); the alerts that wait (a pause, the breaker, a window's or a hold's
end) are judged again when their time comes (`waiting.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import aiohttp

from stallwatch import USER_AGENT
from stallwatch.common.restarter_config import RestarterConfig, Target
from stallwatch.core.alert_plan import (
    AlertMemory,
    Plan,
    firing_plan,
    followed_config,
    look_plan,
    resolved_plan,
    settle_plan,
    window_alert,
)
from stallwatch.core.alerts import Alert, Notification
from stallwatch.core.holds import Hold
from stallwatch.core.lease import merge_restarts
from stallwatch.core.policy import Decision, History, budget_spent, lookback_seconds
from stallwatch.core.quarantine import Verdict, verdict
from stallwatch.restarter.background import BackgroundActions
from stallwatch.restarter.confirm import Confirmations, Confirmer, confirm_stall
from stallwatch.restarter.fleet import FleetGuard
from stallwatch.restarter.holds import TargetHolds
from stallwatch.restarter.journal import Journal
from stallwatch.restarter.journal_reader import JournalError
from stallwatch.restarter.metrics import UNCONFIGURED_TARGET, RestarterMetrics
from stallwatch.restarter.outcomes import JOURNAL_UNWRITABLE, Outcomes
from stallwatch.restarter.platform import PlainPlatform, Platform
from stallwatch.restarter.rotation import Rotation
from stallwatch.restarter.steps import PENDING, Pending, PlanSteps
from stallwatch.restarter.waiting import WaitingAlerts

if TYPE_CHECKING:
    from stallwatch.core.policy import PastRestart
    from stallwatch.restarter.kube.side import KubeSide

log = logging.getLogger("stallwatch.restarter")

# Alerts that need no confirmation are judged this many at a time: one commit (one wait for
# the disk) per batch, and the event loop gets a turn between batches.
JUDGED_PER_COMMIT = 200
__all__ = ["JOURNAL_UNWRITABLE", "Restarter"]


class Restarter:
    """Decisions, journal and background actions for one configuration."""

    def __init__(
        self,
        config: RestarterConfig,
        *,
        clock: Callable[[], float] = time.time,
        confirmer: Confirmer = confirm_stall,
    ) -> None:
        self.config = config
        self.clock = clock
        self.confirmations = Confirmations(confirmer)
        self.metrics = RestarterMetrics(config)
        self.journal = Journal.open(config.journal)
        self.locks = {target.name: asyncio.Lock() for target in config.targets}
        self._lookback = lookback_seconds(config)
        self._session: aiohttp.ClientSession | None = None
        # Where it runs: plain, or Kubernetes (set up on start: pod targets, the Lease, Events,
        # pod readiness). `kube` is the Kubernetes side itself, for its own endpoints and tests.
        self.platform: Platform = PlainPlatform(self.current_config)
        self.kube: KubeSide | None = None
        self._refusals: dict[tuple[str, str], Decision] = {}
        # The windows, the waiting alerts and who is out of rotation (core/alert_plan.py).
        self.memory = AlertMemory()
        self.fleet = FleetGuard(self.journal, self.metrics, self.current_config, clock)
        self.holds = TargetHolds(self.journal, self.metrics, self.current_config, clock)
        self.waiting = WaitingAlerts(self)
        self.rotation = Rotation(self)
        self.outcomes = Outcomes(self)
        self.steps = PlanSteps(self)
        self.background = BackgroundActions(self.journal, self.metrics, self.fleet, clock)
        self.background.close_interrupted()
        self.memory = self.rotation.restored(self.memory)
        self.memory = self.outcomes.restored_windows(self.memory)
        self._settling: set[asyncio.Task[None]] = set()

    def current_config(self) -> RestarterConfig:
        return self.config

    @property
    def actions(self) -> set[asyncio.Task[None]]:
        """The restart actions running in the background."""
        return self.background.tasks

    @property
    def acting(self) -> set[str]:
        """Targets whose restart action is running now: one action per target at a time."""
        return self.background.acting

    @property
    def leads(self) -> bool:
        """Whether this replica acts (always, outside Kubernetes; the Lease holder on it)."""
        return self.platform.acting

    def verdict(self, target: str) -> Verdict:
        """What routers are told about `target`: routable unless quarantined (unknown targets
        are routable: routers fail open, and so does the verdict)."""
        return verdict(target, self.memory.quarantines)

    def verdicts(self) -> dict[str, Verdict]:
        """The verdict of every configured target and every quarantined one."""
        names = {target.name for target in self.config.targets} | set(self.memory.quarantines)
        return {name: self.verdict(name) for name in sorted(names)}

    def pool_members(self, target: Target) -> tuple[str, ...]:
        """The targets of `target`'s pool, itself included: on Kubernetes the pods of its
        workload, elsewhere the configured targets with the same `pool`."""
        return self.platform.pool_members(target)

    def apply(self, config: RestarterConfig) -> None:
        """Decide with `config` from now on (a reload); decisions under way finish as begun."""
        config = self.platform.effective(config)  # with the targets the platform adds
        self.config = config
        for target in config.targets:
            self.locks.setdefault(target.name, asyncio.Lock())
        self.metrics.add_targets(config)
        self.holds.refresh_gauges()
        self._lookback = lookback_seconds(config)
        self.rotation.follow_config()
        self.memory = followed_config(self.memory, config)
        # A target that left (a reload, a pod that is gone) takes its series with it.
        self.metrics.keep_only({t.name for t in config.targets} | set(self.memory.quarantines))

    @property
    def open_session(self) -> aiohttp.ClientSession | None:
        """The HTTP session once started (None before)."""
        return self._session

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the restarter is not started")
        return self._session

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            headers={"User-Agent": USER_AGENT}, timeout=aiohttp.ClientTimeout(total=300)
        )
        if self.config.kubernetes is not None:
            from stallwatch.restarter.kube.side import KubeSide

            self.kube = await KubeSide.connect(
                self.config,
                clock=self.clock,
                own_restarts=self._own_restarts,
                on_event=self._count_event,
                on_routing_count=self._count_routing,
            )
            self.kube.routable = self._routable
            self.platform = self.kube
        try:
            await self.platform.start()
        except BaseException:
            await self._session.close()
            self.platform, self.kube = PlainPlatform(self.current_config), None
            raise
        self.background.start(self._session, self.platform)
        self.waiting.start()
        self.rotation.start()

    def _own_restarts(self, since: float) -> tuple[PastRestart, ...]:
        return self.journal.restarts_since(since, dry_run=self.config.dry_run)

    def _count_event(self, result: str) -> None:
        self.metrics.kube_events.labels(result=result).inc()

    def _count_routing(self, result: str) -> None:
        self.metrics.kube_routing.labels(result=result).inc()

    def _routable(self, name: str) -> bool:
        return self.verdict(name).routable

    async def stop(self) -> None:
        await self.waiting.stop()
        await self.rotation.stop()
        for task in self._settling:
            task.cancel()
        await asyncio.gather(*self._settling, return_exceptions=True)
        await self.background.finish()
        await self.platform.stop()
        await self.background.close()
        if self._session is not None:
            await self._session.close()
        self.journal.close()

    async def wait_for_actions(self) -> None:
        """Wait until every background action has finished and journaled its result."""
        await self.background.wait()

    async def settled(self) -> None:
        """Wait for the settling reads under way (for tests)."""
        await asyncio.gather(*self._settling, return_exceptions=True)

    def history(self, alert: Alert, now: float, holds: Mapping[str, Hold]) -> History:
        history = self.journal.history(
            alert, since=now - self._lookback, dry_run=self.config.dry_run
        )
        history = replace(
            self.fleet.with_fleet(history, now), holds=holds, acting=frozenset(self.acting)
        )
        # Restarts an earlier Lease holder decided count as if this replica had.
        shared = self.platform.shared_restarts()
        if not shared:
            return history
        return replace(history, restarts=merge_restarts(history.restarts, shared))

    def metric_target(self, alert: Alert) -> str:
        name = alert.target
        return name if name is not None and self.config.target(name) else UNCONFIGURED_TARGET

    # Driving a plan: each step answered here, the outcome applied at once.

    async def handle(self, notification: Notification) -> list[dict[str, str]]:
        """Judge every alert of a notification and journal each decision.

        The alerts whose plans need no confirmation are judged first, in batches written in one
        commit each; the rest then wait for their target's confirmation, the alerts of
        different targets concurrently. An alert whose decision the journal could not record
        is answered `journal_unwritable` and not acted on.
        """
        delivered = notification
        notification, refusals = await self.platform.resolve_notification(notification)
        self._refusals.update(refusals)
        if self.platform.adds_targets:
            self.apply(self.platform.config)
        alerts = notification.alerts
        try:
            self.fleet.notice(notification)
        except JournalError as error:  # each decision below meets the same error and says so
            log.error("fleet state not updated: %s", error)
        try:  # the holds, once for the whole notification (and again after a confirmation)
            holds = self.holds.follow(self.clock())
        except JournalError as error:
            log.error("holds not followed: %s", error)
            holds = self.holds.current(self.clock())
        outcomes: list[Decision | Pending | None] = []
        for start in range(0, len(alerts), JUDGED_PER_COMMIT):
            batch = list(
                zip(
                    delivered.alerts[start : start + JUDGED_PER_COMMIT],
                    alerts[start:],
                    strict=False,
                )
            )
            try:
                with self.journal.transaction():
                    judged = [
                        self._judge_at_once(given, alert, notification, holds)
                        for given, alert in batch
                    ]
            except JournalError as error:
                judged = [self.outcomes.unrecorded(alert, error) for _, alert in batch]
            outcomes.extend(judged)
            if start + JUDGED_PER_COMMIT < len(alerts):
                await asyncio.sleep(0)
        waiting = [index for index, outcome in enumerate(outcomes) if outcome is PENDING]
        confirmed = await asyncio.gather(
            *(
                self._judge_recorded(delivered.alerts[index], alerts[index], notification)
                for index in waiting
            )
        )
        for index, decision in zip(waiting, confirmed, strict=True):
            outcomes[index] = decision
        return [
            {
                "alertname": alert.alertname,
                "target": alert.target or "",
                "decision": "resolved" if decision is None else decision.action,
                "reason": "resolved" if decision is None else decision.reason,
            }
            for alert, decision in zip(alerts, outcomes, strict=True)
            if not isinstance(decision, Pending)
        ]

    def _plan(self, alert: Alert) -> Plan:
        if alert.status == "resolved":
            return resolved_plan(alert, self.config)
        refusal = self._refusals.pop((alert.fingerprint, alert.starts_at), None)
        return firing_plan(alert, self.config, self.config.quarantine, refusal=refusal)

    def _judge_at_once(
        self,
        given: Alert,
        alert: Alert,
        notification: Notification,
        holds: Mapping[str, Hold],
    ) -> Decision | Pending | None:
        """Judge an alert whose plan needs no confirmation (PENDING: one that does)."""
        # A plan with an allow-rule's refusal ends without waiting, so the refusal popped for it
        # is never lost to a plan driven again.
        outcome = self.steps.now(self._plan(alert), holds)
        if isinstance(outcome, Pending):
            return PENDING
        return self.outcomes.conclude(given, alert, outcome, notification)

    async def _judge_recorded(
        self, given: Alert, alert: Alert, notification: Notification
    ) -> Decision | None:
        try:
            return await self.judge(alert, notification, given=given)
        except JournalError as error:
            return self.outcomes.unrecorded(alert, error)

    async def judge(
        self, alert: Alert, notification: Notification, *, given: Alert | None = None
    ) -> Decision | None:
        """Drive one alert's plan to its end and journal the decision (None: resolved)."""
        asked_at = time.monotonic()
        target = self.config.target(alert.target) if alert.target else None
        if target is None or target.name not in self.locks:
            return self.outcomes.conclude(
                given or alert,
                alert,
                await self.steps.run(self._plan(alert), asked_at),
                notification,
            )
        async with self.locks[target.name]:
            outcome = await self.steps.run(self._plan(alert), asked_at)
            return self.outcomes.conclude(given or alert, alert, outcome, notification)

    def settle_later(self, target: Target, alert: Alert, notification: Notification) -> None:
        """Settle `target`'s open window with one fresh read, in the background."""
        if self._session is None:
            return
        task = asyncio.create_task(self._settle(target, alert, notification))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle(self, target: Target, alert: Alert, notification: Notification) -> None:
        try:
            async with self.locks[target.name]:
                outcome = await self.steps.run(settle_plan(target), time.monotonic())
                now = self.clock()
                self.outcomes.apply(outcome, alert.alertname, now)
                if outcome.settled is not None:
                    self.journal.record_decision(
                        alert,
                        outcome.settled,
                        now,
                        receiver=notification.receiver,
                        external_url=notification.external_url,
                    )
                self.rotation.effects(outcome, alert, notification, now)
                self.metrics.restart_windows.set(len(self.memory.windows))
        except JournalError as error:
            log.error("restart window not settled: %s", error)
        except Exception:  # a bug in one settling must not go unseen
            log.exception("restart window not settled")

    async def look_at(self, target: Target) -> None:
        """One look at a quarantined target, under its lock (`rotation.py` calls it)."""
        lock = self.locks.setdefault(target.name, asyncio.Lock())
        async with lock:
            outcome = await self.steps.run(
                look_plan(target, self.config.quarantine), time.monotonic()
            )
            now = self.clock()
            self.outcomes.apply(outcome, "", now)
            if outcome.settled is not None and outcome.near_miss is not None:
                self.journal.record_decision(window_alert(outcome.near_miss), outcome.settled, now)
            self.rotation.effects(outcome, None, None, now)
            self.metrics.restart_windows.set(len(self.memory.windows))

    async def release_held(self) -> int:
        """Judge the waiting alerts again if no pause and no open breaker refuses them now (and
        this replica acts); how many were judged."""
        return await self.waiting.release()

    def refresh_gauges(self) -> None:
        """Budget and last-restart gauges from the journal (they survive a restart)."""
        now = self.clock()
        restarts = self.journal.restarts_since(now - self._lookback, dry_run=self.config.dry_run)
        for target in self.config.targets:
            exhausted = budget_spent(restarts, target, now) >= target.budget.max_restarts
            self.metrics.budget_exhausted.labels(target=target.name).set(1 if exhausted else 0)
        for name, at in self.journal.last_restart_times(dry_run=self.config.dry_run).items():
            if self.config.target(name) is not None:
                self.metrics.last_restart.labels(target=name).set(at)
        self.metrics.held_alerts.set(len(self.memory.waiting))
        self.fleet.refresh_gauges()
        self.holds.refresh_gauges()
        self.rotation.refresh_gauges(now)
