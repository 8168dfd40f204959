"""The chart's README documents every value of values.yaml, and values.schema.json knows every
one of them (no helm needed)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import yaml

from tests.contract.chart import CHART

# Values whose default is a free-form map (documented as one row, not key by key).
FREE_FORM = {
    "config",
    "resources",
    "podSecurityContext",
    "securityContext",
    "namespaceSelector",
    "selector",
    "labels",
    "annotations",
    "commonLabels",
    "podAnnotations",
    "podLabels",
    "nodeSelector",
    "affinity",
    "tokenSecret",
}


def leaves(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in FREE_FORM:
            yield from leaves(value, path + ".")
        else:
            yield path


def documented() -> set[str]:
    """Every value path named in the README's values table (`a`, `b.c`, and `x.d`, `e`
    shorthands: a row's first cell may list several values of one parent)."""
    text = (CHART / "README.md").read_text()
    table = text[text.index("## Values") :]
    names = set()
    for line in table.splitlines():
        if not line.startswith("| `"):
            continue
        cell = line.split("|")[1]
        paths = re.findall(r"`([^`]+)`", cell)
        parent = paths[0].rsplit(".", 1)[0] + "." if "." in paths[0] else ""
        names.add(paths[0])
        names.update(p if "." in p else parent + p for p in paths[1:])
    return names


def test_the_readme_lists_every_value() -> None:
    """Each value of values.yaml has a row in the README's values table, and no row names a
    value that is not there."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    paths = set(leaves(values))
    rows = documented()
    tokens = {p for p in paths if p.startswith("alertmanagerConfig.tokenSecret")}
    missing = paths - rows - tokens
    assert not missing, f"values without a README row: {sorted(missing)}"
    unknown = {r for r in rows if r not in paths and not r.startswith(tuple(paths))}
    unknown -= {"alertmanagerConfig.tokenSecret.name", "alertmanagerConfig.tokenSecret.key"}
    assert not unknown, f"README rows of no value: {sorted(unknown)}"


def test_the_schema_knows_every_value() -> None:
    """values.schema.json has a property for each value of values.yaml (it refuses others)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for path in leaves(values):
        node = schema
        for part in path.split("."):
            assert part in node.get("properties", {}), f"values.schema.json lacks {path}"
            node = node["properties"][part]
    assert schema["additionalProperties"] is False


def test_the_readme_shows_the_readiness_gate_and_the_release_label() -> None:
    """The README carries the pod template's readinessGates snippet and the loud release-label
    note for ServiceMonitors and PrometheusRules."""
    text = (CHART / "README.md").read_text()
    assert "- conditionType: stallwatch.io/routable" in text
    assert "readinessGates:" in text
    assert "**kube-prometheus-stack selects only ServiceMonitors AND PrometheusRules" in text
    assert "## Upgrading" in text
