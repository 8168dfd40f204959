"""Stallwatch on the fleet: coarse exporter states, the real alert rules, the real restarter.

The exporter's judgement is coarse (the state a poll would reach, from the server's true
state, instead of `classify` on counters), but everything after it is the project's own code:
`restart_alert_fires` for the alert rules (with the hold clause), and the restarter's own alert
plans (`core/alert_plan.py`) driven on the virtual clock by `replay/restarter.py`, with one
`History` shared by the whole fleet (restarts, stalled targets, breaker, holds from
`current_holds`). The confirmation and quarantine reads are coarse too (from the true state: a
step counter that moves only while a server serves). Alertmanager groups by alert name and
target (as shipped), so each server's alert has its own group_wait; a server out of rotation
gets no new users' requests.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, replace

from stallwatch.common.exporter_config import DEFAULT_TEST_REQUEST_MIN_INTERVAL_SECONDS
from stallwatch.common.restarter_config import (
    Breaker,
    CommandAction,
    ConfirmSettings,
    MassStall,
    RestarterConfig,
    Target,
)
from stallwatch.core.alerts import Alert
from stallwatch.core.classify import State
from stallwatch.core.confirmation import Confirmation, FailedRead, ReadAttempt
from stallwatch.core.fleet import Controls, breaker_trip
from stallwatch.core.holds import Hold, HoldEvent, current_holds
from stallwatch.core.policy import (
    History,
)
from stallwatch.core.reading import EngineSample, Reading
from stallwatch.core.rules import RESTART_ALERT_STATES, restart_alert_fires
from stallwatch.replay.clock import Scheduler, rfc3339
from stallwatch.replay.fleet_plan import FleetPlan
from stallwatch.replay.fleet_state import FleetState, WayTally
from stallwatch.replay.restarter import VirtualRestarter

ACTION_SECONDS = 2.0
# The states a restart rule watches: in any other, no rule fires.
WATCHED_STATES = frozenset(RESTART_ALERT_STATES.values())


def target_name(server: int) -> str:
    return f"server-{server}"


def hold_events(plan: FleetPlan) -> tuple[HoldEvent, ...]:
    """The trainers' holds, as the restarter's journal keeps them: one before each held weight
    sync, released when it ends (time order)."""
    config = plan.config
    events = []
    for silence in plan.silences:
        if silence.held:
            name = target_name(silence.server)
            duration = max(silence.seconds, config.weight_sync_hold_seconds)
            events.append(HoldEvent("hold", name, silence.start, duration, "weight sync"))
            events.append(HoldEvent("hold_released", name, silence.end, 0.0, "weight sync done"))
    return tuple(sorted(events, key=lambda event: event.time))


def fleet_restarter_config(
    plan: FleetPlan, fleet_rules: bool, restart_after: float | None = None
) -> RestarterConfig:
    """The shipped defaults for every server; without fleet rules, no mass-stall cap and no
    breaker (`max_in_flight` and `fleet_window` stay: they are older than the fleet rules).
    `restart_after`: the restart window (None: the plan's config says)."""
    config = plan.config
    window = config.restart_after if restart_after is None else restart_after
    targets = tuple(
        Target(
            name=target_name(server),
            metrics_url=f"http://{target_name(server)}:8000/metrics",
            action=CommandAction(argv=("true",)),
            cooldown=config.cooldown,
            restart_after=window,
        )
        for server in range(config.servers)
    )
    restarter = RestarterConfig(
        targets=targets,
        journal="fleet-replay",
        insecure_no_auth=True,
        confirm=ConfirmSettings(gap=config.confirm_gap),
    )
    if not fleet_rules:
        restarter = replace(
            restarter,
            mass_stall=MassStall(max_percent=100),
            breaker=Breaker(on_mass_stall=False, failed_actions=0),
        )
    return restarter


@dataclass
class _Episode:
    starts_at: float
    last_sent: float | None = None
    alert: Alert | None = None  # as last delivered


class FleetStallwatch:
    """Exporter polls, alert rules, Alertmanager timing and one restarter for the whole fleet."""

    def __init__(
        self, plan: FleetPlan, fleet_rules: bool, restart_after: float | None = None
    ) -> None:
        self.plan = plan
        self.config = plan.config
        self.fleet = FleetState(plan)
        self.restarter_config = fleet_restarter_config(plan, fleet_rules, restart_after)
        self.restart_after = self.restarter_config.targets[0].restart_after
        self.name = (
            "stallwatch with fleet rules" if fleet_rules else "stallwatch without fleet rules"
        )
        if self.restart_after <= 0:
            self.name += ", two-poll rule"
        self.hold_events = hold_events(plan)
        self._hold_times = [event.time for event in self.hold_events]
        self._holds_at: tuple[float, Mapping[str, Hold]] = (-1.0, current_holds((), 0.0))
        self.scheduler = Scheduler()
        count = self.config.servers
        self.state: list[State | None] = [None] * count
        self.polls = [0] * count
        self.baseline = [False] * count
        self.proven_alive = [0.0] * count
        self.episodes: dict[tuple[int, str], _Episode] = {}
        self.seen_stalled: dict[str, float] = {}
        self.controls = Controls()
        self.breaker_openings = 0
        self._servers = {target_name(server): server for server in range(count)}
        self._steps = [0] * count
        self._started: dict[int, float] = {}
        self.restarter = VirtualRestarter(
            self.restarter_config,
            self.scheduler,
            self,
            confirm_gap=self.config.confirm_gap,
            action_seconds=ACTION_SECONDS,
        )
        self.fleet.out_of_rotation = self._out_of_rotation

    def run(self) -> WayTally:
        self.scheduler.at(0.0, self._tick)
        for when in self.plan.exporter_restarts:
            self.scheduler.at(when, self._exporter_restart)
        while self.scheduler.next_time() < self.config.duration:
            when, action = self.scheduler.pop()
            action(when)
        self.fleet.advance(self.config.duration)
        quarantines = sum(1 for _, c in self.restarter.routing if c.move == "quarantined")
        return self.fleet.tally(
            self.name,
            dict(self.restarter.skips),
            self.restart_after,
            self.fleet.stuck_traffic(quarantines),
        )

    def holds(self, now: float) -> Mapping[str, Hold]:
        """The holds in force at `now`: the journal's hold rows from `max_hold` before it up to
        it, as `TargetHolds.current` reads them."""
        if self._holds_at[0] != now:
            since = now - self.restarter_config.max_hold - 1.0
            rows = self.hold_events[
                bisect.bisect_left(self._hold_times, since) : bisect.bisect_right(
                    self._hold_times, now
                )
            ]
            self._holds_at = (now, current_holds(rows, now))
        return self._holds_at[1]

    # The exporter: one poll of every server per interval.

    def _exporter_down(self, now: float) -> bool:
        length = self.config.exporter_restart_seconds
        return any(start <= now < start + length for start in self.plan.exporter_restarts)

    def _exporter_restart(self, now: float) -> None:
        """Every server's history is lost; its series vanish, so every alert resolves."""
        self.state = [None] * self.config.servers
        self.polls = [0] * self.config.servers
        self.baseline = [False] * self.config.servers
        for server, alertname in list(self.episodes):
            self._resolve(server, alertname, now)

    def _observe(self, server: int, now: float) -> State:
        """The state the exporter's poll would reach (coarse, from the server's true state)."""
        fleet = self.fleet
        if fleet.loading(server, now):
            self.baseline[server] = False
            return State.DOWN
        if self.plan.blipped(server, now):
            return State.HUNG  # connected, then no answer in time
        if not self.baseline[server]:
            self.baseline[server] = True  # one read: nothing to compare with yet
            return State.UNKNOWN
        hang = fleet.hang[server]
        if hang is not None and hang.running_at_hang:
            return State.STALLED  # running > 0, nothing moves
        silence = fleet.silent(server, now)
        if silence is not None and silence.running_at_start:
            return State.STALLED  # frozen with work present, until it goes on by itself
        if hang is None and silence is None and self.plan.busy(server, now):
            self.proven_alive[server] = now
            return State.BUSY
        if now - self.proven_alive[server] < DEFAULT_TEST_REQUEST_MIN_INTERVAL_SECONDS:
            return State.IDLE  # the idle test request is not due yet
        if hang is not None or silence is not None:
            return State.UNRESPONSIVE  # the test request fails
        self.proven_alive[server] = now
        return State.IDLE

    def _tick(self, now: float) -> None:
        self.scheduler.at(now + self.config.exporter_interval, self._tick)
        self.fleet.advance(now)
        if self._exporter_down(now):
            return
        for server in range(self.config.servers):
            state = self._observe(server, now)
            self.polls[server] = self.polls[server] + 1 if state == self.state[server] else 1
            self.state[server] = state
            self._evaluate(server, now)

    # Prometheus and Alertmanager (group_by alertname and target).

    def _evaluate(self, server: int, now: float) -> None:
        if self.state[server] not in WATCHED_STATES and not (
            self.episodes
            and any((server, alertname) in self.episodes for alertname in RESTART_ALERT_STATES)
        ):
            return  # no rule can fire and none has fired: nothing to evaluate
        held = self.config.rules_hold_clause and target_name(server) in self.holds(now)
        for alertname in RESTART_ALERT_STATES:
            firing = restart_alert_fires(
                alertname, self.state[server], self.polls[server], held=held
            )
            key = (server, alertname)
            episode = self.episodes.get(key)
            if firing and episode is None:
                self.episodes[key] = _Episode(now)
                self.scheduler.at(now + self.config.group_wait, self._notifier(key))
            elif firing and episode is not None and episode.last_sent is not None:
                if now - episode.last_sent >= self.config.repeat_interval:
                    self.scheduler.at(now, self._notifier(key))
            elif not firing and episode is not None:
                self._resolve(server, alertname, now)

    def _resolve(self, server: int, alertname: str, now: float) -> None:
        episode = self.episodes.pop((server, alertname))
        if not any(s == server for s, _ in self.episodes):
            self.seen_stalled.pop(target_name(server), None)
        if episode.alert is not None:
            self.restarter.resolve(episode.alert, now)

    def _notifier(self, key: tuple[int, str]):  # type: ignore[no-untyped-def]
        def notify(now: float) -> None:
            episode = self.episodes.get(key)
            if episode is None or (
                episode.last_sent is not None
                and now - episode.last_sent < self.config.repeat_interval
            ):
                return
            episode.last_sent = now
            server, alertname = key
            name = target_name(server)
            alert = Alert(
                status="firing",
                labels={"alertname": alertname, "target": name, "severity": "critical"},
                fingerprint=f"{alertname}:{name}",
                starts_at=rfc3339(episode.starts_at),
            )
            episode.alert = alert
            self.seen_stalled.setdefault(name, now)
            self._receive(server, alert, now)

        return notify

    # The restarter: the core's alert plans on the virtual clock (`replay/restarter.py`), one
    # for the fleet; its steps answered from the servers' true states (coarse reads).

    def _receive(self, server: int, alert: Alert, now: float) -> None:
        self.restarter.receive(alert, now)

    def restarter_history(self, now: float) -> History:
        window = self.restarter_config.mass_stall.window
        stalled = frozenset(n for n, t in self.seen_stalled.items() if now - t < window)
        history = History(
            stalled=stalled,
            covered=self.config.servers,
            controls=self.controls,
            holds=self.holds(now),
        )
        return self._check_breaker(history, now)

    def _check_breaker(self, history: History, now: float) -> History:
        if self.controls.breaker_open:
            return history
        why = breaker_trip(self.restarter_config, history.stalled, history.covered, 0)
        if why is None:
            return history
        self.controls = Controls(breaker_opened_at=now, breaker_detail=why)
        self.breaker_openings += 1
        self.scheduler.at(now + self.config.operator_resume_seconds, self._operator_resumes)
        return replace(history, controls=self.controls)

    def _operator_resumes(self, now: float) -> None:
        self.controls = Controls()
        self.restarter.release(now, controls_allow=True)

    def confirm_first(self, target: Target, now: float) -> object:
        return None

    def confirm(self, target: Target, first: object, now: float) -> Confirmation:
        self.fleet.advance(now)
        return self._confirmation(self._server(target), now)

    def fresh_read(self, target: Target, now: float) -> ReadAttempt | None:
        """A coarse reading from the server's true state: one engine whose step counter moves
        while it serves and stays put while it is frozen."""
        self.fleet.advance(now)
        server = self._server(target)
        fleet = self.fleet
        if fleet.loading(server, now):
            return FailedRead("unreachable", "connection refused")
        if self.plan.blipped(server, now):
            return FailedRead("no_answer", "connected, no answer")
        hang = fleet.hang[server]
        silence = fleet.silent(server, now)
        frozen = hang is not None or silence is not None
        running_frozen = (hang is not None and hang.running_at_hang) or (
            hang is None and silence is not None and silence.running_at_start
        )
        busy = not frozen and self.plan.busy(server, now)
        if busy:
            self._steps[server] += 1
        sample = EngineSample(
            model_name="replayed",
            engine="0",
            running=1.0 if running_frozen or busy else 0.0,
            waiting=0.0,
            steps=float(self._steps[server]),
            requests_completed=float(self._steps[server]),
        )
        started = self._started.get(server, 0.0)
        return Reading(taken_at=now, engines=(sample,), process_start_time=started)

    def test_request(self, target: Target, now: float) -> tuple[bool, str]:
        server = self._server(target)
        fleet = self.fleet
        if fleet.loading(server, now) or fleet.hang[server] is not None:
            return False, "no answer"
        if fleet.silent(server, now) is not None:
            return False, "no answer"
        return True, "answered"

    def restart(self, target: Target, now: float) -> None:
        server = self._server(target)
        self._started[server] = now
        self.fleet.restart(server, now)

    def _out_of_rotation(self, server: int) -> bool:
        return target_name(server) in self.restarter.memory.quarantines

    def _server(self, target: Target) -> int:
        return self._servers[target.name]

    def _confirmation(self, server: int, now: float) -> Confirmation:
        """What two fresh reads of the server, `confirm_gap` apart, would show."""
        fleet = self.fleet
        if fleet.loading(server, now):
            return Confirmation(False, "down", "connection refused")
        if self.plan.blipped(server, now):
            return Confirmation(False, "no_answer", "connected, no answer")
        hang = fleet.hang[server]
        silence = fleet.silent(server, now)
        frozen_busy = (hang is not None and hang.running_at_hang) or (
            hang is None and silence is not None and silence.running_at_start
        )
        if frozen_busy:
            return Confirmation(True, None, "requests running, no progress")
        if hang is not None or silence is not None:
            return Confirmation(False, "idle", "no work and nothing moved")
        if self.plan.busy(server, now):
            return Confirmation(False, "progress", "tokens generated")
        return Confirmation(False, "idle", "no work and nothing moved")
