"""One way's view of the fleet: a coarse per-server state (busy, idle, hung, silent, loading) and
its tally.

Each way of watching the fleet gets its own `FleetState` over the same `FleetPlan`: the plan
says when servers turn busy or idle and when hangs and legitimate silences strike; the way's
restarts change the rest (a restart ends a hang, or cuts a silence short, and loads the model,
refusing requests meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stallwatch.replay.fleet_plan import FleetPlan, PlannedSilence


@dataclass
class FleetHang:
    """One hang that struck a server under this way: its cause, and when a restart ended it."""

    server: int
    started_at: float
    cause: str  # independent, bad_node
    running_at_hang: bool  # the running gauge stayed above 0 (hung while busy)
    caught_after: float | None = None


@dataclass
class FleetSilence:
    """One legitimate silence that struck a server under this way, and whether a restart cut it
    short (a false restart: it would have ended by itself)."""

    planned: PlannedSilence
    running_at_start: bool  # work present: the frozen gauges read running > 0 (stalled)
    restarted_after: float | None = None


@dataclass(frozen=True)
class StuckTraffic:
    """Users' traffic to hung servers, with quarantine and (counterfactually) without it."""

    requests: float
    request_seconds: float
    requests_without_quarantine: float
    request_seconds_without_quarantine: float
    healthy_minutes_out: float
    quarantines: int


@dataclass(frozen=True)
class WayTally:
    """What one way did over the run."""

    name: str
    healthy_restarts: int
    healthy_restarts_in_blips: int
    hung_restarts: int
    hangs: tuple[FleetHang, ...]
    requests_failed: int
    minutes_hung: float
    skips: dict[str, int]
    silences: tuple[FleetSilence, ...] = ()
    restart_after: float | None = None  # stallwatch's restart window (None: not stallwatch)
    # Users' requests sent to hung servers (in rotation), and the request-seconds they spent
    # there until the hang ended; the same without quarantine (a hung server in rotation until
    # it is restarted); the healthy server-minutes quarantines took out of rotation.
    stuck: StuckTraffic | None = None

    @property
    def restarts_in_silences(self) -> int:
        """Healthy restarts of a server in a legitimate silence."""
        return sum(1 for silence in self.silences if silence.restarted_after is not None)

    @property
    def recovered_in_window(self) -> int:
        """Near misses: confirmed stalls that recovered inside their restart window."""
        return self.skips.get("recovered_in_window", 0)

    @property
    def hangs_caught(self) -> int:
        return sum(1 for hang in self.hangs if hang.caught_after is not None)

    def catch_seconds(self) -> list[float]:
        return sorted(h.caught_after for h in self.hangs if h.caught_after is not None)


class FleetState:
    """The servers' true state under one way, advanced in time order."""

    def __init__(self, plan: FleetPlan) -> None:
        self.plan = plan
        self.config = plan.config
        count = self.config.servers
        self.hang: list[FleetHang | None] = [None] * count
        self.silence: list[FleetSilence | None] = [None] * count
        self.silences: list[FleetSilence] = []
        self.starts = 0
        self._next_silence = 0
        self.loading_until = [0.0] * count
        self.hangs: list[FleetHang] = []
        self.healthy_restarts = 0
        self.healthy_restarts_in_blips = 0
        self.hung_restarts = 0
        self.failed = 0.0
        self.hung_seconds = 0.0
        self._next_hang = 0
        self._advanced_to = 0.0
        # Out of users' rotation (the way's quarantine; none for the other ways).
        self.out_of_rotation: Callable[[int], bool] = _in_rotation
        # Requests in flight on each hung server, with quarantine and without.
        self._stuck = [0.0] * count
        self._stuck_without = [0.0] * count
        self.stuck_requests = 0.0
        self.stuck_request_seconds = 0.0
        self.stuck_requests_without = 0.0
        self.stuck_request_seconds_without = 0.0
        self.healthy_seconds_out = 0.0

    def advance(self, now: float) -> None:
        """Count the requests lost since the last call, then let the hangs due by `now` strike."""
        config = self.config
        span = now - self._advanced_to
        if span > 0:
            for server in range(config.servers):
                hung = self.hang[server] is not None
                out = self.out_of_rotation(server)
                rate = (
                    config.requests_per_minute_busy
                    if self.plan.busy(server, self._advanced_to)
                    else config.requests_per_minute_idle
                )
                arrivals = rate * span / 60.0
                if (hung and not out) or self.loading_until[server] > self._advanced_to:
                    self.failed += arrivals
                if hung:
                    self.hung_seconds += span
                    self._count_stuck(server, arrivals, 0.0 if out else arrivals, span)
                elif out:
                    self.healthy_seconds_out += span
            self._advanced_to = now
        for server, silence in enumerate(self.silence):
            if silence is not None and now >= silence.planned.end:
                self.silence[server] = None  # it ended by itself
        for server, hang in enumerate(self.hang):
            if hang is not None and now - hang.started_at >= config.person_notices_seconds:
                self.hang[server] = None  # a person restarts it; no watchdog caught it
                self._hang_ended(server)
                self.loading_until[server] = (
                    now + config.restart_load_seconds + self.plan.autotune(self.starts)
                )
                self.starts += 1
        hangs = self.plan.hangs
        while self._next_hang < len(hangs) and hangs[self._next_hang][0] <= now:
            when, server, cause = hangs[self._next_hang]
            self._next_hang += 1
            if self.hang[server] is not None or self.loading_until[server] > when:
                continue  # already down: the fault has nothing left to break
            busy = self.plan.busy(server, when)
            hang = FleetHang(server, when, cause, running_at_hang=busy)
            self.hang[server] = hang
            self.silence[server] = None  # a hung engine ends no silence by itself
            self.hangs.append(hang)
            if busy:
                self.failed += config.running_when_busy
        silences = self.plan.silences
        while self._next_silence < len(silences) and silences[self._next_silence].start <= now:
            planned = silences[self._next_silence]
            self._next_silence += 1
            server = planned.server
            if now >= planned.end or self.hang[server] is not None:
                continue
            if self.loading_until[server] > planned.start:
                continue  # a server not up has nothing to compile or sync
            current = self.silence[server]
            if current is not None and current.planned.end >= planned.end:
                continue  # inside a longer silence
            silence = FleetSilence(planned, self.plan.busy(server, planned.start))
            self.silence[server] = silence
            self.silences.append(silence)

    def _count_stuck(self, server: int, without: float, sent: float, span: float) -> None:
        """Requests arriving at a hung server over `span` wait there until the hang ends."""
        self.stuck_requests_without += without
        self.stuck_request_seconds_without += (self._stuck_without[server] + without / 2) * span
        self._stuck_without[server] += without
        self.stuck_requests += sent
        self.stuck_request_seconds += (self._stuck[server] + sent / 2) * span
        self._stuck[server] += sent

    def _hang_ended(self, server: int) -> None:
        self._stuck[server] = 0.0
        self._stuck_without[server] = 0.0

    def loading(self, server: int, now: float) -> bool:
        return self.loading_until[server] > now

    def busy(self, server: int, now: float) -> bool:
        """Busy with real work (a healthy server in a busy spell; a silent one serves later)."""
        return (
            self.hang[server] is None
            and not self.loading(server, now)
            and self.plan.busy(server, now)
        )

    def silent(self, server: int, now: float) -> FleetSilence | None:
        """The legitimate silence the server is in now, if any."""
        silence = self.silence[server]
        if silence is None or not silence.planned.start <= now < silence.planned.end:
            return None
        return silence

    def restart(self, server: int, now: float) -> None:
        hang = self.hang[server]
        silence = self.silent(server, now)
        self.silence[server] = None
        if hang is not None:
            hang.caught_after = now - hang.started_at
            self.hang[server] = None
            self._hang_ended(server)
            self.hung_restarts += 1
        else:
            self.healthy_restarts += 1
            if self.plan.in_blip(now):
                self.healthy_restarts_in_blips += 1
            if silence is not None:
                silence.restarted_after = now - silence.planned.start
                if silence.running_at_start:
                    self.failed += self.config.running_when_busy
            elif self.busy(server, now):
                self.failed += self.config.running_when_busy
        # The weights load, then the autotune and graph capture: vLLM opens its port after both.
        self.loading_until[server] = (
            now + self.config.restart_load_seconds + self.plan.autotune(self.starts)
        )
        self.starts += 1

    def stuck_traffic(self, quarantines: int) -> StuckTraffic:
        return StuckTraffic(
            requests=self.stuck_requests,
            request_seconds=self.stuck_request_seconds,
            requests_without_quarantine=self.stuck_requests_without,
            request_seconds_without_quarantine=self.stuck_request_seconds_without,
            healthy_minutes_out=self.healthy_seconds_out / 60.0,
            quarantines=quarantines,
        )

    def tally(
        self,
        name: str,
        skips: dict[str, int] | None = None,
        restart_after: float | None = None,
        stuck: StuckTraffic | None = None,
    ) -> WayTally:
        self.advance(self.config.duration)
        return WayTally(
            name=name,
            healthy_restarts=self.healthy_restarts,
            healthy_restarts_in_blips=self.healthy_restarts_in_blips,
            hung_restarts=self.hung_restarts,
            hangs=tuple(self.hangs),
            requests_failed=round(self.failed),
            minutes_hung=self.hung_seconds / 60.0,
            skips=dict(sorted((skips or {}).items())),
            silences=tuple(self.silences),
            restart_after=restart_after,
            stuck=stuck,
        )


def _in_rotation(server: int) -> bool:
    """No way but stallwatch's takes a server out of rotation."""
    del server
    return False
