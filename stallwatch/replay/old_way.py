"""The old way: watchdogs that send real requests, and one that restarts on HTTP 500s."""

from __future__ import annotations

import math

from stallwatch.replay.clock import Scheduler
from stallwatch.replay.server import SimulatedServer


class RequestWatchdog:
    """Sends a real request every `interval`; restarts after `failures` failures in a row."""

    def __init__(
        self,
        name: str,
        server: SimulatedServer,
        scheduler: Scheduler,
        *,
        interval: float,
        timeout: float,
        failures: int,
        phase: float,
        skip_when_busy_flag: bool,
    ) -> None:
        self.name = name
        self.server = server
        self.scheduler = scheduler
        self.interval = interval
        self.timeout = timeout
        self.failures_to_restart = failures
        self.skip_when_busy_flag = skip_when_busy_flag
        self.streak = 0
        scheduler.at(phase, self._check)

    def _check(self, now: float) -> None:
        self.scheduler.at(now + self.interval, self._check)
        config = self.server.config
        if self.skip_when_busy_flag and config.busy_flag_set:
            return
        if not self.server.is_up(now):  # /health is down: the server is starting, not failing
            return
        answered: list[int] = []
        request_id = self.server.submit(
            "test", 30, config.check_max_tokens, now, lambda _t, status: answered.append(status)
        )

        def judge(later: float) -> None:
            ok = bool(answered) and answered[0] == 200
            if not answered and request_id is not None:
                self.server.give_up(request_id)
            self._result(later, ok)

        if request_id is None:
            self._result(now, False)
        else:
            self.scheduler.at(now + self.timeout, judge)

    def _result(self, now: float, ok: bool) -> None:
        self.streak = 0 if ok else self.streak + 1
        if self.streak >= self.failures_to_restart:
            self.streak = 0
            self.server.restart(now, self.name)


class ErrorWatchdog:
    """Restarts on HTTP 500s: the more errors in its window, the fewer checks it waits."""

    def __init__(self, server: SimulatedServer, scheduler: Scheduler, phase: float) -> None:
        self.server = server
        self.scheduler = scheduler
        self.streak = 0
        self.last_restart = -math.inf
        scheduler.at(phase, self._check)

    def _check(self, now: float) -> None:
        config = self.server.config
        self.scheduler.at(now + config.error_check_interval, self._check)
        if not self.server.is_up(now):
            return
        since = max(now - config.error_window, self.last_restart)
        errors = sum(1 for t in self.server.error_times if t > since)
        if errors == 0:
            self.streak = 0
            return
        self.streak += 1
        if self.streak >= math.ceil(config.error_pressure / errors):
            self.streak = 0
            self.last_restart = now
            self.server.restart(now, "http-500 watchdog")
