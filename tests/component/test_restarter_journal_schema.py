"""The journal's schema version: stamped on a new file, an old file brought up, a newer refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from stallwatch.restarter.journal import MIGRATIONS, Journal
from stallwatch.restarter.journal_reader import SCHEMA_VERSION, JournalError, JournalReader


def _user_version(path: Path) -> int:
    connection = sqlite3.connect(path)
    try:
        (version,) = connection.execute("PRAGMA user_version").fetchone()
    finally:
        connection.close()
    return int(version)


def _stamp(path: Path, version: int) -> None:
    connection = sqlite3.connect(path)
    try:
        connection.execute(f"PRAGMA user_version = {version}")
        connection.commit()
    finally:
        connection.close()


def test_there_is_one_migration_step_per_version() -> None:
    """MIGRATIONS has a step from each version below SCHEMA_VERSION to the next, no more."""
    assert len(MIGRATIONS) == SCHEMA_VERSION


def test_a_new_journal_is_stamped_with_the_current_version(tmp_path: Path) -> None:
    """A journal created now carries SCHEMA_VERSION in its user_version."""
    path = tmp_path / "journal.sqlite"
    Journal.open(path).close()
    assert _user_version(path) == SCHEMA_VERSION


def test_a_journal_from_before_the_version_opens_keeps_its_rows_and_is_stamped(
    tmp_path: Path,
) -> None:
    """A journal written before user_version existed (version 0) opens with its rows intact and
    is stamped with the current version, so the next open has nothing to do."""
    path = tmp_path / "journal.sqlite"
    journal = Journal.open(path)
    journal.record_control("paused", "before the version was stamped", 1000.0)
    journal.close()
    _stamp(path, 0)
    assert _user_version(path) == 0
    journal = Journal.open(path)
    try:
        rows = journal.recent(10)
    finally:
        journal.close()
    assert [(row.reason, row.detail) for row in rows] == [
        ("paused", "before the version was stamped")
    ]
    assert _user_version(path) == SCHEMA_VERSION


def test_a_journal_of_a_newer_version_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    """A journal stamped with a version this code does not know is refused, by the restarter
    and by `stallwatch restarter journal`, with an error naming the file and both versions."""
    path = tmp_path / "journal.sqlite"
    journal = Journal.open(path)
    journal.record_control("paused", "written by a newer stallwatch", 1000.0)
    journal.close()
    newer = SCHEMA_VERSION + 1
    _stamp(path, newer)
    for opener in (Journal.open, JournalReader.open_read_only):
        with pytest.raises(JournalError) as raised:
            opener(path)
        message = str(raised.value)
        assert message.startswith(f"journal {path}: schema version {newer}, newer than the ")
        assert f" {SCHEMA_VERSION} this stallwatch knows" in message
    assert _user_version(path) == newer
