"""The chart's ValidatingAdmissionPolicy, its CEL evaluated with cel-python on pod updates:
the restarter's ServiceAccount may flip the stallwatch.io/routable condition through
pods/status and change nothing else (labels, annotations, other conditions, other status).

cel-python evaluates the expressions on plain maps, where the API server evaluates them on
typed Pod objects; the expressions use only has(), ==, filter and size, which mean the same on
both. This is not an API server's admission: that is not run here (docs/deploy.md)."""

from __future__ import annotations

import copy
import functools
from typing import Any

import celpy
import pytest

from tests.contract.chart import one, render, values

SERVICE_ACCOUNT = "system:serviceaccount:stallwatch:stallwatch-restarter"


@functools.cache
def policy() -> dict[str, Any]:
    return one(render(*values("quarantine-readinessgate")), "ValidatingAdmissionPolicy")


def evaluate(expression: str, activation: dict[str, Any]) -> bool | None:
    """True or False as CEL answers; None for anything else (an evaluation error, which the
    API server, with failurePolicy Fail, would refuse too)."""
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    result = program.evaluate({k: celpy.json_to_cel(v) for k, v in activation.items()})
    return bool(result) if isinstance(result, celpy.celtypes.BoolType) else None


def refusals(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The messages of the validations that fail for this update (none: admitted)."""
    spec = policy()["spec"]
    return [
        v["message"]
        for v in spec["validations"]
        if evaluate(v["expression"], {"object": new, "oldObject": old}) is not True
    ]


def pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "vllm-0",
            "namespace": "llm",
            "labels": {"app.kubernetes.io/name": "vllm"},
            "annotations": {"team": "inference"},
        },
        "spec": {"readinessGates": [{"conditionType": "stallwatch.io/routable"}]},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.7",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "stallwatch.io/routable", "status": "True"},
            ],
        },
    }


def condition(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    (found,) = [c for c in doc["status"]["conditions"] if c["type"] == kind]
    return found


def test_it_matches_only_the_restarters_service_account() -> None:
    """The match condition is true for the restarter's ServiceAccount and false for anyone
    else (a kubelet, another controller)."""
    (match,) = policy()["spec"]["matchConditions"]
    for user, matched in [(SERVICE_ACCOUNT, True), ("system:node:n1", False)]:
        assert evaluate(match["expression"], {"request": {"userInfo": {"username": user}}}) is (
            matched
        )


def test_flipping_the_routable_condition_is_admitted() -> None:
    """Setting stallwatch.io/routable False (quarantine) or True again passes every check."""
    old = pod()
    new = copy.deepcopy(old)
    condition(new, "stallwatch.io/routable")["status"] = "False"
    condition(new, "stallwatch.io/routable")["lastTransitionTime"] = "2026-12-03T09:00:00Z"
    assert refusals(old, new) == []
    assert refusals(new, old) == []


def test_adding_the_routable_condition_is_admitted() -> None:
    """A pod without the condition yet may get it."""
    old = pod()
    old["status"]["conditions"] = [c for c in old["status"]["conditions"] if c["type"] == "Ready"]
    assert refusals(old, pod()) == []


def label_changed(doc: dict[str, Any]) -> None:
    doc["metadata"]["labels"]["stallwatch.io/routable"] = "false"


def labels_dropped(doc: dict[str, Any]) -> None:
    del doc["metadata"]["labels"]


def annotation_changed(doc: dict[str, Any]) -> None:
    doc["metadata"]["annotations"]["team"] = "someone-else"


def ready_changed(doc: dict[str, Any]) -> None:
    condition(doc, "Ready")["status"] = "False"


def condition_added(doc: dict[str, Any]) -> None:
    doc["status"]["conditions"].append({"type": "example.com/other", "status": "True"})


def routable_twice(doc: dict[str, Any]) -> None:
    doc["status"]["conditions"].append({"type": "stallwatch.io/routable", "status": "False"})


def phase_changed(doc: dict[str, Any]) -> None:
    doc["status"]["phase"] = "Failed"


def pod_ip_changed(doc: dict[str, Any]) -> None:
    doc["status"]["podIP"] = "10.0.0.8"


def message_added(doc: dict[str, Any]) -> None:
    doc["status"]["message"] = "quarantined"


@pytest.mark.parametrize(
    "change",
    [
        label_changed,
        labels_dropped,
        annotation_changed,
        ready_changed,
        condition_added,
        routable_twice,
        phase_changed,
        pod_ip_changed,
        message_added,
    ],
)
def test_any_other_change_is_refused(change: Any) -> None:
    """A change to labels, annotations, another condition or another status field, even beside
    a flip of the routable condition, fails at least one check."""
    old = pod()
    new = copy.deepcopy(old)
    condition(new, "stallwatch.io/routable")["status"] = "False"
    change(new)
    assert refusals(old, new), f"{change.__name__} was admitted"
