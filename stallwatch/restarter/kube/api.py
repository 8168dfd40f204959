"""The Kubernetes API calls the restarter makes, through kubernetes_asyncio, and nothing more.

Every call here is one the restarter's RBAC Role in deploy/kubernetes grants; a test compares
the two.
"""

from __future__ import annotations

import asyncio
import datetime
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from stallwatch.common.kubernetes_config import KubernetesSettings
from stallwatch.core.lease import LEDGER_ANNOTATION, LeaseView
from stallwatch.core.pod_rules import PodCondition, PodFacts

__all__ = ["API_ERRORS", "ApiException", "KubeApi", "LeaseObject", "answer_of"]

# What a call can raise when the API refuses it or cannot be reached.
API_ERRORS = (ApiException, aiohttp.ClientError, asyncio.TimeoutError)


def answer_of(error: BaseException) -> str:
    """The API's status code, or what kept the call from an answer."""
    if isinstance(error, ApiException):
        return f"the API answered {error.status}"
    return f"the API was not reached ({type(error).__name__}: {error})"


MERGE_PATCH = "application/merge-patch+json"
# Merges `status.conditions` by type; a JSON merge patch would replace the whole list.
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
COMPONENT = "stallwatch-restarter"
# What the API server allows in a core/v1 Event with an eventTime (bytes, as Go counts a
# string: pkg/apis/core/validation/events.go).
EVENT_MESSAGE_LIMIT = 1024
EVENT_REPORTING_INSTANCE_LIMIT = 128


@dataclass(frozen=True)
class LeaseObject:
    """A Lease as read: what it says, its ledger annotation, and its resourceVersion."""

    view: LeaseView
    ledger: str | None
    resource_version: str
    transitions: int
    # spec.acquireTime in Unix seconds (None: absent).
    acquired_at: float | None


def _seconds(moment: datetime.datetime | None) -> float | None:
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def _moment(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)


def micro_time(seconds: float) -> str:
    """A metav1.MicroTime as the API server decodes it: "2006-01-02T15:04:05.000000Z07:00",
    six digits of fraction always (a whole second too, which `isoformat()` would write
    without them and the API would refuse with 400)."""
    return _moment(seconds).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339_time(seconds: float) -> str:
    """A metav1.Time: RFC 3339 in whole seconds, as the API server writes it."""
    return _moment(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


def clipped(text: str, limit: int) -> str:
    """`text` cut to at most `limit` bytes of UTF-8, never inside a character."""
    return text.encode()[:limit].decode(errors="ignore")


def pod_facts(pod: Any) -> PodFacts:
    metadata = pod.metadata
    ports = [
        (port.name, int(port.container_port))
        for container in (pod.spec.containers or [])
        for port in (container.ports or [])
        if port.name
    ]
    owner = next(
        ((ref.kind, ref.name) for ref in (metadata.owner_references or []) if ref.controller),
        None,
    )
    return PodFacts(
        namespace=metadata.namespace,
        name=metadata.name,
        uid=metadata.uid or "",
        labels=dict(metadata.labels or {}),
        pod_ip=pod.status.pod_ip if pod.status else None,
        ports=ports,
        owner=owner,
        termination_grace_period=pod.spec.termination_grace_period_seconds,
        phase=(pod.status.phase or "") if pod.status else "",
        conditions=tuple(
            PodCondition(
                type=condition.type,
                status=condition.status,
                reason=condition.reason or "",
                message=condition.message or "",
            )
            for condition in ((pod.status.conditions or []) if pod.status else [])
        ),
        readiness_gates=tuple(gate.condition_type for gate in (pod.spec.readiness_gates or [])),
        deleting=metadata.deletion_timestamp is not None,
    )


@dataclass(frozen=True)
class ServiceFacts:
    """What the restarter reads of a Service: whom it selects, and whether it lists pods
    that are not Ready."""

    namespace: str
    name: str
    selector: Mapping[str, str]
    publish_not_ready: bool


@dataclass(frozen=True)
class Selector:
    """A workload's label selector."""

    match_labels: Mapping[str, str]
    match_expressions: tuple[Mapping[str, Any], ...]


class KubeApi:
    """One API client for the restarter's process; `connect` reads a kubeconfig or the
    pod's service account."""

    def __init__(self, api_client: Any) -> None:
        self._client = api_client
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)

    @classmethod
    async def connect(cls, settings: KubernetesSettings) -> KubeApi:
        configuration = client.Configuration()
        if settings.kubeconfig is not None:
            await config.load_kube_config(
                config_file=settings.kubeconfig,
                context=settings.context,
                client_configuration=configuration,
                persist_config=False,
            )
        else:
            config.load_incluster_config(client_configuration=configuration)
        return cls(client.ApiClient(configuration))

    async def close(self) -> None:
        await self._client.close()

    # --- pods ------------------------------------------------------------------------------
    async def pod(self, namespace: str, name: str) -> PodFacts | None:
        """The pod, or None when the API says it does not exist."""
        try:
            return pod_facts(await self.core.read_namespaced_pod(name, namespace))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    async def pods(self, namespace: str, label_selector: str) -> list[PodFacts]:
        listed = await self.core.list_namespaced_pod(namespace, label_selector=label_selector)
        return [pod_facts(pod) for pod in listed.items]

    async def watch_pods(
        self, namespace: str, timeout: float
    ) -> AsyncIterator[tuple[str, PodFacts]]:
        """The namespace's pods as they change, for up to `timeout` seconds: first each pod as
        it is (ADDED), then (ADDED, MODIFIED or DELETED, the pod) as the API reports them
        (`pods: watch`)."""
        async with watch.Watch() as stream:
            async for event in stream.stream(
                self.core.list_namespaced_pod, namespace, timeout_seconds=max(1, round(timeout))
            ):
                kind = event.get("type")
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    yield kind, pod_facts(event["object"])

    async def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """A strategic merge patch of the pod's status (`pods/status: patch`)."""
        await self.core.patch_namespaced_pod_status(
            name, namespace, patch, _content_type=STRATEGIC_MERGE_PATCH
        )

    async def patch_labels(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """A merge patch of the pod's metadata (`pods: patch`)."""
        await self.core.patch_namespaced_pod(name, namespace, patch, _content_type=MERGE_PATCH)

    async def services(self, namespace: str) -> list[ServiceFacts]:
        listed = await self.core.list_namespaced_service(namespace)
        return [
            ServiceFacts(
                namespace=namespace,
                name=service.metadata.name,
                selector=dict(service.spec.selector or {}) if service.spec else {},
                publish_not_ready=bool(service.spec and service.spec.publish_not_ready_addresses),
            )
            for service in listed.items
        ]

    async def owner_selector(self, namespace: str, kind: str, name: str) -> Selector | None:
        """The selector of a pod's controller (a ReplicaSet or StatefulSet; None: another
        kind, whose selector the restarter does not read)."""
        if kind == "ReplicaSet":
            owner = await self.apps.read_namespaced_replica_set(name, namespace)
        elif kind == "StatefulSet":
            owner = await self.apps.read_namespaced_stateful_set(name, namespace)
        else:
            return None
        selector = owner.spec.selector if owner.spec else None
        if selector is None:
            return Selector({}, ())
        return Selector(
            dict(selector.match_labels or {}),
            tuple(
                {"key": e.key, "operator": e.operator, "values": list(e.values or [])}
                for e in (selector.match_expressions or [])
            ),
        )

    async def evict(self, namespace: str, name: str, grace_period: int | None) -> None:
        """Ask for an eviction (PodDisruptionBudgets apply: 429 when one forbids it)."""
        options = (
            client.V1DeleteOptions(grace_period_seconds=grace_period)
            if grace_period is not None
            else None
        )
        body = client.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
            delete_options=options,
        )
        await self.core.create_namespaced_pod_eviction(name, namespace, body)

    async def delete(self, namespace: str, name: str, grace_period: int | None) -> None:
        if grace_period is None:
            await self.core.delete_namespaced_pod(name, namespace)
        else:
            await self.core.delete_namespaced_pod(
                name, namespace, grace_period_seconds=grace_period
            )

    # --- owners ----------------------------------------------------------------------------
    async def workload_of(self, pod: PodFacts) -> tuple[str, str] | None:
        """The Deployment or StatefulSet that runs the pod (a Deployment through its
        ReplicaSet), or None."""
        if pod.owner is None:
            return None
        kind, name = pod.owner
        if kind == "StatefulSet":
            return kind, name
        if kind != "ReplicaSet":
            return None
        replica_set = await self.apps.read_namespaced_replica_set(name, pod.namespace)
        owner = next(
            (ref for ref in (replica_set.metadata.owner_references or []) if ref.controller),
            None,
        )
        if owner is None or owner.kind != "Deployment":
            return None
        return "Deployment", owner.name

    async def rollout_restart(self, namespace: str, kind: str, name: str, at: float) -> None:
        """What `kubectl rollout restart` does: stamp the pod template's annotation."""
        stamp = rfc3339_time(at)
        patch = {"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: stamp}}}}}
        if kind == "Deployment":
            await self.apps.patch_namespaced_deployment(
                name, namespace, patch, _content_type=MERGE_PATCH
            )
        else:
            await self.apps.patch_namespaced_stateful_set(
                name, namespace, patch, _content_type=MERGE_PATCH
            )

    # --- events ----------------------------------------------------------------------------
    async def event(
        self,
        pod: tuple[str, str],
        reason: str,
        message: str,
        *,
        warning: bool,
        at: float,
        uid: str = "",
        action: str = "Restart",
    ) -> None:
        """A core/v1 Event on the pod. `kubectl describe pod` lists the Events whose
        involvedObject has the pod's kind, name, namespace and uid (kubectl's
        pkg/describe/describe.go searchEvents), so `uid` is the pod's, as read from the API
        ("" only when the pod could not be read)."""
        namespace, name = pod
        stamp = rfc3339_time(at)
        body = client.CoreV1Event(
            api_version="v1",
            kind="Event",
            metadata=client.V1ObjectMeta(generate_name=f"{name}.", namespace=namespace),
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="Pod", namespace=namespace, name=name, uid=uid or None
            ),
            reason=reason,
            message=clipped(message, EVENT_MESSAGE_LIMIT),
            type="Warning" if warning else "Normal",
            # Strings, not datetimes: the client would write isoformat(), which is not the
            # API's MicroTime format at a whole second.
            event_time=micro_time(at),
            first_timestamp=stamp,
            last_timestamp=stamp,
            count=1,
            action=action,
            source=client.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT,
            reporting_instance=clipped(
                os.environ.get("POD_NAME", COMPONENT), EVENT_REPORTING_INSTANCE_LIMIT
            ),
        )
        await self.core.create_namespaced_event(namespace, body)

    # --- leases ----------------------------------------------------------------------------
    async def lease(self, namespace: str, name: str) -> LeaseObject | None:
        try:
            lease = await self.coordination.read_namespaced_lease(name, namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        spec = lease.spec
        annotations: Mapping[str, str] = lease.metadata.annotations or {}
        return LeaseObject(
            view=LeaseView(
                holder=spec.holder_identity if spec else None,
                renewed_at=_seconds(spec.renew_time) if spec else None,
                duration=float(spec.lease_duration_seconds)
                if spec and spec.lease_duration_seconds
                else None,
            ),
            ledger=annotations.get(LEDGER_ANNOTATION),
            resource_version=lease.metadata.resource_version,
            transitions=int(spec.lease_transitions or 0) if spec else 0,
            acquired_at=_seconds(spec.acquire_time) if spec else None,
        )

    async def write_lease(
        self,
        namespace: str,
        name: str,
        *,
        holder: str,
        duration: float,
        now: float,
        ledger: str,
        previous: LeaseObject | None,
        taking: bool,
    ) -> None:
        """Create the Lease, or replace it at `previous`'s resourceVersion (409 if it moved)."""
        acquired = now if taking or previous is None else previous.acquired_at
        transitions = 0 if previous is None else previous.transitions + (1 if taking else 0)
        body = client.V1Lease(
            api_version="coordination.k8s.io/v1",
            kind="Lease",
            metadata=client.V1ObjectMeta(
                name=name,
                namespace=namespace,
                annotations={LEDGER_ANNOTATION: ledger},
                resource_version=None if previous is None else previous.resource_version,
            ),
            spec=client.V1LeaseSpec(
                holder_identity=holder,
                lease_duration_seconds=max(1, round(duration)),
                # Strings in the API's MicroTime format (see micro_time).
                acquire_time=None if acquired is None else micro_time(acquired),
                renew_time=micro_time(now),
                lease_transitions=transitions,
            ),
        )
        if previous is None:
            await self.coordination.create_namespaced_lease(namespace, body)
        else:
            await self.coordination.replace_namespaced_lease(name, namespace, body)
