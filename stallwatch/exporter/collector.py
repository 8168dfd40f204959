"""The exporter's `/metrics`: metric families built anew on every scrape from the latest polls."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

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


class _Families:
    """Families that share the target label and the target's extra labels."""

    def __init__(self, extra_label_names: tuple[str, ...]) -> None:
        self.extra = extra_label_names
        self.families: list[Metric] = []

    def gauge(
        self, name: str, documentation: str, labels: tuple[str, ...] = ()
    ) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            name, f"{documentation} {REFRESH}", labels=["target", *labels, *self.extra]
        )
        self.families.append(family)
        return family

    def counter(
        self, name: str, documentation: str, labels: tuple[str, ...] = ()
    ) -> CounterMetricFamily:
        family = CounterMetricFamily(
            name, f"{documentation} {REFRESH}", labels=["target", *labels, *self.extra]
        )
        self.families.append(family)
        return family


class TargetCollector(Collector):
    """What each target publishes: its state, the figures behind it, its polls. A `/probe`
    answer is this collector over one target."""

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
        out = _Families(extra)
        state = out.gauge(
            "stallwatch_target_state",
            "Current state of the target: 1 for the current state, 0 for the others.",
            ("state",),
        )
        state_polls = out.gauge(
            "stallwatch_target_state_polls",
            "Consecutive polls, this one included, that found the target in its current state.",
        )
        up = out.gauge(
            "stallwatch_target_up", "1 when the last read of the target's endpoint answered."
        )
        info = out.gauge(
            "stallwatch_target_info",
            "The target's URL, its configured kind, and the engine its metrics were read as "
            "(the kind itself when forced; under kind auto the engine recognised, `none` when "
            "the server publishes no engine's metrics, empty before the first read).",
            ("url", "kind", "engine"),
        )
        interval = out.gauge(
            "stallwatch_target_interval_seconds", "Seconds between two polls of the target."
        )
        running = out.gauge(
            "stallwatch_requests_running", "Requests running on the engine, as it reports them."
        )
        waiting = out.gauge(
            "stallwatch_requests_waiting", "Requests waiting for the engine, as it reports them."
        )
        steps = out.gauge(
            "stallwatch_engine_steps_per_second",
            "Engine steps with output per second between the last two reads of one process.",
        )
        tokens = out.gauge(
            "stallwatch_generation_tokens_per_second",
            "Generated tokens per second between the last two reads of one process.",
        )
        last_progress = out.gauge(
            "stallwatch_last_progress_timestamp_seconds",
            "Unix time of the last poll that saw the engine make progress or finish requests.",
        )
        last_poll = out.gauge(
            "stallwatch_last_poll_timestamp_seconds", "Unix time the last poll finished."
        )
        poll_duration = out.gauge(
            "stallwatch_poll_duration_seconds", "Duration of the last poll, test request included."
        )
        restarts = out.counter(
            "stallwatch_restarts_detected",
            "Restarts of the server seen between two reads (new start time or a counter reset).",
        )
        test_requests = out.counter(
            "stallwatch_test_requests",
            "Idle test requests sent; only ever to a server with no work and nothing completed.",
        )
        test_request_failures = out.counter(
            "stallwatch_test_request_failures", "Idle test requests that failed or timed out."
        )
        # The names before 0.2 ("probe" is /probe's word): published until 0.3.
        old_test_requests = out.counter(
            "stallwatch_probe_requests",
            "Deprecated, removed in 0.3: stallwatch_test_requests_total, old name.",
        )
        old_test_request_failures = out.counter(
            "stallwatch_probe_failures",
            "Deprecated, removed in 0.3: stallwatch_test_request_failures_total, old name.",
        )
        stall = out.gauge(
            "stallwatch_target_stall_seconds",
            "How long the reads have shown the current stall (stalled, unresponsive or hung), "
            "from the last read before it; 0 when not stalled.",
        )
        recovered = out.counter(
            "stallwatch_target_recovered_stalls",
            "Stalls that ended with the server moving again by itself (near misses: a restart "
            "ends none).",
        )
        longest_recovered = out.gauge(
            "stallwatch_target_longest_recovered_stall_seconds",
            "The longest stall that ended by itself since the exporter started.",
        )
        last_recovered = out.gauge(
            "stallwatch_target_last_recovered_stall_seconds",
            "How long the latest stall that ended by itself had lasted.",
        )
        degraded = out.gauge(
            "stallwatch_target_degraded",
            "1 while the target is degraded for the reason (slow, not stuck: for people, never "
            "a restart), 0 otherwise; only the reasons its engine's metrics support.",
            ("reason",),
        )
        rate_per_request = out.gauge(
            "stallwatch_generation_tokens_per_second_per_request",
            "Output tokens per second per running request between the last two busy reads "
            "(engines without a live token counter: decode steps per second).",
        )
        rate_baseline = out.gauge(
            "stallwatch_generation_tokens_per_second_per_request_baseline",
            "This server's learned rate per running request: the median of its latest healthy "
            "busy reads; absent until enough were seen, forgotten on a restart.",
        )
        preemptions = out.gauge(
            "stallwatch_preemptions_per_second",
            "Requests preempted per second between the last two busy reads.",
        )
        kv_usage = out.gauge(
            "stallwatch_kv_cache_usage_ratio",
            "The engine's KV-cache usage (0 to 1) at the last busy read, the highest of its "
            "engines.",
        )
        queue_time = out.gauge(
            "stallwatch_request_queue_time_mean_seconds",
            "The mean queue time of the requests that left the queue between the last two "
            "busy reads.",
        )
        polls = out.counter("stallwatch_polls", "Polls of the target.")
        poll_errors = out.counter(
            "stallwatch_poll_errors",
            "Polls that could not read the target, by reason.",
            ("reason",),
        )

        for target in config.targets:
            history = histories.get(target.name, TargetHistory())
            values = _label_values(target, extra)
            current = history.state
            for candidate in State:
                state.add_metric([target.name, candidate.value, *values], candidate == current)
            state_polls.add_metric([target.name, *values], history.state_polls)
            if history.verdict is not None:
                answered = history.verdict.state not in (State.DOWN, State.HUNG)
                up.add_metric([target.name, *values], answered)
            engine = engine_label(target, history)
            info.add_metric([target.name, target.url, target.kind, engine, *values], 1)
            interval.add_metric([target.name, *values], target.interval_seconds)
            verdict = history.verdict
            if verdict is not None and verdict.state != State.DOWN:
                _maybe(running, target.name, values, verdict.running)
                _maybe(waiting, target.name, values, verdict.waiting)
                _maybe(steps, target.name, values, verdict.steps_per_second)
                _maybe(tokens, target.name, values, verdict.tokens_per_second)
            _maybe(last_progress, target.name, values, history.last_progress_at)
            _maybe(last_poll, target.name, values, history.last_poll_at)
            _maybe(poll_duration, target.name, values, history.last_poll_duration_seconds)
            restarts.add_metric([target.name, *values], history.restarts_detected)
            for sent, failed in (
                (test_requests, test_request_failures),
                (old_test_requests, old_test_request_failures),
            ):
                sent.add_metric([target.name, *values], history.test_requests)
                failed.add_metric([target.name, *values], history.test_request_failures)
            polls.add_metric([target.name, *values], history.polls)
            stall.add_metric([target.name, *values], history.stall_seconds)
            recovered.add_metric([target.name, *values], history.recovered_stalls)
            longest_recovered.add_metric(
                [target.name, *values], history.longest_recovered_stall_seconds
            )
            _maybe(last_recovered, target.name, values, history.last_recovered_stall_seconds)
            judged = PROFILES.get(engine)
            degradation = history.degradation
            for reason in DEGRADED_REASONS:
                if judged is not None and judged.judges(reason):
                    is_degraded = reason in degradation.reasons
                    degraded.add_metric([target.name, reason, *values], is_degraded)
            measures = degradation.measures
            _maybe(rate_per_request, target.name, values, measures.rate_per_request)
            _maybe(rate_baseline, target.name, values, measures.baseline_rate_per_request)
            _maybe(preemptions, target.name, values, measures.preemptions_per_second)
            _maybe(kv_usage, target.name, values, measures.kv_cache_usage)
            _maybe(queue_time, target.name, values, measures.queue_time_seconds)
            for reason in POLL_ERROR_REASONS:
                count = history.poll_errors.get(reason, 0)
                poll_errors.add_metric([target.name, reason, *values], count)
        yield from out.families


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


def _label_values(target: TargetConfig, extra: tuple[str, ...]) -> list[str]:
    return [target.labels.get(name, "") for name in extra]


def _maybe(family: GaugeMetricFamily, name: str, values: list[str], value: float | None) -> None:
    if value is not None:
        family.add_metric([name, *values], value)
