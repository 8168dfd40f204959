"""One simulated model server on the virtual clock: the simulator's engine, hangs, legitimate
silences (it freezes and goes on by itself), slow restarts."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from stallwatch.core.holds import HoldEvent
from stallwatch.core.reading import EngineSample, Reading
from stallwatch.replay.clock import Scheduler
from stallwatch.replay.config import ReplayConfig
from stallwatch.replay.degraded import DegradedPeriod
from stallwatch.replay.silences import (
    NO_SILENCES,
    SilenceCause,
    SilenceOutcome,
    SilencePlan,
    shape_of,
)
from stallwatch.simulator.engine import Engine, EngineConfig, SimRequest, TokenEvent
from stallwatch.simulator.metrics import load_families

MODEL_NAME = "model"
# The name the restarter knows the server by (its holds are taken under it).
TARGET_NAME = "model-server"

Done = Callable[[float, int], None]  # (time, HTTP status); 200 = answered, 0 = refused


@dataclass
class _Pending:
    kind: str
    done: Done


@dataclass
class _Silence:
    """The engine frozen now, until `ends_at`, for `causes`; it then goes on by itself."""

    started_at: float
    ends_at: float
    causes: list[SilenceCause]
    held: bool = False

    def outcome(self, restarted_at: float | None) -> SilenceOutcome:
        return SilenceOutcome(
            self.started_at,
            tuple(self.causes),
            self.ends_at - self.started_at,
            self.held,
            None if restarted_at is None else restarted_at - self.started_at,
        )


def engine_reading(engine: Engine, process_start_time: float, taken_at: float) -> Reading:
    """What the exporter's parser reads from this engine's `/metrics` (same values, no text)."""
    stats = engine.stats
    gauges = stats.gauges
    completed = stats.labelled_counters.get("vllm:request_success", {})
    queue = stats.histograms["vllm:request_queue_time_seconds"]
    sample = EngineSample(
        model_name=MODEL_NAME,
        engine="0",
        running=gauges.get("vllm:num_requests_running"),
        waiting=gauges.get("vllm:num_requests_waiting"),
        kv_cache_usage=gauges.get("vllm:kv_cache_usage_perc"),
        awake=1.0 if engine.sleep_level == 0 else 0.0,
        steps=float(stats.histograms["vllm:iteration_tokens_total"].count),
        generation_tokens=stats.counters.get("vllm:generation_tokens", 0.0),
        prompt_tokens=stats.counters.get("vllm:prompt_tokens", 0.0),
        requests_completed=sum(completed.values()),
        preemptions=stats.counters.get("vllm:num_preemptions", 0.0),
        queue_time_sum=float(queue.total),
        queue_time_count=float(queue.count),
    )
    return Reading(taken_at=taken_at, engines=(sample,), process_start_time=process_start_time)


class SimulatedServer:
    """One model server on the virtual clock: engine, restarts that take minutes, hangs."""

    def __init__(
        self, config: ReplayConfig, scheduler: Scheduler, silences: SilencePlan = NO_SILENCES
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.silence_plan = silences
        self.silence: _Silence | None = None
        self.silences: list[SilenceOutcome] = []
        self.shapes_seen: set[int] = set()
        self.starts = 0
        # The trainer's holds, as the restarter's journal keeps them (`/-/hold`, `/-/unhold`);
        # only stallwatch's restarter reads them: the old watchdogs know no holds.
        self.hold_events: list[HoldEvent] = []
        self._families = load_families()
        self._ids = itertools.count(1)
        self._pending: dict[str, _Pending] = {}
        self.engine: Engine | None = None
        self.process_start_time = 0.0
        self.up_at = 0.0
        self.hung_since: float | None = None
        # (time, by whom, was it hung, was it in a legitimate silence)
        self.restarts: list[tuple[float, str, bool, bool]] = []
        self.hangs: list[tuple[float, float | None]] = []  # (start, end)
        # Per hang: did its frozen gauges read running and waiting at 0 (idle when it hung)?
        self.hangs_frozen_at_zero: list[bool] = []
        self.loading_seconds = 0.0
        self.failed_500 = 0
        self.refused = 0
        self.completed = 0
        self.test_requests = 0
        self.test_requests_to_busy = 0
        self.test_requests_in_silence = 0
        self.error_times: list[float] = []
        # The degraded period in force (a slow band outlives a restart: its cause is not the
        # process), and every restart made during one, by whom.
        self.degraded: DegradedPeriod | None = None
        self.restarts_in_degraded: list[str] = []
        self._boot(0.0)

    def _engine_config(self) -> EngineConfig:
        step = self.config.tokens_per_step
        return EngineConfig(
            max_num_seqs=self.config.max_num_seqs,
            max_num_batched_tokens=max(1, 2048 // step),
            tokens_per_second=self.config.tokens_per_second / step,
            prefill_tokens_per_second=self.config.prefill_tokens_per_second / step,
            kv_cache_tokens=1_048_576 // step,
            max_model_len=8192,
        )

    def _boot(self, now: float) -> None:
        self.engine = Engine(self._engine_config(), self._families, now)
        self._apply_degraded()

    # Degraded periods: the engine goes on, badly.

    def degrade(self, period: DegradedPeriod) -> None:
        self.degraded = period
        self._apply_degraded()

    def end_degraded(self, now: float) -> None:
        self.degraded = None
        self._apply_degraded()

    def _apply_degraded(self) -> None:
        engine = self.engine
        if engine is None:
            return
        base = self._engine_config()
        mode = None if self.degraded is None else self.degraded.mode
        slow = mode in ("throughput", "admission")
        engine.tokens_per_second = base.tokens_per_second * (
            self.config.degraded_factor if slow else 1.0
        )
        engine.admitting = mode != "admission"
        engine.kv_cache_tokens = (
            max(1, int(base.kv_cache_tokens * self.config.degraded_kv_fraction))
            if mode == "preemption"
            else base.kv_cache_tokens
        )

    def _chunks(self, tokens: int) -> int:
        return max(1, math.ceil(tokens / self.config.tokens_per_step))

    # State.

    def is_up(self, now: float) -> bool:
        return self.engine is not None and now >= self.up_at

    @property
    def hung(self) -> bool:
        return self.hung_since is not None

    @property
    def frozen(self) -> bool:
        """The engine core makes no step: hung, or in a legitimate silence."""
        return self.hung_since is not None or self.silence is not None

    def is_busy(self, now: float) -> bool:
        """Serving real work: up, not frozen (hung or in a silence), and requests running or
        waiting. A frozen engine serves nothing; the requests it queues wait for it either way."""
        return (
            self.is_up(now)
            and not self.frozen
            and self.engine is not None
            and self.engine.has_work()
        )

    def next_step_at(self, now: float) -> float:
        engine = self.engine
        if engine is None or self.frozen or not self.is_up(now) or not engine.has_work():
            return math.inf
        return max(engine.next_step_at, self.up_at)

    def advance_to(self, now: float) -> None:
        if self.engine is None or self.frozen or not self.is_up(now):
            return
        self._deliver(self.engine.advance_to(now), now)

    def _deliver(self, events: list[TokenEvent], now: float) -> None:
        for event in events:
            if event.finish_reason is None:
                continue
            pending = self._pending.pop(event.request_id, None)
            if pending is not None:
                if pending.kind != "test":
                    self.completed += 1
                pending.done(now, 200)

    def read(self, now: float) -> Reading | None:
        """A read of `/metrics`, or None while the server is loading (port closed)."""
        if self.engine is None or not self.is_up(now):
            return None
        return engine_reading(self.engine, self.process_start_time, now)

    # Requests.

    def submit(
        self, kind: str, prompt_tokens: int, max_tokens: int, now: float, done: Done
    ) -> str | None:
        """Send a request; `done(time, status)` is called when it ends. None: refused."""
        if kind == "test":
            self.test_requests += 1
            if self.is_busy(now):
                self.test_requests_to_busy += 1
            if self.silence is not None:
                self.test_requests_in_silence += 1
        if self.engine is None or not self.is_up(now):
            if kind == "interactive":
                self.refused += 1
            done(now, 0)
            return None
        request_id = f"r{next(self._ids)}"
        request = SimRequest(
            request_id, self._chunks(prompt_tokens), self._chunks(max_tokens), True, now
        )
        self._pending[request_id] = _Pending(kind, done)
        self.engine.submit(request, now)
        if kind != "test":
            self._new_shape(shape_of(prompt_tokens, self.config), now)
        return request_id

    def _new_shape(self, shape: int, now: float) -> None:
        if shape in self.shapes_seen:
            return
        self.shapes_seen.add(shape)
        seconds = self.silence_plan.compiles.get(shape)
        if seconds is not None:
            self.fall_silent(now, seconds, "compile")

    def give_up(self, request_id: str) -> bool:
        """The client stopped waiting (its timeout). False if the request had already ended."""
        if self._pending.pop(request_id, None) is None:
            return False
        if self.engine is not None and not self.frozen:
            self.engine.abort(request_id)  # a frozen engine core does not process the abort
        return True

    # Legitimate silences.

    def fall_silent(
        self, now: float, seconds: float, cause: SilenceCause, *, held: bool = False
    ) -> bool:
        """The engine freezes for `seconds` (a compile, a weight sync, an autotune), counters and
        gauges where its last step left them, then goes on by itself. A silence that strikes a
        silent engine lengthens it; a hung or stopped one has none. Whether it fell silent."""
        if self.engine is None or self.hung or not self.is_up(now):
            return False
        silence = self.silence
        if silence is None:
            silence = _Silence(now, now + seconds, [cause], held)
            self.silence = silence
        else:
            silence.ends_at += seconds
            silence.causes.append(cause)
            silence.held = silence.held or held
        self.scheduler.at(silence.ends_at, self._resume)
        return True

    def _resume(self, now: float) -> None:
        silence = self.silence
        if silence is None or now < silence.ends_at:
            return  # ended by a restart, or lengthened: a later event resumes it
        self.silence = None
        self.silences.append(silence.outcome(None))
        if self.engine is not None:
            self.engine.next_step_at = max(self.engine.next_step_at, now)

    def weight_sync(self, now: float, seconds: float, held: bool) -> None:
        """The trainer pushes new weights: it holds the target first if `held`, and releases
        the hold when the sync ends. A server that is down or hung gets no sync."""
        if self.engine is None or self.hung or not self.is_up(now):
            return
        if held:
            hold = max(seconds, self.config.weight_sync_hold_seconds)
            self.hold_events.append(
                HoldEvent("hold", TARGET_NAME, now, hold, "weight sync (replayed trainer)")
            )
        self.fall_silent(now, seconds, "weight_sync", held=held)
        if held:
            self.scheduler.at(now + seconds, self._release_hold)

    def _release_hold(self, now: float) -> None:
        self.hold_events.append(
            HoldEvent("hold_released", TARGET_NAME, now, 0.0, "weight sync done")
        )

    def _start_autotune(self, now: float) -> None:
        seconds = self.silence_plan.autotune(self.starts - 1)
        if seconds > 0:
            self.fall_silent(now, seconds, "start_autotune")

    # Faults and restarts.

    def hang(self, now: float) -> None:
        """The engine core stops: counters and gauges freeze at what its last step wrote."""
        self.hung_since = now
        self.hangs.append((now, None))
        frozen = self.read(now)  # what every read shows from now on
        work = 0.0 if frozen is None else (frozen.running or 0.0) + (frozen.waiting or 0.0)
        self.hangs_frozen_at_zero.append(work == 0)

    def restart(self, now: float, by: str) -> None:
        """Kill and start the server: requests in flight fail with 500, weights load again."""
        was_hung = self.hung
        if self.hung_since is not None:
            self.hangs[-1] = (self.hung_since, now)
            self.hung_since = None
        silence, self.silence = self.silence, None
        if silence is not None:
            self.silences.append(silence.outcome(now))
        self.restarts.append((now, by, was_hung, silence is not None and not was_hung))
        if self.degraded is not None and not was_hung and silence is None:
            self.restarts_in_degraded.append(by)
        if not self.is_up(now):  # restarted while still loading: that load is lost
            self.loading_seconds -= self.up_at - now
        failed = list(self._pending.items())
        self._pending.clear()
        self.engine = None
        self.starts += 1
        autotune = self.silence_plan.autotune(self.starts - 1)
        if self.config.start_autotune_port_open:
            self.up_at = now + self.config.restart_load_seconds
            self.scheduler.at(self.up_at, self._start_autotune)
        else:  # vLLM opens its port once autotune and graph capture are done: `down` till then
            self.up_at = now + self.config.restart_load_seconds + autotune
        self.loading_seconds += self.up_at - now
        self.process_start_time = now
        self._boot(self.up_at)
        for _request_id, pending in failed:
            if pending.kind != "test":
                self.failed_500 += 1
            self.error_times.append(now)
            pending.done(now, 500)

    def finish(self, end: float) -> None:
        if self.up_at > end:
            self.loading_seconds -= self.up_at - end
        if self.hung_since is not None:
            self.hangs[-1] = (self.hung_since, None)
        if self.silence is not None:
            self.silences.append(self.silence.outcome(None))
            self.silence = None
