"""Allow-rules, pods read from the API, and LeaderWorkerSet groups: the pure matching, by table."""

from __future__ import annotations

import pytest

from stallwatch.common.kubernetes_config import KubernetesAction, PodRule
from stallwatch.core.pod_rules import (
    LWS_GROUP,
    LWS_NAME,
    LWS_WORKER,
    PodFacts,
    Refusal,
    allowed_pod,
    group_of,
    metrics_url,
    rule_for_pod,
    rules_for_alert,
    target_name,
)

RULE = PodRule(
    name="vllm",
    namespaces=("llm-a", "llm-b"),
    selector=(("app", "vllm"), ("tier", "serving")),
    metrics_port="http",
    action=KubernetesAction(),
    alert_labels=(("severity", ("critical", "page")),),
)
OTHER = PodRule(
    name="sglang",
    namespaces=("sg",),
    selector=(("app", "sglang"),),
    metrics_port="metrics",
    action=KubernetesAction(mode="delete"),
    namespace_label="exported_namespace",
    pod_label="exported_pod",
)


def pod(labels: dict[str, str], ip: str | None = "10.1.2.3", ports=(("http", 8000),)) -> PodFacts:
    return PodFacts("llm-a", "vllm-0", labels, ip, list(ports))


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"namespace": "llm-a", "pod": "p", "severity": "critical"}, ("vllm", "llm-a", "p")),
        ({"namespace": "llm-b", "pod": "p", "severity": "page"}, ("vllm", "llm-b", "p")),
        ({"namespace": "llm-c", "pod": "p", "severity": "critical"}, "no_rule"),
        ({"namespace": "llm-a", "pod": "p", "severity": "warning"}, "no_rule"),
        ({"namespace": "llm-a", "pod": "p"}, "no_rule"),
        ({"namespace": "llm-a", "severity": "critical"}, "no_rule"),
        ({"exported_namespace": "sg", "exported_pod": "s-1"}, ("sglang", "sg", "s-1")),
        ({"namespace": "sg", "pod": "s-1"}, "no_rule"),
    ],
)
def test_rule_for_alert(labels: dict[str, str], expected: object) -> None:
    """An alert is allowed only by a rule that lists its namespace and accepts its labels."""
    found = rules_for_alert((RULE, OTHER), labels)
    if isinstance(expected, str):
        assert isinstance(found, Refusal)
        assert found.reason == expected
    else:
        assert not isinstance(found, Refusal)
        first = found[0]
        assert (first.rule.name, first.namespace, first.pod) == expected


def test_no_rules_refuse_everything() -> None:
    """With no rule configured, no alert names a pod the restarter may touch."""
    assert rules_for_alert((), {"namespace": "llm-a", "pod": "p"}) == Refusal(
        "no_rule", "no allow-rule is configured"
    )


@pytest.mark.parametrize(
    ("labels", "allowed"),
    [
        ({"app": "vllm", "tier": "serving"}, True),
        ({"app": "vllm", "tier": "serving", "extra": "x"}, True),
        ({"app": "vllm"}, False),
        ({"app": "vllm", "tier": "batch"}, False),
        ({}, False),
    ],
)
def test_the_pods_own_labels_must_match_the_selector(labels: dict[str, str], allowed: bool) -> None:
    """The selector is checked on the labels the API returned for the pod."""
    assert (allowed_pod(RULE, pod(labels)) is None) is allowed


@pytest.mark.parametrize(
    ("ip", "ports", "expected"),
    [
        ("10.1.2.3", (("http", 8000),), "http://10.1.2.3:8000/metrics"),
        ("fd00::7", (("grpc", 9000), ("http", 8080)), "http://[fd00::7]:8080/metrics"),
        (None, (("http", 8000),), "no_pod_ip"),
        ("10.1.2.3", (("grpc", 9000),), "no_metrics_port"),
    ],
)
def test_metrics_url_comes_from_the_pod(ip: str | None, ports: object, expected: str) -> None:
    """The confirmation URL is the pod's IP and its port named in the rule, or a refusal."""
    found = metrics_url(RULE, pod({}, ip, ports))  # type: ignore[arg-type]
    assert (found.reason if isinstance(found, Refusal) else found) == expected


@pytest.mark.parametrize(
    ("labels", "name", "leader"),
    [
        (
            {LWS_NAME: "big", LWS_GROUP: "2", LWS_WORKER: "3"},
            "llm-a/big-group-2",
            "leaderworkerset.sigs.k8s.io/name=big,leaderworkerset.sigs.k8s.io/group-index=2,"
            "leaderworkerset.sigs.k8s.io/worker-index=0",
        ),
        ({LWS_NAME: "big"}, "llm-a/vllm-0", None),
        ({"app": "vllm"}, "llm-a/vllm-0", None),
    ],
)
def test_group_members_share_one_target(
    labels: dict[str, str], name: str, leader: str | None
) -> None:
    """A LeaderWorkerSet member is journaled as its group, whose leader is found by labels."""
    facts = pod(labels)
    group = group_of(facts.labels)
    assert target_name(facts) == name
    assert (group.leader_selector if group else None) == leader


SGLANG_HERE = PodRule(
    name="sglang-here",
    namespaces=("llm-a",),
    selector=(("app", "sglang"),),
    metrics_port="metrics",
    action=KubernetesAction(mode="delete"),
)


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"app": "vllm", "tier": "serving"}, "vllm"),
        ({"app": "sglang"}, "sglang-here"),
        ({"app": "tgi"}, "pod_not_allowed"),
        (None, "pod_not_found"),
    ],
)
def test_the_pods_labels_choose_among_the_rules_that_accept_the_alert(
    labels: dict[str, str] | None, expected: str
) -> None:
    """Rules for one namespace that differ by selector: the first whose selector the pod
    matches is used; none matching is pod_not_allowed naming each rule; no pod, not found."""
    alert = {"namespace": "llm-a", "pod": "vllm-0", "severity": "critical"}
    names = rules_for_alert((RULE, SGLANG_HERE), alert)
    assert isinstance(names, tuple)
    assert [n.rule.name for n in names] == ["vllm", "sglang-here"]
    found = rule_for_pod(names, {("llm-a", "vllm-0"): None if labels is None else pod(labels)})
    if isinstance(found, Refusal):
        assert found.reason == expected
        if expected == "pod_not_allowed":
            assert "vllm: " in found.detail
            assert "sglang-here: " in found.detail
    else:
        assert found[0].rule.name == expected
