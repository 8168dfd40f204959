"""The restarter's configuration: frozen dataclasses, built and checked from a plain mapping.

Relative paths in the file (token, journal, TLS, action files) are taken relative to the
directory of the configuration file, so a config and its secrets can move together.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from stallwatch.common.config import ConfigError, Section, parse_listen
from stallwatch.common.exporter_config import metrics_in_base_url

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


KubernetesMode = Literal["evict", "delete", "rollout_restart"]
KUBERNETES_MODES: tuple[KubernetesMode, ...] = ("evict", "delete", "rollout_restart")


@dataclass(frozen=True)
class KubernetesAction:
    """Restart a pod through the Kubernetes API: evict it (PodDisruptionBudgets apply), delete
    it, or restart its owner (a Deployment's or StatefulSet's rollout restart).

    `namespace` and `pod` are set for a fixed target; a rule's action leaves them empty and
    the pod the rule resolved fills them in.
    """

    mode: KubernetesMode = "evict"
    namespace: str = ""
    pod: str = ""
    grace_period: int | None = None
    kind: Literal["kubernetes"] = "kubernetes"


Action = CommandAction | DockerAction | SystemdAction | HttpAction | KubernetesAction


@dataclass(frozen=True)
class Budget:
    max_restarts: int = 3
    window: float = 3600.0


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


@dataclass(frozen=True)
class CooldownAuto:
    """`cooldown: auto`: factor x the target's last measured load time, within floor and max."""

    floor: float = 600.0
    factor: float = 3.0
    max: float = 7200.0


@dataclass(frozen=True)
class ConfirmSettings:
    gap: float = 5.0
    timeout: float = 3.0
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


@dataclass(frozen=True)
class PodRule:
    """An allow-rule: which alerts may restart which pods, and how.

    The alert names the pod (its `namespace_label` and `pod_label`); the rule allows it only
    when the namespace is listed, the alert's `alert_labels` match, and the pod read from the
    API carries every label of `selector`. The confirmation reads the pod's IP at the
    container port named `metrics_port`, never a URL from the alert.
    """

    name: str
    namespaces: tuple[str, ...]
    selector: tuple[tuple[str, str], ...]
    metrics_port: str
    action: KubernetesAction
    metrics_path: str = "/metrics"
    metrics_scheme: str = "http"
    alert_labels: tuple[tuple[str, tuple[str, ...]], ...] = ()
    namespace_label: str = "namespace"
    pod_label: str = "pod"
    cooldown: float = 600.0
    budget: Budget = field(default_factory=Budget)
    action_timeout: float = 120.0


@dataclass(frozen=True)
class LeaseSettings:
    """The coordination.k8s.io Lease that makes one of several replicas the one that acts."""

    name: str
    namespace: str
    identity: str
    duration: float = 15.0
    renew_every: float = 5.0


@dataclass(frozen=True)
class KubernetesSettings:
    """How the restarter reaches the Kubernetes API (a kubeconfig file, or in-cluster)."""

    kubeconfig: str | None = None
    context: str | None = None
    lease: LeaseSettings | None = None
    events: bool = True
    event_namespace_fallback: str = "default"


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
    source: str = "<memory>"
    # What the file asks for that still works but should change (deprecated keys).
    warnings: tuple[str, ...] = ()

    def target(self, name: str) -> Target | None:
        for target in self.targets:
            if target.name == name:
                return target
        return None

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_listen(self.listen)


class _Files:
    """Paths of the config file, resolved next to it and checked on disk."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir

    def path(self, section: Section, key: str) -> str:
        return str(self.base_dir / Path(section.string(key, required=True)).expanduser())

    def existing_file(self, section: Section, key: str) -> str | None:
        if not section.has(key):
            return None
        resolved = self.path(section, key)
        if not Path(resolved).is_file():
            raise section.error(key, f"file not found: {section.raw(key)}")
        return resolved

    def secret(self, section: Section, key: str) -> str | None:
        """A file only its owner's group may read and only its owner may write."""
        resolved = self.existing_file(section, key)
        if resolved is None:
            return None
        mode = stat.S_IMODE(Path(resolved).stat().st_mode)
        if mode & (stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP):
            raise section.error(
                key,
                f"{section.raw(key)} has mode {mode:04o}: a secret must not be readable by "
                "every user nor writable by its group (chmod 600, or 640 to share it with a group)",
            )
        return resolved

    def token(self, section: Section, key: str) -> str | None:
        resolved = self.secret(section, key)
        if resolved is None:
            return None
        name = section.raw(key)
        try:
            token = Path(resolved).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise section.error(key, f"cannot read {name}: {error}") from None
        if not token:
            raise section.error(key, f"{name} is empty")
        if any(ch.isspace() for ch in token) or not token.isascii():
            raise section.error(key, f"{name} must hold one token of printable ASCII characters")
        return token

    def program(self, section: Section, name: str) -> str:
        """argv[0] as it will be run: a path (relative ones next to the config) that is an
        executable file, or a name found on the PATH now, as it would be at restart time."""
        if "/" not in name:
            if shutil.which(name) is None:
                raise section.error("argv", f"program {name!r} not found on the PATH")
            return name
        resolved = self.base_dir / Path(name).expanduser()
        if not resolved.is_file():
            raise section.error("argv", f"program not found: {name}")
        if not os.access(resolved, os.X_OK):
            raise section.error("argv", f"{name} is not executable (chmod +x)")
        return str(resolved)

    def journal(self, section: Section, key: str) -> str:
        resolved = Path(self.path(section, key))
        if resolved.is_dir():
            raise section.error(key, f"{resolved} is a directory, not a journal file")
        for parent in resolved.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise section.error(key, f"{parent} is a file, not a directory")
                break
        return str(resolved)


def _action(section: Section, files: _Files, action_timeout: float) -> Action:
    kind = section.choice("kind", "", tuple(_ACTION_KEYS))
    if kind == "command":
        argv = section.raw("argv")
        if not isinstance(argv, list):
            raise section.error("argv", f"expected a list of strings, got {argv!r}")
        program = section.string_list("argv", ())
        if not program:
            raise section.error("argv", "expected at least the program")
        return CommandAction(argv=(files.program(section, program[0]), *program[1:]))
    if kind == "docker":
        stop_timeout = section.duration("stop_timeout", 30.0, zero=True)
        if stop_timeout >= action_timeout:
            raise section.error("stop_timeout", "must be shorter than the target's action_timeout")
        return DockerAction(
            container=section.string("container", required=True),
            socket=section.string("socket", DEFAULT_DOCKER_SOCKET),
            stop_timeout=stop_timeout,
        )
    if kind == "kubernetes":
        return _kubernetes_action(section, fixed=True)
    if kind == "systemd":
        unit = section.string("unit", required=True)
        if unit.startswith("-"):
            raise section.error("unit", "a unit name cannot start with '-'")
        return SystemdAction(unit=unit, user=section.boolean("user", False))
    method = section.string("method", "POST").upper()
    if method not in HTTP_METHODS:
        raise section.error("method", f"expected one of {', '.join(HTTP_METHODS)}")
    return HttpAction(
        url=section.url("url"),
        method=method,
        bearer_token_file=files.secret(section, "bearer_token_file"),
    )


def _kubernetes_action(section: Section, *, fixed: bool) -> KubernetesAction:
    """A kubernetes action; a fixed target names its pod, a rule's pods come from the API."""
    mode = section.choice("mode", "evict", KUBERNETES_MODES)
    grace = section.integer("grace_period", 0) if section.has("grace_period") else None
    if not fixed:
        for key in ("namespace", "pod"):
            if section.has(key):
                raise section.error(key, "a rule's pod comes from the alert and the API, not here")
        return KubernetesAction(mode=mode, grace_period=grace)  # type: ignore[arg-type]
    return KubernetesAction(
        mode=mode,  # type: ignore[arg-type]
        namespace=section.string("namespace", required=True),
        pod=section.string("pod", required=True),
        grace_period=grace,
    )


_ACTION_KEYS: dict[str, tuple[str, ...]] = {
    "command": ("kind", "argv"),
    "docker": ("kind", "container", "socket", "stop_timeout"),
    "systemd": ("kind", "unit", "user"),
    "http": ("kind", "url", "method", "bearer_token_file"),
    "kubernetes": ("kind", "mode", "namespace", "pod", "grace_period"),
}
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
                f"{metrics_url!r} is a base URL, not a /metrics endpoint: write "
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
    url = section.url("url")
    problem = metrics_in_base_url(url)
    if problem:
        raise section.error("url", problem)
    metrics_path = section.string("metrics_path", "/metrics")
    if not metrics_path.startswith("/"):
        raise section.error("metrics_path", "must start with /")
    return url.rstrip("/") + metrics_path


def _target(section: Section, files: _Files, warnings: list[str]) -> Target:
    name = section.string("name", required=True)
    metrics_url = _metrics_url(section, warnings)
    action_timeout = section.duration("action_timeout", 120.0)
    raw_action = section.required("action")
    kind = raw_action.get("kind") if isinstance(raw_action, dict) else None
    if isinstance(raw_action, dict) and kind not in _ACTION_KEYS:
        kinds = ", ".join(_ACTION_KEYS)
        raise section.error("action.kind", f"expected one of {kinds}, got {kind!r}")
    keys = _ACTION_KEYS[kind] if isinstance(kind, str) else ("kind",)
    action = _action(section.section("action", keys), files, action_timeout)
    budget = section.section("budget", ("max_restarts", "window"))
    cooldown_auto = _cooldown_auto(section)
    return Target(
        name=name,
        metrics_url=metrics_url,
        action=action,
        cooldown=(
            cooldown_auto.floor
            if cooldown_auto is not None
            else section.duration("cooldown", 600.0, zero=True)
        ),
        cooldown_auto=cooldown_auto,
        budget=Budget(
            max_restarts=budget.integer("max_restarts", 3, minimum=1),
            window=budget.duration("window", 3600.0),
        ),
        action_timeout=action_timeout,
    )


_KUBERNETES_KEYS = ("kubeconfig", "context", "lease", "events")


def _cooldown_auto(section: Section) -> CooldownAuto | None:
    """`cooldown: auto` (with optional `cooldown_auto: {floor, factor, max}`), else None."""
    auto = section.section("cooldown_auto", ("floor", "factor", "max"))
    if section.raw("cooldown") != "auto":
        if section.has("cooldown_auto"):
            raise section.error("cooldown_auto", "only goes with cooldown: auto")
        return None
    floor = auto.duration("floor", 600.0, zero=True)
    ceiling = auto.duration("max", 7200.0)
    if ceiling < floor:
        raise auto.error("max", "must not be shorter than floor")
    factor = auto.raw("factor", 3.0)
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 1 <= factor <= 100:
        raise auto.error("factor", f"expected a number from 1 to 100, got {factor!r}")
    return CooldownAuto(floor=floor, factor=float(factor), max=ceiling)


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
    "targets",
    "rules",
    "kubernetes",
)
_RULE_KEYS = (
    "name",
    "namespaces",
    "alert_labels",
    "namespace_label",
    "pod_label",
    "selector",
    "metrics_port",
    "metrics_path",
    "metrics_scheme",
    "action",
    "cooldown",
    "budget",
    "action_timeout",
)
# Names the API would refuse anyway; checked here so a typo fails at load, not at restart.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _rule(section: Section) -> PodRule:
    name = section.string("name", required=True)
    namespaces = section.string_list("namespaces", ())
    if not namespaces:
        raise section.error("namespaces", "list the namespaces this rule may restart pods in")
    for namespace in namespaces:
        if not _DNS_LABEL.fullmatch(namespace):
            raise section.error("namespaces", f"{namespace!r} is not a namespace name")
    selector = section.string_map("selector")
    if not selector:
        raise section.error(
            "selector", "give the labels a pod must carry (read from the API, not the alert)"
        )
    alert_labels: list[tuple[str, tuple[str, ...]]] = []
    raw_labels = section.raw("alert_labels", {})
    if not isinstance(raw_labels, dict):
        raise section.error("alert_labels", "expected a mapping of label to a list of values")
    for label, values in raw_labels.items():
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(v, str) for v in values)
        ):
            raise section.error(f"alert_labels.{label}", "expected a list of allowed values")
        alert_labels.append((str(label), tuple(values)))
    metrics_path = section.string("metrics_path", "/metrics")
    if not metrics_path.startswith("/"):
        raise section.error("metrics_path", "must start with /")
    action_section = section.section("action", _ACTION_KEYS["kubernetes"])
    if action_section.string("kind", "kubernetes") != "kubernetes":
        raise section.error("action.kind", "a rule's action is kind: kubernetes")
    budget = section.section("budget", ("max_restarts", "window"))
    return PodRule(
        name=name,
        namespaces=namespaces,
        selector=tuple(sorted(selector.items())),
        metrics_port=section.string("metrics_port", required=True),
        action=_kubernetes_action(action_section, fixed=False),
        metrics_path=metrics_path,
        metrics_scheme=section.choice("metrics_scheme", "http", ("http", "https")),
        alert_labels=tuple(sorted(alert_labels)),
        namespace_label=section.string("namespace_label", "namespace"),
        pod_label=section.string("pod_label", "pod"),
        cooldown=section.duration("cooldown", 600.0, zero=True),
        budget=Budget(
            max_restarts=budget.integer("max_restarts", 3, minimum=1),
            window=budget.duration("window", 3600.0),
        ),
        action_timeout=section.duration("action_timeout", 120.0),
    )


def _kubernetes(section: Section, files: _Files) -> KubernetesSettings:
    lease_settings: LeaseSettings | None = None
    if section.has("lease"):
        lease = section.section(
            "lease", ("name", "namespace", "identity", "duration", "renew_every")
        )
        identity = lease.optional_string("identity") or os.environ.get("POD_NAME", "")
        if not identity:
            raise lease.error(
                "identity", "is required (or set POD_NAME, from the downward API, as it runs)"
            )
        duration = lease.duration("duration", 15.0)
        renew_every = lease.duration("renew_every", 5.0)
        if renew_every * 2 > duration:
            raise lease.error(
                "renew_every", "must be at most half the duration (a holder renews in time)"
            )
        lease_settings = LeaseSettings(
            name=lease.string("name", required=True),
            namespace=lease.string("namespace", required=True),
            identity=identity,
            duration=duration,
            renew_every=renew_every,
        )
    return KubernetesSettings(
        kubeconfig=files.existing_file(section, "kubeconfig"),
        context=section.optional_string("context"),
        lease=lease_settings,
        events=section.boolean("events", True),
    )


def restarter_config_from_mapping(data: object, source: str, base_dir: Path) -> RestarterConfig:
    """Build and check the restarter's config; `source` names the file in every error."""
    top = Section(source, "", data, _TOP_KEYS)
    files = _Files(base_dir)
    top.listen("listen", DEFAULT_LISTEN)  # checked here; the config keeps the text as written
    insecure = top.boolean("insecure_no_auth", False)
    token = files.token(top, "token_file")
    if token is None and not insecure:
        raise top.error("token_file", "is required (or set insecure_no_auth: true)")
    cert = files.existing_file(top, "tls_cert_file")
    key = files.existing_file(top, "tls_key_file")
    if (cert is None) != (key is None):
        raise top.error("tls_cert_file", "tls_cert_file and tls_key_file go together")
    confirm = top.section("confirm", ("gap", "timeout", "idle_confirms", "hung_confirms"))
    fleet = top.section("fleet_window", ("max_targets", "window"))
    mass = top.section("mass_stall", ("max_percent", "min_stalled", "window"))
    breaker = top.section("breaker", ("on_mass_stall", "failed_actions"))
    max_percent = mass.integer("max_percent", 50, minimum=1)
    if max_percent > 100:
        raise mass.error("max_percent", "expected a percentage from 1 to 100 (100: never)")
    config = RestarterConfig(
        targets=(),
        journal=files.journal(top, "journal"),
        listen=top.string("listen", DEFAULT_LISTEN),
        token=token,
        insecure_no_auth=insecure,
        tls_cert_file=cert,
        tls_key_file=key,
        restart_alerts=top.string_list("restart_alerts", DEFAULT_RESTART_ALERTS),
        dry_run=top.boolean("dry_run", False),
        confirm=ConfirmSettings(
            gap=confirm.duration("gap", 5.0, minimum=MIN_CONFIRM_GAP_SECONDS, why=_GAP_WHY),
            timeout=confirm.duration("timeout", 3.0),
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
        source=source,
    )
    targets: list[Target] = []
    warnings: list[str] = []
    rules = tuple(_rule(section) for section in top.sections("rules", _RULE_KEYS))
    if len({rule.name for rule in rules}) != len(rules):
        raise top.error("rules", "rule names must differ")
    kubernetes = (
        _kubernetes(top.section("kubernetes", _KUBERNETES_KEYS), files)
        if top.has("kubernetes")
        else None
    )
    for index, section in enumerate(top.sections("targets", _TARGET_KEYS, required=not rules)):
        target = _target(section, files, warnings)
        if target.name in {t.name for t in targets}:
            raise ConfigError(
                source, f"targets[{index}].name", f"duplicate target name {target.name!r}"
            )
        targets.append(target)
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
