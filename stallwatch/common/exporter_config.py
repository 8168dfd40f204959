"""The exporter's configuration: frozen dataclasses, built and checked from a plain mapping."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Literal, cast
from urllib.parse import urlsplit, urlunsplit

from stallwatch.common.allowlist import AllowRuleError, parse_allow_rule
from stallwatch.common.config import ConfigError, Section, quoted
from stallwatch.engines import AUTO, DEFAULT_METRICS_PATH, TARGET_KINDS, default_metrics_path

# A target's `kind`: one of the engine registry's TARGET_KINDS (`auto`, the default, recognises
# the engine from its families; `proxy` reads no metrics of its own).
TargetKind = str
TestRequestEndpoint = Literal["completions", "chat"]
TEST_REQUEST_ENDPOINTS: tuple[str, ...] = ("completions", "chat")
DEFAULT_LISTEN = "127.0.0.1:9732"
DEFAULT_INTERVAL_SECONDS = 15.0
DEFAULT_TIMEOUT_SECONDS = 5.0
DEFAULT_TEST_REQUEST_TIMEOUT_SECONDS = 10.0
# At most one test request a minute (four 15 s polls) to a server that answers: an idle
# server's request log holds at most 1 440 a day instead of ~2 900, and a hang with running
# frozen at 0 is caught at most ~45 s later than with one every other poll.
DEFAULT_TEST_REQUEST_MIN_INTERVAL_SECONDS = 60.0
DEFAULT_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
# Shorter polls would only measure the exporter; shorter timeouts would fail a healthy server.
MIN_INTERVAL_SECONDS = 0.05
MIN_TEST_REQUEST_TIMEOUT_SECONDS = 0.1
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RESERVED_LABELS = frozenset({"target", "state", "reason", "url", "kind", "engine", "version"})
_TOP_KEYS = (
    "listen",
    "interval",
    "timeout",
    "test_request",
    "probe",
    "degraded",
    "max_payload_bytes",
    "targets",
    "modules",
)
_TEST_REQUEST_KEYS = ("enabled", "model", "endpoint", "timeout", "min_interval")
# The idle test request's settings were `probe:` before 0.2, a word that belongs to `/probe`.
TEST_REQUEST_KEY = "test_request"
OLD_TEST_REQUEST_KEY = "probe"
_DEGRADED_KEYS = (
    "enabled",
    "admission_window",
    "collapse_window",
    "collapse_factor",
    "baseline_samples",
    "baseline_min_samples",
    "preemption_window",
    "preemptions_per_second",
    "kv_cache_full",
    "queue_time_window",
    "queue_time",
)
_MODULE_KEYS = (
    "kind",
    "metrics_path",
    "interval",
    "timeout",
    "test_request",
    "probe",
    "allow",
    "forget_after",
    "max_targets",
    "degraded",
)
_MODULE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
# A target no `/probe` asked for in this long (or four intervals, if longer) is forgotten,
# its history with it.
DEFAULT_FORGET_AFTER_SECONDS = 600.0
# At most this many targets are remembered by `/probe` at once, over all modules (see
# BENCHMARKS.md for the memory each takes). Each module may remember its own `max_targets`,
# by default an equal share of these, so a flood in one module leaves the others their room.
MAX_PROBE_TARGETS = 10_000
_TARGET_KEYS = (
    "name",
    "url",
    "kind",
    "metrics_path",
    "interval",
    "timeout",
    "test_request",
    "probe",
    "degraded",
    "labels",
)


def metrics_in_base_url(url: str) -> str:
    """Why `url` cannot be a server's base URL because it points into `/metrics` ("" if not).

    vLLM answers every path under `/metrics` with its metrics, so a base URL ending in
    `/metrics` reads fine but sends the test request to `/metrics/v1/completions`, which
    fails: a healthy idle server would read unresponsive and be restarted.
    """
    parts = urlsplit(url)
    segments = parts.path.split("/")
    if "metrics" not in segments:
        return ""
    base_path = "/".join(segments[: segments.index("metrics")])
    base = urlunsplit((parts.scheme, parts.netloc, base_path, "", ""))
    return (
        f"{quoted(url)} points into /metrics: give the server's base URL, {quoted(base)} "
        "(stallwatch reads its metrics under the base URL and sends the test request to "
        "base + /v1/completions; vLLM answers every path under /metrics with metrics, so that "
        "request would fail and a healthy idle server would read unresponsive)"
    )


@dataclass(frozen=True)
class IdleTestRequestConfig:
    """The idle test request: one `max_tokens: 1` request, sent only to a server with no work."""

    enabled: bool = True
    model: str | None = None  # None: the model name the server's own metrics carry
    endpoint: TestRequestEndpoint = "completions"
    timeout_seconds: float = DEFAULT_TEST_REQUEST_TIMEOUT_SECONDS
    # At most one test request per this long to a server that answers (0: on every idle poll).
    min_interval_seconds: float = DEFAULT_TEST_REQUEST_MIN_INTERVAL_SECONDS


@dataclass(frozen=True)
class DegradedConfig:
    """When a server that still makes progress reads degraded: for people, never a restart.

    Each reason must hold on every poll of its window before it is reported (see
    docs/states.md, "Degraded").
    """

    enabled: bool = True
    # Requests waiting and none admitted (no prompt tokens, no completions, running not growing)
    # for this long; longer than the longest healthy generation of a full batch.
    admission_window_seconds: float = 600.0
    # Output tokens per second per running request below `collapse_factor` times this server's
    # own baseline (the median of its last `baseline_samples` healthy busy polls) for this long.
    collapse_window_seconds: float = 600.0
    collapse_factor: float = 0.25
    baseline_samples: int = 120
    # No collapse is judged before the baseline holds this many polls.
    baseline_min_samples: int = 20
    # More preemptions a second than this, with KV-cache usage at or above `kv_cache_full`.
    preemption_window_seconds: float = 300.0
    preemptions_per_second: float = 0.5
    kv_cache_full: float = 0.9
    # The mean queue time of the requests that left the queue between two reads above this.
    queue_time_window_seconds: float = 300.0
    queue_time_seconds: float = 30.0


DEFAULT_DEGRADED = DegradedConfig()


@dataclass(frozen=True)
class TargetConfig:
    name: str
    url: str
    kind: TargetKind = "auto"
    metrics_path: str = "/metrics"
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    test_request: IdleTestRequestConfig = IdleTestRequestConfig()
    degraded: DegradedConfig = DegradedConfig()
    labels: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def metrics_url(self) -> str:
        return self.url.rstrip("/") + self.metrics_path


@dataclass(frozen=True)
class ModuleConfig:
    """What `/probe?module=NAME` reads a target with: a target list's settings and an allow-list.

    The idle test request is off unless the module turns it on (`/probe` reads addresses
    that arrive in a request, so sending generations to them is opted into, not defaulted).
    """

    name: str
    allow: tuple[str, ...]
    kind: TargetKind = "auto"
    metrics_path: str = DEFAULT_METRICS_PATH
    # Reads of one target are at least this far apart, however often `/probe` asks.
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    test_request: IdleTestRequestConfig = IdleTestRequestConfig(enabled=False)
    forget_after_seconds: float = DEFAULT_FORGET_AFTER_SECONDS
    # The most targets this module remembers at once; None: an equal share of the total
    # (`module_max_targets`).
    max_targets: int | None = None
    degraded: DegradedConfig = DegradedConfig()

    def target(self, name: str, url: str) -> TargetConfig:
        """The target config one `/probe` of `url` under this module reads with."""
        return TargetConfig(
            name=name,
            url=url,
            kind=self.kind,
            metrics_path=self.metrics_path,
            interval_seconds=self.interval_seconds,
            timeout_seconds=self.timeout_seconds,
            test_request=self.test_request,
            degraded=self.degraded,
        )


@dataclass(frozen=True)
class ExporterConfig:
    targets: tuple[TargetConfig, ...]
    listen_host: str = "127.0.0.1"
    listen_port: int = 9732
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    source: str = "<defaults>"
    modules: MappingProxyType[str, ModuleConfig] = field(
        default_factory=lambda: MappingProxyType({})
    )
    # What the file asks for that still works but should change (deprecated keys).
    warnings: tuple[str, ...] = ()


def _test_request_section(section: Section, warnings: list[str]) -> Section:
    """The idle test request's settings under `section`: `test_request`, or its old name
    `probe` with a warning; both at once is an error."""
    if not section.has(OLD_TEST_REQUEST_KEY):
        return section.section(TEST_REQUEST_KEY, _TEST_REQUEST_KEYS)
    if section.has(TEST_REQUEST_KEY):
        section.report(
            OLD_TEST_REQUEST_KEY,
            f"the old name of {section.field_name(TEST_REQUEST_KEY)}, given beside it: "
            f"keep {TEST_REQUEST_KEY} only",
        )
        return section.section(TEST_REQUEST_KEY, _TEST_REQUEST_KEYS)
    warnings.append(
        f"{section.source}: {section.field_name(OLD_TEST_REQUEST_KEY)}: deprecated (to be "
        f"removed in 0.3): write {TEST_REQUEST_KEY}: instead (the idle test request, not the "
        "/probe endpoint)"
    )
    return section.section(OLD_TEST_REQUEST_KEY, _TEST_REQUEST_KEYS)


def _test_request(section: Section, defaults: IdleTestRequestConfig) -> IdleTestRequestConfig:
    return IdleTestRequestConfig(
        enabled=section.boolean("enabled", defaults.enabled),
        model=section.optional_string("model") or defaults.model,
        endpoint=cast(
            TestRequestEndpoint,
            section.choice("endpoint", defaults.endpoint, TEST_REQUEST_ENDPOINTS),
        ),
        timeout_seconds=section.duration(
            "timeout", defaults.timeout_seconds, minimum=MIN_TEST_REQUEST_TIMEOUT_SECONDS
        ),
        min_interval_seconds=section.duration(
            "min_interval", defaults.min_interval_seconds, zero=True
        ),
    )


def _degraded(section: Section, defaults: DegradedConfig) -> DegradedConfig:
    samples = section.integer("baseline_samples", defaults.baseline_samples, minimum=2)
    if samples > 10_000:
        section.report("baseline_samples", f"must be at most 10000, got {samples}")
        samples = defaults.baseline_samples
    least = section.integer("baseline_min_samples", min(defaults.baseline_min_samples, samples))
    if not 1 <= least <= samples:
        section.report(
            "baseline_min_samples", f"must be from 1 to baseline_samples ({samples}), got {least}"
        )
        least = min(defaults.baseline_min_samples, samples)
    return DegradedConfig(
        enabled=section.boolean("enabled", defaults.enabled),
        admission_window_seconds=section.duration(
            "admission_window", defaults.admission_window_seconds
        ),
        collapse_window_seconds=section.duration(
            "collapse_window", defaults.collapse_window_seconds
        ),
        collapse_factor=section.number(
            "collapse_factor", defaults.collapse_factor, above=0.0, at_most=1.0
        ),
        baseline_samples=samples,
        baseline_min_samples=least,
        preemption_window_seconds=section.duration(
            "preemption_window", defaults.preemption_window_seconds
        ),
        preemptions_per_second=section.number(
            "preemptions_per_second",
            defaults.preemptions_per_second,
            above=0.0,
            at_most=1_000_000.0,
        ),
        kv_cache_full=section.number(
            "kv_cache_full", defaults.kv_cache_full, above=0.0, at_most=1.0
        ),
        queue_time_window_seconds=section.duration(
            "queue_time_window", defaults.queue_time_window_seconds
        ),
        queue_time_seconds=section.duration("queue_time", defaults.queue_time_seconds),
    )


def _target(
    section: Section,
    interval: float,
    timeout: float,
    test_request_defaults: IdleTestRequestConfig,
    warnings: list[str],
    degraded_defaults: DegradedConfig = DEFAULT_DEGRADED,
) -> TargetConfig:
    name = section.attempt(partial(section.string, "name", required=True), "")
    url = section.attempt(partial(section.url, "url"), "")
    problem = metrics_in_base_url(url)
    if problem:
        section.report("url", problem)
    labels = section.string_map("labels")
    for label in labels:
        if not _LABEL_NAME.match(label) or label.startswith("__") or label in _RESERVED_LABELS:
            section.report("labels", f"{quoted(label)} cannot be used as a label name")
    kind = section.choice("kind", AUTO, TARGET_KINDS)
    metrics_path = section.string("metrics_path", default_metrics_path(kind))
    if not metrics_path.startswith("/"):
        section.report("metrics_path", "must start with /")
    target = TargetConfig(
        name=name,
        url=url,
        kind=kind,
        metrics_path=metrics_path,
        interval_seconds=section.duration("interval", interval, minimum=MIN_INTERVAL_SECONDS),
        timeout_seconds=section.duration("timeout", timeout, minimum=MIN_INTERVAL_SECONDS),
        test_request=_test_request(_test_request_section(section, warnings), test_request_defaults),
        degraded=_degraded(section.section("degraded", _DEGRADED_KEYS), degraded_defaults),
        labels=MappingProxyType(labels),
    )
    if target.timeout_seconds > target.interval_seconds:
        section.report("timeout", "must not be longer than the interval")
    return target


def _module(
    name: str,
    section: Section,
    interval: float,
    timeout: float,
    test_request_defaults: IdleTestRequestConfig,
    warnings: list[str],
    degraded_defaults: DegradedConfig = DEFAULT_DEGRADED,
) -> ModuleConfig:
    if not _MODULE_NAME.match(name):
        raise ConfigError(
            section.source, section.path, "a module name is letters, digits, '.', '_' and '-'"
        )
    allow = section.string_list("allow", ())
    if not allow:
        raise section.error("allow", "required: the hosts or networks /probe may read")
    for index, entry in enumerate(allow):
        problem = allow_rule_problem(entry)
        if problem:
            section.report(f"allow[{index}]", problem)
    kind = section.choice("kind", AUTO, TARGET_KINDS)
    metrics_path = section.string("metrics_path", default_metrics_path(kind))
    if not metrics_path.startswith("/"):
        section.report("metrics_path", "must start with /")
    module_interval = section.duration("interval", interval, minimum=MIN_INTERVAL_SECONDS)
    module_timeout = section.duration("timeout", min(timeout, module_interval))
    if module_timeout > module_interval:
        section.report("timeout", "must not be longer than the interval")
    forget_after = section.duration(
        "forget_after", max(DEFAULT_FORGET_AFTER_SECONDS, 4 * module_interval)
    )
    if forget_after < 2 * module_interval:
        section.report("forget_after", "must be at least two intervals")
    test_request_section = _test_request_section(section, warnings)
    defaults = IdleTestRequestConfig(
        enabled=False,
        model=test_request_defaults.model,
        endpoint=test_request_defaults.endpoint,
        timeout_seconds=test_request_defaults.timeout_seconds,
        min_interval_seconds=test_request_defaults.min_interval_seconds,
    )
    return ModuleConfig(
        name=name,
        allow=allow,
        kind=kind,
        metrics_path=metrics_path,
        interval_seconds=module_interval,
        timeout_seconds=module_timeout,
        test_request=_test_request(test_request_section, defaults),
        forget_after_seconds=forget_after,
        max_targets=section.integer("max_targets", 0, minimum=1)
        if section.has("max_targets")
        else None,
        degraded=_degraded(section.section("degraded", _DEGRADED_KEYS), degraded_defaults),
    )


def module_max_targets(
    modules: Mapping[str, ModuleConfig], name: str, total: int = MAX_PROBE_TARGETS
) -> int:
    """The most targets module `name` remembers at once: its own `max_targets`, or else an
    equal share of the `total` over all modules (at least one)."""
    own = modules[name].max_targets
    return own if own is not None else max(1, total // len(modules))


def _check_module_shares(source: str, modules: Mapping[str, ModuleConfig]) -> None:
    """The modules' caps must fit in the total, so that no module can fill another's room."""
    caps = {name: module_max_targets(modules, name) for name in modules}
    if sum(caps.values()) <= MAX_PROBE_TARGETS:
        return
    named = next(name for name in modules if modules[name].max_targets is not None)
    share = MAX_PROBE_TARGETS // len(modules)
    raise ConfigError(
        source,
        f"modules.{named}.max_targets",
        f"the modules' max_targets add up to {sum(caps.values())} (a module without one takes"
        f" {share}, an equal share), more than the {MAX_PROBE_TARGETS} targets /probe remembers",
    )


def allow_rule_problem(entry: str) -> str:
    """Why `entry` is no allow-list entry ("" when it is one)."""
    try:
        parse_allow_rule(entry)
    except AllowRuleError as error:
        return str(error)
    return ""


def exporter_config_from_mapping(data: object, source: str) -> ExporterConfig:
    """Build and check the exporter's config; `source` names the file in every error."""
    top = Section(source, "", data, _TOP_KEYS)
    host, port = top.listen("listen", DEFAULT_LISTEN)
    interval = top.duration("interval", DEFAULT_INTERVAL_SECONDS, minimum=MIN_INTERVAL_SECONDS)
    timeout = top.duration(
        "timeout",
        min(DEFAULT_TIMEOUT_SECONDS, interval),
        minimum=MIN_INTERVAL_SECONDS,
    )
    warnings: list[str] = []
    test_request_defaults = _test_request(
        _test_request_section(top, warnings), IdleTestRequestConfig()
    )
    degraded_defaults = _degraded(top.section("degraded", _DEGRADED_KEYS), DegradedConfig())
    max_payload = top.integer("max_payload_bytes", DEFAULT_MAX_PAYLOAD_BYTES, minimum=1024)
    targets: list[TargetConfig] = []
    for section in top.sections("targets", _TARGET_KEYS):
        target = top.attempt(
            partial(
                _target,
                section,
                interval,
                timeout,
                test_request_defaults,
                warnings,
                degraded_defaults,
            ),
            None,
        )
        if target is None:
            continue
        if target.name in {t.name for t in targets}:
            section.report("name", f"duplicate target name {quoted(target.name)}")
        targets.append(target)
    modules_section = top.raw("modules", {})
    if not isinstance(modules_section, Mapping):
        top.report("modules", "expected a mapping of module names to modules")
        modules_section = {}
    modules: dict[str, ModuleConfig] = {}
    for name, value in modules_section.items():
        module_section = top.attempt(
            partial(Section, source, f"modules.{name}", value, _MODULE_KEYS, top.problems), None
        )
        if module_section is None:
            continue
        module = top.attempt(
            partial(
                _module,
                str(name),
                module_section,
                interval,
                timeout,
                test_request_defaults,
                warnings,
                degraded_defaults,
            ),
            None,
        )
        if module is not None:
            modules[str(name)] = module
    if modules:
        top.attempt(lambda: _check_module_shares(source, modules), None)
    top.finish()
    return ExporterConfig(
        targets=tuple(targets),
        listen_host=host,
        listen_port=port,
        max_payload_bytes=max_payload,
        source=source,
        modules=MappingProxyType(modules),
        warnings=tuple(warnings),
    )
