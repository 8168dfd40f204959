"""Prometheus config, alerting and recording rules, checked and unit-tested with promtool."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.tools import promtool

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = REPO / "prometheus"
RULE_FILES = [PROMETHEUS_DIR / "alerts.yml", PROMETHEUS_DIR / "recording.yml"]
RULE_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))

CONTRACT_ALERTS = {
    "LLMServerStuck",
    "LLMServerUnresponsive",
    "LLMServerHung",
    "LLMServerDown",
    "LLMServerRestartLoop",
    "StallwatchExporterDown",
    "StallwatchRestartBudgetExhausted",
    "StallwatchRestarterDown",
    "StallwatchRestartAlertsUnhandled",
    "LLMServersMassStall",
    "StallwatchRestarterBreakerOpen",
    "StallwatchRestarterPaused",
    "LLMServerRecoveredNearRestart",
    "LLMServerDegraded",
    "LLMServerAdmissionStalled",
}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def explain(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def alerting_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def test_prometheus_config_is_valid() -> None:
    """promtool accepts prometheus.yml and the rule files it loads."""
    result = run(promtool(), "check", "config", str(PROMETHEUS_DIR / "prometheus.yml"))
    assert result.returncode == 0, explain(result)
    assert "2 rule files found" in result.stdout, explain(result)


@pytest.mark.parametrize("rule_file", RULE_FILES, ids=lambda path: path.name)
def test_rule_file_is_valid(rule_file: Path) -> None:
    """promtool accepts each rule file."""
    result = run(promtool(), "check", "rules", str(rule_file))
    assert result.returncode == 0, explain(result)


def test_rule_test_files_exist() -> None:
    """The rule tests cover the restart alerts, the alerts for people and the recording rules."""
    assert [path.name for path in RULE_TESTS] == [
        "degraded_alerts_test.yml",
        "fleet_alerts_test.yml",
        "human_alerts_test.yml",
        "mass_stall_alerts_test.yml",
        "recording_test.yml",
        "restart_alerts_test.yml",
        "restarter_alerts_test.yml",
        "window_alerts_test.yml",
    ]


@pytest.mark.parametrize("test_file", RULE_TESTS, ids=lambda path: path.name)
def test_every_rule_test_group_sets_the_exporter_interval(test_file: Path) -> None:
    """Every test group sets interval 15s (promtool 2.42 silently defaults it to 1m)."""
    document = yaml.safe_load(test_file.read_text())
    assert document["evaluation_interval"] == "15s"
    assert [group.get("interval") for group in document["tests"]] == ["15s"] * len(
        document["tests"]
    )


@pytest.mark.parametrize("test_file", RULE_TESTS, ids=lambda path: path.name)
def test_rule_tests_pass(test_file: Path) -> None:
    """promtool test rules passes for each test file."""
    result = run(promtool(), "test", "rules", str(test_file))
    assert result.returncode == 0, explain(result)
    assert "SUCCESS" in result.stdout, explain(result)


def test_alert_names_match_the_contract() -> None:
    """alerts.yml defines exactly the alerts every other part of stallwatch refers to."""
    assert {rule["alert"] for rule in alerting_rules()} == CONTRACT_ALERTS


@pytest.mark.parametrize("rule", alerting_rules(), ids=lambda rule: str(rule["alert"]))
def test_every_alert_has_severity_and_explains_itself(rule: dict[str, Any]) -> None:
    """Each alert carries a severity, a summary, and a description of what stallwatch does."""
    assert rule["labels"]["severity"] in {"critical", "warning"}
    assert set(rule["annotations"]) >= {"summary", "description"}
    assert "restart" in rule["annotations"]["description"]


def test_recording_rules_follow_the_naming_convention() -> None:
    """Every recorded series is named level:metric:operation."""
    document = yaml.safe_load((PROMETHEUS_DIR / "recording.yml").read_text())
    names = [rule["record"] for group in document["groups"] for rule in group["rules"]]
    assert names
    for name in names:
        assert re.fullmatch(r"[a-z_]+:stallwatch_[a-z_]+:[a-z0-9_]+", name), name


@pytest.mark.parametrize("alertname", ["LLMServerStuck", "LLMServerHung"])
def test_a_broken_threshold_fails_the_rule_tests(tmp_path: Path, alertname: str) -> None:
    """The rule tests catch a restart alert firing on a single poll in its state."""
    copy = tmp_path / "prometheus"
    shutil.copytree(PROMETHEUS_DIR, copy)
    alerts = copy / "alerts.yml"
    document = yaml.safe_load(alerts.read_text())
    (stuck,) = [
        rule
        for group in document["groups"]
        for rule in group["rules"]
        if rule.get("alert") == alertname
    ]
    assert "stallwatch_target_state_polls >= 2" in stuck["expr"]
    stuck["expr"] = stuck["expr"].replace(
        "stallwatch_target_state_polls >= 2", "stallwatch_target_state_polls >= 1"
    )
    alerts.write_text(yaml.safe_dump(document, sort_keys=False))
    assert run(promtool(), "check", "rules", str(alerts)).returncode == 0

    result = run(promtool(), "test", "rules", str(copy / "tests" / "restart_alerts_test.yml"))

    assert result.returncode != 0, explain(result)
    assert "FAILED" in result.stdout + result.stderr, explain(result)
    assert alertname in result.stdout + result.stderr, explain(result)
