"""The exporter's configuration: frozen dataclasses, built and checked from a plain mapping."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, cast, get_args
from urllib.parse import urlsplit, urlunsplit

from stallwatch.common.config import ConfigError, Section

TargetKind = Literal[
    "auto", "vllm", "sglang", "tgi", "llamacpp", "lmdeploy", "trtllm", "triton", "proxy"
]
# Every value of a target's `kind` (`auto`, the default, recognises the engine from its
# families). The engine profiles in the core hold the same list; a unit test keeps them equal.
TARGET_KINDS: tuple[str, ...] = get_args(TargetKind)
DEFAULT_METRICS_PATH = "/metrics"
# Engines that publish Prometheus metrics somewhere else (trtllm-serve's `/metrics` is a
# destructive JSON read of its stats queue).
ENGINE_METRICS_PATHS: Mapping[str, str] = MappingProxyType({"trtllm": "/prometheus/metrics"})
ProbeEndpoint = Literal["completions", "chat"]
PROBE_ENDPOINTS: tuple[str, ...] = ("completions", "chat")
DEFAULT_LISTEN = "127.0.0.1:9732"
DEFAULT_INTERVAL_SECONDS = 15.0
DEFAULT_TIMEOUT_SECONDS = 5.0
DEFAULT_PROBE_TIMEOUT_SECONDS = 10.0
# At most one test request a minute (four 15 s polls) to a server that answers: an idle
# server's request log holds at most 1 440 a day instead of ~2 900, and a hang with running
# frozen at 0 is caught at most ~45 s later than with one every other poll.
DEFAULT_PROBE_MIN_INTERVAL_SECONDS = 60.0
DEFAULT_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
# Shorter polls would only measure the exporter; shorter timeouts would fail a healthy server.
MIN_INTERVAL_SECONDS = 0.05
MIN_PROBE_TIMEOUT_SECONDS = 0.1
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RESERVED_LABELS = frozenset({"target", "state", "reason", "url", "kind", "engine", "version"})
_TOP_KEYS = ("listen", "interval", "timeout", "probe", "max_payload_bytes", "targets")
_PROBE_KEYS = ("enabled", "model", "endpoint", "timeout", "min_interval")
_TARGET_KEYS = ("name", "url", "kind", "metrics_path", "interval", "timeout", "probe", "labels")


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
        f"{url!r} points into /metrics: give the server's base URL, {base!r} (stallwatch "
        "reads its metrics under the base URL and sends the test request to "
        "base + /v1/completions; vLLM answers every path under /metrics with metrics, so that "
        "request would fail and a healthy idle server would read unresponsive)"
    )


@dataclass(frozen=True)
class ProbeConfig:
    """The idle test request: one `max_tokens: 1` request, sent only to a server with no work."""

    enabled: bool = True
    model: str | None = None  # None: the model name the server's own metrics carry
    endpoint: ProbeEndpoint = "completions"
    timeout_seconds: float = DEFAULT_PROBE_TIMEOUT_SECONDS
    # At most one test request per this long to a server that answers (0: on every idle poll).
    min_interval_seconds: float = DEFAULT_PROBE_MIN_INTERVAL_SECONDS


@dataclass(frozen=True)
class TargetConfig:
    name: str
    url: str
    kind: TargetKind = "auto"
    metrics_path: str = "/metrics"
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    probe: ProbeConfig = ProbeConfig()
    labels: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def metrics_url(self) -> str:
        return self.url.rstrip("/") + self.metrics_path


@dataclass(frozen=True)
class ExporterConfig:
    targets: tuple[TargetConfig, ...]
    listen_host: str = "127.0.0.1"
    listen_port: int = 9732
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    source: str = "<defaults>"


def _probe(section: Section, defaults: ProbeConfig) -> ProbeConfig:
    return ProbeConfig(
        enabled=section.boolean("enabled", defaults.enabled),
        model=section.optional_string("model") or defaults.model,
        endpoint=cast(
            ProbeEndpoint, section.choice("endpoint", defaults.endpoint, PROBE_ENDPOINTS)
        ),
        timeout_seconds=section.duration(
            "timeout", defaults.timeout_seconds, minimum=MIN_PROBE_TIMEOUT_SECONDS
        ),
        min_interval_seconds=section.duration(
            "min_interval", defaults.min_interval_seconds, zero=True
        ),
    )


def _target(
    section: Section, interval: float, timeout: float, probe_defaults: ProbeConfig
) -> TargetConfig:
    name = section.string("name", required=True)
    url = section.url("url")
    problem = metrics_in_base_url(url)
    if problem:
        raise section.error("url", problem)
    labels = section.string_map("labels")
    for label in labels:
        if not _LABEL_NAME.match(label) or label.startswith("__") or label in _RESERVED_LABELS:
            raise section.error("labels", f"{label!r} cannot be used as a label name")
    kind = cast(TargetKind, section.choice("kind", "auto", TARGET_KINDS))
    metrics_path = section.string(
        "metrics_path", ENGINE_METRICS_PATHS.get(kind, DEFAULT_METRICS_PATH)
    )
    if not metrics_path.startswith("/"):
        raise section.error("metrics_path", "must start with /")
    target = TargetConfig(
        name=name,
        url=url,
        kind=kind,
        metrics_path=metrics_path,
        interval_seconds=section.duration("interval", interval, minimum=MIN_INTERVAL_SECONDS),
        timeout_seconds=section.duration("timeout", timeout, minimum=MIN_INTERVAL_SECONDS),
        probe=_probe(section.section("probe", _PROBE_KEYS), probe_defaults),
        labels=MappingProxyType(labels),
    )
    if target.timeout_seconds > target.interval_seconds:
        raise section.error("timeout", "must not be longer than the interval")
    return target


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
    probe_defaults = _probe(top.section("probe", _PROBE_KEYS), ProbeConfig())
    max_payload = top.integer("max_payload_bytes", DEFAULT_MAX_PAYLOAD_BYTES, minimum=1024)
    targets = tuple(
        _target(section, interval, timeout, probe_defaults)
        for section in top.sections("targets", _TARGET_KEYS)
    )
    names = [target.name for target in targets]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise ConfigError(source, f"targets[{index}].name", f"duplicate target name {name!r}")
    return ExporterConfig(
        targets=targets,
        listen_host=host,
        listen_port=port,
        max_payload_bytes=max_payload,
        source=source,
    )
