"""The chart's AlertmanagerConfig as the Prometheus Operator merges it into an Alertmanager
config (its route first among the top-level routes, `continue: true`, matcher strategy None):
the restart alerts reach the restarter, and reach people only through a route of the
Alertmanager's own config, the one the chart README gives (amtool config routes test)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.contract.chart import CHART, NAMESPACE, explain, one, render, run, tool, values

PEOPLE = "people"
RESTART_ALERTS = "LLMServerStuck|LLMServerUnresponsive|LLMServerHung"
# The route the chart README asks for in the Alertmanager's own config.
PEOPLE_ROUTE = {"receiver": PEOPLE, "matchers": [f'alertname=~"{RESTART_ALERTS}"']}


def merged(tmp_path: Path, own_routes: list[dict[str, Any]]) -> tuple[Path, str]:
    """An Alertmanager config whose top-level receiver is people, with the operator's route
    for the chart's AlertmanagerConfig put before `own_routes` (pkg/alertmanager/amcfg.go)."""
    amc = one(render(*values("restarter")), "AlertmanagerConfig")
    spec = amc["spec"]["route"]
    name = f"{NAMESPACE}/{amc['metadata']['name']}/{spec['receiver']}"
    route = {
        "receiver": name,
        "matchers": [
            f"{m['name']}{m.get('matchType', '=')}{json.dumps(m['value'])}"
            for m in spec["matchers"]
        ],
        "group_by": spec["groupBy"],
        "continue": True,
    }
    config = {
        "route": {"receiver": PEOPLE, "routes": [route, *own_routes]},
        "receivers": [
            {"name": PEOPLE},
            {"name": name, "webhook_configs": [{"url": "http://127.0.0.1:9733/alerts"}]},
        ],
    }
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    checked = run(tool("amtool"), "check-config", str(path))
    assert checked.returncode == 0, explain(checked)
    return path, name


def routes(config: Path, *labels: str) -> str:
    result = run(tool("amtool"), "config", "routes", "test", f"--config.file={config}", *labels)
    assert result.returncode == 0, explain(result)
    return result.stdout.strip()


def test_without_a_route_of_its_own_people_miss_the_restart_alerts(tmp_path: Path) -> None:
    """The trap the README warns of: the operator's route matched, so the top-level receiver
    is skipped and the restarter alone gets a restart alert."""
    config, restarter = merged(tmp_path, [])
    assert routes(config, "alertname=LLMServerStuck", "namespace=llm") == restarter
    assert routes(config, "alertname=LLMServerDown", "namespace=llm") == PEOPLE


def test_the_readmes_route_tells_people_too(tmp_path: Path) -> None:
    """With the README's route in the Alertmanager's own config, each restart alert reaches the
    restarter and people; other alerts reach people only."""
    config, restarter = merged(tmp_path, [PEOPLE_ROUTE])
    for alertname in RESTART_ALERTS.split("|"):
        assert routes(config, f"alertname={alertname}", "namespace=llm") == (
            f"{restarter},{PEOPLE}"
        )
    assert routes(config, "alertname=LLMServerDegraded", "namespace=llm") == PEOPLE


def test_the_readme_carries_that_route() -> None:
    """The chart README's kube-prometheus-stack values hold exactly PEOPLE_ROUTE's matcher."""
    text = (CHART / "README.md").read_text()
    assert f"matchers: ['alertname=~\"{RESTART_ALERTS}\"']" in text
