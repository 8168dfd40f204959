"""Alertmanager routing, checked with amtool: only the restart alerts reach the restarter."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "alertmanager" / "alertmanager.yml"
RESTARTER_COOLDOWN_SECONDS = 600

DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")
SECONDS_PER_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def amtool() -> str:
    path = shutil.which("amtool")
    if path is None:
        pytest.fail(
            "amtool is not installed; `make test` installs it "
            "(Debian package prometheus-alertmanager)"
        )
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def explain(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def seconds(duration: str) -> float:
    parts = DURATION_PART.findall(duration)
    assert "".join(number + unit for number, unit in parts) == duration, duration
    return sum(int(number) * SECONDS_PER_UNIT[unit] for number, unit in parts)


def routes_test(config: Path, expected: str, *labels: str) -> subprocess.CompletedProcess[str]:
    return run(
        amtool(),
        "config",
        "routes",
        "test",
        f"--config.file={config}",
        f"--verify.receivers={expected}",
        *labels,
    )


def restarter_route(document: dict[str, Any]) -> dict[str, Any]:
    routes: list[dict[str, Any]] = document["route"]["routes"]
    (route,) = [r for r in routes if r["receiver"] == "stallwatch-restarter"]
    return route


def test_config_is_valid() -> None:
    """amtool accepts alertmanager.yml."""
    result = run(amtool(), "check-config", str(CONFIG))
    assert result.returncode == 0, explain(result)
    assert "SUCCESS" in result.stdout, explain(result)


@pytest.mark.parametrize(
    ("alertname", "severity", "receivers"),
    [
        ("LLMServerStuck", "critical", "stallwatch-restarter,default"),
        ("LLMServerUnresponsive", "critical", "stallwatch-restarter,default"),
        ("LLMServerHung", "critical", "stallwatch-restarter,default"),
        ("LLMServerDown", "critical", "default"),
        ("LLMServerRestartLoop", "warning", "default"),
        ("LLMServerDegraded", "warning", "default"),
        ("LLMServerAdmissionStalled", "warning", "default"),
        ("StallwatchExporterDown", "critical", "default"),
        ("StallwatchRestartBudgetExhausted", "warning", "default"),
        ("StallwatchRestarterDown", "critical", "default"),
        ("SomeOtherAlert", "critical", "default"),
    ],
)
def test_alert_reaches_exactly_its_receivers(alertname: str, severity: str, receivers: str) -> None:
    """Only the three restart alerts reach the restarter; people see every alert."""
    result = routes_test(
        CONFIG, receivers, f"alertname={alertname}", "target=gpu-a", f"severity={severity}"
    )
    assert result.returncode == 0, explain(result)
    assert result.stdout.strip() == receivers, explain(result)


def test_restarter_route_is_grouped_per_target() -> None:
    """One restarter notification carries one alert name and one target."""
    route = restarter_route(yaml.safe_load(CONFIG.read_text()))
    assert set(route["group_by"]) == {"alertname", "target"}


def test_restarter_repeat_interval_is_longer_than_its_cooldown() -> None:
    """A repeated notification can never land inside the restarter's cooldown."""
    route = restarter_route(yaml.safe_load(CONFIG.read_text()))
    assert seconds(route["repeat_interval"]) > RESTARTER_COOLDOWN_SECONDS
    assert seconds(route["group_wait"]) <= 10


def test_restarter_webhook_authenticates_and_sends_resolved() -> None:
    """The webhook sends a bearer token from a file, resolved alerts, and every alert."""
    document = yaml.safe_load(CONFIG.read_text())
    (receiver,) = [r for r in document["receivers"] if r["name"] == "stallwatch-restarter"]
    (webhook,) = receiver["webhook_configs"]
    assert webhook["url"] == "http://restarter:9733/alerts"
    assert webhook["send_resolved"] is True
    assert webhook["max_alerts"] == 0
    assert webhook["http_config"]["authorization"] == {
        "type": "Bearer",
        "credentials_file": "/etc/stallwatch/restarter-token",
    }


def test_default_receiver_sends_nowhere_until_replaced() -> None:
    """The default receiver is a documented placeholder with no notifier."""
    document = yaml.safe_load(CONFIG.read_text())
    assert {"name": "default"} in document["receivers"]
    assert document["route"]["receiver"] == "default"


@pytest.mark.parametrize("alertname", ["LLMServerUnresponsive", "LLMServerHung"])
def test_a_broken_route_is_caught(tmp_path: Path, alertname: str) -> None:
    """Routing tests fail when the restarter route stops matching a restart alert."""
    document = yaml.safe_load(CONFIG.read_text())
    route = restarter_route(document)
    assert route["matchers"] == ['alertname=~"LLMServerStuck|LLMServerUnresponsive|LLMServerHung"']
    route["matchers"] = ['alertname="LLMServerStuck"']
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(yaml.safe_dump(document, sort_keys=False))
    assert run(amtool(), "check-config", str(broken)).returncode == 0

    result = routes_test(
        broken,
        "stallwatch-restarter,default",
        f"alertname={alertname}",
        "target=gpu-a",
        "severity=critical",
    )

    assert result.returncode != 0, explain(result)
    assert result.stdout.splitlines()[0] == "default", explain(result)
    assert "did not match" in result.stdout, explain(result)


@pytest.mark.parametrize("alertname", ["LLMServerDegraded", "LLMServerAdmissionStalled"])
def test_degradation_alerts_reach_people_even_if_the_restarter_route_is_widened(
    tmp_path: Path, alertname: str
) -> None:
    """The degradation alerts stop at their own route to people, ahead of the restarter's:
    a restarter route widened to every LLMServer alert still never receives them."""
    document = yaml.safe_load(CONFIG.read_text())
    restarter_route(document)["matchers"] = ['alertname=~"LLMServer.*"']
    widened = tmp_path / "alertmanager.yml"
    widened.write_text(yaml.safe_dump(document, sort_keys=False))
    assert run(amtool(), "check-config", str(widened)).returncode == 0
    stuck = routes_test(
        widened, "stallwatch-restarter,default", "alertname=LLMServerStuck", "target=gpu-a"
    )
    assert stuck.returncode == 0, explain(stuck)

    result = routes_test(widened, "default", f"alertname={alertname}", "target=gpu-a")

    assert result.returncode == 0, explain(result)
    assert result.stdout.strip() == "default", explain(result)
