"""What the exporter publishes: every target's families as a table (`TARGET_FAMILIES`) and its
samples as data (`target_samples`); `/metrics` builds prometheus_client families from them on
every scrape, a `/probe` answer is written from them directly (`exporter.answer`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from stallwatch import __version__
from stallwatch.common.exporter_config import ExporterConfig, TargetConfig
from stallwatch.core.classify import State
from stallwatch.core.history import TargetHistory
from stallwatch.engines import AUTO, PROFILES, PROXY
from stallwatch.engines.profile import DEGRADED_REASONS
from stallwatch.exporter.reload import ReloadStatus

REFRESH = "Refreshed every poll interval of the target."
POLL_ERROR_REASONS: tuple[str, ...] = ("timeout", "connection", "http_status", "too_large", "parse")


@dataclass(frozen=True)
class Family:
    """One family every target publishes: its labels are `target`, `labels`, then the
    targets' own label names (sorted)."""

    name: str
    type: Literal["gauge", "counter"]
    documentation: str
    labels: tuple[str, ...] = ()

    @property
    def help(self) -> str:
        return f"{self.documentation} {REFRESH}"


def _gauge(name: str, documentation: str, labels: tuple[str, ...] = ()) -> Family:
    return Family(name, "gauge", documentation, labels)


def _counter(name: str, documentation: str, labels: tuple[str, ...] = ()) -> Family:
    return Family(name, "counter", documentation, labels)


# What each target publishes, in the order it is written.
TARGET_FAMILIES: tuple[Family, ...] = (
    _gauge(
        "stallwatch_target_state",
        "Current state of the target: 1 for the current state, 0 for the others.",
        ("state",),
    ),
    _gauge(
        "stallwatch_target_state_polls",
        "Consecutive polls, this one included, that found the target in its current state.",
    ),
    _gauge("stallwatch_target_up", "1 when the last read of the target's endpoint answered."),
    _gauge(
        "stallwatch_target_info",
        "The target's URL, its configured kind, and the engine its metrics were read as "
        "(the kind itself when forced; under kind auto the engine recognised, `none` when "
        "the server publishes no engine's metrics, empty before the first read).",
        ("url", "kind", "engine"),
    ),
    _gauge("stallwatch_target_interval_seconds", "Seconds between two polls of the target."),
    _gauge("stallwatch_requests_running", "Requests running on the engine, as it reports them."),
    _gauge("stallwatch_requests_waiting", "Requests waiting for the engine, as it reports them."),
    _gauge(
        "stallwatch_engine_steps_per_second",
        "Engine steps with output per second between the last two reads of one process.",
    ),
    _gauge(
        "stallwatch_generation_tokens_per_second",
        "Generated tokens per second between the last two reads of one process.",
    ),
    _gauge(
        "stallwatch_last_progress_timestamp_seconds",
        "Unix time of the last poll that saw the engine make progress or finish requests.",
    ),
    _gauge("stallwatch_last_poll_timestamp_seconds", "Unix time the last poll finished."),
    _gauge("stallwatch_poll_duration_seconds", "Duration of the last poll, test request included."),
    _counter(
        "stallwatch_restarts_detected",
        "Restarts of the server seen between two reads (new start time or a counter reset).",
    ),
    _counter(
        "stallwatch_test_requests",
        "Idle test requests sent; only ever to a server with no work and nothing completed.",
    ),
    _counter("stallwatch_test_request_failures", "Idle test requests that failed or timed out."),
    # The names before 0.2 ("probe" is /probe's word): published until 0.3.
    _counter(
        "stallwatch_probe_requests",
        "Deprecated, removed in 0.3: stallwatch_test_requests_total, old name.",
    ),
    _counter(
        "stallwatch_probe_failures",
        "Deprecated, removed in 0.3: stallwatch_test_request_failures_total, old name.",
    ),
    _gauge(
        "stallwatch_target_stall_seconds",
        "How long the reads have shown the current stall (stalled, unresponsive or hung), "
        "from the last read before it; 0 when not stalled.",
    ),
    _counter(
        "stallwatch_target_recovered_stalls",
        "Stalls that ended with the server moving again by itself (near misses: a restart "
        "ends none).",
    ),
    _gauge(
        "stallwatch_target_longest_recovered_stall_seconds",
        "The longest stall that ended by itself since the exporter started.",
    ),
    _gauge(
        "stallwatch_target_last_recovered_stall_seconds",
        "How long the latest stall that ended by itself had lasted.",
    ),
    _gauge(
        "stallwatch_target_degraded",
        "1 while the target is degraded for the reason (slow, not stuck: for people, never "
        "a restart), 0 otherwise; only the reasons its engine's metrics support.",
        ("reason",),
    ),
    _gauge(
        "stallwatch_generation_tokens_per_second_per_request",
        "Output tokens per second per running request between the last two busy reads "
        "(engines without a live token counter: decode steps per second).",
    ),
    _gauge(
        "stallwatch_generation_tokens_per_second_per_request_baseline",
        "This server's learned rate per running request: the median of its latest healthy "
        "busy reads; absent until enough were seen, forgotten on a restart.",
    ),
    _gauge(
        "stallwatch_preemptions_per_second",
        "Requests preempted per second between the last two busy reads.",
    ),
    _gauge(
        "stallwatch_kv_cache_usage_ratio",
        "The engine's KV-cache usage (0 to 1) at the last busy read, the highest of its engines.",
    ),
    _gauge(
        "stallwatch_request_queue_time_mean_seconds",
        "The mean queue time of the requests that left the queue between the last two busy reads.",
    ),
    _counter("stallwatch_polls", "Polls of the target."),
    _counter(
        "stallwatch_poll_errors", "Polls that could not read the target, by reason.", ("reason",)
    ),
)
FAMILY_INDEX = {family.name: index for index, family in enumerate(TARGET_FAMILIES)}

# One sample of a target: its family (an index in TARGET_FAMILIES), the values of the
# family's own labels, and its value. The target's name and labels are the caller's.
TargetSample = tuple[int, tuple[str, ...], float]


def _index(name: str) -> int:
    return FAMILY_INDEX[name]


_STATE = _index("stallwatch_target_state")
_STATE_POLLS = _index("stallwatch_target_state_polls")
_UP = _index("stallwatch_target_up")
_INFO = _index("stallwatch_target_info")
_INTERVAL = _index("stallwatch_target_interval_seconds")
_RUNNING = _index("stallwatch_requests_running")
_WAITING = _index("stallwatch_requests_waiting")
_STEPS = _index("stallwatch_engine_steps_per_second")
_TOKENS = _index("stallwatch_generation_tokens_per_second")
_LAST_PROGRESS = _index("stallwatch_last_progress_timestamp_seconds")
_LAST_POLL = _index("stallwatch_last_poll_timestamp_seconds")
_POLL_DURATION = _index("stallwatch_poll_duration_seconds")
_RESTARTS = _index("stallwatch_restarts_detected")
_TEST_REQUESTS = _index("stallwatch_test_requests")
_TEST_REQUEST_FAILURES = _index("stallwatch_test_request_failures")
_OLD_TEST_REQUESTS = _index("stallwatch_probe_requests")
_OLD_TEST_REQUEST_FAILURES = _index("stallwatch_probe_failures")
_STALL = _index("stallwatch_target_stall_seconds")
_RECOVERED = _index("stallwatch_target_recovered_stalls")
_LONGEST_RECOVERED = _index("stallwatch_target_longest_recovered_stall_seconds")
_LAST_RECOVERED = _index("stallwatch_target_last_recovered_stall_seconds")
_DEGRADED = _index("stallwatch_target_degraded")
_RATE_PER_REQUEST = _index("stallwatch_generation_tokens_per_second_per_request")
_RATE_BASELINE = _index("stallwatch_generation_tokens_per_second_per_request_baseline")
_PREEMPTIONS = _index("stallwatch_preemptions_per_second")
_KV_USAGE = _index("stallwatch_kv_cache_usage_ratio")
_QUEUE_TIME = _index("stallwatch_request_queue_time_mean_seconds")
_POLLS = _index("stallwatch_polls")
_POLL_ERRORS = _index("stallwatch_poll_errors")
_NO_LABELS: tuple[str, ...] = ()
# Each family's own label values, made once (the answer to every read writes them all).
_STATE_LABELS = tuple((state, (state.value,)) for state in State)
_DEGRADED_LABELS = tuple((reason, (reason,)) for reason in DEGRADED_REASONS)
_POLL_ERROR_LABELS = tuple((reason, (reason,)) for reason in POLL_ERROR_REASONS)


def target_samples(target: TargetConfig, history: TargetHistory) -> list[TargetSample]:
    """Every sample `target` publishes with this history, in the order they are written."""
    samples: list[TargetSample] = []
    add = samples.append

    def maybe(family: int, value: float | None) -> None:
        if value is not None:
            add((family, _NO_LABELS, value))

    current = history.state
    for candidate, state_label in _STATE_LABELS:
        add((_STATE, state_label, candidate == current))
    add((_STATE_POLLS, _NO_LABELS, history.state_polls))
    verdict = history.verdict
    if verdict is not None:
        add((_UP, _NO_LABELS, verdict.state not in (State.DOWN, State.HUNG)))
    engine = engine_label(target, history)
    add((_INFO, (target.url, target.kind, engine), 1))
    add((_INTERVAL, _NO_LABELS, target.interval_seconds))
    if verdict is not None and verdict.state != State.DOWN:
        maybe(_RUNNING, verdict.running)
        maybe(_WAITING, verdict.waiting)
        maybe(_STEPS, verdict.steps_per_second)
        maybe(_TOKENS, verdict.tokens_per_second)
    maybe(_LAST_PROGRESS, history.last_progress_at)
    maybe(_LAST_POLL, history.last_poll_at)
    maybe(_POLL_DURATION, history.last_poll_duration_seconds)
    add((_RESTARTS, _NO_LABELS, history.restarts_detected))
    add((_TEST_REQUESTS, _NO_LABELS, history.test_requests))
    add((_TEST_REQUEST_FAILURES, _NO_LABELS, history.test_request_failures))
    add((_OLD_TEST_REQUESTS, _NO_LABELS, history.test_requests))
    add((_OLD_TEST_REQUEST_FAILURES, _NO_LABELS, history.test_request_failures))
    add((_STALL, _NO_LABELS, history.stall_seconds))
    add((_RECOVERED, _NO_LABELS, history.recovered_stalls))
    add((_LONGEST_RECOVERED, _NO_LABELS, history.longest_recovered_stall_seconds))
    maybe(_LAST_RECOVERED, history.last_recovered_stall_seconds)
    judged = PROFILES.get(engine)
    degradation = history.degradation
    if judged is not None:
        for reason, reason_label in _DEGRADED_LABELS:
            if judged.judges(reason):
                add((_DEGRADED, reason_label, reason in degradation.reasons))
    measures = degradation.measures
    maybe(_RATE_PER_REQUEST, measures.rate_per_request)
    maybe(_RATE_BASELINE, measures.baseline_rate_per_request)
    maybe(_PREEMPTIONS, measures.preemptions_per_second)
    maybe(_KV_USAGE, measures.kv_cache_usage)
    maybe(_QUEUE_TIME, measures.queue_time_seconds)
    add((_POLLS, _NO_LABELS, history.polls))
    errors = history.poll_errors
    for reason, reason_label in _POLL_ERROR_LABELS:
        add((_POLL_ERRORS, reason_label, errors.get(reason, 0)))
    return samples


class TargetCollector(Collector):
    """What each target publishes (`TARGET_FAMILIES`, from `target_samples`) as
    prometheus_client families: the `/metrics` side. A `/probe` answer is written by
    `exporter.answer` with the same table."""

    def __init__(
        self,
        config: Callable[[], ExporterConfig],
        histories: Callable[[], Mapping[str, TargetHistory]],
    ) -> None:
        self._config = config
        self._histories = histories

    def collect(self) -> Iterator[Metric]:
        config = self._config()
        histories = self._histories()
        extra = tuple(sorted({name for t in config.targets for name in t.labels}))
        families: list[GaugeMetricFamily | CounterMetricFamily] = [
            (GaugeMetricFamily if family.type == "gauge" else CounterMetricFamily)(
                family.name, family.help, labels=["target", *family.labels, *extra]
            )
            for family in TARGET_FAMILIES
        ]
        for target in config.targets:
            history = histories.get(target.name, TargetHistory())
            values = tuple(target.labels.get(name, "") for name in extra)
            for index, own, value in target_samples(target, history):
                families[index].add_metric([target.name, *own, *values], value)
        yield from families


class ExporterProcessCollector(Collector):
    """What the exporter process publishes of itself: its config reloads and its version."""

    def __init__(self, reload_status: Callable[[], ReloadStatus]) -> None:
        self._reload_status = reload_status

    def collect(self) -> Iterator[Metric]:
        reload = self._reload_status()
        yield GaugeMetricFamily(
            "stallwatch_config_last_reload_successful",
            "1 when the last configuration load or reload succeeded.",
            value=1 if reload.successful else 0,
        )
        yield GaugeMetricFamily(
            "stallwatch_config_last_reload_success_timestamp_seconds",
            "Unix time of the last successful configuration load or reload.",
            value=reload.last_success_at,
        )
        build = GaugeMetricFamily(
            "stallwatch_build_info", "The running stallwatch version.", labels=["version"]
        )
        build.add_metric([__version__], 1)
        yield build


def engine_label(target: TargetConfig, history: TargetHistory) -> str:
    """Which engine the target was read as: what `kind: auto` chose, or what was forced."""
    if target.kind == PROXY:
        return PROXY
    reading = history.baseline
    if reading is not None and reading.engine_kind is not None:
        return reading.engine_kind
    if history.state == State.NO_METRICS:
        return "none"
    return "" if target.kind == AUTO else target.kind
