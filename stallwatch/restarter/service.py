"""The running restarter: decisions, the journal, and restart actions in the background.

For each firing alert the decision is made and journaled before the caller answers; a
restart action then runs in a background task (`background.py`) and journals its result when
it finishes. Alerts a pause or the open breaker refused are judged again once neither refuses
(`release.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import aiohttp

from stallwatch import USER_AGENT
from stallwatch.common.restarter_config import RestarterConfig, Target
from stallwatch.core.alert_plan import AlertMemory
from stallwatch.core.alerts import Alert, Notification
from stallwatch.core.holds import Hold
from stallwatch.core.lease import merge_restarts
from stallwatch.core.policy import (
    Decision,
    History,
    budget_spent,
    decide,
    decide_confirmed,
    lookback_seconds,
)
from stallwatch.core.poll_plan import ReadResult
from stallwatch.core.quarantine import Verdict, verdict
from stallwatch.net.fetch import read_metrics
from stallwatch.restarter.background import BackgroundActions
from stallwatch.restarter.confirm import Confirmations, Confirmer, confirm_stall
from stallwatch.restarter.fleet import FleetGuard
from stallwatch.restarter.held import HeldAlerts
from stallwatch.restarter.journal import Journal
from stallwatch.restarter.journal_reader import JournalError, printable
from stallwatch.restarter.metrics import UNCONFIGURED_TARGET, RestarterMetrics
from stallwatch.restarter.release import HeldRelease
from stallwatch.restarter.windows import RestartWindows, TargetHolds, waits_until

if TYPE_CHECKING:
    from stallwatch.restarter.kube.side import KubeSide

log = logging.getLogger("stallwatch.restarter")

# Alerts that need no confirmation are judged this many at a time: one commit (one wait for
# the disk) per batch, and the event loop gets a turn between batches.
JUDGED_PER_COMMIT = 200
# Skip reasons the restarter adds to the policy's: a target's action still running (whatever
# the cooldown says), and a decision the journal could not record (nothing is run unrecorded).
ACTION_IN_PROGRESS = "action_in_progress"
JOURNAL_UNWRITABLE = "journal_unwritable"


class _Pending:
    """An alert whose cheap checks passed: it waits for its target's lock and confirmation."""


PENDING = _Pending()


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
        # On Kubernetes (set up on start): pod targets, the Lease, Events.
        self.kube: KubeSide | None = None
        self._refusals: dict[tuple[str, str], Decision] = {}
        # The windows, the waiting alerts and who is out of rotation (core/alert_plan.py).
        self.memory = AlertMemory()
        self.fleet = FleetGuard(self.journal, self.metrics, lambda: self.config, clock)
        self.windows = RestartWindows(
            self.metrics, clock=clock, locks=self.locks, fresh_read=self._fresh_read
        )
        self.holds = TargetHolds(self.journal, self.metrics, lambda: self.config, clock)
        self.held = HeldAlerts()
        self.held_release = HeldRelease(
            self.held,
            self.fleet.controls,
            clock,
            judge=self.handle,
            acts=lambda: self.kube is None or self.kube.acting,
            held_targets=lambda now: self.holds.follow(now).keys(),
        )
        self.background = BackgroundActions(self.journal, self.metrics, self.fleet, clock)
        self.background.close_interrupted()

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
        if self.kube is not None:
            return self.kube.pool_members(target)
        return tuple(t.name for t in self.config.targets if t.pool == target.pool)

    @property
    def actions(self) -> set[asyncio.Task[None]]:
        """The restart actions running in the background."""
        return self.background.tasks

    @property
    def acting(self) -> set[str]:
        """Targets whose restart action is running now: one action per target at a time."""
        return self.background.acting

    def apply(self, config: RestarterConfig) -> None:
        """Decide with `config` from now on (a reload); decisions under way finish as begun."""
        if self.kube is not None:  # with the pod targets the allow-rules resolved
            config = self.kube.effective(config)
        self.config = config
        for target in config.targets:
            self.locks.setdefault(target.name, asyncio.Lock())
        self.metrics.add_targets(config)
        self.holds.refresh_gauges()
        self._lookback = lookback_seconds(config)

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
                own_restarts=lambda since: self.journal.restarts_since(
                    since, dry_run=self.config.dry_run
                ),
                on_event=lambda result: self.metrics.kube_events.labels(result=result).inc(),
            )
            await self.kube.start()
        self.background.start(self._session, self.kube)
        self.held_release.start()

    async def stop(self) -> None:
        await self.held_release.stop()
        await self.windows.stop()
        await self.background.finish()
        if self.kube is not None:
            await self.kube.stop()
        await self.background.close()
        if self._session is not None:
            await self._session.close()
        self.journal.close()

    async def wait_for_actions(self) -> None:
        """Wait until every background action has finished and journaled its result."""
        await self.background.wait()

    def _history(self, alert: Alert, now: float, holds: Mapping[str, Hold]) -> History:
        history = self.journal.history(
            alert, since=now - self._lookback, dry_run=self.config.dry_run
        )
        history = replace(self.fleet.with_fleet(history, now), holds=holds)
        if self.kube is None:
            return history
        # Restarts an earlier Lease holder decided count as if this replica had.
        shared = self.kube.shared_restarts()
        return replace(history, restarts=merge_restarts(history.restarts, shared))

    def _metric_target(self, alert: Alert) -> str:
        name = alert.target
        return name if name is not None and self.config.target(name) else UNCONFIGURED_TARGET

    async def handle(self, notification: Notification) -> list[dict[str, str]]:
        """Judge every alert of a notification and journal each decision.

        The alerts that need no confirmation are judged first, in batches written in one
        commit each; the rest then wait for their target's confirmation, the alerts of
        different targets concurrently. An alert whose decision the journal could not record
        is answered `journal_unwritable` and not acted on.
        """
        delivered = notification
        if self.kube is not None:
            notification, refusals = await self.kube.resolve_notification(notification)
            self._refusals.update(refusals)
            self.apply(self.kube.config)
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
        outcomes: list[Decision | _Pending | None] = []
        for start in range(0, len(alerts), JUDGED_PER_COMMIT):
            batch = alerts[start : start + JUDGED_PER_COMMIT]
            try:
                with self.journal.transaction():
                    judged = [self._judge_at_once(alert, notification, holds) for alert in batch]
            except JournalError as error:
                judged = [self._unrecorded(alert, error) for alert in batch]
            outcomes.extend(judged)
            if start + JUDGED_PER_COMMIT < len(alerts):
                await asyncio.sleep(0)
        waiting = [index for index, outcome in enumerate(outcomes) if outcome is PENDING]
        confirmed = await asyncio.gather(
            *(self._judge_recorded(alerts[index], notification, holds) for index in waiting)
        )
        for index, decision in zip(waiting, confirmed, strict=True):
            outcomes[index] = decision
        now = self.clock()
        for alert, as_judged, outcome in zip(delivered.alerts, alerts, outcomes, strict=True):
            if not isinstance(outcome, _Pending):
                until = waits_until(self.windows, self.holds.current(now), as_judged, outcome)
                self.held.note(alert, outcome, delivered, now, until)
        return [
            {
                "alertname": alert.alertname,
                "target": alert.target or "",
                "decision": "resolved" if decision is None else decision.action,
                "reason": "resolved" if decision is None else decision.reason,
            }
            for alert, decision in zip(alerts, outcomes, strict=True)
            if not isinstance(decision, _Pending)
        ]

    async def release_held(self) -> int:
        """Judge the held alerts again if no pause and no open breaker refuses them now (and
        this replica acts); how many were judged."""
        return await self.held_release.release()

    def _judge_at_once(
        self, alert: Alert, notification: Notification, holds: Mapping[str, Hold]
    ) -> Decision | _Pending | None:
        """Judge an alert that needs no confirmation (PENDING: one that does)."""
        if alert.status == "resolved":
            self._resolve(alert, notification)
            return None
        refusal = self._refusals.pop((alert.fingerprint, alert.starts_at), None)
        if refusal is not None:  # no allow-rule lets this alert restart its pod
            return self._conclude(alert, refusal, notification, None)
        target = self.config.target(alert.target) if alert.target else None
        now = self.clock()
        decision = decide(alert, self.config, self._history(alert, now, holds), now)
        if decision.restarts and target is not None and target.name not in self.acting:
            return PENDING
        return self._conclude(alert, decision, notification, target)

    async def _judge_recorded(
        self, alert: Alert, notification: Notification, holds: Mapping[str, Hold]
    ) -> Decision | None:
        try:
            return await self.judge(alert, notification, holds)
        except JournalError as error:
            return self._unrecorded(alert, error)

    def _unrecorded(self, alert: Alert, error: JournalError) -> Decision:
        """The answer for an alert whose decision could not be journaled: nothing is run."""
        self.metrics.skips.labels(
            target=self._metric_target(alert), reason=JOURNAL_UNWRITABLE
        ).inc()
        log.error(
            "%s target=%s alert=%s fingerprint=%s: not acted on: %s",
            JOURNAL_UNWRITABLE,
            printable(alert.target or ""),
            printable(alert.alertname),
            printable(alert.fingerprint),
            error,
        )
        return Decision("skip", JOURNAL_UNWRITABLE, f"not acted on: {error}")

    def _journal(
        self, alert: Alert, decision: Decision | None, notification: Notification, now: float
    ) -> int:
        return self.journal.record_decision(
            alert,
            decision,
            now,
            receiver=notification.receiver,
            external_url=notification.external_url,
        )

    def _resolve(self, alert: Alert, notification: Notification) -> None:
        target = self.config.target(alert.target) if alert.target else None
        self.windows.resolve(
            alert,
            target,
            lambda decision: self._journal(alert, decision, notification, self.clock()),
            self._metric_target(alert),
        )

    def _fresh_read(self, target: Target) -> Awaitable[ReadResult] | None:
        """One read of the target's metrics (None: not started, nothing to read with)."""
        if self._session is None:
            return None
        timeout = self.config.confirm.timeout
        return read_metrics(self._session, target.metrics_url, timeout=timeout)

    async def judge(
        self,
        alert: Alert,
        notification: Notification,
        holds: Mapping[str, Hold] | None = None,
    ) -> Decision | None:
        """Decide about one alert and journal the decision (None: a resolved alert).

        `holds`: the holds as its notification found them (None: followed now).
        """
        asked_at = time.monotonic()
        if alert.status == "resolved":
            self._resolve(alert, notification)
            return None
        if holds is None:
            holds = self.holds.follow(self.clock())
        target = self.config.target(alert.target) if alert.target else None
        if target is None:
            now = self.clock()
            return self._conclude(
                alert,
                decide(alert, self.config, self._history(alert, now, holds), now),
                notification,
                None,
            )
        async with self.locks[target.name]:
            now = self.clock()
            decision = decide(alert, self.config, self._history(alert, now, holds), now)
            if not decision.restarts:
                return self._conclude(alert, decision, notification, target)
            confirmation = await self.confirmations.confirm(
                self.session, target, self.config.confirm, asked_at
            )
            # Other targets may have restarted, and a hold may have been taken, during the
            # reads: check again, and write the decision with no await in between, so no
            # other decision can slip in.
            now = self.clock()
            history = self._history(alert, now, self.holds.follow(now))
            decision = decide_confirmed(alert, self.config, history, now, confirmation)
            decision = self.windows.apply(alert, target, decision, confirmation, now)
            return self._conclude(alert, decision, notification, target)

    def _conclude(
        self,
        alert: Alert,
        decision: Decision,
        notification: Notification,
        target: Target | None,
    ) -> Decision:
        if decision.restarts and target is not None and target.name in self.acting:
            decision = Decision(
                "skip",
                ACTION_IN_PROGRESS,
                f"the restart action of {target.name} is still running; one at a time",
            )
        now = self.clock()
        row_id = self._journal(alert, decision, notification, now)
        log.info(
            "%s target=%s alert=%s fingerprint=%s reason=%s: %s",
            decision.action,
            printable(alert.target or ""),
            printable(alert.alertname),
            printable(alert.fingerprint),
            decision.reason,
            printable(decision.detail),
            extra={
                "decision": decision.action,
                "target": alert.target or "",
                "alertname": alert.alertname,
                "fingerprint": alert.fingerprint,
                "reason": decision.reason,
                "journal_row": row_id,
            },
        )
        if self.kube is not None:
            self.kube.on_decision(alert, decision, target)
        if not decision.restarts or target is None:
            self.metrics.skips.labels(
                target=self._metric_target(alert), reason=decision.reason
            ).inc()
            return decision
        self.metrics.last_restart.labels(target=target.name).set(now)
        self.background.launch(row_id, target)
        return decision

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
        self.metrics.held_alerts.set(len(self.held))
        self.fleet.refresh_gauges()
        self.holds.refresh_gauges()
