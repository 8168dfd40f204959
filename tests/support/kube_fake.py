"""A protocol-level Kubernetes API for tests: real paths, verbs, bodies and status codes.

It serves what the restarter uses (pods: get, list by labelSelector, delete, patch of the
metadata; pods/status: patch, in the four patch types; pods/eviction: create, with
PodDisruptionBudgets as kube-apiserver v1.32 applies them; services: list; replicasets: get;
deployments and statefulsets: get, merge-patch; leases: get, create, update with
resourceVersion conflicts; events: create, and list by fieldSelector as `kubectl describe`
does) over plain HTTP on loopback, authorizes every request against RBAC rules (403 for
anything not granted, like the API server), and records each call as the (apiGroup,
resource, verb) an RBAC rule would name. A second token is a cluster admin (what a person
runs kubectl with): not checked against the rules and not recorded.

Where the real API refuses a body, this one refuses it the same way, with the real message;
each rule below names the kube-apiserver source it follows (kubernetes/kubernetes v1.32):
- times: a MicroTime field must be "2006-01-02T15:04:05.000000Z07:00", a Time field RFC 3339
  (400 "<Kind> in version "v1" cannot be handled as a <Kind>: parsing time ..."; see
  tests/support/kube_gotime.py and staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go,
  transformDecodeError);
- evictions: pkg/registry/core/pod/storage/eviction.go;
- Leases: pkg/apis/coordination/validation/validation.go, and the Lease strategy's
  AllowUnconditionalUpdate false (pkg/registry/coordination/lease/strategy.go);
- Events: pkg/apis/core/validation/events.go (legacyValidateEvent, the core/v1 path), and
  the fields a selector may name, pkg/registry/core/event/strategy.go (ToSelectableFields);
- pods/status patches, as measured on a real kube-apiserver v1.32.13: a strategic merge patch
  merges `status.conditions` by `type` (its patchMergeKey, staging/src/k8s.io/api/core/v1/
  types.go); a JSON merge patch replaces the whole list (`Ready` gone); a JSON patch `add` to
  `/status/conditions/-` appends a second condition of the same type; server-side apply merges
  by type; the server sets no `lastTransitionTime` and checks neither a condition's type nor its
  status; labels and annotations change through `pods/status`, `spec` changes are dropped
  (podStatusStrategy.PrepareForUpdate, pkg/registry/core/pod/strategy.go); a patch of `pods`
  keeps the old status (podStrategy.PrepareForUpdate).

A kubelet stands beside it (`kubelet = False`: a wedged one): after each write of a pod it
recomputes `Ready` from `ContainersReady` and every readiness gate's condition, as the kubelet's
status manager does (pkg/kubelet/status/generate.go GeneratePodReadyCondition), so a read back
sees what a real cluster shows a moment later.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.support.kube_gotime import RFC3339, RFC3339_MICRO, GoParseError, go_parse

TOKEN = "fake-service-account-token"
ADMIN_TOKEN = "fake-cluster-admin-token"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
Key = tuple[str, str]
Call = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


def status(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> web.Response:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return web.json_response(body, status=code)


class Refused(Exception):
    """A request the API answers with a Status error."""

    def __init__(
        self, code: int, reason: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.response = status(code, reason, message, details)


# --- field errors (k8s.io/apimachinery/pkg/util/validation/field/errors.go) ------------------
class GoRaw(str):
    """A bad value Go prints with %#v (an unsigned number: 0x0)."""


def _go_value(value: Any) -> str:
    """How field.Error's ErrorBody prints a bad value (%v for numbers, %q for strings)."""
    if isinstance(value, GoRaw):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def required(path: str, detail: str = "") -> tuple[str, str, str]:
    return (path, "FieldValueRequired", "Required value" + (f": {detail}" if detail else ""))


def invalid(path: str, value: Any, detail: str) -> tuple[str, str, str]:
    return (path, "FieldValueInvalid", f"Invalid value: {_go_value(value)}: {detail}")


def too_long(path: str, limit: int) -> tuple[str, str, str]:
    return (path, "FieldValueTooLong", f"Too long: must have at most {limit} bytes")


def unprocessable(kind: str, name: str, errors: list[tuple[str, str, str]]) -> Refused:
    """422 Invalid, as apierrors.NewInvalid words it (one error, or a [list])."""
    texts = [f"{path}: {body}" for path, _, body in errors]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    causes = [{"reason": reason, "message": body, "field": path} for path, reason, body in errors]
    return Refused(
        422,
        "Invalid",
        f"{kind} {json.dumps(name)} is invalid: {joined}",
        {"name": name, "kind": kind.split(".")[0], "causes": causes},
    )


# --- decoding times ----------------------------------------------------------------------------
# The MicroTime and Time fields of the objects the restarter writes (k8s.io/api v0.32:
# coordination/v1 LeaseSpec.acquireTime, renewTime; core/v1 Event.eventTime,
# series.lastObservedTime are MicroTime; Event.firstTimestamp, lastTimestamp and
# ObjectMeta.creationTimestamp, deletionTimestamp are Time).
TIME_FIELDS: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = {
    "Lease": (
        (("spec", "acquireTime"), RFC3339_MICRO),
        (("spec", "renewTime"), RFC3339_MICRO),
    ),
    "Event": (
        (("eventTime",), RFC3339_MICRO),
        (("series", "lastObservedTime"), RFC3339_MICRO),
        (("firstTimestamp",), RFC3339),
        (("lastTimestamp",), RFC3339),
    ),
}
_META_TIMES = (
    (("metadata", "creationTimestamp"), RFC3339),
    (("metadata", "deletionTimestamp"), RFC3339),
)


def decode_times(kind: str, body: dict[str, Any]) -> None:
    """Refuse a body whose times the API server cannot decode, with its 400 message."""
    version = str(body.get("apiVersion", "")).rsplit("/", 1)[-1]
    for path, layout in (*TIME_FIELDS.get(kind, ()), *_META_TIMES):
        node: Any = body
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is None:  # absent, or JSON null: the zero time
            continue
        try:
            if not isinstance(node, str):
                raise GoParseError(
                    f"json: cannot unmarshal {type(node).__name__} into Go value of type string"
                )
            go_parse(layout, node)
        except GoParseError as error:
            raise Refused(
                400,
                "BadRequest",
                f'{kind} in version "{version}" cannot be handled as a {kind}: {error}',
            ) from None


# pkg/apis/core/validation/events.go
REPORTING_INSTANCE_LIMIT = 128
ACTION_LIMIT = 128
REASON_LIMIT = 128
NOTE_LIMIT = 1024
# staging/src/k8s.io/apimachinery/pkg/api/validation/objectmeta.go
TOTAL_ANNOTATION_SIZE_LIMIT = 256 * (1 << 10)
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
DNS1123_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*"
    "[a-z0-9])?)*')"
)


def is_dns1123_subdomain(name: str) -> bool:
    return len(name) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(name) is not None


def _annotation_errors(meta: dict[str, Any]) -> list[tuple[str, str, str]]:
    annotations = meta.get("annotations") or {}
    size = sum(len(k.encode()) + len(str(v).encode()) for k, v in annotations.items())
    if size > TOTAL_ANNOTATION_SIZE_LIMIT:
        return [too_long("metadata.annotations", TOTAL_ANNOTATION_SIZE_LIMIT)]
    return []


def validate_lease(body: dict[str, Any]) -> list[tuple[str, str, str]]:
    """ValidateLease (pkg/apis/coordination/validation/validation.go, v1.32)."""
    meta = body.get("metadata") or {}
    errors: list[tuple[str, str, str]] = []
    name = meta.get("name", "")
    if not name:
        errors.append(required("metadata.name", "name or generateName is required"))
    elif not is_dns1123_subdomain(name):
        errors.append(invalid("metadata.name", name, DNS1123_SUBDOMAIN_MESSAGE))
    errors += _annotation_errors(meta)
    spec = body.get("spec") or {}
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and duration <= 0:
        errors.append(invalid("spec.leaseDurationSeconds", duration, "must be greater than 0"))
    transitions = spec.get("leaseTransitions")
    if transitions is not None and transitions < 0:
        errors.append(
            invalid("spec.leaseTransitions", transitions, "must be greater than or equal to 0")
        )
    if spec.get("preferredHolder") and not spec.get("strategy"):
        errors.append(
            (
                "spec.preferredHolder",
                "FieldValueForbidden",
                "Forbidden: may only be specified if `strategy` is defined",
            )
        )
    return errors


def validate_core_event(body: dict[str, Any], namespace: str) -> list[tuple[str, str, str]]:
    """legacyValidateEvent for a core/v1 Event (pkg/apis/core/validation/events.go, v1.32):
    an Event with an eventTime must name its reporter, instance and action, and keep the
    reason and the message within their limits (bytes, as Go's len counts them)."""
    errors: list[tuple[str, str, str]] = []
    involved = body.get("involvedObject") or {}
    involved_namespace = involved.get("namespace", "")
    if not body.get("eventTime"):
        if involved_namespace and involved_namespace != namespace:
            errors.append(
                invalid(
                    "involvedObject.namespace", involved_namespace, "does not match event.namespace"
                )
            )
        elif not involved_namespace and namespace not in ("", "default"):
            errors.append(invalid("involvedObject.namespace", "", "does not match event.namespace"))
    else:
        if not involved_namespace and namespace not in ("default", "kube-system"):
            errors.append(invalid("involvedObject.namespace", "", "does not match event.namespace"))
        component = body.get("reportingComponent", "")
        if not component:
            errors.append(required("reportingComponent"))
        elif not (len(component) <= 316 and _QUALIFIED_NAME.fullmatch(component)):
            errors.append(invalid("reportingComponent", component, "must be a qualified name"))
        for key, limit in (
            ("reportingInstance", REPORTING_INSTANCE_LIMIT),
            ("action", ACTION_LIMIT),
            ("reason", REASON_LIMIT),
        ):
            text = body.get(key, "")
            if not text:
                errors.append(required(key))
            if len(text.encode()) > limit:
                errors.append(invalid(key, "", f"can have at most {limit} characters"))
        if len(body.get("message", "").encode()) > NOTE_LIMIT:
            errors.append(invalid("message", "", f"can have at most {NOTE_LIMIT} characters"))
    if not is_dns1123_subdomain(namespace):
        errors.append(invalid("namespace", namespace, DNS1123_SUBDOMAIN_MESSAGE))
    return errors


# The fields an Event list may select on (pkg/registry/core/event/strategy.go, v1.32).
EVENT_SELECTABLE = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
    "metadata.name",
    "metadata.namespace",
)


def event_fields(event: dict[str, Any]) -> dict[str, str]:
    involved = event.get("involvedObject") or {}
    meta = event.get("metadata") or {}
    source = (event.get("source") or {}).get("component") or event.get("reportingComponent", "")
    fields = {
        f"involvedObject.{key}": str(involved.get(key, ""))
        for key in (
            "kind",
            "namespace",
            "name",
            "uid",
            "apiVersion",
            "resourceVersion",
            "fieldPath",
        )
    }
    return {
        **fields,
        "reason": event.get("reason", ""),
        "reportingComponent": event.get("reportingComponent", ""),
        "source": source,
        "type": event.get("type", ""),
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
    }


def parse_field_selector(text: str) -> list[tuple[str, str, str]]:
    """(field, operator, value) terms of a fieldSelector (k8s.io/apimachinery/pkg/fields/
    selector.go: ',' between terms, '=', '==' or '!=', '\\' escapes)."""
    terms: list[tuple[str, str, str]] = []
    current, escaped = "", False
    parts: list[str] = []
    for char in text:
        if escaped:
            current += "\\" + char
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ",":
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    for part in parts:
        if not part:
            continue
        match = re.fullmatch(r"([^=!]+)(!=|==|=)(.*)", part)
        if match is None:
            raise Refused(
                400, "BadRequest", f"invalid selector: '{text}'; can't understand '{part}'"
            )
        value = re.sub(r"\\(.)", r"\1", match.group(3))
        terms.append((match.group(1), match.group(2), value))
    return terms


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


# The list fields of a pod whose strategic merge key the API's types name (patchMergeKey in
# staging/src/k8s.io/api/core/v1/types.go); other lists are replaced whole.
POD_MERGE_KEYS: dict[tuple[str, ...], str] = {
    ("status", "conditions"): "type",
    ("status", "containerStatuses"): "name",
    ("status", "initContainerStatuses"): "name",
    ("metadata", "ownerReferences"): "uid",
    ("metadata", "finalizers"): "",  # a set: merged as values
    ("spec", "containers"): "name",
    ("spec", "volumes"): "name",
}
STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
PATCH_TYPES = (STRATEGIC, MERGE, JSON_PATCH, APPLY)


def strategic_merge(
    target: Any, patch: Any, keys: dict[tuple[str, ...], str], path: tuple[str, ...] = ()
) -> Any:
    """A strategic merge patch (k8s.io/apimachinery/pkg/util/strategicpatch): maps merge, null
    deletes, a list with a merge key merges its elements by that key (in the stored order, new
    ones after), any other list is replaced."""
    if not isinstance(patch, dict):
        if isinstance(patch, list) and path in keys and isinstance(target, list):
            key = keys[path]
            if not key:
                return list(target) + [v for v in patch if v not in target]
            merged = [copy.deepcopy(item) for item in target]
            for item in patch:
                index = next(
                    (i for i, old in enumerate(merged) if old.get(key) == item.get(key)), None
                )
                if index is None:
                    merged.append(copy.deepcopy(item))
                else:
                    merged[index] = strategic_merge(merged[index], item, keys, (*path, "*"))
            return merged
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = strategic_merge(result.get(key), value, keys, (*path, key))
    return result


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise Refused(422, "Invalid", f"the path {path!r} does not start with a slash")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def json_patch(document: Any, operations: Any) -> Any:
    """RFC 6902 (add, replace, remove, test), as the API server's json-patch applies it: `add`
    to a list's `-` appends, whatever the list holds."""
    result = copy.deepcopy(document)
    if not isinstance(operations, list):
        raise Refused(400, "BadRequest", "json: cannot unmarshal object into a JSON patch")
    for op in operations:
        parts = _pointer(str(op.get("path", "")))
        parent: Any = result
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.get(part)
            if parent is None:
                raise Refused(422, "Invalid", f"doc is missing path: {op.get('path')}")
        last = parts[-1]
        kind = op.get("op")
        if kind == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), op.get("value"))
            else:
                parent[last] = op.get("value")
        elif kind == "replace":
            if isinstance(parent, list):
                parent[int(last)] = op.get("value")
            else:
                parent[last] = op.get("value")
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                parent.pop(last, None)
        elif kind == "test":
            here = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if here != op.get("value"):
                raise Refused(422, "Invalid", "the test operation failed")
        else:
            raise Refused(422, "Invalid", f"Unexpected kind: {kind}")
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
    phase: str = "Running",
    ready: bool = True,
    node: str | None = "node-1",
    readiness_gates: list[str] | None = None,
) -> dict[str, Any]:
    """A pod as the API stores it once its kubelet has reported. `ready`: its containers are
    ready (and the pod is Ready, unless a readiness gate's condition is missing or False)."""
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
    # A pod is healthy to a PodDisruptionBudget when its Ready condition is True
    # (pkg/api/pod/util.go IsPodReady). A gate without its condition counts False.
    gated_ready = ready and not readiness_gates
    stamp = "2026-12-01T00:00:00Z"
    conditions = [
        {"type": kind, "status": "True" if value else "False", "lastTransitionTime": stamp}
        for kind, value in (
            ("PodScheduled", node is not None),
            ("Initialized", True),
            ("ContainersReady", ready),
            ("Ready", gated_ready),
        )
    ]
    status_part: dict[str, Any] = {"phase": phase, "conditions": conditions}
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
            **({"nodeName": node} if node else {}),
            **(
                {"readinessGates": [{"conditionType": gate} for gate in readiness_gates]}
                if readiness_gates
                else {}
            ),
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
        self.pdbs: dict[Key, dict[str, Any]] = {}
        self.calls: list[Call] = []
        self.denied: list[Call] = []
        self.evicted: list[Key] = []
        self.deleted: list[Key] = []
        # The gracePeriodSeconds each eviction or delete asked for (None: not given).
        self.grace_periods: dict[Key, int | None] = {}
        self.patches: list[tuple[str, str, str, dict[str, Any]]] = []
        # Every patch of a pod or its status: (namespace, pod, subresource or "", content type,
        # body).
        self.pod_patches: list[tuple[str, str, str, str, Any]] = []
        self.services: dict[Key, dict[str, Any]] = {}
        # The kubelet recomputes Ready after each write of a pod (False: it is wedged).
        self.kubelet = True
        # The open watches of pods: (namespace, queue of (event type, pod); None ends it).
        self._watchers: list[tuple[str, asyncio.Queue[tuple[str, dict[str, Any]] | None]]] = []
        self._versions = itertools.count(1)
        self._names = itertools.count(1)
        self.app = web.Application()
        self.app.router.add_route("*", "/{path:.*}", self.dispatch)
        self.server = TestServer(self.app, host="127.0.0.1")

    # --- set-up -------------------------------------------------------------------------------
    def add_pod(self, pod: dict[str, Any]) -> None:
        """Store a pod; each one gets its own uid, so a pod recreated under its name is
        another object (as the API server's are)."""
        meta = pod["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta["resourceVersion"] = str(next(self._versions))
        self.pods[(meta["namespace"], meta["name"])] = pod
        self._emit("ADDED", pod)

    def _emit(self, kind: str, pod: dict[str, Any]) -> None:
        """Tell every open watch of the pod's namespace."""
        for namespace, queue in self._watchers:
            if namespace == pod["metadata"]["namespace"]:
                queue.put_nowait((kind, copy.deepcopy(pod)))

    async def close(self) -> None:
        """End every open watch (as the API server does when it shuts down), then stop."""
        for _, queue in self._watchers:
            queue.put_nowait(None)
        await self.server.close()

    def add_service(
        self,
        namespace: str,
        name: str,
        selector: dict[str, str],
        *,
        publish_not_ready: bool = False,
    ) -> None:
        spec: dict[str, Any] = {"selector": selector, "ports": [{"name": "http", "port": 8000}]}
        if publish_not_ready:
            spec["publishNotReadyAddresses"] = True
        self.services[(namespace, name)] = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
            "spec": spec,
        }

    def condition(self, namespace: str, pod: str, kind: str) -> list[dict[str, Any]]:
        """Every condition of that type the pod's status holds (a writer may append two)."""
        conditions = self.pods[(namespace, pod)]["status"].get("conditions") or []
        return [c for c in conditions if c.get("type") == kind]

    def add_pdb(
        self,
        namespace: str,
        name: str,
        match_labels: dict[str, str],
        *,
        desired_healthy: int,
        current_healthy: int,
        disruptions_allowed: int | None = None,
        generation: int = 1,
        observed_generation: int | None = None,
        unhealthy_pod_eviction_policy: str | None = None,
    ) -> None:
        """A policy/v1 PodDisruptionBudget with the status its controller computed
        (`observed_generation` below `generation`: not computed yet)."""
        allowed = (
            max(0, current_healthy - desired_healthy)
            if disruptions_allowed is None
            else disruptions_allowed
        )
        spec: dict[str, Any] = {
            "minAvailable": desired_healthy,
            "selector": {"matchLabels": match_labels},
        }
        if unhealthy_pod_eviction_policy is not None:
            spec["unhealthyPodEvictionPolicy"] = unhealthy_pod_eviction_policy
        self.pdbs[(namespace, name)] = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace, "generation": generation},
            "spec": spec,
            "status": {
                "observedGeneration": generation
                if observed_generation is None
                else observed_generation,
                "desiredHealthy": desired_healthy,
                "currentHealthy": current_healthy,
                "disruptionsAllowed": allowed,
                "expectedPods": current_healthy,
            },
        }

    def add_workload(
        self,
        resource: str,
        namespace: str,
        name: str,
        selector: dict[str, Any] | None = None,
    ) -> None:
        self.workloads[(resource, namespace, name)] = {
            "apiVersion": "apps/v1",
            "kind": "Deployment" if resource == "deployments" else "StatefulSet",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
            "spec": {
                "selector": selector or {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "server", "image": "vllm"}]},
                },
            },
        }

    def add_replicaset(
        self,
        namespace: str,
        name: str,
        deployment: str,
        selector: dict[str, Any] | None = None,
    ) -> None:
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
            "spec": {"selector": selector or {"matchLabels": {"app": deployment}}},
        }

    def kubeconfig(self, directory: Path, *, admin: bool = False) -> Path:
        """A kubeconfig that points a client at this fake over http on loopback (as the
        restarter's service account, or as a cluster admin running kubectl)."""
        path = directory / ("kubeconfig-admin" if admin else "kubeconfig")
        token = ADMIN_TOKEN if admin else TOKEN
        document = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "restarter", "user": {"token": token}}],
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
        admin = request.headers.get("Authorization") == f"Bearer {ADMIN_TOKEN}"
        if not admin and request.headers.get("Authorization") != f"Bearer {TOKEN}":
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
        if verb == "list" and request.query.get("watch") in ("true", "True", "1"):
            verb = "watch"
        if request.method == "POST" and name is not None and sub is None:
            return status(405, "MethodNotAllowed", "POST on a named object")
        call = (group, f"{resource}/{sub}" if sub else resource, verb)
        handler = getattr(self, f"_{resource}", None)
        if admin:
            if handler is None:
                return status(404, "NotFound", f"the server could not find {request.path}")
            return await self._handle(handler, request, verb, namespace, name, sub)
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
        if handler is None:
            return status(404, "NotFound", f"the server could not find {request.path}")
        return await self._handle(handler, request, verb, namespace, name, sub)

    async def _handle(
        self,
        handler: Any,
        request: web.Request,
        verb: str,
        namespace: str,
        name: str | None,
        sub: str | None,
    ) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request, verb, namespace, name, sub)
        except Refused as refused:
            return refused.response
        return response

    @staticmethod
    async def _body(request: web.Request, kind: str, namespace: str) -> dict[str, Any]:
        """The request's object, refused as the API server refuses what it cannot decode or
        what names another namespace (staging/src/k8s.io/apiserver/pkg/registry/rest/
        create.go and update.go: "the namespace of the provided object does not match the
        namespace sent on the request")."""
        body: dict[str, Any] = await request.json()
        decode_times(kind, body)
        given = (body.get("metadata") or {}).get("namespace")
        if given and given != namespace:
            raise Refused(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on "
                "the request",
            )
        return body

    async def _pods(
        self, request: web.Request, verb: str, namespace: str, name: str | None, sub: str | None
    ) -> web.StreamResponse:
        if verb == "watch":
            return await self._watch_pods(request, namespace)
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
            return self._evict(await request.json(), namespace, name, pod)
        if verb == "patch" and sub in (None, "status"):
            return await self._patch_pod(request, namespace, name, pod, sub)
        if verb == "delete":
            self.deleted.append((namespace, name))
            body = await request.json() if request.can_read_body else {}
            grace = request.query.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
            self.grace_periods[(namespace, name)] = None if grace is None else int(grace)
            return web.json_response(
                self._delete_pod(namespace, name, None if grace is None else int(grace))
            )
        return status(405, "MethodNotAllowed", f"{verb} on pods")

    async def _watch_pods(self, request: web.Request, namespace: str) -> web.StreamResponse:
        """A watch of the namespace's pods, as the API streams it: one JSON event a line, every
        pod first (ADDED: a watch without a resourceVersion starts from the state now), then
        each change, until `timeoutSeconds` or the server's shutdown."""
        timeout = float(request.query.get("timeoutSeconds", "1800"))
        queue: asyncio.Queue[tuple[str, dict[str, Any]] | None] = asyncio.Queue()
        for key, pod in sorted(self.pods.items()):
            if key[0] == namespace:
                queue.put_nowait(("ADDED", copy.deepcopy(pod)))
        watcher = (namespace, queue)
        self._watchers.append(watcher)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            while True:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    event = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                if event is None:
                    break
                line = json.dumps({"type": event[0], "object": event[1]}) + "\n"
                await response.write(line.encode())
            await response.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass  # the client went away
        finally:
            self._watchers.remove(watcher)
        return response

    async def _patch_pod(
        self,
        request: web.Request,
        namespace: str,
        name: str,
        pod: dict[str, Any],
        sub: str | None,
    ) -> web.Response:
        """PATCH of a pod or its status, in the content type given (415 for another)."""
        kind = request.content_type
        if kind not in PATCH_TYPES:
            return status(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {', '.join(PATCH_TYPES)}",
            )
        if kind == APPLY and not request.query.get("fieldManager"):
            raise Refused(
                400, "BadRequest", "PATCH /apply requires the fieldManager query parameter"
            )
        text = await request.text()
        body = yaml.safe_load(text) if kind == APPLY else json.loads(text)
        self.pod_patches.append((namespace, name, sub or "", kind, body))
        if kind == MERGE:
            patched = merge_patch(pod, body)
        elif kind == JSON_PATCH:
            patched = json_patch(pod, body)
        else:
            patched = strategic_merge(pod, body, POD_MERGE_KEYS)
        meta = dict(pod["metadata"])
        new_meta = patched.get("metadata") or {}
        # Labels and annotations change through either; identity fields never do.
        for key in ("labels", "annotations"):
            if key in new_meta:
                meta[key] = new_meta[key]
            else:
                meta.pop(key, None)
        if sub == "status":
            # podStatusStrategy: the spec as stored, whatever the patch said.
            stored = {**pod, "metadata": meta, "status": patched.get("status") or {}}
        else:
            if patched.get("spec") != pod["spec"]:
                raise unprocessable(
                    "Pod",
                    name,
                    [
                        (
                            "spec",
                            "FieldValueForbidden",
                            "Forbidden: pod updates may not change fields other than "
                            "`spec.containers[*].image`, `spec.initContainers[*].image`, "
                            "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions "
                            "to existing tolerations), `spec.terminationGracePeriodSeconds` "
                            "(allow it to be set to 1 if it was previously negative)",
                        )
                    ],
                )
            # podStrategy: the status as stored.
            stored = {**pod, "metadata": meta, "status": pod["status"]}
        meta["resourceVersion"] = str(next(self._versions))
        self.pods[(namespace, name)] = stored
        self._kubelet_sync(stored)
        self._emit("MODIFIED", stored)
        return web.json_response(stored)

    def _kubelet_sync(self, pod: dict[str, Any]) -> None:
        """The kubelet's Ready: ContainersReady and every readiness gate's condition True
        (GeneratePodReadyCondition); it writes only when it changes."""
        if not self.kubelet:
            return
        conditions = pod["status"].setdefault("conditions", [])
        by_type = {c.get("type"): c for c in conditions}
        gates = [g["conditionType"] for g in pod["spec"].get("readinessGates") or []]
        containers = (by_type.get("ContainersReady") or {}).get("status") == "True"
        ready = containers and all(
            (by_type.get(gate) or {}).get("status") == "True" for gate in gates
        )
        wanted = "True" if ready else "False"
        current = by_type.get("Ready")
        if current is None:
            conditions.append({"type": "Ready", "status": wanted})
        elif current.get("status") != wanted:
            current["status"] = wanted
            current["lastTransitionTime"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    async def _services(
        self, request: web.Request, verb: str, namespace: str, name: str | None, sub: str | None
    ) -> web.Response:
        if verb != "list":
            return status(405, "MethodNotAllowed", f"{verb} on services")
        items = [svc for (ns, _), svc in sorted(self.services.items()) if ns == namespace]
        return web.json_response(
            {"apiVersion": "v1", "kind": "ServiceList", "metadata": {}, "items": items}
        )

    def _evict(
        self, body: dict[str, Any], namespace: str, name: str, pod: dict[str, Any]
    ) -> web.Response:
        """EvictionREST.Create (pkg/registry/core/pod/storage/eviction.go, v1.32)."""
        if body.get("kind") != "Eviction":
            raise Refused(400, "BadRequest", f"not a Eviction object: {body.get('kind')}")
        if (body.get("metadata") or {}).get("name") != name:
            raise Refused(400, "BadRequest", "name in URL does not match name in Eviction object")
        # canIgnorePDB: a terminal or Pending pod, or one being deleted, is deleted directly.
        phase = pod["status"].get("phase")
        if phase in ("Succeeded", "Failed", "Pending") or pod["metadata"].get("deletionTimestamp"):
            return self._evicted(body, namespace, name)
        labels = pod["metadata"]["labels"]
        pdbs = [
            pdb
            for (ns, _), pdb in sorted(self.pdbs.items())
            if ns == namespace
            # A nil or empty selector matches nothing (getPodDisruptionBudgets).
            and (selector := (pdb["spec"].get("selector") or {}).get("matchLabels"))
            and all(labels.get(k) == v for k, v in selector.items())
        ]
        if len(pdbs) > 1:
            raise Refused(
                500,
                "",
                "This pod has more than one PodDisruptionBudget, which the eviction "
                "subresource does not support.",
            )
        if pdbs:
            pdb = pdbs[0]
            pdb_status = pdb["status"]
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in pod["status"].get("conditions") or []
            )
            # An unready pod is not counted healthy: evicting it takes nothing from the
            # budget while the budget is met (IfHealthyBudget, the default), or always
            # (AlwaysAllow).
            unready_goes = not ready and (
                pdb["spec"].get("unhealthyPodEvictionPolicy") == "AlwaysAllow"
                or (
                    pdb_status["currentHealthy"] >= pdb_status["desiredHealthy"]
                    and pdb_status["desiredHealthy"] > 0
                )
            )
            if not unready_goes:
                self._check_and_decrement(pdb, name)
        return self._evicted(body, namespace, name)

    def _check_and_decrement(self, pdb: dict[str, Any], pod: str) -> None:
        """checkAndDecrement (eviction.go, v1.32): 429 until the disruption controller has
        computed the budget's status for its generation, or while it allows no disruption."""
        pdb_name = pdb["metadata"]["name"]
        pdb_status = pdb["status"]
        too_many = "Cannot evict pod as it would violate the pod's disruption budget."
        if pdb_status["observedGeneration"] < pdb["metadata"]["generation"]:
            cause = f"The disruption budget {pdb_name} is still being processed by the server."
            raise Refused(
                429,
                "TooManyRequests",
                too_many,
                {
                    "causes": [{"reason": "DisruptionBudget", "message": cause}],
                    "retryAfterSeconds": 10,
                },
            )
        if pdb_status["disruptionsAllowed"] < 0:
            raise Refused(
                403,
                "Forbidden",
                f'poddisruptionbudgets.policy "{pdb_name}" is forbidden: pdb disruptions '
                "allowed is negative",
            )
        if pdb_status["disruptionsAllowed"] == 0:
            cause = (
                f"The disruption budget {pdb_name} needs {pdb_status['desiredHealthy']} "
                f"healthy pods and has {pdb_status['currentHealthy']} currently"
            )
            raise Refused(
                429,
                "TooManyRequests",
                too_many,
                {"causes": [{"reason": "DisruptionBudget", "message": cause}]},
            )
        pdb_status["disruptionsAllowed"] -= 1
        pdb_status.setdefault("disruptedPods", {})[pod] = time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime()
        )

    def _evicted(self, body: dict[str, Any], namespace: str, name: str) -> web.Response:
        """The pod is deleted; the answer is a Status (metav1.StatusSuccess), code 201 as
        the create handler sets it (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/
        create.go), never the Eviction sent."""
        self.evicted.append((namespace, name))
        grace = (body.get("deleteOptions") or {}).get("gracePeriodSeconds")
        self.grace_periods[(namespace, name)] = grace
        self._delete_pod(namespace, name, grace)
        answer = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }
        return web.json_response(answer, status=201)

    def _delete_pod(self, namespace: str, name: str, requested: int | None) -> dict[str, Any]:
        """Delete a pod as the API server does: gracefully, so it stays, Terminating, with a
        deletionTimestamp until its kubelet has stopped it (`finish_terminating`); at once
        only with a grace period of 0, or when no node runs it or it has ended
        (pkg/registry/core/pod/strategy.go CheckGracefulDelete; the generic store's
        BeforeDelete, staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go, which only
        ever shortens the grace of a pod already Terminating). Returns the pod as stored."""
        pod = self.pods[(namespace, name)]
        spec = pod["spec"]
        period = (
            requested if requested is not None else spec.get("terminationGracePeriodSeconds", 0)
        )
        if not spec.get("nodeName") or pod["status"].get("phase") in ("Failed", "Succeeded"):
            period = 0
        if period < 0:
            period = 1
        if period == 0:
            self._remove(namespace, name)
            return pod
        meta = pod["metadata"]
        current = meta.get("deletionGracePeriodSeconds")
        if current is None or period < current:
            meta["deletionTimestamp"] = time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + period)
            )
            meta["deletionGracePeriodSeconds"] = period
            meta["resourceVersion"] = str(next(self._versions))
            self._emit("MODIFIED", pod)
        return pod

    def terminating(self) -> list[Key]:
        return sorted(
            key for key, pod in self.pods.items() if "deletionTimestamp" in pod["metadata"]
        )

    def finish_terminating(self) -> None:
        """Every Terminating pod's kubelet has stopped it: the pods go, with their
        dependents."""
        for namespace, name in self.terminating():
            if (namespace, name) in self.pods:
                self._remove(namespace, name)

    def _remove(self, namespace: str, name: str) -> None:
        """Remove a pod; a LeaderWorkerSet leader takes its group's workers with it (they
        belong to the leader, so the garbage collector deletes them)."""
        pod = self.pods.pop((namespace, name))
        self._emit("DELETED", pod)
        labels = pod["metadata"]["labels"]
        if labels.get(LWS_WORKER) == "0" and LWS_NAME in labels:
            for key, other in list(self.pods.items()):
                theirs = other["metadata"]["labels"]
                if (
                    key[0] == namespace
                    and theirs.get(LWS_NAME) == labels[LWS_NAME]
                    and theirs.get(LWS_GROUP) == labels.get(LWS_GROUP)
                ):
                    self._emit("DELETED", self.pods.pop(key))

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
        kind = "Lease.coordination.k8s.io"
        if verb == "create":
            body = await self._body(request, "Lease", namespace)
            lease_name = body["metadata"].get("name", "")
            errors = validate_lease(body)
            if errors:
                raise unprocessable(kind, lease_name, errors)
            if (namespace, lease_name) in self.leases:
                return status(
                    409,
                    "AlreadyExists",
                    f'leases.coordination.k8s.io "{lease_name}" already exists',
                )
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
        body = await self._body(request, "Lease", namespace)
        if body["metadata"].get("name") != name:
            raise Refused(
                400,
                "BadRequest",
                f"the name of the object ({body['metadata'].get('name')}) does not match the "
                f"name on the URL ({name})",
            )
        if not body["metadata"].get("resourceVersion"):
            # The Lease strategy allows no unconditional update; the generic store words it
            # with the resource, not the kind (staging/src/k8s.io/apiserver/pkg/registry/
            # generic/registry/store.go, Update).
            raise unprocessable(
                "leases.coordination.k8s.io",
                name or "",
                [
                    invalid(
                        "metadata.resourceVersion",
                        GoRaw("0x0"),
                        "must be specified for an update",
                    )
                ],
            )
        errors = validate_lease(body)
        if errors:
            raise unprocessable(kind, name or "", errors)
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
        if verb == "list":
            terms = parse_field_selector(request.query.get("fieldSelector", ""))
            for field, _, _ in terms:
                if field not in EVENT_SELECTABLE:
                    # pkg/apis/core/v1/conversion.go, the Event's field label conversion
                    raise Refused(400, "BadRequest", f"field label not supported: {field}")
            items = [
                event
                for event in self.events
                if event["metadata"]["namespace"] == namespace
                and all(
                    (event_fields(event)[field] == value) == (operator != "!=")
                    for field, operator, value in terms
                )
            ]
            return web.json_response(
                {"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": items}
            )
        if verb != "create":
            return status(405, "MethodNotAllowed", f"{verb} on events")
        body = await self._body(request, "Event", namespace)
        meta = body.setdefault("metadata", {})
        if "name" not in meta:
            meta["name"] = meta["generateName"] + f"{next(self._names):05x}"
        errors = validate_core_event(body, namespace)
        if errors:
            raise unprocessable("Event", meta["name"], errors)
        meta["namespace"] = namespace
        meta["uid"] = str(uuid.uuid4())
        self.events.append(body)
        return web.json_response(body, status=201)

    def event_reasons(self, pod: str) -> list[str]:
        return [e["reason"] for e in self.events if e["involvedObject"]["name"] == pod]

    def lease_record(self, namespace: str, name: str) -> dict[str, Any]:
        return json.loads(json.dumps(self.leases[(namespace, name)]))  # type: ignore[no-any-return]
