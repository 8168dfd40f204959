"""What the exporter remembers about a target between polls: pure, `now` passed in."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from stallwatch.common.exporter_config import DEFAULT_DEGRADED, DegradedConfig
from stallwatch.core.classify import State, Verdict
from stallwatch.core.degraded import NOT_DEGRADED, Degradation, judge
from stallwatch.core.reading import Reading

_NO_ERRORS: Mapping[str, int] = MappingProxyType({})
# The states a restart alert watches: a run of them is one stall, however it changes between them.
STALL_STATES = frozenset({State.STALLED, State.UNRESPONSIVE, State.HUNG})


@dataclass(frozen=True)
class PollOutcome:
    """Everything one poll produced, as data."""

    verdict: Verdict
    reading: Reading | None
    finished_at: float
    duration_seconds: float
    test_requests_sent: int = 0
    test_requests_failed: int = 0
    error_reason: str | None = None
    # A test request was asked for but not due yet: the verdict leans on an earlier proof.
    test_request_deferred: bool = False

    @property
    def started_at(self) -> float:
        """When the poll read the server (and sent its test request, if any)."""
        return self.finished_at - self.duration_seconds


@dataclass(frozen=True)
class TargetHistory:
    """The running record of one target, advanced by one poll at a time."""

    verdict: Verdict | None = None
    baseline: Reading | None = None
    state_polls: int = 0
    last_progress_at: float | None = None
    # The latest moment the current process is known to have been alive (see `_proof_of_life`);
    # None before any proof and after a restart.
    last_proven_alive_at: float | None = None
    last_poll_at: float | None = None
    last_poll_duration_seconds: float | None = None
    polls: int = 0
    restarts_detected: int = 0
    test_requests: int = 0
    test_request_failures: int = 0
    poll_errors: Mapping[str, int] = field(default_factory=lambda: _NO_ERRORS)
    # The current stall: the time of the last read before it (None: not stalled), and how long
    # the reads have shown it so far.
    stall_since: float | None = None
    stall_seconds: float = 0.0
    # Stalls that ended with the server moving again, by itself (a restart ends none).
    recovered_stalls: int = 0
    longest_recovered_stall_seconds: float = 0.0
    last_recovered_stall_seconds: float | None = None
    # Slow, not stuck: for people only, never a restart state.
    degradation: Degradation = NOT_DEGRADED

    @property
    def state(self) -> State | None:
        return self.verdict.state if self.verdict is not None else None

    def advance(
        self, outcome: PollOutcome, degraded: DegradedConfig = DEFAULT_DEGRADED
    ) -> TargetHistory:
        verdict = outcome.verdict
        same_state = self.verdict is not None and self.verdict.state == verdict.state
        errors = self.poll_errors
        if outcome.error_reason is not None:
            counts = dict(errors)
            counts[outcome.error_reason] = counts.get(outcome.error_reason, 0) + 1
            errors = MappingProxyType(counts)
        proven_idle = (
            verdict.state == State.IDLE
            and not verdict.test_request_needed
            and not outcome.test_request_deferred
        )
        shows_life = verdict.progressed or proven_idle
        stall_since, stall_seconds = self._stall(outcome)
        recovered = self.stall_since is not None and stall_since is None and shows_life
        return replace(
            self,
            verdict=verdict,
            # A down server keeps the last baseline, so the next read can still tell a
            # restart (new start time) from a process that merely stopped answering.
            baseline=outcome.reading if outcome.reading is not None else self.baseline,
            state_polls=self.state_polls + 1 if same_state else 1,
            last_progress_at=outcome.finished_at if shows_life else self.last_progress_at,
            last_proven_alive_at=self._proof_of_life(outcome),
            last_poll_at=outcome.finished_at,
            last_poll_duration_seconds=outcome.duration_seconds,
            polls=self.polls + 1,
            restarts_detected=self.restarts_detected + (1 if verdict.restart_detected else 0),
            test_requests=self.test_requests + outcome.test_requests_sent,
            test_request_failures=self.test_request_failures + outcome.test_requests_failed,
            poll_errors=errors,
            stall_since=stall_since,
            stall_seconds=stall_seconds,
            recovered_stalls=self.recovered_stalls + (1 if recovered else 0),
            longest_recovered_stall_seconds=(
                max(self.longest_recovered_stall_seconds, self.stall_seconds)
                if recovered
                else self.longest_recovered_stall_seconds
            ),
            last_recovered_stall_seconds=(
                self.stall_seconds if recovered else self.last_recovered_stall_seconds
            ),
            degradation=judge(
                self.degradation,
                self.baseline,
                outcome.reading,
                verdict,
                degraded,
                now=outcome.started_at,
            ),
        )

    def _stall(self, outcome: PollOutcome) -> tuple[float | None, float]:
        """The stall once `outcome` is counted: since when, and how long the reads show it.

        It starts at the read before the first stalled (or unresponsive, or hung) poll: no
        progress since then is what that poll proved. It ends at any other state.
        """
        if outcome.verdict.state not in STALL_STATES:
            return None, 0.0
        since = self.stall_since
        if since is None:
            since = self.baseline.taken_at if self.baseline is not None else outcome.started_at
        return since, max(0.0, outcome.started_at - since)

    def _proof_of_life(self, outcome: PollOutcome) -> float | None:
        """When the server last proved it was alive, once `outcome` is counted.

        A test request that answered proves it from the moment it was sent. Counters that
        moved prove it only from the previous read on, so that read's time is taken: the
        completion of a test request, seen on the next poll, does not push the next one later.
        """
        verdict = outcome.verdict
        if outcome.test_requests_sent > outcome.test_requests_failed:
            return outcome.started_at
        if verdict.progressed:
            return self.baseline.taken_at if self.baseline is not None else outcome.started_at
        if verdict.restart_detected:
            return None  # what was proven was the old process
        return self.last_proven_alive_at
