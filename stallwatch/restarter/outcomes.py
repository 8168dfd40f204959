"""What the restarter does with an alert plan's outcome: the memory it changes (and the window
rows that let a restarted restarter go on), the decision journaled and logged, the skip counted
or the restart action launched, the routing changes handed on, a settling read started."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal, Protocol

from stallwatch.common.restarter_config import RestarterConfig, Target
from stallwatch.common.text import printable
from stallwatch.core.alert_plan import (
    FORGET_WINDOW_AFTER_SECONDS,
    AlertMemory,
    AlertOutcome,
    restored_memory,
    window_change,
)
from stallwatch.core.alerts import Alert, Notification
from stallwatch.core.policy import Decision
from stallwatch.restarter.background import BackgroundActions
from stallwatch.restarter.journal import Journal
from stallwatch.restarter.journal_reader import (
    JournalError,
)
from stallwatch.restarter.metrics import RestarterMetrics
from stallwatch.restarter.rotation import Rotation
from stallwatch.restarter.waiting import WaitingAlerts

if TYPE_CHECKING:
    from stallwatch.restarter.platform import Platform

log = logging.getLogger("stallwatch.restarter")

# A decision the journal could not record (nothing is run unrecorded).
JOURNAL_UNWRITABLE: Literal["journal_unwritable"] = "journal_unwritable"


class Owner(Protocol):
    """What of the restarter the outcomes use."""

    memory: AlertMemory
    config: RestarterConfig
    journal: Journal
    metrics: RestarterMetrics
    platform: Platform
    background: BackgroundActions
    rotation: Rotation
    waiting: WaitingAlerts

    def clock(self) -> float: ...

    def metric_target(self, alert: Alert) -> str: ...

    def settle_later(self, target: Target, alert: Alert, notification: Notification) -> None: ...


class Outcomes:
    def __init__(self, owner: Owner) -> None:
        self.owner = owner

    def unrecorded(self, alert: Alert, error: JournalError) -> Decision:
        """The answer for an alert whose decision could not be journaled: nothing is run."""
        self.owner.metrics.skips.labels(
            target=self.owner.metric_target(alert), reason=JOURNAL_UNWRITABLE
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

    def conclude(
        self, given: Alert, alert: Alert, outcome: AlertOutcome, notification: Notification
    ) -> Decision | None:
        """Apply an outcome: the memory, the journal, the routing changes, the action."""
        now = self.owner.clock()
        self.apply(outcome, alert.alertname, now)
        self.owner.waiting.remember(given, outcome, notification)
        # The outcome names the target it judged (none: an allow-rule refused the alert first).
        target = self.owner.config.target(outcome.target) if outcome.target else None
        decision = outcome.decision
        if decision is None:
            self.owner.journal.record_decision(
                alert,
                None,
                now,
                receiver=notification.receiver,
                external_url=notification.external_url,
            )
            self.owner.metrics.resolved.labels(target=self.owner.metric_target(alert)).inc()
            log.info(
                "resolved target=%s alert=%s fingerprint=%s (journaled, not acted on)",
                printable(alert.target or ""),
                printable(alert.alertname),
                printable(alert.fingerprint),
            )
        else:
            row_id = self.owner.journal.record_decision(
                alert,
                decision,
                now,
                receiver=notification.receiver,
                external_url=notification.external_url,
            )
            self._log_decision(alert, decision, row_id)
            self.owner.platform.on_decision(alert, decision, target)
            if decision.restarts and target is not None:
                self.owner.metrics.last_restart.labels(target=target.name).set(now)
                self.owner.background.launch(row_id, target)
            else:
                self.owner.metrics.skips.labels(
                    target=self.owner.metric_target(alert), reason=decision.reason
                ).inc()
        self.owner.rotation.effects(outcome, alert, notification, now)
        settling = self.owner.config.target(outcome.settle) if outcome.settle else None
        if settling is not None:
            self.owner.settle_later(settling, alert, notification)
        self.owner.metrics.restart_windows.set(len(self.owner.memory.windows))
        self.owner.metrics.held_alerts.set(len(self.owner.memory.waiting))
        return decision

    def apply(self, outcome: AlertOutcome, alertname: str, now: float) -> None:
        """The outcome's changes to the memory, and a journal row for a window that opened or
        closed (so a restarted restarter goes on with it)."""
        name = outcome.target
        before = self.owner.memory.windows.get(name) if name else None
        self.owner.memory = outcome.applied(self.owner.memory, now)
        after = self.owner.memory.windows.get(name) if name else None
        change = window_change(before, after)
        if change is not None:
            kind, window = change
            self.owner.journal.record_window(kind, window, alertname, now)

    def _log_decision(self, alert: Alert, decision: Decision, row_id: int) -> None:
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

    def restored_windows(self, memory: AlertMemory) -> AlertMemory:
        """The windows the journal says were open, with their alerts waiting for their ends."""
        now = self.owner.clock()
        longest = max((t.restart_after for t in self.owner.config.targets), default=0.0)
        try:
            events = self.owner.journal.window_events(now - longest - FORGET_WINDOW_AFTER_SECONDS)
        except JournalError as error:
            log.error("restart windows not read back from the journal: %s", error)
            return memory
        restored = restored_memory(memory, events, self.owner.config, now)
        for name in sorted(set(restored.windows) - set(memory.windows)):
            log.warning(
                "restart window target=%s read back from the journal: its alert is judged "
                "again when it ends",
                printable(name),
            )
        return restored
