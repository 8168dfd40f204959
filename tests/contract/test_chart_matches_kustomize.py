"""The chart and deploy/kubernetes render the same objects for the same settings, and the
kustomize overlays build with the pinned kubectl without a warning.

Same settings: the chart gets the overlays' exporter.yml and restarter.yml, their image and
their namespace. Then every object both render is equal, but for what is packaging, not
behaviour (normalize below): the chart's own labels (helm.sh/chart, instance, managed-by,
version, component, part-of) and the overlays' (part-of, release) in labels and selectors;
kustomize's hash suffix on generated ConfigMaps; the chart's checksum annotations; the
defaults Kubernetes fills in (imagePullPolicy IfNotPresent, Service type ClusterIP). Labels
the overlays set must be on the chart's object too; the chart may add more. The differences
that are behaviour are listed, and asserted, one by one (ONLY_IN_CHART, ONLY_IN_KUSTOMIZE,
test_the_chart_grants_only_the_action_modes_it_uses)."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
import yaml

from tests.contract.chart import KUBE, NAMESPACE, kustomize, render

PACKAGING_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "release",
}
# What the chart renders and the overlays leave to the user, or lack.
ONLY_IN_CHART = {
    # the overlays ask the user to create it (kubectl create secret); the chart makes one
    ("Secret", "stallwatch-restarter-token"),
    # two replicas of which one acts: the chart keeps one up through a node drain
    ("PodDisruptionBudget", "stallwatch-restarter"),
    # StallwatchRestarterDown watches up{job="stallwatch-restarter"}: the chart scrapes it
    ("ServiceMonitor", "stallwatch-restarter"),
}
# A Helm chart installs into a namespace; it does not make it.
ONLY_IN_KUSTOMIZE = {("Namespace", "stallwatch")}
# The overlays grant the quarantine mode in a ClusterRole of its own (rbac-readiness-gate.yaml,
# swapped for rbac-label.yaml in label mode); the chart adds the same rules to its one
# ClusterRole (test_the_chart_grants_only_the_action_modes_it_uses compares the grants).
KUSTOMIZE_MODE_ROLE = {
    ("ClusterRole", "stallwatch-restarter-readiness-gate"),
    ("ClusterRoleBinding", "stallwatch-restarter-readiness-gate"),
}
# The overlays' ClusterRole grants every action mode, so that editing restarter.yml never
# needs an RBAC change; the chart grants the modes its rules use (here: evict only, and the
# delete of a pod out of rotation whose budget refuses its eviction).
UNUSED_MODES = {
    ("apps", "replicasets", "get"),
    ("apps", "deployments", "patch"),
    ("apps", "statefulsets", "patch"),
}
HASH_SUFFIX = re.compile(r"-[a-z0-9]{10}$")
CHART_OWNED_RESTARTER_KEYS = ("listen", "token_file", "journal")


def chart_settings(with_restarter: bool) -> list[str]:
    """The chart's arguments for the overlays' settings."""
    exporter = yaml.safe_load((KUBE / "base" / "exporter.yml").read_text())
    args = [
        "--set",
        "image.registry=registry.example.com",
        "--set",
        "image.tag=0.1.0",
        "--set-json",
        f"config={json.dumps(exporter)}",
        "--set",
        "serviceMonitor.labels.release=kube-prometheus-stack",
        "--set",
        "prometheusRule.labels.release=kube-prometheus-stack",
    ]
    if with_restarter:
        restarter = yaml.safe_load((KUBE / "restarter" / "restarter.yml").read_text())
        for key in CHART_OWNED_RESTARTER_KEYS:
            restarter.pop(key)
        lease = restarter["kubernetes"].pop("lease")
        assert lease["namespace"] == NAMESPACE
        args += [
            "--set",
            "restarter.enabled=true",
            "--set",
            "restarter.quarantine.mode=readinessGate",
            "--set-json",
            f"restarter.config={json.dumps(restarter)}",
            "--set",
            f"restarter.lease.duration={lease['duration']}",
            "--set",
            f"restarter.lease.renewEvery={lease['renew_every']}",
        ]
    return args


def strip_labels(labels: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (labels or {}).items() if k not in PACKAGING_LABELS}


def normalize(doc: dict[str, Any]) -> dict[str, Any]:
    """The object without what is packaging (the module's docstring lists it)."""
    doc = copy.deepcopy(doc)
    meta = doc["metadata"]
    meta.pop("labels", None)
    if doc["kind"] == "ConfigMap":
        meta["name"] = HASH_SUFFIX.sub("", meta["name"])
        for key, text in doc.get("data", {}).items():
            if key.endswith(".yml"):
                data = yaml.safe_load(text)
                if key == "restarter.yml":
                    data["kubernetes"].pop("quarantine_mode", None)
                doc["data"][key] = data
    spec = doc.get("spec", {})
    if doc["kind"] in ("Deployment", "ServiceMonitor") and "matchLabels" in spec["selector"]:
        spec["selector"]["matchLabels"] = strip_labels(spec["selector"]["matchLabels"])
    if doc["kind"] == "Service":
        spec["selector"] = strip_labels(spec["selector"])
        spec.setdefault("type", "ClusterIP")
    if doc["kind"] == "Deployment":
        template = spec["template"]
        template["metadata"]["labels"] = strip_labels(template["metadata"]["labels"])
        annotations = {
            k: v
            for k, v in template["metadata"].get("annotations", {}).items()
            if not k.startswith("checksum/")
        }
        template["metadata"].pop("annotations", None)
        if annotations:
            template["metadata"]["annotations"] = annotations
        for container in template["spec"]["containers"]:
            container.setdefault("imagePullPolicy", "IfNotPresent")
        for volume in template["spec"]["volumes"]:
            if "configMap" in volume:
                volume["configMap"]["name"] = HASH_SUFFIX.sub("", volume["configMap"]["name"])
    return doc


def key(doc: dict[str, Any]) -> tuple[str, str]:
    return (doc["kind"], HASH_SUFFIX.sub("", doc["metadata"]["name"]))


def by_key(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for doc in docs:
        assert key(doc) not in out, key(doc)
        out[key(doc)] = doc
    return out


def grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def pairs(with_restarter: bool) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """The overlays' objects and the chart's, by (kind, name)."""
    if with_restarter:
        kustomized = kustomize("with-restarter") + kustomize("restarter")
    else:
        kustomized = kustomize("without-restarter")
    return by_key(kustomized), by_key(render(*chart_settings(with_restarter)))


@pytest.mark.parametrize("with_restarter", [False, True], ids=["alerts-only", "with-restarter"])
def test_the_chart_renders_the_overlays_objects(with_restarter: bool) -> None:
    """For the same settings the chart renders every object of the overlays, equal but for
    packaging, plus only the objects listed in ONLY_IN_CHART."""
    kustomized, charted = pairs(with_restarter)
    only_chart = set(charted) - set(kustomized)
    assert only_chart == (ONLY_IN_CHART if with_restarter else set())
    only_kustomize = ONLY_IN_KUSTOMIZE | (KUSTOMIZE_MODE_ROLE if with_restarter else set())
    assert set(kustomized) - set(charted) == only_kustomize
    for name in set(kustomized) & set(charted):
        ours, theirs = kustomized[name], charted[name]
        labels = strip_labels(ours["metadata"].get("labels"))
        assert labels.items() <= strip_labels(theirs["metadata"].get("labels")).items(), name
        if name == ("ClusterRole", "stallwatch-restarter"):
            continue  # test_the_chart_grants_only_the_action_modes_it_uses
        assert normalize(theirs) == normalize(ours), name


def test_the_chart_grants_only_the_action_modes_it_uses() -> None:
    """The chart's ClusterRole is the overlays' two (the restarter's and its quarantine mode's)
    minus the verbs of action modes no rule uses."""
    kustomized, charted = pairs(True)
    ours = grants(kustomized[("ClusterRole", "stallwatch-restarter")]) | grants(
        kustomized[("ClusterRole", "stallwatch-restarter-readiness-gate")]
    )
    theirs = grants(charted[("ClusterRole", "stallwatch-restarter")])
    assert theirs == ours - UNUSED_MODES
    assert ours >= UNUSED_MODES


def test_normalize_keeps_what_is_behaviour() -> None:
    """A changed port, argument or rule still differs after normalize, so the comparison can
    fail."""
    kustomized, _ = pairs(False)
    deployment = kustomized[("Deployment", "stallwatch-exporter")]
    changed = copy.deepcopy(deployment)
    changed["spec"]["template"]["spec"]["containers"][0]["args"].append("--log-level=debug")
    assert normalize(changed) != normalize(deployment)
    changed = copy.deepcopy(deployment)
    changed["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] = "other"
    assert normalize(changed) != normalize(deployment)


@pytest.mark.parametrize("overlay", ["base", "with-restarter", "without-restarter", "restarter"])
def test_the_overlays_build_without_a_warning(overlay: str) -> None:
    """`kubectl kustomize` (v1.35) builds each overlay with nothing on stderr: no deprecated
    field (bases, commonLabels, patchesJson6902) is left."""
    assert kustomize(overlay)
