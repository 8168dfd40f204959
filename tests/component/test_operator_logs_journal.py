"""Operator's logs and journal: failed authentications logged (rate-limited), `journal --json`
and `--target`, a command's multi-line output as one field, JSON logs from a real process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from stallwatch.cli import main
from stallwatch.common.cli import JsonFormatter, record_fields
from stallwatch.restarter.journal import Journal
from tests.support.restarter import (
    alert,
    fake_vllm,
    payload,
    post_alerts,
    running_restarter,
    settle,
    target_entry,
    write_config,
)

MULTI_LINE_SCRIPT = "printf 'stopping gpu1\\nstopped\\nstarting\\n'; exit 3"


async def test_failed_authentications_are_logged_once_per_client_with_a_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Ten webhooks with a wrong token: all get 401, one warning names the client, none more."""
    config = write_config(
        tmp_path,
        [target_entry("gpu1", "http://127.0.0.1:1/metrics", {"kind": "command", "argv": ["true"]})],
    )
    with caplog.at_level(logging.WARNING, logger="stallwatch.restarter"):
        async with running_restarter(config) as (client, _):
            for _ in range(10):
                response = await client.post(
                    "/alerts", json=payload(alert()), headers={"Authorization": "Bearer nope"}
                )
                assert response.status == 401
            response = await client.get("/journal")
            assert response.status == 401
    failures = [r for r in caplog.records if "authentication failed" in r.getMessage()]
    assert len(failures) == 1
    assert "127.0.0.1" in failures[0].getMessage()
    assert "/alerts" in failures[0].getMessage()
    assert failures[0].__dict__["client"] == "127.0.0.1"


async def test_a_multi_line_action_output_is_one_field_and_one_table_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The journal keeps a command's lines in one detail; the table escapes them on one row;
    --json gives them back unescaped in one object."""
    async with fake_vllm("stalled") as fake:
        action = {"kind": "command", "argv": ["/bin/sh", "-c", MULTI_LINE_SCRIPT]}
        config = write_config(tmp_path, [target_entry("gpu1", fake.url, action)])
        async with running_restarter(config) as (client, restarter):
            await client.post(
                "/alerts",
                json=payload(alert()),
                headers={"Authorization": "Bearer test-token-0123456789"},
            )
            await settle(restarter)
    journal = Journal.open_read_only(config.journal)
    try:
        (result,) = [e for e in journal.recent(10) if e.decision == "action_result"]
    finally:
        journal.close()
    assert result.detail.endswith("stopping gpu1\nstopped\nstarting")
    config_file = str(tmp_path / "restarter.yml")
    assert main(["restarter", "journal", "--config", config_file]) == 0
    table = capsys.readouterr().out
    assert len(table.splitlines()) == 1 + len(journal_rows(config_file, capsys))
    assert "stopping gpu1\\nstopped\\nstarting" in table
    rows = journal_rows(config_file, capsys)
    (as_json,) = [row for row in rows if row["decision"] == "action_result"]
    assert as_json["detail"] == result.detail
    assert as_json["target"] == "gpu1"


async def test_decisions_and_results_are_logged_with_their_fields(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A decision's and an action result's log records carry target, reason and result as
    fields, so `--log-format json` and logfmt give them as keys, not only in the message."""
    async with fake_vllm("stalled") as fake:
        config = write_config(
            tmp_path, [target_entry("gpu1", fake.url, {"kind": "command", "argv": ["true"]})]
        )
        with caplog.at_level(logging.INFO, logger="stallwatch.restarter"):
            async with running_restarter(config) as (client, restarter):
                await post_alerts(client, payload(alert()))
                await settle(restarter)
    fields = [record_fields(r, JsonFormatter()) for r in caplog.records if "decision" in r.__dict__]
    decision, result = fields
    assert (decision["decision"], decision["target"], decision["reason"]) == (
        "restart",
        "gpu1",
        "confirmed",
    )
    assert decision["alertname"] == "LLMServerStuck"
    assert (result["decision"], result["target"], result["result"]) == (
        "action_result",
        "gpu1",
        "success",
    )
    assert result["restart_row"] == decision["journal_row"]
    assert json.loads(JsonFormatter().format(caplog.records[-1]))["message"]


def journal_rows(config_file: str, capsys: pytest.CaptureFixture[str], *extra: str) -> list[dict]:
    assert main(["restarter", "journal", "--config", config_file, "--json", *extra]) == 0
    lines = capsys.readouterr().out.splitlines()
    return [json.loads(line) for line in lines]


async def test_journal_target_shows_only_that_targets_latest_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--target gpu2 --limit 2 gives gpu2's two newest rows, even under newer rows of gpu1."""
    config = write_config(
        tmp_path,
        [target_entry("gpu1", "http://127.0.0.1:1/metrics", {"kind": "command", "argv": ["true"]})],
    )
    async with running_restarter(config) as (client, _):
        for index, target in enumerate(["gpu2", "gpu2", "gpu2", "gpu1", "gpu1", "gpu1"]):
            await client.post(
                "/alerts",
                json=payload(alert(target, fingerprint=f"f{index}")),
                headers={"Authorization": "Bearer test-token-0123456789"},
            )
    config_file = str(tmp_path / "restarter.yml")
    rows = journal_rows(config_file, capsys, "--target", "gpu2", "--limit", "2")
    assert [(row["target"], row["fingerprint"]) for row in rows] == [("gpu2", "f2"), ("gpu2", "f1")]
    assert journal_rows(config_file, capsys, "--target", "gpu7") == []
    assert main(["restarter", "journal", "--config", config_file, "--target", "gpu7"]) == 0
    assert capsys.readouterr().out.strip() == "no rows about gpu7"


def test_the_simulator_process_logs_one_json_object_per_line() -> None:
    """`stallwatch sim --log-format json --log-level info` writes JSON lines on stderr."""
    command = [sys.executable, "-m", "stallwatch.simulator", "--port", "0"]
    process = subprocess.Popen(
        [*command, "--log-format", "json", "--log-level", "info"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        first: list[str] = []
        reader = threading.Thread(target=lambda: first.append(process.stdout.readline()))
        reader.start()
        reader.join(20)
        url = first[0].strip().removeprefix("listening on ")
        request = urllib.request.Request(
            url + "/sim/fault",
            data=b'{"fault": "freeze"}',
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=10)
    records = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    applied = [r for r in records if r["message"].startswith("fault applied")]
    assert len(applied) == 1
    assert applied[0]["level"] == "info"
    assert set(applied[0]) >= {"time", "level", "logger", "message"}


async def test_a_webhook_is_logged_on_arrival_before_its_decision(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A delivered alert is logged when it arrives (name, status, target), before the decision
    that the confirming reads take seconds to reach."""
    config = write_config(
        tmp_path,
        [target_entry("gpu1", "http://127.0.0.1:1/metrics", {"kind": "command", "argv": ["true"]})],
    )
    with caplog.at_level(logging.INFO, logger="stallwatch.restarter"):
        async with running_restarter(config) as (client, _):
            answer = await post_alerts(client, payload(alert("gpu1")))
            assert answer["status"] == "ok"
    messages = [r.getMessage() for r in caplog.records]
    arrival = next(i for i, m in enumerate(messages) if m.startswith("webhook: 1 alert(s)"))
    assert "LLMServerStuck firing target=gpu1" in messages[arrival]
    decided = [i for i, m in enumerate(messages) if "gpu1" in m and i != arrival]
    assert decided, messages
    assert all(i > arrival for i in decided)
