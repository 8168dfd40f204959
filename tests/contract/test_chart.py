"""charts/stallwatch with the real helm: it lints, renders valid objects for every ci/ values
file, and renders what the chart README promises (RBAC per mode, labels, hardening, rules)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from stallwatch.common.config import ConfigError
from stallwatch.common.config_files import load_restarter_config
from stallwatch.restarter.kube.routing import CALLS_BY_MODE
from tests.contract.chart import (
    CHART,
    CI_VALUES,
    NAMESPACE,
    REPO,
    explain,
    find,
    helm_template,
    one,
    pod_spec,
    render,
    run,
    tool,
    values,
)
from tests.support.kube_schemas import is_custom, validate_object

RESTARTER_ONLY_RULES = {"StallwatchRestarterDown", "StallwatchRestartAlertsUnhandled"}
RESTART_ALERTS = "LLMServerStuck|LLMServerUnresponsive|LLMServerHung"

# The restarter's RBAC, rule by rule, as (apiGroup, resource, verb): what every install has,
# what each action mode adds, and what each quarantine mode adds (chart README, "RBAC").
ALWAYS = {("", "pods", "get"), ("", "pods", "list"), ("", "events", "create")}
PER_ACTION = {
    "evict": {("", "pods/eviction", "create")},
    "delete": {("", "pods", "delete")},
    "rollout_restart": {
        ("apps", "replicasets", "get"),
        ("apps", "deployments", "patch"),
        ("apps", "statefulsets", "patch"),
    },
}
# The calls of each quarantine mode (stallwatch/restarter/kube/routing.py CALLS_BY_MODE, which
# the restarter's component tests run against a fake API granting exactly these).
PER_QUARANTINE = {
    "readinessGate": {
        ("", "pods", "watch"),
        ("", "pods/status", "patch"),
        ("", "services", "list"),
    },
    "label": {
        ("", "pods", "watch"),
        ("", "pods", "patch"),
        ("apps", "replicasets", "get"),
        ("apps", "statefulsets", "get"),
    },
    "off": set(),
}
# With evict and a quarantine mode: the delete of a pod out of rotation whose budget refuses it.
EVICT_FALLBACK = {("", "pods", "delete")}
LEASE = {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}


def grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    """Every (apiGroup, resource, verb) a Role or ClusterRole grants."""
    out = set()
    for rule in role["rules"]:
        assert "resourceNames" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out


def source_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for name in ("alerts.yml", "recording.yml"):
        groups += yaml.safe_load((REPO / "prometheus" / name).read_text())["groups"]
    return groups


def restarter_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(
        one(docs, "ConfigMap", "stallwatch-restarter")["data"]["restarter.yml"]
    )
    return config


# --- lint and validity ---------------------------------------------------------------------------
@pytest.mark.parametrize("path", CI_VALUES, ids=lambda p: p.name)
def test_helm_lint_strict_passes(path: Path) -> None:
    """`helm lint --strict` passes the chart with each ci/ values file."""
    result = run(tool("helm"), "lint", "--strict", str(CHART), "-f", str(path))
    assert result.returncode == 0, explain(result)
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("path", CI_VALUES, ids=lambda p: p.name)
def test_every_rendered_object_validates(path: Path) -> None:
    """Every object `helm template` renders for a ci/ values file passes the strict Kubernetes
    schemas (kubernetes-validate) or its Prometheus Operator CRD."""
    docs = render("-f", str(path))
    assert {"Deployment", "Service", "ServiceMonitor", "PrometheusRule"} <= {
        d["kind"] for d in docs
    }
    for doc in docs:
        validate_object(doc)


def test_the_ci_values_cover_every_case_the_issue_names() -> None:
    """ci/ holds the default, restarter, each quarantine mode, existing-secret and release-label
    values files."""
    names = {p.name.removesuffix("-values.yaml") for p in CI_VALUES}
    assert {
        "default",
        "restarter",
        "quarantine-readinessgate",
        "quarantine-label",
        "quarantine-off",
        "existing-secret",
        "release-label",
    } <= names


def test_a_broken_object_fails_validation() -> None:
    """The validator refuses a rendered object with an unknown field, core and custom alike."""
    docs = render()
    deployment = one(docs, "Deployment", "stallwatch-exporter")
    deployment["spec"]["replica"] = 1
    with pytest.raises(Exception, match="replica"):
        validate_object(deployment)
    monitor = one(docs, "ServiceMonitor", "stallwatch-exporter")
    assert is_custom(monitor)
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(Exception, match="intervall"):
        validate_object(monitor)


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("restarter.enabeld=true", "enabeld"),
        ("restarter.quarantine.mode=readinessgate", "readinessGate"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("serviceMonitor.interval=15", "interval"),
        ("workers=0", "workers"),
        ("workers=many", "workers"),
    ],
)
def test_a_typo_in_values_fails_with_its_path(setting: str, said: str) -> None:
    """values.schema.json refuses an unknown or ill-typed value, naming it."""
    result = helm_template("--set", setting)
    assert result.returncode != 0, explain(result)
    assert said in result.stderr, explain(result)


# --- the restarter: disabled renders nothing, RBAC exactly per mode ----------------------------
def test_without_the_restarter_nothing_of_it_is_rendered() -> None:
    """By default no restarter object, no RBAC, no route to it, and no rule about it."""
    docs = render(*values("default"))
    assert not [d for d in docs if "restarter" in d["metadata"]["name"]]
    kinds = {d["kind"] for d in docs}
    assert not kinds & {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Secret",
        "AlertmanagerConfig",
        "ValidatingAdmissionPolicy",
        "PodDisruptionBudget",
        "NetworkPolicy",
    }
    rule = one(docs, "PrometheusRule")
    alerts = {r.get("alert") for g in rule["spec"]["groups"] for r in g["rules"]}
    assert not alerts & RESTARTER_ONLY_RULES
    assert "LLMServerStuck" in alerts


@pytest.mark.parametrize("mode", ["readinessGate", "label", "off"])
def test_rbac_is_exactly_what_each_quarantine_mode_needs(mode: str) -> None:
    """The restarter's ClusterRole grants the base verbs, evict (the default rule's action)
    and exactly what its quarantine mode needs; the Lease Role only the Lease."""
    docs = render(*values(f"quarantine-{mode.lower()}"))
    role = one(docs, "ClusterRole", "stallwatch-restarter")
    fallback = EVICT_FALLBACK if mode != "off" else set()
    assert grants(role) == ALWAYS | PER_ACTION["evict"] | PER_QUARANTINE[mode] | fallback
    assert grants(one(docs, "Role", "stallwatch-restarter-lease")) == LEASE
    binding = one(docs, "ClusterRoleBinding", "stallwatch-restarter")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "stallwatch-restarter", "namespace": NAMESPACE}
    ]
    config_mode = {"readinessGate": "readiness_gate", "label": "label", "off": "off"}[mode]
    assert restarter_config(docs)["kubernetes"]["quarantine_mode"] == config_mode


def test_each_quarantine_modes_grants_are_the_calls_the_code_makes() -> None:
    """PER_QUARANTINE, which the chart's RBAC is held to, is what the restarter calls in each
    quarantine mode (the component tests run those calls against a fake API granting them)."""
    for chart_mode, mode in (("readinessGate", "readiness_gate"), ("label", "label")):
        assert PER_QUARANTINE[chart_mode] == CALLS_BY_MODE[mode]
    assert PER_QUARANTINE["off"] == CALLS_BY_MODE["off"]


def test_rbac_follows_the_action_modes_of_the_rules() -> None:
    """Rules of three action modes get each mode's verbs, bound only in the rules' namespaces
    when rbac.clusterWide is false."""
    docs = render(*values("restarter"))
    role = one(docs, "ClusterRole", "stallwatch-restarter")
    expected = ALWAYS | PER_QUARANTINE["readinessGate"]
    for action in PER_ACTION.values():
        expected |= action
    assert grants(role) == expected
    assert not find(docs, "ClusterRoleBinding")
    bindings = [b for b in find(docs, "RoleBinding") if b["roleRef"]["kind"] == "ClusterRole"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["llm", "llm-batch"]


def test_an_action_mode_not_used_is_not_granted() -> None:
    """A restarter whose only rule deletes gets no eviction and no rollout verbs."""
    rule = {
        "name": "only-delete",
        "namespaces": ["llm"],
        "selector": {"app": "x"},
        "action": {"kind": "kubernetes", "mode": "delete"},
    }
    docs = render(
        "--set",
        "restarter.enabled=true",
        "--set",
        "restarter.quarantine.mode=off",
        "--set-json",
        f"restarter.config.rules=[{json.dumps(rule)}]",
    )
    assert grants(one(docs, "ClusterRole")) == ALWAYS | PER_ACTION["delete"]


def test_rbac_create_false_renders_no_rbac() -> None:
    """rbac.create false leaves the roles and bindings to the operator of the cluster."""
    docs = render("--set", "restarter.enabled=true", "--set", "restarter.rbac.create=false")
    assert not {d["kind"] for d in docs} & {
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    }
    assert one(docs, "Deployment", "stallwatch-restarter")


def test_the_admission_policy_limits_the_restarter_to_its_condition() -> None:
    """The ValidatingAdmissionPolicy matches pods/status updates by the restarter's
    ServiceAccount only, and refuses a change to labels, annotations or another condition."""
    docs = render(*values("quarantine-readinessgate"))
    policy = one(docs, "ValidatingAdmissionPolicy")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["pods/status"]
    assert rule["operations"] == ["UPDATE"]
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        'request.userInfo.username == "system:serviceaccount:stallwatch:stallwatch-restarter"'
    )
    expressions = " ".join(v["expression"] for v in policy["spec"]["validations"])
    for guarded in ("metadata.labels", "metadata.annotations", "stallwatch.io/routable"):
        assert guarded in expressions
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert not find(render(*values("quarantine-label")), "ValidatingAdmissionPolicy")


def test_the_admission_policy_without_readiness_gates_is_refused() -> None:
    """The policy guards pods/status, so asking for it with quarantine mode label fails."""
    result = helm_template(
        *values("quarantine-label"), "--set", "restarter.quarantine.admissionPolicy.enabled=true"
    )
    assert result.returncode != 0
    assert "readinessGate" in result.stderr


def test_the_admission_policy_needs_kubernetes_1_30() -> None:
    """On a cluster older than 1.30 (no ValidatingAdmissionPolicy v1) the policy fails the
    install, saying why, instead of an unknown kind at apply."""
    result = helm_template(*values("quarantine-readinessgate"), "--kube-version", "1.29.0")
    assert result.returncode != 0
    assert "needs Kubernetes 1.30 or newer; this cluster is v1.29.0" in result.stderr
    assert render(*values("quarantine-readinessgate"), "--kube-version", "1.30.0")


def test_a_bare_off_in_values_is_quarantine_mode_off() -> None:
    """`mode: off` unquoted (YAML's false) is mode off, written quoted into restarter.yml."""
    docs = render("--set", "restarter.enabled=true", "--set", "restarter.quarantine.mode=false")
    assert restarter_config(docs)["kubernetes"]["quarantine_mode"] == "off"
    assert grants(one(docs, "ClusterRole")) == ALWAYS | PER_ACTION["evict"]


def test_the_rendered_restarter_config_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """restarter.yml as the chart renders it is a config the restarter accepts, token and
    journal moved to a tmp dir (skipped, saying so, while this restarter does not know
    kubernetes.quarantine_mode yet)."""
    docs = render(*values("restarter"))
    config = restarter_config(docs)
    assert config["listen"] == "0.0.0.0:9733"
    assert config["kubernetes"]["lease"] == {
        "name": "stallwatch-restarter",
        "namespace": NAMESPACE,
        "duration": "15s",
        "renew_every": "5s",
    }
    assert config["token_file"] == "/etc/stallwatch-token/token"
    (tmp_path / "token").write_text("t0ken\n")
    (tmp_path / "token").chmod(0o600)
    config["token_file"] = str(tmp_path / "token")
    config["journal"] = str(tmp_path / "journal.sqlite")
    path = tmp_path / "restarter.yml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("POD_NAME", "stallwatch-restarter-abc")
    try:
        loaded = load_restarter_config(path)
    except ConfigError as error:
        if "quarantine_mode" in str(error):
            pytest.skip(f"this restarter does not know kubernetes.quarantine_mode yet: {error}")
        raise
    assert [rule.name for rule in loaded.rules] == ["vllm", "sglang", "tgi"]


def test_the_rendered_exporter_config_passes_its_check(tmp_path: Path) -> None:
    """exporter.yml as the chart renders it passes `stallwatch exporter --config.check`."""
    docs = render()
    config = tmp_path / "exporter.yml"
    config.write_text(one(docs, "ConfigMap", "stallwatch-exporter")["data"]["exporter.yml"])
    stallwatch = Path(sys.executable).parent / "stallwatch"
    result = subprocess.run(
        [str(stallwatch), "exporter", "--config", str(config), "--config.check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, explain(result)


# --- labels, hardening, config sources -----------------------------------------------------------
def test_release_label_and_common_labels_are_where_kube_prometheus_stack_looks() -> None:
    """With the release-label values every ServiceMonitor and the PrometheusRule carry
    `release`, and every object carries commonLabels."""
    docs = render(*values("release-label"))
    selected = [d for d in docs if d["kind"] in ("ServiceMonitor", "PrometheusRule")]
    assert len(selected) == 3
    for doc in selected:
        assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    for doc in docs:
        assert doc["metadata"]["labels"]["team"] == "inference", doc["metadata"]["name"]
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == "stallwatch"


def test_every_pod_runs_hardened_by_default() -> None:
    """Both Deployments: non-root, read-only root filesystem, no privilege escalation, ALL
    capabilities dropped, RuntimeDefault seccomp; the exporter without an API token."""
    docs = render(*values("restarter"))
    for name in ("stallwatch-exporter", "stallwatch-restarter"):
        spec = pod_spec(one(docs, "Deployment", name))
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        (container,) = spec["containers"]
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
    assert (
        pod_spec(one(docs, "Deployment", "stallwatch-exporter"))["automountServiceAccountToken"]
        is False
    )


def test_an_existing_secret_replaces_the_rendered_config_and_token() -> None:
    """configExistingSecretName mounts that Secret and renders no config of its own; an
    existing token Secret is the one mounted and sent; a digest pins the image."""
    docs = render(*values("existing-secret"))
    assert not find(docs, "ConfigMap", "stallwatch-exporter")
    assert not find(docs, "Secret")
    exporter = pod_spec(one(docs, "Deployment", "stallwatch-exporter"))
    volumes = {v["name"]: v for v in exporter["volumes"]}
    assert volumes["config"] == {
        "name": "config",
        "secret": {"secretName": "my-stallwatch-exporter-config"},
    }
    restarter = pod_spec(one(docs, "Deployment", "stallwatch-restarter"))
    token = {v["name"]: v for v in restarter["volumes"]}["token"]
    assert token["secret"]["secretName"] == "my-restarter-token"
    amc = one(docs, "AlertmanagerConfig")
    (hook,) = amc["spec"]["receivers"][0]["webhookConfigs"]
    assert hook["httpConfig"]["authorization"]["credentials"]["name"] == "my-restarter-token"
    assert exporter["containers"][0]["image"] == (
        "registry.example.com/stallwatch@sha256:"
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    )


def test_secret_config_renders_the_config_into_a_secret() -> None:
    """secretConfig true puts exporter.yml into a Secret the exporter mounts."""
    docs = render("--set", "secretConfig=true")
    secret = one(docs, "Secret", "stallwatch-exporter")
    assert "modules" in yaml.safe_load(secret["stringData"]["exporter.yml"])
    volumes = {v["name"]: v for v in pod_spec(one(docs, "Deployment"))["volumes"]}
    assert volumes["config"]["secret"]["secretName"] == "stallwatch-exporter"
    assert not find(docs, "ConfigMap", "stallwatch-exporter")


def test_extension_points_reach_the_exporter_pod() -> None:
    """extraArgs, extraEnv, extraVolumes, extraVolumeMounts, podAnnotations and the image
    values land in the exporter's pod."""
    docs = render(
        "--set",
        "extraArgs={--log-format=json}",
        "--set-json",
        'extraEnv=[{"name":"X","value":"1"}]',
        "--set-json",
        'extraVolumes=[{"name":"ca","configMap":{"name":"ca"}}]',
        "--set-json",
        'extraVolumeMounts=[{"name":"ca","mountPath":"/etc/ca"}]',
        "--set",
        "podAnnotations.a=b",
        "--set",
        "image.registry=r.example",
        "--set",
        "image.tag=9.9.9",
    )
    deployment = one(docs, "Deployment", "stallwatch-exporter")
    spec = pod_spec(deployment)
    (container,) = spec["containers"]
    assert container["args"][-1] == "--log-format=json"
    assert container["env"] == [{"name": "X", "value": "1"}]
    assert {"name": "ca", "configMap": {"name": "ca"}} in spec["volumes"]
    assert {"name": "ca", "mountPath": "/etc/ca"} in container["volumeMounts"]
    assert deployment["spec"]["template"]["metadata"]["annotations"]["a"] == "b"
    assert container["image"] == "r.example/stallwatch:9.9.9"


@pytest.mark.parametrize(
    ("workers", "args"), [("1", []), ("2", ["--workers=2"]), ("auto", ["--workers=auto"])]
)
def test_workers_reach_the_exporter_as_its_flag(workers: str, args: list[str]) -> None:
    """`workers` becomes the exporter's `--workers` flag (none at the default 1)."""
    docs = render("--set", f"workers={workers}")
    (container,) = pod_spec(one(docs, "Deployment", "stallwatch-exporter"))["containers"]
    assert container["args"][3:] == args
    assert container["args"][:3] == ["exporter", "--config", "/etc/stallwatch/exporter.yml"]


def test_the_image_tag_defaults_to_the_app_version() -> None:
    """With no tag the image is <repository>:<appVersion>."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (container,) = pod_spec(one(render(), "Deployment"))["containers"]
    assert container["image"] == f"stallwatch:{chart['appVersion']}"


# --- monitoring: rules, dashboard, scrapes, routing ----------------------------------------------
def test_the_chart_rule_files_are_the_repositorys() -> None:
    """charts/stallwatch/files holds byte-for-byte copies of prometheus/'s rule files and the
    Grafana dashboard (helm reads no file outside the chart)."""
    for name in ("alerts.yml", "recording.yml"):
        chart_copy = CHART / "files" / "prometheus" / name
        assert chart_copy.read_bytes() == (REPO / "prometheus" / name).read_bytes(), (
            f"{chart_copy} differs from prometheus/{name}: cp prometheus/{name} {chart_copy}"
        )
    dashboard = CHART / "files" / "dashboards" / "stallwatch.json"
    assert dashboard.read_bytes() == (REPO / "grafana/dashboards/stallwatch.json").read_bytes()


def test_the_prometheusrule_holds_exactly_the_rule_files_groups() -> None:
    """With a restarter, the PrometheusRule's groups equal prometheus/alerts.yml and
    recording.yml; without one, minus exactly the two rules about the restarter."""
    with_restarter = one(render(*values("restarter")), "PrometheusRule")
    assert with_restarter["spec"]["groups"] == source_groups()
    without = one(render(), "PrometheusRule")["spec"]["groups"]
    expected = [
        {**g, "rules": [r for r in g["rules"] if r.get("alert") not in RESTARTER_ONLY_RULES]}
        for g in source_groups()
    ]
    assert without == expected


def test_the_dashboard_configmap_is_the_dashboard_for_grafanas_sidecar() -> None:
    """The dashboard ConfigMap holds grafana/dashboards/stallwatch.json, labelled
    grafana_dashboard: "1"."""
    dashboard = one(render(), "ConfigMap", "stallwatch-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    source = (REPO / "grafana" / "dashboards" / "stallwatch.json").read_text()
    assert json.loads(dashboard["data"]["stallwatch.json"]) == json.loads(source)


def test_model_servers_are_read_through_this_releases_exporter() -> None:
    """The model servers' ServiceMonitor calls /probe with the module on this release's
    exporter Service, keeping the exporter's labels; the self-scrapes have the jobs the Down
    alerts watch."""
    docs = render(*values("restarter"))
    (endpoint,) = one(docs, "ServiceMonitor", "stallwatch-model-servers")["spec"]["endpoints"]
    assert endpoint["path"] == "/probe"
    assert endpoint["params"] == {"module": ["vllm"]}
    assert endpoint["honorLabels"] is True
    assert endpoint["relabelings"][-1] == {
        "targetLabel": "__address__",
        "replacement": f"stallwatch-exporter.{NAMESPACE}.svc:9732",
    }
    for component in ("exporter", "restarter"):
        (own,) = one(docs, "ServiceMonitor", f"stallwatch-{component}")["spec"]["endpoints"]
        assert {"targetLabel": "job", "replacement": f"stallwatch-{component}"} in own[
            "relabelings"
        ]


def test_a_module_the_exporter_lacks_is_refused() -> None:
    """A model-server module that is not in config.modules fails the render, naming it."""
    result = helm_template("--set", "serviceMonitor.modelServers.module=sglang")
    assert result.returncode != 0
    assert '"sglang" is not a module of config.modules' in result.stderr


def test_disabled_monitoring_renders_no_operator_objects() -> None:
    """serviceMonitor, prometheusRule and dashboards off: no ServiceMonitor, PrometheusRule or
    dashboard, so the chart installs on a cluster without the Prometheus Operator."""
    docs = render(
        "--set",
        "serviceMonitor.enabled=false",
        "--set",
        "prometheusRule.enabled=false",
        "--set",
        "dashboards.enabled=false",
    )
    assert not [d for d in docs if is_custom(d)]
    assert not find(docs, "ConfigMap", "stallwatch-dashboard")


def test_the_alertmanagerconfig_routes_the_restart_alerts_to_this_restarter() -> None:
    """With the restarter, the AlertmanagerConfig sends the three restart alerts to its
    Service with the token Secret the restarter mounts."""
    docs = render(*values("restarter"))
    amc = one(docs, "AlertmanagerConfig")
    assert amc["spec"]["route"]["matchers"] == [
        {"name": "alertname", "matchType": "=~", "value": RESTART_ALERTS}
    ]
    (hook,) = amc["spec"]["receivers"][0]["webhookConfigs"]
    assert hook["url"] == f"http://stallwatch-restarter.{NAMESPACE}.svc:9733/alerts"
    secret = hook["httpConfig"]["authorization"]["credentials"]
    mounted = {
        v["name"]: v for v in pod_spec(one(docs, "Deployment", "stallwatch-restarter"))["volumes"]
    }["token"]["secret"]["secretName"]
    assert secret == {"name": mounted, "key": "token"}
    assert one(docs, "Secret", mounted)["data"]["token"]


def test_an_alertmanagerconfig_for_an_outside_restarter_needs_its_url() -> None:
    """alertmanagerConfig without the chart's restarter fails unless given a URL."""
    result = helm_template("--set", "alertmanagerConfig.enabled=true")
    assert result.returncode != 0
    assert "alertmanagerConfig.url" in result.stderr
    docs = render(
        "--set",
        "alertmanagerConfig.enabled=true",
        "--set",
        "alertmanagerConfig.url=https://restarter.example:9733/alerts",
        "--set",
        "alertmanagerConfig.tokenSecret.name=tok",
    )
    (hook,) = one(docs, "AlertmanagerConfig")["spec"]["receivers"][0]["webhookConfigs"]
    assert hook["url"] == "https://restarter.example:9733/alerts"
    rule = one(docs, "PrometheusRule")
    alerts = {r.get("alert") for g in rule["spec"]["groups"] for r in g["rules"]}
    assert alerts >= RESTARTER_ONLY_RULES


def test_helm_package_makes_the_chart_version_archive(tmp_path: Path) -> None:
    """`helm package` writes stallwatch-<chart version>.tgz."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    result = run(tool("helm"), "package", str(CHART), "--destination", str(tmp_path))
    assert result.returncode == 0, explain(result)
    assert (tmp_path / f"stallwatch-{chart['version']}.tgz").is_file()
