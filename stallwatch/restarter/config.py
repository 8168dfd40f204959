"""The restarter's configuration: YAML into frozen dataclasses, every error naming file and field.

Relative paths in the file (token, journal, TLS, action files) are taken relative to the
directory of the configuration file, so a config and its secrets can move together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import yaml

from stallwatch.common.config import parse_prometheus_duration as parse_duration

DEFAULT_LISTEN = "127.0.0.1:9733"
DEFAULT_RESTART_ALERTS: tuple[str, ...] = ("LLMServerStuck", "LLMServerUnresponsive")
# The alerts whose stall shows up as an idle server (no work, nothing completed): for them,
# two idle reads confirm instead of refusing. The exporter already sent the test request.
DEFAULT_IDLE_CONFIRMS: tuple[str, ...] = ("LLMServerUnresponsive",)
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_DOCKER_SOCKET = "/var/run/docker.sock"

ActionKind = Literal["command", "docker", "systemd", "http"]


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class CommandAction:
    argv: tuple[str, ...]
    kind: Literal["command"] = "command"


@dataclass(frozen=True)
class DockerAction:
    container: str
    socket: str = DEFAULT_DOCKER_SOCKET
    stop_timeout: float = 30.0
    kind: Literal["docker"] = "docker"


@dataclass(frozen=True)
class SystemdAction:
    unit: str
    user: bool = False
    kind: Literal["systemd"] = "systemd"


@dataclass(frozen=True)
class HttpAction:
    url: str
    method: str = "POST"
    bearer_token_file: str | None = None
    kind: Literal["http"] = "http"


Action = CommandAction | DockerAction | SystemdAction | HttpAction


@dataclass(frozen=True)
class Budget:
    max_restarts: int = 3
    window: float = 3600.0


@dataclass(frozen=True)
class FleetWindow:
    max_targets: int = 2
    window: float = 900.0


@dataclass(frozen=True)
class ConfirmSettings:
    gap: float = 5.0
    timeout: float = 3.0
    idle_confirms: tuple[str, ...] = DEFAULT_IDLE_CONFIRMS


@dataclass(frozen=True)
class Target:
    name: str
    metrics_url: str
    action: Action
    cooldown: float = 600.0
    budget: Budget = field(default_factory=Budget)
    action_timeout: float = 120.0


@dataclass(frozen=True)
class RestarterConfig:
    targets: tuple[Target, ...]
    journal: str
    listen: str = DEFAULT_LISTEN
    token: str | None = None
    insecure_no_auth: bool = False
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    restart_alerts: tuple[str, ...] = DEFAULT_RESTART_ALERTS
    dry_run: bool = False
    confirm: ConfirmSettings = field(default_factory=ConfirmSettings)
    max_in_flight: int = 1
    fleet_window: FleetWindow = field(default_factory=FleetWindow)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    source: str = "<memory>"

    def target(self, name: str) -> Target | None:
        for target in self.targets:
            if target.name == name:
                return target
        return None

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)


T = TypeVar("T")


class _Reader:
    """Walks the YAML tree and reports errors as `FILE: path.to.field: message`."""

    def __init__(self, source: str, base_dir: Path) -> None:
        self.source = source
        self.base_dir = base_dir

    def error(self, path: str, message: str) -> ConfigError:
        return ConfigError(
            f"{self.source}: {path}: {message}" if path else f"{self.source}: {message}"
        )

    def mapping(self, value: Any, path: str, allowed: set[str]) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.error(path, f"expected a mapping, got {type(value).__name__}")
        for key in value:
            if not isinstance(key, str) or key not in allowed:
                known = ", ".join(sorted(allowed))
                raise self.error(_join(path, str(key)), f"unknown key (known keys: {known})")
        return value

    def required(self, data: Mapping[str, Any], key: str, path: str) -> Any:
        if key not in data or data[key] is None:
            raise self.error(_join(path, key), "required")
        return data[key]

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.error(path, "expected a non-empty string")
        return value

    def boolean(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.error(path, "expected true or false")
        return value

    def integer(self, value: Any, path: str, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(path, f"expected an integer >= {minimum}")
        return value

    def duration(self, value: Any, path: str, *, positive: bool = False) -> float:
        try:
            if not isinstance(value, str):
                raise ValueError(value)
            seconds = parse_duration(value)
        except ValueError:
            raise self.error(path, 'expected a duration like "10m"') from None
        if positive and seconds <= 0:
            raise self.error(path, "expected a duration above zero")
        return seconds

    def string_list(self, value: Any, path: str) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise self.error(path, "expected a list of strings")
        return tuple(self.string(item, f"{path}[{index}]") for index, item in enumerate(value))

    def path(self, value: Any, path: str) -> str:
        text = self.string(value, path)
        return str(self.base_dir / Path(text).expanduser())

    def existing_file(self, value: Any, path: str) -> str:
        resolved = self.path(value, path)
        if not Path(resolved).is_file():
            raise self.error(path, f"file not found: {value}")
        return resolved

    def url(self, value: Any, path: str) -> str:
        text = self.string(value, path)
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise self.error(path, "expected an http:// or https:// URL")
        return text

    def optional(
        self, data: Mapping[str, Any], key: str, path: str, convert: Callable[[Any, str], T]
    ) -> T | None:
        value = data.get(key)
        return None if value is None else convert(value, _join(path, key))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def read_token(reader: _Reader, value: Any, path: str) -> str:
    token_path = reader.existing_file(value, path)
    try:
        token = Path(token_path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        raise reader.error(path, f"cannot read {value}: {error}") from None
    if not token:
        raise reader.error(path, f"{value} is empty")
    if any(ch.isspace() for ch in token) or not token.isascii():
        raise reader.error(path, f"{value} must hold one token of printable ASCII characters")
    return token


def _action(reader: _Reader, value: Any, path: str, stop_limit: float) -> Action:
    if not isinstance(value, dict):
        raise reader.error(path, "expected a mapping with a `kind`")
    kind = value.get("kind")
    if kind == "command":
        data = reader.mapping(value, path, {"kind", "argv"})
        argv = reader.string_list(reader.required(data, "argv", path), _join(path, "argv"))
        if not argv:
            raise reader.error(_join(path, "argv"), "expected at least the program")
        return CommandAction(argv=argv)
    if kind == "docker":
        data = reader.mapping(value, path, {"kind", "container", "socket", "stop_timeout"})
        container = reader.string(
            reader.required(data, "container", path), _join(path, "container")
        )
        stop = data.get("stop_timeout", "30s")
        stop_timeout = reader.duration(stop, _join(path, "stop_timeout"))
        if stop_timeout >= stop_limit:
            raise reader.error(
                _join(path, "stop_timeout"), "must be shorter than the target's action_timeout"
            )
        socket = reader.string(data.get("socket", DEFAULT_DOCKER_SOCKET), _join(path, "socket"))
        return DockerAction(container=container, socket=socket, stop_timeout=stop_timeout)
    if kind == "systemd":
        data = reader.mapping(value, path, {"kind", "unit", "user"})
        unit = reader.string(reader.required(data, "unit", path), _join(path, "unit"))
        if unit.startswith("-"):
            raise reader.error(_join(path, "unit"), "a unit name cannot start with '-'")
        user = reader.boolean(data.get("user", False), _join(path, "user"))
        return SystemdAction(unit=unit, user=user)
    if kind == "http":
        data = reader.mapping(value, path, {"kind", "url", "method", "bearer_token_file"})
        url = reader.url(reader.required(data, "url", path), _join(path, "url"))
        method = reader.string(data.get("method", "POST"), _join(path, "method")).upper()
        if method not in ("POST", "PUT", "GET", "DELETE", "PATCH"):
            raise reader.error(_join(path, "method"), "expected POST, PUT, GET, DELETE or PATCH")
        token_file = reader.optional(data, "bearer_token_file", path, reader.existing_file)
        return HttpAction(url=url, method=method, bearer_token_file=token_file)
    raise reader.error(_join(path, "kind"), "expected one of: command, docker, systemd, http")


def _target(reader: _Reader, value: Any, path: str) -> Target:
    allowed = {"name", "metrics_url", "action", "cooldown", "budget", "action_timeout"}
    data = reader.mapping(value, path, allowed)
    name = reader.string(reader.required(data, "name", path), _join(path, "name"))
    metrics_url = reader.url(reader.required(data, "metrics_url", path), _join(path, "metrics_url"))
    action_timeout = reader.duration(
        data.get("action_timeout", "2m"), _join(path, "action_timeout"), positive=True
    )
    action = _action(
        reader, reader.required(data, "action", path), _join(path, "action"), action_timeout
    )
    cooldown = reader.duration(data.get("cooldown", "10m"), _join(path, "cooldown"))
    budget_path = _join(path, "budget")
    budget_data = reader.mapping(data.get("budget", {}), budget_path, {"max_restarts", "window"})
    budget = Budget(
        max_restarts=reader.integer(
            budget_data.get("max_restarts", 3), _join(budget_path, "max_restarts"), 1
        ),
        window=reader.duration(
            budget_data.get("window", "1h"), _join(budget_path, "window"), positive=True
        ),
    )
    return Target(
        name=name,
        metrics_url=metrics_url,
        action=action,
        cooldown=cooldown,
        budget=budget,
        action_timeout=action_timeout,
    )


_TOP_KEYS = {
    "listen",
    "token_file",
    "insecure_no_auth",
    "tls_cert_file",
    "tls_key_file",
    "restart_alerts",
    "journal",
    "dry_run",
    "confirm",
    "max_in_flight",
    "fleet_window",
    "max_body_bytes",
    "targets",
}


def parse_config(document: Any, source: str, base_dir: Path) -> RestarterConfig:
    """Build the config from a parsed YAML document; `source` names the file in errors."""
    reader = _Reader(source, base_dir)
    data = reader.mapping(document, "", _TOP_KEYS)
    listen = reader.string(data.get("listen", DEFAULT_LISTEN), "listen")
    host, separator, port = listen.rpartition(":")
    if not separator or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise reader.error("listen", 'expected HOST:PORT, e.g. "127.0.0.1:9733"')
    insecure = reader.boolean(data.get("insecure_no_auth", False), "insecure_no_auth")
    token: str | None = None
    if data.get("token_file") is not None:
        token = read_token(reader, data["token_file"], "token_file")
    elif not insecure:
        raise reader.error("token_file", "required (or set insecure_no_auth: true)")
    cert = reader.optional(data, "tls_cert_file", "", reader.existing_file)
    key = reader.optional(data, "tls_key_file", "", reader.existing_file)
    if (cert is None) != (key is None):
        raise reader.error("tls_cert_file", "tls_cert_file and tls_key_file go together")
    restart_alerts: tuple[str, ...] = DEFAULT_RESTART_ALERTS
    if "restart_alerts" in data:
        restart_alerts = reader.string_list(data["restart_alerts"], "restart_alerts")
    journal = reader.path(reader.required(data, "journal", ""), "journal")
    dry_run = reader.boolean(data.get("dry_run", False), "dry_run")
    confirm_data = reader.mapping(
        data.get("confirm", {}), "confirm", {"gap", "timeout", "idle_confirms"}
    )
    confirm = ConfirmSettings(
        gap=reader.duration(confirm_data.get("gap", "5s"), "confirm.gap"),
        timeout=reader.duration(
            confirm_data.get("timeout", "3s"), "confirm.timeout", positive=True
        ),
        idle_confirms=reader.string_list(
            confirm_data.get("idle_confirms", list(DEFAULT_IDLE_CONFIRMS)), "confirm.idle_confirms"
        ),
    )
    max_in_flight = reader.integer(data.get("max_in_flight", 1), "max_in_flight", 1)
    fleet_data = reader.mapping(
        data.get("fleet_window", {}), "fleet_window", {"max_targets", "window"}
    )
    fleet_window = FleetWindow(
        max_targets=reader.integer(fleet_data.get("max_targets", 2), "fleet_window.max_targets", 1),
        window=reader.duration(
            fleet_data.get("window", "15m"), "fleet_window.window", positive=True
        ),
    )
    max_body = reader.integer(
        data.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES), "max_body_bytes", 1024
    )
    raw_targets = reader.required(data, "targets", "")
    if not isinstance(raw_targets, list) or not raw_targets:
        raise reader.error("targets", "expected a non-empty list of targets")
    targets: list[Target] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_targets):
        target = _target(reader, raw, f"targets[{index}]")
        if target.name in seen:
            raise reader.error(f"targets[{index}].name", f"duplicate target name {target.name!r}")
        seen.add(target.name)
        targets.append(target)
    return RestarterConfig(
        targets=tuple(targets),
        journal=journal,
        listen=listen,
        token=token,
        insecure_no_auth=insecure,
        tls_cert_file=cert,
        tls_key_file=key,
        restart_alerts=restart_alerts,
        dry_run=dry_run,
        confirm=confirm,
        max_in_flight=max_in_flight,
        fleet_window=fleet_window,
        max_body_bytes=max_body,
        source=source,
    )


def load_config(path: str | Path) -> RestarterConfig:
    """Read and validate a restarter config file."""
    file = Path(path)
    source = file.name
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot read: {error}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{source}: not valid YAML: {error}") from None
    return parse_config(document, source, file.resolve().parent)
