"""Which allow-rule lets an alert restart a pod, and what the pod read from the API says: pure.

An alert only names a pod (namespace and name). Whether it may be restarted, how, and where its
metrics are read all come from the rule and the pod object the API returns, never from the
alert's text: a rule lists the namespaces, the alert labels it accepts, and the labels the pod
itself must carry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from stallwatch.common.kubernetes_config import PodRule

# LeaderWorkerSet's pod labels (sigs.k8s.io/lws): the set, the group's index, and the pod's
# index in its group (0 is the leader).
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"

RuleRefusal = Literal["no_rule", "pod_not_found", "pod_not_allowed", "no_pod_ip", "no_metrics_port"]


@dataclass(frozen=True)
class PodName:
    """The pod an alert names, and the rule that allows alerts like it."""

    rule: PodRule
    namespace: str
    pod: str


@dataclass(frozen=True)
class PodCondition:
    """One entry of a pod's `status.conditions`, as read."""

    type: str
    status: str
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class PodFacts:
    """What the restarter needs of a pod object read from the API."""

    namespace: str
    name: str
    labels: Mapping[str, str]
    pod_ip: str | None
    # (port name, port number) of every container port that has a name.
    ports: Sequence[tuple[str, int]]
    # (kind, name) of the controller owner, if any.
    owner: tuple[str, str] | None = None
    # spec.terminationGracePeriodSeconds: SIGTERM to SIGKILL when the pod is deleted (the API
    # server sets 30 when the pod's spec leaves it out).
    termination_grace_period: int | None = None
    # metadata.uid: which object this is (a pod recreated under its name has another); Events
    # name it, as `kubectl describe pod` selects them by it.
    uid: str = ""
    # status.phase, status.conditions and spec.readinessGates' condition types; whether a
    # deletionTimestamp is set (the pod is Terminating).
    phase: str = ""
    conditions: Sequence[PodCondition] = ()
    readiness_gates: Sequence[str] = ()
    deleting: bool = False

    def condition(self, kind: str) -> PodCondition | None:
        """The pod's condition of this type (the first, if a writer appended several)."""
        return next((c for c in self.conditions if c.type == kind), None)

    def condition_true(self, kind: str) -> bool:
        found = self.condition(kind)
        return found is not None and found.status == "True"


@dataclass(frozen=True)
class Refusal:
    reason: RuleRefusal
    detail: str


@dataclass(frozen=True)
class GroupOf:
    """A LeaderWorkerSet group: its members are restarted together, through the leader."""

    set_name: str
    group_index: str

    @property
    def leader_selector(self) -> str:
        return f"{LWS_NAME}={self.set_name},{LWS_GROUP}={self.group_index},{LWS_WORKER}=0"


def rules_for_alert(
    rules: Sequence[PodRule], labels: Mapping[str, str]
) -> tuple[PodName, ...] | Refusal:
    """Every rule whose namespaces and alert labels accept these alert labels, in the
    config's order (the pod's own labels then choose among them: `rule_for_pod`)."""
    if not rules:
        return Refusal("no_rule", "no allow-rule is configured")
    seen: list[str] = []
    found: list[PodName] = []
    for rule in rules:
        namespace = labels.get(rule.namespace_label, "")
        pod = labels.get(rule.pod_label, "")
        if not namespace or not pod:
            seen.append(f"{rule.name}: no {rule.namespace_label!r} or {rule.pod_label!r} label")
            continue
        if namespace not in rule.namespaces:
            seen.append(f"{rule.name}: namespace {namespace!r} not listed")
            continue
        mismatch = next(
            (label for label, allowed in rule.alert_labels if labels.get(label) not in allowed),
            None,
        )
        if mismatch is not None:
            seen.append(f"{rule.name}: label {mismatch!r} not allowed")
            continue
        found.append(PodName(rule, namespace, pod))
    if found:
        return tuple(found)
    return Refusal("no_rule", "no allow-rule accepts this alert (" + "; ".join(seen) + ")")


def rule_for_pod(
    names: Sequence[PodName], pods: Mapping[tuple[str, str], PodFacts | None]
) -> tuple[PodName, PodFacts] | Refusal:
    """The first of the rules that accept an alert whose selector the pod, as read from the
    API, matches; so rules for one namespace that differ only by selector each apply to their
    own pods. `pods` holds each named pod as read (None: the API says it does not exist)."""
    refusals: list[str] = []
    missing: list[str] = []
    for named in names:
        pod = pods.get((named.namespace, named.pod))
        if pod is None:
            missing.append(f"{named.namespace}/{named.pod}")
            continue
        refusal = allowed_pod(named.rule, pod)
        if refusal is None:
            return named, pod
        refusals.append(f"{named.rule.name}: {refusal.detail}")
    if not refusals:
        return Refusal("pod_not_found", f"pod {', '.join(dict.fromkeys(missing))} not found")
    if len(refusals) == 1:
        return Refusal("pod_not_allowed", refusals[0].split(": ", 1)[1])
    return Refusal(
        "pod_not_allowed", "no rule's selector matches the pod (" + "; ".join(refusals) + ")"
    )


def selector_matches(selector: Sequence[tuple[str, str]], labels: Mapping[str, str]) -> bool:
    """Whether a pod's labels carry every (key, value) of an equality selector."""
    return all(labels.get(key) == value for key, value in selector)


def label_selector(selector: Sequence[tuple[str, str]]) -> str:
    """The selector as the API's labelSelector query parameter."""
    return ",".join(f"{key}={value}" for key, value in selector)


def allowed_pod(rule: PodRule, pod: PodFacts) -> Refusal | None:
    """Why the pod read from the API may not be restarted by `rule` (None: it may)."""
    if not selector_matches(rule.selector, pod.labels):
        wanted = label_selector(rule.selector)
        return Refusal(
            "pod_not_allowed",
            f"pod {pod.namespace}/{pod.name} does not carry the rule's labels ({wanted})",
        )
    return None


def metrics_url(rule: PodRule, pod: PodFacts) -> str | Refusal:
    """The URL the confirmation reads: the pod's IP and its port named in the rule."""
    if not pod.pod_ip:
        return Refusal("no_pod_ip", f"pod {pod.namespace}/{pod.name} has no IP (not running?)")
    port = next((number for name, number in pod.ports if name == rule.metrics_port), None)
    if port is None:
        return Refusal(
            "no_metrics_port",
            f"pod {pod.namespace}/{pod.name} has no container port named {rule.metrics_port!r}",
        )
    host = f"[{pod.pod_ip}]" if ":" in pod.pod_ip else pod.pod_ip
    return f"{rule.metrics_scheme}://{host}:{port}{rule.metrics_path}"


def group_of(labels: Mapping[str, str]) -> GroupOf | None:
    """The LeaderWorkerSet group a pod belongs to, from its own labels (None: not in one)."""
    name = labels.get(LWS_NAME)
    group = labels.get(LWS_GROUP)
    if not name or group is None:
        return None
    return GroupOf(name, group)


def target_name(pod: PodFacts) -> str:
    """The journal's name for what a restart of this pod restarts: the pod, or its group
    (any member's alert restarts the whole group, so cooldown and budget are the group's)."""
    group = group_of(pod.labels)
    if group is not None:
        return f"{pod.namespace}/{group.set_name}-group-{group.group_index}"
    return f"{pod.namespace}/{pod.name}"
