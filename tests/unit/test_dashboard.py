"""grafana/dashboards/stallwatch.json is a well-formed dashboard that uses only real series.

Grafana cannot run here, so this checks the structure Grafana 10/11 needs and that every
query names a metric the exporter or restarter publishes (the shared metric contract), a
recording rule of prometheus/recording.yml, or a Prometheus builtin.
tests/e2e/test_dashboard_queries.py runs every query against a real Prometheus.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "grafana" / "dashboards" / "stallwatch.json"
RECORDING_RULES = REPO / "prometheus" / "recording.yml"
PROVISIONED_DATASOURCES = REPO / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# The shared metric contract: every series the exporter and the restarter publish.
EXPORTER_METRICS = frozenset(
    {
        "stallwatch_target_state",
        "stallwatch_target_state_polls",
        "stallwatch_target_stall_seconds",
        "stallwatch_target_recovered_stalls_total",
        "stallwatch_target_last_recovered_stall_seconds",
        "stallwatch_target_longest_recovered_stall_seconds",
        "stallwatch_target_up",
        "stallwatch_target_info",
        "stallwatch_target_interval_seconds",
        "stallwatch_requests_running",
        "stallwatch_requests_waiting",
        "stallwatch_engine_steps_per_second",
        "stallwatch_generation_tokens_per_second",
        "stallwatch_target_degraded",
        "stallwatch_generation_tokens_per_second_per_request",
        "stallwatch_generation_tokens_per_second_per_request_baseline",
        "stallwatch_preemptions_per_second",
        "stallwatch_kv_cache_usage_ratio",
        "stallwatch_request_queue_time_mean_seconds",
        "stallwatch_last_progress_timestamp_seconds",
        "stallwatch_restarts_detected_total",
        "stallwatch_test_requests_total",
        "stallwatch_test_request_failures_total",
        "stallwatch_polls_total",
        "stallwatch_poll_errors_total",
        "stallwatch_poll_duration_seconds",
        "stallwatch_last_poll_timestamp_seconds",
        "stallwatch_config_last_reload_successful",
        "stallwatch_config_last_reload_success_timestamp_seconds",
        "stallwatch_build_info",
    }
)
RESTARTER_HISTOGRAMS = frozenset({"stallwatch_restarter_action_duration_seconds"})
RESTARTER_METRICS = frozenset(
    {
        "stallwatch_restarter_restarts_total",
        "stallwatch_restarter_skips_total",
        "stallwatch_restarter_restart_after_seconds",
        "stallwatch_restarter_recovered_in_window_total",
        "stallwatch_restarter_hold_expiry_timestamp_seconds",
        "stallwatch_restarter_resolved_total",
        "stallwatch_restarter_webhook_requests_total",
        "stallwatch_restarter_budget_exhausted",
        "stallwatch_restarter_last_restart_timestamp_seconds",
        "stallwatch_restarter_build_info",
        "stallwatch_restarter_routable",
        "stallwatch_restarter_quarantine_seconds",
        *(
            f"{name}{suffix}"
            for name in RESTARTER_HISTOGRAMS
            for suffix in ("_bucket", "_sum", "_count")
        ),
    }
)
PROMETHEUS_BUILTINS = frozenset({"ALERTS", "ALERTS_FOR_STATE", "up"})
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
    "hung",
)
PROMQL_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "inf", "nan"}
)
GRID_WIDTH = 24


def load_dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including those inside collapsed rows."""
    result: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        result.append(panel)
        result.extend(panel.get("panels", []))
    return result


def query_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for panel in panels(dashboard) if panel["type"] != "row"]


def recording_rule_expressions() -> dict[str, str]:
    document = yaml.safe_load(RECORDING_RULES.read_text())
    rules = [rule for group in document["groups"] for rule in group["rules"]]
    return {rule["record"]: rule["expr"] for rule in rules if "record" in rule}


def recording_rule_names() -> set[str]:
    return set(recording_rule_expressions())


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels or keywords)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(
        r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text, flags=re.I
    )
    text = re.sub(r"\$\{?\w+\}?", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()", text):
        name = match.group(1)
        if name.lower() not in PROMQL_KEYWORDS:
            names.add(name)
    return names


def dashboard_expressions(dashboard: dict[str, Any]) -> list[str]:
    return [
        target["expr"] for panel in query_panels(dashboard) for target in panel.get("targets", [])
    ]


def test_the_metric_name_reader_finds_metrics_and_only_metrics() -> None:
    """The extractor used below separates metric names from functions, labels and keywords."""
    assert metric_names(
        'sum by (target, reason) (increase(foo_total{target=~"$target",x="a b"}[$__range])) * 60'
    ) == {"foo_total"}
    assert metric_names("a:b:c{x='y'} and ignoring(state) bar == 1 or vector(0)") == {
        "a:b:c",
        "bar",
    }
    assert metric_names('ALERTS{alertstate="firing"} offset 5m') == {"ALERTS"}
    assert metric_names("histogram_quantile(0.9, rate(h_bucket[1m]))") == {"h_bucket"}


def test_the_dashboard_is_a_grafana_10_or_11_dashboard() -> None:
    """Valid JSON with a uid, a title, schemaVersion 36-41 and a panel list."""
    dashboard = load_dashboard()
    assert dashboard["uid"] == "stallwatch"
    assert dashboard["title"]
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert query_panels(dashboard)
    assert "id" not in dashboard or dashboard["id"] is None


def test_panel_ids_are_unique() -> None:
    """Grafana keys panels by id; two panels with one id break editing and links."""
    ids = [panel["id"] for panel in panels(load_dashboard())]
    assert all(isinstance(panel_id, int) for panel_id in ids)
    assert len(ids) == len(set(ids)), ids


def test_every_panel_queries_the_data_source_variable() -> None:
    """Each panel and each of its queries reads `${datasource}`, never a fixed data source uid."""
    for panel in query_panels(load_dashboard()):
        assert panel.get("datasource") == DATASOURCE, panel["title"]
        targets = panel.get("targets", [])
        assert targets, f"{panel['title']} has no query"
        ref_ids = [target["refId"] for target in targets]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in targets:
            assert target.get("datasource") == DATASOURCE, panel["title"]
            assert target.get("expr", "").strip(), f"{panel['title']} {target['refId']}: no expr"


def test_no_data_source_uid_is_hard_coded() -> None:
    """The text names no data source uid but the variable and the import input, so the
    dashboard works in a Grafana whose Prometheus has any uid."""
    text = DASHBOARD.read_text()
    uids = set(re.findall(r'"uid":\s*"([^"]*)"', text)) - {"stallwatch"}
    assert uids <= {"${datasource}", "-- Grafana --"}, uids


def test_import_asks_for_a_prometheus_data_source() -> None:
    """`__inputs` declares DS_PROMETHEUS (a Prometheus data source), and the import's choice
    becomes the data source variable's initial value: its only use."""
    dashboard = load_dashboard()
    (prometheus_input,) = dashboard["__inputs"]
    assert prometheus_input["name"] == "DS_PROMETHEUS"
    assert prometheus_input["type"] == "datasource"
    assert prometheus_input["pluginId"] == "prometheus"
    variables = dashboard["templating"]["list"]
    (variable,) = [v for v in variables if v["type"] == "datasource"]
    assert variables[0] is variable  # the others are queried through it
    assert variable["name"] == "datasource"
    assert variable["query"] == "prometheus"
    assert variable["current"]["value"] == "${DS_PROMETHEUS}"
    assert DASHBOARD.read_text().count("${DS_PROMETHEUS}") == 2  # current's text and value


def test_the_provisioned_data_source_is_a_prometheus_the_variable_offers() -> None:
    """docker-compose provisions exactly one Prometheus data source, so the variable picks it."""
    document = yaml.safe_load(PROVISIONED_DATASOURCES.read_text())
    assert [source["type"] for source in document["datasources"]] == ["prometheus"]


def test_every_metric_is_in_the_contract_the_rules_or_prometheus() -> None:
    """No query names a series nobody publishes (a typo shows as an empty panel, silently)."""
    known = EXPORTER_METRICS | RESTARTER_METRICS | PROMETHEUS_BUILTINS | recording_rule_names()
    dashboard = load_dashboard()
    used: set[str] = set()
    for expr in dashboard_expressions(dashboard):
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        unknown = names - known
        assert not unknown, f"{expr!r} uses unknown metrics {sorted(unknown)}"
        used |= names
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(
                r"label_values\((\w+)(\{[^}]*\})?,\s*(\w+)\)", variable["definition"]
            )
            assert match, variable["definition"]
            assert match.group(1) in known
    # The series the dashboard promises are shown, directly or through a recording rule.
    rules = recording_rule_expressions()
    shown = used | {name for rule in used & set(rules) for name in metric_names(rules[rule])}
    for required in (
        "stallwatch_target_state",
        "stallwatch_requests_running",
        "stallwatch_requests_waiting",
        "stallwatch_engine_steps_per_second",
        "stallwatch_generation_tokens_per_second",
        "stallwatch_test_requests_total",
        "stallwatch_restarts_detected_total",
        "stallwatch_restarter_restarts_total",
        "stallwatch_restarter_skips_total",
        "stallwatch_poll_errors_total",
        "stallwatch_poll_duration_seconds",
        "stallwatch_target_degraded",
        "stallwatch_generation_tokens_per_second_per_request",
        "stallwatch_generation_tokens_per_second_per_request_baseline",
        "ALERTS",
    ):
        assert required in shown, required


def test_the_dashboard_uses_the_recording_rules_where_they_fit() -> None:
    """State code, steps/s, tokens/s, detected restarts, restarts and skips read the rules."""
    expressions = " ".join(dashboard_expressions(load_dashboard()))
    for rule in (
        "target:stallwatch_target_state_code:max",
        "target:stallwatch_engine_steps_per_second:max",
        "target:stallwatch_generation_tokens_per_second:max",
        "target:stallwatch_restarts_detected:increase1h",
        "target_result:stallwatch_restarter_restarts:increase1h",
        "target_reason:stallwatch_restarter_skips:increase1h",
    ):
        assert rule in recording_rule_names(), rule
        assert rule in expressions, rule


def variable(dashboard: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [v for v in dashboard["templating"]["list"] if v["name"] == name]
    return found


def test_the_target_variable_filters_every_per_target_query() -> None:
    """`target` lists the targets of the chosen engines; per-target queries use =~, and All
    expands to the listed targets (no catch-all regex that would ignore the engine)."""
    dashboard = load_dashboard()
    target = variable(dashboard, "target")
    assert target["type"] == "query"
    assert target["definition"] == 'label_values(stallwatch_target_info{engine=~"$engine"}, target)'
    assert target["query"]["query"] == target["definition"]
    assert target["datasource"] == DATASOURCE
    assert target["includeAll"] is True
    assert target["multi"] is True
    assert not target.get("allValue")
    for expr in dashboard_expressions(dashboard):
        if "$target" in expr:
            assert 'target=~"$target"' in expr, expr
            assert 'target="$target"' not in expr, expr
        elif "ALERTS" not in expr and "up{" not in expr:
            assert "stallwatch_config" in expr, f"{expr!r} ignores the target selection"


def test_the_engine_variable_lists_the_engines_read() -> None:
    """`engine` offers the engines of stallwatch_target_info (not the empty one), many at once;
    it comes before `target`, which it filters."""
    dashboard = load_dashboard()
    engine = variable(dashboard, "engine")
    assert engine["type"] == "query"
    assert engine["definition"] == 'label_values(stallwatch_target_info{engine!=""}, engine)'
    assert engine["query"]["query"] == engine["definition"]
    assert engine["datasource"] == DATASOURCE
    assert engine["multi"] is True
    assert engine["includeAll"] is True
    # All keeps the targets whose engine is still empty (not read yet).
    assert engine["allValue"] == ".*"
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names.index("engine") < names.index("target")


def test_a_panel_shows_each_targets_engine() -> None:
    """One table lists target, engine, kind and URL from stallwatch_target_info."""
    (table,) = [
        panel
        for panel in query_panels(load_dashboard())
        if any("stallwatch_target_info" in target["expr"] for target in panel["targets"])
    ]
    assert table["type"] == "table"
    (query,) = table["targets"]
    assert "engine" in query["expr"]
    assert 'target=~"$target"' in query["expr"]
    assert query["format"] == "table"


def test_the_state_timeline_maps_every_state_code_of_the_recording_rule() -> None:
    """The state-timeline's value mappings match the codes target:..._state_code:max assigns."""
    document = yaml.safe_load(RECORDING_RULES.read_text())
    (rule,) = [
        rule
        for group in document["groups"]
        for rule in group["rules"]
        if rule.get("record") == "target:stallwatch_target_state_code:max"
    ]
    codes = {
        state: int(code)
        for state, code in re.findall(r'state="(\w+)"\}\s*\*\s*(\d+)', rule["expr"])
    }
    assert set(codes) == set(STATES)
    (timeline,) = [
        panel
        for panel in query_panels(load_dashboard())
        if panel["type"] == "state-timeline"
        and any("state_code" in target["expr"] for target in panel["targets"])
    ]
    (mapping,) = timeline["fieldConfig"]["defaults"]["mappings"]
    assert mapping["type"] == "value"
    assert {int(code): entry["text"] for code, entry in mapping["options"].items()} == {
        code: state for state, code in codes.items()
    }


@pytest.mark.parametrize(
    ("needle", "panel_type"),
    [
        ("stallwatch_test_requests_total", "timeseries"),
        ('ALERTS{alertstate="firing"}', "state-timeline"),
        ("stallwatch_restarter_restarts", "timeseries"),
        ("stallwatch_restarter_skips", "timeseries"),
    ],
)
def test_the_promised_panels_exist(needle: str, panel_type: str) -> None:
    """Test requests, alerts, restarts performed and skips each have a panel of the right type."""
    matching = [
        panel
        for panel in query_panels(load_dashboard())
        if any(needle in target["expr"] for target in panel["targets"])
    ]
    assert [panel["type"] for panel in matching] == [panel_type]


def test_test_requests_are_counted_with_increase() -> None:
    """The test-request panel plots increase() of the counter, which stays at 0 while busy."""
    expressions = dashboard_expressions(load_dashboard())
    assert any(
        re.search(r"increase\(stallwatch_test_requests_total\{[^}]*\}\[\$__\w+\]\)", expr)
        for expr in expressions
    )


def test_panels_fit_the_grid_without_overlapping() -> None:
    """Every panel lies inside the 24-column grid and no two panels share a cell."""
    cells: dict[tuple[int, int], str] = {}
    for panel in query_panels(load_dashboard()):
        grid = panel["gridPos"]
        assert grid["w"] > 0
        assert grid["h"] > 0
        assert grid["x"] >= 0
        assert grid["x"] + grid["w"] <= GRID_WIDTH, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_every_panel_says_what_it_shows() -> None:
    """Each panel has a title and a description (Grafana shows it as the panel's help)."""
    for panel in query_panels(load_dashboard()):
        assert panel["title"].strip()
        assert len(panel.get("description", "")) >= 40, panel["title"]


def test_the_out_of_rotation_row_shows_the_verdict_and_time_out_per_target() -> None:
    """A row "Out of rotation" holds, per target, the routable 0/1 verdict (as in and out of
    rotation) and the time out of rotation, both filtered by the target variable."""
    dashboard = load_dashboard()
    top = dashboard["panels"]
    (row_index,) = [
        i for i, p in enumerate(top) if p["type"] == "row" and p["title"] == "Out of rotation"
    ]
    row = top[row_index]
    below = [p for p in top[row_index + 1 :] if p["gridPos"]["y"] > row["gridPos"]["y"]]
    by_metric = {
        name: [p for p in below if any(name in t["expr"] for t in p["targets"])]
        for name in ("stallwatch_restarter_routable", "stallwatch_restarter_quarantine_seconds")
    }
    (verdict,) = [
        p for p in by_metric["stallwatch_restarter_routable"] if p["type"] == "state-timeline"
    ]
    (mapping,) = verdict["fieldConfig"]["defaults"]["mappings"]
    assert {code: entry["text"] for code, entry in mapping["options"].items()} == {
        "0": "out of rotation",
        "1": "in rotation",
    }
    (seconds,) = by_metric["stallwatch_restarter_quarantine_seconds"]
    assert seconds["fieldConfig"]["defaults"]["unit"] == "s"
    for panel in (verdict, seconds):
        assert all('target=~"$target"' in t["expr"] for t in panel["targets"])
        assert "{{target}}" in panel["targets"][0]["legendFormat"]
