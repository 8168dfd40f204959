"""examples/wiring/: the snippets for an existing Prometheus and Alertmanager pass promtool and
amtool, alone and merged into a config that has routes of its own, and match the project's
rules and routing."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WIRING = REPO / "examples" / "wiring"
PROMETHEUS_SNIPPET = WIRING / "prometheus.yml"
ALERTMANAGER_SNIPPET = WIRING / "alertmanager.yml"
PROJECT_RULES = REPO / "prometheus"
PROJECT_ALERTMANAGER = REPO / "alertmanager" / "alertmanager.yml"
RESTART_ALERTS = ("LLMServerStuck", "LLMServerUnresponsive", "LLMServerHung")
RECEIVER = "stallwatch-restarter"


def tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; `make test` installs it (Debian package {package})")
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def explain(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    return document


def prometheus_snippet_in(tmp_path: Path) -> Path:
    """The snippet with its rule files copied next to it: only the paths change."""
    document = load(PROMETHEUS_SNIPPET)
    paths = []
    for rule_file in document["rule_files"]:
        copy = tmp_path / Path(rule_file).name
        shutil.copy(PROJECT_RULES / Path(rule_file).name, copy)
        paths.append(str(copy))
    document["rule_files"] = paths
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(document))
    return config


def test_the_prometheus_snippet_passes_promtool(tmp_path: Path) -> None:
    """promtool check config accepts the snippet and finds both of the project's rule files."""
    result = run(
        tool("promtool", "prometheus"), "check", "config", str(prometheus_snippet_in(tmp_path))
    )
    assert result.returncode == 0, explain(result)
    assert "2 rule files found" in result.stdout + result.stderr, explain(result)


def test_the_prometheus_snippet_loads_the_projects_rule_files_by_name() -> None:
    """The snippet names alerts.yml and recording.yml, the files prometheus/ ships."""
    names = [Path(path).name for path in load(PROMETHEUS_SNIPPET)["rule_files"]]
    assert names == load(REPO / "prometheus" / "prometheus.yml")["rule_files"]


def test_the_scrape_jobs_carry_the_names_the_rules_look_for() -> None:
    """Every job="..." the alerting rules name is a scrape job of the snippet, and no other."""
    rules_text = (PROJECT_RULES / "alerts.yml").read_text()
    named = set(re.findall(r'job="([\w-]+)"', rules_text))
    jobs = {job["job_name"] for job in load(PROMETHEUS_SNIPPET)["scrape_configs"]}
    assert named == jobs == {"stallwatch-exporter", "stallwatch-restarter"}


def test_the_scrape_addresses_are_the_examples_listen_addresses() -> None:
    """The snippet scrapes where examples/exporter.yml and examples/restarter.yml listen."""
    targets = {
        job["job_name"]: job["static_configs"][0]["targets"]
        for job in load(PROMETHEUS_SNIPPET)["scrape_configs"]
    }
    assert targets["stallwatch-exporter"] == [load(REPO / "examples" / "exporter.yml")["listen"]]
    assert targets["stallwatch-restarter"] == [load(REPO / "examples" / "restarter.yml")["listen"]]


def test_the_alertmanager_snippet_passes_amtool() -> None:
    """amtool check-config accepts the snippet as it is."""
    result = run(
        tool("amtool", "prometheus-alertmanager"), "check-config", str(ALERTMANAGER_SNIPPET)
    )
    assert result.returncode == 0, explain(result)
    assert "SUCCESS" in result.stdout, explain(result)


def routes_test(config: Path, expected: str, *labels: str) -> subprocess.CompletedProcess[str]:
    amtool = tool("amtool", "prometheus-alertmanager")
    return run(
        amtool,
        "config",
        "routes",
        "test",
        f"--config.file={config}",
        f"--verify.receivers={expected}",
        *labels,
    )


@pytest.mark.parametrize("alertname", RESTART_ALERTS)
def test_the_snippet_routes_each_restart_alert_to_the_restarter(alertname: str) -> None:
    """amtool: LLMServerStuck, LLMServerUnresponsive and LLMServerHung reach the restarter,
    then the top-level receiver (people)."""
    result = routes_test(
        ALERTMANAGER_SNIPPET, f"{RECEIVER},default", f"alertname={alertname}", "target=gpu1"
    )
    assert result.returncode == 0, explain(result)


def merged_into_an_existing_config(tmp_path: Path) -> Path:
    """An operator's own config (a pager for critical alerts, a catch-all) with the snippet's
    two routes put first among its routes and its receiver added, as the snippet's comment says."""
    snippet = load(ALERTMANAGER_SNIPPET)
    routes = snippet["route"]["routes"]
    (receiver,) = [r for r in snippet["receivers"] if r["name"] == RECEIVER]
    existing: dict[str, Any] = {
        "route": {
            "receiver": "team-email",
            "group_by": ["alertname"],
            "routes": [{"receiver": "pager", "matchers": ['severity="critical"']}],
        },
        "receivers": [
            {"name": "team-email", "webhook_configs": [{"url": "http://127.0.0.1:1/email"}]},
            {"name": "pager", "webhook_configs": [{"url": "http://127.0.0.1:1/pager"}]},
        ],
    }
    existing["route"]["routes"][:0] = routes
    existing["receivers"].append(receiver)
    config = tmp_path / "alertmanager.yml"
    config.write_text(yaml.safe_dump(existing))
    return config


@pytest.mark.parametrize(
    ("labels", "receivers"),
    [
        (("alertname=LLMServerStuck", "severity=critical"), f"{RECEIVER},team-email,pager"),
        (("alertname=LLMServerHung", "severity=critical"), f"{RECEIVER},team-email,pager"),
        (("alertname=LLMServerUnresponsive",), f"{RECEIVER},team-email"),
        (("alertname=LLMServerDown", "severity=critical"), "pager"),
        (("alertname=StallwatchRestartBudgetExhausted", "severity=warning"), "team-email"),
        (("alertname=DiskFull", "severity=warning"), "team-email"),
    ],
)
def test_merged_into_an_existing_config_only_restart_alerts_reach_the_restarter(
    tmp_path: Path, labels: tuple[str, ...], receivers: str
) -> None:
    """Merged as documented, the restart alerts reach the restarter, the top-level receiver and
    still the operator's own receivers; every other alert is routed as before."""
    config = merged_into_an_existing_config(tmp_path)
    checked = run(tool("amtool", "prometheus-alertmanager"), "check-config", str(config))
    assert checked.returncode == 0, explain(checked)
    result = routes_test(config, receivers, *labels, "target=gpu1")
    assert result.returncode == 0, explain(result)


def test_the_snippet_routes_and_sends_as_the_projects_alertmanager_config() -> None:
    """Matchers, grouping, timers and webhook settings equal alertmanager/alertmanager.yml's;
    only the URL and the token file's path differ."""
    snippet, project = load(ALERTMANAGER_SNIPPET), load(PROJECT_ALERTMANAGER)

    def restarter_parts(document: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        (route,) = [r for r in document["route"]["routes"] if r.get("receiver") == RECEIVER]
        (receiver,) = [r for r in document["receivers"] if r["name"] == RECEIVER]
        (webhook,) = receiver["webhook_configs"]
        webhook = {**webhook, "url": "URL"}
        webhook["http_config"]["authorization"]["credentials_file"] = "TOKEN"
        return route, webhook

    assert restarter_parts(snippet) == restarter_parts(project)


def test_the_snippet_routes_exactly_the_examples_restart_alerts() -> None:
    """The snippet routes to the restarter the very alerts examples/restarter.yml acts on."""
    (route,) = [
        r for r in load(ALERTMANAGER_SNIPPET)["route"]["routes"] if r.get("receiver") == RECEIVER
    ]
    (matcher,) = route["matchers"]
    routed = re.fullmatch(r'alertname=~"([\w|]+)"', matcher)
    assert routed, matcher
    assert tuple(routed.group(1).split("|")) == RESTART_ALERTS
    assert tuple(load(REPO / "examples" / "restarter.yml")["restart_alerts"]) == RESTART_ALERTS
