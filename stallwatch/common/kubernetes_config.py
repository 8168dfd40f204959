"""The restarter's Kubernetes configuration: pod actions, allow-rules, and how to reach the API.

A fixed target's `kubernetes` action names its pod; a rule (`rules:`) lets alerts restart the
pods it allows, read from the API. `kubernetes:` says how the API is reached and which Lease
makes one of several replicas the one that acts.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Literal

from stallwatch.common.config import Section, quoted
from stallwatch.common.restart_limits import (
    BUDGET_KEYS,
    DEFAULT_RESTART_AFTER,
    Budget,
    budget_from,
    restart_after_from,
)
from stallwatch.common.restarter_files import RestarterFiles

KubernetesMode = Literal["evict", "delete", "rollout_restart"]
# How a pod leaves users' rotation while it is quarantined: its readiness gate condition
# `stallwatch.io/routable` (pods that list the gate), the label `stallwatch.io/routable`
# (routers that watch a label selector), or not at all on the Kubernetes side.
QuarantineMode = Literal["readiness_gate", "label", "off"]
QUARANTINE_MODES: tuple[QuarantineMode, ...] = ("readiness_gate", "label", "off")
KUBERNETES_MODES: tuple[KubernetesMode, ...] = ("evict", "delete", "rollout_restart")
KUBERNETES_ACTION_KEYS = ("kind", "mode", "namespace", "pod", "grace_period")
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
    "restart_after",
)
_KUBERNETES_KEYS = ("kubeconfig", "context", "lease", "events", "quarantine_mode")
# Names the API would refuse anyway; checked here so a typo fails at load, not at restart.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


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
    # gracePeriodSeconds sent with the eviction or delete: the kubelet's SIGTERM to SIGKILL.
    # None: the pod's own terminationGracePeriodSeconds.
    grace_period: int | None = None
    kind: Literal["kubernetes"] = "kubernetes"


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
    restart_after: float = DEFAULT_RESTART_AFTER


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
    quarantine_mode: QuarantineMode = "readiness_gate"


def kubernetes_action_from(section: Section, *, fixed: bool) -> KubernetesAction:
    """A kubernetes action; a fixed target names its pod, a rule's pods come from the API."""
    mode = section.choice("mode", "evict", KUBERNETES_MODES)
    grace = _grace_period(section, mode)
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


def _grace_period(section: Section, mode: str) -> int | None:
    """The kill bound sent with an eviction or delete: whole seconds, at least 1 (0 would be a
    forced deletion: the pod object goes at once, while its containers may still run)."""
    if not section.has("grace_period"):
        return None
    if mode == "rollout_restart":
        raise section.error(
            "grace_period",
            "applies to mode evict or delete; a rollout restart stops each old pod after its "
            "own terminationGracePeriodSeconds",
        )
    raw = section.raw("grace_period")
    if isinstance(raw, int) and not isinstance(raw, bool) and raw == 0:
        raise section.error(
            "grace_period",
            "0 would force the deletion (the pod object goes at once while its containers may "
            "still run, beside their replacement): give 1 or more seconds",
        )
    return section.integer("grace_period", 1, minimum=1)


def pod_rules_from(
    top: Section, restart_after: float = DEFAULT_RESTART_AFTER
) -> tuple[PodRule, ...]:
    """The config's `rules:`, each checked field by field; their names must differ.
    `restart_after`: the window of a rule that sets none."""
    rules = tuple(_rule(section, restart_after) for section in top.sections("rules", _RULE_KEYS))
    if len({rule.name for rule in rules}) != len(rules):
        raise top.error("rules", "rule names must differ")
    return rules


def _rule(section: Section, restart_after: float) -> PodRule:
    name = section.string("name", required=True)
    namespaces = section.string_list("namespaces", ())
    if not namespaces:
        raise section.error("namespaces", "list the namespaces this rule may restart pods in")
    for namespace in namespaces:
        if not _DNS_LABEL.fullmatch(namespace):
            raise section.error("namespaces", f"{quoted(namespace)} is not a namespace name")
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
    action_section = section.section("action", KUBERNETES_ACTION_KEYS)
    if action_section.string("kind", "kubernetes") != "kubernetes":
        raise section.error("action.kind", "a rule's action is kind: kubernetes")
    budget = section.section("budget", BUDGET_KEYS)
    return PodRule(
        name=name,
        namespaces=namespaces,
        selector=tuple(sorted(selector.items())),
        metrics_port=section.string("metrics_port", required=True),
        action=kubernetes_action_from(action_section, fixed=False),
        metrics_path=metrics_path,
        metrics_scheme=section.choice("metrics_scheme", "http", ("http", "https")),
        alert_labels=tuple(sorted(alert_labels)),
        namespace_label=section.string("namespace_label", "namespace"),
        pod_label=section.string("pod_label", "pod"),
        cooldown=section.duration("cooldown", 600.0, zero=True),
        budget=budget_from(budget),
        action_timeout=section.duration("action_timeout", 120.0),
        restart_after=restart_after_from(section, restart_after),
    )


def kubernetes_settings_from(top: Section, files: RestarterFiles) -> KubernetesSettings | None:
    """The config's `kubernetes:` section (None if not given): how to reach the API."""
    if not top.has("kubernetes"):
        return None
    return _kubernetes(top.section("kubernetes", _KUBERNETES_KEYS), files)


def _kubernetes(section: Section, files: RestarterFiles) -> KubernetesSettings:
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
        quarantine_mode=section.choice(  # type: ignore[arg-type]
            "quarantine_mode", "readiness_gate", QUARANTINE_MODES
        ),
    )
