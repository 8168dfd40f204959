"""The restarter config's `rules:` and `kubernetes:` keys: what loads, and what is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stallwatch.common.config import ConfigError
from stallwatch.common.kubernetes_config import KubernetesAction
from stallwatch.common.restarter_config import restarter_config_from_mapping

RULE: dict[str, Any] = {
    "name": "vllm",
    "namespaces": ["llm"],
    "selector": {"app": "vllm"},
    "metrics_port": "http",
    "action": {"kind": "kubernetes", "mode": "evict"},
}


def load(tmp_path: Path, **top: Any) -> Any:
    document = {"insecure_no_auth": True, "journal": "j.sqlite", **top}
    return restarter_config_from_mapping(document, "restarter.yml", tmp_path)


def test_rules_alone_are_a_config_and_bring_in_cluster_kubernetes(tmp_path: Path) -> None:
    """With rules, no fixed target is needed, and the API is reached in-cluster by default."""
    config = load(tmp_path, rules=[RULE])
    assert config.targets == ()
    (rule,) = config.rules
    assert rule.selector == (("app", "vllm"),)
    assert rule.action == KubernetesAction(mode="evict")
    assert config.kubernetes is not None
    assert config.kubernetes.kubeconfig is None
    assert config.kubernetes.lease is None


def test_a_lease_takes_its_identity_from_pod_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Lease holder's identity defaults to POD_NAME (the downward API sets it)."""
    monkeypatch.setenv("POD_NAME", "restarter-7f-abc")
    lease = {"name": "l", "namespace": "stallwatch"}
    config = load(tmp_path, rules=[RULE], kubernetes={"lease": lease})
    assert config.kubernetes.lease.identity == "restarter-7f-abc"


def test_a_fixed_target_may_name_its_pod(tmp_path: Path) -> None:
    """A fixed target's kubernetes action names the namespace and pod (a StatefulSet's)."""
    action = {"kind": "kubernetes", "mode": "delete", "namespace": "llm", "pod": "vllm-0"}
    target = {"name": "vllm-0", "url": "http://vllm-0.vllm.llm:8000", "action": action}
    config = load(tmp_path, targets=[target])
    assert config.targets[0].action == KubernetesAction("delete", "llm", "vllm-0")
    assert config.kubernetes is not None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"namespaces": []}, "rules[0].namespaces: list the namespaces"),
        ({"namespaces": ["Bad_NS"]}, "rules[0].namespaces: 'Bad_NS' is not a namespace name"),
        ({"selector": {}}, "rules[0].selector: give the labels a pod must carry"),
        ({"metrics_port": None}, "rules[0].metrics_port: is required"),
        ({"action": {"kind": "kubernetes", "mode": "reboot"}}, "rules[0].action.mode: expected"),
        ({"action": {"kind": "command"}}, "rules[0].action.kind: a rule's action is kind: kuber"),
        (
            {"action": {"kind": "kubernetes", "pod": "x"}},
            "rules[0].action.pod: a rule's pod comes from the alert and the API",
        ),
        ({"alert_labels": {"severity": "critical"}}, "rules[0].alert_labels.severity: expected a"),
        ({"colour": 1}, "rules[0].colour: unknown key"),
    ],
)
def test_a_bad_rule_is_refused_naming_its_field(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    """Each mistake in a rule names the file and the field."""
    rule = {key: value for key, value in {**RULE, **change}.items() if value is not None}
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, rules=[rule])
    assert str(raised.value).startswith("restarter.yml: " + message), str(raised.value)


@pytest.mark.parametrize(
    ("lease", "message"),
    [
        ({"name": "l", "namespace": "s", "identity": "a", "renew_every": "10s"}, "renew_every"),
        ({"namespace": "s", "identity": "a"}, "name: is required"),
    ],
)
def test_a_bad_lease_is_refused(tmp_path: Path, lease: dict[str, Any], message: str) -> None:
    """A Lease renewed less than twice per duration, or without a name, is refused."""
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, rules=[RULE], kubernetes={"lease": lease})


def test_no_targets_and_no_rules_is_refused(tmp_path: Path) -> None:
    """Something must be restartable: targets, or rules."""
    with pytest.raises(ConfigError, match="targets: is required"):
        load(tmp_path)


@pytest.mark.parametrize("mode", ["readiness_gate", "label", "off"])
def test_quarantine_mode_is_read(tmp_path: Path, mode: str) -> None:
    """kubernetes.quarantine_mode takes readiness_gate, label or off."""
    config = load(tmp_path, rules=[RULE], kubernetes={"quarantine_mode": mode})
    assert config.kubernetes is not None
    assert config.kubernetes.quarantine_mode == mode


def test_quarantine_mode_defaults_to_the_readiness_gate(tmp_path: Path) -> None:
    """Without quarantine_mode the readiness gate is used."""
    config = load(tmp_path, rules=[RULE])
    assert config.kubernetes is not None
    assert config.kubernetes.quarantine_mode == "readiness_gate"


def test_an_unknown_quarantine_mode_names_the_field_and_the_file(tmp_path: Path) -> None:
    """Another value is refused, naming kubernetes.quarantine_mode, restarter.yml and the
    choices."""
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, rules=[RULE], kubernetes={"quarantine_mode": "readinessGate"})
    text = str(raised.value)
    assert "restarter.yml" in text
    assert "kubernetes.quarantine_mode" in text
    assert "expected one of readiness_gate, label, off, got 'readinessGate'" in text
