"""The Prometheus Operator's CRDs as strict JSON schemas, and one validator for every object.

Core kinds are validated with kubernetes-validate's schemas (strict: unknown fields fail).
Custom resources (ServiceMonitor, PrometheusRule, AlertmanagerConfig) are validated against
the Prometheus Operator's own CRDs (v0.93.0, tests/testdata/prometheus-operator-crds/), their
`openAPIV3Schema` read as the API server applies it under kubectl's strict field validation:
- an object with `properties` accepts no other field, unless `x-kubernetes-preserve-unknown-
  fields` (the API server would prune it, and strict validation refuses it);
- `x-kubernetes-int-or-string`: an integer or a string; `nullable`: null too;
- `x-kubernetes-list-type: set`: no item twice; `map`: no two items with the same
  `x-kubernetes-list-map-keys`; `atomic`, and `x-kubernetes-map-type`, constrain nothing;
- `x-kubernetes-validations` (CEL) are not evaluated: the one rule in these CRDs is on an SNS
  receiver field, which no manifest here uses;
- a `pattern` is Go RE2: an inline `(?i)` inside a group becomes Python's scoped `(?i:...)`;
- `metadata` is the API server's ObjectMeta, not the CRD's: checked with the strict subset
  METADATA below.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import jsonschema.validators
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[2]


# --- the Prometheus Operator CRDs -----------------------------------------------------------------
CRDS = REPO / "tests" / "testdata" / "prometheus-operator-crds"
STR = {"type": "string"}
STR_MAP = {"type": "object", "additionalProperties": STR}
METADATA = {
    "type": "object",
    "properties": {"name": STR, "namespace": STR, "labels": STR_MAP, "annotations": STR_MAP},
    "required": ["name"],
    "additionalProperties": False,
}


class CrdLoader(yaml.SafeLoader):
    """A SafeLoader that reads a plain `=` as the string it is (PyYAML: YAML 1.1's value type)."""


CrdLoader.add_constructor(
    "tag:yaml.org,2002:value",
    lambda loader, node: loader.construct_scalar(node),  # type: ignore[arg-type]
)


def python_pattern(pattern: str) -> str:
    """A CRD's pattern (Go RE2) for Python's re: RE2 lets `(?i)` start anywhere, up to the end
    of its group; Python takes that only as a scoped `(?i:...)`, or at the very start."""
    out = ""
    whole = ""
    closes: list[bool] = []  # for each open group: whether a scoped flag must close with it
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            out += pattern[index : index + 2]
            index += 2
            continue
        if pattern.startswith("(?i)", index):
            if closes:
                out += "(?i:"
                closes[-1] = True
            else:  # at the top level: the rest of the pattern, anchors aside
                whole = "(?i)"
            index += 4
            continue
        if char == "(":
            closes.append(False)
        elif char == ")" and closes:
            out += ")" if closes.pop() else ""
        out += char
        index += 1
    return whole + out


def strict(schema: Any) -> Any:
    """A CRD's structural schema as the API server applies it with strict field validation."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "properties":
            out[key] = {name: strict(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not", "anyOf", "allOf", "oneOf"):
            out[key] = strict(value)
        elif key == "pattern":
            out[key] = python_pattern(value)
        else:
            out[key] = value
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def _int_or_string(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if value and (isinstance(instance, bool) or not isinstance(instance, int | str)):
        yield jsonschema.ValidationError(f"{instance!r} is neither an integer nor a string")


def _list_type(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not isinstance(instance, list) or value not in ("set", "map"):
        return
    if value == "set":
        keys = [json.dumps(item, sort_keys=True) for item in instance]
    else:
        names = schema.get("x-kubernetes-list-map-keys", [])
        keys = [
            json.dumps([item.get(n) for n in names]) for item in instance if isinstance(item, dict)
        ]
    duplicates = sorted({key for key in keys if keys.count(key) > 1})
    if duplicates:
        yield jsonschema.ValidationError(f"duplicate entries for list-type {value}: {duplicates}")


CrdValidator = jsonschema.validators.extend(
    jsonschema.Draft4Validator,
    {"x-kubernetes-int-or-string": _int_or_string, "x-kubernetes-list-type": _list_type},
)


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the strict schema of each version the CRDs serve."""
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=CrdLoader)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                schema = strict(version["schema"]["openAPIV3Schema"])
                schema["properties"]["metadata"] = METADATA
                schema["required"] = sorted({*schema.get("required", []), "metadata", "spec"})
                CrdValidator.check_schema(schema)
                schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas


def validate_crd(doc: dict[str, Any]) -> None:
    schema = crd_schemas().get((doc["apiVersion"], doc["kind"]))
    assert schema is not None, f"no CRD in {CRDS} serves {doc['apiVersion']} {doc['kind']}"
    CrdValidator(schema).validate(doc)


def is_custom(doc: dict[str, Any]) -> bool:
    """Whether a CRD in CRDS serves this object's apiVersion and kind."""
    return (doc["apiVersion"], doc["kind"]) in crd_schemas()


def validate_object(doc: dict[str, Any]) -> None:
    """A custom resource against its CRD, any other object against the Kubernetes schemas."""
    if is_custom(doc):
        validate_crd(doc)
    else:
        kubernetes_validate.validate(doc, kubernetes_validate.utils.latest_version(), strict=True)
