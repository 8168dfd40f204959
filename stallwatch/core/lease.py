"""Who may act among restarter replicas, and the restarts a failover must know: pure Lease logic.

A coordination.k8s.io Lease names its holder and when the holder last renewed it. A replica
takes a Lease that is free or whose holder has not renewed it within its duration. The holder
also keeps in the Lease (one annotation) the restarts decided within the policy's look-back,
so the replica that takes over honours their cooldowns, budgets and fleet windows.
No I/O and no clock: `now` is passed in.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from stallwatch.core.policy import PastRestart

# The annotation of the Lease that holds the restarts (JSON, newest last).
LEDGER_ANNOTATION = "stallwatch.io/restarts"
# At most this many restarts are kept in the Lease (an object's annotations are capped at
# 256 KiB in all; an entry takes about 150 bytes).
LEDGER_MAX_ENTRIES = 500

LeaseMove = Literal["renew", "take", "wait"]


@dataclass(frozen=True)
class LeaseView:
    """What a Lease says, in Unix seconds (None where a field is absent)."""

    holder: str | None
    renewed_at: float | None
    duration: float | None


def lease_move(view: LeaseView | None, identity: str, now: float, duration: float) -> LeaseMove:
    """What a replica named `identity` does with the Lease at `now` (None: no Lease yet).

    `renew`: it holds the Lease; `take`: the Lease is free, or its holder let it expire
    (no renewal within the Lease's duration, or `duration` if the Lease gives none);
    `wait`: another replica holds it.
    """
    if view is None or not view.holder:
        return "take"
    if view.holder == identity:
        return "renew"
    if view.renewed_at is None:
        return "take"
    held_for = view.duration if view.duration else duration
    return "take" if now - view.renewed_at >= held_for else "wait"


def encode_ledger(restarts: Iterable[PastRestart], since: float) -> str:
    """The restarts decided since `since`, as the Lease annotation keeps them."""
    kept = sorted(
        (past for past in restarts if past.decided_at >= since),
        key=lambda past: past.decided_at,
    )[-LEDGER_MAX_ENTRIES:]
    return json.dumps(
        [
            {"target": p.target, "decided_at": p.decided_at, "finished_at": p.finished_at}
            | ({"blocked": True} if p.blocked else {})
            | ({"alert": p.alert} if p.alert else {})
            for p in kept
        ],
        separators=(",", ":"),
    )


def decode_ledger(text: str | None) -> tuple[PastRestart, ...]:
    """The restarts an annotation holds; entries that are not well formed are left out."""
    if not text:
        return ()
    try:
        items = json.loads(text)
    except ValueError:
        return ()
    if not isinstance(items, list):
        return ()
    restarts: list[PastRestart] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        target = item.get("target")
        decided = item.get("decided_at")
        finished = item.get("finished_at")
        if not isinstance(target, str) or not isinstance(decided, int | float):
            continue
        if finished is not None and not isinstance(finished, int | float):
            finished = None
        blocked = item.get("blocked") is True
        alert = item.get("alert")
        restarts.append(
            PastRestart(
                target, float(decided), finished, blocked, alert if isinstance(alert, str) else ""
            )
        )
    return tuple(restarts)


def merge_restarts(
    local: Iterable[PastRestart], shared: Iterable[PastRestart]
) -> tuple[PastRestart, ...]:
    """One list of restarts from this replica's journal and the Lease, each restart once.

    A restart is the same in both when its target and decision time agree (to the
    millisecond); the copy that knows when the action finished wins.
    """
    merged: dict[tuple[str, int], PastRestart] = {}
    for past in (*local, *shared):
        key = (past.target, round(past.decided_at * 1000))
        known = merged.get(key)
        if known is None or (known.finished_at is None and past.finished_at is not None):
            merged[key] = past
    return tuple(sorted(merged.values(), key=lambda past: past.decided_at))
