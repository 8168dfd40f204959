"""The restarter under hostile or unlucky conditions: bad text, bad journals, slow clients."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from stallwatch.cli import main
from stallwatch.core.alerts import Alert
from stallwatch.restarter.journal import Journal, JournalError
from stallwatch.restarter.service import Restarter
from tests.component.restarter_support import (
    AUTH,
    alert,
    fake_vllm,
    marker_argv,
    payload,
    running_restarter,
    target_entry,
    write_config,
)


def command_target(name: str, url: str, marker: Path, **extra: Any) -> dict[str, Any]:
    return target_entry(name, url, {"kind": "command", "argv": marker_argv(marker)}, **extra)


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
            for bad in ("²", "١٢", "５", "0" * 5000 + "1"):
                response = await client.get("/journal", params={"limit": bad}, headers=AUTH)
                assert response.status == 400, bad


def damage(journal: Path) -> None:
    """Overwrite the pages after the first two with garbage, as a bad disk would."""
    data = bytearray(journal.read_bytes())
    page = 4096
    assert len(data) > 4 * page
    data[2 * page :] = b"\xa5" * (len(data) - 2 * page)
    journal.write_bytes(bytes(data))


def filled_journal(path: Path) -> Path:
    """A journal with enough rows to span several pages, checkpointed into the main file."""
    journal = Journal.open(path)
    for index in range(400):
        journal.record_decision(alert_object(f"fp{index}"), None, 1.0e9 + index)
    journal.close()
    return path


def alert_object(fingerprint: str) -> Alert:
    return Alert("resolved", {"alertname": "LLMServerStuck", "target": "gpu1"}, fingerprint, "x")


async def test_a_damaged_journal_stops_the_restarter_at_start(tmp_path: Path) -> None:
    """A journal with damaged pages is refused when opened, with a message naming the file."""
    damage(filled_journal(tmp_path / "journal.sqlite"))
    config = write_config(tmp_path, [command_target("gpu1", "http://127.0.0.1:1/m", tmp_path / "m")])
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
    assert "journal.sqlite" in err and "Traceback" not in err
    (tmp_path / "journal.sqlite").write_bytes(b"not a database at all" * 400)
    code = main(["restarter", "journal", "--config", str(tmp_path / "restarter.yml")])
    err = capsys.readouterr().err
    assert code == 1
    assert "journal.sqlite" in err and "Traceback" not in err
