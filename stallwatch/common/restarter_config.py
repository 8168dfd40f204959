"""The restarter's configuration: frozen dataclasses, built and checked from a plain mapping."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Literal
from urllib.parse import urlsplit

from stallwatch.common.config import Section, parse_listen, quoted
from stallwatch.common.exporter_config import metrics_in_base_url
from stallwatch.common.kubernetes_config import (
    KUBERNETES_ACTION_KEYS,
    KubernetesAction,
    KubernetesSettings,
    PodRule,
    kubernetes_action_from,
    kubernetes_settings_from,
    pod_rules_from,
)
from stallwatch.common.quarantine_config import (
    DEFAULT_POOL,
    QuarantineSettings,
    quarantine_settings_from,
)
from stallwatch.common.restart_limits import (
    BUDGET_KEYS,
    DEFAULT_MAX_HOLD,
    DEFAULT_RESTART_AFTER,
    Budget,
    CooldownAuto,
    budget_from,
    cooldown_auto_from,
    restart_after_from,
)
from stallwatch.common.restarter_files import RestarterFiles

DEFAULT_LISTEN = "127.0.0.1:9733"
DEFAULT_RESTART_ALERTS: tuple[str, ...] = (
    "LLMServerStuck",
    "LLMServerUnresponsive",
    "LLMServerHung",
)
# The alerts whose stall shows up as an idle server (no work, nothing completed): for them,
# two idle reads confirm instead of refusing. The exporter already sent the test request.
DEFAULT_IDLE_CONFIRMS: tuple[str, ...] = ("LLMServerUnresponsive",)
# The alerts whose stall is a server that accepts connections and never answers: for them, two
# reads that both connect and get no answer confirm. For any other alert they refuse (down).
DEFAULT_HUNG_CONFIRMS: tuple[str, ...] = ("LLMServerHung",)
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_DOCKER_SOCKET = "/var/run/docker.sock"
# vLLM publishes its counters once per engine step, and its progress counter only on steps that
# emit a token; one step of a loaded server (a full prefill chunk on a large model) can take
# several hundred milliseconds. Two reads closer than this can fall inside one step and show a
# healthy busy server as stalled.
MIN_CONFIRM_GAP_SECONDS = 1.0
_GAP_WHY = (
    " (vLLM updates its counters once per engine step, and a loaded server's step can take"
    " most of a second: reads closer together can show no progress on a healthy server)"
)
HTTP_METHODS: tuple[str, ...] = ("POST", "PUT", "GET", "DELETE", "PATCH")


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


Action = CommandAction | DockerAction | SystemdAction | HttpAction | KubernetesAction


@dataclass(frozen=True)
class FleetWindow:
    max_targets: int = 2
    window: float = 900.0


@dataclass(frozen=True)
class MassStall:
    """More than `max_percent` % of the targets stalled at once (and at least `min_stalled`):
    a shared cause, so restart none. A firing restart alert counts for `window` unless resolved."""

    max_percent: int = 50
    min_stalled: int = 3
    window: float = 4500.0


@dataclass(frozen=True)
class Breaker:
    """What opens the latched breaker (only an operator's `resume` closes it)."""

    on_mass_stall: bool = True
    failed_actions: int = 3  # failed actions in a row, fleet-wide; 0: never


DEFAULT_CONFIRM_TIMEOUT = 2.0


@dataclass(frozen=True)
class ConfirmSettings:
    gap: float = 5.0
    # gap + 2 x timeout stays under Alertmanager's webhook timeout (about 10 s) when both
    # confirming reads time out.
    timeout: float = DEFAULT_CONFIRM_TIMEOUT
    idle_confirms: tuple[str, ...] = DEFAULT_IDLE_CONFIRMS
    hung_confirms: tuple[str, ...] = DEFAULT_HUNG_CONFIRMS


@dataclass(frozen=True)
class Target:
    name: str
    metrics_url: str
    action: Action
    cooldown: float = 600.0
    budget: Budget = field(default_factory=Budget)
    action_timeout: float = 120.0
    # Set by `cooldown: auto`; `cooldown` then holds its floor.
    cooldown_auto: CooldownAuto | None = None
    # How long the restarter must itself see no progress before it acts (0: at once).
    restart_after: float = DEFAULT_RESTART_AFTER
    # The replicas it stands in for: a quarantine never takes out the last of them.
    pool: str = DEFAULT_POOL


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
    rules: tuple[PodRule, ...] = ()
    kubernetes: KubernetesSettings | None = None
    mass_stall: MassStall = field(default_factory=MassStall)
    breaker: Breaker = field(default_factory=Breaker)
    # Each target's restart window unless it sets its own; the longest hold allowed.
    restart_after: float = DEFAULT_RESTART_AFTER
    max_hold: float = DEFAULT_MAX_HOLD
    quarantine: QuarantineSettings = field(default_factory=QuarantineSettings)
    source: str = "<memory>"
    # What the file asks for that still works but should change (deprecated keys).
    warnings: tuple[str, ...] = ()

    def target(self, name: str) -> Target | None:
        for target in self.targets:
            if target.name == name:
                return target
        return None

    def pools(self) -> dict[str, tuple[str, ...]]:
        """The configured targets by pool, in config order."""
        pools: dict[str, tuple[str, ...]] = {}
        for target in self.targets:
            pools[target.pool] = (*pools.get(target.pool, ()), target.name)
        return pools

    def quarantine_summary(self) -> list[str]:
        """What the quarantine will do with these targets, one line each: on or off, and each
        pool, a target alone in its pool saying it never leaves rotation (it has no replica to
        take its users, so its stalls are not journaled as refused either). Nothing without fixed
        targets (rules' pods are pooled by workload as they are found)."""
        settings = self.quarantine
        if not self.targets:
            return []
        if not settings.enabled:
            return ["quarantine: off"]
        lines = [
            f"quarantine: on, at most {settings.max_share} % of a pool out of rotation at once"
        ]
        for pool, names in self.pools().items():
            if len(names) == 1:
                lines.append(
                    f"pool {pool}: {names[0]} alone, never taken out of rotation "
                    "(give its replicas the same pool:)"
                )
            else:
                lines.append(f"pool {pool}: {', '.join(names)}")
        return lines

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_listen(self.listen)


def _command_action(section: Section, files: RestarterFiles, action_timeout: float) -> Action:
    argv = section.raw("argv")
    if not isinstance(argv, list):
        raise section.error("argv", f"expected a list of strings, got {quoted(argv)}")
    program = section.string_list("argv", ())
    if not program:
        raise section.error("argv", "expected at least the program")
    return CommandAction(argv=(files.program(section, program[0]), *program[1:]))


def _docker_action(section: Section, files: RestarterFiles, action_timeout: float) -> Action:
    stop_timeout = section.duration("stop_timeout", 30.0, zero=True)
    if stop_timeout >= action_timeout:
        raise section.error("stop_timeout", "must be shorter than the target's action_timeout")
    return DockerAction(
        container=section.string("container", required=True),
        socket=section.string("socket", DEFAULT_DOCKER_SOCKET),
        stop_timeout=stop_timeout,
    )


def _systemd_action(section: Section, files: RestarterFiles, action_timeout: float) -> Action:
    unit = section.string("unit", required=True)
    if unit.startswith("-"):
        raise section.error("unit", "a unit name cannot start with '-'")
    return SystemdAction(unit=unit, user=section.boolean("user", False))


def _http_action(section: Section, files: RestarterFiles, action_timeout: float) -> Action:
    method = section.string("method", "POST").upper()
    if method not in HTTP_METHODS:
        raise section.error("method", f"expected one of {', '.join(HTTP_METHODS)}")
    return HttpAction(
        url=section.url("url"),
        method=method,
        bearer_token_file=files.secret(section, "bearer_token_file"),
    )


def _kubernetes_action(section: Section, files: RestarterFiles, action_timeout: float) -> Action:
    return kubernetes_action_from(section, fixed=True)


@dataclass(frozen=True)
class ActionSpec:
    """One kind of restart action in the config: the keys its mapping takes and its parser."""

    keys: tuple[str, ...]
    parse: Callable[[Section, RestarterFiles, float], Action]


# Every action kind a target may name. The restarter's runners (`restarter/actions.py`) have
# one entry a kind too; a unit test holds the two tables to the same keys.
ACTION_KINDS: Mapping[str, ActionSpec] = MappingProxyType(
    {
        "command": ActionSpec(("kind", "argv"), _command_action),
        "docker": ActionSpec(("kind", "container", "socket", "stop_timeout"), _docker_action),
        "systemd": ActionSpec(("kind", "unit", "user"), _systemd_action),
        "http": ActionSpec(("kind", "url", "method", "bearer_token_file"), _http_action),
        "kubernetes": ActionSpec(KUBERNETES_ACTION_KEYS, _kubernetes_action),
    }
)


def _action(section: Section, files: RestarterFiles, action_timeout: float) -> Action:
    """The target's `action`: its kind looked up in ACTION_KINDS, then parsed by that kind."""
    raw = section.required("action")
    if not isinstance(raw, Mapping):
        raise section.error("action", f"expected a mapping, got {type(raw).__name__}")
    kind = raw.get("kind")
    spec = ACTION_KINDS.get(kind) if isinstance(kind, str) else None
    if spec is None:
        kinds = ", ".join(ACTION_KINDS)
        raise section.error("action.kind", f"expected one of {kinds}, got {quoted(kind)}")
    action_section = section.section("action", spec.keys)
    return spec.parse(action_section, files, action_timeout)


_TARGET_KEYS = (
    "name",
    "url",
    "metrics_path",
    "metrics_url",
    "action",
    "cooldown",
    "budget",
    "action_timeout",
    "cooldown_auto",
    "restart_after",
    "pool",
)


def _metrics_url(section: Section, warnings: list[str]) -> str:
    """The URL the confirmation reads: `url` + `metrics_path` as the exporter's targets
    say it, or the deprecated `metrics_url` (a full `/metrics` URL) with a warning."""
    if section.has("metrics_url"):
        if section.has("url") or section.has("metrics_path"):
            raise section.error("metrics_url", "give url (and metrics_path), not metrics_url too")
        metrics_url = section.url("metrics_url")
        path = urlsplit(metrics_url).path
        if path in ("", "/"):
            raise section.error(
                "metrics_url",
                f"{quoted(metrics_url)} is a base URL, not a /metrics endpoint: write "
                f"url: {metrics_url.rstrip('/')} instead (the metrics are read at url + "
                "metrics_path, /metrics unless given)",
            )
        if metrics_url.endswith("/metrics"):
            hint = f"url: {metrics_url.removesuffix('/metrics')}"
        else:
            parts = urlsplit(metrics_url)
            base = f"{parts.scheme}://{parts.netloc}"
            hint = f"url: {base} and metrics_path: {metrics_url.removeprefix(base)}"
        warnings.append(
            f"{section.source}: {section.field_name('metrics_url')}: deprecated (to be removed "
            f"in 0.3): write {hint} instead, as in the exporter's targets"
        )
        return metrics_url
    url = section.attempt(partial(section.url, "url"), "")
    problem = metrics_in_base_url(url)
    if problem:
        raise section.error("url", problem)
    metrics_path = section.string("metrics_path", "/metrics")
    if not metrics_path.startswith("/"):
        raise section.error("metrics_path", "must start with /")
    return url.rstrip("/") + metrics_path


def _target(
    section: Section, files: RestarterFiles, warnings: list[str], restart_after: float
) -> Target | None:
    """The target, or None when a part of it could not be built (its errors are recorded)."""
    name = section.attempt(partial(section.string, "name", required=True), "")
    metrics_url = section.attempt(partial(_metrics_url, section, warnings), "")
    action_timeout = section.duration("action_timeout", 120.0)
    action = section.attempt(partial(_action, section, files, action_timeout), None)
    budget = section.section("budget", BUDGET_KEYS)
    cooldown_auto = cooldown_auto_from(section)
    cooldown = (
        cooldown_auto.floor
        if cooldown_auto is not None
        else section.duration("cooldown", 600.0, zero=True)
    )
    limits = budget_from(budget)
    restart_window = restart_after_from(section, restart_after)
    if action is None:
        return None
    return Target(
        name=name,
        metrics_url=metrics_url,
        action=action,
        cooldown=cooldown,
        cooldown_auto=cooldown_auto,
        budget=limits,
        action_timeout=action_timeout,
        restart_after=restart_window,
        pool=section.string("pool", DEFAULT_POOL),
    )


_TOP_KEYS = (
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
    "mass_stall",
    "breaker",
    "restart_after",
    "max_hold",
    "targets",
    "rules",
    "kubernetes",
    "quarantine",
)


def restarter_config_from_mapping(data: object, source: str, base_dir: Path) -> RestarterConfig:
    """Build and check the restarter's config; `source` names the file in every error."""
    top = Section(source, "", data, _TOP_KEYS)
    files = RestarterFiles(base_dir)
    top.listen("listen", DEFAULT_LISTEN)  # checked here; the config keeps the text as written
    insecure = top.boolean("insecure_no_auth", False)
    token = top.attempt(partial(files.token, top, "token_file"), "")
    if token is None and not insecure:
        top.report("token_file", "is required (or set insecure_no_auth: true)")
    cert = top.attempt(partial(files.existing_file, top, "tls_cert_file"), "")
    key = top.attempt(partial(files.existing_file, top, "tls_key_file"), "")
    if "" not in (cert, key) and (cert is None) != (key is None):  # "": already refused
        top.report("tls_cert_file", "tls_cert_file and tls_key_file go together")
    confirm = top.section("confirm", ("gap", "timeout", "idle_confirms", "hung_confirms"))
    fleet = top.section("fleet_window", ("max_targets", "window"))
    mass = top.section("mass_stall", ("max_percent", "min_stalled", "window"))
    breaker = top.section("breaker", ("on_mass_stall", "failed_actions"))
    max_percent = mass.integer("max_percent", 50, minimum=1)
    if max_percent > 100:
        mass.report("max_percent", "expected a percentage from 1 to 100 (100: never)")
    config = RestarterConfig(
        targets=(),
        journal=top.attempt(partial(files.journal, top, "journal"), ""),
        listen=top.string("listen", DEFAULT_LISTEN),
        token=token,
        insecure_no_auth=insecure,
        tls_cert_file=cert,
        tls_key_file=key,
        restart_alerts=top.string_list("restart_alerts", DEFAULT_RESTART_ALERTS),
        dry_run=top.boolean("dry_run", False),
        confirm=ConfirmSettings(
            gap=confirm.duration("gap", 5.0, minimum=MIN_CONFIRM_GAP_SECONDS, why=_GAP_WHY),
            timeout=confirm.duration("timeout", DEFAULT_CONFIRM_TIMEOUT),
            idle_confirms=confirm.string_list("idle_confirms", DEFAULT_IDLE_CONFIRMS),
            hung_confirms=confirm.string_list("hung_confirms", DEFAULT_HUNG_CONFIRMS),
        ),
        max_in_flight=top.integer("max_in_flight", 1, minimum=1),
        fleet_window=FleetWindow(
            max_targets=fleet.integer("max_targets", 2, minimum=1),
            window=fleet.duration("window", 900.0),
        ),
        max_body_bytes=top.integer("max_body_bytes", DEFAULT_MAX_BODY_BYTES, minimum=1024),
        mass_stall=MassStall(
            max_percent=max_percent,
            min_stalled=mass.integer("min_stalled", 3, minimum=1),
            window=mass.duration("window", 4500.0),
        ),
        breaker=Breaker(
            on_mass_stall=breaker.boolean("on_mass_stall", True),
            failed_actions=breaker.integer("failed_actions", 3),
        ),
        restart_after=restart_after_from(top, DEFAULT_RESTART_AFTER),
        max_hold=top.duration("max_hold", DEFAULT_MAX_HOLD),
        quarantine=quarantine_settings_from(top),
        source=source,
    )
    targets: list[Target] = []
    warnings: list[str] = []
    parsed_rules = top.attempt(partial(pod_rules_from, top, config.restart_after), None)
    rules = parsed_rules or ()
    kubernetes = top.attempt(partial(kubernetes_settings_from, top, files), None)
    for section in top.sections("targets", _TARGET_KEYS, required=parsed_rules == ()):
        target = top.attempt(partial(_target, section, files, warnings, config.restart_after), None)
        if target is None:
            continue
        if target.name in {t.name for t in targets}:
            section.report("name", f"duplicate target name {quoted(target.name)}")
        targets.append(target)
    top.finish()
    uses_kubernetes = bool(rules) or any(
        isinstance(target.action, KubernetesAction) for target in targets
    )
    if uses_kubernetes and kubernetes is None:
        kubernetes = KubernetesSettings()  # in-cluster, from the pod's service account
    return replace(
        config,
        targets=tuple(targets),
        rules=rules,
        kubernetes=kubernetes,
        warnings=tuple(warnings),
    )
