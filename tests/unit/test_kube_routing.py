"""The pure decisions of taking a pod out of rotation on Kubernetes (core/kube_routing.py): the
condition or label to write, what the sync writes, the owner's selector, Ready read back, and
the pool of a pod."""

from __future__ import annotations

from typing import Any

import pytest

from stallwatch.core.kube_routing import (
    ROUTABLE,
    Routable,
    camel,
    gate_condition,
    gate_patch,
    in_sync,
    is_out,
    label_patch,
    opted_in,
    pool_members,
    pool_of,
    ready_divergence,
    selector_conflict,
    selects,
    taken_out,
)
from stallwatch.core.pod_rules import LWS_GROUP, LWS_NAME, LWS_WORKER, PodCondition, PodFacts

NOW = "2026-12-03T10:00:00Z"
OUT = Routable(False, "Stalled", "stall confirmed")
IN = Routable(True, "InRotation", "in rotation: no stall confirmed")


def pod(
    name: str = "vllm-0",
    *,
    gate: str | None = None,
    containers: bool = True,
    ready: bool | None = None,
    gated: bool = True,
    labels: dict[str, str] | None = None,
    owner: tuple[str, str] | None = ("ReplicaSet", "vllm-abc"),
    phase: str = "Running",
    deleting: bool = False,
    reason: str = "",
    message: str = "",
) -> PodFacts:
    conditions = [
        PodCondition("ContainersReady", "True" if containers else "False"),
        PodCondition("Ready", "True" if (containers if ready is None else ready) else "False"),
    ]
    if gate is not None:
        conditions.append(PodCondition(ROUTABLE, gate, reason, message))
    return PodFacts(
        namespace="llm",
        name=name,
        labels=labels or {},
        pod_ip="10.0.0.1",
        ports=(),
        owner=owner,
        phase=phase,
        conditions=tuple(conditions),
        readiness_gates=(ROUTABLE,) if gated else (),
        deleting=deleting,
    )


@pytest.mark.parametrize(
    ("current", "wanted", "expected"),
    [
        # no condition yet: written, with a transition time
        (None, IN, {"status": "True", "reason": "InRotation", "lastTransitionTime": NOW}),
        # True -> False: a transition
        (("True", "InRotation", ""), OUT, {"status": "False", "lastTransitionTime": NOW}),
        # False -> False with another message: no transition time (the stored one stays)
        (("False", "Stalled", "older"), OUT, {"status": "False", "message": "stall confirmed"}),
        # already exactly so: nothing
        (("False", "Stalled", "stall confirmed"), OUT, None),
    ],
)
def test_the_gate_condition_to_write(
    current: tuple[str, str, str] | None, wanted: Routable, expected: dict[str, str] | None
) -> None:
    """The element carries type, status, reason and message, and lastTransitionTime only
    when the status changes; nothing when the pod already says it."""
    facts = (
        pod() if current is None else pod(gate=current[0], reason=current[1], message=current[2])
    )
    element = gate_condition(facts, wanted, NOW)
    if expected is None:
        assert element is None
        return
    assert element is not None
    assert element["type"] == ROUTABLE
    assert {k: element[k] for k in expected} == expected
    assert ("lastTransitionTime" in element) == ("lastTransitionTime" in expected)


def test_the_patch_names_only_the_gate_condition() -> None:
    """The strategic merge patch holds one condition, the gate's: never Ready."""
    element = gate_condition(pod(), OUT, NOW)
    assert element is not None
    patch = gate_patch(element)
    assert list(patch) == ["status"]
    assert [c["type"] for c in patch["status"]["conditions"]] == [ROUTABLE]


@pytest.mark.parametrize(
    ("facts", "out", "mode", "expected"),
    [
        (pod(gated=False), False, "readiness_gate", None),  # not opted in: never written
        (pod(containers=False), False, "readiness_gate", None),  # containers not ready yet
        (pod(), False, "readiness_gate", True),  # opted in, ready, no condition: True
        (pod(gate="True"), False, "readiness_gate", None),  # already True
        (pod(gate="False", reason="Stalled"), False, "readiness_gate", True),  # stale False
        (pod(gate="True"), True, "readiness_gate", False),  # out: kept out
        (pod(gate="False", reason="Hung"), True, "readiness_gate", None),  # out already
        (pod(containers=False), True, "readiness_gate", False),  # out, even not ready
        (pod(deleting=True), False, "readiness_gate", None),  # Terminating: left alone
        (pod(labels={ROUTABLE: "false"}), False, "label", True),
        (pod(labels={ROUTABLE: "true"}), True, "label", False),
        (pod(labels={ROUTABLE: "true"}), False, "label", None),
        (pod(labels={}), True, "label", None),  # no label: not opted in
    ],
)
def test_what_the_sync_writes(facts: PodFacts, out: bool, mode: Any, expected: bool | None) -> None:
    """The sync writes True on an opted-in pod in rotation once its containers are ready,
    keeps a pod that is out of rotation out, and leaves a right mark and others' pods alone."""
    wanted = in_sync(facts, out, mode)
    assert (None if wanted is None else wanted.routable) == expected


def test_opting_in_and_the_marks() -> None:
    """Opted in: the gate listed (gate mode) or the label present (label mode); stallwatch's
    mark reads out from a False gate or a "false" label."""
    assert opted_in(pod(), "readiness_gate")
    assert not opted_in(pod(gated=False), "readiness_gate")
    assert opted_in(pod(labels={ROUTABLE: "true"}), "label")
    assert not opted_in(pod(), "label")
    assert is_out(pod(gate="False"), "readiness_gate")
    assert not is_out(pod(), "readiness_gate")
    assert taken_out(pod(labels={ROUTABLE: "false"}, gated=False))
    assert not taken_out(pod(gate="True", labels={ROUTABLE: "true"}))


def test_the_label_patch() -> None:
    """Label mode writes the label's new value, and nothing when it already has it."""
    assert label_patch(pod(labels={ROUTABLE: "true"}), OUT) == {
        "metadata": {"labels": {ROUTABLE: "false"}}
    }
    assert label_patch(pod(labels={ROUTABLE: "false"}), OUT) is None


@pytest.mark.parametrize(
    ("labels", "expressions", "conflict"),
    [
        ({"app": "vllm"}, None, False),
        ({"app": "vllm", ROUTABLE: "true"}, None, True),
        (None, [{"key": ROUTABLE, "operator": "Exists"}], True),
        (None, [{"key": "tier", "operator": "In", "values": ["a"]}], False),
    ],
)
def test_a_workload_selecting_on_the_label_conflicts(
    labels: dict[str, str] | None, expressions: list[dict[str, Any]] | None, conflict: bool
) -> None:
    """A selector naming stallwatch.io/routable, by matchLabels or by an expression, forbids
    label mode on its pods, and the reason names the workload and the risk."""
    why = selector_conflict("ReplicaSet", "llm/vllm-abc", labels, expressions)
    assert (why is not None) == conflict
    if why is not None:
        assert "ReplicaSet llm/vllm-abc selects its pods on the label" in why
        assert "orphan" in why


@pytest.mark.parametrize(
    ("facts", "routable", "diverged"),
    [
        (pod(gate="False", ready=True), False, True),  # the kubelet did not act on the gate
        (pod(gate="False", ready=False), False, False),
        (pod(gate="True", ready=True), True, False),
        (pod(gate="True", ready=False), True, True),  # containers ready, gates True, Ready False
        (pod(gate="True", containers=False, ready=False), True, False),  # containers explain it
    ],
)
def test_ready_read_back_against_the_gate(facts: PodFacts, routable: bool, diverged: bool) -> None:
    """A divergence is Ready True under a False gate, or Ready False with containers ready and
    every gate True; a pod whose containers are not ready does not diverge."""
    why = ready_divergence(facts, routable, 2.0)
    assert (why is not None) == diverged
    if why is not None:
        assert "llm/vllm-0" in why


def test_the_pool_of_a_pod_and_its_members() -> None:
    """A pod's pool is its controller (or its LeaderWorkerSet, or itself); the members are
    the serving pods of that pool, and the targets out of rotation stay members."""
    a = pod("a")
    b = pod("b")
    pending = pod("c", phase="Pending", containers=False)
    other = pod("x", owner=("ReplicaSet", "other"))
    lws = {LWS_NAME: "big", LWS_GROUP: "1", LWS_WORKER: "0"}
    leader = pod("big-1", labels=lws, owner=("StatefulSet", "big"))
    bare = pod("bare", owner=None)
    assert pool_of(a) == "llm/ReplicaSet/vllm-abc"
    assert pool_of(leader) == "llm/LeaderWorkerSet/big"
    assert pool_of(bare) == "llm/Pod/bare"
    pods = [a, b, pending, other, leader]
    assert pool_members(pods, "llm/ReplicaSet/vllm-abc") == ("llm/a", "llm/b")
    assert pool_members(pods, "llm/ReplicaSet/vllm-abc", ["llm/c"]) == ("llm/a", "llm/b", "llm/c")
    assert pool_members(pods, "llm/LeaderWorkerSet/big") == ("llm/big-group-1",)


def test_service_selection_and_reasons() -> None:
    """An empty Service selector selects no pod; reasons are CamelCase words."""
    assert selects({"app": "vllm"}, {"app": "vllm", "x": "y"})
    assert not selects({}, {"app": "vllm"})
    assert not selects({"app": "vllm"}, {"app": "other"})
    assert camel("test_request_passed") == "TestRequestPassed"
    assert camel("stalled") == "Stalled"
