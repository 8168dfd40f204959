"""The restarter's fleet safety at the edge: what it has seen stall, the breaker and the pause
switch in the journal, their gauges, and measuring a restarted model's load time.

Where the restarter learns how many servers are stalled at once: from the restart alerts it
receives. A target counts as stalled from the moment its firing alert arrives until its
resolved notification, or for `mass_stall.window` with no news (a lost resolved notification
must not hold the fleet forever). The firing alerts are read from the journal once, when the
first notification comes (so a restarted restarter still knows them), and followed in memory
from then on: every delivery is a journal row, and a query per delivery made a storm of
duplicates cost more per delivery the longer it lasted. The decisions come from
`stallwatch.core.fleet`; this module only reads and writes the journal.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import aiohttp

from stallwatch.common.restarter_config import RestarterConfig, Target
from stallwatch.common.text import printable
from stallwatch.core.alerts import Notification, episode_before
from stallwatch.core.fleet import Controls, breaker_trip, current_controls
from stallwatch.core.policy import History
from stallwatch.net.fetch import read_metrics
from stallwatch.restarter.journal import Journal
from stallwatch.restarter.metrics import RestarterMetrics

log = logging.getLogger("stallwatch.restarter")

# After a restart of a `cooldown: auto` target, its /metrics is read this often until it
# answers with engine metrics (the model is loaded), for at most its `cooldown_auto.max`.
LOAD_POLL_SECONDS = 5.0
# How far back the firing alerts are read at start, and kept: beyond any sensible
# `mass_stall.window`, so a window lengthened by a reload still finds them.
FIRING_LOOKBACK_SECONDS = 86400.0


@dataclass(frozen=True)
class _StalledAnswer:
    """`FleetGuard.stalled` as computed at `computed_at`: true until `valid_until` (the first
    moment an alert it counts leaves the window), for this config and these firing alerts."""

    config: RestarterConfig
    version: int
    computed_at: float
    valid_until: float
    targets: frozenset[str]


class FleetGuard:
    """Fleet state for one restarter: seen stalls, breaker, pause, load times."""

    def __init__(
        self,
        journal: Journal,
        metrics: RestarterMetrics,
        config: Callable[[], RestarterConfig],
        clock: Callable[[], float],
    ) -> None:
        self.journal = journal
        self.metrics = metrics
        self._config = config
        self.clock = clock
        # Firing restart alerts not resolved: (target, fingerprint) -> time last seen; None
        # until read from the journal.
        self._firing: dict[tuple[str, str], float] | None = None
        # The episode (startsAt) of each firing alert seen in a notification: a resolved notice
        # of an earlier episode of the same alert does not end the current one.
        self._episodes: dict[tuple[str, str], str] = {}
        # Bumped whenever `_firing` changes: what a cached `stalled` answer was computed from.
        self._firing_version = 0
        self._stalled: _StalledAnswer | None = None

    def _kept_since(self, config: RestarterConfig, now: float) -> float:
        return now - max(config.mass_stall.window, FIRING_LOOKBACK_SECONDS)

    def _firing_alerts(self) -> dict[tuple[str, str], float]:
        if self._firing is None:
            config = self._config()
            since = self._kept_since(config, self.clock())
            self._firing = self.journal.firing_alerts(since, config.restart_alerts)
            self._firing_version += 1
        return self._firing

    def controls(self, now: float) -> Controls:
        """The breaker and the pause switch as the journal has them now."""
        return current_controls(self.journal.controls(), now)

    def notice(self, notification: Notification) -> None:
        """Count the notification's restart alerts as stalls (or their end), then see whether
        the breaker must open, before any of them is judged."""
        config = self._config()
        now = self.clock()
        firing = self._firing_alerts()
        self._firing_version += 1
        for alert in notification.alerts:
            name = alert.target
            if alert.alertname not in config.restart_alerts or name is None:
                continue
            if config.target(name) is None:
                continue
            key = (name, alert.fingerprint)
            if alert.status == "resolved":
                current = self._episodes.get(key)
                if current is not None and episode_before(alert.starts_at, current):
                    continue  # a late notice about an episode that ended before this one began
                firing.pop(key, None)
                self._episodes.pop(key, None)
            else:
                firing[key] = now
                self._episodes[key] = alert.starts_at
        since = self._kept_since(config, now)
        for key in [key for key, at in firing.items() if at <= since]:
            del firing[key]
            self._episodes.pop(key, None)
        self.check_breaker()

    def stalled(self, now: float) -> frozenset[str]:
        """The configured targets with a firing restart alert seen within `mass_stall.window`.

        Every alert judged asks this, so the answer is kept until the firing alerts or the
        config change, or one of the alerts it counts grows older than the window: a
        notification (or a release) of thousands of alerts reads them once, not once per alert.
        """
        config = self._config()
        firing = self._firing_alerts()
        cached = self._stalled
        if (
            cached is not None
            and cached.config is config
            and cached.version == self._firing_version
            and cached.computed_at <= now < cached.valid_until
        ):
            return cached.targets
        window = config.mass_stall.window
        names = {target.name for target in config.targets}
        counted = [(name, at) for (name, _), at in firing.items() if at > now - window]
        targets = frozenset(name for name, at in counted if name in names)
        valid_until = min((at + window for name, at in counted if name in names), default=math.inf)
        self._stalled = _StalledAnswer(config, self._firing_version, now, valid_until, targets)
        return targets

    def with_fleet(self, history: History, now: float) -> History:
        """`history` with what the fleet rules read: stalls, controls, load times."""
        return replace(
            history,
            stalled=self.stalled(now),
            controls=self.controls(now),
            load_seconds=self.journal.load_times(),
        )

    def check_breaker(self) -> None:
        """Open (journal) the breaker when a mass stall or failed actions in a row say so."""
        config = self._config()
        now = self.clock()
        if self.controls(now).breaker_open:
            return
        failed = self.journal.failed_actions_in_a_row(max(config.breaker.failed_actions, 1))
        why = breaker_trip(config, self.stalled(now), len(config.targets), failed)
        if why is None:
            return
        self.journal.record_control("breaker_open", why, now)
        self.metrics.breaker_open.set(1)
        log.error("breaker_open: %s; no restarts until `stallwatch restarter resume`", why)

    def pause(self, duration: float | None, detail: str) -> None:
        self.journal.record_control("paused", detail, self.clock(), duration=duration)
        self.refresh_gauges()
        length = "until resumed" if duration is None else f"for {duration:g} s"
        log.warning("paused %s: %s", length, printable(detail))

    def resume(self, detail: str) -> None:
        self.journal.record_control("resumed", detail, self.clock())
        self.refresh_gauges()
        log.warning("resumed (breaker closed, pause ended): %s", printable(detail))

    def refresh_gauges(self) -> None:
        now = self.clock()
        controls = self.controls(now)
        self.metrics.breaker_open.set(1 if controls.breaker_open else 0)
        self.metrics.paused.set(1 if controls.paused(now) else 0)
        self.metrics.stalled_targets.set(len(self.stalled(now)))
        for name, seconds in self.journal.load_times().items():
            if self._config().target(name) is not None:
                self.metrics.load_seconds.labels(target=name).set(seconds)

    async def measure_load(
        self, session: aiohttp.ClientSession, restart_id: int, target: Target, started: float
    ) -> None:
        """Read the restarted target until it serves engine metrics; journal how long it took."""
        auto = target.cooldown_auto
        if auto is None:
            return
        timeout = self._config().confirm.timeout
        while self.clock() - started < auto.max:
            result = await read_metrics(session, target.metrics_url, timeout=timeout)
            if result.reading is not None and result.reading.has_engines:
                seconds = self.clock() - started
                self.journal.record_load_time(restart_id, seconds, self.clock())
                self.metrics.load_seconds.labels(target=target.name).set(seconds)
                log.info("load_measured target=%s seconds=%.0f", printable(target.name), seconds)
                return
            await asyncio.sleep(LOAD_POLL_SECONDS)
        log.warning(
            "load_measured target=%s: no engine metrics within %g s; cooldown stays at its "
            "last measurement",
            printable(target.name),
            auto.max,
        )
