"""Slow, not stuck: whether a server that still makes progress is degraded, as pure code.

A judgement beside the state, never a restart state: a degraded server serves its requests,
only far too slowly or not its queue, and a restart would fail every one of them. It is judged
from two reads of the server's own counters, per engine profile (`EngineProfile.judges`), and
only on a read whose state is `busy`: a frozen server is `stalled`, the restart alerts' case.
Each reason must hold on every busy read of its window. One `stalled` read between two busy ones
(a server so slow that a poll saw no step) changes nothing, and the next busy read is measured
from the last busy one; two in a row, or any other state, end every reason. No I/O and no clock:
`now` is passed in, readings carry the time they were taken.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from stallwatch.common.exporter_config import DegradedConfig
from stallwatch.core.classify import State, Verdict
from stallwatch.core.reading import EngineSample, Reading
from stallwatch.engines import profile_for
from stallwatch.engines.profile import (
    ADMISSION_STALLED,
    DEGRADED_REASONS,
    PREEMPTION_STORM,
    QUEUE_TIME,
    THROUGHPUT_COLLAPSE,
    EngineProfile,
)

_NONE: Mapping[str, float] = MappingProxyType({})
_NO_TEXT: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class Measures:
    """The figures behind the judgement, from the last two reads (None: not measured)."""

    # Output tokens per second per running request, and this server's learned baseline of it.
    rate_per_request: float | None = None
    baseline_rate_per_request: float | None = None
    preemptions_per_second: float | None = None
    kv_cache_usage: float | None = None
    # The mean queue time of the requests that left the queue between the two reads.
    queue_time_seconds: float | None = None


@dataclass(frozen=True)
class Degradation:
    """What the exporter remembers about a target's degradation, advanced one read at a time.

    `since`: for each reason whose condition holds, the time of the read before the first
    read that showed it. `baseline`: the rates per request of the latest healthy busy reads
    (at most `baseline_samples`), emptied on a restart. `reasons`: the reasons degraded now.
    """

    since: Mapping[str, float] = field(default_factory=lambda: _NONE)
    baseline: tuple[float, ...] = ()
    # The requests running at the latest busy reads (at most `baseline_samples`), emptied on a
    # restart: the most this server has recently run at once.
    running_seen: tuple[float, ...] = ()
    measures: Measures = Measures()
    reasons: tuple[str, ...] = ()
    details: Mapping[str, str] = field(default_factory=lambda: _NO_TEXT)
    # The last busy read, which the next busy read is measured from, and the stalled reads
    # since it (at most one is let through).
    last_busy: Reading | None = None
    stalled_reads: int = 0

    @property
    def degraded(self) -> bool:
        return bool(self.reasons)


NOT_DEGRADED = Degradation()


def _common(previous: Reading, current: Reading) -> list[tuple[EngineSample, EngineSample]]:
    before = previous.engine_map()
    return [(before[e.key], e) for e in current.engines if e.key in before]


def _delta(pairs: Iterable[tuple[EngineSample, EngineSample]], role: str) -> float | None:
    """How much `role` grew over the engines known in both reads; None when none knew it."""
    total, found = 0.0, False
    for old, new in pairs:
        before, after = getattr(old, role), getattr(new, role)
        if before is None or after is None:
            continue
        total += after - before
        found = True
    return total if found else None


def _total(samples: Iterable[EngineSample], role: str) -> float | None:
    values = [value for sample in samples if (value := getattr(sample, role)) is not None]
    return sum(values) if values else None


def _rate_per_request(
    profile: EngineProfile, pairs: list[tuple[EngineSample, EngineSample]], elapsed: float
) -> float | None:
    grown = _delta(pairs, profile.throughput_role)
    if grown is None or grown < 0:
        return None
    rate = grown / elapsed
    if profile.throughput_role == "steps":
        return rate  # each decode step is one token for every running request
    running = [
        (old.running or 0.0) + (new.running or 0.0)
        for old, new in pairs
        if old.running is not None and new.running is not None
    ]
    mean_running = sum(running) / 2 if running else 0.0
    return rate / mean_running if mean_running >= 1 else None


def _admission_stalled(
    profile: EngineProfile, pairs: list[tuple[EngineSample, EngineSample]]
) -> bool:
    """Requests waited at both reads, and none was admitted between them."""
    waiting_before = _total((old for old, _ in pairs), "waiting")
    waiting_now = _total((new for _, new in pairs), "waiting")
    if not waiting_before or not waiting_now:
        return False
    running_before = _total((old for old, _ in pairs), "running") or 0.0
    running_now = _total((new for _, new in pairs), "running") or 0.0
    if running_now > running_before:
        return False
    moved = [_delta(pairs, role) for role in profile.admission_evidence]
    known = [value for value in moved if value is not None]
    return bool(known) and not any(value > 0 for value in known)


def _saturated(
    state: Degradation,
    pairs: list[tuple[EngineSample, EngineSample]],
    running_now: float,
    config: DegradedConfig,
) -> bool:
    """Whether the server is full: as many requests running as it has recently run at most (or
    no busy read to tell), or its KV cache full. Requests waiting for a full server wait for
    capacity (a batch job that fills every slot), not because the server is degraded."""
    usages = [new.kv_cache_usage for _, new in pairs if new.kv_cache_usage is not None]
    if usages and max(usages) >= config.kv_cache_full:
        return True
    return not state.running_seen or running_now >= max(state.running_seen)


def judge(
    state: Degradation,
    previous: Reading | None,
    current: Reading | None,
    verdict: Verdict,
    config: DegradedConfig,
    now: float,
) -> Degradation:
    """The degradation once the read `current` (judged `verdict`) follows `previous`."""
    if verdict.restart_detected:
        return NOT_DEGRADED  # a new process: nothing learned of the old one carries over
    if verdict.state == State.STALLED and state.last_busy is not None and not state.stalled_reads:
        return replace(state, stalled_reads=1)
    if state.stalled_reads and state.last_busy is not None:
        previous = state.last_busy
    if (
        not config.enabled
        or previous is None
        or current is None
        or verdict.state != State.BUSY
        or not current.has_engines
        or current.engine_kind != previous.engine_kind
    ):
        return _reset(state, config)
    elapsed = current.taken_at - previous.taken_at
    pairs = _common(previous, current)
    if elapsed <= 0 or not pairs:
        return _reset(state, config)
    profile = profile_for(current.engines[0].kind)
    holds: dict[str, bool | None] = {}  # None: no evidence either way; the reason stays as is
    details: dict[str, str] = {}

    rate = (
        _rate_per_request(profile, pairs, elapsed) if profile.judges(THROUGHPUT_COLLAPSE) else None
    )
    baseline = state.baseline
    reference = statistics.median(baseline) if baseline else None
    learned = reference is not None and len(baseline) >= config.baseline_min_samples
    if rate is not None:
        slow = learned and reference is not None and rate < config.collapse_factor * reference
        holds[THROUGHPUT_COLLAPSE] = slow
        if slow:
            details[THROUGHPUT_COLLAPSE] = (
                f"{rate:.3g} output tokens/s per running request, below "
                f"{config.collapse_factor:g} x this server's baseline of {reference:.3g}"
            )
        else:
            baseline = (*baseline, rate)[-config.baseline_samples :]

    running_now = _total((new for _, new in pairs), "running") or 0.0
    saturated = _saturated(state, pairs, running_now, config)
    if profile.judges(ADMISSION_STALLED):
        stalled = _admission_stalled(profile, pairs) and not saturated
        holds[ADMISSION_STALLED] = stalled
        if stalled:
            details[ADMISSION_STALLED] = (
                f"{_total((new for _, new in pairs), 'waiting') or 0:g} requests waiting, "
                "none admitted (running not growing, no prompt tokens, no completions)"
            )

    preemption_rate: float | None = None
    kv_usage: float | None = None
    if profile.judges(PREEMPTION_STORM):
        preempted = _delta(pairs, "preemptions")
        usages = [new.kv_cache_usage for _, new in pairs if new.kv_cache_usage is not None]
        kv_usage = max(usages) if usages else None
        if preempted is not None and preempted >= 0:
            preemption_rate = preempted / elapsed
        if preemption_rate is not None and kv_usage is not None:
            storm = (
                preemption_rate > config.preemptions_per_second and kv_usage >= config.kv_cache_full
            )
            holds[PREEMPTION_STORM] = storm
            if storm:
                details[PREEMPTION_STORM] = (
                    f"{preemption_rate:.3g} preemptions/s with KV cache {kv_usage:.0%} full"
                )

    queue_time: float | None = None
    if profile.judges(QUEUE_TIME):
        left = _delta(pairs, "queue_time_count")
        waited = _delta(pairs, "queue_time_sum")
        if left is not None and waited is not None and left > 0 and waited >= 0:
            queue_time = waited / left
            long_wait = queue_time > config.queue_time_seconds and not saturated
            holds[QUEUE_TIME] = long_wait
            if long_wait:
                details[QUEUE_TIME] = (
                    f"requests queued {queue_time:.3g} s on average, "
                    f"above {config.queue_time_seconds:g} s"
                )

    windows = {
        ADMISSION_STALLED: config.admission_window_seconds,
        THROUGHPUT_COLLAPSE: config.collapse_window_seconds,
        PREEMPTION_STORM: config.preemption_window_seconds,
        QUEUE_TIME: config.queue_time_window_seconds,
    }
    since: dict[str, float] = {}
    for reason in DEGRADED_REASONS:
        held = holds.get(reason)
        if held is None and reason in state.since:
            since[reason] = state.since[reason]
        elif held:
            since[reason] = state.since.get(reason, previous.taken_at)
    reasons = tuple(r for r in DEGRADED_REASONS if r in since and now - since[r] >= windows[r])
    return Degradation(
        since=MappingProxyType(since),
        baseline=baseline,
        running_seen=(*state.running_seen, running_now)[-config.baseline_samples :],
        measures=Measures(
            rate_per_request=rate,
            baseline_rate_per_request=reference if learned else None,
            preemptions_per_second=preemption_rate,
            kv_cache_usage=kv_usage,
            queue_time_seconds=queue_time,
        ),
        reasons=reasons,
        details=MappingProxyType({r: details.get(r) or state.details.get(r, "") for r in reasons}),
        last_busy=current,
    )


def _reset(state: Degradation, config: DegradedConfig) -> Degradation:
    """Every reason ended (a read that was not busy); the baseline is kept."""
    learned = len(state.baseline) >= config.baseline_min_samples
    reference = statistics.median(state.baseline) if learned else None
    return Degradation(
        baseline=state.baseline,
        running_seen=state.running_seen,
        measures=Measures(baseline_rate_per_request=reference),
    )
