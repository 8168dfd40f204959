"""A deterministic, virtual-time replay of one day on one model server: the old way vs stallwatch.

Pure model, no I/O and no real clock. One simulated server (the simulator's own engine model,
`simulator.engine.Engine`, driven by a virtual clock) serves the same traffic twice:

- the **old way**: watchdogs that send real requests and restart on failures, plus one that
  restarts on HTTP 500s;
- the **new way**: stallwatch, using the project's real code for every decision: the exporter's
  `classify` / `with_probe_result` / `TargetHistory` on `Reading`s of the engine's counters, the
  alert rule's "two consecutive polls", and the restarter's `decide` / `with_confirmation` on
  two fresh reads (`judge_confirmation`). Only the timing of Prometheus and Alertmanager is
  modelled (scrape, evaluation, group_wait, group_interval, repeat_interval).

The engine advances `tokens_per_step` tokens per request per step (time scaled to match), so
that a whole day runs in about a second; what the decisions read (which counters moved between
two reads 15 s apart) is unchanged by that.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from stallwatch.common.restarter_config import (
    Budget,
    CommandAction,
    ConfirmSettings,
    RestarterConfig,
    Target,
)
from stallwatch.core.alerts import Alert
from stallwatch.core.classify import State, Verdict, classify, down, with_probe_result
from stallwatch.core.confirmation import Confirmation, judge_confirmation
from stallwatch.core.history import PollOutcome, TargetHistory
from stallwatch.core.policy import History, PastDecision, PastRestart, decide, with_confirmation
from stallwatch.core.reading import EngineSample, Reading
from stallwatch.simulator.engine import Engine, EngineConfig, SimRequest, TokenEvent
from stallwatch.simulator.metrics import load_families

MODEL_NAME = "model"
TARGET_NAME = "model-server"
STUCK_ALERT = "LLMServerStuck"
UNRESPONSIVE_ALERT = "LLMServerUnresponsive"
# Day zero of the replay, only used to write alert startsAt timestamps.
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@dataclass(frozen=True)
class ReplayConfig:
    """The server, the traffic, and both ways of watching it. Times in seconds."""

    seed: int = 1
    hours: float = 24.0
    load: float = 1.0  # batch intensity: 1.0 = two to four long requests, most of the day
    # The server: ~8 tokens/s for one request, decode speed shared by the running requests.
    tokens_per_second: float = 8.0
    prefill_tokens_per_second: float = 1500.0
    max_num_seqs: int = 4
    restart_load_seconds: float = 360.0  # ~19 GB of weights to load
    tokens_per_step: int = 8
    # The traffic.
    batch_busy_fraction: float = 0.5
    batch_prompt_tokens: tuple[int, int] = (1500, 3000)
    batch_max_tokens: tuple[int, int] = (1500, 3000)
    batch_retry_seconds: float = 30.0
    interactive_per_hour: float = 20.0
    interactive_prompt_tokens: tuple[int, int] = (100, 800)
    interactive_max_tokens: tuple[int, int] = (50, 400)
    hangs_per_day: float = 3.0
    min_hang_spacing_seconds: float = 2700.0
    # The old way.
    chat_check_interval: float = 300.0
    chat_check_timeout: float = 45.0
    chat_check_failures: int = 5
    check_max_tokens: int = 32
    timer_intervals: tuple[float, ...] = (300.0, 600.0, 900.0, 1800.0)
    timer_check_timeout: float = 60.0
    timer_check_failures: int = 3
    busy_flag_set: bool = False  # the batch job never sets it
    error_check_interval: float = 60.0
    error_window: float = 600.0
    error_pressure: float = 20.0  # restart after ceil(pressure / errors) checks with errors
    # The new way.
    exporter_interval: float = 15.0
    probe_timeout: float = 10.0
    scrape_interval: float = 15.0
    evaluation_interval: float = 15.0
    group_wait: float = 5.0
    group_interval: float = 60.0
    repeat_interval: float = 3600.0
    confirm_gap: float = 5.0
    cooldown: float = 600.0
    budget_max_restarts: int = 3
    budget_window: float = 3600.0
    action_seconds: float = 2.0

    @property
    def duration(self) -> float:
        return self.hours * 3600.0


@dataclass(frozen=True)
class HangOutcome:
    """One real engine hang: when it began, and how long it lasted until a restart ended it."""

    started_at: float
    caught_after: float | None  # None: still hung at the end of the day
    lasted: float


@dataclass(frozen=True)
class WayResult:
    """What one way of watching did to the server over the day."""

    name: str
    restarts: int
    false_restarts: int
    true_restarts: int
    failed_500: int
    refused_while_loading: int
    test_requests: int
    test_requests_to_busy_server: int
    minutes_loading: float
    minutes_hung: float
    hangs: tuple[HangOutcome, ...]
    completed_requests: int
    restarts_by: dict[str, int]
    restarter_skips: dict[str, int]

    @property
    def minutes_down(self) -> float:
        return self.minutes_loading + self.minutes_hung

    @property
    def hangs_caught(self) -> int:
        return sum(1 for hang in self.hangs if hang.caught_after is not None)


@dataclass(frozen=True)
class ReplayResult:
    config: ReplayConfig
    old: WayResult
    new: WayResult
    hang_times: tuple[float, ...]
    batch_phases: tuple[tuple[float, float, int], ...]


# --- the traffic plan: drawn once from the seed, replayed identically for both ways --------------


@dataclass(frozen=True)
class TrafficPlan:
    batch_phases: tuple[tuple[float, float, int], ...]  # (start, end, concurrency)
    interactive: tuple[tuple[float, int, int], ...]  # (arrival, prompt tokens, max tokens)
    hang_times: tuple[float, ...]
    batch_sizes: tuple[tuple[int, int], ...]  # (prompt, max tokens), taken in order


def plan_traffic(config: ReplayConfig) -> TrafficPlan:
    """The day's batch phases, interactive arrivals and hang times, from `config.seed`."""
    rng = random.Random(f"stallwatch-replay-{config.seed}")
    end = config.duration
    phases: list[tuple[float, float, int]] = []
    busy = min(0.95, config.batch_busy_fraction * config.load)
    if busy > 0:
        t = rng.uniform(0, 1800)
        while t < end:
            length = rng.uniform(1800, 7200)
            base = rng.choice((2, 3, 4))
            concurrency = min(config.max_num_seqs, max(1, round(base * config.load)))
            phases.append((t, min(end, t + length), concurrency))
            mean_gap = length * (1 - busy) / busy
            t += length + rng.uniform(0.5, 1.5) * mean_gap
    interactive: list[tuple[float, int, int]] = []
    if config.interactive_per_hour > 0:
        t = rng.expovariate(config.interactive_per_hour / 3600.0)
        while t < end:
            interactive.append(
                (
                    t,
                    rng.randint(*config.interactive_prompt_tokens),
                    rng.randint(*config.interactive_max_tokens),
                )
            )
            t += rng.expovariate(config.interactive_per_hour / 3600.0)
    hangs: list[float] = []
    count = max(1, round(config.hangs_per_day * config.hours / 24.0))
    earliest, latest = 1800.0, end - 1800.0
    for _ in range(200):
        if len(hangs) == count or latest <= earliest:
            break
        candidate = rng.uniform(earliest, latest)
        if all(abs(candidate - other) >= config.min_hang_spacing_seconds for other in hangs):
            hangs.append(candidate)
    sizes = tuple(
        (rng.randint(*config.batch_prompt_tokens), rng.randint(*config.batch_max_tokens))
        for _ in range(4096)
    )
    return TrafficPlan(tuple(phases), tuple(interactive), tuple(sorted(hangs)), sizes)


# --- the virtual clock ---------------------------------------------------------------------------


class Scheduler:
    """Events at virtual times; ties run in the order they were scheduled."""

    def __init__(self) -> None:
        self._queue: list[tuple[float, int, Callable[[float], None]]] = []
        self._order = itertools.count()

    def at(self, when: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self._queue, (when, next(self._order), action))

    def next_time(self) -> float:
        return self._queue[0][0] if self._queue else math.inf

    def pop(self) -> tuple[float, Callable[[float], None]]:
        when, _, action = heapq.heappop(self._queue)
        return when, action


# --- the simulated server ------------------------------------------------------------------------

Done = Callable[[float, int], None]  # (time, HTTP status); 200 = answered, 0 = refused


@dataclass
class _Pending:
    kind: str
    done: Done


def engine_reading(engine: Engine, process_start_time: float, taken_at: float) -> Reading:
    """What the exporter's parser reads from this engine's `/metrics` (same values, no text)."""
    stats = engine.stats
    gauges = stats.gauges
    completed = stats.labelled_counters.get("vllm:request_success", {})
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
    )
    return Reading(taken_at=taken_at, engines=(sample,), process_start_time=process_start_time)


class SimulatedServer:
    """One model server on the virtual clock: engine, restarts that take minutes, hangs."""

    def __init__(self, config: ReplayConfig, scheduler: Scheduler) -> None:
        self.config = config
        self.scheduler = scheduler
        self._families = load_families()
        self._ids = itertools.count(1)
        self._pending: dict[str, _Pending] = {}
        self.engine: Engine | None = None
        self.process_start_time = 0.0
        self.up_at = 0.0
        self.hung_since: float | None = None
        self.restarts: list[tuple[float, str, bool]] = []  # (time, by whom, was it hung)
        self.hangs: list[tuple[float, float | None]] = []  # (start, end)
        self.loading_seconds = 0.0
        self.failed_500 = 0
        self.refused = 0
        self.completed = 0
        self.test_requests = 0
        self.test_requests_to_busy = 0
        self.error_times: list[float] = []
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

    def _chunks(self, tokens: int) -> int:
        return max(1, math.ceil(tokens / self.config.tokens_per_step))

    # State.

    def is_up(self, now: float) -> bool:
        return self.engine is not None and now >= self.up_at

    @property
    def hung(self) -> bool:
        return self.hung_since is not None

    def is_busy(self, now: float) -> bool:
        """Serving real work: up, not hung, and requests running or waiting."""
        return (
            self.is_up(now)
            and not self.hung
            and self.engine is not None
            and (self.engine.has_work())
        )

    def next_step_at(self, now: float) -> float:
        engine = self.engine
        if engine is None or self.hung or not self.is_up(now) or not engine.has_work():
            return math.inf
        return max(engine.next_step_at, self.up_at)

    def advance_to(self, now: float) -> None:
        if self.engine is None or self.hung or not self.is_up(now):
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
        return request_id

    def give_up(self, request_id: str) -> bool:
        """The client stopped waiting (its timeout). False if the request had already ended."""
        if self._pending.pop(request_id, None) is None:
            return False
        if self.engine is not None and not self.hung:
            self.engine.abort(request_id)  # a hung engine core never processes the abort
        return True

    # Faults and restarts.

    def hang(self, now: float) -> None:
        self.hung_since = now
        self.hangs.append((now, None))

    def restart(self, now: float, by: str) -> None:
        """Kill and start the server: requests in flight fail with 500, weights load again."""
        was_hung = self.hung
        if self.hung_since is not None:
            self.hangs[-1] = (self.hung_since, now)
            self.hung_since = None
        self.restarts.append((now, by, was_hung))
        if not self.is_up(now):  # restarted while still loading: that load is lost
            self.loading_seconds -= self.up_at - now
        failed = list(self._pending.items())
        self._pending.clear()
        self.engine = None
        self.up_at = now + self.config.restart_load_seconds
        self.loading_seconds += self.config.restart_load_seconds
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


# --- the traffic, replayed -----------------------------------------------------------------------


class Traffic:
    """The batch job (keeps N long requests in flight in each phase) and interactive users."""

    def __init__(self, plan: TrafficPlan, server: SimulatedServer, scheduler: Scheduler) -> None:
        self.plan = plan
        self.server = server
        self.scheduler = scheduler
        self._sizes = itertools.cycle(plan.batch_sizes)
        self._pending_hangs = list(plan.hang_times)

    def start(self) -> None:
        for start, end, concurrency in self.plan.batch_phases:
            for _ in range(concurrency):
                self.scheduler.at(start, self._batch_worker(end))
        for arrival, prompt, max_tokens in self.plan.interactive:
            self.scheduler.at(arrival, self._interactive(prompt, max_tokens))
        for when in self.plan.hang_times:
            self.scheduler.at(when, self._hang)

    def _batch_worker(self, phase_end: float) -> Callable[[float], None]:
        def send(now: float) -> None:
            if now >= phase_end:
                return
            if not self.server.is_up(now):  # the job waits for the server to come back
                self.scheduler.at(self.server.up_at + self.server.config.batch_retry_seconds, send)
                return
            prompt, max_tokens = next(self._sizes)
            self.server.submit("batch", prompt, max_tokens, now, done)

        def done(now: float, status: int) -> None:
            if status == 200:
                self.scheduler.at(now, send)
            else:
                self.scheduler.at(now + self.server.config.batch_retry_seconds, send)

        return send

    def _interactive(self, prompt: int, max_tokens: int) -> Callable[[float], None]:
        def send(now: float) -> None:
            self.server.submit("interactive", prompt, max_tokens, now, lambda _t, _s: None)

        return send

    def _hang(self, now: float) -> None:
        # A hang strikes a running process; if the server is loading or already hung, it
        # strikes the next process once that one is up.
        if self.server.is_up(now) and not self.server.hung:
            self.server.hang(now)
        else:
            self.scheduler.at(max(now + 60.0, self.server.up_at + 60.0), self._hang)


# --- the old way ---------------------------------------------------------------------------------


class RequestWatchdog:
    """Sends a real request every `interval`; restarts after `failures` failures in a row."""

    def __init__(
        self,
        name: str,
        server: SimulatedServer,
        scheduler: Scheduler,
        *,
        interval: float,
        timeout: float,
        failures: int,
        phase: float,
        skip_when_busy_flag: bool,
    ) -> None:
        self.name = name
        self.server = server
        self.scheduler = scheduler
        self.interval = interval
        self.timeout = timeout
        self.failures_to_restart = failures
        self.skip_when_busy_flag = skip_when_busy_flag
        self.streak = 0
        scheduler.at(phase, self._check)

    def _check(self, now: float) -> None:
        self.scheduler.at(now + self.interval, self._check)
        config = self.server.config
        if self.skip_when_busy_flag and config.busy_flag_set:
            return
        if not self.server.is_up(now):  # /health is down: the server is starting, not failing
            return
        answered: list[int] = []
        request_id = self.server.submit(
            "test", 30, config.check_max_tokens, now, lambda _t, status: answered.append(status)
        )

        def judge(later: float) -> None:
            ok = bool(answered) and answered[0] == 200
            if not answered and request_id is not None:
                self.server.give_up(request_id)
            self._result(later, ok)

        if request_id is None:
            self._result(now, False)
        else:
            self.scheduler.at(now + self.timeout, judge)

    def _result(self, now: float, ok: bool) -> None:
        self.streak = 0 if ok else self.streak + 1
        if self.streak >= self.failures_to_restart:
            self.streak = 0
            self.server.restart(now, self.name)


class ErrorWatchdog:
    """Restarts on HTTP 500s: the more errors in its window, the fewer checks it waits."""

    def __init__(self, server: SimulatedServer, scheduler: Scheduler, phase: float) -> None:
        self.server = server
        self.scheduler = scheduler
        self.streak = 0
        self.last_restart = -math.inf
        scheduler.at(phase, self._check)

    def _check(self, now: float) -> None:
        config = self.server.config
        self.scheduler.at(now + config.error_check_interval, self._check)
        if not self.server.is_up(now):
            return
        since = max(now - config.error_window, self.last_restart)
        errors = sum(1 for t in self.server.error_times if t > since)
        if errors == 0:
            self.streak = 0
            return
        self.streak += 1
        if self.streak >= math.ceil(config.error_pressure / errors):
            self.streak = 0
            self.last_restart = now
            self.server.restart(now, "http-500 watchdog")


# --- the new way: stallwatch ---------------------------------------------------------------------


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(EPOCH + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def restarter_config(config: ReplayConfig) -> RestarterConfig:
    """The restarter's configuration for the replayed server (its shipped defaults)."""
    target = Target(
        name=TARGET_NAME,
        metrics_url="http://model-server:8000/metrics",
        action=CommandAction(argv=("systemctl", "restart", "model-server")),
        cooldown=config.cooldown,
        budget=Budget(max_restarts=config.budget_max_restarts, window=config.budget_window),
    )
    return RestarterConfig(
        targets=(target,),
        journal="replay",
        insecure_no_auth=True,
        confirm=ConfirmSettings(gap=config.confirm_gap),
    )


@dataclass
class _Episode:
    alertname: str
    starts_at: float
    last_sent: float | None = None


@dataclass
class _JournalEntry:
    time: float
    fingerprint: str
    starts_at: str
    action: str
    reason: str


class Stallwatch:
    """Exporter, alert rule, Alertmanager timing and restarter, on the virtual clock."""

    def __init__(self, server: SimulatedServer, scheduler: Scheduler, rng: random.Random) -> None:
        self.server = server
        self.scheduler = scheduler
        self.config = server.config
        self.restarter = restarter_config(self.config)
        self.history = TargetHistory()
        self.scraped: tuple[State | None, int] = (None, 0)
        self.episodes: dict[str, _Episode] = {}
        self.last_flush: dict[str, float] = {}
        self.journal: list[_JournalEntry] = []
        self.past_restarts: list[PastRestart] = []
        self.skips: Counter[str] = Counter()
        self._polling = False
        scheduler.at(rng.uniform(0, self.config.exporter_interval), self._poll)
        scheduler.at(rng.uniform(0, self.config.scrape_interval), self._scrape)
        scheduler.at(rng.uniform(0, self.config.evaluation_interval), self._evaluate)

    # The exporter (exporter/poll.py's steps, with the real pure functions).

    def _poll(self, now: float) -> None:
        self.scheduler.at(now + self.config.exporter_interval, self._poll)
        if self._polling:  # the previous poll still waits for its test request: skip a tick
            return
        reading = self.server.read(now)
        if reading is None:
            self._finish_poll(
                PollOutcome(
                    down("/metrics: connection refused"), None, now, 0.0, error_reason="connection"
                )
            )
            return
        verdict = classify(self.history.baseline, reading)
        if not verdict.probe_needed:
            self._finish_poll(PollOutcome(verdict, reading, now, 0.0))
            return
        self._polling = True
        answered: list[int] = []
        request_id = self.server.submit(
            "test", 1, 1, now, lambda _t, status: answered.append(status)
        )

        def settle(later: float, verdict: Verdict = verdict, reading: Reading = reading) -> None:
            self._polling = False
            if answered and answered[0] == 200:
                settled = with_probe_result(verdict, True, "answered")
                self._finish_poll(PollOutcome(settled, reading, later, later - now, 1, 0))
                return
            if request_id is not None:
                self.server.give_up(request_id)
            again = self.server.read(later)
            if again is not None:
                recheck = classify(reading, again)
                if recheck.progressed and recheck.state != State.RESTARTED:
                    self._finish_poll(PollOutcome(recheck, again, later, later - now, 1, 1))
                    return
            failed = with_probe_result(verdict, False, "no answer")
            self._finish_poll(PollOutcome(failed, reading, later, later - now, 1, 1))

        if request_id is None:
            settle(now)
        else:
            # The answer comes within one step when the engine works; give it until the timeout.
            self.scheduler.at(now + self.config.probe_timeout, settle)

    def _finish_poll(self, outcome: PollOutcome) -> None:
        self.history = self.history.advance(outcome)

    # Prometheus: scrape the exporter, evaluate the alert rules.

    def _scrape(self, now: float) -> None:
        self.scheduler.at(now + self.config.scrape_interval, self._scrape)
        self.scraped = (self.history.state, self.history.state_polls)

    def _evaluate(self, now: float) -> None:
        self.scheduler.at(now + self.config.evaluation_interval, self._evaluate)
        state, polls = self.scraped
        firing = {
            STUCK_ALERT: state == State.STALLED and polls >= 2,
            UNRESPONSIVE_ALERT: state == State.UNRESPONSIVE and polls >= 2,
        }
        for alertname, is_firing in firing.items():
            episode = self.episodes.get(alertname)
            if is_firing and episode is None:
                episode = _Episode(alertname, now)
                self.episodes[alertname] = episode
                self._schedule_flush(alertname, now + self.config.group_wait)
            elif is_firing and episode is not None and episode.last_sent is not None:
                if now - episode.last_sent >= self.config.repeat_interval:
                    self._schedule_flush(alertname, now)
            elif not is_firing and episode is not None:
                del self.episodes[alertname]  # resolved: journaled, never acted on

    # Alertmanager: one group per alert name and target.

    def _schedule_flush(self, alertname: str, earliest: float) -> None:
        last = self.last_flush.get(alertname)
        when = earliest if last is None else max(earliest, last + self.config.group_interval)
        self.scheduler.at(when, lambda now: self._notify(alertname, now))

    def _notify(self, alertname: str, now: float) -> None:
        episode = self.episodes.get(alertname)
        if episode is None or (
            episode.last_sent is not None and now - episode.last_sent < self.config.repeat_interval
        ):
            return
        episode.last_sent = now
        self.last_flush[alertname] = now
        alert = Alert(
            status="firing",
            labels={"alertname": alertname, "target": TARGET_NAME, "severity": "critical"},
            fingerprint=f"{alertname}:{TARGET_NAME}",
            starts_at=_rfc3339(episode.starts_at),
        )
        self._receive(alert, now)

    # The restarter: the real policy, then two fresh reads of the server, then the action.

    def _journal_history(self, alert: Alert, now: float) -> History:
        same = tuple(
            PastDecision(entry.time, entry.action, entry.reason)
            for entry in self.journal
            if entry.fingerprint == alert.fingerprint and entry.starts_at == alert.starts_at
        )
        return History(restarts=tuple(self.past_restarts), same_alert=same)

    def _record(self, alert: Alert, now: float, action: str, reason: str) -> None:
        self.journal.append(_JournalEntry(now, alert.fingerprint, alert.starts_at, action, reason))
        if action == "skip":
            self.skips[reason] += 1

    def _receive(self, alert: Alert, now: float) -> None:
        decision = decide(alert, self.restarter, self._journal_history(alert, now), now)
        if not decision.restarts:
            self._record(alert, now, decision.action, decision.reason)
            return
        first = self.server.read(now)
        if first is None:
            confirmation = Confirmation(False, "down", "connection refused")
            final = with_confirmation(decision, alert, self.restarter, confirmation)
            self._record(alert, now, final.action, final.reason)
            return

        def second_read(later: float, first: Reading = first) -> None:
            again = self.server.read(later)
            if again is None:
                confirmation = Confirmation(False, "down", "connection refused")
            else:
                confirmation = judge_confirmation(classify(first, again))
            final = with_confirmation(decision, alert, self.restarter, confirmation)
            self._record(alert, later, final.action, final.reason)
            if final.restarts:
                self.past_restarts.append(
                    PastRestart(TARGET_NAME, later, later + self.config.action_seconds)
                )
                self.server.restart(later, "stallwatch")

        self.scheduler.at(now + self.config.confirm_gap, second_read)


# --- running a day -------------------------------------------------------------------------------


def _run_way(config: ReplayConfig, plan: TrafficPlan, way: str) -> WayResult:
    scheduler = Scheduler()
    server = SimulatedServer(config, scheduler)
    Traffic(plan, server, scheduler).start()
    rng = random.Random(f"stallwatch-replay-phases-{config.seed}")
    stallwatch: Stallwatch | None = None
    if way == "old":
        RequestWatchdog(
            "chat watchdog",
            server,
            scheduler,
            interval=config.chat_check_interval,
            timeout=config.chat_check_timeout,
            failures=config.chat_check_failures,
            phase=rng.uniform(0, config.chat_check_interval),
            skip_when_busy_flag=False,
        )
        for interval in config.timer_intervals:
            RequestWatchdog(
                f"{interval / 60:g}-minute timer",
                server,
                scheduler,
                interval=interval,
                timeout=config.timer_check_timeout,
                failures=config.timer_check_failures,
                phase=rng.uniform(0, interval),
                skip_when_busy_flag=True,
            )
        ErrorWatchdog(server, scheduler, rng.uniform(0, config.error_check_interval))
    else:
        stallwatch = Stallwatch(server, scheduler, rng)

    end = config.duration
    while True:
        next_event = scheduler.next_time()
        now = min(next_event, server.next_step_at(next_event))
        if now > end:
            break
        server.advance_to(now)
        while scheduler.next_time() <= now:
            when, action = scheduler.pop()
            action(when)
    server.finish(end)

    hangs = tuple(
        HangOutcome(
            started_at=start,
            caught_after=None if stop is None else stop - start,
            lasted=(end if stop is None else stop) - start,
        )
        for start, stop in server.hangs
    )
    true_restarts = sum(1 for _t, _by, was_hung in server.restarts if was_hung)
    return WayResult(
        name=way,
        restarts=len(server.restarts),
        false_restarts=len(server.restarts) - true_restarts,
        true_restarts=true_restarts,
        failed_500=server.failed_500,
        refused_while_loading=server.refused,
        test_requests=server.test_requests,
        test_requests_to_busy_server=server.test_requests_to_busy,
        minutes_loading=server.loading_seconds / 60.0,
        minutes_hung=sum(hang.lasted for hang in hangs) / 60.0,
        hangs=hangs,
        completed_requests=server.completed,
        restarts_by=dict(Counter(by for _t, by, _hung in server.restarts)),
        restarter_skips=dict(stallwatch.skips) if stallwatch is not None else {},
    )


def run_replay(config: ReplayConfig) -> ReplayResult:
    """Replay the same day the old way and the new way; deterministic for a given config."""
    if config.hours <= 0 or config.load < 0 or config.tokens_per_step < 1:
        raise ValueError("hours must be > 0, load >= 0 and tokens_per_step >= 1")
    plan = plan_traffic(config)
    return ReplayResult(
        config=config,
        old=_run_way(config, plan, "old"),
        new=_run_way(config, plan, "new"),
        hang_times=plan.hang_times,
        batch_phases=plan.batch_phases,
    )


__all__ = [
    "HangOutcome",
    "ReplayConfig",
    "ReplayResult",
    "WayResult",
    "engine_reading",
    "plan_traffic",
    "run_replay",
]
