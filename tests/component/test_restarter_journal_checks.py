"""The journal is checked before it is written, refused alike by the restarter and the journal
command, never adopted from another program, and claimed by one running restarter only."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import aiohttp
import pytest

from stallwatch.cli import main
from stallwatch.localstack.processes import free_port
from stallwatch.restarter.app import serve
from stallwatch.restarter.journal import Journal, JournalLock
from stallwatch.restarter.journal_reader import SCHEMA_VERSION, JournalError, JournalReader
from tests.support.restarter import (
    command_target,
    damage,
    filled_journal,
    write_config,
)


def _rollback_mode(path: Path) -> None:
    """Turn a journal back to SQLite's rollback mode, checkpointed into the one file."""
    connection = sqlite3.connect(path)
    try:
        connection.execute("PRAGMA journal_mode=DELETE")
    finally:
        connection.close()


def _files(path: Path) -> dict[str, bytes]:
    """Every file of the journal (the database, and a WAL or shared-memory file if any)."""
    return {p.name: p.read_bytes() for p in sorted(path.parent.glob(path.name + "*"))}


def test_a_newer_rollback_mode_journal_is_refused_byte_for_byte_unchanged(
    tmp_path: Path,
) -> None:
    """A journal of a newer schema in rollback mode is refused before WAL mode is set: the
    file is not rewritten and no WAL file appears."""
    path = filled_journal(tmp_path / "journal.sqlite")
    _rollback_mode(path)
    connection = sqlite3.connect(path)
    connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    connection.commit()
    connection.close()
    before = _files(path)
    with pytest.raises(JournalError, match="newer than"):
        Journal.open(path)
    assert _files(path) == before


def test_a_damaged_journal_is_refused_before_any_write(tmp_path: Path) -> None:
    """A damaged rollback-mode journal is refused by quick_check before anything is written."""
    path = filled_journal(tmp_path / "journal.sqlite")
    _rollback_mode(path)
    damage(path)
    before = _files(path)
    with pytest.raises(JournalError, match="cannot trust"):
        Journal.open(path)
    assert _files(path) == before


def test_the_journal_command_refuses_a_damaged_journal_as_the_restarter_does(
    tmp_path: Path,
) -> None:
    """Reading a journal with damaged pages is refused naming the file, as the restarter does
    (it was read without a word when the damage missed the rows shown)."""
    path = filled_journal(tmp_path / "journal.sqlite")
    damage(path)
    with pytest.raises(JournalError, match=r"journal\.sqlite.*cannot trust"):
        JournalReader.open_read_only(path)


@pytest.mark.parametrize(
    "schema",
    [
        "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)",
        "CREATE TABLE journal (id INTEGER PRIMARY KEY, entry TEXT)",
    ],
    ids=["other-tables", "other-journal-table"],
)
def test_another_programs_database_is_refused_and_left_as_it_is(
    tmp_path: Path, schema: str
) -> None:
    """A SQLite file holding tables that are not the journal's is refused by the restarter and
    the journal command, naming the file; no table is added and no version stamped."""
    path = tmp_path / "app.sqlite"
    connection = sqlite3.connect(path)
    connection.execute(schema)
    connection.commit()
    connection.close()
    before = _files(path)
    for opener in (Journal.open, JournalReader.open_read_only):
        with pytest.raises(JournalError) as raised:
            opener(path)
        assert str(raised.value).startswith(f"journal {path} holds ")
        assert "another program's database" in str(raised.value)
    assert _files(path) == before


def test_the_journals_own_tables_are_accepted(tmp_path: Path) -> None:
    """A journal the restarter wrote, and an empty file, open: the check refuses only others."""
    filled_journal(tmp_path / "journal.sqlite")
    Journal.open(tmp_path / "journal.sqlite").close()
    JournalReader.open_read_only(tmp_path / "journal.sqlite").close()
    (tmp_path / "empty.sqlite").write_bytes(b"")
    Journal.open(tmp_path / "empty.sqlite").close()


async def _healthy(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never answered")


async def test_a_second_restarter_on_one_journal_refuses_to_start(tmp_path: Path) -> None:
    """While one restarter runs, a second on the same journal stops at start with an error
    saying another restarter holds it; once the first stops, the journal is free again."""
    port = free_port()
    config = write_config(
        tmp_path,
        [command_target("gpu1", "http://127.0.0.1:1/m", tmp_path / "m")],
        listen=f"127.0.0.1:{port}",
    )
    stop = asyncio.Event()
    first = asyncio.create_task(serve(config, stop=stop))
    try:
        await _healthy(f"http://127.0.0.1:{port}/-/healthy")
        with pytest.raises(JournalError, match="in use by another running restarter"):
            await serve(config, stop=asyncio.Event())
    finally:
        stop.set()
        await first
    JournalLock.take(config.journal).release()


def test_the_restarter_command_says_the_journal_is_in_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`stallwatch restarter` on a journal another restarter holds exits 1 with one line naming
    the journal and why."""
    write_config(
        tmp_path,
        [command_target("gpu1", "http://127.0.0.1:1/m", tmp_path / "m")],
        listen=f"127.0.0.1:{free_port()}",
    )
    lock = JournalLock.take(tmp_path / "journal.sqlite")
    try:
        code = main(["restarter", "--config", str(tmp_path / "restarter.yml")])
    finally:
        lock.release()
    err = capsys.readouterr().err
    assert code == 1
    assert "journal.sqlite is in use by another running restarter" in err
    assert "Traceback" not in err
