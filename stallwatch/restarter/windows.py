"""The restart windows open now, and the targets' holds: the restarter's memory and journal for
"wait before acting". The decisions are `stallwatch.core.restart_window` and `core.holds`.

A window is the target's: a restart alert that resolves while nothing moved (one slow poll read
`hung`, then `stalled` again) leaves it open, and the next alert goes on in it. Windows live in
memory: after a restart of the restarter, the next delivery of a still-firing alert opens its
window again (a stall is then restarted later, never sooner).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from types import MappingProxyType
from typing import Any

from stallwatch.common.restarter_config import RestarterConfig, Target
from stallwatch.core.alerts import Alert
from stallwatch.core.confirmation import Confirmation
from stallwatch.core.holds import NO_HOLDS, Hold, folded, hold_refusal, in_force
from stallwatch.core.policy import Decision, alert_key
from stallwatch.core.poll_plan import ReadResult
from stallwatch.core.reading import Reading
from stallwatch.core.restart_window import RestartWindow, moved_since, with_window
from stallwatch.restarter.journal import Journal
from stallwatch.restarter.journal_reader import JournalError, printable
from stallwatch.restarter.metrics import RestarterMetrics

log = logging.getLogger("stallwatch.restarter")

# A window nobody judged again for this long past its end is forgotten (its alert was lost).
FORGET_AFTER_SECONDS = 3600.0


class RestartWindows:
    """The windows of confirmed stalls, by target."""

    def __init__(
        self,
        metrics: RestarterMetrics,
        *,
        clock: Callable[[], float] = time.time,
        locks: Mapping[str, asyncio.Lock] | None = None,
        fresh_read: Callable[[Target], Awaitable[ReadResult] | None] = lambda _: None,
    ) -> None:
        """`locks`: the targets' locks (a settling read holds its target's); `fresh_read`: one
        read of a target's metrics (None: none can be made, the window is left as it is)."""
        self.metrics = metrics
        self.clock = clock
        self._locks = locks if locks is not None else {}
        self._fresh_read = fresh_read
        self._open: dict[str, RestartWindow] = {}
        self._longest: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._open)

    def later(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` (a settling read) in the background; errors are logged, not raised."""
        task = asyncio.create_task(self._logged(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _logged(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except JournalError as error:
            log.error("restart window not settled: %s", error)
        except Exception:  # a bug in one settling must not go unseen
            log.exception("restart window not settled")

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def settled(self) -> None:
        """Wait for the settling reads under way (for tests)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def due_at(self, alert: Alert) -> float | None:
        window = self._open.get(alert.target or "")
        return None if window is None else window.due_at

    def open_for(self, target: str) -> RestartWindow | None:
        return self._open.get(target)

    def apply(
        self,
        alert: Alert,
        target: Target,
        decision: Decision,
        confirmation: Confirmation,
        now: float,
    ) -> Decision:
        """The decision once the alert's window has had its say (see `with_window`)."""
        windowed = with_window(
            decision,
            self._open.get(target.name),
            alert=alert_key(alert),
            target=target,
            confirmation=confirmation,
            now=now,
        )
        if windowed.window is None:
            self._open.pop(target.name, None)
        else:
            self._open[target.name] = windowed.window
        if windowed.recovered is not None:
            self._count_recovered(windowed.recovered, now)
        self._forget_stale(now)
        return windowed.decision

    def resolve(
        self,
        alert: Alert,
        target: Target | None,
        record: Callable[[Decision | None], object],
        metric_target: str,
    ) -> None:
        """A restart alert resolved: `record` it (None), count it, and when its target has an
        open window, settle that window with one fresh read in the background."""
        record(None)
        window = self.open_for(target.name) if target is not None else None
        if target is not None and window is not None and target.name in self._locks:
            self.later(self._settle(window, target, record))
        self.metrics.resolved.labels(target=metric_target).inc()
        log.info(
            "resolved target=%s alert=%s fingerprint=%s (journaled, not acted on)",
            printable(alert.target or ""),
            printable(alert.alertname),
            printable(alert.fingerprint),
        )

    async def _settle(
        self, window: RestartWindow, target: Target, record: Callable[[Decision | None], object]
    ) -> None:
        """One fresh read once a windowed alert resolved: a near miss if the server moved."""
        async with self._locks[target.name]:
            if self.open_for(target.name) is not window:
                return  # judged meanwhile
            read = self._fresh_read(target)
            if read is None:
                return
            result = await read
            record(self.settle_resolved(window, result.reading, result.detail, self.clock()))

    def settle_resolved(
        self, window: RestartWindow, reading: Reading | None, detail: str, now: float
    ) -> Decision:
        """A restart alert of the window's target resolved, and one fresh read says whether the
        server moved since the window opened: then the window closes as a recovery (a near
        miss); if nothing moved, it stays open for the next alert of the target."""
        lasted = f"{now - window.opened_at:.0f} s into its {window.restart_after:g} s window"
        moved = moved_since(window.first, reading)
        if reading is not None and moved is None:
            return Decision(
                "skip",
                "restart_window",
                f"the alert resolved {lasted}, but nothing moved since the window opened: "
                "the window stays open for the target's next alert",
            )
        if self._open.get(window.target) is window:
            del self._open[window.target]
        self.metrics.restart_windows.set(len(self._open))
        if reading is None:
            return Decision(
                "skip",
                "recovered_in_window",
                f"the alert resolved {lasted}; the server no longer answers ({detail}): its "
                "window is closed, a new stall opens a new one",
            )
        self._count_recovered(window, now)
        return Decision(
            "skip",
            "recovered_in_window",
            f"the alert resolved {lasted} and the server moved ({moved}): it recovered by "
            "itself and was not restarted",
        )

    def _count_recovered(self, window: RestartWindow, now: float) -> None:
        lasted = now - window.opened_at
        self.metrics.recovered_in_window.labels(target=window.target).inc()
        if lasted > self._longest.get(window.target, -1.0):
            self._longest[window.target] = lasted
            self.metrics.longest_recovered.labels(target=window.target).set(lasted)
        log.warning(
            "recovered_in_window target=%s: the stall ended %.0f s into its %g s restart "
            "window (a restart now would have been false)",
            printable(window.target),
            lasted,
            window.restart_after,
            extra={"target": window.target, "seconds": round(lasted, 3)},
        )

    def _forget_stale(self, now: float) -> None:
        stale = [k for k, w in self._open.items() if now > w.due_at + FORGET_AFTER_SECONDS]
        for key in stale:
            del self._open[key]
        self.metrics.restart_windows.set(len(self._open))


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


def waits_until(
    windows: RestartWindows,
    holds: Mapping[str, Hold],
    alert: Alert,
    decision: Decision | None,
) -> float | None:
    """When an alert that waits for a time is to be judged again (None: it does not)."""
    if decision is None:
        return None
    if decision.reason == "restart_window":
        return windows.due_at(alert)
    if decision.reason == "on_hold" and alert.target is not None:
        hold = holds.get(alert.target)
        return None if hold is None else hold.until
    return None
