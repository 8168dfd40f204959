"""The Lease between restarter replicas: who may take it, and the restarts it carries over."""

from __future__ import annotations

import pytest

from stallwatch.core.lease import (
    LEDGER_MAX_ENTRIES,
    LeaseView,
    decode_ledger,
    encode_ledger,
    lease_move,
    merge_restarts,
)
from stallwatch.core.policy import PastRestart


@pytest.mark.parametrize(
    ("view", "now", "move"),
    [
        (None, 100.0, "take"),
        (LeaseView(None, None, None), 100.0, "take"),
        (LeaseView("me", 10.0, 15.0), 100.0, "renew"),
        (LeaseView("other", 90.0, 15.0), 100.0, "wait"),
        (LeaseView("other", 85.0, 15.0), 100.0, "take"),
        (LeaseView("other", 86.0, None), 100.0, "wait"),  # our duration (20 s) applies
        (LeaseView("other", 79.0, None), 100.0, "take"),
        (LeaseView("other", None, 15.0), 100.0, "take"),
    ],
)
def test_lease_move(view: LeaseView | None, now: float, move: str) -> None:
    """A replica takes a free or expired Lease, renews its own, and waits on a live one."""
    assert lease_move(view, "me", now, 20.0) == move


def test_the_ledger_keeps_the_look_back_and_round_trips() -> None:
    """Encoding keeps restarts since `since` (newest last); decoding gives them back."""
    restarts = [PastRestart("a", 50.0, 60.0), PastRestart("b", 10.0), PastRestart("c", 40.0)]
    text = encode_ledger(restarts, since=30.0)
    assert decode_ledger(text) == (PastRestart("c", 40.0), PastRestart("a", 50.0, 60.0))


def test_the_ledger_carries_a_blocked_restart_to_the_next_holder() -> None:
    """A restart a PodDisruptionBudget blocked stays blocked across a failover, and each
    restart keeps the alert episode it acted on; absent fields are not written."""
    restarts = [
        PastRestart("a", 50.0, 51.0, blocked=True),
        PastRestart("b", 55.0, 60.0, alert="f00d@2026-11-30T05:29:50Z"),
    ]
    text = encode_ledger(restarts, since=0.0)
    assert decode_ledger(text) == tuple(restarts)
    assert text.count('"blocked"') == 1
    assert text.count('"alert"') == 1


def test_the_ledger_is_bounded() -> None:
    """Only the newest LEDGER_MAX_ENTRIES restarts are kept in the Lease."""
    many = [PastRestart("t", float(i)) for i in range(LEDGER_MAX_ENTRIES + 10)]
    kept = decode_ledger(encode_ledger(many, since=0.0))
    assert len(kept) == LEDGER_MAX_ENTRIES
    assert kept[0].decided_at == 10.0


@pytest.mark.parametrize(
    "text",
    [None, "", "not json", "{}", '[1, "x", {"target": 3, "decided_at": 1}]', '[{"target": "a"}]'],
)
def test_a_malformed_ledger_holds_nothing(text: str | None) -> None:
    """An annotation someone edited by hand is read as no restarts, not an error."""
    assert decode_ledger(text) == ()


def test_merge_counts_each_restart_once_and_keeps_the_finished_copy() -> None:
    """The same restart in the journal and the Lease is one; its finish time is kept."""
    local = [PastRestart("a", 10.0)]
    shared = [PastRestart("a", 10.0004, 30.0), PastRestart("b", 20.0)]
    assert merge_restarts(local, shared) == (
        PastRestart("a", 10.0004, 30.0),
        PastRestart("b", 20.0),
    )
