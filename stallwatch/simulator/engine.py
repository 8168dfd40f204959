"""A clock-driven model of one vLLM V1 engine core: scheduler, chunked prefill, decode, stats.

Pure logic: no I/O, no real clock. `advance_to(now)` runs every engine step whose start time
is at or before `now`; each step takes simulated time derived from the configured speeds.
The metric semantics follow vLLM V1:

- the gauges (running, waiting, KV-cache usage) are refreshed on every step that has work and
  keep their last value otherwise;
- `iteration_tokens_total` is observed only on steps that produce output, so a long chunked
  prefill leaves its count flat while `kv_cache_usage_perc` rises;
- `prompt_tokens_total` grows when a request's prefill completes (its first token is sampled).

The stats themselves (families, histograms, buckets) are in `engine_stats`.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from stallwatch.simulator.engine_stats import zeroed_stats

BLOCK_SIZE = 128
# A step never takes less than this, so a catch-up after a stalled event loop stays bounded.
MIN_STEP_SECONDS = 0.0005
MAX_STEPS_PER_ADVANCE = 20_000


@dataclass(frozen=True)
class EngineConfig:
    """Capacity and speed of one engine core."""

    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048
    tokens_per_second: float = 200.0
    prefill_tokens_per_second: float = 100_000.0
    kv_cache_tokens: int = 1_048_576
    eos_probability: float = 0.0
    max_model_len: int = 2048


@dataclass
class SimRequest:
    """One request inside the engine."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    ignore_eos: bool
    arrival: float
    computed_prompt: int = 0
    generated: int = 0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    num_preemptions: int = 0
    finish_reason: str | None = None

    @property
    def prefilling(self) -> bool:
        return self.computed_prompt < self.prompt_tokens

    @property
    def kv_tokens(self) -> int:
        return self.computed_prompt + self.generated


@dataclass(frozen=True)
class StepRecord:
    """What one engine step did, for the other engines' metric models (see simulator.engines)."""

    start: float
    end: float
    prefill_tokens: int
    decode_tokens: int
    completed_prefill_tokens: int
    generated: int
    finished: tuple[SimRequest, ...]
    running: tuple[SimRequest, ...]
    waiting: int


@dataclass(frozen=True)
class TokenEvent:
    """Output of one step for one request: new tokens, and the finish reason when done."""

    request_id: str
    new_tokens: int
    finish_reason: str | None


class Engine:
    """One engine core (one data-parallel rank). Drive it with `submit`, `advance_to`, `abort`."""

    def __init__(
        self,
        config: EngineConfig,
        families: list[dict[str, object]],
        now: float,
        seed: int = 0,
    ) -> None:
        self.config = config
        self.tokens_per_second = config.tokens_per_second
        # The `degrade` fault: a scheduler that admits nothing, or a KV cache far too small.
        self.admitting = True
        self.kv_cache_tokens = config.kv_cache_tokens
        self._rng = random.Random(seed)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.next_step_at = now
        self.steps = 0
        self.output_steps = 0
        self.sleep_level = 0
        # Called after every step (the non-vLLM metric models count from these).
        self.step_listeners: list[Callable[[StepRecord], None]] = []
        self.stats = zeroed_stats(families, config.max_model_len, now)

    # --- inputs -------------------------------------------------------------------------

    def submit(self, request: SimRequest, now: float) -> None:
        """Queue a request; it is scheduled on the next step."""
        if not self.has_work():
            self.next_step_at = max(self.next_step_at, now)
        self.waiting.append(request)

    def abort(self, request_id: str) -> bool:
        """Drop a request (client went away). Returns whether it was known."""
        for queue in (self.waiting, self.running):
            for request in list(queue):
                if request.request_id == request_id:
                    queue.remove(request)
                    self._labelled("vllm:request_success", "abort", 1)
                    if not self.has_work():
                        # vLLM steps once more after an abort and publishes its scheduler
                        # stats, so the gauges drop to zero; an engine with work left
                        # refreshes them on its next step.
                        self._refresh_gauges()
                    return True
        return False

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def freeze_gauges_at_zero(self) -> None:
        """Model a hang that happened before the scheduler published its first stats."""
        self.stats.gauges["vllm:num_requests_running"] = 0.0
        self.stats.gauges["vllm:num_requests_waiting"] = 0.0

    # --- time ---------------------------------------------------------------------------

    def advance_to(self, now: float) -> list[TokenEvent]:
        """Run every step that starts at or before `now`; return the outputs they produced."""
        events: list[TokenEvent] = []
        steps = 0
        while self.has_work() and self.next_step_at <= now and steps < MAX_STEPS_PER_ADVANCE:
            step_start = self.next_step_at
            duration, step_events = self._step(step_start)
            events.extend(step_events)
            self.next_step_at = step_start + max(duration, MIN_STEP_SECONDS)
            steps += 1
        if not self.has_work():
            self.next_step_at = max(self.next_step_at, now)
        return events

    def _step(self, now: float) -> tuple[float, list[TokenEvent]]:
        self.steps += 1
        budget = self.config.max_num_batched_tokens
        decode_tokens = 0
        prefill_tokens = 0
        completed_prefill_tokens = 0
        events: list[TokenEvent] = []
        finished: list[SimRequest] = []

        # Admit waiting requests into free slots (FCFS), as the V1 scheduler does.
        # `admitting` False (the `degrade` fault): a waiting request is admitted only into an
        # empty batch, as behind slow non-preemptible loads; the engine is slow, never frozen.
        while (
            self.waiting
            and len(self.running) < self.config.max_num_seqs
            and (self.admitting or not self.running)
        ):
            request = self.waiting.popleft()
            if request.scheduled_at is None:
                request.scheduled_at = now
            self.running.append(request)
            self._count("vllm:prefix_cache_queries", request.prompt_tokens)

        produced: list[SimRequest] = []
        for request in self.running:
            if budget <= 0:
                break
            if request.prefilling:
                chunk = min(request.prompt_tokens - request.computed_prompt, budget)
                request.computed_prompt += chunk
                prefill_tokens += chunk
                budget -= chunk
                if not request.prefilling:
                    completed_prefill_tokens += request.prompt_tokens
                    produced.append(request)
            else:
                decode_tokens += 1
                budget -= 1
                produced.append(request)

        self._preempt_if_kv_full()

        duration = (
            decode_tokens / self.tokens_per_second
            + prefill_tokens / self.config.prefill_tokens_per_second
        )
        step_end_estimate = now + max(duration, MIN_STEP_SECONDS)

        generated_this_step = 0
        for request in produced:
            if request not in self.running:
                continue  # preempted in this step
            request.generated += 1
            generated_this_step += 1
            hist = self.stats.histograms
            if request.first_token_at is None:
                request.first_token_at = step_end_estimate
                hist["vllm:time_to_first_token_seconds"].observe(
                    step_end_estimate - request.arrival
                )
            elif request.last_token_at is not None:
                hist["vllm:inter_token_latency_seconds"].observe(
                    step_end_estimate - request.last_token_at
                )
            request.last_token_at = step_end_estimate
            reason: str | None = None
            if request.generated >= request.max_tokens:
                reason = "length"
            elif not request.ignore_eos and self._rng.random() < self.config.eos_probability:
                reason = "stop"
            if reason is not None:
                request.finish_reason = reason
                finished.append(request)
            events.append(TokenEvent(request.request_id, 1, reason))

        for request in finished:
            self.running.remove(request)
            self._record_finished(request, step_end_estimate)

        # Scheduler stats ship on every step with work: refresh the gauges.
        self._refresh_gauges()
        if generated_this_step:
            # Iteration stats exist only when the step produced request outputs.
            self.output_steps += 1
            self.stats.histograms["vllm:iteration_tokens_total"].observe(
                completed_prefill_tokens + generated_this_step
            )
            self._count("vllm:prompt_tokens", completed_prefill_tokens)
            self._labelled(
                "vllm:prompt_tokens_by_source", "local_compute", completed_prefill_tokens
            )
            self._count("vllm:generation_tokens", generated_this_step)
        if self.step_listeners:
            record = StepRecord(
                start=now,
                end=step_end_estimate,
                prefill_tokens=prefill_tokens,
                decode_tokens=decode_tokens,
                completed_prefill_tokens=completed_prefill_tokens,
                generated=generated_this_step,
                finished=tuple(finished),
                running=tuple(self.running),
                waiting=len(self.waiting),
            )
            for listener in self.step_listeners:
                listener(record)
        return step_end_estimate - now, events

    def _preempt_if_kv_full(self) -> None:
        while self.running and self._kv_blocks_used() * BLOCK_SIZE > self.kv_cache_tokens:
            victim = self.running.pop()
            victim.computed_prompt = 0
            victim.num_preemptions += 1
            self.waiting.appendleft(victim)
            self._count("vllm:num_preemptions", 1)

    def _kv_blocks_used(self) -> int:
        return sum(math.ceil(r.kv_tokens / BLOCK_SIZE) for r in self.running)

    def _refresh_gauges(self) -> None:
        gauges = self.stats.gauges
        gauges["vllm:num_requests_running"] = float(len(self.running))
        gauges["vllm:num_requests_waiting"] = float(len(self.waiting))
        total_blocks = max(1, self.kv_cache_tokens // BLOCK_SIZE)
        gauges["vllm:kv_cache_usage_perc"] = self._kv_blocks_used() / total_blocks

    def _record_finished(self, request: SimRequest, now: float) -> None:
        hist = self.stats.histograms
        reason = request.finish_reason or "length"
        self._labelled("vllm:request_success", reason, 1)
        scheduled = request.scheduled_at if request.scheduled_at is not None else request.arrival
        first = request.first_token_at if request.first_token_at is not None else now
        hist["vllm:e2e_request_latency_seconds"].observe(now - request.arrival)
        hist["vllm:request_queue_time_seconds"].observe(scheduled - request.arrival)
        hist["vllm:request_inference_time_seconds"].observe(now - scheduled)
        hist["vllm:request_prefill_time_seconds"].observe(first - scheduled)
        hist["vllm:request_decode_time_seconds"].observe(now - first)
        hist["vllm:request_prompt_tokens"].observe(request.prompt_tokens)
        hist["vllm:request_generation_tokens"].observe(request.generated)
        hist["vllm:request_max_num_generation_tokens"].observe(request.generated)
        hist["vllm:request_params_n"].observe(1)
        hist["vllm:request_params_max_tokens"].observe(request.max_tokens)
        hist["vllm:request_num_preemptions"].observe(request.num_preemptions)
        hist["vllm:request_prefill_kv_computed_tokens"].observe(request.prompt_tokens)
        if request.generated > 1:
            hist["vllm:request_time_per_output_token_seconds"].observe(
                (now - first) / (request.generated - 1)
            )

    def _count(self, name: str, amount: float) -> None:
        self.stats.counters[name] = self.stats.counters.get(name, 0.0) + amount

    def _labelled(self, name: str, label_value: str, amount: float) -> None:
        values = self.stats.labelled_counters.setdefault(name, {})
        values[label_value] = values.get(label_value, 0.0) + amount
