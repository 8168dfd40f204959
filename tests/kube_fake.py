"""A protocol-level Kubernetes API for tests: real paths, verbs, bodies and status codes.

It serves what the restarter uses (pods: get, list by labelSelector, delete; pods/eviction:
create, 429 when a PodDisruptionBudget forbids; replicasets: get; deployments and
statefulsets: get, merge-patch; leases: get, create, update with resourceVersion conflicts;
events: create) over plain HTTP on loopback, authorizes every request against RBAC rules
(403 for anything not granted, like the API server), and records each call as the
(apiGroup, resource, verb) an RBAC rule would name.
"""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

TOKEN = "fake-service-account-token"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
Key = tuple[str, str]
Call = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


def status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def granted(rules: list[dict[str, Any]]) -> set[Call]:
    """Every (apiGroup, resource, verb) a list of RBAC PolicyRules allows."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


def make_pod(
    namespace: str,
    name: str,
    *,
    labels: dict[str, str] | None = None,
    pod_ip: str | None = "127.0.0.1",
    port: int = 8000,
    port_name: str = "http",
    owner: tuple[str, str] | None = None,
    grace_period: int = 30,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
    if owner is not None:
        kind, owner_name = owner
        api_version = "v1" if kind == "Node" else "apps/v1"
        metadata["ownerReferences"] = [
            {
                "apiVersion": api_version,
                "kind": kind,
                "name": owner_name,
                "uid": f"uid-{owner_name}",
                "controller": True,
            }
        ]
    status_part: dict[str, Any] = {"phase": "Running"}
    if pod_ip is not None:
        status_part["podIP"] = pod_ip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "containers": [
                {
                    "name": "server",
                    "image": "vllm",
                    "ports": [{"name": port_name, "containerPort": port, "protocol": "TCP"}],
                }
            ],
            # What the API server fills in when a manifest leaves it out: 30.
            "terminationGracePeriodSeconds": grace_period,
        },
        "status": status_part,
    }


class FakeKube:
    """The API's state, its RBAC rules, and the calls it saw (allowed and denied)."""

    def __init__(self, rules: list[dict[str, Any]]) -> None:
        self.grants = granted(rules)
        self.pods: dict[Key, dict[str, Any]] = {}
        self.replicasets: dict[Key, dict[str, Any]] = {}
        self.workloads: dict[tuple[str, str, str], dict[str, Any]] = {}  # (resource, ns, name)
        self.leases: dict[Key, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.pdb_forbids: set[Key] = set()
        self.calls: list[Call] = []
        self.denied: list[Call] = []
        self.evicted: list[Key] = []
        self.deleted: list[Key] = []
        # The gracePeriodSeconds each eviction or delete asked for (None: not given).
        self.grace_periods: dict[Key, int | None] = {}
        self.patches: list[tuple[str, str, str, dict[str, Any]]] = []
        self._versions = itertools.count(1)
        self._names = itertools.count(1)
        self.app = web.Application()
        self.app.router.add_route("*", "/{path:.*}", self.dispatch)
        self.server = TestServer(self.app, host="127.0.0.1")

    # --- set-up -------------------------------------------------------------------------------
    def add_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta["resourceVersion"] = str(next(self._versions))
        self.pods[(meta["namespace"], meta["name"])] = pod

    def add_workload(self, resource: str, namespace: str, name: str) -> None:
        self.workloads[(resource, namespace, name)] = {
            "apiVersion": "apps/v1",
            "kind": "Deployment" if resource == "deployments" else "StatefulSet",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "server", "image": "vllm"}]},
                },
            },
        }

    def add_replicaset(self, namespace: str, name: str, deployment: str) -> None:
        self.replicasets[(namespace, name)] = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": deployment,
                        "uid": f"uid-{deployment}",
                        "controller": True,
                    }
                ],
            },
            "spec": {"selector": {"matchLabels": {"app": deployment}}},
        }

    def kubeconfig(self, directory: Path) -> Path:
        """A kubeconfig that points a client at this fake over http on loopback."""
        path = directory / "kubeconfig"
        document = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "restarter", "user": {"token": TOKEN}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "restarter"}}],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(document))
        return path

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    # --- serving ------------------------------------------------------------------------------
    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return status(401, "Unauthorized", "Unauthorized")
        parts = [p for p in request.path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, rest = "", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, rest = parts[1], parts[3:]
        else:
            return status(404, "NotFound", f"the server could not find {request.path}")
        if len(rest) < 3 or rest[0] != "namespaces":
            return status(404, "NotFound", f"the server could not find {request.path}")
        namespace, resource = rest[1], rest[2]
        name = rest[3] if len(rest) > 3 else None
        sub = rest[4] if len(rest) > 4 else None
        verb = {
            "GET": "get" if name else "list",
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete",
        }.get(request.method, "unknown")
        if request.method == "POST" and name is not None and sub is None:
            return status(405, "MethodNotAllowed", "POST on a named object")
        call = (group, f"{resource}/{sub}" if sub else resource, verb)
        if call not in self.grants:
            self.denied.append(call)
            return status(
                403,
                "Forbidden",
                f'{resource} is forbidden: User "system:serviceaccount:stallwatch:restarter" '
                f'cannot {verb} resource "{call[1]}" in API group "{group}" '
                f'in the namespace "{namespace}"',
            )
        self.calls.append(call)
        handler = getattr(self, f"_{resource}", None)
        if handler is None:
            return status(404, "NotFound", f"the server could not find {request.path}")
        response: web.StreamResponse = await handler(request, verb, namespace, name, sub)
        return response

    async def _pods(
        self, request: web.Request, verb: str, namespace: str, name: str | None, sub: str | None
    ) -> web.Response:
        if verb == "list":
            wanted = dict(
                term.split("=", 1)
                for term in request.query.get("labelSelector", "").split(",")
                if term
            )
            items = [
                pod
                for (ns, _), pod in sorted(self.pods.items())
                if ns == namespace
                and all(pod["metadata"]["labels"].get(k) == v for k, v in wanted.items())
            ]
            return web.json_response(
                {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
            )
        assert name is not None
        pod = self.pods.get((namespace, name))
        if pod is None:
            return status(404, "NotFound", f'pods "{name}" not found')
        if verb == "get":
            return web.json_response(pod)
        if sub == "eviction":
            body = await request.json()
            if body.get("kind") != "Eviction" or body.get("metadata", {}).get("name") != name:
                return status(400, "BadRequest", "expected an Eviction for this pod")
            if (namespace, name) in self.pdb_forbids:
                return status(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                )
            self.evicted.append((namespace, name))
            self.grace_periods[(namespace, name)] = (body.get("deleteOptions") or {}).get(
                "gracePeriodSeconds"
            )
            self._remove(namespace, name)
            return web.json_response(body, status=201)
        if verb == "delete":
            self.deleted.append((namespace, name))
            body = await request.json() if request.can_read_body else {}
            grace = request.query.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
            self.grace_periods[(namespace, name)] = None if grace is None else int(grace)
            self._remove(namespace, name)
            return web.json_response(pod)
        return status(405, "MethodNotAllowed", f"{verb} on pods")

    def _remove(self, namespace: str, name: str) -> None:
        """Remove a pod; a LeaderWorkerSet leader takes its group's workers with it (they
        belong to the leader, so the garbage collector deletes them)."""
        pod = self.pods.pop((namespace, name))
        labels = pod["metadata"]["labels"]
        if labels.get(LWS_WORKER) == "0" and LWS_NAME in labels:
            for key, other in list(self.pods.items()):
                theirs = other["metadata"]["labels"]
                if (
                    key[0] == namespace
                    and theirs.get(LWS_NAME) == labels[LWS_NAME]
                    and theirs.get(LWS_GROUP) == labels.get(LWS_GROUP)
                ):
                    del self.pods[key]

    async def _replicasets(
        self, request: web.Request, verb: str, namespace: str, name: str | None, sub: str | None
    ) -> web.Response:
        found = self.replicasets.get((namespace, name or ""))
        if found is None:
            return status(404, "NotFound", f'replicasets.apps "{name}" not found')
        return web.json_response(found)

    async def _workload(
        self, resource: str, request: web.Request, verb: str, namespace: str, name: str | None
    ) -> web.Response:
        found = self.workloads.get((resource, namespace, name or ""))
        if found is None:
            return status(404, "NotFound", f'{resource}.apps "{name}" not found')
        if verb == "get":
            return web.json_response(found)
        if verb != "patch":
            return status(405, "MethodNotAllowed", f"{verb} on {resource}")
        if request.content_type != "application/merge-patch+json":
            return status(415, "UnsupportedMediaType", f"{request.content_type} not accepted")
        patch = await request.json()
        self.patches.append((resource, namespace, name or "", patch))
        updated = merge_patch(found, patch)
        self.workloads[(resource, namespace, name or "")] = updated
        return web.json_response(updated)

    async def _deployments(
        self, request: web.Request, verb: str, namespace: str, name: str | None, sub: str | None
    ) -> web.Response:
        return await self._workload("deployments", request, verb, namespace, name)

    async def _statefulsets(
        self, request: web.Request, verb: str, namespace: str, name: str | None, sub: str | None
    ) -> web.Response:
        return await self._workload("statefulsets", request, verb, namespace, name)

    async def _leases(
        self, request: web.Request, verb: str, namespace: str, name: str | None, sub: str | None
    ) -> web.Response:
        if verb == "create":
            body = await request.json()
            lease_name = body["metadata"]["name"]
            if (namespace, lease_name) in self.leases:
                return status(409, "AlreadyExists", f'leases "{lease_name}" already exists')
            body["metadata"]["namespace"] = namespace
            body["metadata"]["resourceVersion"] = str(next(self._versions))
            self.leases[(namespace, lease_name)] = body
            return web.json_response(body, status=201)
        stored = self.leases.get((namespace, name or ""))
        if stored is None:
            return status(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
        if verb == "get":
            return web.json_response(stored)
        if verb != "update":
            return status(405, "MethodNotAllowed", f"{verb} on leases")
        body = await request.json()
        if body["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]:
            return status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": the '
                "object has been modified; please apply your changes to the latest version "
                "and try again",
            )
        body["metadata"]["resourceVersion"] = str(next(self._versions))
        self.leases[(namespace, name or "")] = body
        return web.json_response(body)

    async def _events(
        self, request: web.Request, verb: str, namespace: str, name: str | None, sub: str | None
    ) -> web.Response:
        body = await request.json()
        meta = body["metadata"]
        if "name" not in meta:
            meta["name"] = meta["generateName"] + f"{next(self._names):05x}"
        meta["namespace"] = namespace
        self.events.append(body)
        return web.json_response(body, status=201)

    def event_reasons(self, pod: str) -> list[str]:
        return [e["reason"] for e in self.events if e["involvedObject"]["name"] == pod]

    def lease_record(self, namespace: str, name: str) -> dict[str, Any]:
        return json.loads(json.dumps(self.leases[(namespace, name)]))  # type: ignore[no-any-return]
