"""Judge whether two fresh reads of a server show a stall (the restarter's last look)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stallwatch.core.classify import State, Verdict

Refusal = Literal["progress", "idle", "down", "error"]


@dataclass(frozen=True)
class Confirmation:
    confirmed: bool
    refusal: Refusal | None
    detail: str
    verdict: Verdict | None = None


def judge_confirmation(verdict: Verdict) -> Confirmation:
    """Whether a verdict from two fresh reads shows a server that is really stuck."""
    if verdict.state == State.STALLED:
        return Confirmation(True, None, verdict.reason, verdict)
    if verdict.state == State.DOWN:
        return Confirmation(False, "down", verdict.reason, verdict)
    if verdict.has_work or verdict.progressed or verdict.state == State.RESTARTED:
        return Confirmation(False, "progress", f"{verdict.state}: {verdict.reason}", verdict)
    if verdict.state in (State.IDLE, State.SLEEPING):
        # An idle server whose test request failed is the exporter's call to make, through
        # LLMServerUnresponsive; here an idle read with no work is not a stall.
        return Confirmation(False, "idle", f"{verdict.state}: {verdict.reason}", verdict)
    return Confirmation(False, "error", f"{verdict.state}: {verdict.reason}", verdict)
