"""The journal is checked before it is written, refused alike by the restarter and the journal
command, and never adopted from another program."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from stallwatch.restarter.journal import Journal
from stallwatch.restarter.journal_reader import SCHEMA_VERSION, JournalError, JournalReader
from tests.component.test_restarter_hardening import (
    damage,
    filled_journal,
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
