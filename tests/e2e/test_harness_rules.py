"""stallwatch's rules and routing in real Prometheus and Alertmanager, driven by a fake exporter.

The fake exporter serves the exporter's state gauges with values the test sets, on the port the
stack scrapes as job stallwatch-exporter. Each test uses its own target names, so alerts from
one test never satisfy another.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from stallwatch.localstack.errors import LocalStackError
from stallwatch.localstack.rewrite import (
    DEFAULT_ALERT_FOR,
    DEFAULT_ROUTE_TIMERS,
    rewrite_alertmanager_config,
    rewrite_prometheus_config,
    rewrite_rule_files,
)
from tests.support.alerting_stack import AlertingStack

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e

STATES = (
    "down",
    "no_metrics",
    "restarted",
    "sleeping",
    "busy",
    "stalled",
    "idle",
    "unresponsive",
    "unknown",
)
TIMEOUT = 30.0


class FakeExporter:
    """Serves stallwatch_target_state (all 9 series), _state_polls and _up for each target."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._targets: dict[str, tuple[str, int]] = {}
        self._runner: web.AppRunner | None = None

    def set_state(self, target: str, state: str, polls: int) -> None:
        assert state in STATES
        self._targets[target] = (state, polls)

    def render(self) -> str:
        lines = [
            "# TYPE stallwatch_target_state gauge",
            *(
                f'stallwatch_target_state{{target="{target}",state="{name}"}} '
                f"{1 if name == state else 0}"
                for target, (state, _polls) in self._targets.items()
                for name in STATES
            ),
            "# TYPE stallwatch_target_state_polls gauge",
            *(
                f'stallwatch_target_state_polls{{target="{target}"}} {polls}'
                for target, (_state, polls) in self._targets.items()
            ),
            "# TYPE stallwatch_target_up gauge",
            *(
                f'stallwatch_target_up{{target="{target}"}} {0 if state == "down" else 1}'
                for target, (state, _polls) in self._targets.items()
            ),
        ]
        return "\n".join(lines) + "\n"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(text=self.render(), content_type="text/plain")


@pytest.fixture
async def exporter(alerting_stack: AlertingStack) -> AsyncIterator[FakeExporter]:
    """A fake exporter on the stack's exporter port, stopped after the test."""
    fake = FakeExporter(alerting_stack.exporter_port)
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def seen_by_prometheus(stack: AlertingStack, target: str, state: str, polls: int) -> None:
    """Wait until Prometheus has scraped this target in this state with this poll count."""
    await stack.wait_for_query(
        f'stallwatch_target_state{{target="{target}",state="{state}"}} == 1 '
        f'and ignoring(state) stallwatch_target_state_polls{{target="{target}"}} == {polls}',
        TIMEOUT,
    )


def prometheus_alerts_for(stack: AlertingStack, target: str) -> list[str]:
    return [
        f"{alert['labels']['alertname']} {alert['state']}"
        for alert in stack.alerts()
        if alert["labels"].get("target") == target
    ]


async def test_a_stall_of_two_polls_reaches_the_restarter_with_its_token(
    alerting_stack: AlertingStack, exporter: FakeExporter
) -> None:
    """Stalled in two consecutive polls fires LLMServerStuck; the webhook carries the token."""
    stack, target = alerting_stack, unique("stall")
    exporter.set_state(target, "busy", 4)
    await seen_by_prometheus(stack, target, "busy", 4)
    exporter.set_state(target, "stalled", 1)
    await seen_by_prometheus(stack, target, "stalled", 1)
    assert stack.receiver.find("LLMServerStuck", target) is None

    exporter.set_state(target, "stalled", 2)
    stall_visible = time.monotonic()
    notification = await stack.receiver.wait_for("LLMServerStuck", target, timeout=TIMEOUT)

    latency = notification.received_monotonic - stall_visible
    print(f"stall visible (polls=2 served) -> webhook: {latency:.2f} s")
    payload = notification.payload
    assert notification.authorization == f"Bearer {stack.token}"
    assert payload["receiver"] == "stallwatch-restarter"
    assert payload["groupLabels"] == {"alertname": "LLMServerStuck", "target": target}
    (alert,) = payload["alerts"]
    assert alert["status"] == "firing"
    assert alert["labels"]["severity"] == "critical"
    assert alert["labels"]["job"] == "stallwatch-exporter"
    assert "2 consecutive exporter polls" in alert["annotations"]["description"]

    exporter.set_state(target, "busy", 1)
    resolved = await stack.receiver.wait_for("LLMServerStuck", target, "resolved", TIMEOUT)
    assert resolved.payload["alerts"][0]["startsAt"] == alert["startsAt"]


async def test_a_one_poll_pause_and_a_busy_server_fire_nothing(
    alerting_stack: AlertingStack, exporter: FakeExporter
) -> None:
    """One stalled poll, or busy, never fires, while a control target that stalls does."""
    stack = alerting_stack
    paused, busy, control = unique("pause"), unique("busy"), unique("control")
    exporter.set_state(paused, "stalled", 1)
    exporter.set_state(busy, "busy", 40)
    exporter.set_state(control, "stalled", 2)

    # The control's webhook proves the rules were evaluated and routed on the same scrapes.
    await stack.receiver.wait_for("LLMServerStuck", control, timeout=TIMEOUT)
    await seen_by_prometheus(stack, paused, "stalled", 1)
    exporter.set_state(paused, "busy", 1)
    exporter.set_state(busy, "busy", 41)
    await seen_by_prometheus(stack, paused, "busy", 1)
    await seen_by_prometheus(stack, busy, "busy", 41)

    assert prometheus_alerts_for(stack, paused) == []
    assert prometheus_alerts_for(stack, busy) == []
    for target in (paused, busy):
        for notification in stack.receiver.notifications:
            assert target not in str(notification.payload)


async def test_an_unresponsive_idle_server_reaches_the_restarter(
    alerting_stack: AlertingStack, exporter: FakeExporter
) -> None:
    """Unresponsive in two consecutive polls fires LLMServerUnresponsive to the restarter."""
    stack, target = alerting_stack, unique("unresponsive")
    exporter.set_state(target, "unresponsive", 1)
    await seen_by_prometheus(stack, target, "unresponsive", 1)
    assert stack.receiver.find("LLMServerUnresponsive", target) is None

    exporter.set_state(target, "unresponsive", 2)
    notification = await stack.receiver.wait_for("LLMServerUnresponsive", target, timeout=TIMEOUT)

    assert notification.payload["receiver"] == "stallwatch-restarter"
    assert notification.payload["alerts"][0]["labels"]["target"] == target
    assert stack.receiver.find("LLMServerStuck", target) is None


async def test_a_down_server_goes_to_people_not_to_the_restarter(
    alerting_stack: AlertingStack, exporter: FakeExporter
) -> None:
    """LLMServerDown (its `for:` shortened) reaches Alertmanager for `default` only."""
    stack, target = alerting_stack, unique("down")
    exporter.set_state(target, "down", 1)

    alert = await stack.wait_for_am_alert("LLMServerDown", target, TIMEOUT)

    assert [receiver["name"] for receiver in alert["receivers"]] == ["default"]
    assert stack.receiver.find("LLMServerDown", target) is None


async def test_stopping_the_exporter_fires_stallwatch_exporter_down(
    alerting_stack: AlertingStack, exporter: FakeExporter
) -> None:
    """An exporter that stops answering fires StallwatchExporterDown, routed to `default`."""
    stack = alerting_stack
    target = unique("watched")
    exporter.set_state(target, "busy", 1)
    await seen_by_prometheus(stack, target, "busy", 1)
    await stack.wait_for_query('up{job="stallwatch-exporter"} == 1', TIMEOUT)

    await exporter.stop()
    await stack.wait_for_query('up{job="stallwatch-exporter"} == 0', TIMEOUT)
    alert = await stack.wait_for_alert("StallwatchExporterDown", "stallwatch-exporter")
    am_alert = await stack.wait_for_am_alert("StallwatchExporterDown", "stallwatch-exporter")

    assert alert["labels"]["severity"] == "critical"
    assert [receiver["name"] for receiver in am_alert["receivers"]] == ["default"]
    assert stack.receiver.find("StallwatchExporterDown", "stallwatch-exporter") is None
    assert stack.query(f'stallwatch_target_state{{target="{target}"}}') == []


async def test_the_receiver_refuses_a_request_without_the_token(
    alerting_stack: AlertingStack,
) -> None:
    """The restarter stand-in records only requests that carry the bearer token."""
    stack = alerting_stack
    before = stack.receiver.rejected
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.post(stack.receiver.url, json={"alerts": []}) as response,
    ):
        assert response.status == 401
    assert stack.receiver.rejected == before + 1


def without(document: Any, key: str) -> Any:
    """`document` with every mapping entry named `key` removed, at any depth."""
    if isinstance(document, dict):
        return {k: without(v, key) for k, v in document.items() if k != key}
    if isinstance(document, list):
        return [without(item, key) for item in document]
    return document


def without_all(document: Any, keys: tuple[str, ...]) -> Any:
    """`document` without any of `keys`, at any depth."""
    for key in keys:
        document = without(document, key)
    return document


def load(relative: str, rename: tuple[str, str] = ("", "")) -> Any:
    """A project file, parsed, with `rename[0]` replaced by `rename[1]` in its text."""
    old, new = rename
    text = (REPO / relative).read_text()
    return yaml.safe_load(text.replace(old, new) if old else text)


def rule_files() -> dict[str, Any]:
    return {name: load(f"prometheus/{name}") for name in ("alerts.yml", "recording.yml")}


def rewrite_routing(document: Any) -> dict[str, Any]:
    return rewrite_alertmanager_config(
        document,
        route_timers=DEFAULT_ROUTE_TIMERS,
        webhook_url="http://127.0.0.1:1/alerts",
        credentials_file="token",
    )


def test_the_harness_changes_only_the_for_durations_of_the_rules() -> None:
    """The e2e rules are the project's rules with only LLMServerDown's and ExporterDown's `for:`."""
    original = rule_files()

    rewritten = rewrite_rule_files(original, DEFAULT_ALERT_FOR)

    assert without(rewritten, "for") == without(original, "for")
    assert rewritten["recording.yml"] == original["recording.yml"]
    durations = {
        rule["alert"]: rule.get("for")
        for group in rewritten["alerts.yml"]["groups"]
        for rule in group["rules"]
    }
    assert durations == {
        "LLMServerStuck": None,
        "LLMServerUnresponsive": None,
        "LLMServerHung": None,
        "LLMServerRecoveredNearRestart": None,
        "LLMServerDown": "3s",
        "LLMServerRestartLoop": None,
        "StallwatchExporterDown": "2s",
        "StallwatchRestartBudgetExhausted": None,
        "StallwatchRestarterDown": "5m",
        "StallwatchRestartAlertsUnhandled": "10m",
        "LLMServersMassStall": None,
        "StallwatchRestarterBreakerOpen": None,
        "StallwatchRestarterPaused": "8h",
        "LLMServerAdmissionStalled": "1m",
        "LLMServerDegraded": "5m",
    }


def test_the_harness_changes_only_intervals_and_addresses_of_prometheus() -> None:
    """The e2e prometheus.yml keeps every job's settings; only intervals and addresses change."""
    original = load("prometheus/prometheus.yml")
    jobs = {"prometheus": "127.0.0.1:1", "stallwatch-exporter": "127.0.0.1:2"}
    jobs["stallwatch-restarter"] = "127.0.0.1:3"

    rewritten = rewrite_prometheus_config(
        original,
        interval="1s",
        rule_files=["/config/alerts.yml", "/config/recording.yml"],
        targets_by_job=jobs,
        alertmanager_address="127.0.0.1:4",
    )

    ignored = ("global", "rule_files", "alerting", "static_configs")
    assert without_all(rewritten, ignored) == without_all(original, ignored)
    assert rewritten["global"] == {
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "evaluation_interval": "1s",
    }
    assert {
        job["job_name"]: job["static_configs"][0]["targets"][0]
        for job in rewritten["scrape_configs"]
    } == jobs


def test_the_harness_changes_only_timers_url_and_token_file_of_the_routing() -> None:
    """The e2e routing is the project's routing with only grouping timers and webhook target."""
    original = load("alertmanager/alertmanager.yml")

    rewritten = rewrite_routing(original)

    ignored = ("group_wait", "group_interval", "url", "credentials_file")
    assert without_all(rewritten, ignored) == without_all(original, ignored)
    assert rewritten["route"]["group_wait"] == "0s"
    assert rewritten["route"]["group_interval"] == "1s"
    (restarter,) = [
        route
        for route in rewritten["route"]["routes"]
        if route["receiver"] == "stallwatch-restarter"
    ]
    assert restarter["group_wait"] == "0s"
    assert restarter["group_interval"] == "1s"


def test_a_renamed_alert_stops_the_rewrite() -> None:
    """An alert whose `for:` the harness shortens but no rule file defines any more is an error."""
    renamed = load("prometheus/alerts.yml", ("LLMServerDown", "LLMHostDown"))

    with pytest.raises(LocalStackError, match="LLMServerDown"):
        rewrite_rule_files({**rule_files(), "alerts.yml": renamed}, DEFAULT_ALERT_FOR)


def test_a_renamed_scrape_job_stops_the_rewrite() -> None:
    """A scrape job the harness points at loopback but prometheus.yml no longer has is an error."""
    renamed = load("prometheus/prometheus.yml", ("job_name: stallwatch-restarter", "job_name: x"))

    with pytest.raises(LocalStackError, match="stallwatch-restarter"):
        rewrite_prometheus_config(
            renamed,
            interval="1s",
            rule_files=["alerts.yml", "recording.yml"],
            targets_by_job={"stallwatch-restarter": "127.0.0.1:1"},
            alertmanager_address="127.0.0.1:2",
        )


def test_a_renamed_restarter_receiver_stops_the_rewrite() -> None:
    """A routing without the stallwatch-restarter receiver is an error, not an unpointed webhook."""
    renamed = load("alertmanager/alertmanager.yml", ("stallwatch-restarter", "restarter"))

    with pytest.raises(LocalStackError, match="stallwatch-restarter"):
        rewrite_routing(renamed)
