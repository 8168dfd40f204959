"""Every query of the Grafana dashboard runs in real Prometheus and shows data from a real stack.

Grafana cannot run here, so this does what Grafana would: it takes every PromQL expression of
grafana/dashboards/stallwatch.json, fills in the template variables, and sends it to the e2e
harness's Prometheus (stallwatch's own rules, 1 s scrapes) as a range query over the scenario.

The scenario uses only real parts: the simulator under load, the real exporter watching it
(on the port the harness scrapes as job stallwatch-exporter), and the real restarter (on the
port scraped as job stallwatch-restarter, dry-run, with a Docker socket that does not exist).
The simulator is busy, then its engine hangs: the exporter says stalled twice, LLMServerStuck
fires, and one webhook makes the restarter journal a skip. So every panel, the restarter's
included, has something to show; none is allowed an empty result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from stallwatch.common.exporter_config import DegradedConfig, ExporterConfig
from stallwatch.common.restarter_config import restarter_config_from_mapping
from stallwatch.exporter.app import running_exporter
from stallwatch.restarter.app import build_app
from stallwatch.simulator.load import run_load
from stallwatch.simulator.testing import engine_sample, read_metrics, running_simulator
from tests.support.alerting_stack import AlertingStack
from tests.support.exporter import target as exporter_target

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "grafana" / "dashboards" / "stallwatch.json"
# Grafana's interval variables; 1m holds dozens of 1 s scrapes, enough for rate/increase.
INTERVAL_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1m"}
TIMEOUT = 30.0
BUSY_SCRAPES = 3
STATE_CODES = {"busy": 5, "stalled": 6}
LEARN_FAST = DegradedConfig(baseline_min_samples=4)


@dataclass(frozen=True)
class Query:
    panel: str
    ref_id: str
    expr: str  # as in the dashboard
    promql: str  # with the variables filled in


@dataclass(frozen=True)
class Answer:
    query: Query
    http_status: int
    status: str
    result: list[dict[str, Any]]
    error: str


@dataclass(frozen=True)
class Scenario:
    target: str
    answers: list[Answer]
    variable_values: dict[str, list[str]]
    webhook_decisions: list[dict[str, str]]


def dashboard_queries(target: str) -> list[Query]:
    """Every panel query, with $target set to this scenario's target (a regex, as Grafana's)."""
    # Grafana puts the value into the regex as is; keep it free of regex metacharacters.
    assert re.fullmatch(r"[A-Za-z0-9_-]+", target), target
    dashboard = json.loads(DASHBOARD.read_text())
    queries = []
    for panel in dashboard["panels"]:
        for panel_target in panel.get("targets", []):
            promql = panel_target["expr"].replace("$target", target)
            for variable, value in INTERVAL_VARIABLES.items():
                promql = promql.replace(variable, value)
            assert "$" not in promql, f"unfilled variable in {promql!r}"
            queries.append(
                Query(panel["title"], panel_target["refId"], panel_target["expr"], promql)
            )
    return queries


def range_query(stack: AlertingStack, promql: str, start: float, end: float) -> tuple[int, Any]:
    """GET /api/v1/query_range with a 1 s step: (HTTP status, JSON body)."""
    parameters = urllib.parse.urlencode({"query": promql, "start": start, "end": end, "step": "1"})
    url = f"{stack.prometheus_url}/api/v1/query_range?{parameters}"
    try:
        with urllib.request.urlopen(url, timeout=5.0) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


async def answer(stack: AlertingStack, query: Query, start: float) -> Answer:
    """Ask until the result is non-empty (or a parse error, or TIMEOUT): Prometheus scrapes 1/s."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        code, body = await asyncio.to_thread(range_query, stack, query.promql, start, time.time())
        result = body.get("data", {}).get("result", []) if code == 200 else []
        if code != 200 or result or time.monotonic() > deadline:
            return Answer(query, code, body.get("status", ""), result, body.get("error", ""))
        await asyncio.sleep(0.5)


@contextlib.asynccontextmanager
async def running_restarter(
    stack: AlertingStack, target: str, metrics_url: str, workdir: Path
) -> AsyncIterator[str]:
    """The real restarter app on the stack's restarter port, dry-run; yields its base URL."""
    (workdir / "restarter-token").write_text(stack.token + "\n")
    (workdir / "restarter-token").chmod(0o600)  # the restarter refuses a token others can read
    document = {
        "listen": stack.restarter_address,
        "token_file": "restarter-token",
        "journal": "journal.sqlite",
        "dry_run": True,
        "targets": [
            {
                "name": target,
                "metrics_url": metrics_url,
                "action": {"kind": "docker", "container": target, "socket": "no-docker.sock"},
            }
        ],
    }
    config = restarter_config_from_mapping(document, "restarter.yml", workdir)
    runner = web.AppRunner(build_app(config), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", stack.restarter_port).start()
        yield f"http://{stack.restarter_address}"
    finally:
        await runner.cleanup()


def webhook_payload(target: str) -> dict[str, Any]:
    """An Alertmanager v4 payload with one firing alert the restarter may not act on."""
    return {
        "version": "4",
        "status": "firing",
        "receiver": "stallwatch-restarter",
        "groupKey": f'{{}}:{{alertname="LLMServerDown", target="{target}"}}',
        "externalURL": "http://127.0.0.1:9093",
        "groupLabels": {"alertname": "LLMServerDown", "target": target},
        "commonLabels": {"alertname": "LLMServerDown", "target": target},
        "commonAnnotations": {},
        "truncatedAlerts": 0,
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "LLMServerDown", "target": target, "severity": "critical"},
                "annotations": {"summary": "down"},
                "startsAt": "2026-01-01T00:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://127.0.0.1:9090/graph",
                "fingerprint": uuid.uuid4().hex[:16],
            }
        ],
    }


async def wait_for_running_requests(session: aiohttp.ClientSession, url: str) -> None:
    running = engine_sample("vllm:num_requests_running")
    deadline = time.monotonic() + TIMEOUT
    while (await read_metrics(session, url)).get(running, 0.0) < 1:
        if time.monotonic() > deadline:
            raise TimeoutError("the simulator never had a request running")
        await asyncio.sleep(0.05)


async def run_scenario(stack: AlertingStack, workdir: Path) -> Scenario:
    name = f"dash-{uuid.uuid4().hex[:8]}"
    started = time.time()
    async with (
        running_simulator() as sim,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        running_restarter(stack, name, sim.url + "/metrics", workdir) as restarter_url,
    ):
        load = asyncio.create_task(
            run_load(sim.url, concurrency=4, prompt_tokens=32, max_tokens=1000, duration=600)
        )
        try:
            # Work first, then the exporter: its first read already sees a busy server.
            await wait_for_running_requests(session, sim.url)
            config = ExporterConfig(
                # The degraded panel's baseline is learned within the busy phase.
                targets=(exporter_target(name, sim.url, degraded=LEARN_FAST),),
                listen_host="127.0.0.1",
                listen_port=stack.exporter_port,
            )
            async with running_exporter(
                config, workdir / "exporter.yml", host="127.0.0.1", port=stack.exporter_port
            ):
                await stack.wait_for_query(
                    f'sum_over_time(stallwatch_target_state{{target="{name}",state="busy"}}[1m])'
                    f" >= {BUSY_SCRAPES}",
                    TIMEOUT,
                )
                sim.apply_fault("hang")
                await stack.wait_for_alert("LLMServerStuck", name, "firing", TIMEOUT)
                # Recording rules run in their own group: on a loaded machine they can lag the
                # alert, so wait until the state panel's rule has seen the stall too.
                await stack.wait_for_query(
                    f'target:stallwatch_target_state_code:max{{target="{name}"}}'
                    f" == {STATE_CODES['stalled']}",
                    TIMEOUT,
                )
                # Range queries step by 1 s from the scenario's start: give the stalled value
                # two steps, so the last step cannot fall just before its first sample.
                await asyncio.sleep(2.0)
                async with session.post(
                    restarter_url + "/alerts",
                    json=webhook_payload(name),
                    headers={"Authorization": f"Bearer {stack.token}"},
                ) as response:
                    assert response.status == 200, await response.text()
                    decisions = (await response.json())["decisions"]
                await stack.wait_for_query(
                    f'stallwatch_restarter_skips_total{{target="{name}"}}', TIMEOUT
                )
                answers = [await answer(stack, query, started) for query in dashboard_queries(name)]
                variables = await asyncio.to_thread(variable_values, stack)
        finally:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load
    return Scenario(name, answers, variables, decisions)


def label_values(stack: AlertingStack, variable_name: str, engine: str = ".*") -> list[str]:
    """What Grafana asks Prometheus for the dashboard variable `variable_name`'s
    label_values(SELECTOR, LABEL), with $engine set to the regex `engine` (All is .*)."""
    dashboard = json.loads(DASHBOARD.read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == variable_name]
    match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["definition"])
    assert match, variable["definition"]
    selector = match.group(1).replace("$engine", engine)
    assert "$" not in selector, selector
    parameters = urllib.parse.urlencode({"match[]": selector})
    url = f"{stack.prometheus_url}/api/v1/label/{match.group(2)}/values?{parameters}"
    with urllib.request.urlopen(url, timeout=5.0) as response:
        values: list[str] = json.load(response)["data"]
        return values


def variable_values(stack: AlertingStack) -> dict[str, list[str]]:
    """The engine variable's values, and the target variable's under All, vllm and sglang."""
    return {
        "engine": label_values(stack, "engine"),
        "target": label_values(stack, "target"),
        "target|vllm": label_values(stack, "target", "vllm"),
        "target|sglang": label_values(stack, "target", "sglang"),
    }


@pytest.fixture(scope="module")
def scenario(
    alerting_stack: AlertingStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scenario]:
    """Run the scenario once (about 15 s) and keep every dashboard query's answer."""
    workdir = tmp_path_factory.mktemp("dashboard-scenario")
    try:
        yield asyncio.run(run_scenario(alerting_stack, workdir))
    except BaseException:
        print(alerting_stack.logs())
        raise


def answers_for(scenario: Scenario, needle: str) -> list[Answer]:
    found = [item for item in scenario.answers if needle in item.query.expr]
    assert found, f"no dashboard query contains {needle!r}"
    return found


def values(answer: Answer) -> list[float]:
    return [float(value) for series in answer.result for _, value in series["values"]]


def test_every_dashboard_query_parses(scenario: Scenario) -> None:
    """Prometheus accepts every expression of the dashboard (HTTP 200, status success)."""
    failed = [
        f"{item.query.panel} {item.query.ref_id}: {item.http_status} {item.error} "
        f"({item.query.promql})"
        for item in scenario.answers
        if item.http_status != 200 or item.status != "success"
    ]
    assert not failed, "\n".join(failed)


def test_every_dashboard_query_returns_data(scenario: Scenario) -> None:
    """No panel stays empty: exporter, recording-rule, alert and restarter queries all have data."""
    assert len(scenario.answers) >= 10
    empty = [
        f"{item.query.panel} {item.query.ref_id}: {item.query.promql}"
        for item in scenario.answers
        if not item.result
    ]
    assert not empty, "empty results:\n" + "\n".join(empty)


def test_the_target_variable_lists_the_watched_target(scenario: Scenario) -> None:
    """The target variable, all engines chosen, offers the target the exporter watches."""
    assert scenario.target in scenario.variable_values["target"]


def test_the_engine_variable_filters_the_targets(scenario: Scenario) -> None:
    """The engine variable offers vllm (the simulator's engine); choosing vllm keeps the
    target, choosing sglang leaves it out."""
    assert "vllm" in scenario.variable_values["engine"]
    assert "" not in scenario.variable_values["engine"]
    assert scenario.target in scenario.variable_values["target|vllm"]
    assert scenario.target not in scenario.variable_values["target|sglang"]


def test_the_engine_table_names_the_targets_engine(scenario: Scenario) -> None:
    """The engine panel's query gives the watched target with engine vllm."""
    (table,) = answers_for(scenario, "stallwatch_target_info")
    engines = {series["metric"]["target"]: series["metric"]["engine"] for series in table.result}
    assert engines[scenario.target] == "vllm"


def test_the_state_timeline_shows_busy_then_stalled(scenario: Scenario) -> None:
    """The state panel's series goes from the busy code to the stalled code, in that order."""
    (state,) = answers_for(scenario, "target:stallwatch_target_state_code:max")
    (series,) = state.result
    assert series["metric"]["target"] == scenario.target
    codes = [int(float(value)) for _, value in series["values"]]
    assert STATE_CODES["busy"] in codes, series["values"]
    assert STATE_CODES["stalled"] in codes, series["values"]
    assert codes.index(STATE_CODES["busy"]) < codes.index(STATE_CODES["stalled"])


def test_the_test_request_panel_stays_flat_while_the_server_has_work(scenario: Scenario) -> None:
    """Busy, then stalled: the exporter sent no test request, and the panel shows only zeros."""
    (sent,) = [
        item
        for item in answers_for(scenario, "stallwatch_test_requests_total")
        if item.query.ref_id == "A"
    ]
    assert values(sent)
    assert set(values(sent)) == {0.0}


def test_the_alerts_panel_shows_the_stuck_alert(scenario: Scenario) -> None:
    """The hung engine's LLMServerStuck appears in the firing-alerts panel for its target."""
    (alerts,) = answers_for(scenario, "ALERTS")
    labels = [series["metric"] for series in alerts.result]
    assert {"alertname": "LLMServerStuck", "target": scenario.target} in labels


def test_the_skips_panel_shows_the_restarters_reason(scenario: Scenario) -> None:
    """The restarter's skip of a non-restart alert shows under its reason in the skips panel."""
    assert [d["reason"] for d in scenario.webhook_decisions] == ["not_restart_alert"]
    (skips,) = answers_for(scenario, "stallwatch_restarter_skips")
    reasons = {
        series["metric"].get("reason")
        for series in skips.result
        if series["metric"].get("target") == scenario.target
    }
    assert reasons == {"not_restart_alert"}


def test_the_degraded_panels_show_rate_baseline_and_no_reason(scenario: Scenario) -> None:
    """Busy, then hung: the rate per request and its learned baseline are drawn, every reason
    vLLM supports is listed, and none reads degraded (a hang is stalled, not slow)."""
    (rate,) = answers_for(scenario, "stallwatch_generation_tokens_per_second_per_request{")
    (baseline,) = answers_for(
        scenario, "stallwatch_generation_tokens_per_second_per_request_baseline"
    )
    (reasons,) = answers_for(scenario, "stallwatch_target_degraded")
    assert max(values(rate)) > 0
    assert min(values(baseline)) > 0
    listed = {series["metric"]["reason"] for series in reasons.result}
    assert listed == {"admission_stalled", "throughput_collapse", "preemption_storm", "queue_time"}
    assert set(values(reasons)) == {0.0}
