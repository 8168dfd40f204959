"""deploy/kubernetes/restarter builds, validates offline, and runs two replicas of which only the
Lease holder is Ready; its restarter.yml loads."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from stallwatch.common.config_files import load_restarter_config
from tests.support.tools import find_tool, missing_reason

OVERLAY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "restarter"


def build() -> list[dict[str, Any]]:
    kubectl = find_tool("kubectl")
    if kubectl is None:
        pytest.fail(missing_reason("kubectl"))
    result = subprocess.run(
        [kubectl, "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_every_restarter_object_validates_offline() -> None:
    """Each object of the overlay passes the strict Kubernetes schema."""
    docs = build()
    kinds = sorted(doc["kind"] for doc in docs)
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Deployment",
            "Service",
            "ConfigMap",
        ]
    )
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.utils.latest_version(), strict=True)


def test_two_replicas_one_ready_with_the_lease() -> None:
    """Two replicas; readiness is /-/ready (the Lease), liveness /-/healthy; the identity is
    the pod's name; the pods run as the ServiceAccount the Role is bound to."""
    docs = build()
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/-/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/-/healthy"
    (env,) = container["env"]
    assert env == {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    bindings = [d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    for binding in bindings:
        (subject,) = binding["subjects"]
        assert subject["name"] == pod["serviceAccountName"]
        assert subject["namespace"] == deployment["metadata"]["namespace"]


def test_the_shipped_restarter_config_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """restarter.yml passes the restarter's own checks (token and journal moved to a tmp dir)."""
    document = yaml.safe_load((OVERLAY / "restarter.yml").read_text())
    (tmp_path / "token").write_text("t0ken\n")
    (tmp_path / "token").chmod(0o600)
    document["token_file"] = str(tmp_path / "token")
    document["journal"] = str(tmp_path / "journal.sqlite")
    path = tmp_path / "restarter.yml"
    path.write_text(yaml.safe_dump(document))
    monkeypatch.setenv("POD_NAME", "stallwatch-restarter-abc")
    config = load_restarter_config(path)
    assert config.kubernetes is not None
    assert config.kubernetes.lease is not None
    assert config.kubernetes.lease.identity == "stallwatch-restarter-abc"
    assert [rule.name for rule in config.rules] == ["vllm"]
