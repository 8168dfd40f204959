"""One alert's life as a plan: each step asks the driver for what the decision needs (the clock,
the journal's history, two confirming reads, a settling read, a look at a quarantined target,
one test request), the last is the outcome. No I/O: the restarter (`restarter/alerts.py`) and
both replays drive the same plans, so none of them decides an alert itself (a unit test holds
it), and the figures the replays publish come from the code the restarter runs.

The life of a restart alert: the cheap checks (`policy.decide`); when they pass, two fresh reads
confirm the stall and the checks run again (`decide_confirmed`); the restart window
(`restart_window.with_window`) then acts, or waits and takes the target out of users' rotation
(`quarantine`), or closes as a near miss when the server moved. An alert refused by a pause or
the breaker, or waiting for its window's or its hold's end, waits to be judged again; a resolved
alert settles its target's window with one fresh read; a quarantined target is looked at every
few seconds until it moves, passes a test request, is restarted, or its quarantine expires.

The state between alerts, `AlertMemory`, is a frozen value: the windows by target, the waiting
alerts by episode, the quarantines by target. An outcome says what changes for its own target and
alert only, so the plans of different targets can run at once.
"""

from __future__ import annotations

from collections.abc import Collection, Generator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal, TypeVar

from stallwatch.common.quarantine_config import QuarantineSettings
from stallwatch.common.restarter_config import RestarterConfig, Target
from stallwatch.core.alerts import Alert, episode_before
from stallwatch.core.confirmation import Confirmation, FailedRead, ReadAttempt
from stallwatch.core.policy import (
    Decision,
    History,
    alert_key,
    decide,
    decide_confirmed,
)
from stallwatch.core.quarantine import (
    NO_QUARANTINES,
    Look,
    Quarantine,
    QuarantineReason,
    QuarantineRefusal,
    ReleaseReason,
    after_test_request,
    look,
    quarantine_refusal,
    quarantined,
    restarting,
)
from stallwatch.core.reading import Reading
from stallwatch.core.restart_window import RestartWindow, moved_since, with_window

# A restart action of the target is still running: one at a time, whatever the cooldown says.
ACTION_IN_PROGRESS: Literal["action_in_progress"] = "action_in_progress"
# The refusals an operator or a timer ends: the alert waits until neither refuses.
HELD_REASONS = frozenset({"paused", "breaker_open"})
# The decisions that wait for a time of their own: judged again once it has come.
WAITING_REASONS = frozenset({"restart_window", "on_hold"})
# Alertmanager has re-sent an alert still firing by then (`repeat_interval` 1 h shipped, 4 h
# by default), so an older wait would only repeat its delivery.
WAIT_AT_MOST_SECONDS = 4 * 3600.0
# A window nobody judged again for this long past its end is forgotten (its alert was lost).
FORGET_WINDOW_AFTER_SECONDS = 3600.0


# The steps: what a plan asks its driver, and what each is answered with.


@dataclass(frozen=True)
class AskClock:
    """Answered with the time now (seconds)."""


@dataclass(frozen=True)
class AskHistory:
    """Answered with the journal's `History` for the alert at `now` (holds, fleet state and the
    targets whose action runs now included)."""

    alert: Alert
    now: float


@dataclass(frozen=True)
class AskMemory:
    """Answered with the driver's `AlertMemory` as it is now. A plan asks for it just before it
    returns, and the driver applies the outcome without waiting in between."""


@dataclass(frozen=True)
class AskPool:
    """Answered with the names of the targets in `target`'s pool (itself included)."""

    target: Target


@dataclass(frozen=True)
class Confirm:
    """Answered with the `Confirmation` of two fresh reads of `target`."""

    target: Target


@dataclass(frozen=True)
class FreshRead:
    """Answered with one fresh read of `target` (a `ReadAttempt`), or None: none can be made."""

    target: Target


@dataclass(frozen=True)
class AskTestRequest:
    """Answered with (passed, detail) of one `max_tokens: 1` request for `model` ("": the
    server's one model) to a quarantined target (out of rotation, no user shares its queue)."""

    target: Target
    model: str = ""


Step = AskClock | AskHistory | AskMemory | AskPool | Confirm | FreshRead | AskTestRequest


# The state between alerts.


@dataclass(frozen=True)
class Waiting:
    """An alert episode waiting to be judged again: once no pause and no breaker refuses it
    (`until` None), or once `until` has come (its window's end, its hold's end)."""

    alert: Alert
    reason: str
    held_at: float
    until: float | None = None

    def due(self, now: float, controls_allow: bool) -> bool:
        if self.until is None:
            return controls_allow and now - self.held_at < WAIT_AT_MOST_SECONDS
        return now >= self.until

    def expired(self, now: float) -> bool:
        return self.until is None and now - self.held_at >= WAIT_AT_MOST_SECONDS


@dataclass(frozen=True)
class AlertMemory:
    """What the restarter remembers between alerts; each map a frozen copy."""

    windows: Mapping[str, RestartWindow] = field(default_factory=lambda: MappingProxyType({}))
    waiting: Mapping[str, Waiting] = field(default_factory=lambda: MappingProxyType({}))
    quarantines: Mapping[str, Quarantine] = field(default_factory=lambda: NO_QUARANTINES)

    def with_window(self, target: str, window: RestartWindow | None) -> AlertMemory:
        windows = dict(self.windows)
        if window is None:
            windows.pop(target, None)
        else:
            windows[target] = window
        return replace(self, windows=MappingProxyType(windows))

    def with_waiting(self, key: str, waiting: Waiting | None) -> AlertMemory:
        """The memory with episode `key` waiting (None: not waiting). An episode that waits
        ends the wait of the earlier episodes of its alert (same fingerprint); a late delivery
        of an earlier episode does not replace a later one that waits."""
        entries = dict(self.waiting)
        if waiting is None:
            entries.pop(key, None)
            return replace(self, waiting=MappingProxyType(entries))
        fingerprint, starts_at = waiting.alert.fingerprint, waiting.alert.starts_at
        for other_key, other in list(entries.items()):
            if other_key == key or other.alert.fingerprint != fingerprint:
                continue
            if episode_before(starts_at, other.alert.starts_at):
                return self
            del entries[other_key]
        entries[key] = waiting
        return replace(self, waiting=MappingProxyType(entries))

    def with_quarantine(self, target: str, quarantine: Quarantine | None) -> AlertMemory:
        quarantines = dict(self.quarantines)
        if quarantine is None:
            quarantines.pop(target, None)
        else:
            quarantines[target] = quarantine
        return replace(self, quarantines=MappingProxyType(quarantines))


# What an outcome changes besides the decision.

RoutingMove = Literal["quarantined", "refused", "restarting", "released"]


@dataclass(frozen=True)
class RoutingChange:
    """A target leaving or returning to rotation (or refused leave), with why, for the journal,
    the metrics and whatever routers listen (pod readiness, a label)."""

    move: RoutingMove
    target: str
    reason: QuarantineReason | ReleaseReason | QuarantineRefusal
    detail: str
    out_for: float = 0.0  # on a release: how long it was out


class Unchanged:
    """An outcome's "leave this as it is" for a window, a waiting alert or a quarantine."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = Unchanged()


@dataclass(frozen=True)
class AlertOutcome:
    """What one plan decided, and what it changes in the memory (its own target and alert only).

    `decision`: journaled as the alert's decision (None: the alert resolved, journaled as such;
    with `settled` the settling read's decision follows). `window`, `waiting`, `quarantine`: the
    new value for the target or the alert episode, or `UNCHANGED` (untouched). `near_miss`: the
    window this outcome closed because the server moved.
    """

    decision: Decision | None
    target: str | None = None
    alert: str | None = None
    window: RestartWindow | Unchanged | None = UNCHANGED
    waiting: Waiting | Unchanged | None = UNCHANGED
    quarantine: Quarantine | Unchanged | None = UNCHANGED
    routing: tuple[RoutingChange, ...] = ()
    near_miss: RestartWindow | None = None
    settled: Decision | None = None
    settle: str | None = None

    def applied(self, memory: AlertMemory, now: float) -> AlertMemory:
        """`memory` with this outcome's changes (and windows long past their end forgotten)."""
        if self.target is not None and not isinstance(self.window, Unchanged):
            memory = memory.with_window(self.target, self.window)
        if self.alert is not None and not isinstance(self.waiting, Unchanged):
            memory = memory.with_waiting(self.alert, self.waiting)
        if self.target is not None and not isinstance(self.quarantine, Unchanged):
            memory = memory.with_quarantine(self.target, self.quarantine)
        stale = [
            name
            for name, window in memory.windows.items()
            if now > window.due_at + FORGET_WINDOW_AFTER_SECONDS
        ]
        for name in stale:
            memory = memory.with_window(name, None)
        return memory


Answer = object
Plan = Generator[Step, Answer, AlertOutcome]
T = TypeVar("T")


def advance(plan: Plan, answer: object) -> Step | AlertOutcome:
    """Give the plan the answer to its last step (None to start it): its next step, or its
    outcome."""
    try:
        return plan.send(answer)
    except StopIteration as finished:
        outcome: AlertOutcome = finished.value
        return outcome


def _ask(step: Step, kind: type[T]) -> Generator[Step, Answer, T]:
    answer = yield step
    if not isinstance(answer, kind):
        raise TypeError(f"{type(step).__name__} answered with {type(answer).__name__}")
    return answer


def _clock() -> Generator[Step, Answer, float]:
    answer = yield AskClock()
    if not isinstance(answer, (int, float)):
        raise TypeError(f"AskClock answered with {type(answer).__name__}")
    return float(answer)


def _memory() -> Generator[Step, Answer, AlertMemory]:
    return (yield from _ask(AskMemory(), AlertMemory))


def waiting_after(
    alert: Alert,
    decision: Decision,
    now: float,
    *,
    window: RestartWindow | None,
    history: History,
) -> Waiting | None:
    """Whether and until when the alert waits to be judged again after `decision`."""
    if decision.reason in HELD_REASONS:
        return Waiting(alert, decision.reason, now)
    if decision.reason == "restart_window" and window is not None:
        return Waiting(alert, decision.reason, now, window.due_at)
    if decision.reason == "on_hold" and alert.target is not None:
        hold = history.holds.get(alert.target)
        if hold is not None:
            return Waiting(alert, decision.reason, now, hold.until)
    return None


def firing_plan(
    alert: Alert,
    config: RestarterConfig,
    settings: QuarantineSettings,
    *,
    refusal: Decision | None = None,
) -> Plan:
    """Judge one firing alert. `refusal`: a decision made before the plan (no allow-rule lets
    the alert restart its pod), journaled as it is."""
    key = alert_key(alert)
    target = config.target(alert.target) if alert.target else None
    now = yield from _clock()
    history = yield from _ask(AskHistory(alert, now), History)
    if refusal is not None:
        return AlertOutcome(refusal, alert=key, waiting=None)
    decision = decide(alert, config, history, now)
    if decision.restarts and target is not None and target.name in history.acting:
        decision = _action_in_progress(target)
    if not decision.restarts or target is None:
        memory = yield from _memory()
        window = None if target is None else memory.windows.get(target.name)
        return AlertOutcome(
            decision,
            target=None if target is None else target.name,
            alert=key,
            waiting=waiting_after(alert, decision, now, window=window, history=history),
        )
    confirmation = yield from _ask(Confirm(target), Confirmation)
    now = yield from _clock()
    # Other targets may have restarted, and a hold may have been taken, during the reads.
    history = yield from _ask(AskHistory(alert, now), History)
    final = decide_confirmed(alert, config, history, now, confirmation)
    if final.restarts and target.name in history.acting:
        final = _action_in_progress(target)
    members = yield from _ask(AskPool(target), tuple)
    memory = yield from _memory()
    windowed = with_window(
        final,
        memory.windows.get(target.name),
        alert=key,
        target=target,
        confirmation=confirmation,
        now=now,
    )
    decision = windowed.decision
    current = memory.quarantines.get(target.name)
    quarantine: Quarantine | Unchanged | None = UNCHANGED
    routing: tuple[RoutingChange, ...] = ()
    if windowed.recovered is not None and current is not None:
        quarantine, routing = None, (_released(current, "recovered_in_window", decision, now),)
    elif decision.reason == "restart_window" or decision.restarts:
        reason: QuarantineReason = (
            "hung" if alert.alertname in config.confirm.hung_confirms else "stalled"
        )
        if current is None:
            quarantine, routing = _take_out(
                target, reason, confirmation, members, memory, settings, now
            )
            current = quarantine if isinstance(quarantine, Quarantine) else None
        if decision.restarts and current is not None:
            quarantine = restarting(current, now)
            moved = RoutingChange("restarting", target.name, "restarting", final.detail)
            routing = (*routing, moved)
    waiting = waiting_after(alert, decision, now, window=windowed.window, history=history)
    return AlertOutcome(
        decision,
        target=target.name,
        alert=key,
        window=windowed.window,
        waiting=waiting,
        quarantine=quarantine,
        routing=routing,
        near_miss=windowed.recovered,
    )


def _action_in_progress(target: Target) -> Decision:
    return Decision(
        "skip",
        ACTION_IN_PROGRESS,
        f"the restart action of {target.name} is still running; one at a time",
    )


def _take_out(
    target: Target,
    reason: QuarantineReason,
    confirmation: Confirmation,
    members: Collection[str],
    memory: AlertMemory,
    settings: QuarantineSettings,
    now: float,
) -> tuple[Quarantine | Unchanged | None, tuple[RoutingChange, ...]]:
    """Quarantine `target` on its confirmed stall, unless a guard refuses."""
    if not settings.enabled or set(members) <= {target.name}:
        return UNCHANGED, ()  # alone in its pool: there is nowhere else to send users
    refused = quarantine_refusal(target.name, members, memory.quarantines, settings.max_share)
    if refused is not None:
        why, detail = refused
        return UNCHANGED, (RoutingChange("refused", target.name, why, detail),)
    detail = f"stall confirmed ({confirmation.detail})"
    taken = quarantined(target.name, target.pool, reason, detail, confirmation.reading, now)
    return taken, (RoutingChange("quarantined", target.name, reason, detail),)


def _released(
    quarantine: Quarantine, why: ReleaseReason, decision: Decision | None, now: float
) -> RoutingChange:
    detail = decision.detail if decision is not None else ""
    return RoutingChange("released", quarantine.target, why, detail, quarantine.out_for(now))


def resolved_plan(alert: Alert, config: RestarterConfig) -> Plan:
    """A restart alert resolved: journaled as such; only its own episode stops waiting (a late
    resolve of an earlier episode leaves the current one alone). `settle` names its target when
    the target has a window open: one fresh read then settles it (`settle_plan`)."""
    key = alert_key(alert)
    target = config.target(alert.target) if alert.target else None
    memory = yield from _memory()
    waiting: Waiting | Unchanged | None = None if key in memory.waiting else UNCHANGED
    window = None if target is None else memory.windows.get(target.name)
    settle = target.name if target is not None and window is not None else None
    return AlertOutcome(None, alert=key, waiting=waiting, settle=settle)


def settle_plan(target: Target) -> Plan:
    """One fresh read once a restart alert of `target` resolved inside its window: the server
    moved (a near miss: the window closes and the target returns to rotation), or nothing moved
    and the window stays open for the next alert. A read that connects and gets no answer is
    the hang itself, never a recovery."""
    memory = yield from _memory()
    window = memory.windows.get(target.name)
    if window is None:
        return AlertOutcome(None)
    read = yield FreshRead(target)
    now = yield from _clock()
    memory = yield from _memory()
    if memory.windows.get(target.name) is not window or read is None:
        return AlertOutcome(None)  # judged meanwhile, or no read could be made
    if not isinstance(read, (FailedRead, Reading)):
        raise TypeError(f"FreshRead answered with {type(read).__name__}")
    settled, closes, moved = settle_window(window, read, now)
    current = memory.quarantines.get(target.name)
    if not closes:
        return AlertOutcome(None, target=target.name, settled=settled)
    quarantine: Quarantine | Unchanged | None = UNCHANGED
    routing: tuple[RoutingChange, ...] = ()
    if moved and current is not None:
        quarantine, routing = None, (_released(current, "recovered_in_window", settled, now),)
    return AlertOutcome(
        None,
        target=target.name,
        window=None,
        quarantine=quarantine,
        routing=routing,
        near_miss=window if moved else None,
        settled=settled,
    )


def settle_window(
    window: RestartWindow, read: ReadAttempt, now: float
) -> tuple[Decision, bool, bool]:
    """A restart alert of the window's target resolved; what one fresh read says: the decision
    to journal, whether the window closes, and whether it closes because the server moved."""
    lasted = f"{now - window.opened_at:.0f} s into its {window.restart_after:g} s window"
    if isinstance(read, FailedRead):
        if read.failure == "no_answer":
            return (
                Decision(
                    "skip",
                    "restart_window",
                    f"the alert resolved {lasted}, but the server still gives no answer "
                    f"({read.detail}): the window stays open for the target's next alert",
                ),
                False,
                False,
            )
        return (
            Decision(
                "skip",
                "recovered_in_window",
                f"the alert resolved {lasted}; the server no longer answers ({read.detail}): "
                "its window is closed, a new stall opens a new one",
            ),
            True,
            False,
        )
    moved = moved_since(window.first, read)
    if moved is None:
        return (
            Decision(
                "skip",
                "restart_window",
                f"the alert resolved {lasted}, but nothing moved since the window opened: "
                "the window stays open for the target's next alert",
            ),
            False,
            False,
        )
    return (
        Decision(
            "skip",
            "recovered_in_window",
            f"the alert resolved {lasted} and the server moved ({moved}): it recovered by "
            "itself and was not restarted",
        ),
        True,
        True,
    )


def look_plan(target: Target, settings: QuarantineSettings) -> Plan:
    """One look at a quarantined target: a fresh read, and one test request when nothing runs
    on it; it stays out, or returns to rotation (and its window closes as a near miss when it
    moved by itself)."""
    memory = yield from _memory()
    current = memory.quarantines.get(target.name)
    if current is None:
        return AlertOutcome(None)
    read = yield FreshRead(target)
    now = yield from _clock()
    if read is None:
        return AlertOutcome(None)
    if not isinstance(read, (FailedRead, Reading)):
        raise TypeError(f"FreshRead answered with {type(read).__name__}")
    judged: Look = look(
        current,
        read,
        now,
        expire_after=settings.expire_after,
        test_request=settings.test_request,
    )
    if judged.step == "test_request" and judged.quarantine is not None:
        model = read.model_names[0] if isinstance(read, Reading) and read.model_names else ""
        answer = yield AskTestRequest(target, model)
        if not isinstance(answer, tuple):
            raise TypeError(f"AskTestRequest answered with {type(answer).__name__}")
        passed, detail = answer
        now = yield from _clock()
        judged = after_test_request(judged.quarantine, bool(passed), str(detail), now)
    memory = yield from _memory()
    if memory.quarantines.get(target.name) is not current:
        return AlertOutcome(None)  # changed meanwhile (an alert's plan, a restart)
    if judged.release is None:
        return AlertOutcome(None, target=target.name, quarantine=judged.quarantine)
    out_for = current.out_for(now)
    change = RoutingChange("released", target.name, judged.release, judged.detail, out_for)
    window = memory.windows.get(target.name)
    if window is None or judged.release == "expired":
        return AlertOutcome(None, target=target.name, quarantine=None, routing=(change,))
    settled = Decision(
        "skip",
        "recovered_in_window",
        f"out of rotation for {current.out_for(now):.0f} s, {now - window.opened_at:.0f} s "
        f"into its {window.restart_after:g} s window: {judged.detail}; back in rotation, "
        "not restarted",
    )
    recovered = current.reason != "restarting" and judged.release in (
        "progress",
        "test_request_passed",
    )
    return AlertOutcome(
        None,
        target=target.name,
        window=None,
        quarantine=None,
        routing=(change,),
        near_miss=window if recovered else None,
        settled=settled if recovered else None,
    )


def due_waiting(
    memory: AlertMemory, now: float, controls_allow: bool
) -> tuple[tuple[Waiting, ...], AlertMemory]:
    """The waiting alerts due now (taken out of the memory), and those that waited too long for
    a resume dropped."""
    due = tuple(w for w in memory.waiting.values() if w.due(now, controls_allow))
    kept = {
        key: w
        for key, w in memory.waiting.items()
        if not w.due(now, controls_allow) and not w.expired(now)
    }
    return due, replace(memory, waiting=MappingProxyType(kept))


def expedite_holds(memory: AlertMemory, held: Collection[str], now: float) -> AlertMemory:
    """The alerts waiting on the hold of a target no longer held are due now (released early)."""
    entries = {
        key: replace(w, until=now)
        if w.reason == "on_hold" and w.alert.target is not None and w.alert.target not in held
        else w
        for key, w in memory.waiting.items()
    }
    return replace(memory, waiting=MappingProxyType(entries))


def window_alert(window: RestartWindow) -> Alert:
    """The alert episode a window was opened for, as the journal names it (fingerprint and
    startsAt), for the row that closes the window outside any delivery (a look that saw the
    target move)."""
    fingerprint, _, starts_at = window.alert.partition("@")
    return Alert(
        status="firing",
        labels={"alertname": "", "target": window.target},
        fingerprint=fingerprint,
        starts_at=starts_at,
    )


# The journal's window rows, folded back into the windows open and the alerts waiting for
# them: a restarted restarter goes on with the silence it was timing.
WindowKind = Literal["opened", "closed"]
WINDOW_KINDS: tuple[WindowKind, ...] = ("opened", "closed")


@dataclass(frozen=True)
class WindowEvent:
    """One window row of the journal: a target's window opened (for an alert episode) or closed."""

    kind: WindowKind
    target: str
    alert: str  # the episode, as `alert_key` writes it
    alertname: str
    time: float
    restart_after: float = 0.0


def restored_memory(
    memory: AlertMemory, events: tuple[WindowEvent, ...], config: RestarterConfig, now: float
) -> AlertMemory:
    """`memory` with the windows the rows (oldest first) leave open for configured targets, each
    with its alert waiting for the window's end. A restored window has no first reading: the
    next confirmation becomes it."""
    open_windows: dict[str, WindowEvent] = {}
    for event in events:
        if event.kind == "opened":
            open_windows[event.target] = event
        else:
            open_windows.pop(event.target, None)
    for name, event in open_windows.items():
        if config.target(name) is None:
            continue
        window = RestartWindow(
            event.alert, name, event.time, event.restart_after, None, restored=True
        )
        if now > window.due_at + FORGET_WINDOW_AFTER_SECONDS:
            continue
        fingerprint, _, starts_at = event.alert.partition("@")
        alert = Alert(
            status="firing",
            labels={"alertname": event.alertname, "target": name},
            fingerprint=fingerprint,
            starts_at=starts_at,
        )
        memory = memory.with_window(name, window).with_waiting(
            event.alert, Waiting(alert, "restart_window", now, window.due_at)
        )
    return memory


def window_change(
    before: RestartWindow | None, after: RestartWindow | None
) -> tuple[WindowKind, RestartWindow] | None:
    """What the journal records of a target's window going from `before` to `after`: a window
    opened (a new one), closed, or nothing (the same window, a first reading set)."""
    if after is not None and (before is None or after.opened_at != before.opened_at):
        return "opened", after
    if after is None and before is not None:
        return "closed", before
    return None


def followed_config(memory: AlertMemory, config: RestarterConfig) -> AlertMemory:
    """The open windows with the `restart_after` a reload set for their targets (longer or
    shorter), and the alerts waiting for them due at the new ends: what the gauge says is what
    the window does."""
    for name, window in memory.windows.items():
        target = config.target(name)
        if target is None or target.restart_after == window.restart_after:
            continue
        moved = replace(window, restart_after=target.restart_after)
        memory = memory.with_window(name, moved)
        for key, waiting in memory.waiting.items():
            if waiting.reason == "restart_window" and waiting.alert.target == name:
                memory = memory.with_waiting(key, replace(waiting, until=moved.due_at))
    return memory
