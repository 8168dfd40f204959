"""Classify a server from two reads of its own counters: the decision table, as pure code.

No I/O and no clock: readings carry the time they were taken. The only decision that needs
the network, the idle test request, is returned as `test_request_needed` and settled by
`with_test_request_result` once the caller has sent it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum

from stallwatch.core.reading import EngineSample, Reading


class State(StrEnum):
    DOWN = "down"
    HUNG = "hung"
    NO_METRICS = "no_metrics"
    RESTARTED = "restarted"
    SLEEPING = "sleeping"
    BUSY = "busy"
    STALLED = "stalled"
    IDLE = "idle"
    UNRESPONSIVE = "unresponsive"
    UNKNOWN = "unknown"


# TGI's registry (metrics-exporter-prometheus) creates each series at its first update, and the
# one gauge its startup sets (`tgi_batch_max_total_tokens`) is set before the router installs the
# registry: until its first request a TGI's /metrics is an empty 200. Nothing to judge yet: never
# restarted, no test request (an empty payload proves nothing about the engine).
EMPTY_PAYLOAD = (
    "reachable, but /metrics holds no series at all: no request seen yet "
    "(TGI publishes nothing before its first request); never restarted, no test request"
)

# When engines of one server disagree, the server takes the worst of their states.
_ENGINE_SEVERITY: dict[State, int] = {
    State.STALLED: 5,
    State.UNKNOWN: 4,
    State.BUSY: 3,
    State.SLEEPING: 2,
    State.IDLE: 1,
}


@dataclass(frozen=True)
class EngineVerdict:
    model_name: str
    engine: str
    state: State
    reason: str
    progressed: bool = False
    completed: bool = False
    test_request_needed: bool = False


@dataclass(frozen=True)
class Verdict:
    """What one read says about a server, with the figures behind it."""

    state: State
    reason: str
    running: float | None = None
    waiting: float | None = None
    steps_per_second: float | None = None
    tokens_per_second: float | None = None
    progressed: bool = False
    restart_detected: bool = False
    test_request_needed: bool = False
    engines: tuple[EngineVerdict, ...] = ()

    @property
    def has_work(self) -> bool:
        return (self.running or 0.0) + (self.waiting or 0.0) > 0


def down(reason: str) -> Verdict:
    """The server's `/metrics` could not be read (refused, reset, not connected in time, error
    status)."""
    return Verdict(state=State.DOWN, reason=reason)


def hung(reason: str) -> Verdict:
    """The server accepted the connection, but its `/metrics` did not answer in time."""
    return Verdict(state=State.HUNG, reason=reason)


def restart_evidence(previous: Reading, current: Reading) -> str | None:
    """Why `current` comes from a different process than `previous`, or None if it does not.

    A start time (or start marker) that changed is proof; where the server publishes none
    (prometheus multiprocess mode, TGI, SGLang), any counter going down is, and on engines
    whose series exist only once updated, a counter that vanished.
    """
    if _moved(previous.process_start_time, current.process_start_time):
        return "process start time changed"
    if None not in (previous.start_marker, current.start_marker) and (
        previous.start_marker != current.start_marker
    ):
        return "process start marker changed"
    if None not in (previous.engine_kind, current.engine_kind) and (
        previous.engine_kind != current.engine_kind
    ):
        return f"engine changed ({previous.engine_kind} -> {current.engine_kind})"
    before = previous.engine_map()
    for engine in current.engines:
        old = before.get(engine.key)
        if old is None:
            continue
        old_counters = old.counters()
        vanish = engine.profile.counters_vanish_on_restart
        for name, value in engine.counters().items():
            old_value = old_counters[name]
            if value is not None and old_value is not None and value < old_value:
                return f"{name} went down ({old_value:g} -> {value:g})"
            if vanish and value is None and old_value is not None:
                return f"{name} vanished (was {old_value:g})"
    return None


def _moved(old: float | None, new: float | None) -> bool:
    return old is not None and new is not None and new != old


def _progress_signals(old: EngineSample, new: EngineSample) -> list[str]:
    old_counters = old.counters()
    moved = [
        name
        for name, value in new.counters().items()
        if value is not None and (before := old_counters[name]) is not None and value > before
    ]
    if _moved(old.kv_cache_usage, new.kv_cache_usage):
        moved.append(new.profile.role_names["kv_cache_usage"])
    return moved


def _imprecise(sample: EngineSample, roles: tuple[str, ...]) -> list[str]:
    """The evidence counters printed with too few digits to show every increase."""
    digits = sample.profile.significant_digits
    if digits is None:
        return []
    limit = 10.0**digits
    names = sample.profile.role_names
    return [
        f"{names[role]} {value:.6g}"
        for role in roles
        if (value := getattr(sample, role)) is not None and abs(value) >= limit
    ]


def _without_progress(
    previous: EngineSample, current: EngineSample, elapsed: float, inflight: float | None
) -> tuple[State, str, bool]:
    """Work present and nothing moved: stalled only when the engine's counters can prove it."""
    profile = current.profile
    if profile.stall_unprovable:
        return State.UNKNOWN, f"work present and nothing moved; {profile.stall_unprovable}", False
    if inflight is not None and inflight == 0:
        reason = "no generation request in flight: the work gauges are stale"
        return State.IDLE, f"{reason}; an idle test request decides", True
    if _moved(previous.idle_loop, current.idle_loop):
        name = profile.role_names["idle_loop"]
        reason = (
            f"{name} moved, so the engine loop turns without a batch: the work gauges are stale"
        )
        return State.IDLE, f"{reason}; an idle test request decides", True
    evidence = [
        role
        for role in profile.stall_evidence
        if getattr(previous, role) is not None and getattr(current, role) is not None
    ]
    if not evidence:
        names = ", ".join(profile.role_names.get(role, role) for role in profile.stall_evidence)
        return (
            State.UNKNOWN,
            f"work present, but no progress counter ({names}) in both reads",
            False,
        )
    imprecise = _imprecise(current, tuple(evidence))
    if len(imprecise) == len(evidence):
        digits = profile.significant_digits or 0
        largest = max(abs(getattr(current, role)) for role in evidence)
        step = 10.0 ** (math.floor(math.log10(largest)) + 1 - digits)
        reason = (
            f"work present and nothing moved, but {', '.join(imprecise)} is printed to "
            f"{profile.significant_digits} significant digits: increases under {step:g} do not "
            "show, so this is no proof of a stall"
        )
        return State.UNKNOWN, reason, False
    lag = profile.work_gauge_lag_seconds
    if lag and current.idle_loop is None and elapsed < lag:
        reason = (
            f"work present and nothing moved in {elapsed:g} s, but {profile.work_gauge_lag}: "
            f"a stall needs reads at least {lag:g} s apart"
        )
        return State.UNKNOWN, reason, False
    return State.STALLED, "work present and no progress signal moved", False


def still_loading(sample: EngineSample) -> bool:
    """Whether the engine publishes none of the series a loaded engine of its kind does."""
    roles = sample.profile.loaded_when
    return bool(roles) and all(getattr(sample, role) is None for role in roles)


def inflight_work(
    previous: EngineSample, current: EngineSample, inflight: float | None, elapsed: float
) -> bool:
    """Whether generation requests in flight at the HTTP layer are work the engine has, though
    its work gauges read 0: they are (the gauges lag) when the engine's idle-loop counter, in
    both reads, did not move, so its loop did not turn idle in between. Reads closer together
    than the counter is flushed prove nothing."""
    profile = current.profile
    if profile.inflight is None or inflight is None or inflight <= 0:
        return False
    if elapsed < profile.idle_loop_flush_seconds:
        return False
    before, now = previous.idle_loop, current.idle_loop
    return before is not None and now is not None and now == before


def _work_ended(previous: EngineSample, current: EngineSample, inflight: float | None) -> bool:
    """Whether the work that moved the counters, which lagging gauges never showed, is over
    by this read: nothing in flight at the HTTP layer now, or, where the engine publishes no
    such count, its idle loop turned since the last read (an idle test request's own forward
    passes, a short request that came and went)."""
    if current.profile.inflight is not None and inflight is not None:
        return inflight == 0
    return _moved(previous.idle_loop, current.idle_loop)


def idle_unproven(
    previous: EngineSample | None, current: EngineSample, inflight: float | None
) -> str:
    """Why work gauges of 0 with nothing moved do not prove this engine idle; empty when they do.

    A test request may only go to an engine proven idle. Gauges that lag the work by whole
    requests (the profile's `idle_unprovable`) never prove it; nor do gauges that lag while
    the engine's fresh count of requests in flight at the HTTP layer is above 0, unless its
    idle-loop counter moved (the engine loop turns without a batch: the engine is idle).
    """
    profile = current.profile
    if profile.idle_unprovable:
        return profile.idle_unprovable
    if still_loading(current):
        return profile.loading
    if profile.inflight is None or inflight is None or inflight <= 0:
        return ""
    if previous is not None and _moved(previous.idle_loop, current.idle_loop):
        return ""
    lag = profile.work_gauge_lag or "the work gauges lag the work"
    return f"{inflight:g} generation request(s) in flight at the HTTP layer ({lag})"


def classify_engine(
    previous: EngineSample | None,
    current: EngineSample,
    *,
    elapsed: float = 0.0,
    inflight: float | None = None,
) -> EngineVerdict:
    """One engine's state from two samples of the same process, `elapsed` seconds apart.

    `inflight` is the server's count of client requests in flight, where the engine
    publishes one that is fresher than its work gauges.
    """

    def verdict(state: State, reason: str, **flags: bool) -> EngineVerdict:
        return EngineVerdict(current.model_name, current.engine, state, reason, **flags)

    if current.awake is not None and current.awake == 0:
        return verdict(State.SLEEPING, "engine is asleep")
    has_work = current.work > 0
    if previous is None:
        if has_work:
            return verdict(State.UNKNOWN, "first read with work: nothing to compare with yet")
        unproven = idle_unproven(None, current, inflight)
        if unproven:
            return verdict(State.UNKNOWN, f"no work reported on the first read, but {unproven}")
        return verdict(State.IDLE, "no work on the first read", test_request_needed=True)
    moved = _progress_signals(previous, current)
    completed = _moved(previous.requests_completed, current.requests_completed)
    in_flight = not has_work and inflight_work(previous, current, inflight, elapsed)
    if has_work or in_flight:
        names = current.profile.role_names
        if in_flight:
            work = (
                f"{inflight:g} generation request(s) in flight at the HTTP layer and "
                f"{names['idle_loop']} flat, the work gauges at 0"
            )
        elif (current.running or 0.0) + (current.waiting or 0.0) == 0:
            shown = f"{names['forwards_started']} - {names['steps']}"
            work = f"a forward in flight ({shown}), the work gauges at 0"
        else:
            work = "work present"
        if moved:
            return verdict(State.BUSY, f"{work}; moved: " + ", ".join(moved), progressed=True)
        state, reason, needs_test = _without_progress(previous, current, elapsed, inflight)
        if work != "work present":
            reason = reason.replace("work present", work, 1)
        return verdict(state, reason, test_request_needed=needs_test)
    lag = current.profile.work_gauge_lag
    live = [name for name in moved if current.role_of(name) != "requests_completed"]
    if lag and live and not _work_ended(previous, current, inflight):
        reason = f"no work reported, but {lag}; moved: {', '.join(live)}"
        return verdict(State.BUSY, reason, progressed=True, completed=completed)
    if moved or completed:
        done = "requests completed" if completed else "the engine worked and is done"
        return verdict(
            State.IDLE,
            f"no work; {done} since the last read",
            progressed=True,
            completed=completed,
        )
    unproven = idle_unproven(previous, current, inflight)
    if unproven:
        reason = f"no work reported and nothing moved, but {unproven}: no test request"
        return verdict(State.UNKNOWN, reason)
    return verdict(State.IDLE, "no work and nothing completed", test_request_needed=True)


def _rate(previous: Reading, current: Reading, field: str) -> float | None:
    elapsed = current.taken_at - previous.taken_at
    if elapsed <= 0:
        return None
    before = previous.engine_map()
    total = 0.0
    found = False
    for engine in current.engines:
        old = before.get(engine.key)
        if old is None:
            continue
        new_value, old_value = getattr(engine, field), getattr(old, field)
        if new_value is None or old_value is None:
            continue
        total += new_value - old_value
        found = True
    return total / elapsed if found else None


def classify(previous: Reading | None, current: Reading) -> Verdict:
    """The server's state from its previous read (same process or not) and this one."""
    running, waiting = current.running, current.waiting
    if not current.has_engines:
        if current.empty:
            return Verdict(State.NO_METRICS, EMPTY_PAYLOAD)
        return Verdict(State.NO_METRICS, "reachable, but no engine series")
    if previous is not None and previous.has_engines:
        evidence = restart_evidence(previous, current)
        if evidence is not None:
            has_work = (running or 0.0) + (waiting or 0.0) > 0
            unproven = [
                why
                for engine in current.engines
                if (why := idle_unproven(None, engine, current.inflight_requests))
            ]
            reason = f"new process: {evidence}"
            if unproven and not has_work:
                reason = f"{reason}; no test request: {unproven[0]}"
            return Verdict(
                State.RESTARTED,
                reason,
                restart_detected=True,
                test_request_needed=not has_work and not unproven,
                running=running,
                waiting=waiting,
            )
    before = previous.engine_map() if previous is not None and previous.has_engines else {}
    elapsed = current.taken_at - previous.taken_at if previous is not None else 0.0
    engine_verdicts = tuple(
        classify_engine(before.get(e.key), e, elapsed=elapsed, inflight=current.inflight_requests)
        for e in current.engines
    )
    worst = max(engine_verdicts, key=lambda v: _ENGINE_SEVERITY[v.state])
    any_work = any(v.state in (State.BUSY, State.STALLED, State.UNKNOWN) for v in engine_verdicts)
    test_request_needed = not any_work and any(v.test_request_needed for v in engine_verdicts)
    if test_request_needed:
        stale = [
            v.reason for v in engine_verdicts if v.test_request_needed and v.state == State.IDLE
        ]
        state, reason = State.IDLE, "no work and nothing completed: an idle test request decides"
        if stale and "stale" in stale[0]:
            reason = stale[0]
    else:
        state, reason = worst.state, worst.reason
        if len(engine_verdicts) > 1:
            reason = f"engine {worst.engine}: {reason}"
    rates_from = previous if previous is not None and previous.has_engines else None
    return Verdict(
        state=state,
        reason=reason,
        steps_per_second=_rate(rates_from, current, "steps") if rates_from else None,
        tokens_per_second=_rate(rates_from, current, "generation_tokens") if rates_from else None,
        progressed=any(v.progressed for v in engine_verdicts),
        test_request_needed=test_request_needed,
        engines=engine_verdicts,
        running=running,
        waiting=waiting,
    )


def held_by_engine_fault_tolerance(verdict: Verdict, faulted: tuple[str, ...]) -> Verdict:
    """A stall or an idle test request the engine's own fault tolerance explains: it holds
    `faulted` engines for its orchestrator's recovery. Unknown, with no test request: not ours
    to test or restart while that recovery may still come."""
    if not faulted or not (verdict.state == State.STALLED or verdict.test_request_needed):
        return verdict
    reason = (
        f"the engine's fault tolerance holds {', '.join(faulted)} for its orchestrator's "
        f"recovery; no test request, no restart (was: {verdict.reason})"
    )
    return replace(verdict, state=State.UNKNOWN, test_request_needed=False, reason=reason)


def with_test_request_result(verdict: Verdict, succeeded: bool, detail: str) -> Verdict:
    """Settle a verdict that waited for an idle test request."""
    if not verdict.test_request_needed:
        return verdict
    if verdict.state == State.RESTARTED:
        reason = f"{verdict.reason}; test request: {detail}"
        return replace(verdict, test_request_needed=False, reason=reason)
    if succeeded:
        return replace(
            verdict, state=State.IDLE, test_request_needed=False, reason=f"idle: {detail}"
        )
    return replace(
        verdict,
        state=State.UNRESPONSIVE,
        test_request_needed=False,
        reason=f"no work, nothing completed, and the test request failed: {detail}",
    )
