"""Out of rotation before a restart: which targets users' routers should skip, and why.

A confirmed stall takes its target out of rotation at once (the restart waits for its window);
the target returns as soon as a fresh read shows progress, or, when nothing runs on it, as soon
as one test request passes (out of rotation no user shares its queue, so the request is
harmless). After a restart it stays out until the new process shows progress or passes a test
request. Routers fail open, so the verdict does too: never the last routable target of a pool,
never more than `max_share` % of it, a quarantine no fresh read has confirmed for
`expire_after` ends, and a target nobody quarantined is routable. Pure: `now` passed in.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Literal, get_args

from stallwatch.common.quarantine_config import DEFAULT_POOL
from stallwatch.core.classify import classify
from stallwatch.core.confirmation import FailedRead, ReadAttempt
from stallwatch.core.reading import Reading

# Why a target is out of rotation: a stall its counters show, a server that connects and never
# answers, or a restart decided on it (out until the new process proves it serves).
QuarantineReason = Literal["stalled", "hung", "restarting"]
# Why a target came back (or never left): what a journal row and a metric say.
ReleaseReason = Literal[
    "progress",  # a fresh read showed its counters moving
    "test_request_passed",  # nothing ran on it, and one test request was answered
    "expired",  # no fresh read confirmed the stall for `expire_after`: fail open
    "recovered_in_window",  # the restart window's confirmation or settling read saw it move
    "target_removed",  # it left the config (a reload, a pod that is gone)
    "disabled",  # quarantine was switched off by a reload
]
RELEASE_REASONS: tuple[ReleaseReason, ...] = get_args(ReleaseReason)
# Why a confirmed stall did not take its target out of rotation.
QuarantineRefusal = Literal["last_in_pool", "pool_share", "quarantine_disabled"]
QUARANTINE_REFUSALS: tuple[QuarantineRefusal, ...] = get_args(QuarantineRefusal)
# The verdict a router reads.
RoutingReason = Literal["in_rotation", "stalled", "hung", "restarting"]
ROUTING_REASONS: tuple[RoutingReason, ...] = get_args(RoutingReason)


@dataclass(frozen=True)
class Quarantine:
    """One target out of rotation.

    `first`: the reading movement is judged against (None: none yet, a hung server or a new
    process not answering yet). `confirmed_at`: the last fresh read that still showed it stuck.
    """

    target: str
    pool: str
    since: float
    reason: QuarantineReason
    detail: str
    confirmed_at: float
    first: Reading | None = None

    def out_for(self, now: float) -> float:
        return max(0.0, now - self.since)


NO_QUARANTINES: Mapping[str, Quarantine] = MappingProxyType({})


@dataclass(frozen=True)
class Verdict:
    """What a router is told about one target."""

    target: str
    routable: bool
    reason: RoutingReason
    detail: str
    since: float | None = None


def verdict(target: str, quarantines: Mapping[str, Quarantine]) -> Verdict:
    """The routing verdict of `target`: routable unless it is quarantined (unknown: routable)."""
    quarantine = quarantines.get(target)
    if quarantine is None:
        return Verdict(target, True, "in_rotation", "in rotation")
    return Verdict(target, False, quarantine.reason, quarantine.detail, quarantine.since)


def quarantine_refusal(
    target: str,
    members: Collection[str],
    quarantines: Mapping[str, Quarantine],
    max_share: int,
) -> tuple[QuarantineRefusal, str] | None:
    """Why `target` may not leave rotation now (None: it may). `members`: its pool, itself
    included. Routers fail open when too many endpoints look bad; so does this."""
    pool = set(members) | {target}
    out = {name for name in pool if name in quarantines}
    left = pool - out - {target}
    if not left:
        return (
            "last_in_pool",
            f"the last routable target of its pool ({len(pool)} in all): "
            "taking it out would leave users nowhere to go",
        )
    share = 100 * (len(out) + 1) / len(pool)
    if share > max_share:
        return (
            "pool_share",
            f"{len(out) + 1} of {len(pool)} targets of its pool out of rotation would be "
            f"{share:.0f} %, over max_share {max_share} %",
        )
    return None


def quarantined(
    target: str,
    pool: str,
    reason: QuarantineReason,
    detail: str,
    reading: Reading | None,
    now: float,
) -> Quarantine:
    return Quarantine(target, pool, now, reason, detail, now, reading)


def restarting(quarantine: Quarantine, now: float) -> Quarantine:
    """The quarantine of a target whose restart was just decided: out until the new process
    proves it serves (movement is judged from its first reading)."""
    return replace(
        quarantine,
        reason="restarting",
        detail="restarted; out of rotation until the new process shows progress",
        confirmed_at=now,
        first=None,
    )


# What one look at a quarantined target leads to.
LookStep = Literal["keep", "release", "test_request"]


@dataclass(frozen=True)
class Look:
    """The judgement of one fresh read of a quarantined target.

    `quarantine`: the quarantine to keep (None when released). `release`: why it came back.
    """

    step: LookStep
    quarantine: Quarantine | None
    detail: str
    release: ReleaseReason | None = None


def _running(reading: Reading) -> float:
    return (reading.running or 0.0) + (reading.waiting or 0.0)


def look(
    quarantine: Quarantine,
    read: ReadAttempt,
    now: float,
    *,
    expire_after: float,
    test_request: bool = True,
) -> Look:
    """Judge one fresh read of a quarantined target: keep it out, release it, or ask for one
    test request (nothing runs on it and nothing moved: hung with nothing running, or idle)."""
    if isinstance(read, FailedRead):
        if read.failure == "no_answer" and quarantine.reason != "restarting":
            kept = replace(quarantine, confirmed_at=now)
            return Look("keep", kept, f"still no answer: {read.detail}")
        return _unconfirmed(quarantine, now, expire_after, read.detail)
    if not read.has_engines:
        return _unconfirmed(quarantine, now, expire_after, "a reading with no engine series")
    if quarantine.first is None:
        kept = replace(quarantine, first=read, confirmed_at=now)
        if test_request and _running(read) == 0:
            return Look("test_request", kept, "answers again with nothing running")
        return Look("keep", kept, "answers again; progress is judged from this reading")
    judged = classify(quarantine.first, read)
    if judged.restart_detected:
        kept = replace(
            quarantine,
            reason="restarting",
            detail=f"a new process ({judged.reason}); out until it shows progress",
            first=read,
            confirmed_at=now,
        )
        if test_request and _running(read) == 0:
            return Look("test_request", kept, f"a new process ({judged.reason}), idle")
        return Look("keep", kept, f"a new process ({judged.reason})")
    if judged.progressed:
        return Look("release", None, f"moved: {judged.reason}", "progress")
    kept = replace(quarantine, confirmed_at=now)
    if _running(read) == 0:
        if test_request:
            return Look("test_request", kept, "nothing runs on it and nothing moved")
        return _unconfirmed(quarantine, now, expire_after, "nothing runs on it")
    return Look("keep", kept, f"still stuck: {judged.reason}")


def _unconfirmed(quarantine: Quarantine, now: float, expire_after: float, why: str) -> Look:
    """A read that neither confirms the stall nor shows recovery: out until `expire_after`
    has passed since the last confirming read, then back (fail open)."""
    since = now - quarantine.confirmed_at
    if since >= expire_after:
        return Look(
            "release",
            None,
            f"no fresh read confirmed the stall for {since:.0f} s ({why}); back in rotation "
            f"(expire_after {expire_after:g} s)",
            "expired",
        )
    return Look("keep", quarantine, f"not confirmed ({why}); {expire_after - since:.0f} s left")


def after_test_request(quarantine: Quarantine, passed: bool, detail: str, now: float) -> Look:
    """The quarantined target answered one test request (back in rotation) or did not (still
    out: hung with nothing running)."""
    if passed:
        return Look("release", None, f"test request answered ({detail})", "test_request_passed")
    kept = replace(
        quarantine,
        confirmed_at=now,
        detail=f"{quarantine.detail}; test request failed ({detail})",
    )
    return Look("keep", kept, f"test request failed ({detail})")


def pools(targets: Iterable[tuple[str, str]]) -> Mapping[str, tuple[str, ...]]:
    """Each pool's members from (target, pool) pairs."""
    grouped: dict[str, list[str]] = {}
    for name, pool in targets:
        grouped.setdefault(pool, []).append(name)
    return MappingProxyType({pool: tuple(names) for pool, names in grouped.items()})


# The journal's quarantine rows, folded back into the quarantines in force (a restarter that
# restarts keeps who is out of rotation).
QuarantineKind = Literal["quarantined", "refused", "released", "restarting"]
QUARANTINE_KINDS: tuple[QuarantineKind, ...] = get_args(QuarantineKind)


@dataclass(frozen=True)
class QuarantineEvent:
    """One quarantine row of the journal."""

    kind: QuarantineKind
    target: str
    time: float
    reason: str
    pool: str = DEFAULT_POOL
    detail: str = ""


def folded_quarantines(events: Iterable[QuarantineEvent]) -> Mapping[str, Quarantine]:
    """The quarantines the rows leave in force, oldest row first. A restored quarantine has no
    first reading: the next fresh read is its new baseline."""
    current: dict[str, Quarantine] = {}
    for event in events:
        if event.kind == "quarantined" and event.reason in ("stalled", "hung"):
            reason: QuarantineReason = "hung" if event.reason == "hung" else "stalled"
            current[event.target] = Quarantine(
                event.target, event.pool, event.time, reason, event.detail, event.time
            )
        elif event.kind == "restarting" and event.target in current:
            current[event.target] = restarting(current[event.target], event.time)
        elif event.kind == "released":
            current.pop(event.target, None)
    return MappingProxyType(current)
