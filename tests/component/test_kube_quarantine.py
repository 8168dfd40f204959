"""Out of rotation on Kubernetes, through the real client against the fake API server
(tests/support/kube_fake.py, which patches pods as a real kube-apiserver 1.32 was measured to):
the readiness gate condition `stallwatch.io/routable`, the label mode, the pool of a workload,
and the restart of a pod the restarter itself took out of rotation."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from stallwatch.common.kubernetes_config import KubernetesAction
from stallwatch.common.restarter_config import Target
from stallwatch.core.alert_plan import RoutingChange
from stallwatch.core.alerts import Alert
from stallwatch.core.kube_routing import ROUTABLE, LabelSelectorConflict
from stallwatch.core.quarantine import quarantine_refusal, quarantined
from stallwatch.restarter.kube.side import KubeSide
from stallwatch.simulator.testing import running_simulator
from tests.support.kube_fake import (
    ADMIN_TOKEN,
    LWS_GROUP,
    LWS_NAME,
    LWS_WORKER,
    FakeKube,
    make_pod,
)
from tests.support.kube_restarter import (
    SERVER_LABELS,
    Clock,
    fake_kube,
    pod_alert,
    restarter_app,
    role_rules,
    send,
    sim_port,
    write_config,
)

GATE = [ROUTABLE]
STAMP = "2026-11-30T00:53:20Z"  # Clock's start, as a metav1.Time


@contextlib.asynccontextmanager
async def kube_side(
    fake: FakeKube,
    directory: Path,
    *,
    mode: str = "readiness_gate",
    clock: Clock | None = None,
    counts: list[str] | None = None,
) -> AsyncIterator[KubeSide]:
    """A started KubeSide in `mode`; its sync runs once at start, then only when a test asks."""
    config = write_config(directory, fake, quarantine_mode=mode)
    side = await KubeSide.connect(
        config,
        clock=clock or Clock(),
        own_restarts=lambda since: (),
        on_routing_count=None if counts is None else counts.append,
    )
    if side.routing is not None:
        side.routing.readback_delay = 0.0
        side.routing.sync_interval = 3600.0
    try:
        await side.start()
        yield side
    finally:
        await side.stop()


def pod_target(pod: str, namespace: str = "llm", pool: str = "default") -> Target:
    return Target(
        name=f"{namespace}/{pod}",
        metrics_url="http://127.0.0.1:9/metrics",
        action=KubernetesAction(namespace=namespace, pod=pod),
        pool=pool,
    )


def change(move: str, pod: str, reason: str, detail: str, out_for: float = 0.0) -> RoutingChange:
    return RoutingChange(move, f"llm/{pod}", reason, detail, out_for)  # type: ignore[arg-type]


def status_of(fake: FakeKube, pod: str, kind: str) -> str | None:
    found = fake.condition("llm", pod, kind)
    return found[0]["status"] if found else None


async def quarantine(side: KubeSide, pod: str, detail: str = "stall confirmed") -> None:
    await side.on_routing(change("quarantined", pod, "stalled", detail), pod_target(pod))
    assert side.routing is not None
    await side.routing.settled()


async def release(side: KubeSide, pod: str, out_for: float = 42.0) -> None:
    await side.on_routing(change("released", pod, "progress", "moved", out_for), pod_target(pod))
    assert side.routing is not None
    await side.routing.settled()


async def wait_for_gate(fake: FakeKube, pod: str, status: str) -> None:
    """Until the pod's gate condition has this status (the routing hook runs as a task)."""
    deadline = time.monotonic() + 30
    while status_of(fake, pod, ROUTABLE) != status:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{pod}: {ROUTABLE} never became {status}")
        await asyncio.sleep(0.05)


# --- readiness gate ------------------------------------------------------------------------------
async def test_opted_in_pods_get_the_gate_true_once_their_containers_are_ready(
    tmp_path: Path,
) -> None:
    """At start the sync writes True (with a lastTransitionTime) on an opted-in pod whose
    containers are ready, so it turns Ready; nothing on one whose containers are not ready yet,
    and nothing ever on a pod without the gate."""
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "gated", labels=SERVER_LABELS, readiness_gates=GATE))
        fake.add_pod(
            make_pod("llm", "starting", labels=SERVER_LABELS, ready=False, readiness_gates=GATE)
        )
        fake.add_pod(make_pod("llm", "plain", labels=SERVER_LABELS))
        assert status_of(fake, "gated", "Ready") == "False"  # the missing gate blocks it
        async with kube_side(fake, tmp_path):
            (gate,) = fake.condition("llm", "gated", ROUTABLE)
            ready = status_of(fake, "gated", "Ready")
            starting = fake.condition("llm", "starting", ROUTABLE)
            written = {(ns, pod) for ns, pod, *_ in fake.pod_patches}
    assert gate == {
        "type": ROUTABLE,
        "status": "True",
        "reason": "InRotation",
        "message": "in rotation: no stall confirmed",
        "lastTransitionTime": STAMP,
    }
    assert ready == "True"
    assert starting == []
    assert written == {("llm", "gated")}


async def test_quarantine_writes_false_with_why_and_release_writes_true(tmp_path: Path) -> None:
    """Quarantined: the gate False with the reason and the stall's detail, the pod not Ready,
    and a sync meanwhile keeps it out; released: True again, and Ready."""
    clock = Clock()
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, readiness_gates=GATE))
        async with kube_side(fake, tmp_path, clock=clock) as side:
            clock.now += 60
            await quarantine(side, "vllm-0", "stall confirmed (no token for 2 polls)")
            (out,) = fake.condition("llm", "vllm-0", ROUTABLE)
            ready_out = status_of(fake, "vllm-0", "Ready")
            assert side.routing is not None
            assert await side.routing.sync() == 0  # kept out, nothing to write
            clock.now += 60
            await release(side, "vllm-0")
            (back,) = fake.condition("llm", "vllm-0", ROUTABLE)
            ready_back = status_of(fake, "vllm-0", "Ready")
    assert out == {
        "type": ROUTABLE,
        "status": "False",
        "reason": "Stalled",
        "message": "stall confirmed (no token for 2 polls)",
        "lastTransitionTime": "2026-11-30T00:54:20Z",
    }
    assert ready_out == "False"
    assert back["status"] == "True"
    assert back["message"] == "back in rotation (progress) after 42 s"
    assert back["lastTransitionTime"] == "2026-11-30T00:55:20Z"
    assert ready_back == "True"


async def test_only_the_gate_condition_is_written_by_strategic_merge(tmp_path: Path) -> None:
    """Every write is a strategic merge patch of pods/status naming only the gate condition:
    Ready and the kubelet's conditions are never in a body, and all four stay on the pod."""
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, readiness_gates=GATE))
        async with kube_side(fake, tmp_path) as side:
            await quarantine(side, "vllm-0")
            await release(side, "vllm-0")
        kinds = [c["type"] for c in fake.pods[("llm", "vllm-0")]["status"]["conditions"]]
    assert len(fake.pod_patches) == 3  # True at start, False, True
    for _, _, sub, content_type, body in fake.pod_patches:
        assert (sub, content_type) == ("status", "application/strategic-merge-patch+json")
        assert set(body) == {"status"}
        assert [c["type"] for c in body["status"]["conditions"]] == [ROUTABLE]
    assert kinds == ["PodScheduled", "Initialized", "ContainersReady", "Ready", ROUTABLE]


async def test_the_restarters_own_verdict_keeps_a_pod_out(tmp_path: Path) -> None:
    """A target the restarter's verdict says is out (a quarantine read back from its journal,
    with no routing change this run) is written False by the sync; its neighbour True."""
    async with fake_kube() as fake:
        for name in ("vllm-0", "vllm-1"):
            fake.add_pod(make_pod("llm", name, labels=SERVER_LABELS, readiness_gates=GATE))
        async with kube_side(fake, tmp_path) as side:
            side.routable = lambda name: name != "llm/vllm-0"
            assert side.routing is not None
            await side.routing.sync()
            (gate,) = fake.condition("llm", "vllm-0", ROUTABLE)
    assert (gate["status"], gate["reason"]) == ("False", "OutOfRotation")
    assert status_of(fake, "vllm-1", ROUTABLE) == "True"


async def test_a_leaderworkerset_group_leaves_rotation_whole(tmp_path: Path) -> None:
    """A group target's quarantine writes the gate False on every pod of the group (leader and
    workers), and on no pod of another group; a sync keeps them all out."""
    async with fake_kube() as fake:
        for group, worker in [("0", "0"), ("0", "1"), ("1", "0")]:
            labels = {**SERVER_LABELS, LWS_NAME: "big", LWS_GROUP: group, LWS_WORKER: worker}
            name = f"big-{group}" if worker == "0" else f"big-{group}-{worker}"
            fake.add_pod(make_pod("llm", name, labels=labels, readiness_gates=GATE))
        async with kube_side(fake, tmp_path) as side:
            target = replace(pod_target("big-0"), name="llm/big-group-0")
            out = RoutingChange("quarantined", target.name, "stalled", "stall confirmed")
            await side.on_routing(out, target)
            assert side.routing is not None
            assert await side.routing.sync() == 0
    assert status_of(fake, "big-0", ROUTABLE) == "False"
    assert status_of(fake, "big-0-1", ROUTABLE) == "False"
    assert status_of(fake, "big-1", ROUTABLE) == "True"


async def test_last_transition_time_moves_only_when_the_status_changes(tmp_path: Path) -> None:
    """A second False with another message keeps the first False's lastTransitionTime (the
    server sets none, so the writer must keep it right)."""
    clock = Clock()
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, readiness_gates=GATE))
        async with kube_side(fake, tmp_path, clock=clock) as side:
            clock.now += 10
            await quarantine(side, "vllm-0", "first")
            clock.now += 10
            await side.on_routing(
                change("restarting", "vllm-0", "restarting", "restarted"), pod_target("vllm-0")
            )
            (gate,) = fake.condition("llm", "vllm-0", ROUTABLE)
    assert (gate["reason"], gate["message"]) == ("Restarting", "restarted")
    assert gate["lastTransitionTime"] == "2026-11-30T00:53:30Z"


async def test_a_ready_that_does_not_follow_the_gate_is_reported(tmp_path: Path) -> None:
    """With a wedged kubelet, Ready stays True after the gate went False: the read-back logs
    it and counts `ready_diverged`; with a working kubelet nothing is counted."""
    counts: list[str] = []
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "a", labels=SERVER_LABELS, readiness_gates=GATE))
        fake.add_pod(make_pod("llm", "b", labels=SERVER_LABELS, readiness_gates=GATE))
        async with kube_side(fake, tmp_path, counts=counts) as side:
            await quarantine(side, "a")
            assert "ready_diverged" not in counts
            fake.kubelet = False
            await quarantine(side, "b")
            assert side.routing is not None
            divergences = side.routing.divergences
    assert counts.count("ready_diverged") == 1
    assert divergences == 1


async def test_a_new_opted_in_pod_is_ready_only_once_the_restarter_runs(tmp_path: Path) -> None:
    """A gate blocks by default: with the restarter down, a new opted-in pod stays NotReady
    (no condition); the restarter's start makes it Ready; one created while it runs gets True
    from the watch, with no sync asked for."""
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, readiness_gates=GATE))
        down = (status_of(fake, "vllm-0", "Ready"), fake.condition("llm", "vllm-0", ROUTABLE))
        async with kube_side(fake, tmp_path):
            first = status_of(fake, "vllm-0", "Ready")
            fake.add_pod(make_pod("llm", "vllm-1", labels=SERVER_LABELS, readiness_gates=GATE))
            await wait_for_gate(fake, "vllm-1", "True")
            later = status_of(fake, "vllm-1", "Ready")
    assert down == ("False", [])
    assert first == "True"
    assert later == "True"


async def test_only_the_acting_replica_writes(tmp_path: Path) -> None:
    """A replica that does not hold the Lease lists pods but writes no gate."""
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, readiness_gates=GATE))
        async with kube_side(fake, tmp_path) as side:
            assert side.routing is not None
            side.routing.acting = lambda: False
            fake.pod_patches.clear()
            fake.pods[("llm", "vllm-0")]["status"]["conditions"].pop()  # the gate, gone
            assert await side.routing.sync() == 0
    assert fake.pod_patches == []


async def test_a_service_publishing_not_ready_pods_is_warned_about_once(tmp_path: Path) -> None:
    """A Service with publishNotReadyAddresses that selects an opted-in pod is counted once
    across syncs; one without it, or selecting no opted-in pod, is not."""
    counts: list[str] = []
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, readiness_gates=GATE))
        fake.add_service("llm", "vllm-peers", SERVER_LABELS, publish_not_ready=True)
        fake.add_service("llm", "vllm", SERVER_LABELS)
        fake.add_service("llm", "other", {"app": "other"}, publish_not_ready=True)
        async with kube_side(fake, tmp_path, counts=counts) as side:
            assert side.routing is not None
            await side.routing.sync()
    assert counts.count("publish_not_ready_service") == 1


async def test_an_api_out_of_reach_is_logged_and_counted_not_raised(tmp_path: Path) -> None:
    """The sync against an API that no longer answers counts `sync_failed` and goes on; a
    routing change then writes nothing and raises nothing."""
    counts: list[str] = []
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, readiness_gates=GATE))
        async with kube_side(fake, tmp_path, counts=counts) as side:
            await fake.close()
            assert side.routing is not None
            await side.routing.sync_or_log()
            await quarantine(side, "vllm-0")
    assert counts == ["gate_written", "sync_failed"]


async def test_label_mode_refuses_to_start_when_it_cannot_read_the_owners(tmp_path: Path) -> None:
    """Without the label Role (no statefulsets get), the owner's selector cannot be checked:
    the restarter refuses to start, naming the API's answer."""
    async with fake_kube(role_rules("readiness_gate")) as fake:
        fake.add_workload("statefulsets", "llm", "vllm")
        labels = {**SERVER_LABELS, ROUTABLE: "true"}
        fake.add_pod(make_pod("llm", "vllm-0", labels=labels, owner=("StatefulSet", "vllm")))
        with pytest.raises(LabelSelectorConflict, match="the API answered 403"):
            async with kube_side(fake, tmp_path, mode="label"):
                pass


async def test_the_running_restarter_takes_a_hung_pod_out_and_puts_it_back(
    tmp_path: Path,
) -> None:
    """End to end through the running restarter: a hung pod of a ReplicaSet of three is
    confirmed inside its restart window and its gate goes False (Ready with it); once its
    server answers again and passes a test request, the gate goes True; it is never evicted."""
    async with running_simulator() as sim, fake_kube() as fake:
        sim.apply_fault("freeze")
        owner = ("ReplicaSet", "vllm-abc")
        for index in range(3):
            port = sim_port(sim) if index == 0 else 8000
            fake.add_pod(
                make_pod(
                    "llm",
                    f"vllm-{index}",
                    labels=SERVER_LABELS,
                    owner=owner,
                    port=port,
                    readiness_gates=GATE,
                )
            )
        config = write_config(
            tmp_path,
            fake,
            extra_rule={"restart_after": "1h"},
            top={"quarantine": {"check_interval": "500ms", "expire_after": "1h"}},
        )
        async with restarter_app(config, Clock()) as (client, restarter):
            assert status_of(fake, "vllm-0", "Ready") == "True"  # written True at start
            decisions = await send(client, pod_alert("vllm-0"))
            await wait_for_gate(fake, "vllm-0", "False")
            (out,) = fake.condition("llm", "vllm-0", ROUTABLE)
            ready_out = status_of(fake, "vllm-0", "Ready")
            sim.apply_fault("recover")
            await wait_for_gate(fake, "vllm-0", "True")
            ready_back = status_of(fake, "vllm-0", "Ready")
            assert restarter.kube is not None
            assert restarter.kube.routing is not None
            await restarter.kube.routing.settled()
    assert [(d["target"], d["reason"]) for d in decisions] == [("llm/vllm-0", "restart_window")]
    assert out["reason"] == "Hung"
    assert (ready_out, ready_back) == ("False", "True")
    assert fake.evicted == []
    assert status_of(fake, "vllm-1", ROUTABLE) == "True"


# --- the API server's patch semantics (measured on kube-apiserver 1.32) ----------------------
async def admin_patch(
    fake: FakeKube, pod: str, content_type: str, body: Any, sub: str = "/status"
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": content_type}
    path = f"{fake.url}/api/v1/namespaces/llm/pods/{pod}{sub}"
    if content_type == "application/apply-patch+yaml":
        path += "?fieldManager=stallwatch&force=true"
    async with (
        aiohttp.ClientSession() as session,
        session.patch(path, data=json.dumps(body), headers=headers) as response,
    ):
        answer: dict[str, Any] = await response.json()
        return response.status, answer


GATE_FALSE = {"type": ROUTABLE, "status": "False", "reason": "Stalled", "message": "m"}


@pytest.mark.parametrize(
    ("content_type", "body", "types"),
    [
        (
            "application/strategic-merge-patch+json",
            {"status": {"conditions": [GATE_FALSE]}},
            ["PodScheduled", "Initialized", "ContainersReady", "Ready", ROUTABLE],
        ),
        ("application/merge-patch+json", {"status": {"conditions": [GATE_FALSE]}}, [ROUTABLE]),
        (
            "application/json-patch+json",
            [{"op": "add", "path": "/status/conditions/-", "value": GATE_FALSE}] * 2,
            ["PodScheduled", "Initialized", "ContainersReady", "Ready", ROUTABLE, ROUTABLE],
        ),
        (
            "application/apply-patch+yaml",
            {"apiVersion": "v1", "kind": "Pod", "status": {"conditions": [GATE_FALSE]}},
            ["PodScheduled", "Initialized", "ContainersReady", "Ready", ROUTABLE],
        ),
    ],
)
async def test_pod_status_patches_behave_as_the_measured_api_server(
    content_type: str, body: Any, types: list[str]
) -> None:
    """Strategic merge and apply merge conditions by type; a JSON merge patch replaces the whole
    list (Ready gone: why the restarter never sends one); a JSON patch add appends a second
    condition of the same type; the server adds no lastTransitionTime (no kubelet here)."""
    async with fake_kube() as fake:
        fake.kubelet = False
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, readiness_gates=GATE))
        code, answer = await admin_patch(fake, "vllm-0", content_type, body)
    assert code == 200
    conditions = answer["status"]["conditions"]
    assert [c["type"] for c in conditions] == types
    assert all("lastTransitionTime" not in c for c in conditions if c["type"] == ROUTABLE)


async def test_pod_status_takes_any_condition_and_labels_but_drops_spec() -> None:
    """Through pods/status the server stores any condition type and status ("Maybe"), changes
    labels and annotations, and drops a spec change."""
    odd = {"type": "not-a-gate", "status": "Maybe"}
    body = {
        "metadata": {"labels": {"x": "y"}, "annotations": {"a": "b"}},
        "spec": {"terminationGracePeriodSeconds": 1},
        "status": {"conditions": [odd]},
    }
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS))
        code, answer = await admin_patch(
            fake, "vllm-0", "application/strategic-merge-patch+json", body
        )
    assert code == 200
    assert odd in answer["status"]["conditions"]
    assert answer["metadata"]["labels"] == {**SERVER_LABELS, "x": "y"}
    assert answer["metadata"]["annotations"] == {"a": "b"}
    assert answer["spec"]["terminationGracePeriodSeconds"] == 30


async def test_the_gate_role_may_patch_status_but_not_the_pod(tmp_path: Path) -> None:
    """The readiness-gate Role grants no patch of pods: a label write under it is the API's
    403, and the label stays."""
    async with fake_kube(role_rules("readiness_gate")) as fake:
        fake.add_pod(make_pod("llm", "vllm-0", labels={**SERVER_LABELS, ROUTABLE: "true"}))
        async with kube_side(fake, tmp_path, mode="label") as side:
            await quarantine(side, "vllm-0")
            labels = fake.pods[("llm", "vllm-0")]["metadata"]["labels"]
    assert ("", "pods", "patch") in fake.denied
    assert labels[ROUTABLE] == "true"


# --- label mode ----------------------------------------------------------------------------------
async def test_label_mode_flips_the_label_of_opted_in_pods_only(tmp_path: Path) -> None:
    """Label mode: quarantine sets stallwatch.io/routable=false, release true, by a patch of the
    pod's metadata; a pod without the label is never written; the status is not touched."""
    labelled = {**SERVER_LABELS, ROUTABLE: "true"}
    async with fake_kube(role_rules("label")) as fake:
        fake.add_replicaset("llm", "vllm-abc", "vllm")
        owner = ("ReplicaSet", "vllm-abc")
        fake.add_pod(make_pod("llm", "vllm-0", labels=labelled, owner=owner))
        fake.add_pod(make_pod("llm", "vllm-1", labels=SERVER_LABELS, owner=owner))
        async with kube_side(fake, tmp_path, mode="label") as side:
            await quarantine(side, "vllm-0")
            out = fake.pods[("llm", "vllm-0")]["metadata"]["labels"][ROUTABLE]
            await quarantine(side, "vllm-1")
            await release(side, "vllm-0")
            back = fake.pods[("llm", "vllm-0")]["metadata"]["labels"][ROUTABLE]
    assert (out, back) == ("false", "true")
    assert ROUTABLE not in fake.pods[("llm", "vllm-1")]["metadata"]["labels"]
    assert {(pod, sub) for _, pod, sub, *_ in fake.pod_patches} == {("vllm-0", "")}
    assert fake.denied == []


@pytest.mark.parametrize(
    ("resource", "selector"),
    [
        ("replicasets", {"matchLabels": {"app": "vllm", ROUTABLE: "true"}}),
        (
            "statefulsets",
            {"matchExpressions": [{"key": ROUTABLE, "operator": "In", "values": ["true"]}]},
        ),
    ],
)
async def test_label_mode_refuses_to_start_when_a_workload_selects_on_the_label(
    tmp_path: Path, resource: str, selector: dict[str, Any]
) -> None:
    """A ReplicaSet (matchLabels) or StatefulSet (matchExpressions) selecting on the label:
    flipping it would orphan the pod, so the restarter refuses to start, naming the workload;
    no pod is written."""
    async with fake_kube(role_rules("label")) as fake:
        if resource == "replicasets":
            fake.add_replicaset("llm", "vllm-abc", "vllm", selector=selector)
            owner = ("ReplicaSet", "vllm-abc")
        else:
            fake.add_workload("statefulsets", "llm", "vllm", selector=selector)
            owner = ("StatefulSet", "vllm")
        labels = {**SERVER_LABELS, ROUTABLE: "true"}
        fake.add_pod(make_pod("llm", "vllm-0", labels=labels, owner=owner))
        with pytest.raises(LabelSelectorConflict) as raised:
            async with kube_side(fake, tmp_path, mode="label"):
                pass
    assert f"{owner[0]} llm/{owner[1]} selects its pods on the label {ROUTABLE}" in str(
        raised.value
    )
    assert fake.pod_patches == []


# --- the pool ------------------------------------------------------------------------------------
def alert_for(pod: str) -> Alert:
    labels = {"alertname": "LLMServerHung", "namespace": "llm", "pod": pod}
    return Alert("firing", labels, "f00d", "2026-11-30T00:00:00Z")


async def test_the_pool_is_the_serving_pods_of_one_replicaset(tmp_path: Path) -> None:
    """An alert's pod target has its ReplicaSet as pool; the members are that ReplicaSet's
    serving pods (those that never alerted too; not another ReplicaSet's, not a Terminating
    one); with three members the guard lets one go out and refuses the second (50 %), and a
    single-replica ReplicaSet's pod is the last in its pool."""
    async with fake_kube() as fake:
        for index in range(3):
            owner = ("ReplicaSet", "vllm-abc")
            fake.add_pod(make_pod("llm", f"vllm-{index}", labels=SERVER_LABELS, owner=owner))
        fake.add_pod(make_pod("llm", "leaving", labels=SERVER_LABELS, owner=owner))
        fake.pods[("llm", "leaving")]["metadata"]["deletionTimestamp"] = STAMP
        fake.add_pod(make_pod("llm", "solo", labels=SERVER_LABELS, owner=("ReplicaSet", "s")))
        async with kube_side(fake, tmp_path, mode="off") as side:
            _, target = await side.resolve(alert_for("vllm-0"))
            _, solo = await side.resolve(alert_for("solo"))
            assert isinstance(target, Target)
            assert isinstance(solo, Target)
            members = side.pool_members(target)
            solo_members = side.pool_members(solo)
    assert target.pool == "llm/ReplicaSet/vllm-abc"
    assert members == ("llm/vllm-0", "llm/vllm-1", "llm/vllm-2")
    out = {"llm/vllm-1": quarantined("llm/vllm-1", target.pool, "stalled", "", None, 0.0)}
    assert quarantine_refusal("llm/vllm-0", members, {}, 50) is None
    refused = quarantine_refusal("llm/vllm-0", members, out, 50)
    assert refused is not None
    assert refused[0] == "pool_share"
    assert solo_members == ("llm/solo",)
    last = quarantine_refusal("llm/solo", solo_members, {}, 50)
    assert last is not None
    assert last[0] == "last_in_pool"


async def test_a_fixed_targets_pool_is_the_configured_one(tmp_path: Path) -> None:
    """A fixed target (not resolved by a rule) keeps its configured pool: its members are the
    configured targets that name the same pool."""
    async with fake_kube() as fake, kube_side(fake, tmp_path, mode="off") as side:
        first = pod_target("vllm-0", pool="big")
        targets = (first, pod_target("vllm-1", pool="big"), pod_target("other", pool="small"))
        side.effective(replace(side.config, targets=targets))
        assert side.pool_members(first) == ("llm/vllm-0", "llm/vllm-1")


# --- restarting a pod out of rotation ------------------------------------------------------------
@pytest.mark.parametrize(
    ("policy", "taken_out", "result", "words"),
    [
        (None, True, "success", "deleted pod llm/vllm-0 after the PodDisruptionBudget refused"),
        ("AlwaysAllow", True, "success", "evicted pod llm/vllm-0"),
        (None, False, "pdb_blocked", "a PodDisruptionBudget allows no disruption"),
    ],
)
async def test_a_pod_out_of_rotation_is_deleted_when_its_budget_refuses_the_eviction(
    tmp_path: Path, policy: str | None, taken_out: bool, result: str, words: str
) -> None:
    """A single replica stallwatch took out of rotation is not Ready, so its budget (default
    IfHealthyBudget) answers 429: the restarter deletes it and says why; under AlwaysAllow it
    is evicted; a not-Ready pod stallwatch did not take out stays pdb_blocked."""
    async with fake_kube() as fake:
        if taken_out:
            fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, readiness_gates=GATE))
        else:  # not Ready for a reason of its own (its containers)
            fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, ready=False))
        fake.add_pdb(
            "llm",
            "vllm",
            SERVER_LABELS,
            desired_healthy=1,
            current_healthy=0,
            unhealthy_pod_eviction_policy=policy,
        )
        async with kube_side(fake, tmp_path) as side:
            if taken_out:
                await quarantine(side, "vllm-0")
            assert status_of(fake, "vllm-0", "Ready") == "False"
            got, detail = await side.actor.restart(
                KubernetesAction(mode="evict", namespace="llm", pod="vllm-0")
            )
    assert got == result
    assert words in detail
    if taken_out and policy is None:
        assert "needs 1 healthy pods and has 0 currently" in detail
        assert fake.deleted == [("llm", "vllm-0")]
        assert fake.evicted == []


@pytest.mark.parametrize(
    ("ready", "policy", "evict", "code"),
    [
        # §2.5 of the measurements: a Running pod whose Ready is False, by budget policy
        ([False], "IfHealthyBudget", 0, 429),
        ([False], None, 0, 429),
        ([False], "AlwaysAllow", 0, 201),
        ([True, False], "IfHealthyBudget", 1, 201),
        ([True, False], "IfHealthyBudget", 0, 429),
        ([True], "AlwaysAllow", 0, 429),
    ],
)
async def test_evictions_answer_as_measured_by_budget_policy(
    ready: list[bool], policy: str | None, evict: int, code: int
) -> None:
    """Evictions under a budget of minAvailable 1, as kube-apiserver 1.32 answered them: a
    not-Ready pod of an application with no healthy budget left is refused (429) unless the
    budget says AlwaysAllow; with one healthy pod to spare it goes; a Ready pod at the minimum
    is refused under either policy."""
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction"}
    async with fake_kube() as fake:
        for index, is_ready in enumerate(ready):
            fake.add_pod(make_pod("llm", f"vllm-{index}", labels=SERVER_LABELS, ready=is_ready))
        fake.add_pdb(
            "llm",
            "vllm",
            SERVER_LABELS,
            desired_healthy=1,
            current_healthy=sum(ready),
            unhealthy_pod_eviction_policy=policy,
        )
        name = f"vllm-{evict}"
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        body = {**eviction, "metadata": {"name": name, "namespace": "llm"}}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{fake.url}/api/v1/namespaces/llm/pods/{name}/eviction", json=body, headers=headers
            ) as response,
        ):
            answer = await response.json()
    assert response.status == code, answer
    if code == 429 and not ready[evict]:
        assert answer["details"]["causes"][0]["message"] == (
            f"The disruption budget vllm needs 1 healthy pods and has {sum(ready)} currently"
        )
