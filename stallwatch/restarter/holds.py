"""The targets' holds ("silent for up to N"): taken over HTTP or from the command line, kept in
the journal and followed in memory. What a hold means is `stallwatch.core.holds`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType

from stallwatch.common.restarter_config import RestarterConfig
from stallwatch.common.text import printable
from stallwatch.core.holds import NO_HOLDS, Hold, folded, hold_refusal, in_force
from stallwatch.restarter.journal import Journal
from stallwatch.restarter.metrics import RestarterMetrics

log = logging.getLogger("stallwatch.restarter")


class TargetHolds:
    """Holds taken over HTTP or from the command line, kept in the journal and followed in
    memory: `follow` reads only the hold rows written since its last look (the command line
    writes them from another process), `current` answers from memory."""

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
        self._shown: set[str] = set()
        self._holds: Mapping[str, Hold] = NO_HOLDS
        self._last_row = 0

    def follow(self, now: float) -> Mapping[str, Hold]:
        """Take in the hold rows written since the last look; the holds in force at `now`."""
        since = now - self._config().max_hold - 1.0  # no hold lasts longer than max_hold
        events, self._last_row = self.journal.hold_events_after(self._last_row, since)
        holds = folded(self._holds, events)
        self._holds = MappingProxyType({k: h for k, h in holds.items() if h.until > now})
        return self.current(now)

    def current(self, now: float) -> Mapping[str, Hold]:
        """The holds in force at `now`, as last followed (no journal read)."""
        return in_force(self._holds, now)

    def hold(self, target: str, duration: float, detail: str) -> str | None:
        """Hold `target` for `duration` seconds; why not (None: held)."""
        refusal = hold_refusal(duration, self._config().max_hold)
        if refusal is not None:
            return refusal
        now = self.clock()
        self.journal.record_hold("hold", target, detail, now, duration=duration)
        self.refresh_gauges()
        log.warning("hold target=%s for %g s: %s", printable(target), duration, printable(detail))
        return None

    def release(self, target: str, detail: str) -> bool:
        """End `target`'s hold; whether it had one."""
        now = self.clock()
        if target not in self.follow(now):
            return False
        self.journal.record_hold("hold_released", target, detail, now)
        self.refresh_gauges()
        log.warning("hold_released target=%s: %s", printable(target), printable(detail))
        return True

    def refresh_gauges(self) -> None:
        holds = self.follow(self.clock())
        for name in self._shown - set(holds):
            self.metrics.hold_expiry.remove(name)
        for name, hold in holds.items():
            self.metrics.hold_expiry.labels(target=name).set(hold.until)
        self._shown = set(holds)
