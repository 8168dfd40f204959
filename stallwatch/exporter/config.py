"""The exporter's configuration: YAML into frozen dataclasses, validated before it is used."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal, cast
from urllib.parse import urlsplit

from stallwatch.common.config import ConfigError, Section, load_yaml_mapping
from stallwatch.core.engines import TARGET_KINDS, default_metrics_path
from stallwatch.exporter.fetch import ProbeEndpoint

TargetKind = Literal[
    "auto", "vllm", "sglang", "tgi", "llamacpp", "lmdeploy", "trtllm", "triton", "proxy"
]
DEFAULT_LISTEN = "127.0.0.1:9732"
DEFAULT_INTERVAL_SECONDS = 15.0
DEFAULT_TIMEOUT_SECONDS = 5.0
DEFAULT_PROBE_TIMEOUT_SECONDS = 10.0
DEFAULT_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RESERVED_LABELS = frozenset({"target", "state", "reason", "url", "kind", "engine", "version"})


@dataclass(frozen=True)
class ProbeConfig:
    """The idle test request: one `max_tokens: 1` request, sent only to a server with no work."""

    enabled: bool = True
    model: str | None = None  # None: the model name the server's own metrics carry
    endpoint: ProbeEndpoint = "completions"
    timeout_seconds: float = DEFAULT_PROBE_TIMEOUT_SECONDS


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

    def target(self, name: str) -> TargetConfig | None:
        return next((t for t in self.targets if t.name == name), None)


def parse_listen(value: str) -> tuple[str, int]:
    """`host:port`, `:port` (all interfaces) or `[v6]:port`."""
    host, separator, port_text = value.rpartition(":")
    if not separator or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"expected host:port, got {value!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port_text)


def _probe(section: Section, defaults: ProbeConfig) -> ProbeConfig:
    probe = ProbeConfig(
        enabled=section.boolean("enabled", defaults.enabled),
        model=section.optional_string("model") or defaults.model,
        endpoint=cast(
            ProbeEndpoint, section.choice("endpoint", defaults.endpoint, ("completions", "chat"))
        ),
        timeout_seconds=section.duration("timeout", defaults.timeout_seconds, minimum=0.1),
    )
    section.finish()
    return probe


def _url(section: Section) -> str:
    url = section.string("url", required=True)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise section.error("url", f"expected an http(s) URL, got {url!r}")
    return url


def _target(
    section: Section, interval: float, timeout: float, probe_defaults: ProbeConfig
) -> TargetConfig:
    labels = section.string_map("labels")
    for label in labels:
        if not _LABEL_NAME.match(label) or label.startswith("__") or label in _RESERVED_LABELS:
            raise section.error("labels", f"{label!r} cannot be used as a label name")
    kind = cast(TargetKind, section.choice("kind", "auto", TARGET_KINDS))
    metrics_path = section.string("metrics_path", default_metrics_path(kind))
    if not metrics_path.startswith("/"):
        raise section.error("metrics_path", "must start with /")
    target = TargetConfig(
        name=section.string("name", required=True),
        url=_url(section),
        kind=kind,
        metrics_path=metrics_path,
        interval_seconds=section.duration("interval", interval, minimum=0.05),
        timeout_seconds=section.duration("timeout", timeout, minimum=0.05),
        probe=_probe(section.section("probe"), probe_defaults),
        labels=MappingProxyType(labels),
    )
    if target.timeout_seconds > target.interval_seconds:
        raise section.error("timeout", "must not be longer than the interval")
    section.finish()
    return target


def config_from_mapping(data: object, source: str) -> ExporterConfig:
    top = Section(source, "", data)
    try:
        host, port = parse_listen(top.string("listen", DEFAULT_LISTEN))
    except ValueError as error:
        raise top.error("listen", str(error)) from error
    interval = top.duration("interval", DEFAULT_INTERVAL_SECONDS, minimum=0.05)
    timeout = top.duration("timeout", min(DEFAULT_TIMEOUT_SECONDS, interval), minimum=0.05)
    probe_defaults = _probe(top.section("probe"), ProbeConfig())
    max_payload = top.integer("max_payload_bytes", DEFAULT_MAX_PAYLOAD_BYTES, minimum=1024)
    targets = tuple(
        _target(section, interval, timeout, probe_defaults) for section in top.sections("targets")
    )
    names = [target.name for target in targets]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise ConfigError(source, f"targets[{index}].name", f"duplicate target name {name!r}")
    top.finish()
    return ExporterConfig(
        targets=targets,
        listen_host=host,
        listen_port=port,
        max_payload_bytes=max_payload,
        source=source,
    )


def load_config(path: Path) -> ExporterConfig:
    """Read and validate a config file; raises ConfigError naming the file and field."""
    return config_from_mapping(load_yaml_mapping(path), str(path))
