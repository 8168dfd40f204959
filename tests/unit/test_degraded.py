"""The degraded judgement: per engine, from its own counters, beside the state, never a restart."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from stallwatch.common.exporter_config import DegradedConfig, ExporterConfig, TargetConfig
from stallwatch.core.classify import State, classify
from stallwatch.core.degraded import NOT_DEGRADED, Degradation, judge
from stallwatch.core.history import PollOutcome, TargetHistory
from stallwatch.core.reading import EngineSample, Reading
from stallwatch.engines import PROFILES
from stallwatch.engines.profile import (
    ADMISSION_STALLED,
    DEGRADED_REASONS,
    PREEMPTION_STORM,
    QUEUE_TIME,
    THROUGHPUT_COLLAPSE,
)
from stallwatch.exporter.collector import TargetCollector

GAP = 15.0
CONFIG = DegradedConfig()
KINDS = tuple(PROFILES)
ROLES = (
    "running",
    "waiting",
    "kv_cache_usage",
    "steps",
    "generation_tokens",
    "prompt_tokens",
    "requests_completed",
    "preemptions",
    "queue_time_sum",
    "queue_time_count",
)


@dataclass(frozen=True)
class Server:
    """A server's counters, only the roles its engine publishes; `step` moves them by one poll."""

    kind: str
    running: float = 4.0
    waiting: float = 0.0
    kv_cache_usage: float = 0.5
    steps: float = 0.0
    generation_tokens: float = 0.0
    prompt_tokens: float = 0.0
    requests_completed: float = 0.0
    preemptions: float = 0.0
    queue_time_sum: float = 0.0
    queue_time_count: float = 0.0

    def reading(self, at: float) -> Reading:
        names = PROFILES[self.kind].role_names
        values = {role: getattr(self, role) if role in names else None for role in ROLES}
        sample = EngineSample(model_name="m", engine="0", kind=self.kind, **values)  # type: ignore[arg-type]
        return Reading(taken_at=at, engines=(sample,), process_start_time=1.0)


def healthy(server: Server) -> Server:
    """One healthy busy poll: 20 tokens/s per request, requests admitted and completed."""
    return replace(
        server,
        steps=server.steps + 20 * GAP,
        generation_tokens=server.generation_tokens + 20 * GAP * server.running,
        prompt_tokens=server.prompt_tokens + 500,
        requests_completed=server.requests_completed + 2,
        queue_time_sum=server.queue_time_sum + 2 * 0.5,
        queue_time_count=server.queue_time_count + 2,
    )


def slow(factor: float) -> Callable[[Server], Server]:
    def move(server: Server) -> Server:
        rate = 20 * factor * GAP
        return replace(
            healthy(server),
            steps=server.steps + rate,
            generation_tokens=server.generation_tokens + rate * server.running,
        )

    return move


def not_admitting(server: Server) -> Server:
    """Decode goes on for the one request left running; the queue is never admitted although
    the server has run four at once (`Running: 1, Waiting: 5`, as in the field report)."""
    return replace(
        server,
        running=1.0,
        waiting=5.0,
        steps=server.steps + 20 * GAP,
        generation_tokens=server.generation_tokens + 20 * GAP * server.running,
    )


def thrashing(server: Server) -> Server:
    return replace(healthy(server), preemptions=server.preemptions + 30, kv_cache_usage=0.99)


def full_and_not_admitting(server: Server) -> Server:
    """Every slot the server has used is taken by long requests; the queue waits for one."""
    return replace(not_admitting(server), running=server.running)


def queued_long(server: Server) -> Server:
    return replace(
        healthy(server),
        running=2.0,
        waiting=10.0,
        queue_time_sum=server.queue_time_sum + 2 * 90.0,
        queue_time_count=server.queue_time_count + 2,
    )


def run(
    kind: str,
    phases: list[tuple[int, Callable[[Server], Server]]],
    config: DegradedConfig = CONFIG,
    start: Server | None = None,
) -> list[Degradation]:
    """Poll a server through phases of (polls, move); the degradation after every poll."""
    server = start or Server(kind)
    at = 0.0
    previous = server.reading(at)
    state = NOT_DEGRADED
    seen: list[Degradation] = []
    for polls, move in phases:
        for _ in range(polls):
            server = move(server)
            at += GAP
            current = server.reading(at)
            verdict = classify(previous, current)
            state = judge(state, previous, current, verdict, config, now=at)
            seen.append(state)
            previous = current
    return seen


def judging(reason: str) -> list[str]:
    return [kind for kind in KINDS if PROFILES[kind].judges(reason)]


def not_judging(reason: str) -> list[str]:
    return [kind for kind in KINDS if not PROFILES[kind].judges(reason)]


WARMUP = (30, healthy)


def test_every_engine_judges_each_reason_or_says_why_not() -> None:
    """Per profile, each reason is either judged or explained in `degraded_unjudged`, never both."""
    for kind, profile in PROFILES.items():
        for reason in DEGRADED_REASONS:
            explained = bool(profile.degraded_unjudged.get(reason))
            assert profile.judges(reason) != explained, (kind, reason)
    assert judging(ADMISSION_STALLED) == ["vllm", "llamacpp", "lmdeploy"]
    assert judging(THROUGHPUT_COLLAPSE) == [
        "vllm",
        "sglang",
        "tgi",
        "llamacpp",
        "lmdeploy",
        "triton",
    ]
    assert judging(PREEMPTION_STORM) == ["vllm"]
    assert judging(QUEUE_TIME) == ["vllm"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_healthy_busy_server_never_reads_degraded(kind: str) -> None:
    """An hour of steady healthy work raises no reason on any engine."""
    seen = run(kind, [(240, healthy)])
    assert not any(state.degraded for state in seen)


@pytest.mark.parametrize("kind", judging(ADMISSION_STALLED))
def test_admission_stalled_after_its_window_and_not_before(kind: str) -> None:
    """Waiting, decode going on, nothing admitted: degraded once the whole window held it."""
    # The first read with a queue starts it: requests must wait at both ends of an interval.
    polls = int(CONFIG.admission_window_seconds / GAP) + 1
    seen = run(kind, [WARMUP, (polls, not_admitting)])
    assert not seen[-2].degraded
    assert seen[-1].reasons == (ADMISSION_STALLED,)
    assert "5 requests waiting" in seen[-1].details[ADMISSION_STALLED]


@pytest.mark.parametrize("kind", judging(ADMISSION_STALLED))
def test_one_admission_inside_the_window_starts_it_again(kind: str) -> None:
    """A single admission (prompt tokens moved) ends the condition; the window starts over."""
    polls = int(CONFIG.admission_window_seconds / GAP)
    admitted = slow(1.0)
    seen = run(
        kind, [WARMUP, (polls - 5, not_admitting), (1, admitted), (polls - 1, not_admitting)]
    )
    assert not any(state.degraded for state in seen)


@pytest.mark.parametrize("kind", not_judging(ADMISSION_STALLED))
def test_engines_without_admission_evidence_never_read_admission_stalled(kind: str) -> None:
    """Where the counters cannot show an admission, a queue is never called unadmitted."""
    seen = run(kind, [WARMUP, (100, not_admitting)])
    assert not any(ADMISSION_STALLED in state.reasons for state in seen)


@pytest.mark.parametrize("kind", judging(THROUGHPUT_COLLAPSE))
def test_throughput_collapse_against_the_servers_own_baseline(kind: str) -> None:
    """A tenth of the learned rate for the whole window reads collapse, with the measures."""
    polls = int(CONFIG.collapse_window_seconds / GAP)
    seen = run(kind, [WARMUP, (polls, slow(0.1))])
    assert not seen[-2].degraded
    assert seen[-1].reasons == (THROUGHPUT_COLLAPSE,)
    measures = seen[-1].measures
    assert measures.baseline_rate_per_request == pytest.approx(20.0)
    assert measures.rate_per_request == pytest.approx(2.0)


@pytest.mark.parametrize("kind", judging(THROUGHPUT_COLLAPSE))
def test_half_speed_is_not_a_collapse(kind: str) -> None:
    """Half the baseline (above the 0.25 factor) for an hour never reads degraded."""
    seen = run(kind, [WARMUP, (240, slow(0.5))])
    assert not any(state.degraded for state in seen)


def test_no_collapse_before_the_baseline_is_learned() -> None:
    """A server slow from its first poll has no baseline yet: nothing to fall below."""
    seen = run("vllm", [(5, healthy), (100, slow(0.05))])
    assert not any(THROUGHPUT_COLLAPSE in state.reasons for state in seen)


def test_the_baseline_is_bounded_and_slow_reads_do_not_teach_it() -> None:
    """The baseline keeps at most `baseline_samples` rates, none from a collapse."""
    config = DegradedConfig(baseline_samples=10, baseline_min_samples=5)
    seen = run("vllm", [(50, healthy), (20, slow(0.1))], config=config)
    assert len(seen[-1].baseline) == 10
    assert min(seen[-1].baseline) == pytest.approx(20.0)


def test_a_restart_forgets_the_baseline_and_every_reason() -> None:
    """A new process (a counter went down) starts with nothing learned."""
    polls = int(CONFIG.collapse_window_seconds / GAP)
    seen = run("vllm", [WARMUP, (polls, slow(0.1))])
    assert seen[-1].degraded
    before = Server("vllm", generation_tokens=1e9, steps=1e9).reading(0.0)
    after = Server("vllm").reading(GAP)
    verdict = classify(before, after)
    assert verdict.restart_detected
    state = judge(seen[-1], before, after, verdict, CONFIG, now=GAP)
    assert state == NOT_DEGRADED


def test_a_frozen_server_is_stalled_not_degraded() -> None:
    """Nothing moving is the restart alerts' case: every reason ends, the baseline stays."""
    polls = int(CONFIG.collapse_window_seconds / GAP)
    seen = run("vllm", [WARMUP, (polls, slow(0.1)), (2, lambda server: server)])
    assert seen[-3].degraded
    assert not seen[-1].degraded
    assert len(seen[-1].baseline) == WARMUP[0]


def test_preemption_storm_needs_both_the_rate_and_a_full_kv_cache() -> None:
    """2 preemptions/s with KV 99 % reads a storm; the same rate with KV half free does not."""
    polls = int(CONFIG.preemption_window_seconds / GAP)
    seen = run("vllm", [WARMUP, (polls, thrashing)])
    assert seen[-1].reasons == (PREEMPTION_STORM,)
    assert seen[-1].measures.preemptions_per_second == pytest.approx(2.0)
    assert seen[-1].measures.kv_cache_usage == pytest.approx(0.99)

    def half_free(server: Server) -> Server:
        return replace(thrashing(server), kv_cache_usage=0.5)

    assert not any(state.degraded for state in run("vllm", [WARMUP, (polls * 2, half_free)]))


def test_queue_time_above_its_threshold_for_the_window() -> None:
    """A mean queue time of 90 s (threshold 30 s) for the window reads queue_time."""
    polls = int(CONFIG.queue_time_window_seconds / GAP)
    seen = run("vllm", [WARMUP, (polls, queued_long)])
    assert not seen[-2].degraded
    assert seen[-1].reasons == (QUEUE_TIME,)
    assert seen[-1].measures.queue_time_seconds == pytest.approx(90.0)


def test_a_read_with_no_request_leaving_the_queue_keeps_the_queue_time_window() -> None:
    """No request left the queue: no evidence either way, the window is neither ended nor new."""
    polls = int(CONFIG.queue_time_window_seconds / GAP)

    def none_left(server: Server) -> Server:
        return replace(
            healthy(server),
            queue_time_sum=server.queue_time_sum,
            queue_time_count=server.queue_time_count,
        )

    seen = run("vllm", [WARMUP, (polls - 2, queued_long), (2, none_left)])
    assert seen[-1].reasons == (QUEUE_TIME,)


def test_disabled_judges_nothing() -> None:
    """`enabled: false` turns every reason off."""
    config = DegradedConfig(enabled=False)
    seen = run("vllm", [WARMUP, (100, not_admitting), (100, thrashing)], config=config)
    assert not any(state.degraded for state in seen)


def test_thresholds_come_from_the_config() -> None:
    """A shorter window and a stricter factor change the judgement as configured."""
    config = DegradedConfig(collapse_window_seconds=60.0, collapse_factor=0.6)
    seen = run("vllm", [WARMUP, (4, slow(0.5))], config=config)
    assert seen[-1].reasons == (THROUGHPUT_COLLAPSE,)
    assert not seen[-2].degraded


def test_the_degraded_state_is_never_a_restart_state() -> None:
    """A degraded server's state stays busy: no restart alert can fire on it."""
    server = Server("vllm")
    polls = int(CONFIG.admission_window_seconds / GAP) + 1
    seen = run("vllm", [WARMUP, (polls, not_admitting)], start=server)
    assert seen[-1].degraded
    previous = not_admitting(server)
    verdict = classify(previous.reading(0.0), not_admitting(previous).reading(GAP))
    assert verdict.state == State.BUSY


def test_the_exporter_publishes_the_reasons_and_the_measures_behind_them() -> None:
    """Through TargetHistory and the collector: the degraded reasons its engine judges, 1 for
    the one degraded, and the rate per request beside its baseline."""
    history = TargetHistory()
    server = Server("vllm")
    at = 0.0
    moves = [healthy] * 30 + [slow(0.1)] * (int(CONFIG.collapse_window_seconds / GAP) + 1)
    for move in [healthy, *moves]:
        reading = server.reading(at)
        verdict = classify(history.baseline, reading)
        history = history.advance(
            PollOutcome(verdict=verdict, reading=reading, finished_at=at, duration_seconds=0.0)
        )
        server = move(server)
        at += GAP
    config = ExporterConfig(targets=(TargetConfig(name="gpu-a", url="http://127.0.0.1:1"),))
    collector = TargetCollector(lambda: config, lambda: {"gpu-a": history})
    samples = {
        (sample.name, sample.labels.get("reason")): sample.value
        for family in collector.collect()
        for sample in family.samples
        if sample.labels.get("target") == "gpu-a"
    }
    degraded = {
        reason: value
        for (name, reason), value in samples.items()
        if name == "stallwatch_target_degraded"
    }
    assert degraded == {
        ADMISSION_STALLED: 0,
        THROUGHPUT_COLLAPSE: 1,
        PREEMPTION_STORM: 0,
        QUEUE_TIME: 0,
    }
    assert samples[("stallwatch_generation_tokens_per_second_per_request", None)] == pytest.approx(
        2.0
    )
    assert samples[
        ("stallwatch_generation_tokens_per_second_per_request_baseline", None)
    ] == pytest.approx(20.0)
    assert samples[("stallwatch_preemptions_per_second", None)] == 0
    assert samples[("stallwatch_kv_cache_usage_ratio", None)] == pytest.approx(0.5)


def test_one_stalled_read_between_busy_ones_neither_ends_nor_hides_a_collapse() -> None:
    """A server so slow that every other poll sees no step still reads collapse, measured from
    the last busy read; two stalled reads in a row end it (the stuck case)."""
    polls = int(CONFIG.collapse_window_seconds / GAP)

    def frozen(server: Server) -> Server:
        return server

    def slow_step(server: Server) -> Server:
        # One step's worth of two polls at a tenth of the speed, then nothing: alternating.
        return replace(
            server,
            steps=server.steps + 2 * 20 * 0.1 * GAP,
            generation_tokens=server.generation_tokens + 2 * 20 * 0.1 * GAP * server.running,
        )

    alternating: list[tuple[int, Callable[[Server], Server]]] = []
    for _ in range(polls // 2 + 1):
        alternating += [(1, frozen), (1, slow_step)]
    seen = run("vllm", [WARMUP, *alternating])
    assert seen[-1].reasons == (THROUGHPUT_COLLAPSE,)
    assert seen[-1].measures.rate_per_request == pytest.approx(2.0)
    assert seen[-2].reasons == seen[-3].reasons == (THROUGHPUT_COLLAPSE,)
    ended = run("vllm", [WARMUP, *alternating, (2, frozen)])
    assert not ended[-1].degraded


@pytest.mark.parametrize("kind", ["vllm", "llamacpp"])
def test_a_full_server_with_a_queue_is_not_degraded(kind: str) -> None:
    """Requests waiting for a server running as many as it has run at most are capacity, not
    degradation: no admission_stalled, however long."""
    polls = int(CONFIG.admission_window_seconds / GAP) * 2
    seen = run(kind, [WARMUP, (polls, full_and_not_admitting)])
    assert all(ADMISSION_STALLED not in state.reasons for state in seen)


def test_long_queue_times_of_a_full_server_are_not_degraded() -> None:
    """Long queue times at full occupancy (a batch job filling every slot) are not degraded."""
    polls = int(CONFIG.queue_time_window_seconds / GAP) * 2

    def full_queue(server: Server) -> Server:
        return replace(queued_long(server), running=server.running)

    seen = run("vllm", [WARMUP, (polls, full_queue)])
    assert all(QUEUE_TIME not in state.reasons for state in seen)


def test_long_queue_times_with_the_kv_cache_full_are_not_degraded() -> None:
    """Long queue times with the KV cache full wait for capacity: not degraded by queue time."""
    polls = int(CONFIG.queue_time_window_seconds / GAP) * 2

    def kv_full_queue(server: Server) -> Server:
        return replace(queued_long(server), kv_cache_usage=0.97)

    seen = run("vllm", [WARMUP, (polls, kv_full_queue)])
    assert all(QUEUE_TIME not in state.reasons for state in seen)


def test_the_running_seen_is_bounded() -> None:
    """The memory of running requests holds at most baseline_samples reads."""
    config = replace(CONFIG, baseline_samples=5)
    seen = run("vllm", [(30, healthy)], config=config)
    assert len(seen[-1].running_seen) == 5
