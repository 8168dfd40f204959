"""The restarter on the fake Kubernetes API (tests/support/kube_fake.py): its RBAC, config, app and
pod alerts, and the Events `kubectl describe pod` lists."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml
from aiohttp.test_utils import TestClient, TestServer
from kubernetes_asyncio import client, config

from stallwatch.common.config_files import load_restarter_config
from stallwatch.common.restarter_config import RestarterConfig
from stallwatch.restarter.app import RESTARTER_KEY, build_app
from stallwatch.restarter.service import Restarter
from stallwatch.simulator.testing import SimHandle
from tests.support.kube_fake import FakeKube
from tests.support.restarter import AUTH, STARTS_AT, TOKEN, payload

RESTARTER = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "restarter"
RBAC = RESTARTER / "rbac.yaml"
SERVER_LABELS = {"app.kubernetes.io/name": "vllm"}


def role_rules(quarantine_mode: str = "readiness_gate") -> list[dict[str, Any]]:
    """The rules of the restarter's ClusterRoles and Role, as shipped, with those of a
    quarantine mode (rbac-<mode>.yaml; the default one is in the kustomization)."""
    files = [RBAC]
    if quarantine_mode != "off":
        files.append(RESTARTER / f"rbac-{quarantine_mode.replace('_', '-')}.yaml")
    docs = [d for path in files for d in yaml.safe_load_all(path.read_text()) if d]
    return [rule for d in docs if d["kind"] in ("ClusterRole", "Role") for rule in d["rules"]]


@contextlib.asynccontextmanager
async def fake_kube(rules: list[dict[str, Any]] | None = None) -> AsyncIterator[FakeKube]:
    fake = FakeKube(role_rules() if rules is None else rules)
    await fake.server.start_server()
    try:
        yield fake
    finally:
        await fake.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1_796_000_000.0

    def __call__(self) -> float:
        return self.now


def write_config(
    directory: Path,
    fake: FakeKube,
    *,
    mode: str = "evict",
    identity: str | None = None,
    extra_rule: dict[str, Any] | None = None,
    more_rules: list[dict[str, Any]] | None = None,
    targets: list[dict[str, Any]] | None = None,
    quarantine_mode: str | None = None,
    top: dict[str, Any] | None = None,
) -> RestarterConfig:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(TOKEN + "\n")
    (directory / "token").chmod(0o600)
    kubernetes: dict[str, Any] = {"kubeconfig": str(fake.kubeconfig(directory))}
    if quarantine_mode is not None:
        kubernetes["quarantine_mode"] = quarantine_mode
    if identity is not None:
        kubernetes["lease"] = {
            "name": "stallwatch-restarter",
            "namespace": "stallwatch",
            "identity": identity,
            "duration": "15s",
            "renew_every": "5s",
        }
    rule = {
        "name": "vllm",
        "namespaces": ["llm"],
        "selector": SERVER_LABELS,
        "metrics_port": "http",
        "action": {"kind": "kubernetes", "mode": mode},
        "cooldown": "10m",
        **(extra_rule or {}),
    }
    document: dict[str, Any] = {
        "token_file": "token",
        "journal": "journal.sqlite",
        "confirm": {"gap": "1s", "timeout": "500ms"},
        "restart_after": "0s",
        "kubernetes": kubernetes,
        "rules": [rule, *(more_rules or [])],
    }
    if targets:
        document["targets"] = targets
    document.update(top or {})
    path = directory / "restarter.yml"
    path.write_text(yaml.safe_dump(document))
    return load_restarter_config(path)


@contextlib.asynccontextmanager
async def restarter_app(
    config: RestarterConfig, clock: Clock
) -> AsyncIterator[tuple[TestClient[Any, Any], Restarter]]:
    app = build_app(config, clock=clock)
    client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        yield client, app[RESTARTER_KEY]
    finally:
        await client.close()


def pod_alert(
    pod: str,
    *,
    namespace: str = "llm",
    alertname: str = "LLMServerHung",
    fingerprint: str = "f00d0000000000a1",
) -> dict[str, Any]:
    # `target` and `instance` point elsewhere on purpose: the restarter must not use them.
    labels = {
        "alertname": alertname,
        "namespace": namespace,
        "pod": pod,
        "target": "http://10.9.9.9:8000",
        "instance": "10.9.9.9:8000",
    }
    return {
        "status": "firing",
        "labels": labels,
        "annotations": {},
        "startsAt": STARTS_AT,
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": fingerprint,
    }


async def send(client: TestClient[Any, Any], *alerts: dict[str, Any]) -> list[dict[str, str]]:
    response = await client.post("/alerts", json=payload(*alerts), headers=AUTH)
    assert response.status == 200, await response.text()
    answer: dict[str, Any] = await response.json()
    decisions: list[dict[str, str]] = answer["decisions"]
    return decisions


def sim_port(sim: SimHandle) -> int:
    return int(sim.url.rsplit(":", 1)[1])


def results(restarter: Restarter) -> list[tuple[str, str]]:
    return [
        (entry.target, entry.reason)
        for entry in reversed(restarter.journal.recent(50))
        if entry.decision == "action_result"
    ]


async def describe_pod_events(fake: FakeKube, directory: Path, namespace: str, name: str) -> Any:
    """The Events `kubectl describe pod` shows: it reads the pod, then lists the Events with
    the field selector client-go's GetFieldSelector builds from the pod's reference (kind,
    name, namespace and uid; kubectl pkg/describe/describe.go searchEvents, limit 500)."""
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(fake.kubeconfig(directory, admin=True)),
        client_configuration=configuration,
        persist_config=False,
    )
    async with client.ApiClient(configuration) as api_client:
        core = client.CoreV1Api(api_client)
        pod = await core.read_namespaced_pod(name, namespace)
        fields = {
            "involvedObject.kind": "Pod",
            "involvedObject.name": name,
            "involvedObject.namespace": namespace,
            "involvedObject.uid": pod.metadata.uid,
        }
        selector = ",".join(f"{key}={value}" for key, value in sorted(fields.items()))
        return await core.list_namespaced_event(namespace, field_selector=selector, limit=500)
