"""The running restarter: decisions, the journal, and restart actions in the background.

For each firing alert the decision is made and journaled before the caller answers; a
restart action then runs in a background task and journals its result when it finishes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import aiohttp

from stallwatch import USER_AGENT
from stallwatch.core.alerts import Alert, Notification
from stallwatch.core.confirmation import Confirmation
from stallwatch.core.policy import Decision, History, decide, lookback_seconds, with_confirmation
from stallwatch.restarter.actions import ActionOutcome, ActionRunner
from stallwatch.restarter.config import RestarterConfig, Target
from stallwatch.restarter.confirm import confirm_stall
from stallwatch.restarter.journal import Journal
from stallwatch.restarter.metrics import UNCONFIGURED_TARGET, RestarterMetrics

log = logging.getLogger("stallwatch.restarter")

# On shutdown, running actions get this long to finish before they are interrupted.
SHUTDOWN_GRACE_SECONDS = 5.0


class Confirmer(Protocol):
    def __call__(
        self,
        session: aiohttp.ClientSession,
        metrics_url: str,
        *,
        gap_seconds: float,
        timeout: float,
    ) -> Awaitable[Confirmation]: ...


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
        self.confirmer = confirmer
        self.metrics = RestarterMetrics(config)
        self.journal = Journal.open(config.journal)
        self.locks = {target.name: asyncio.Lock() for target in config.targets}
        self.actions: set[asyncio.Task[None]] = set()
        self._lookback = lookback_seconds(config)
        self._session: aiohttp.ClientSession | None = None
        self._runner: ActionRunner | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the restarter is not started")
        return self._session

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            headers={"User-Agent": USER_AGENT}, timeout=aiohttp.ClientTimeout(total=300)
        )
        self._runner = ActionRunner(self._session)

    async def stop(self) -> None:
        if self.actions:
            _, pending = await asyncio.wait(set(self.actions), timeout=SHUTDOWN_GRACE_SECONDS)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._runner is not None:
            await self._runner.close()
        if self._session is not None:
            await self._session.close()
        self.journal.close()

    async def wait_for_actions(self) -> None:
        """Wait until every background action has finished and journaled its result."""
        while self.actions:
            await asyncio.gather(*set(self.actions), return_exceptions=True)

    def _history(self, alert: Alert, now: float) -> History:
        return self.journal.history(alert, since=now - self._lookback, dry_run=self.config.dry_run)

    def _metric_target(self, alert: Alert) -> str:
        name = alert.target
        return name if name is not None and self.config.target(name) else UNCONFIGURED_TARGET

    async def handle(self, notification: Notification) -> list[dict[str, str]]:
        """Judge every alert of a notification; the alerts of different targets concurrently."""
        outcomes = await asyncio.gather(
            *(self.judge(alert, notification) for alert in notification.alerts)
        )
        return [
            {
                "alertname": alert.alertname,
                "target": alert.target or "",
                "decision": "resolved" if decision is None else decision.action,
                "reason": "resolved" if decision is None else decision.reason,
            }
            for alert, decision in zip(notification.alerts, outcomes, strict=True)
        ]

    async def judge(self, alert: Alert, notification: Notification) -> Decision | None:
        """Decide about one alert and journal the decision (None: a resolved alert)."""
        if alert.status == "resolved":
            self.journal.record_decision(
                alert,
                None,
                self.clock(),
                receiver=notification.receiver,
                external_url=notification.external_url,
            )
            self.metrics.resolved.labels(target=self._metric_target(alert)).inc()
            log.info(
                "resolved target=%s alert=%s fingerprint=%s (journaled, not acted on)",
                alert.target,
                alert.alertname,
                alert.fingerprint,
            )
            return None
        target = self.config.target(alert.target) if alert.target else None
        if target is None:
            now = self.clock()
            return self._conclude(
                alert,
                decide(alert, self.config, self._history(alert, now), now),
                notification,
                None,
            )
        async with self.locks[target.name]:
            now = self.clock()
            decision = decide(alert, self.config, self._history(alert, now), now)
            if not decision.restarts:
                return self._conclude(alert, decision, notification, target)
            confirmation = await self.confirmer(
                self.session,
                target.metrics_url,
                gap_seconds=self.config.confirm.gap,
                timeout=self.config.confirm.timeout,
            )
            # Other targets may have restarted during the reads: check again, and write the
            # decision with no await in between, so no other decision can slip in.
            now = self.clock()
            decision = decide(alert, self.config, self._history(alert, now), now)
            decision = with_confirmation(decision, alert, self.config, confirmation)
            return self._conclude(alert, decision, notification, target)

    def _conclude(
        self,
        alert: Alert,
        decision: Decision,
        notification: Notification,
        target: Target | None,
    ) -> Decision:
        now = self.clock()
        row_id = self.journal.record_decision(
            alert,
            decision,
            now,
            receiver=notification.receiver,
            external_url=notification.external_url,
        )
        log.info(
            "%s target=%s alert=%s fingerprint=%s reason=%s: %s",
            decision.action,
            alert.target,
            alert.alertname,
            alert.fingerprint,
            decision.reason,
            decision.detail,
        )
        if not decision.restarts or target is None:
            self.metrics.skips.labels(
                target=self._metric_target(alert), reason=decision.reason
            ).inc()
            return decision
        self.metrics.last_restart.labels(target=target.name).set(now)
        task = asyncio.create_task(self._act(row_id, target))
        self.actions.add(task)
        task.add_done_callback(self.actions.discard)
        return decision

    async def _act(self, restart_id: int, target: Target) -> None:
        if self._runner is None:
            raise RuntimeError("the restarter is not started")
        started = time.monotonic()
        try:
            outcome = await self._runner.run(target)
        except asyncio.CancelledError:
            outcome = ActionOutcome(
                "failure", "interrupted: the restarter stopped", time.monotonic() - started
            )
            self._record_outcome(restart_id, target, outcome)
            raise
        self._record_outcome(restart_id, target, outcome)

    def _record_outcome(self, restart_id: int, target: Target, outcome: ActionOutcome) -> None:
        self.journal.record_action_result(
            restart_id, outcome.result, outcome.detail, outcome.duration, self.clock()
        )
        self.metrics.restarts.labels(target=target.name, result=outcome.result).inc()
        self.metrics.action_duration.labels(target=target.name).observe(outcome.duration)
        level = logging.INFO if outcome.result == "success" else logging.WARNING
        log.log(
            level,
            "action_result target=%s result=%s duration=%.2fs: %s",
            target.name,
            outcome.result,
            outcome.duration,
            outcome.detail,
        )

    def refresh_gauges(self) -> None:
        """Budget and last-restart gauges from the journal (they survive a restart)."""
        now = self.clock()
        restarts = self.journal.restarts_since(now - self._lookback, dry_run=self.config.dry_run)
        for target in self.config.targets:
            used = sum(
                1
                for past in restarts
                if past.target == target.name and past.decided_at > now - target.budget.window
            )
            exhausted = used >= target.budget.max_restarts
            self.metrics.budget_exhausted.labels(target=target.name).set(1 if exhausted else 0)
        for name, at in self.journal.last_restart_times(dry_run=self.config.dry_run).items():
            if self.config.target(name) is not None:
                self.metrics.last_restart.labels(target=name).set(at)
