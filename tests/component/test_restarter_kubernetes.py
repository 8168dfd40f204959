"""The restarter against a protocol-level Kubernetes API (tests/support/kube_fake.py) through its
real client library: allow-rules, evict/delete/rollout restart, LeaderWorkerSet groups, PDBs,
RBAC, Events, and two replicas with one Lease."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallwatch.common.kubernetes_config import KubernetesAction, KubernetesSettings
from stallwatch.core.kube_routing import ROUTABLE
from stallwatch.restarter.kube.action import PodRestarter
from stallwatch.restarter.kube.api import ApiException, KubeApi
from stallwatch.simulator.testing import running_simulator
from tests.support.kube_fake import LWS_GROUP, LWS_NAME, LWS_WORKER, granted, make_pod
from tests.support.kube_restarter import (
    SERVER_LABELS,
    Clock,
    fake_kube,
    pod_alert,
    restarter_app,
    results,
    role_rules,
    send,
    sim_port,
    write_config,
)
from tests.support.restarter import AUTH, payload, settle


async def test_a_hung_pod_is_evicted_once(tmp_path: Path) -> None:
    """A pod whose server hangs is confirmed at its own IP and port, evicted once, with Events."""
    async with running_simulator() as sim, fake_kube() as fake:
        sim.apply_fault("freeze")
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, port=sim_port(sim)))
        config = write_config(tmp_path, fake)
        async with restarter_app(config, Clock()) as (client, restarter):
            first = await send(client, pod_alert("vllm-0"))
            await settle(restarter)
            # The evicted pod is Terminating for its grace period: the same alert is a
            # duplicate; once the kubelet has stopped it, the pod is gone.
            again = await send(client, pod_alert("vllm-0"))
            terminating = fake.terminating()
            fake.finish_terminating()
            gone = await send(client, pod_alert("vllm-0"))
            assert restarter.kube is not None
            await restarter.kube.flush_events()
            assert [(d["target"], d["decision"]) for d in first] == [("llm/vllm-0", "restart")]
            assert again[0]["reason"] == "duplicate"
            assert terminating == [("llm", "vllm-0")]
            assert gone[0]["reason"] == "pod_not_found"  # its owner makes a new one
            assert fake.evicted == [("llm", "vllm-0")]
            assert results(restarter) == [("llm/vllm-0", "success")]
            reasons = fake.event_reasons("vllm-0")
            assert reasons == [
                "StallwatchRestarting",
                "StallwatchRestartSuccess",
                "StallwatchRestartRefused",  # the duplicate, while the pod was Terminating
            ]


async def test_a_pdb_that_forbids_eviction_leaves_the_pod_and_says_so(tmp_path: Path) -> None:
    """A 429 is journaled pdb_blocked, counted, an Event; the same alert is not retried within
    the cooldown, spends no budget, and is tried again (and evicts) after it."""
    async with running_simulator() as sim, fake_kube() as fake:
        sim.apply_fault("freeze")
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, port=sim_port(sim)))
        fake.add_pdb("llm", "vllm", SERVER_LABELS, desired_healthy=1, current_healthy=1)
        clock = Clock()
        config = write_config(tmp_path, fake, extra_rule={"budget": {"max_restarts": 1}})
        async with restarter_app(config, clock) as (client, restarter):
            await send(client, pod_alert("vllm-0"))
            await settle(restarter)
            again = await send(client, pod_alert("vllm-0"))
            assert restarter.kube is not None
            await restarter.kube.flush_events()
            metrics = await (await client.get("/metrics")).text()
            assert results(restarter) == [("llm/vllm-0", "pdb_blocked")]
            assert ("llm", "vllm-0") in fake.pods
            assert again[0]["reason"] == "duplicate"
            assert fake.calls.count(("", "pods/eviction", "create")) == 1
            # Another replica is back: the budget allows one now.
            fake.pdbs[("llm", "vllm")]["status"].update(currentHealthy=2, disruptionsAllowed=1)
            clock.now += 601
            retried = await send(client, pod_alert("vllm-0"))
            await settle(restarter)
            assert [(d["decision"], d["reason"]) for d in retried] == [("restart", "confirmed")]
            assert results(restarter) == [
                ("llm/vllm-0", "pdb_blocked"),
                ("llm/vllm-0", "success"),
            ]
            assert restarter.journal.count(decision="control", reason="breaker_open") == 0
        assert fake.evicted == [("llm", "vllm-0")]
        assert (
            'stallwatch_restarter_restarts_total{result="pdb_blocked",target="llm/vllm-0"} 1.0'
            in metrics
        )
        assert "StallwatchRestartPdbBlocked" in fake.event_reasons("vllm-0")
        (blocked,) = [e for e in fake.events if e["reason"] == "StallwatchRestartPdbBlocked"]
        assert blocked["type"] == "Warning"
        assert "PodDisruptionBudget" in blocked["message"]


async def test_a_repeated_refusal_posts_one_event_per_interval(tmp_path: Path) -> None:
    """Re-sent alerts refused the same way post one Event per 10 minutes; the rest are counted."""
    async with running_simulator() as sim, fake_kube() as fake:
        sim.apply_fault("freeze")
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, port=sim_port(sim)))
        clock = Clock()
        config = write_config(tmp_path, fake)
        async with restarter_app(config, clock) as (client, restarter):
            paused = await client.post("/-/pause", params={"for": "2h"}, headers=AUTH)
            assert paused.status == 200
            for _ in range(3):
                assert (await send(client, pod_alert("vllm-0")))[0]["reason"] == "paused"
                clock.now += 60
            clock.now += 600
            assert (await send(client, pod_alert("vllm-0")))[0]["reason"] == "paused"
            assert restarter.kube is not None
            await restarter.kube.flush_events()
            metrics = await (await client.get("/metrics")).text()
        assert fake.event_reasons("vllm-0") == ["StallwatchRestartRefused"] * 2
        assert 'stallwatch_restarter_kubernetes_events_total{result="repeated"} 2.0' in metrics
        assert 'stallwatch_restarter_kubernetes_events_total{result="created"} 2.0' in metrics
        assert fake.evicted == []


async def test_a_pod_alert_held_by_a_pause_is_judged_again_on_resume(tmp_path: Path) -> None:
    """Resuming re-reads the held pod alert through its rule and evicts the hung pod once."""
    async with running_simulator() as sim, fake_kube() as fake:
        sim.apply_fault("freeze")
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, port=sim_port(sim)))
        config = write_config(tmp_path, fake)
        async with restarter_app(config, Clock()) as (client, restarter):
            assert (await client.post("/-/pause", headers=AUTH)).status == 200
            assert (await send(client, pod_alert("vllm-0")))[0]["reason"] == "paused"
            resumed = await client.post("/-/resume", headers=AUTH)
            assert (await resumed.json())["judged_again"] == 1
            await settle(restarter)
            assert results(restarter) == [("llm/vllm-0", "success")]
        assert fake.evicted == [("llm", "vllm-0")]


@pytest.mark.parametrize(
    ("namespace", "labels", "reason"),
    [
        ("llm", {"app.kubernetes.io/name": "other"}, "pod_not_allowed"),
        ("llm", {}, "pod_not_allowed"),
        ("kube-system", SERVER_LABELS, "no_rule"),
    ],
)
async def test_pods_no_rule_allows_are_left_alone(
    tmp_path: Path, namespace: str, labels: dict[str, str], reason: str
) -> None:
    """A pod outside the rule's namespaces, or without its labels in the API, is not touched."""
    async with fake_kube() as fake:
        fake.add_pod(make_pod(namespace, "vllm-0", labels=labels))
        config = write_config(tmp_path, fake)
        async with restarter_app(config, Clock()) as (client, restarter):
            (decision,) = await send(client, pod_alert("vllm-0", namespace=namespace))
            await settle(restarter)
        assert (decision["decision"], decision["reason"]) == ("skip", reason)
        assert fake.evicted == []
        assert fake.deleted == []


async def test_a_pod_without_the_named_port_is_not_confirmed_elsewhere(tmp_path: Path) -> None:
    """No container port of the rule's name: refused, with no read of any URL from the alert."""
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, port_name="grpc"))
        config = write_config(tmp_path, fake)
        async with restarter_app(config, Clock()) as (client, _):
            (decision,) = await send(client, pod_alert("vllm-0"))
        assert decision["reason"] == "no_metrics_port"


async def test_a_group_member_restarts_its_whole_group_through_the_leader(tmp_path: Path) -> None:
    """An alert about a LeaderWorkerSet worker evicts the group's leader, never the worker."""
    async with running_simulator() as sim, fake_kube() as fake:
        sim.apply_fault("freeze")
        for worker in range(3):
            name = "big-0" if worker == 0 else f"big-0-{worker}"
            labels = {**SERVER_LABELS, LWS_NAME: "big", LWS_GROUP: "0", LWS_WORKER: str(worker)}
            fake.add_pod(make_pod("llm", name, labels=labels, port=sim_port(sim)))
        other = {**SERVER_LABELS, LWS_NAME: "big", LWS_GROUP: "1", LWS_WORKER: "0"}
        fake.add_pod(make_pod("llm", "big-1", labels=other))
        config = write_config(tmp_path, fake)
        async with restarter_app(config, Clock()) as (client, restarter):
            (decision,) = await send(client, pod_alert("big-0-2"))
            await settle(restarter)
        assert (decision["target"], decision["decision"]) == ("llm/big-group-0", "restart")
        assert fake.evicted == [("llm", "big-0")]
        assert fake.terminating() == [("llm", "big-0")]
        fake.finish_terminating()  # the leader stopped: its workers go with it
        assert sorted(name for _, name in fake.pods) == ["big-1"]


async def test_rollout_restart_patches_the_deployments_template(tmp_path: Path) -> None:
    """Mode rollout_restart finds the Deployment through the ReplicaSet and merge-patches it."""
    async with running_simulator() as sim, fake_kube() as fake:
        sim.apply_fault("freeze")
        fake.add_replicaset("llm", "vllm-7d9f", "vllm")
        fake.add_workload("deployments", "llm", "vllm")
        pod = make_pod(
            "llm",
            "vllm-7d9f-x",
            labels=SERVER_LABELS,
            port=sim_port(sim),
            owner=("ReplicaSet", "vllm-7d9f"),
        )
        fake.add_pod(pod)
        config = write_config(tmp_path, fake, mode="rollout_restart")
        async with restarter_app(config, Clock()) as (client, restarter):
            await send(client, pod_alert("vllm-7d9f-x"))
            await settle(restarter)
            assert results(restarter) == [("llm/vllm-7d9f-x", "success")]
        template = fake.workloads[("deployments", "llm", "vllm")]["spec"]["template"]
        assert template["metadata"]["annotations"] == {
            "kubectl.kubernetes.io/restartedAt": "2026-11-30T00:53:20Z"
        }
        assert template["spec"]["containers"][0]["name"] == "server"  # merged, not replaced


async def test_an_action_rbac_does_not_grant_fails_with_the_apis_403(tmp_path: Path) -> None:
    """Without pods/eviction create, the eviction is refused 403 and journaled as a failure."""
    rules = [r for r in role_rules() if r["resources"] != ["pods/eviction"]]
    async with running_simulator() as sim, fake_kube(rules) as fake:
        sim.apply_fault("freeze")
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, port=sim_port(sim)))
        config = write_config(tmp_path, fake)
        async with restarter_app(config, Clock()) as (client, restarter):
            await send(client, pod_alert("vllm-0"))
            await settle(restarter)
            (entry,) = [e for e in restarter.journal.recent(10) if e.decision == "action_result"]
        assert (entry.reason, "403") == ("failure", entry.detail.split("answered ")[1][:3])
        assert fake.denied == [("", "pods/eviction", "create")]
        assert ("llm", "vllm-0") in fake.pods


async def test_a_second_replica_takes_over_and_honours_the_first_ones_cooldown(
    tmp_path: Path,
) -> None:
    """Only the Lease holder is Ready and acts; when it loses the Lease, the other takes it,
    becomes Ready, knows the alert the first one acted on as a duplicate, and refuses a new
    alert's restart the first one's cooldown forbids."""
    clock = Clock()
    async with running_simulator() as sim, fake_kube() as fake:
        sim.apply_fault("freeze")
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, port=sim_port(sim)))
        config_a = write_config(tmp_path / "a", fake, identity="restarter-a")
        config_b = write_config(tmp_path / "b", fake, identity="restarter-b")
        async with (
            restarter_app(config_a, clock) as (client_a, a),
            restarter_app(config_b, clock) as (client_b, b),
        ):
            assert (await client_a.get("/-/ready")).status == 200
            assert (await client_b.get("/-/ready")).status == 503
            body = payload(pod_alert("vllm-0"))
            refused = await client_b.post("/alerts", json=body, headers=AUTH)
            assert refused.status == 503
            await send(client_a, pod_alert("vllm-0"))
            await settle(a)
            assert fake.evicted == [("llm", "vllm-0")]
            # The StatefulSet recreates the pod under its name; the first replica stops renewing.
            fake.finish_terminating()
            fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, port=sim_port(sim)))
            assert a.kube is not None
            assert a.kube.lease is not None
            assert b.kube is not None
            assert b.kube.lease is not None
            await a.kube.lease.stop()
            clock.now += 20
            assert await b.kube.lease.step()
            assert not await a.kube.lease.step()
            assert (await client_b.get("/-/ready")).status == 200
            assert (await client_a.get("/-/ready")).status == 503
            (repeat,) = await send(client_b, pod_alert("vllm-0"))
            (decision,) = await send(client_b, pod_alert("vllm-0", fingerprint="f00d0000000000b2"))
        assert (repeat["decision"], repeat["reason"]) == ("skip", "duplicate")
        assert (decision["decision"], decision["reason"]) == ("skip", "cooldown")
        assert fake.evicted == [("llm", "vllm-0")]
        lease = fake.lease_record("stallwatch", "stallwatch-restarter")
        assert lease["spec"]["holderIdentity"] == "restarter-b"
        assert lease["spec"]["leaseTransitions"] == 1
        assert "llm/vllm-0" in lease["metadata"]["annotations"]["stallwatch.io/restarts"]


async def test_a_replica_that_lost_the_lease_does_not_act(tmp_path: Path) -> None:
    """The fence before an action: a replica whose Lease another took is refused the action."""
    clock = Clock()
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS))
        config_a = write_config(tmp_path / "a", fake, identity="restarter-a")
        config_b = write_config(tmp_path / "b", fake, identity="restarter-b")
        async with (
            restarter_app(config_a, clock) as (_, a),
            restarter_app(config_b, clock) as (_, b),
        ):
            assert a.kube is not None
            assert a.kube.lease is not None
            assert b.kube is not None
            assert b.kube.lease is not None
            await a.kube.lease.stop()
            clock.now += 20
            assert await b.kube.lease.step()
            result = await a.kube.actor.restart(
                KubernetesAction(mode="delete", namespace="llm", pod="vllm-0")
            )
        assert result[0] == "failure"
        assert "Lease" in result[1]
        assert fake.deleted == []


async def test_a_lease_written_from_a_stale_read_conflicts(tmp_path: Path) -> None:
    """Replacing a Lease at an old resourceVersion is the API's 409, as a race between replicas."""
    async with fake_kube() as fake:
        api = await KubeApi.connect(KubernetesSettings(kubeconfig=str(fake.kubeconfig(tmp_path))))
        try:
            write = {"holder": "a", "duration": 15.0, "ledger": "[]", "taking": True}
            await api.write_lease("stallwatch", "l", now=1.0, previous=None, **write)
            stale = await api.lease("stallwatch", "l")
            await api.write_lease("stallwatch", "l", now=2.0, previous=stale, **write)
            with pytest.raises(ApiException) as raised:
                await api.write_lease("stallwatch", "l", now=3.0, previous=stale, **write)
        finally:
            await api.close()
    assert raised.value.status == 409


@pytest.mark.parametrize("quarantine_mode", ["readiness_gate", "label", "off"])
async def test_the_role_grants_exactly_the_calls_the_restarter_makes(
    tmp_path: Path, quarantine_mode: str
) -> None:
    """Every kind of call (all action modes, a group, the Lease, Events, and the quarantine
    mode's: the gate condition and the Services, or the label and the owners' selectors)
    against a fake that grants the shipped Roles for that mode: nothing is denied, and every
    rule is used."""
    rules = role_rules(quarantine_mode)
    gates = [ROUTABLE] if quarantine_mode == "readiness_gate" else None
    label = {ROUTABLE: "false"} if quarantine_mode == "label" else {}
    async with fake_kube(rules) as fake:
        fake.add_pod(make_pod("llm", "a", labels=SERVER_LABELS, readiness_gates=gates))
        fake.add_pod(make_pod("llm", "b", labels=SERVER_LABELS))
        owner = ("StatefulSet", "s")
        fake.add_pod(make_pod("llm", "s-0", labels={**SERVER_LABELS, **label}, owner=owner))
        fake.add_workload("statefulsets", "llm", "s")
        fake.add_replicaset("llm", "d-1", "d")
        fake.add_workload("deployments", "llm", "d")
        fake.add_pod(make_pod("llm", "d-1-x", labels=SERVER_LABELS, owner=("ReplicaSet", "d-1")))
        lws = {LWS_NAME: "g", LWS_GROUP: "0"}
        fake.add_pod(make_pod("llm", "g-0", labels={**lws, LWS_WORKER: "0"}))
        fake.add_pod(make_pod("llm", "g-0-1", labels={**lws, LWS_WORKER: "1"}))
        config = write_config(
            tmp_path, fake, identity="restarter-a", quarantine_mode=quarantine_mode
        )
        async with restarter_app(config, Clock()) as (_, restarter):
            kube = restarter.kube
            assert kube is not None
            actor = PodRestarter(kube.api)
            for mode, pod in [
                ("evict", "a"),
                ("delete", "b"),
                ("rollout_restart", "s-0"),
                ("rollout_restart", "d-1-x"),
                ("delete", "g-0-1"),
            ]:
                action = KubernetesAction(mode=mode, namespace="llm", pod=pod)  # type: ignore[arg-type]
                assert (await actor.restart(action))[0] == "success", (mode, pod)
            await kube.api.event(("llm", "a"), "StallwatchRestart", "ok", warning=False, at=1)
            assert kube.lease is not None
            assert await kube.lease.step()  # a renewal: get and update
    assert fake.denied == []
    assert set(fake.calls) == granted(rules)


async def test_the_restarters_events_show_in_kubectl_describe_pod(tmp_path: Path) -> None:
    """The Events of a restart a PodDisruptionBudget blocked carry the pod's uid, so the
    selector `kubectl describe pod` uses lists them; a fixed target's Events too."""
    from tests.support.kube_restarter import describe_pod_events

    async with running_simulator() as sim, fake_kube() as fake:
        sim.apply_fault("freeze")
        for name in ("vllm-0", "fixed-0"):
            labels = {**SERVER_LABELS, "statefulset.kubernetes.io/pod-name": name}
            fake.add_pod(make_pod("llm", name, labels=labels, port=sim_port(sim)))
        fake.add_pdb("llm", "vllm", SERVER_LABELS, desired_healthy=2, current_healthy=2)
        fixed = {
            "name": "fixed-0",
            "url": sim.url,
            "action": {"kind": "kubernetes", "namespace": "llm", "pod": "fixed-0"},
        }
        config = write_config(tmp_path, fake, targets=[fixed])
        async with restarter_app(config, Clock()) as (client, restarter):
            await send(client, pod_alert("vllm-0"))
            fixed_alert = pod_alert("x", fingerprint="f00d0000000000c3")
            fixed_alert["labels"] = {"alertname": "LLMServerHung", "target": "fixed-0"}
            await send(client, fixed_alert)
            await settle(restarter)
            assert restarter.kube is not None
            await restarter.kube.flush_events()
        described = {
            pod: [
                event.reason
                for event in (await describe_pod_events(fake, tmp_path, "llm", pod)).items
            ]
            for pod in ("vllm-0", "fixed-0")
        }
    assert described["vllm-0"] == ["StallwatchRestarting", "StallwatchRestartPdbBlocked"]
    # The fixed target's pod was read for its uid when its Event was posted.
    assert described["fixed-0"]
    assert all(reason.startswith("StallwatchRestart") for reason in described["fixed-0"])
    assert fake.evicted == []


async def test_rules_for_one_namespace_are_chosen_by_the_pods_labels(tmp_path: Path) -> None:
    """Two rules for one namespace that differ only by selector: each pod gets the rule its
    own labels match (here: the second rule's mode, delete), not a refusal by the first."""
    sglang = {"app.kubernetes.io/name": "sglang"}
    second = {
        "name": "sglang",
        "namespaces": ["llm"],
        "selector": sglang,
        "metrics_port": "http",
        "action": {"kind": "kubernetes", "mode": "delete"},
    }
    async with running_simulator() as sim, fake_kube() as fake:
        sim.apply_fault("freeze")
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, port=sim_port(sim)))
        fake.add_pod(make_pod("llm", "sglang-0", labels=sglang, port=sim_port(sim)))
        fake.add_pod(make_pod("llm", "other-0", labels={"app.kubernetes.io/name": "tgi"}))
        config = write_config(tmp_path, fake, more_rules=[second])
        async with restarter_app(config, Clock()) as (client, restarter):
            decisions = []
            for pod, fingerprint in [
                ("vllm-0", "f00d0000000000a1"),
                ("sglang-0", "f00d0000000000d4"),
                ("other-0", "f00d0000000000e5"),
            ]:
                decisions += await send(client, pod_alert(pod, fingerprint=fingerprint))
                await settle(restarter)
            (refused,) = [e for e in restarter.journal.recent(20) if e.reason == "pod_not_allowed"]
    assert [(d["target"], d["decision"]) for d in decisions] == [
        ("llm/vllm-0", "restart"),
        ("llm/sglang-0", "restart"),
        ("llm/other-0", "skip"),
    ]
    assert "vllm: " in refused.detail
    assert "sglang: " in refused.detail
    assert fake.evicted == [("llm", "vllm-0")]
    assert fake.deleted == [("llm", "sglang-0")]
