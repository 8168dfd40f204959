"""One way's view of the fleet: a coarse per-server state (busy, idle, hung, loading) and its tally.

Each way of watching the fleet gets its own `FleetState` over the same `FleetPlan`: the plan
says when servers turn busy or idle and when hangs strike; the way's restarts change the rest
(a restart ends a hang and loads the model, refusing requests meanwhile).
"""

from __future__ import annotations

from dataclasses import dataclass

from stallwatch.replay.fleet_plan import FleetPlan


@dataclass
class FleetHang:
    """One hang that struck a server under this way: its cause, and when a restart ended it."""

    server: int
    started_at: float
    cause: str  # independent, bad_node
    running_at_hang: bool  # the running gauge stayed above 0 (hung while busy)
    caught_after: float | None = None


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
        self.loading_until = [0.0] * count
        self.hangs: list[FleetHang] = []
        self.healthy_restarts = 0
        self.healthy_restarts_in_blips = 0
        self.hung_restarts = 0
        self.failed = 0.0
        self.hung_seconds = 0.0
        self._next_hang = 0
        self._advanced_to = 0.0

    def advance(self, now: float) -> None:
        """Count the requests lost since the last call, then let the hangs due by `now` strike."""
        config = self.config
        span = now - self._advanced_to
        if span > 0:
            for server in range(config.servers):
                hung = self.hang[server] is not None
                if hung or self.loading_until[server] > self._advanced_to:
                    rate = (
                        config.requests_per_minute_busy
                        if self.plan.busy(server, self._advanced_to)
                        else config.requests_per_minute_idle
                    )
                    self.failed += rate * span / 60.0
                if hung:
                    self.hung_seconds += span
            self._advanced_to = now
        for server, hang in enumerate(self.hang):
            if hang is not None and now - hang.started_at >= config.person_notices_seconds:
                self.hang[server] = None  # a person restarts it; no watchdog caught it
                self.loading_until[server] = now + config.restart_load_seconds
        hangs = self.plan.hangs
        while self._next_hang < len(hangs) and hangs[self._next_hang][0] <= now:
            when, server, cause = hangs[self._next_hang]
            self._next_hang += 1
            if self.hang[server] is not None or self.loading_until[server] > when:
                continue  # already down: the fault has nothing left to break
            busy = self.plan.busy(server, when)
            hang = FleetHang(server, when, cause, running_at_hang=busy)
            self.hang[server] = hang
            self.hangs.append(hang)
            if busy:
                self.failed += config.running_when_busy

    def loading(self, server: int, now: float) -> bool:
        return self.loading_until[server] > now

    def busy(self, server: int, now: float) -> bool:
        """Busy with real work (a healthy server in a busy spell)."""
        return (
            self.hang[server] is None
            and not self.loading(server, now)
            and self.plan.busy(server, now)
        )

    def restart(self, server: int, now: float) -> None:
        hang = self.hang[server]
        if hang is not None:
            hang.caught_after = now - hang.started_at
            self.hang[server] = None
            self.hung_restarts += 1
        else:
            self.healthy_restarts += 1
            if self.plan.in_blip(now):
                self.healthy_restarts_in_blips += 1
            if self.busy(server, now):
                self.failed += self.config.running_when_busy
        self.loading_until[server] = now + self.config.restart_load_seconds

    def tally(self, name: str, skips: dict[str, int] | None = None) -> WayTally:
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
        )
