"""The idle test request, as pure code: whether one is due now, and what its answer means.

The exporter and the replay send the request and take the fresh read; this decides when to
send it and what the outcome means. `now` is always passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stallwatch.core.classify import State, Verdict, classify, with_test_request_result
from stallwatch.core.reading import Reading

# Polls run on a fixed schedule, but each starts a few milliseconds late or early; a poll that
# starts within this share of an interval before the due time counts as on time. Without it,
# every other test request would slip one poll later on scheduling noise alone.
ON_TIME_SHARE_OF_INTERVAL = 0.1


def idle_test_request_due(
    verdict: Verdict,
    last_proven_alive_at: float | None,
    now: float,
    *,
    min_interval: float,
    poll_interval: float,
) -> bool:
    """Whether this poll sends the idle test request `verdict` asks for.

    `last_proven_alive_at` is when the server last showed it was alive: its counters moved, or
    a test request answered (None: never, or not since it restarted). A failed test request
    proves nothing, so the next idle poll sends another: two failures in a row are what
    `LLMServerUnresponsive` needs.
    """
    if not verdict.test_request_needed or verdict.progressed:
        return False  # work present, or its own counters show requests completing
    if verdict.restart_detected or last_proven_alive_at is None:
        return True  # a new process, or one never proven alive: nothing to lean on
    if now < last_proven_alive_at:
        return True  # the clock went back: the age of the proof is unknown
    slack = poll_interval * ON_TIME_SHARE_OF_INTERVAL
    return now - last_proven_alive_at >= min_interval - slack


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"


def deferred_verdict(
    verdict: Verdict, last_proven_alive_at: float | None, now: float, *, min_interval: float
) -> Verdict:
    """The verdict of an idle poll whose test request `idle_test_request_due` held back: idle, on a
    proof.

    It is `idle`, never `unresponsive`: nothing failed. The reason says when the server last
    proved it was alive (now, when this read shows an engine completing requests) and when the
    next test request is due.
    """
    if verdict.progressed:
        proven_at = now
    elif last_proven_alive_at is not None:
        proven_at = last_proven_alive_at
    else:
        raise ValueError("nothing proved the server alive: its test request is due")
    age = max(0.0, now - proven_at)
    due_in = max(0.0, min_interval - age)
    read = "requests completed on an engine" if verdict.progressed else "nothing completed"
    return replace(
        verdict,
        state=State.IDLE,
        test_request_needed=False,
        reason=(
            f"no work and {read}; proven alive {_seconds(age)} ago, "
            f"next test request in {_seconds(due_in)}"
        ),
    )


@dataclass(frozen=True)
class SettledTestRequest:
    """The poll's final verdict, the reading it stands on, and whether the test request failed."""

    verdict: Verdict
    reading: Reading
    test_requests_failed: int


def settle_idle_test_request(
    verdict: Verdict,
    reading: Reading,
    *,
    answered: bool,
    detail: str,
    reread: Reading | None = None,
) -> SettledTestRequest:
    """The verdict of a poll whose idle test request answered (or not).

    `reading` is the read that asked for the test request; `reread` is the fresh read taken
    after a failed one (None when none was taken or it failed). A reread that shows the engine
    moving wins over the failed request: work may have arrived while the request waited, and a
    busy server is never unresponsive. A new process in the reread is not such proof.
    """
    if answered:
        return SettledTestRequest(with_test_request_result(verdict, True, detail), reading, 0)
    if reread is not None and reread.has_engines:
        recheck = classify(reading, reread)
        if recheck.progressed and recheck.state != State.RESTARTED:
            return SettledTestRequest(recheck, reread, 1)
    return SettledTestRequest(with_test_request_result(verdict, False, detail), reading, 1)
