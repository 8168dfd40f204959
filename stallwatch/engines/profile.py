"""The one shape of an engine profile: the series behind the common sample, and safe endpoints.

A profile is data. `stallwatch.core.reading` turns a payload into samples with it, the decision
table reads the sample's common fields and the few facts a profile states about its engine
(stale work gauges, counters printed at reduced precision, counters that move only at the end of
a request, work gauges that can never prove idleness), and the exporter calls only the endpoints
a profile marks safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, get_args

# The fields of the common sample a series can feed (see reading.EngineSample).
Role = Literal[
    "running",  # work gauges: requests in the engine's batch
    "waiting",  # work gauges: requests queued for it (several series are added up)
    "kv_cache_usage",  # a gauge that moves during legitimate work (vLLM)
    "awake",  # 0 while the engine sleeps
    "steps",  # the per-forward progress counter (forwards finished)
    "forwards_started",  # forwards begun: minus steps and failures, the forward in flight
    "forwards_failed",
    "forward_tokens",  # tokens computed per forward (moves per step)
    "generation_tokens",
    "prompt_tokens",
    "requests_completed",
    "preemptions",
    "idle_loop",  # a counter that moves only while the engine loop turns without work
    "queue_time_sum",  # a queue-time histogram's _sum and _count (seconds, requests)
    "queue_time_count",
]
ROLES: frozenset[str] = frozenset(get_args(Role))
COUNTER_ROLES: tuple[str, ...] = (
    "steps",
    "forwards_started",
    "forwards_failed",
    "forward_tokens",
    "generation_tokens",
    "prompt_tokens",
    "requests_completed",
    "preemptions",
)


@dataclass(frozen=True)
class Series:
    """One exported sample name read into one role of the common sample.

    `label`/`values` keep only samples whose label has one of the values; `summed` adds up
    every kept sample of one engine (a counter split by `mode`, `method`, `finished_reason`).
    """

    role: Role
    summed: bool = False
    label: str | None = None
    values: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}")

    def keeps(self, labels: Mapping[str, str]) -> bool:
        return self.label is None or labels.get(self.label) in self.values


@dataclass(frozen=True)
class InflightSeries:
    """A fresh server-level gauge of client requests in flight, minus the endpoints named."""

    name: str
    label: str
    not_counted: frozenset[str]


@dataclass(frozen=True)
class Endpoint:
    """An HTTP endpoint of the engine and what calling it does."""

    method: str
    path: str
    effect: str


@dataclass(frozen=True)
class SleepCheck:
    """A safe endpoint that says whether the engine sleeps: JSON `field` true means asleep,
    or (when `equals` is set) the field's string equals it."""

    path: str
    field: str
    equals: str | None = None


@dataclass(frozen=True)
class FaultStatus:
    """A safe endpoint where the engine's own fault tolerance says which of its engines it holds
    faulted: a JSON object whose `engines` list has one `{id, status}` per engine (`healthy`
    when nothing is wrong, `fault_info` naming the fault). 404: the feature is off."""

    path: str
    healthy: str = "healthy"


def faulted_engines(check: FaultStatus, document: object) -> tuple[str, ...]:
    """The engines `document` reports not healthy, each as `engine <id> <status> (<fault>)`;
    empty when all are healthy or the document is not such a report."""
    engines = document.get("engines") if isinstance(document, dict) else None
    if not isinstance(engines, list):
        return ()
    faulted: list[str] = []
    for entry in engines:
        if not isinstance(entry, dict):
            continue
        status = entry.get("status")
        if not isinstance(status, str) or status == check.healthy:
            continue
        fault = entry.get("fault_info")
        detail = f" ({fault})" if isinstance(fault, str) and fault else ""
        faulted.append(f"engine {entry.get('id', '?')} {status}{detail}")
    return tuple(faulted)


# The degradation reasons (stallwatch.core.degraded), in the order they are published.
ADMISSION_STALLED = "admission_stalled"
THROUGHPUT_COLLAPSE = "throughput_collapse"
PREEMPTION_STORM = "preemption_storm"
QUEUE_TIME = "queue_time"
DEGRADED_REASONS: tuple[str, ...] = (
    ADMISSION_STALLED,
    THROUGHPUT_COLLAPSE,
    PREEMPTION_STORM,
    QUEUE_TIME,
)


@dataclass(frozen=True)
class EngineProfile:
    kind: str
    title: str
    series: Mapping[str, tuple[Series, ...]]
    # Sample names that identify the engine in `kind: auto`; None: every name in `series`.
    signature: frozenset[str] | None = None
    model_label: str = "model_name"
    engine_labels: tuple[str, ...] = ()
    # A label that splits a family into parts beside its total, which carries the label empty
    # (SGLang's `priority`): a part counts only for a role no total was found for.
    split_label: str | None = None
    metrics_path: str = "/metrics"
    # Counters that every step of running work moves: a stall needs one of them in both reads.
    stall_evidence: tuple[str, ...] = ("steps",)
    # Non-empty: metrics alone can never prove a stall on this engine, and this says why.
    stall_unprovable: str = ""
    # Seconds the work gauges can lag behind the engine; 0 when they are read live.
    work_gauge_lag_seconds: float = 0.0
    work_gauge_lag: str = ""
    # Non-empty: work gauges of 0 with nothing moved never prove this engine idle (the gauges
    # lag the work by whole requests), so no test request is ever sent on them; this says why.
    idle_unprovable: str = ""
    # The idle-loop counter is flushed at most this often: reads closer together can show it
    # flat while the loop idles.
    idle_loop_flush_seconds: float = 0.0
    # Roles of which a loaded engine publishes at least one; none of them with a sample: the
    # engine is still loading (its /metrics holds startup series only), which proves nothing
    # about idleness, so no test request is sent; `loading` says why. Empty: not applicable.
    loaded_when: tuple[str, ...] = ()
    loading: str = ""
    # Digits the engine prints its numbers with; counters at or above 10**digits lose increments.
    significant_digits: int | None = None
    # Where the engine publishes no start time, a counter that vanishes also marks a new process.
    counters_vanish_on_restart: bool = False
    inflight: InflightSeries | None = None
    # The idle test requests the engine accepts (`max_tokens: 1`), by path; empty: none.
    test_paths: frozenset[str] = frozenset()
    sleep_check: SleepCheck | None = None
    # Asked before a stall or an idle test request is reported (never otherwise): an engine its
    # own fault tolerance holds faulted is recovering under its orchestrator, not ours to test.
    fault_status: FaultStatus | None = None
    safe_endpoints: tuple[Endpoint, ...] = ()
    unsafe_endpoints: tuple[Endpoint, ...] = ()
    flat_while_legit: str = ""
    restart_signal: str = ""
    # The `owned_by` its `GET /v1/models` cards carry, which identify it in `kind: auto` before
    # any engine-specific path is read; empty: it names nothing of its own there.
    owned_by: frozenset[str] = frozenset()
    # Family names by role, for reasons and for the counters the decision compares.
    role_names: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Degraded: the roles whose movement shows a waiting request was admitted (running growing
    # always does); empty: admission stalls are not judged on this engine.
    admission_evidence: tuple[str, ...] = ()
    # The counter the rate per running request is taken from: `generation_tokens` (divided by
    # the requests running) or `steps` (one decode step is one token for each running request);
    # empty: throughput collapse is not judged.
    throughput_role: str = ""
    # Why each degradation reason the engine's metrics cannot support is not judged.
    degraded_unjudged: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.signature is None:
            object.__setattr__(self, "signature", frozenset(self.series))
        elif not self.signature <= set(self.series):
            raise ValueError(f"{self.kind}: signature names not in series")
        names: dict[str, str] = dict(self.role_names)
        for name, rules in self.series.items():
            for rule in rules:
                names.setdefault(rule.role, name)
        object.__setattr__(self, "role_names", MappingProxyType(names))

    def judges(self, reason: str) -> bool:
        """Whether this engine's metrics support degradation `reason`."""
        names = self.role_names
        if reason == ADMISSION_STALLED:
            return bool(self.admission_evidence) and "waiting" in names
        if reason == THROUGHPUT_COLLAPSE:
            return self.throughput_role in names and "running" in names
        if reason == PREEMPTION_STORM:
            return "preemptions" in names and "kv_cache_usage" in names
        if reason == QUEUE_TIME:
            return "queue_time_sum" in names and "queue_time_count" in names
        raise ValueError(f"unknown degradation reason {reason!r}")

    @property
    def identified_by(self) -> frozenset[str]:
        return self.signature or frozenset()

    @property
    def safe_paths(self) -> frozenset[str]:
        return frozenset(endpoint.path for endpoint in self.safe_endpoints)

    @property
    def unsafe_paths(self) -> frozenset[str]:
        return frozenset(endpoint.path for endpoint in self.unsafe_endpoints)


def series(table: Mapping[str, Series | tuple[Series, ...]]) -> Mapping[str, tuple[Series, ...]]:
    """A read-only series table; a single rule may be given without a tuple."""
    return MappingProxyType(
        {name: rules if isinstance(rules, tuple) else (rules,) for name, rules in table.items()}
    )


OPENAI_TEST_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
