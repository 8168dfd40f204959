"""The restarter under hostile or unlucky conditions: bad text, bad journals, slow clients."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import pytest

from stallwatch.cli import main
from stallwatch.core.alert_plan import ACTION_IN_PROGRESS
from stallwatch.core.policy import Decision
from stallwatch.restarter.journal import Journal
from stallwatch.restarter.journal_reader import JournalError
from stallwatch.restarter.service import Restarter
from tests.support.restarter import (
    AUTH,
    alert,
    alert_object,
    command_target,
    damage,
    fake_vllm,
    filled_journal,
    payload,
    post_alerts,
    running_restarter,
    settle,
    target_entry,
    write_config,
)


@pytest.mark.parametrize(
    "spoil",
    [
        lambda a, p: a.update(fingerprint="fp\ud800"),
        lambda a, p: a["labels"].update(alertname="LLMServerStuck\udfff"),
        lambda a, p: a["labels"].update(severity="\ud800"),
        lambda a, p: a["labels"].update({"\ud800": "x"}),
        lambda a, p: p.update(receiver="r\ud800"),
        lambda a, p: p.update(externalURL="\ud800"),
    ],
    ids=["fingerprint", "alertname", "other-label", "label-name", "receiver", "external-url"],
)
async def test_a_lone_surrogate_refuses_the_whole_payload(tmp_path: Path, spoil: Any) -> None:
    """A lone surrogate next to a valid alert gets 400: nothing journaled, read or run."""
    marker = tmp_path / "marker"
    bad = alert(fingerprint="bad")
    document = payload(alert(fingerprint="good"), bad)
    spoil(bad, document)
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, marker)])
        async with running_restarter(config) as (client, restarter):
            response = await client.post("/alerts", json=document, headers=AUTH)
            assert response.status == 400, await response.text()
            assert "Unicode" in (await response.json())["error"]
            await restarter.wait_for_actions()
            assert restarter.journal.count() == 0
            assert fake.reads == 0
    assert not marker.exists()


async def test_journal_limit_must_be_ascii_digits(tmp_path: Path) -> None:
    """GET /journal?limit= with a digit that is not 0-9, or too many digits, gets 400."""
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, tmp_path / "m")])
        async with running_restarter(config) as (client, _):
            for bad in ("\u00b2", "\u0661\u0662", "\uff15", "0" * 5000 + "1"):
                response = await client.get("/journal", params={"limit": bad}, headers=AUTH)
                assert response.status == 400, bad


async def test_a_damaged_journal_stops_the_restarter_at_start(tmp_path: Path) -> None:
    """A journal with damaged pages is refused when opened, with a message naming the file."""
    damage(filled_journal(tmp_path / "journal.sqlite"))
    config = write_config(
        tmp_path, [command_target("gpu1", "http://127.0.0.1:1/m", tmp_path / "m")]
    )
    with pytest.raises(JournalError, match=r"journal\.sqlite"):
        Restarter(config)


def test_a_damaged_journal_is_a_clear_error_for_the_journal_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`stallwatch restarter journal` on a damaged or foreign file: one line of error, exit 1."""
    write_config(tmp_path, [command_target("gpu1", "http://127.0.0.1:1/m", tmp_path / "m")])
    damage(filled_journal(tmp_path / "journal.sqlite"))
    code = main(["restarter", "journal", "--config", str(tmp_path / "restarter.yml")])
    err = capsys.readouterr().err
    assert code == 1
    assert "journal.sqlite" in err
    assert "Traceback" not in err
    (tmp_path / "journal.sqlite").write_bytes(b"not a database at all" * 400)
    code = main(["restarter", "journal", "--config", str(tmp_path / "restarter.yml")])
    err = capsys.readouterr().err
    assert code == 1
    assert "journal.sqlite" in err
    assert "Traceback" not in err


async def test_one_action_per_target_whatever_the_cooldown(tmp_path: Path) -> None:
    """With a cooldown shorter than the action and two in flight allowed, a second restart
    of the same target waits for the first: it is skipped as action_in_progress."""
    marker = tmp_path / "marker"
    slow = ["sh", "-c", f'sleep 4; echo "$STALLWATCH_TARGET" >> {marker}']
    async with fake_vllm("stalled") as fake:
        config = write_config(
            tmp_path,
            [target_entry("gpu1", fake.url, {"kind": "command", "argv": slow}, cooldown="50ms")],
            max_in_flight=2,
            confirm={"gap": "1s", "timeout": "2s"},
        )
        async with running_restarter(config) as (client, restarter):
            first = await post_alerts(client, payload(alert(fingerprint="f1")))
            assert first["decisions"][0]["decision"] == "restart"
            await asyncio.sleep(0.2)  # past the cooldown, the action still running
            second = await post_alerts(
                client, payload(alert(fingerprint="f2", starts_at="2026-11-30T06:00:00Z"))
            )
            assert second["decisions"][0]["reason"] == ACTION_IN_PROGRESS
            await settle(restarter)
            assert restarter.journal.count(reason=ACTION_IN_PROGRESS) == 1
            text = await (await client.get("/metrics")).text()
            assert f'reason="{ACTION_IN_PROGRESS}",target="gpu1"}} 1.0' in text
    assert marker.read_text().splitlines() == ["gpu1"]


def fill_up(journal: Journal) -> None:
    """Let the journal's file grow no more, then use up its last free space."""
    connection = journal._db  # the journal has no way to be made full on purpose
    pages = connection.execute("PRAGMA page_count").fetchone()[0]
    connection.execute(f"PRAGMA max_page_count={pages}")
    with contextlib.suppress(JournalError):
        for index in range(100_000):
            journal.record_decision(alert_object(f"filler{index}"), None, 1.0)


async def test_a_journal_that_cannot_be_written_acts_on_nothing_and_says_so(
    tmp_path: Path,
) -> None:
    """A full journal: the webhook answers 503, nothing runs, the skip is counted with its
    reason, /-/healthy fails; once the disk has room again all is well."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, marker)])
        async with running_restarter(config) as (client, restarter):
            assert (await client.get("/-/healthy")).status == 200
            fill_up(restarter.journal)
            response = await client.post("/alerts", json=payload(alert()), headers=AUTH)
            assert response.status == 503, await response.text()
            answer = await response.json()
            assert answer["decisions"][0]["reason"] == "journal_unwritable"
            assert "full" in answer["error"]
            await restarter.wait_for_actions()
            assert not marker.exists()
            assert (await client.get("/-/healthy")).status == 503
            text = await (await client.get("/metrics")).text()
            assert 'reason="journal_unwritable",target="gpu1"} 1.0' in text
            assert 'webhook_requests_total{code="503"} 1.0' in text
            restarter.journal._db.execute("PRAGMA max_page_count=1073741823")
            answer = await post_alerts(client, payload(alert()))
            assert answer["decisions"][0]["decision"] == "restart"
            await settle(restarter)
            assert (await client.get("/-/healthy")).status == 200
    assert marker.read_text().splitlines() == ["gpu1"]


async def test_an_action_orphaned_by_a_killed_restarter_is_journaled_interrupted(
    tmp_path: Path,
) -> None:
    """A restart row with no result (the restarter died mid-action) is closed as interrupted
    at the next start, once."""
    config = write_config(
        tmp_path, [command_target("gpu1", "http://127.0.0.1:1/m", tmp_path / "m")]
    )
    journal = Journal.open(config.journal)
    restart_row = journal.record_decision(
        alert_object("f1", status="firing"), Decision("restart", "confirmed", "stalled"), 1.0e9
    )
    journal.close()
    for _ in range(2):
        restarter = Restarter(config)
        try:
            results = [e for e in restarter.journal.recent(10) if e.decision == "action_result"]
        finally:
            restarter.journal.close()
        assert [(e.restart_id, e.result) for e in results] == [(restart_row, "interrupted")]


async def test_control_characters_in_labels_are_escaped_in_log_and_table(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """ESC and newline in a label reach neither the log nor the journal table raw."""
    hostile = "gpu9\x1b[2J\nforged row\u202e"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, tmp_path / "m")])
        with caplog.at_level(logging.INFO, logger="stallwatch.restarter"):
            async with running_restarter(config) as (client, _):
                await post_alerts(client, payload(alert(hostile, fingerprint="f\x1b\n")))
    logged = [record.getMessage() for record in caplog.records]
    assert any("forged row" in message for message in logged)
    for message in logged:
        assert "\x1b" not in message
        assert "\n" not in message
        assert "\u202e" not in message
    assert main(["restarter", "journal", "--config", str(tmp_path / "restarter.yml")]) == 0
    table = capsys.readouterr().out
    assert "forged row" in table
    assert "\x1b" not in table
    assert "\u202e" not in table
    assert len(table.splitlines()) == 2


async def test_a_burst_of_alerts_about_one_target_costs_one_confirmation(tmp_path: Path) -> None:
    """Twenty distinct alerts about a target that is making progress: one pair of reads
    refuses them all, instead of one pair each, one after another."""
    async with fake_vllm("progress") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, tmp_path / "m")])
        async with running_restarter(config) as (client, _):
            alerts = [alert(fingerprint=f"f{index}") for index in range(20)]
            answer = await post_alerts(client, payload(*alerts))
    assert {d["reason"] for d in answer["decisions"]} == {"not_confirmed_progress"}
    assert fake.reads == 2


async def test_a_large_payload_is_judged_whole(tmp_path: Path) -> None:
    """A payload of 3 000 alerts (several journal batches) gets one decision each, in order."""
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target("gpu1", fake.url, tmp_path / "m")])
        async with running_restarter(config) as (client, restarter):
            alerts = [alert(f"gpu-x{index}", fingerprint=f"f{index}") for index in range(3000)]
            answer = await post_alerts(client, payload(*alerts))
            assert [d["target"] for d in answer["decisions"]] == [f"gpu-x{i}" for i in range(3000)]
            assert restarter.journal.count(reason="unknown_target") == 3000
