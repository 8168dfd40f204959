"""The restarter on the replay's virtual clock: the core's alert plans (`core/alert_plan.py`)
driven as `restarter/service.py` drives them, their steps answered by a replayed world.

Both replays (one day, the fleet) use this driver, so their figures (restarts, near misses,
time out of rotation) come from the code the restarter runs. What differs from the real
restarter is only time and I/O: a confirmation takes `confirm_gap` virtual seconds and its
reads come from the world; a target's plans run one at a time (the real restarter's lock); an
alert waiting for a time is judged again when it comes; a quarantined target is looked at every
`check_interval`.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from stallwatch.common.restarter_config import RestarterConfig, Target
from stallwatch.core.alert_plan import (
    AlertMemory,
    AlertOutcome,
    AskClock,
    AskHistory,
    AskMemory,
    AskPool,
    AskTestRequest,
    Confirm,
    FreshRead,
    Plan,
    RoutingChange,
    advance,
    due_waiting,
    expedite_holds,
    firing_plan,
    look_plan,
    resolved_plan,
    settle_plan,
    window_alert,
)
from stallwatch.core.alerts import Alert
from stallwatch.core.confirmation import Confirmation, ReadAttempt
from stallwatch.core.policy import Decision, History, PastDecision, PastRestart
from stallwatch.replay.clock import Scheduler


class World(Protocol):
    """What the replayed servers, Prometheus and the operator answer the restarter."""

    def restarter_history(self, now: float) -> History:
        """The world's part of the history at `now`: stalled targets, controls, holds."""
        ...

    def confirm_first(self, target: Target, now: float) -> object:
        """The first of a confirmation's two reads of `target`, at `now`."""
        ...

    def confirm(self, target: Target, first: object, now: float) -> Confirmation:
        """The confirmation: `first`, then a second read at `now`."""
        ...

    def fresh_read(self, target: Target, now: float) -> ReadAttempt | None: ...

    def test_request(self, target: Target, now: float) -> tuple[bool, str]: ...

    def restart(self, target: Target, now: float) -> None:
        """Run the restart action."""
        ...


@dataclass(frozen=True)
class JournalEntry:
    time: float
    target: str
    fingerprint: str
    starts_at: str
    action: str
    reason: str


class VirtualRestarter:
    """One restarter for the replayed servers: its memory, journal and restarts."""

    def __init__(
        self,
        config: RestarterConfig,
        scheduler: Scheduler,
        world: World,
        *,
        confirm_gap: float,
        action_seconds: float,
        release_check_seconds: float = 1.0,
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.world = world
        self.confirm_gap = confirm_gap
        self.action_seconds = action_seconds
        self.release_check_seconds = release_check_seconds
        self._checking_holds = False
        self.memory = AlertMemory()
        self.journal: list[JournalEntry] = []
        self._episodes: dict[tuple[str, str], list[PastDecision]] = {}
        self.past_restarts: list[PastRestart] = []
        self.skips: Counter[str] = Counter()
        self.near_misses: list[float] = []  # how long each window ran before its recovery
        self.routing: list[tuple[float, RoutingChange]] = []
        self._busy: set[str] = set()
        self._queued: dict[str, deque[Callable[[float], None]]] = {}
        self._looking = False

    # The steps.

    def _history(self, alert: Alert, now: float) -> History:
        same = tuple(self._episodes.get((alert.fingerprint, alert.starts_at), ()))
        acting = frozenset(
            past.target
            for past in self.past_restarts
            if past.finished_at is not None and past.finished_at > now
        )
        return replace(
            self.world.restarter_history(now),
            restarts=tuple(self.past_restarts),
            same_alert=same,
            acting=acting,
        )

    def _answer(self, step: object, now: float) -> object:
        match step:
            case AskClock():
                return now
            case AskHistory(alert=alert, now=at):
                return self._history(alert, at)
            case AskMemory():
                return self.memory
            case AskPool(target=target):
                return tuple(t.name for t in self.config.targets if t.pool == target.pool)
            case FreshRead(target=target):
                return self.world.fresh_read(target, now)
            case AskTestRequest(target=target):
                return self.world.test_request(target, now)
        raise TypeError(f"a step the replay does not answer: {step!r}")

    def _drive(
        self, plan: Plan, answer: object, now: float, done: Callable[[AlertOutcome, float], None]
    ) -> None:
        """Answer `plan`'s steps at `now`; a confirmation goes on `confirm_gap` later."""
        step = advance(plan, answer)
        while not isinstance(step, AlertOutcome):
            if isinstance(step, Confirm):
                target = step.target
                first = self.world.confirm_first(target, now)

                def confirmed(later: float, target: Target = target, first: object = first) -> None:
                    self._drive(plan, self.world.confirm(target, first, later), later, done)

                self.scheduler.at(now + self.confirm_gap, confirmed)
                return
            step = advance(plan, self._answer(step, now))
        done(step, now)

    # One plan of a target at a time, as under the restarter's lock.

    def _locked(self, target: str | None, run: Callable[[float], None], now: float) -> None:
        if target is None:
            run(now)
            return
        if target in self._busy:
            self._queued.setdefault(target, deque()).append(run)
            return
        self._busy.add(target)
        run(now)

    def _unlock(self, target: str | None, now: float) -> None:
        if target is None:
            return
        queued = self._queued.get(target)
        if queued:
            self.scheduler.at(now, queued.popleft())
            return
        self._busy.discard(target)

    # What the webhook brings.

    def receive(self, alert: Alert, now: float) -> None:
        """A firing alert delivered (or one judged again)."""
        name = alert.target if self.config.target(alert.target or "") else None

        def run(at: float) -> None:
            plan = firing_plan(alert, self.config, self.config.quarantine)
            self._drive(plan, None, at, lambda o, t: self._concluded(alert, o, t, name))

        self._locked(name, run, now)

    def resolve(self, alert: Alert, now: float) -> None:
        """A restart alert resolved."""
        plan = resolved_plan(alert, self.config)
        self._drive(plan, None, now, lambda o, t: self._concluded(alert, o, t, None))

    def _concluded(self, alert: Alert, outcome: AlertOutcome, now: float, lock: str | None) -> None:
        self.memory = outcome.applied(self.memory, now)
        decision = outcome.decision
        target = self.config.target(outcome.target) if outcome.target else None
        if decision is not None:
            self._record(alert, decision, now)
            if decision.restarts and target is not None:
                self.past_restarts.append(PastRestart(target.name, now, now + self.action_seconds))
                self.world.restart(target, now)
        self._effects(outcome, now)
        if outcome.alert is not None:
            waiting = self.memory.waiting.get(outcome.alert)
            if waiting is not None and waiting.until is not None:
                self.scheduler.at(waiting.until, self.release)
            if waiting is not None and waiting.reason == "on_hold" and not self._checking_holds:
                self._checking_holds = True
                self.scheduler.at(now + self.release_check_seconds, self._check_holds)
        settling = self.config.target(outcome.settle) if outcome.settle else None
        if settling is not None:
            self._locked(settling.name, lambda at: self._settle(alert, settling, at), now)
        self._unlock(lock, now)

    def _settle(self, alert: Alert, target: Target, now: float) -> None:
        def done(outcome: AlertOutcome, at: float) -> None:
            self.memory = outcome.applied(self.memory, at)
            if outcome.settled is not None:
                self._record(alert, outcome.settled, at)
            self._effects(outcome, at)
            self._unlock(target.name, at)

        self._drive(settle_plan(target), None, now, done)

    def _record(self, alert: Alert, decision: Decision, now: float) -> None:
        self.journal.append(
            JournalEntry(
                now,
                alert.target or "",
                alert.fingerprint,
                alert.starts_at,
                decision.action,
                decision.reason,
            )
        )
        episode = self._episodes.setdefault((alert.fingerprint, alert.starts_at), [])
        episode.append(PastDecision(now, decision.action, decision.reason))
        if decision.action == "skip":
            self.skips[decision.reason] += 1

    def _effects(self, outcome: AlertOutcome, now: float) -> None:
        for change in outcome.routing:
            self.routing.append((now, change))
        if outcome.near_miss is not None:
            self.near_misses.append(now - outcome.near_miss.opened_at)
        if self.memory.quarantines and not self._looking:
            self._looking = True
            self.scheduler.at(now + self.config.quarantine.check_interval, self._look)

    def release(self, now: float, controls_allow: bool = True) -> None:
        """Judge again the waiting alerts due at `now`."""
        due, self.memory = due_waiting(self.memory, now, controls_allow)
        for waiting in due:
            self.receive(waiting.alert, now)

    def _check_holds(self, now: float) -> None:
        """Every release check while an alert waits on a hold: a hold released early frees its
        alerts at once (as `restarter/waiting.py` does)."""
        self.memory = expedite_holds(self.memory, set(self.world.restarter_history(now).holds), now)
        self.release(now)
        self._checking_holds = any(w.reason == "on_hold" for w in self.memory.waiting.values())
        if self._checking_holds:
            self.scheduler.at(now + self.release_check_seconds, self._check_holds)

    def _look(self, now: float) -> None:
        """Every `check_interval` while any target is out of rotation: one look at each."""
        for name in list(self.memory.quarantines):
            target = self.config.target(name)
            if target is None:
                continue

            def run(at: float, target: Target = target) -> None:
                def done(outcome: AlertOutcome, later: float) -> None:
                    self.memory = outcome.applied(self.memory, later)
                    if outcome.settled is not None and outcome.near_miss is not None:
                        alert = window_alert(outcome.near_miss)
                        self._record(alert, outcome.settled, later)
                    self._effects(outcome, later)
                    self._unlock(target.name, later)

                self._drive(look_plan(target, self.config.quarantine), None, at, done)

            self._locked(target.name, run, now)
        self._looking = bool(self.memory.quarantines)
        if self._looking:
            self.scheduler.at(now + self.config.quarantine.check_interval, self._look)

    def out_of_rotation(self, target: str, now: float) -> bool:
        """Whether routers skip `target` at `now`."""
        return target in self.memory.quarantines
