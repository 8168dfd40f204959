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
from stallwatch.common.kubernetes_config import QuarantineMode
from stallwatch.core.kube_routing import ROUTABLE
from stallwatch.restarter.kube.routing import CALLS_BY_MODE
from tests.support.tools import find_tool, missing_reason

OVERLAY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "restarter"
EXAMPLE = OVERLAY.parents[2] / "examples" / "kubernetes" / "model-server-readiness-gate.yaml"


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
            "ClusterRole",  # quarantine_mode readiness_gate (the default)
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


def rules_of(path: Path) -> set[tuple[str, str, str]]:
    """Every (apiGroup, resource, verb) the ClusterRoles and Roles of a file grant."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return {
        (group, resource, verb)
        for doc in docs
        if doc["kind"] in ("ClusterRole", "Role")
        for rule in doc["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


@pytest.mark.parametrize("mode", ["readiness_gate", "label"])
def test_each_quarantine_modes_role_grants_what_the_mode_calls(mode: QuarantineMode) -> None:
    """rbac-<mode>.yaml grants exactly the calls the mode makes that rbac.yaml does not
    already grant, and repeats none of them; each file's binding names the restarter's
    ServiceAccount."""
    base = rules_of(OVERLAY / "rbac.yaml")
    path = OVERLAY / f"rbac-{mode.replace('_', '-')}.yaml"
    extra = rules_of(path)
    assert extra == CALLS_BY_MODE[mode] - base
    assert not extra & base
    (binding,) = [d for d in yaml.safe_load_all(path.read_text()) if d and "Binding" in d["kind"]]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "stallwatch-restarter", "namespace": "stallwatch"}
    ]


def test_the_gate_mode_needs_no_pod_patch_and_the_label_mode_no_status_patch() -> None:
    """Least privilege per mode: the gate needs pods/status patch and never pods patch; the
    label needs pods patch and never pods/status; off needs neither."""
    gate, label = CALLS_BY_MODE["readiness_gate"], CALLS_BY_MODE["label"]
    assert ("", "pods/status", "patch") in gate
    assert ("", "pods", "patch") not in gate
    assert ("", "pods", "patch") in label
    assert ("", "pods/status", "patch") not in label
    assert CALLS_BY_MODE["off"] == frozenset()
    assert ("", "pods", "delete") in rules_of(OVERLAY / "rbac.yaml")  # the delete fallback


def test_the_kustomization_ships_the_default_modes_role() -> None:
    """The overlay's ClusterRoles are rbac.yaml's and the readiness gate's (the default mode)."""
    names = sorted(d["metadata"]["name"] for d in build() if d["kind"] == "ClusterRole")
    assert names == ["stallwatch-restarter", "stallwatch-restarter-readiness-gate"]


def test_the_admission_policies_and_the_example_validate_offline() -> None:
    """The optional ValidatingAdmissionPolicies and the example model server (gate, Service,
    PDB with AlwaysAllow) pass the strict schema; the example lists the gate, and its PDB lets
    a pod out of rotation be evicted."""
    version = kubernetes_validate.utils.latest_version()
    policies = [
        d
        for d in yaml.safe_load_all((OVERLAY / "validating-admission-policy.yaml").read_text())
        if d
    ]
    example = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    for doc in policies + example:
        kubernetes_validate.validate(doc, version, strict=True)
    assert sorted(d["kind"] for d in policies) == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
    ]
    by_kind = {d["kind"]: d for d in example}
    template = by_kind["Deployment"]["spec"]["template"]["spec"]
    assert template["readinessGates"] == [{"conditionType": ROUTABLE}]
    assert ROUTABLE not in by_kind["Deployment"]["spec"]["selector"]["matchLabels"]
    assert "publishNotReadyAddresses" not in by_kind["Service"]["spec"]
    assert by_kind["PodDisruptionBudget"]["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
