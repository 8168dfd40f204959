"""Judge whether two fresh reads of a server show a stall (the restarter's last look)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from stallwatch.core.classify import State, Verdict, classify
from stallwatch.core.reading import EngineSample, Reading

# `no_answer`: both reads connected and got no answer in time (a hung server). It confirms the
# alerts whose stall that is (`confirm.hung_confirms`); for any other alert it is `down`.
Refusal = Literal["progress", "idle", "down", "error", "no_answer"]
# Why a read gave no reading: not connected (refused, reset, not in time); connected and no
# answer in time; or an answer that is no reading (an error status, too large).
ReadFailure = Literal["unreachable", "no_answer", "unusable"]


@dataclass(frozen=True)
class Confirmation:
    confirmed: bool
    refusal: Refusal | None
    detail: str
    verdict: Verdict | None = None
    # The later of the two readings, when both reads gave one: what a restart window's last
    # look compares with its first.
    reading: Reading | None = None


@dataclass(frozen=True)
class FailedRead:
    """A confirmation read that gave no reading, and why."""

    failure: ReadFailure
    detail: str


ReadAttempt = Reading | FailedRead


def worth_a_second_read(first: ReadAttempt) -> bool:
    """Whether the first read can be half of a confirmation: a reading, or a connection that got
    no answer (a refused connection or an error status already settles it)."""
    return isinstance(first, Reading) or first.failure == "no_answer"


def judge_attempts(first: ReadAttempt, second: ReadAttempt | None) -> Confirmation:
    """Judge the confirmation's reads; `second` is None when the first settled it.

    Two readings are judged by their counters. Two reads that both connected and got no
    answer are `no_answer`: nothing answered from the first read to the second. Any other
    failed read is `down`: a connection not made, or a server that answered one of the reads
    (so it is not hung) without a reading to judge.
    """
    if isinstance(first, Reading):
        if isinstance(second, Reading):
            return judge_reads(first, second)
        if second is None:
            return Confirmation(False, "error", "a first reading and no second read")
        return Confirmation(False, "down", second.detail)
    if second is None:
        return Confirmation(False, "down", first.detail)
    if isinstance(second, Reading):
        return Confirmation(False, "down", f"{first.detail}; then the second read answered")
    if first.failure == second.failure == "no_answer":
        return Confirmation(
            False, "no_answer", f"connected, no answer, twice: {first.detail}; {second.detail}"
        )
    return Confirmation(False, "down", f"{first.detail}; then {second.detail}")


def judge_confirmation(verdict: Verdict) -> Confirmation:
    """Whether a verdict from two fresh reads shows a server that is really stuck."""
    if verdict.state == State.STALLED:
        return Confirmation(True, None, verdict.reason, verdict)
    if verdict.state == State.DOWN:
        return Confirmation(False, "down", verdict.reason, verdict)
    if verdict.state == State.UNKNOWN and not verdict.progressed:
        # Work present and nothing that could show progress: no evidence either way.
        return Confirmation(False, "error", f"{verdict.state}: {verdict.reason}", verdict)
    if verdict.has_work or verdict.progressed or verdict.state == State.RESTARTED:
        return Confirmation(False, "progress", f"{verdict.state}: {verdict.reason}", verdict)
    if verdict.state in (State.IDLE, State.SLEEPING):
        # An idle server whose test request failed is the exporter's call to make, through
        # LLMServerUnresponsive; here an idle read with no work is not a stall.
        return Confirmation(False, "idle", f"{verdict.state}: {verdict.reason}", verdict)
    return Confirmation(False, "error", f"{verdict.state}: {verdict.reason}", verdict)


def judge_reads(first: Reading, second: Reading) -> Confirmation:
    """Judge two fresh reads; counters that stand still only because they are absent (never
    there, or gone by the second read) are no evidence of a stall, nor of an idle server."""
    verdict = classify(first, second)
    confirmation = replace(judge_confirmation(verdict), reading=second)
    if confirmation.confirmed:
        stalled = {(e.model_name, e.engine) for e in verdict.engines if e.state == State.STALLED}
        missing = missing_signals(first, second, stalled, stall_evidence)
    elif confirmation.refusal == "idle":
        missing = missing_signals(first, second, set(second.engine_map()), any_counter)
    else:
        return confirmation
    if missing is None:
        return confirmation
    detail = f"{verdict.state} only by absence: {missing}; absent signals are no evidence"
    return Confirmation(False, "error", detail, verdict, second)


def stall_evidence(engine: EngineSample) -> tuple[str, ...]:
    """The counters every step of the engine's running work moves (its profile says which):
    a stall is these standing still."""
    names = engine.profile.role_names
    return tuple(names[role] for role in engine.profile.stall_evidence if role in names)


def any_counter(engine: EngineSample) -> tuple[str, ...]:
    """Every progress counter the engine's profile knows."""
    return tuple(engine.counters())


def missing_signals(
    first: Reading,
    second: Reading,
    engines: set[tuple[str, str]],
    evidence_of: Callable[[EngineSample], tuple[str, ...]],
) -> str | None:
    """What is absent that `engines` need to show a standstill, or None if nothing is.

    Each engine must carry one of its evidence counters (`evidence_of`) in both reads, and no
    counter it had in the first read may be gone from the second.
    """
    before, after = first.engine_map(), second.engine_map()
    for key in sorted(engines):
        old, new = before.get(key), after.get(key)
        name = f"engine {key[1]} of {key[0]}"
        if old is None or new is None:
            return f"{name} is not in both reads"
        old_counters, new_counters = old.counters(), new.counters()
        gone = [
            c
            for c, value in old_counters.items()
            if value is not None and new_counters.get(c) is None
        ]
        if gone:
            return f"{name}: {', '.join(gone)} gone between the two reads"
        evidence = evidence_of(new)
        if not any(
            old_counters.get(c) is not None and new_counters.get(c) is not None for c in evidence
        ):
            return f"{name}: none of {', '.join(evidence) or 'its counters'} in both reads"
    return None
