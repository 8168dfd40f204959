"""deploy/kubernetes builds, validates offline, and keeps one source for rules and dashboard.

Core kinds are validated with kubernetes-validate's schemas, the Prometheus Operator's kinds
with its CRDs (tests/support/kube_schemas.py says how).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.support.kube_schemas import CRDS, CrdLoader, crd_schemas, validate_crd
from tests.support.tools import find_tool, missing_reason

REPO = Path(__file__).resolve().parents[2]
KUBE = REPO / "deploy" / "kubernetes"
OVERLAYS = ("base", "with-restarter", "without-restarter")
CORE_KINDS = {"Namespace", "ConfigMap", "Service", "Deployment"}
RESTART_ALERTS = "LLMServerStuck|LLMServerUnresponsive|LLMServerHung"
RESTARTER_ONLY_RULES = {"StallwatchRestarterDown", "StallwatchRestartAlertsUnhandled"}


def tool(name: str) -> str:
    path = find_tool(name)
    if path is None:
        pytest.fail(missing_reason(name))
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def explain(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def build(overlay: str) -> list[dict[str, Any]]:
    result = run(tool("kubectl"), "kustomize", str(KUBE / overlay))
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
    result = run(tool("promtool"), "check", "rules", str(rule_file))
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
    (labels,) = kustomization["labels"]
    release = labels["pairs"]["release"]
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
    result = run(tool("amtool"), "check-config", str(path))
    assert result.returncode == 0, explain(result)
    return path, route["receiver"]


def route_of(config: Path, *labels: str) -> str:
    amtool = tool("amtool")
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
