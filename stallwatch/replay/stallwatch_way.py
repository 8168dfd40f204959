"""The new way: stallwatch's own decision code, with Prometheus and Alertmanager timing modelled.

Every decision is the project's own pure step: the exporter's poll plan (`core/poll_plan.py`,
the same the exporter drives; its steps answered by the simulated server) and `TargetHistory`;
the restart alerts' condition (`restart_alerts`, with the hold clause on the scraped hold
gauge); and the restarter's own alert plans (`core/alert_plan.py`: the cheap checks, two fresh
reads, the restart window, the quarantine) driven on the virtual clock by `replay/restarter.py`
as the restarter drives them. Only the timing of Prometheus (scrape, evaluation) and
Alertmanager (group_wait, group_interval, repeat_interval) is modelled here.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import assert_never

from stallwatch.common.exporter_config import IdleTestRequestConfig, TargetConfig
from stallwatch.common.restart_limits import Budget
from stallwatch.common.restarter_config import (
    CommandAction,
    ConfirmSettings,
    RestarterConfig,
    Target,
)
from stallwatch.core.alerts import Alert
from stallwatch.core.classify import State
from stallwatch.core.confirmation import (
    Confirmation,
    FailedRead,
    ReadAttempt,
    judge_attempts,
    worth_a_second_read,
)
from stallwatch.core.history import PollOutcome, TargetHistory
from stallwatch.core.holds import current_holds
from stallwatch.core.policy import (
    History,
)
from stallwatch.core.poll_plan import (
    AskFaults,
    AskModels,
    AskSleeps,
    Plan,
    PollResult,
    ReadMetrics,
    SendTestRequest,
    advance,
    poll_plan,
)
from stallwatch.core.reading import Reading
from stallwatch.core.reads import (
    ModelsAnswer,
    ReadResult,
    TestRequestResult,
)
from stallwatch.core.rules import ADMISSION_STALLED_ALERT, DEGRADED_ALERT, restart_alerts
from stallwatch.replay.clock import Scheduler, rfc3339
from stallwatch.replay.config import ReplayConfig
from stallwatch.replay.degraded import DegradedAlert
from stallwatch.replay.restarter import VirtualRestarter
from stallwatch.replay.server import TARGET_NAME, SimulatedServer

# The degradation alerts of prometheus/alerts.yml, for people only: the reasons each watches
# and its `for:` (a unit test holds them to the rule file).
DEGRADATION_RULES: dict[str, tuple[frozenset[str], float]] = {
    ADMISSION_STALLED_ALERT: (frozenset({"admission_stalled"}), 60.0),
    DEGRADED_ALERT: (
        frozenset({"throughput_collapse", "preemption_storm", "queue_time"}),
        300.0,
    ),
}


def exporter_target(config: ReplayConfig) -> TargetConfig:
    """The exporter's target for the replayed server (its shipped defaults, kind vllm)."""
    return TargetConfig(
        name=TARGET_NAME,
        url="http://replayed-server:8000",
        kind="vllm",
        interval_seconds=config.exporter_interval,
        test_request=IdleTestRequestConfig(
            timeout_seconds=config.test_request_timeout,
            min_interval_seconds=config.test_request_min_interval,
        ),
    )


def restarter_config(config: ReplayConfig) -> RestarterConfig:
    """The restarter's configuration for the replayed server (its shipped defaults)."""
    target = Target(
        name=TARGET_NAME,
        metrics_url="http://model-server:8000/metrics",
        action=CommandAction(argv=("systemctl", "restart", "model-server")),
        cooldown=config.cooldown,
        budget=Budget(max_restarts=config.budget_max_restarts, window=config.budget_window),
        restart_after=config.restart_after,
    )
    return RestarterConfig(
        targets=(target,),
        journal="replay",
        insecure_no_auth=True,
        confirm=ConfirmSettings(gap=config.confirm_gap),
    )


@dataclass
class _Episode:
    alertname: str
    starts_at: float
    last_sent: float | None = None
    alert: Alert | None = None  # as last delivered


class Stallwatch:
    """Exporter, alert rule, Alertmanager timing and restarter, on the virtual clock."""

    def __init__(self, server: SimulatedServer, scheduler: Scheduler, rng: random.Random) -> None:
        self.server = server
        self.scheduler = scheduler
        self.config = server.config
        self.restarter_config = restarter_config(self.config)
        self.target = exporter_target(self.config)
        self.history = TargetHistory()
        # What Prometheus last scraped: the exporter's state and count, the restarter's hold
        # expiry gauge (None: no hold published).
        self.scraped: tuple[State | None, int, float | None] = (None, 0, None)
        self.episodes: dict[str, _Episode] = {}
        self.last_flush: dict[str, float] = {}
        self.restarter = VirtualRestarter(
            self.restarter_config,
            scheduler,
            self,
            confirm_gap=self.config.confirm_gap,
            action_seconds=self.config.action_seconds,
            release_check_seconds=self.config.release_check_seconds,
        )
        self._polling = False
        # Degradation alerts, for people: what Prometheus last scraped, each rule's pending
        # start, and every firing episode as [alertname, fired at, resolved at or None].
        self.scraped_degraded: tuple[str, ...] = ()
        self.degraded_pending: dict[str, float] = {}
        self.degraded_alerts: list[DegradedAlert] = []
        scheduler.at(rng.uniform(0, self.config.exporter_interval), self._poll)
        scheduler.at(rng.uniform(0, self.config.scrape_interval), self._scrape)
        scheduler.at(rng.uniform(0, self.config.evaluation_interval), self._evaluate)

    # The exporter: the core's poll plan, its steps answered by the simulated server.

    def _poll(self, now: float) -> None:
        self.scheduler.at(now + self.config.exporter_interval, self._poll)
        if self._polling:  # the previous poll still waits for its test request: skip a tick
            return
        self._polling = True
        plan = poll_plan(
            self.target,
            self.history.baseline,
            now,
            last_proven_alive_at=self.history.last_proven_alive_at,
        )
        self._drive(plan, None, now, now)

    def _drive(self, plan: Plan, answer: object, started: float, now: float) -> None:
        """Answer the plan's steps at `now` until it waits for a test request or ends."""
        while not isinstance(step := advance(plan, answer), PollResult):
            match step:
                case ReadMetrics():
                    reading = self.server.read(now)
                    answer = (
                        ReadResult(reading)
                        if reading is not None
                        else ReadResult(None, "connection", "connection refused")
                    )
                case AskModels():
                    up = self.server.read(now) is not None
                    answer = (
                        ModelsAnswer(200, ("vllm",), listed=True)
                        if up
                        else ModelsAnswer(error_reason="connection", detail="connection refused")
                    )
                case AskFaults():
                    answer = ()  # the replayed server runs without --enable-fault-tolerance
                case AskSleeps():
                    answer = None
                case SendTestRequest():
                    self._send_test_request(plan, started, now)
                    return
                case _:
                    assert_never(step)
        self._polling = False
        self._finish_poll(
            PollOutcome(
                step.verdict,
                step.reading,
                now,
                now - started,
                test_requests_sent=step.test_requests_sent,
                test_requests_failed=step.test_requests_failed,
                error_reason=step.error_reason,
                test_request_deferred=step.test_request_deferred,
            )
        )

    def _send_test_request(self, plan: Plan, started: float, now: float) -> None:
        answered: list[int] = []
        request_id = self.server.submit(
            "test", 1, 1, now, lambda _t, status: answered.append(status)
        )

        def settle(later: float) -> None:
            ok = bool(answered) and answered[0] == 200
            if not ok and request_id is not None:
                self.server.give_up(request_id)
            result = TestRequestResult(ok, "answered" if ok else "no answer")
            self._drive(plan, result, started, later)

        if request_id is None:
            settle(now)
        else:
            # The answer comes within one step when the engine works; give it until the timeout.
            self.scheduler.at(now + self.config.test_request_timeout, settle)

    def _finish_poll(self, outcome: PollOutcome) -> None:
        self.history = self.history.advance(outcome)

    # Prometheus: scrape the exporter, evaluate the alert rules.

    def _scrape(self, now: float) -> None:
        self.scheduler.at(now + self.config.scrape_interval, self._scrape)
        hold = current_holds(self.server.hold_events, now).get(TARGET_NAME)
        expiry = None if hold is None else hold.until
        self.scraped = (self.history.state, self.history.state_polls, expiry)
        self.scraped_degraded = self.history.degradation.reasons

    def _evaluate(self, now: float) -> None:
        self.scheduler.at(now + self.config.evaluation_interval, self._evaluate)
        self._evaluate_degraded(now)
        state, polls, expiry = self.scraped
        held = self.config.rules_hold_clause and expiry is not None and expiry > now
        for alertname, is_firing in restart_alerts(state, polls, held=held).items():
            episode = self.episodes.get(alertname)
            if is_firing and episode is None:
                episode = _Episode(alertname, now)
                self.episodes[alertname] = episode
                self._schedule_flush(alertname, now + self.config.group_wait)
            elif is_firing and episode is not None and episode.last_sent is not None:
                if now - episode.last_sent >= self.config.repeat_interval:
                    self._schedule_flush(alertname, now)
            elif not is_firing and episode is not None:
                del self.episodes[alertname]  # resolved: journaled, never acted on
                if episode.alert is not None:
                    self._resolved(episode.alert, now)

    def _evaluate_degraded(self, now: float) -> None:
        """The degradation rules with their `for:`; they go to people, never to the restarter."""
        for alertname, (reasons, hold_for) in DEGRADATION_RULES.items():
            active = any(reason in reasons for reason in self.scraped_degraded)
            firing = next(
                (
                    alert
                    for alert in self.degraded_alerts
                    if alert.alertname == alertname and alert.resolved_at is None
                ),
                None,
            )
            if not active:
                self.degraded_pending.pop(alertname, None)
                if firing is not None:
                    firing.resolved_at = now
                continue
            since = self.degraded_pending.setdefault(alertname, now)
            if firing is None and now - since >= hold_for:
                self.degraded_alerts.append(DegradedAlert(alertname, now))

    # Alertmanager: one group per alert name and target.

    def _schedule_flush(self, alertname: str, earliest: float) -> None:
        last = self.last_flush.get(alertname)
        when = earliest if last is None else max(earliest, last + self.config.group_interval)
        self.scheduler.at(when, lambda now: self._notify(alertname, now))

    def _notify(self, alertname: str, now: float) -> None:
        episode = self.episodes.get(alertname)
        if episode is None or (
            episode.last_sent is not None and now - episode.last_sent < self.config.repeat_interval
        ):
            return
        episode.last_sent = now
        self.last_flush[alertname] = now
        alert = Alert(
            status="firing",
            labels={"alertname": alertname, "target": TARGET_NAME, "severity": "critical"},
            fingerprint=f"{alertname}:{TARGET_NAME}",
            starts_at=rfc3339(episode.starts_at),
        )
        episode.alert = alert
        self._receive(alert, now)

    # The restarter: the core's alert plans on the virtual clock (`replay/restarter.py`), its
    # steps answered by the replayed server.

    @property
    def skips(self) -> Counter[str]:
        return self.restarter.skips

    @property
    def near_misses(self) -> list[float]:
        return self.restarter.near_misses

    def restarter_history(self, now: float) -> History:
        return History(holds=current_holds(self.server.hold_events, now))

    def confirm_first(self, target: Target, now: float) -> ReadAttempt:
        return self._attempt(now)

    def confirm(self, target: Target, first: object, now: float) -> Confirmation:
        assert isinstance(first, (Reading, FailedRead))
        if not worth_a_second_read(first):
            return judge_attempts(first, None)
        return judge_attempts(first, self._attempt(now))

    def fresh_read(self, target: Target, now: float) -> ReadAttempt | None:
        return self._attempt(now)

    def test_request(self, target: Target, now: float) -> tuple[bool, str]:
        reading = self.server.read(now)
        if reading is None or self.server.frozen:
            return False, "no answer"
        return True, "answered"

    def restart(self, target: Target, now: float) -> None:
        self.server.restart(now, "stallwatch")

    def _attempt(self, now: float) -> ReadAttempt:
        reading = self.server.read(now)
        return FailedRead("unreachable", "connection refused") if reading is None else reading

    def _receive(self, alert: Alert, now: float) -> None:
        self.restarter.receive(alert, now)

    def _resolved(self, alert: Alert, now: float) -> None:
        self.restarter.resolve(alert, now)
