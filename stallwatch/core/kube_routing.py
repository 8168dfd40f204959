"""A pod in or out of users' rotation on Kubernetes: what to write, and when it is safe. Pure.

Two ways, chosen by `kubernetes.quarantine_mode`. `readiness_gate`: the pod condition
`stallwatch.io/routable`, which a pod that lists it in `spec.readinessGates` needs True to be
Ready (a missing one counts False: a gate blocks by default, so every opted-in pod gets True
once its containers are ready). `label`: the label `stallwatch.io/routable=true|false`, for
routers that watch a label selector; never where the owning workload selects on it (changing
it would orphan the pod, and its ReplicaSet would start a second copy on another GPU).
A pod that has not opted in (no gate, no label) is never written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from stallwatch.core.pod_rules import PodFacts, group_of, target_name

# The condition type of the readiness gate, and the label key of label mode.
ROUTABLE = "stallwatch.io/routable"
READY = "Ready"
CONTAINERS_READY = "ContainersReady"
# A condition's reason is one CamelCase word (the API does not check it; kubectl shows it).
IN_ROTATION = "InRotation"
RoutingMode = Literal["readiness_gate", "label"]
# What `stallwatch_restarter_kubernetes_routing_total{result}` counts.
RoutingResult = Literal[
    "gate_written",  # the gate condition written on a pod
    "label_written",  # the label written on a pod
    "write_failed",  # the API refused a write
    "sync_failed",  # the API refused the sync's list
    "ready_diverged",  # Ready, read back after a write, disagrees with the gate
    "publish_not_ready_service",  # a Service keeps opted-in pods listed when not Ready (once each)
    "label_conflict",  # label mode: a workload selects on the label; its pods are left alone
]
ROUTING_RESULTS: tuple[RoutingResult, ...] = get_args(RoutingResult)


class LabelSelectorConflict(Exception):
    """Label mode cannot run: a workload selects its pods on `stallwatch.io/routable`."""


@dataclass(frozen=True)
class Routable:
    """Whether a pod should be in users' rotation, with the reason and message to show."""

    routable: bool
    reason: str
    message: str


def camel(text: str) -> str:
    """`stalled` -> `Stalled`, `test_request_passed` -> `TestRequestPassed`."""
    return "".join(part[:1].upper() + part[1:] for part in text.replace("-", "_").split("_"))


def opted_in(pod: PodFacts, mode: RoutingMode) -> bool:
    """Whether the pod asked for stallwatch's verdict: it lists the gate (readiness_gate), or
    it carries the label at all (label: the pod template sets it to "true")."""
    if mode == "readiness_gate":
        return ROUTABLE in pod.readiness_gates
    return ROUTABLE in pod.labels


def serving(pod: PodFacts) -> bool:
    """Running, not Terminating, and its containers ready: a replica routers could use,
    whatever stallwatch's own verdict on it."""
    return pod.phase == "Running" and not pod.deleting and pod.condition_true(CONTAINERS_READY)


def is_out(pod: PodFacts, mode: RoutingMode) -> bool:
    """Whether stallwatch's mark on the pod says out of rotation."""
    if mode == "label":
        return pod.labels.get(ROUTABLE) == "false"
    condition = pod.condition(ROUTABLE)
    return condition is not None and condition.status == "False"


def taken_out(pod: PodFacts) -> bool:
    """Whether the pod as read carries stallwatch's out-of-rotation mark, either way."""
    return is_out(pod, "readiness_gate") or is_out(pod, "label")


def gate_condition(pod: PodFacts, wanted: Routable, now_text: str) -> dict[str, str] | None:
    """The gate condition to merge into the pod's status (None: it already says so).

    `lastTransitionTime` only when the status changes (the API server sets none; an element
    of a strategic merge patch without it leaves the stored one as it is)."""
    status = "True" if wanted.routable else "False"
    current = pod.condition(ROUTABLE)
    if (
        current is not None
        and current.status == status
        and current.reason == wanted.reason
        and current.message == wanted.message
    ):
        return None
    element = {
        "type": ROUTABLE,
        "status": status,
        "reason": wanted.reason,
        "message": wanted.message,
    }
    if current is None or current.status != status:
        element["lastTransitionTime"] = now_text
    return element


def gate_patch(element: Mapping[str, str]) -> dict[str, Any]:
    """A strategic merge patch of `pods/status`: `status.conditions` merges by `type`, so
    only this condition changes (a JSON merge patch would replace the whole list, `Ready`
    and the kubelet's conditions with it)."""
    return {"status": {"conditions": [dict(element)]}}


def label_patch(pod: PodFacts, wanted: Routable) -> dict[str, Any] | None:
    """The metadata patch that sets the label (None: it already says so)."""
    value = "true" if wanted.routable else "false"
    if pod.labels.get(ROUTABLE) == value:
        return None
    return {"metadata": {"labels": {ROUTABLE: value}}}


def in_sync(pod: PodFacts, out: bool, mode: RoutingMode) -> Routable | None:
    """What the periodic sync writes on a pod (None: nothing; a mark that already says the
    right thing is left with its own reason). Out of rotation: kept out. In rotation: True once
    its containers are ready (readiness_gate: before that, Ready is False anyway and the
    kubelet's own checks decide)."""
    if not opted_in(pod, mode) or pod.deleting:
        return None
    if out:
        if is_out(pod, mode):
            return None
        return Routable(False, "OutOfRotation", "stallwatch keeps this pod out of rotation")
    if mode == "readiness_gate":
        if not pod.condition_true(CONTAINERS_READY) or pod.condition_true(ROUTABLE):
            return None
    elif pod.labels.get(ROUTABLE) == "true":
        return None
    return Routable(True, IN_ROTATION, "in rotation: no stall confirmed")


def ready_divergence(pod: PodFacts, routable: bool, waited: float) -> str | None:
    """Why `Ready`, read back `waited` seconds after the gate was written, disagrees with it
    (None: it agrees, or another gate or a container explains it)."""
    ready = pod.condition_true(READY)
    if not routable and ready:
        return (
            f"pod {pod.namespace}/{pod.name}: Ready is still True {waited:g} s after "
            f"{ROUTABLE} went False (the kubelet has not acted on the gate; routers that read "
            "Ready still send it requests)"
        )
    others_true = all(pod.condition_true(gate) for gate in pod.readiness_gates)
    if routable and not ready and others_true and serving(pod):
        return (
            f"pod {pod.namespace}/{pod.name}: Ready is still False {waited:g} s after "
            f"{ROUTABLE} went True, with its containers ready and every gate True"
        )
    return None


def pool_of(pod: PodFacts) -> str:
    """The replicas a pod stands in for: its LeaderWorkerSet (each group one target), else
    its controller (`namespace/ReplicaSet/name`), else itself alone."""
    group = group_of(pod.labels)
    if group is not None:
        return f"{pod.namespace}/LeaderWorkerSet/{group.set_name}"
    if pod.owner is not None:
        kind, name = pod.owner
        return f"{pod.namespace}/{kind}/{name}"
    return f"{pod.namespace}/Pod/{pod.name}"


def pool_members(pods: Iterable[PodFacts], pool: str, out: Iterable[str] = ()) -> tuple[str, ...]:
    """The targets of `pool`: its pods that serve (a pod that never alerted too), and its
    targets in `out` (out of rotation, still members), sorted."""
    names = {target_name(pod) for pod in pods if pool_of(pod) == pool and serving(pod)}
    return tuple(sorted(names | set(out)))


def selector_conflict(
    kind: str,
    name: str,
    match_labels: Mapping[str, str] | None,
    match_expressions: Sequence[Mapping[str, Any]] | None,
) -> str | None:
    """Why label mode may not flip `stallwatch.io/routable` on this workload's pods (None:
    the workload does not select on it)."""
    keys = set(match_labels or {}) | {str(e.get("key")) for e in match_expressions or ()}
    if ROUTABLE not in keys:
        return None
    return (
        f"{kind} {name} selects its pods on the label {ROUTABLE}: flipping it would orphan the "
        f"pod and the {kind} would start a second copy (on another GPU). Keep {ROUTABLE} in "
        "the Service's or the router's selector only, or use quarantine_mode readiness_gate"
    )


def selects(selector: Mapping[str, str] | None, labels: Mapping[str, str]) -> bool:
    """Whether a Service's selector selects a pod with these labels (an empty or missing
    selector selects none: its endpoints are managed by hand)."""
    return bool(selector) and all(labels.get(k) == v for k, v in (selector or {}).items())
