"""deploy/kubernetes builds, validates offline, and keeps one source for rules and dashboard.

Core kinds are validated with kubernetes-validate's schemas (strict: unknown fields fail).
ServiceMonitor, PrometheusRule and AlertmanagerConfig are validated against the Prometheus
Operator's own CRDs (v0.93.0, tests/testdata/prometheus-operator-crds/), their
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

import copy
import functools
import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import jsonschema.validators
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KUBE = REPO / "deploy" / "kubernetes"
OVERLAYS = ("base", "with-restarter", "without-restarter")
CORE_KINDS = {"Namespace", "ConfigMap", "Service", "Deployment"}
RESTART_ALERTS = "LLMServerStuck|LLMServerUnresponsive|LLMServerHung"
RESTARTER_ONLY_RULES = {"StallwatchRestarterDown", "StallwatchRestartAlertsUnhandled"}


def tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; `make test` installs it (Debian package {package})")
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def explain(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def build(overlay: str) -> list[dict[str, Any]]:
    result = run(tool("kubectl", "kubernetes-client"), "kustomize", str(KUBE / overlay))
    assert result.returncode == 0, explain(result)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def source_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for name in ("alerts.yml", "recording.yml"):
        groups += yaml.safe_load((REPO / "prometheus" / name).read_text())["groups"]
    return groups


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


def validate(doc: dict[str, Any]) -> None:
    if doc["kind"] in CORE_KINDS:
        kubernetes_validate.validate(doc, kubernetes_validate.utils.latest_version(), strict=True)
    else:
        validate_crd(doc)


# --- building and validating ----------------------------------------------------------------------
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_manifest_validates_offline(overlay: str) -> None:
    """Each overlay builds with kubectl kustomize, and every object passes a strict schema."""
    docs = build(overlay)
    kinds = {doc["kind"] for doc in docs}
    assert {"Deployment", "Service", "ServiceMonitor", "PrometheusRule", "ConfigMap"} <= kinds
    for doc in docs:
        validate(doc)


def test_the_crds_are_the_operators_and_serve_the_manifests_kinds() -> None:
    """The three CRDs are release 0.93.0's, and serve the versions the manifests use."""
    versions = set()
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=CrdLoader)
        assert crd["metadata"]["annotations"]["operator.prometheus.io/version"] == "0.93.0"
        versions.add(crd["metadata"]["name"])
    assert versions == {
        "servicemonitors.monitoring.coreos.com",
        "prometheusrules.monitoring.coreos.com",
        "alertmanagerconfigs.monitoring.coreos.com",
    }
    used = {
        (d["apiVersion"], d["kind"])
        for overlay in OVERLAYS
        for d in build(overlay)
        if d["kind"] not in CORE_KINDS
    }
    assert used == set(crd_schemas())


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("Deployment", ("spec", "replicas"), "one"),
        ("Deployment", ("spec", "template", "spec", "containers", 0, "livenessprobe"), {}),
        ("ServiceMonitor", ("spec", "endpoints", 0, "honorlabels"), True),
        ("ServiceMonitor", ("spec", "endpoints", 0, "relabelings", 0, "source_labels"), ["x"]),
        ("ServiceMonitor", ("spec", "endpoints", 0, "relabelings", 0, "action"), "rename"),
        ("ServiceMonitor", ("spec", "endpoints", 0, "interval"), "15 seconds"),
        ("PrometheusRule", ("spec", "groups", 0, "rules", 0, "for"), "ten minutes"),
        ("PrometheusRule", ("spec", "groups", 0, "rules", 0, "expr"), ["up"]),
        ("PrometheusRule", ("spec", "groups", 1, "name"), "<the first group's name>"),
        ("AlertmanagerConfig", ("spec", "route", "matchers", 0, "matchType"), "~="),
        ("AlertmanagerConfig", ("spec", "route", "groupwait"), "5s"),
        ("AlertmanagerConfig", ("spec", "receivers", 0, "webhookConfigs", 0, "maxAlerts"), -1),
        ("AlertmanagerConfig", ("spec", "receivers", 0, "webhook_configs"), []),
        ("AlertmanagerConfig", ("metadata", "label"), {}),
    ],
)
def test_a_broken_manifest_fails_validation(kind: str, path: tuple[Any, ...], value: Any) -> None:
    """A wrong type, a value out of the CRD's enum or pattern, a misspelt field or a duplicate
    list-map key is caught by the same checks the manifests pass."""
    doc = copy.deepcopy(next(d for d in build("with-restarter") if d["kind"] == kind))
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value == "<the first group's name>":
        value = doc["spec"]["groups"][0]["name"]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


# --- one source for rules and dashboard ------------------------------------------------------
def test_prometheusrule_holds_exactly_the_rule_files_groups() -> None:
    """The PrometheusRule's groups equal alerts.yml's then recording.yml's, and are up to date."""
    rule = one(build("base"), "PrometheusRule", "stallwatch")
    assert rule["spec"]["groups"] == source_groups()
    assert script("gen_k8s_rules").main(["--check"]) == 0


def test_the_rule_generator_notices_a_changed_rule_file(tmp_path: Path) -> None:
    """A rule changed in prometheus/ but not regenerated makes the check fail."""
    generator = script("gen_k8s_rules")
    changed = tmp_path / "alerts.yml"
    changed.write_text((REPO / "prometheus" / "alerts.yml").read_text().replace(">= 2", ">= 3"))
    rendered = generator.render(
        generator.rule_groups((changed, REPO / "prometheus" / "recording.yml"))
    )
    assert rendered != generator.MANIFEST.read_text()


@pytest.mark.parametrize("overlay", ["with-restarter", "without-restarter"])
def test_the_rules_inside_the_prometheusrule_pass_promtool(overlay: str, tmp_path: Path) -> None:
    """promtool check rules accepts the groups the operator will load."""
    rule = one(build(overlay), "PrometheusRule", "stallwatch")
    rule_file = tmp_path / "rules.yml"
    rule_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = run(tool("promtool", "prometheus"), "check", "rules", str(rule_file))
    assert result.returncode == 0, explain(result)


def test_without_restarter_drops_only_the_restarter_rules() -> None:
    """The overlay without a restarter removes its two rules and the route, nothing else."""
    docs = build("without-restarter")
    kept = one(docs, "PrometheusRule", "stallwatch")["spec"]["groups"]
    expected = source_groups()
    for group in expected:
        group["rules"] = [r for r in group["rules"] if r.get("alert") not in RESTARTER_ONLY_RULES]
    assert kept == expected
    assert not [d for d in docs if d["kind"] == "AlertmanagerConfig"]


def test_dashboard_configmap_is_the_dashboard_file() -> None:
    """The dashboard ConfigMap holds grafana/dashboards/stallwatch.json byte for byte."""
    dashboard = one(build("base"), "ConfigMap", "stallwatch-dashboard")
    source = (REPO / "grafana" / "dashboards" / "stallwatch.json").read_text()
    assert dashboard["data"]["stallwatch.json"] == source
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert script("gen_k8s_dashboard").main(["--check"]) == 0


# --- what kube-prometheus-stack needs ---------------------------------------------------------
def test_prometheus_operator_objects_carry_the_release_label() -> None:
    """Every ServiceMonitor and PrometheusRule has the `release` label of kustomization.yaml."""
    kustomization = yaml.safe_load((KUBE / "base" / "kustomization.yaml").read_text())
    release = kustomization["commonLabels"]["release"]
    selected = [
        d for d in build("with-restarter") if d["kind"] in {"ServiceMonitor", "PrometheusRule"}
    ]
    assert len(selected) == 3
    assert all(d["metadata"]["labels"]["release"] == release for d in selected)


def test_exporter_runs_locked_down_with_probes_on_itself() -> None:
    """One non-root replica, read-only root fs, resources, probes on its own /-/healthy."""
    docs = build("base")
    deployment = one(docs, "Deployment", "stallwatch-exporter")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 1
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert {"requests", "limits"} <= set(container["resources"])
    port_names = {p["name"] for p in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] == "/-/healthy"
        assert container[probe]["httpGet"]["port"] in port_names
    config_map = pod["volumes"][0]["configMap"]["name"]
    assert config_map.startswith("stallwatch-exporter-")
    assert "exporter.yml" in one(docs, "ConfigMap", config_map)["data"]


def test_model_servers_are_read_through_the_exporters_probe() -> None:
    """A discovered address becomes ?target=, and the scrape goes to the exporter's Service."""
    docs = build("base")
    service = one(docs, "Service", "stallwatch-exporter")
    (port,) = service["spec"]["ports"]
    exporter_address = (
        f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{port['port']}"
    )
    (endpoint,) = one(docs, "ServiceMonitor", "stallwatch-model-servers")["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    assert endpoint["path"] == "/probe"
    (module,) = endpoint["params"]["module"]
    exporter_config = yaml.safe_load((KUBE / "base" / "exporter.yml").read_text())
    assert module in exporter_config["modules"]
    relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
    assert relabel["__param_target"]["sourceLabels"] == ["__address__"]
    assert relabel["__param_target"]["replacement"] == "http://$1"
    assert relabel["instance"]["sourceLabels"] == ["__param_target"]
    assert relabel["__address__"]["replacement"] == exporter_address
    assert [r["targetLabel"] for r in endpoint["relabelings"]][-1] == "__address__"


def test_exporter_self_scrape_has_the_job_the_down_alert_watches() -> None:
    """The exporter's own scrape has the job label that StallwatchExporterDown watches."""
    (endpoint,) = one(build("base"), "ServiceMonitor", "stallwatch-exporter")["spec"]["endpoints"]
    (job,) = [r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
    (down,) = [
        r for g in source_groups() for r in g["rules"] if r.get("alert") == "StallwatchExporterDown"
    ]
    assert f'up{{job="{job}"}}' in down["expr"]


def test_exporter_config_passes_the_exporters_own_check() -> None:
    """The ConfigMap's exporter.yml passes `stallwatch exporter --config.check`."""
    # The entry point installed with the interpreter running the tests, whichever environment
    # that is (not one found on the PATH, nor a checkout's .venv).
    stallwatch = Path(sys.executable).parent / "stallwatch"
    config = KUBE / "base" / "exporter.yml"
    result = run(str(stallwatch), "exporter", "--config", str(config), "--config.check")
    assert result.returncode == 0, explain(result)


# --- routing: the route the Prometheus Operator builds from the AlertmanagerConfig ----------------
def operator_route(amc: dict[str, Any], strategy: str) -> dict[str, Any]:
    """The Alertmanager route the operator makes of `amc` (pkg/alertmanager/amcfg.go)."""
    namespace, name = amc["metadata"]["namespace"], amc["metadata"]["name"]
    spec = amc["spec"]["route"]
    matchers = [
        f"{m['name']}{m.get('matchType', '=')}{json.dumps(m['value'])}" for m in spec["matchers"]
    ]
    if strategy == "OnNamespace":
        matchers.append(f"namespace={json.dumps(namespace)}")
    return {
        "receiver": f"{namespace}/{name}/{spec['receiver']}",
        "group_by": spec["groupBy"],
        "group_wait": spec["groupWait"],
        "group_interval": spec["groupInterval"],
        "repeat_interval": spec["repeatInterval"],
        "matchers": matchers,
        "continue": True,
    }


def rendered_alertmanager_config(tmp_path: Path, strategy: str) -> tuple[Path, str]:
    amc = one(build("with-restarter"), "AlertmanagerConfig", "stallwatch-restarter")
    route = operator_route(amc, strategy)
    (webhook,) = amc["spec"]["receivers"][0]["webhookConfigs"]
    config = {
        "route": {"receiver": "default", "group_by": ["alertname"], "routes": [route]},
        "receivers": [
            {"name": "default"},
            {
                "name": route["receiver"],
                "webhook_configs": [
                    {
                        "url": webhook["url"],
                        "send_resolved": webhook["sendResolved"],
                        "max_alerts": webhook["maxAlerts"],
                        "http_config": {"authorization": {"type": "Bearer", "credentials": "x"}},
                    }
                ],
            },
        ],
    }
    path = tmp_path / f"alertmanager-{strategy}.yml"
    path.write_text(yaml.safe_dump(config))
    result = run(tool("amtool", "prometheus-alertmanager"), "check-config", str(path))
    assert result.returncode == 0, explain(result)
    return path, route["receiver"]


def route_of(config: Path, *labels: str) -> str:
    amtool = tool("amtool", "prometheus-alertmanager")
    result = run(amtool, "config", "routes", "test", f"--config.file={config}", *labels)
    assert result.returncode == 0, explain(result)
    return result.stdout.strip()


@pytest.mark.parametrize("alertname", RESTART_ALERTS.split("|"))
@pytest.mark.parametrize("namespace", ["llm-prod", "stallwatch", "default"])
def test_restart_alerts_of_every_namespace_reach_the_restarter(
    alertname: str, namespace: str, tmp_path: Path
) -> None:
    """With matcher strategy None, a restart alert from any namespace goes to the restarter."""
    config, restarter = rendered_alertmanager_config(tmp_path, "None")
    labels = (f"alertname={alertname}", f"namespace={namespace}", "target=http://10.1.2.3:8000")
    assert route_of(config, *labels) == restarter


def test_other_alerts_do_not_reach_the_restarter(tmp_path: Path) -> None:
    """LLMServerDown and the self alerts go to people only."""
    config, _ = rendered_alertmanager_config(tmp_path, "None")
    for alertname in ("LLMServerDown", "StallwatchExporterDown", "LLMServerRestartLoop"):
        assert route_of(config, f"alertname={alertname}", "namespace=llm-prod") == "default"


def test_the_default_matcher_strategy_drops_other_namespaces(tmp_path: Path) -> None:
    """Under OnNamespace (the operator's default) other namespaces' alerts miss the route."""
    config, restarter = rendered_alertmanager_config(tmp_path, "OnNamespace")
    assert route_of(config, "alertname=LLMServerStuck", "namespace=llm-prod") == "default"
    assert route_of(config, "alertname=LLMServerStuck", "namespace=stallwatch") == restarter


def test_kubernetes_route_times_match_the_plain_alertmanager_route() -> None:
    """The AlertmanagerConfig keeps the grouping and timing of alertmanager/alertmanager.yml."""
    plain = yaml.safe_load((REPO / "alertmanager" / "alertmanager.yml").read_text())
    (restarter,) = [r for r in plain["route"]["routes"] if r["receiver"] == "stallwatch-restarter"]
    route = one(build("with-restarter"), "AlertmanagerConfig", "stallwatch-restarter")["spec"][
        "route"
    ]
    assert route["groupBy"] == restarter["group_by"]
    assert (route["groupWait"], route["groupInterval"], route["repeatInterval"]) == (
        restarter["group_wait"],
        restarter["group_interval"],
        restarter["repeat_interval"],
    )
    assert restarter["matchers"] == [f'alertname=~"{route["matchers"][0]["value"]}"']
