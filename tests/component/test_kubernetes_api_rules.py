"""The restarter's Kubernetes calls against a fake that refuses what kube-apiserver v1.32
refuses (tests/support/kube_fake.py): time formats, evictions under PodDisruptionBudgets, Lease and
Event validation, and Events listed the way `kubectl describe pod` lists them."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from stallwatch.common.kubernetes_config import KubernetesAction, KubernetesSettings
from stallwatch.restarter.kube.action import PodRestarter
from stallwatch.restarter.kube.api import KubeApi
from tests.support.kube_fake import ADMIN_TOKEN, FakeKube, make_pod
from tests.support.kube_restarter import (
    SERVER_LABELS,
    describe_pod_events,
    fake_kube,
)

# 2026-11-30T00:53:20Z: a whole second, which isoformat() writes without a fraction.
WHOLE_SECOND = 1_796_000_000.0
MICRO_ERROR = (
    '{kind} in version "v1" cannot be handled as a {kind}: parsing time "{value}" as '
    '"2006-01-02T15:04:05.000000Z07:00": cannot parse "{elem}" as "{layout_elem}"'
)


@contextlib.asynccontextmanager
async def kube_api(fake: FakeKube, directory: Path) -> AsyncIterator[KubeApi]:
    api = await KubeApi.connect(KubernetesSettings(kubeconfig=str(fake.kubeconfig(directory))))
    try:
        yield api
    finally:
        await api.close()


async def raw(
    fake: FakeKube, method: str, path: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    """One request as a cluster admin, with the JSON body as given (no client library)."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, fake.url + path, json=body, headers=headers) as response,
    ):
        answer: dict[str, Any] = await response.json()
        return response.status, answer


def lease_body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "l", "namespace": "stallwatch"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, **spec},
    }


def event_body(**fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": "vllm-0.", "namespace": "llm"},
        "involvedObject": {"kind": "Pod", "namespace": "llm", "name": "vllm-0"},
        "reason": "StallwatchRestarting",
        "message": "m",
        "type": "Normal",
        **fields,
    }


# --- times ----------------------------------------------------------------------------------------
async def test_a_lease_written_at_a_whole_second_is_accepted_with_six_digits(
    tmp_path: Path,
) -> None:
    """The Lease's acquireTime and renewTime are MicroTime with six digits, at a whole second
    too (isoformat() drops them there, and the API refuses that with 400)."""
    async with fake_kube() as fake, kube_api(fake, tmp_path) as api:
        for now, taking in [(WHOLE_SECOND, True), (WHOLE_SECOND + 5, False)]:
            read = await api.lease("stallwatch", "l")
            await api.write_lease(
                "stallwatch",
                "l",
                holder="a",
                duration=15.0,
                now=now,
                ledger="[]",
                previous=read,
                taking=taking,
            )
        read = await api.lease("stallwatch", "l")
        spec = fake.lease_record("stallwatch", "l")["spec"]
    assert spec["acquireTime"] == "2026-11-30T00:53:20.000000Z"
    assert spec["renewTime"] == "2026-11-30T00:53:25.000000Z"
    assert read is not None
    assert read.acquired_at == WHOLE_SECOND


async def test_an_event_at_a_whole_second_has_the_apis_formats(tmp_path: Path) -> None:
    """An Event's eventTime is MicroTime and its first/lastTimestamp Time, each in the API's
    format; the Event is accepted."""
    async with fake_kube() as fake, kube_api(fake, tmp_path) as api:
        await api.event(
            ("llm", "vllm-0"), "StallwatchRestart", "ok", warning=False, at=WHOLE_SECOND
        )
    (event,) = fake.events
    assert event["eventTime"] == "2026-11-30T00:53:20.000000Z"
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-11-30T00:53:20Z"


@pytest.mark.parametrize(
    ("kind", "path", "field", "value", "elem", "layout_elem"),
    [
        ("Lease", "/apis/coordination.k8s.io/v1/namespaces/stallwatch/leases", "renewTime",
         "2026-12-01T18:33:08+00:00", "+00:00", ".000000"),
        ("Lease", "/apis/coordination.k8s.io/v1/namespaces/stallwatch/leases", "acquireTime",
         "2026-12-01T18:33:08Z", "Z", ".000000"),
        ("Lease", "/apis/coordination.k8s.io/v1/namespaces/stallwatch/leases", "renewTime",
         "2026-12-01T18:33:08.123Z", ".123Z", ".000000"),
        ("Event", "/api/v1/namespaces/llm/events", "eventTime",
         "2026-12-01T18:33:08+00:00", "+00:00", ".000000"),
        ("Event", "/api/v1/namespaces/llm/events", "eventTime",
         "2026-12-01T18:33:08.123456789Z", "789Z", "Z07:00"),
    ],
)  # fmt: skip
async def test_a_microtime_in_another_format_is_refused_with_the_apis_message(
    kind: str, path: str, field: str, value: str, elem: str, layout_elem: str
) -> None:
    """A MicroTime without exactly six fraction digits is a 400 with kube-apiserver's words."""
    if kind == "Lease":
        body = lease_body(**{field: value})
    else:
        body = event_body(**{field: value, "action": "Restart"})
    async with fake_kube() as fake:
        code, answer = await raw(fake, "POST", path, body)
    assert (code, answer["reason"]) == (400, "BadRequest")
    assert answer["message"] == MICRO_ERROR.format(
        kind=kind, value=value, elem=elem, layout_elem=layout_elem
    )
    assert fake.events == []
    assert fake.leases == {}


@pytest.mark.parametrize(
    ("value", "accepted", "message"),
    [
        ("2026-12-01T18:33:08Z", True, ""),
        ("2026-12-01T18:33:08.5+01:00", True, ""),  # Go reads a fraction the layout lacks
        ("2026-12-01T18:33:08", False, 'cannot parse "" as "Z07:00"'),
        ("2026-12-01 18:33:08Z", False, 'cannot parse " 18:33:08Z" as "T"'),
    ],
)
async def test_a_time_field_takes_rfc3339(value: str, accepted: bool, message: str) -> None:
    """firstTimestamp is a Time: RFC 3339, any fraction; no zone or no T is a 400."""
    async with fake_kube() as fake:
        code, answer = await raw(
            fake, "POST", "/api/v1/namespaces/llm/events", event_body(firstTimestamp=value)
        )
    assert (code == 201) is accepted, answer
    if not accepted:
        assert answer["message"] == (
            f'Event in version "v1" cannot be handled as a Event: parsing time "{value}" as '
            f'"2006-01-02T15:04:05Z07:00": {message}'
        )


# --- Events ---------------------------------------------------------------------------------------
async def test_event_validation_with_an_event_time(tmp_path: Path) -> None:
    """With an eventTime the API requires an action and caps the message at 1024 bytes: the
    restarter's Events pass, cut at a character boundary; a bare one is refused 422."""
    async with fake_kube() as fake:
        async with kube_api(fake, tmp_path) as api:
            await api.event(("llm", "vllm-0"), "R", "é" * 2000, warning=True, at=WHOLE_SECOND)
        bare = event_body(eventTime="2026-12-01T18:33:08.000000Z", reportingComponent="x")
        code, answer = await raw(fake, "POST", "/api/v1/namespaces/llm/events", bare)
    (event,) = fake.events
    assert len(event["message"].encode()) == 1024
    assert event["action"]
    assert (code, answer["reason"]) == (422, "Invalid")
    assert answer["message"].startswith('Event "vllm-0.')
    assert answer["message"].endswith(
        "is invalid: [reportingInstance: Required value, action: Required value]"
    )


async def test_an_unknown_event_field_selector_is_refused() -> None:
    """Events are selected only by the fields the API knows (400 otherwise)."""
    async with fake_kube() as fake:
        code, answer = await raw(
            fake, "GET", "/api/v1/namespaces/llm/events?fieldSelector=involvedObject.uuid%3Dx"
        )
    assert (code, answer["message"]) == (400, "field label not supported: involvedObject.uuid")


async def test_kubectl_describe_finds_only_the_pods_own_events(tmp_path: Path) -> None:
    """Describe's selector names the uid: an Event with the pod's uid is listed, one without
    a uid or with an earlier pod's of the same name is not."""
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS))
        uid = fake.pods[("llm", "vllm-0")]["metadata"]["uid"]
        async with kube_api(fake, tmp_path) as api:
            await api.event(("llm", "vllm-0"), "Mine", "m", warning=False, at=1.0, uid=uid)
            await api.event(("llm", "vllm-0"), "NoUid", "m", warning=False, at=1.0)
            await api.event(("llm", "vllm-0"), "Older", "m", warning=False, at=1.0, uid="0-1")
        listed = await describe_pod_events(fake, tmp_path, "llm", "vllm-0")
    assert [event.reason for event in listed.items] == ["Mine"]


# --- evictions ------------------------------------------------------------------------------------
async def evict(fake: FakeKube, directory: Path, pod: str) -> tuple[str, str]:
    async with kube_api(fake, directory) as api:
        return await PodRestarter(api).restart(
            KubernetesAction(mode="evict", namespace="llm", pod=pod)
        )


async def test_a_successful_eviction_answers_a_status(tmp_path: Path) -> None:
    """The API answers an eviction with a Status (Success, 201), not the Eviction sent; the
    restarter reads it as evicted."""
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "vllm-0", "namespace": "llm"},
    }
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS))
        fake.add_pod(make_pod("llm", "vllm-1", labels=SERVER_LABELS))
        code, answer = await raw(
            fake, "POST", "/api/v1/namespaces/llm/pods/vllm-0/eviction", eviction
        )
        result = await evict(fake, tmp_path, "vllm-1")
    assert code == 201
    assert answer == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }
    assert result[0] == "success"


@pytest.mark.parametrize(
    ("pod", "evicted"),
    [
        # Pending: canIgnorePDB, deleted without looking at the budget.
        ({"phase": "Pending", "ready": False}, True),
        # Running but not Ready while the budget is met: not counted healthy, evicted.
        ({"ready": False}, True),
        # Ready: counted healthy, so the budget that allows no disruption protects it.
        ({}, False),
    ],
)
async def test_a_pdb_protects_only_pods_it_counts_healthy(
    tmp_path: Path, pod: dict[str, Any], evicted: bool
) -> None:
    """A budget at its minimum blocks a Ready pod's eviction (pdb_blocked, with the API's
    cause) and lets a Pending or unready pod go."""
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, **pod))
        fake.add_pdb("llm", "vllm", SERVER_LABELS, desired_healthy=2, current_healthy=2)
        result, detail = await evict(fake, tmp_path, "vllm-0")
    assert (fake.evicted == [("llm", "vllm-0")]) is evicted
    if evicted:
        assert result == "success"
    else:
        assert result == "pdb_blocked"
        assert "The disruption budget vllm needs 2 healthy pods and has 2 currently" in detail


async def test_an_unready_pod_of_a_disrupted_application_is_protected(tmp_path: Path) -> None:
    """Unready with fewer healthy pods than desired (IfHealthyBudget): 429; AlwaysAllow: evicted."""
    async with fake_kube() as fake:
        for name in ("vllm-0", "vllm-1"):
            labels = {**SERVER_LABELS, "pod": name}
            fake.add_pod(make_pod("llm", name, labels=labels, ready=False))
        fake.add_pdb("llm", "a", {"pod": "vllm-0"}, desired_healthy=2, current_healthy=1)
        fake.add_pdb(
            "llm",
            "b",
            {"pod": "vllm-1"},
            desired_healthy=2,
            current_healthy=1,
            unhealthy_pod_eviction_policy="AlwaysAllow",
        )
        first = await evict(fake, tmp_path, "vllm-0")
        second = await evict(fake, tmp_path, "vllm-1")
    assert (first[0], second[0]) == ("pdb_blocked", "success")
    assert fake.evicted == [("llm", "vllm-1")]


async def test_a_pdb_not_yet_computed_answers_429(tmp_path: Path) -> None:
    """Until the disruption controller has observed the budget's generation the API answers
    429 "still being processed", even with disruptions allowed."""
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS))
        fake.add_pdb(
            "llm",
            "vllm",
            SERVER_LABELS,
            desired_healthy=1,
            current_healthy=3,
            generation=2,
            observed_generation=1,
        )
        result, detail = await evict(fake, tmp_path, "vllm-0")
    assert result == "pdb_blocked"
    assert "The disruption budget vllm is still being processed by the server." in detail
    assert fake.evicted == []


async def test_an_eviction_spends_the_budget(tmp_path: Path) -> None:
    """One disruption allowed: the first eviction takes it (the API decrements the status),
    the next is 429 until the controller recomputes."""
    async with fake_kube() as fake:
        for name in ("vllm-0", "vllm-1"):
            fake.add_pod(make_pod("llm", name, labels=SERVER_LABELS))
        fake.add_pdb("llm", "vllm", SERVER_LABELS, desired_healthy=1, current_healthy=2)
        first = await evict(fake, tmp_path, "vllm-0")
        second = await evict(fake, tmp_path, "vllm-1")
        pdb_status = fake.pdbs[("llm", "vllm")]["status"]
    assert (first[0], second[0]) == ("success", "pdb_blocked")
    assert pdb_status["disruptionsAllowed"] == 0
    assert list(pdb_status["disruptedPods"]) == ["vllm-0"]


async def test_a_pod_under_two_pdbs_is_not_evicted(tmp_path: Path) -> None:
    """Two budgets selecting one pod: the API answers 500 and evicts nothing; a failure."""
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS))
        fake.add_pdb("llm", "a", SERVER_LABELS, desired_healthy=1, current_healthy=3)
        fake.add_pdb("llm", "b", SERVER_LABELS, desired_healthy=1, current_healthy=3)
        result, detail = await evict(fake, tmp_path, "vllm-0")
    assert result == "failure"
    assert "more than one PodDisruptionBudget" in detail
    assert fake.evicted == []


@pytest.mark.parametrize(
    ("pod", "mode", "grace", "stays"),
    [
        ({}, "evict", None, 30),  # the pod's terminationGracePeriodSeconds
        ({}, "delete", 5, 5),  # the action's grace_period
        ({"node": None, "phase": "Pending", "ready": False}, "evict", None, 0),  # unscheduled
        ({"phase": "Failed", "ready": False}, "delete", None, 0),  # already ended
    ],
)
async def test_a_deleted_pod_stays_terminating_for_its_grace_period(
    tmp_path: Path, pod: dict[str, Any], mode: str, grace: int | None, stays: int
) -> None:
    """An evicted or deleted pod stays, with a deletionTimestamp, for its grace period (at
    once only when unscheduled or ended); evicting it again ignores the budget."""
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, **pod))
        fake.add_pdb("llm", "vllm", SERVER_LABELS, desired_healthy=1, current_healthy=2)
        async with kube_api(fake, tmp_path) as api:
            action = KubernetesAction(mode=mode, namespace="llm", pod="vllm-0", grace_period=grace)  # type: ignore[arg-type]
            first = await PodRestarter(api).restart(action)
            stored = fake.pods.get(("llm", "vllm-0"))
            again = await evict(fake, tmp_path, "vllm-0")
        allowed = fake.pdbs[("llm", "vllm")]["status"]["disruptionsAllowed"]
    assert first[0] == "success"
    if stays:
        assert stored is not None
        assert stored["metadata"]["deletionGracePeriodSeconds"] == stays
        assert again[0] == "success"  # a Terminating pod is deleted, not budgeted
        assert allowed == (0 if mode == "evict" else 1)
    else:
        assert stored is None
        assert again[0] == "failure"  # no such pod any more
        assert "no longer exists" in again[1]


# --- Leases ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"spec": {"leaseDurationSeconds": 0}},
            'Lease.coordination.k8s.io "l" is invalid: spec.leaseDurationSeconds: '
            "Invalid value: 0: must be greater than 0",
        ),
        (
            {"metadata": {"resourceVersion": None}},
            'leases.coordination.k8s.io "l" is invalid: metadata.resourceVersion: '
            "Invalid value: 0x0: must be specified for an update",
        ),
        (
            {"metadata": {"annotations": {"a": "x" * (256 * 1024)}}},
            'Lease.coordination.k8s.io "l" is invalid: metadata.annotations: '
            "Too long: must have at most 262144 bytes",
        ),
    ],
)
async def test_a_lease_update_the_api_would_refuse_is_refused(
    change: dict[str, Any], message: str
) -> None:
    """No update without a resourceVersion (the Lease strategy allows none), a duration above
    0, annotations within 256 KiB: 422 with the API's message."""
    path = "/apis/coordination.k8s.io/v1/namespaces/stallwatch/leases"
    async with fake_kube() as fake:
        code, created = await raw(fake, "POST", path, lease_body())
        assert code == 201, created
        body = json.loads(json.dumps(created))
        for part, values in change.items():
            for key, value in values.items():
                if value is None:
                    body[part].pop(key, None)
                else:
                    body[part][key] = value
        code, answer = await raw(fake, "PUT", f"{path}/l", body)
    assert (code, answer["message"]) == (422, message)
