"""The restarter's webhook against real loopback servers and a real SQLite journal."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from stallwatch.core.policy import SKIP_REASONS
from stallwatch.restarter.metrics import RESULTS
from tests.support.restarter import (
    AUTH,
    alert,
    fake_vllm,
    marker_argv,
    marker_lines,
    payload,
    post_alerts,
    running_restarter,
    settle,
    target_entry,
    write_config,
)


def command_target(name: str, url: str, marker: Path, **extra: Any) -> dict[str, Any]:
    return target_entry(name, url, {"kind": "command", "argv": marker_argv(marker)}, **extra)


async def test_wrong_or_missing_token_is_refused_and_not_journaled(tmp_path: Path) -> None:
    """No token or a wrong token gets 401, runs nothing and writes no journal row."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, marker)])
        async with running_restarter(config) as (client, restarter):
            body = payload(alert())
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": AUTH["Authorization"] + "x"},
                {"Authorization": "Basic dGVzdDp0ZXN0"},
                {"Authorization": AUTH["Authorization"].lower()},
            ):
                response = await client.post("/alerts", json=body, headers=headers)
                assert response.status == 401, headers
            journal = await client.get("/journal", headers={"Authorization": "Bearer wrong"})
            assert journal.status == 401
            assert restarter.journal.count() == 0
            assert fake.reads == 0
            metrics = await (await client.get("/metrics")).text()
            assert 'stallwatch_restarter_webhook_requests_total{code="401"} 5.0' in metrics
    assert not marker.exists()


async def test_confirmed_stall_restarts_once_and_journals_before_answering(tmp_path: Path) -> None:
    """A stuck target is confirmed, the restart row is written before the 200, the result after."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, marker)])
        async with running_restarter(config) as (client, restarter):
            answer = await post_alerts(client, payload(alert()))
            assert answer["decisions"] == [
                {
                    "alertname": "LLMServerStuck",
                    "target": "gpu1",
                    "decision": "restart",
                    "reason": "confirmed",
                }
            ]
            assert restarter.journal.count(decision="restart", target="gpu1") == 1
            assert fake.reads == 2
            await settle(restarter)
            assert marker_lines(marker) == ["gpu1"]
            rows = (await (await client.get("/journal?limit=5", headers=AUTH)).json())["entries"]
            assert [row["decision"] for row in rows] == ["action_result", "restart"]
            assert rows[0]["result"] == "success"
            assert rows[0]["restart_id"] == rows[1]["id"]
            assert rows[0]["duration_seconds"] > 0


async def test_malformed_payloads_get_400_and_change_nothing(tmp_path: Path) -> None:
    """Bad JSON, a wrong version and ill-typed fields get 400; no row, no read, no action."""
    marker = tmp_path / "marker"
    good = alert()
    cases: list[bytes | dict[str, Any]] = [
        b"{not json",
        b"",
        b"[]",
        {**payload(good), "version": "3"},
        {k: v for k, v in payload(good).items() if k != "version"},
        {**payload(good), "alerts": {"0": good}},
        payload({**good, "labels": {"alertname": "LLMServerStuck", "target": 7}}),
        payload({**good, "status": "pending"}),
        payload({k: v for k, v in good.items() if k != "fingerprint"}),
        payload({**good, "startsAt": "yesterday"}),
        # a good alert first and a bad one after it: nothing of the payload is acted on
        payload(good, {**good, "labels": None}),
    ]
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, marker)])
        async with running_restarter(config) as (client, restarter):
            for case in cases:
                if isinstance(case, bytes):
                    response = await client.post("/alerts", data=case, headers=AUTH)
                else:
                    response = await client.post("/alerts", json=case, headers=AUTH)
                assert response.status == 400, case
                assert "error" in await response.json()
            assert restarter.journal.count() == 0
            assert fake.reads == 0
    assert not marker.exists()


async def test_oversized_body_gets_413(tmp_path: Path) -> None:
    """A body above max_body_bytes is refused with 413 before it is parsed."""
    async with fake_vllm("stalled") as fake:
        config = write_config(
            tmp_path,
            [command_target("gpu1", fake.url, tmp_path / "m")],
            max_body_bytes=2048,
        )
        async with running_restarter(config) as (client, restarter):
            big = payload(alert(), receiver="x" * 4096)
            response = await client.post("/alerts", json=big, headers=AUTH)
            assert response.status == 413
            assert restarter.journal.count() == 0


async def test_thousand_concurrent_duplicates_restart_once(tmp_path: Path) -> None:
    """1 000 deliveries of one alert, 100 at a time, give exactly one restart."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, marker)])
        async with running_restarter(config) as (client, restarter):
            body = payload(alert())
            answers: list[dict[str, Any]] = []
            for _ in range(10):
                answers += await asyncio.gather(*(post_alerts(client, body) for _ in range(100)))
            await settle(restarter)
            decisions = [a["decisions"][0]["decision"] for a in answers]
            assert decisions.count("restart") == 1
            reasons = {a["decisions"][0]["reason"] for a in answers} - {"confirmed"}
            assert reasons == {"duplicate"}
            assert marker_lines(marker) == ["gpu1"]
            assert restarter.journal.count(decision="restart") == 1
            assert restarter.journal.count(reason="duplicate") == 999


async def test_two_alertmanagers_deliver_the_same_alert(tmp_path: Path) -> None:
    """An HA pair sends the same fingerprint+startsAt from two receivers: one restart."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, marker)])
        async with running_restarter(config) as (client, restarter):
            first, second = await asyncio.gather(
                post_alerts(client, payload(alert(), external_url="http://am-a:9093")),
                post_alerts(
                    client,
                    payload(alert(), receiver="restarter-b", external_url="http://am-b:9093"),
                ),
            )
            await settle(restarter)
            reasons = sorted([first["decisions"][0]["reason"], second["decisions"][0]["reason"]])
            assert reasons == ["confirmed", "duplicate"]
            assert marker_lines(marker) == ["gpu1"]


async def test_confirmation_vetoes_a_recovered_and_a_down_server(tmp_path: Path) -> None:
    """A target whose /metrics shows progress, or does not answer, is not restarted."""
    marker = tmp_path / "marker"
    async with fake_vllm("progress") as recovered, fake_vllm("down") as down:
        config = write_config(
            tmp_path,
            [
                command_target("gpu1", recovered.url, marker),
                command_target("gpu2", down.url, marker),
            ],
            max_in_flight=2,
        )
        async with running_restarter(config) as (client, restarter):
            answer = await post_alerts(
                client, payload(alert("gpu1", fingerprint="a1"), alert("gpu2", fingerprint="a2"))
            )
            reasons = {d["target"]: d["reason"] for d in answer["decisions"]}
            assert reasons == {"gpu1": "not_confirmed_progress", "gpu2": "not_confirmed_down"}
            await settle(restarter)
            assert restarter.journal.count(decision="restart") == 0
    assert not marker.exists()


async def test_idle_server_vetoes_stuck_but_confirms_unresponsive(tmp_path: Path) -> None:
    """Two idle reads refuse LLMServerStuck and confirm LLMServerUnresponsive."""
    marker = tmp_path / "marker"
    async with fake_vllm("idle") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, marker)])
        async with running_restarter(config) as (client, restarter):
            stuck = await post_alerts(client, payload(alert(fingerprint="s1")))
            assert stuck["decisions"][0]["reason"] == "not_confirmed_idle"
            unresponsive = await post_alerts(
                client, payload(alert(alertname="LLMServerUnresponsive", fingerprint="u1"))
            )
            assert unresponsive["decisions"][0]["reason"] == "confirmed"
            await settle(restarter)
    assert marker_lines(marker) == ["gpu1"]


async def test_dry_run_journals_and_runs_nothing(tmp_path: Path) -> None:
    """In dry-run mode a confirmed stall is journaled as dry_run and nothing runs."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, marker)], dry_run=True)
        async with running_restarter(config) as (client, restarter):
            answer = await post_alerts(client, payload(alert()))
            assert answer["decisions"][0] == {
                "alertname": "LLMServerStuck",
                "target": "gpu1",
                "decision": "skip",
                "reason": "dry_run",
            }
            again = await post_alerts(client, payload(alert()))
            assert again["decisions"][0]["reason"] == "duplicate"
            await settle(restarter)
            assert restarter.journal.count(reason="dry_run") == 1
    assert not marker.exists()


async def test_resolved_alerts_are_journaled_only(tmp_path: Path) -> None:
    """A resolved alert is journaled as resolved; nothing is read or run."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, marker)])
        async with running_restarter(config) as (client, restarter):
            answer = await post_alerts(client, payload(alert(status="resolved")))
            assert answer["decisions"][0]["decision"] == "resolved"
            assert restarter.journal.count(decision="resolved", target="gpu1") == 1
            assert fake.reads == 0
            metrics = await (await client.get("/metrics")).text()
            assert 'stallwatch_restarter_resolved_total{target="gpu1"} 1.0' in metrics
    assert not marker.exists()


async def test_each_alert_judged_on_its_own_labels(tmp_path: Path) -> None:
    """Alerts outside the allow-list are skipped with their reason, whatever commonLabels say."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, marker)])
        async with running_restarter(config) as (client, _restarter):
            body = payload(
                alert(alertname="LLMServerDown", fingerprint="d"),
                alert(None, fingerprint="n"),
                alert("gpu9", fingerprint="u"),
            )
            body["commonLabels"] = {"alertname": "LLMServerStuck", "target": "gpu1"}
            answer = await post_alerts(client, body)
            reasons = [d["reason"] for d in answer["decisions"]]
            assert reasons == ["not_restart_alert", "no_target_label", "unknown_target"]
            assert fake.reads == 0
            metrics = await (await client.get("/metrics")).text()
            assert (
                'stallwatch_restarter_skips_total{reason="unknown_target",target=""} 1.0' in metrics
            )
    assert not marker.exists()


async def test_healthy_and_metrics_names(tmp_path: Path) -> None:
    """/-/healthy answers 200 and /metrics carries exactly the contract's restarter names."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, marker)])
        async with running_restarter(config) as (client, restarter):
            assert (await client.get("/-/healthy")).status == 200
            await post_alerts(client, payload(alert()))
            await post_alerts(client, payload(alert()))
            await settle(restarter)
            text = await (await client.get("/metrics")).text()
    names = {
        line.split("{")[0].split(" ")[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert names == {
        "stallwatch_restarter_restarts_total",
        "stallwatch_restarter_skips_total",
        "stallwatch_restarter_webhook_requests_total",
        "stallwatch_restarter_action_duration_seconds_bucket",
        "stallwatch_restarter_action_duration_seconds_count",
        "stallwatch_restarter_action_duration_seconds_sum",
        "stallwatch_restarter_budget_exhausted",
        "stallwatch_restarter_last_restart_timestamp_seconds",
        "stallwatch_restarter_build_info",
        "stallwatch_restarter_journal_errors_total",
        "stallwatch_restarter_breaker_open",
        "stallwatch_restarter_paused",
        "stallwatch_restarter_stalled_targets",
        "stallwatch_restarter_held_alerts",
        "stallwatch_restarter_restart_after_seconds",
        "stallwatch_restarter_restart_windows",
        "stallwatch_restarter_recovered_in_window_total",
        "stallwatch_restarter_routable",
        "stallwatch_restarter_routing",
        "stallwatch_restarter_quarantine_seconds",
    }
    assert 'stallwatch_restarter_restarts_total{result="success",target="gpu1"} 1.0' in text
    assert 'stallwatch_restarter_skips_total{reason="duplicate",target="gpu1"} 1.0' in text
    assert 'stallwatch_restarter_webhook_requests_total{code="200"} 2.0' in text
    assert 'stallwatch_restarter_budget_exhausted{target="gpu1"} 0.0' in text
    assert set(RESULTS) == {"success", "failure", "timeout"}
    assert len(SKIP_REASONS) == 29  # the policy's 21, the restarter's 2, the allow-rules' 6


async def test_journal_endpoint_validates_limit(tmp_path: Path) -> None:
    """GET /journal answers 400 for a bad limit and returns at most `limit` rows."""
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, tmp_path / "m")])
        async with running_restarter(config) as (client, _):
            for fingerprint in ("a", "b", "c"):
                await post_alerts(client, payload(alert("gpu9", fingerprint=fingerprint)))
            for bad in ("0", "-1", "x", "100000"):
                assert (await client.get(f"/journal?limit={bad}", headers=AUTH)).status == 400
            rows = (await (await client.get("/journal?limit=2", headers=AUTH)).json())["entries"]
            assert [row["fingerprint"] for row in rows] == ["c", "b"]


async def test_a_degradation_alert_routed_here_by_mistake_is_refused_and_counted(
    tmp_path: Path,
) -> None:
    """LLMServerDegraded for a known target: skipped as degradation_alert with why, counted,
    journaled, the server never read and nothing run."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, marker)])
        async with running_restarter(config) as (client, _restarter):
            answer = await post_alerts(
                client, payload(alert(alertname="LLMServerDegraded", fingerprint="g"))
            )
            (decision,) = answer["decisions"]
            assert (decision["decision"], decision["reason"]) == ("skip", "degradation_alert")
            assert fake.reads == 0
            metrics = await (await client.get("/metrics")).text()
            assert (
                'stallwatch_restarter_skips_total{reason="degradation_alert",target="gpu1"} 1.0'
                in metrics
            )
            rows = (await (await client.get("/journal?limit=5", headers=AUTH)).json())["entries"]
            (row,) = rows
            assert (row["decision"], row["reason"]) == ("skip", "degradation_alert")
            assert "slow, not stuck" in row["detail"]
    assert not marker.exists()
