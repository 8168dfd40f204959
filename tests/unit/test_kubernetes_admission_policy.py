"""The optional ValidatingAdmissionPolicies of deploy/kubernetes/restarter, their CEL evaluated on
old and new pods as the API server hands them over: the restarter's ServiceAccount may write its
own condition (gate mode) or its own label (label mode), and nothing else of the pod."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from stallwatch.core.kube_routing import ROUTABLE

POLICIES = (
    Path(__file__).resolve().parents[2]
    / "deploy"
    / "kubernetes"
    / "restarter"
    / "validating-admission-policy.yaml"
)
RESTARTER = "system:serviceaccount:stallwatch:stallwatch-restarter"


def policy(name: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(POLICIES.read_text()) if d]
    (found,) = [
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == name
    ]
    return found


def evaluate(expression: str, activation: dict[str, Any]) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(expression)).evaluate(activation)


def refusals(name: str, old: dict[str, Any], new: dict[str, Any], user: str = RESTARTER) -> Any:
    """The messages of the validations the update fails (None: the policy does not apply)."""
    spec = policy(name)["spec"]
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel({"userInfo": {"username": user}}),
    }
    if not all(evaluate(c["expression"], activation) for c in spec["matchConditions"]):
        return None
    variables = {v["name"]: evaluate(v["expression"], activation) for v in spec["variables"]}
    activation["variables"] = celpy.celtypes.MapType(
        {celpy.celtypes.StringType(key): value for key, value in variables.items()}
    )
    return [v["message"] for v in spec["validations"] if not evaluate(v["expression"], activation)]


def pod(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "vllm-0", "labels": {"app": "vllm", ROUTABLE: "true"}},
        "spec": {"readinessGates": [{"conditionType": ROUTABLE}]},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.7",
            "conditions": [
                {"type": "ContainersReady", "status": "True"},
                {"type": "Ready", "status": "True"},
                {"type": ROUTABLE, "status": "True", "reason": "InRotation"},
            ],
        },
    }
    for path, value in changes.items():
        node = base
        *parents, last = path.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return base


def with_gate(status: str, *, extra: list[dict[str, str]] | None = None) -> dict[str, Any]:
    new = pod()
    conditions = new["status"]["conditions"]
    conditions[2] = {"type": ROUTABLE, "status": status, "reason": "Stalled", "message": "m"}
    conditions += extra or []
    return new


GATE = "stallwatch-restarter-own-condition"
LABEL = "stallwatch-restarter-own-label"


@pytest.mark.parametrize(
    ("new", "refused"),
    [
        (with_gate("False"), []),
        (with_gate("True"), []),
        (with_gate("Maybe"), ["one stallwatch.io/routable condition, True or False"]),
        (
            with_gate("False", extra=[{"type": ROUTABLE, "status": "False"}]),
            ["one stallwatch.io/routable condition, True or False"],
        ),
    ],
)
def test_the_gate_policy_lets_the_restarter_write_its_condition(
    new: dict[str, Any], refused: list[str]
) -> None:
    """Its own condition, True or False, once: allowed; another status value or a second
    condition of the type: refused."""
    assert refusals(GATE, pod(), new) == refused


def test_the_gate_policy_refuses_anything_else_through_pods_status() -> None:
    """Ready, a label, an annotation, the phase: each refused with its own message; the same
    update by another user is not the policy's business."""
    ready_false = pod()
    ready_false["status"]["conditions"][1]["status"] = "False"
    labelled = pod(metadata__labels={"app": "other", ROUTABLE: "true"})
    annotated = pod(metadata__annotations={"x": "y"})
    phased = pod(status__phase="Failed")
    assert refusals(GATE, pod(), ready_false) == [
        "the restarter may write only the stallwatch.io/routable condition (never Ready)"
    ]
    label_message = "the restarter may not change a pod's labels or annotations through pods/status"
    assert refusals(GATE, pod(), labelled) == [label_message]
    assert refusals(GATE, pod(), annotated) == [label_message]
    assert refusals(GATE, pod(), phased) == [
        "the restarter may not change the pod's phase, container statuses or IP"
    ]
    assert refusals(GATE, pod(), ready_false, user="system:node:node-1") is None


@pytest.mark.parametrize(
    ("labels", "annotations", "refused"),
    [
        ({"app": "vllm", ROUTABLE: "false"}, None, []),
        ({"app": "vllm", ROUTABLE: "maybe"}, None, ['stallwatch.io/routable is "true" or "false"']),
        ({"app": "other", ROUTABLE: "false"}, None, ["the restarter may change only the label "
                                                      "stallwatch.io/routable"]),
        ({ROUTABLE: "false"}, None, ["the restarter may change only the label "
                                     "stallwatch.io/routable"]),
        ({"app": "vllm", ROUTABLE: "true"}, {"x": "y"}, ["the restarter may not change a pod's "
                                                          "annotations"]),
    ],
)  # fmt: skip
def test_the_label_policy_lets_the_restarter_flip_its_label_only(
    labels: dict[str, str], annotations: dict[str, str] | None, refused: list[str]
) -> None:
    """Label mode: the label flipped to "false": allowed; another value, another label changed
    or removed, an annotation: refused."""
    new = copy.deepcopy(pod(metadata__labels=labels))
    if annotations is not None:
        new["metadata"]["annotations"] = annotations
    assert refusals(LABEL, pod(), new) == refused
