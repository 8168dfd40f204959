"""The journal's read side: its rows, and the look-backs every decision is made from.

Cooldowns, budgets, duplicates, the fleet's state and `stallwatch restarter journal` all read
the journal through `JournalReader`; `journal.Journal` adds the schema and the writes.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from stallwatch.common.text import printable
from stallwatch.core.alert_plan import WINDOW_KINDS, WindowEvent
from stallwatch.core.alerts import Alert
from stallwatch.core.fleet import CONTROL_KINDS, ControlEvent
from stallwatch.core.holds import HOLD_KINDS, HoldEvent
from stallwatch.core.policy import History, PastDecision, PastRestart
from stallwatch.core.quarantine import QUARANTINE_KINDS, QuarantineEvent
from stallwatch.restarter.metrics import PDB_BLOCKED

# The rows the duplicate rule reads: restarts (dry-run ones too) and refusals by confirmation.
DECISIVE_ROWS = "decision = 'restart' OR reason = 'dry_run' OR reason LIKE 'not_confirmed_%'"

# The columns of the journal table (its schema is in journal.py), in order.
COLUMNS = (
    "id",
    "time",
    "target",
    "alertname",
    "fingerprint",
    "starts_at",
    "decision",
    "reason",
    "detail",
    "result",
    "duration_seconds",
    "restart_id",
    "receiver",
    "external_url",
)

INTERRUPTED = "interrupted"

# A restart, or in dry-run mode a restart that would have happened.
_RESTART_LIKE = (
    "(d.decision = 'restart' OR (:dry_run AND d.decision = 'skip' AND d.reason = 'dry_run'))"
)


@dataclass(frozen=True)
class JournalEntry:
    id: int
    time: float
    target: str
    alertname: str
    fingerprint: str
    starts_at: str
    decision: str
    reason: str
    detail: str
    result: str | None
    duration_seconds: float | None
    restart_id: int | None
    receiver: str
    external_url: str

    def as_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in COLUMNS}


class JournalError(Exception):
    """The journal cannot be read or written; the message names the file."""


# The journal's schema, as `PRAGMA user_version`: 0 is a journal written before the version was
# stamped (its table is that of version 1). `journal.py` holds the step from each version to the
# next; a journal of a version above this one was written by a newer stallwatch and is refused.
SCHEMA_VERSION = 1


def schema_version(connection: sqlite3.Connection, file: Path) -> int:
    """The journal's schema version; a JournalError when it is newer than this code knows."""
    (version,) = connection.execute("PRAGMA user_version").fetchone()
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise JournalError(
            f"journal {file}: schema version {version}, newer than the {SCHEMA_VERSION} this "
            "stallwatch knows: it was written by a newer stallwatch; run that version (or move "
            "the file aside, and a new journal is created)"
        )
    return version


# The tables a journal holds (sqlite_sequence is SQLite's own, kept for AUTOINCREMENT); a table
# added to the schema is added here too. A file holding any other table is another program's
# database, and is refused rather than adopted.
JOURNAL_TABLES = frozenset({"journal", "sqlite_sequence"})

DAMAGED_ADVICE = (
    "; the restarter will not act on a journal it cannot trust: move the file aside "
    "(a new journal is created) or restore it from a backup"
)


def check_journal(connection: sqlite3.Connection, file: Path) -> int:
    """Check the file is a journal this code may use, reading only; its schema version.

    Refused with a JournalError naming the file: a newer schema, damaged pages (`quick_check`),
    and tables or a `journal` table that are not the journal's. Nothing is written before this
    has passed, so a refused file is left exactly as it was.
    """
    version = schema_version(connection, file)
    problems = [row[0] for row in connection.execute("PRAGMA quick_check").fetchall()]
    if problems != ["ok"]:
        raise JournalError(
            f"journal {file} is damaged: {printable(str(problems[0]))}{DAMAGED_ADVICE}"
        )
    objects = connection.execute(
        "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') ORDER BY name"
    ).fetchall()
    names = [str(name) for (name,) in objects]
    foreign = [name for name in names if name not in JOURNAL_TABLES]
    columns: set[str] = set()
    if "journal" in names:
        columns = {str(row[1]) for row in connection.execute("PRAGMA table_info(journal)")}
    missing = [name for name in COLUMNS if name not in columns] if "journal" in names else []
    if foreign or missing:
        what = (
            f"tables that are not the journal's ({', '.join(printable(n) for n in foreign[:5])}"
            f"{', ...' if len(foreign) > 5 else ''})"
            if foreign
            else f"a journal table without the column {missing[0]}"
        )
        raise JournalError(
            f"journal {file} holds {what}: it is another program's database, and the restarter "
            "does not adopt it; name a file of its own as the journal"
        )
    return version


class JournalReader:
    """The journal file, read; every failure to read it is a JournalError naming the file.

    `failure` holds the last error until a write succeeds again: while it is set the journal
    cannot be trusted to record a restart, so the restarter acts on nothing and says so.
    """

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self._db = connection
        self.path = path
        self.failure: str | None = None

    @classmethod
    def open_read_only(cls, path: str | Path) -> Self:
        """Open the journal at `path` for reading only; it must exist."""
        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(f"no journal at {file}")
        try:
            connection = sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True)
        except sqlite3.Error as error:
            raise JournalError(f"journal {file}: cannot open: {error}") from None
        try:
            check_journal(connection, file)
        except sqlite3.Error as error:
            connection.close()
            raise JournalError(f"journal {file}: cannot read: {error}{DAMAGED_ADVICE}") from None
        except JournalError:
            connection.close()
            raise
        return cls(connection, file)

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def _guard(self, doing: str, *, writes: bool = False) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as error:
            self.failure = f"journal {self.path}: cannot {doing}: {error}"
            raise JournalError(self.failure) from None
        if writes:
            self.failure = None

    def unfinished_restarts(self) -> list[JournalEntry]:
        """Restart rows with no result: their action was running when the restarter died."""
        with self._guard("read"):
            rows = self._db.execute(
                f"SELECT {', '.join('d.' + name for name in COLUMNS)} FROM journal d "
                "WHERE d.decision = 'restart' AND NOT EXISTS (SELECT 1 FROM journal r "
                "WHERE r.restart_id = d.id AND r.decision = 'action_result') ORDER BY d.id"
            ).fetchall()
        return [JournalEntry(*row) for row in rows]

    def restarts_since(self, since: float, *, dry_run: bool = False) -> tuple[PastRestart, ...]:
        """Restarts decided after `since`, each with the time its action finished (if it has)."""
        with self._guard("read"):
            rows = self._db.execute(
                "SELECT d.target, d.time, "
                "CASE WHEN d.decision = 'skip' THEN d.time ELSE r.time END, "
                "COALESCE(r.result = :blocked, 0), d.fingerprint || '@' || d.starts_at "
                "FROM journal d LEFT JOIN journal r "
                "ON r.restart_id = d.id AND r.decision = 'action_result' "
                f"WHERE {_RESTART_LIKE} AND d.time > :since ORDER BY d.time",
                {"since": since, "dry_run": dry_run, "blocked": PDB_BLOCKED},
            ).fetchall()
        return tuple(
            PastRestart(target, decided, finished, bool(blocked), alert)
            for target, decided, finished, blocked, alert in rows
        )

    def history(self, alert: Alert, *, since: float, dry_run: bool = False) -> History:
        """What `policy.decide` needs to judge `alert`."""
        with self._guard("read"):
            same = self._db.execute(
                # Only the rows the duplicate rule reads: restarts (dry-run ones too) and
                # refusals by confirmation. Earlier duplicates are left out, so a storm of
                # deliveries of one alert costs the same per delivery however long it lasts.
                "SELECT d.time, d.decision, d.reason, EXISTS (SELECT 1 FROM journal r "
                "WHERE r.restart_id = d.id AND r.decision = 'action_result' "
                "AND r.result = ?) FROM journal d "
                "WHERE d.fingerprint = ? AND d.starts_at = ? "
                f"AND ({DECISIVE_ROWS}) "
                "ORDER BY d.time",
                (PDB_BLOCKED, alert.fingerprint, alert.starts_at),
            ).fetchall()
        return History(
            restarts=self.restarts_since(since, dry_run=dry_run),
            same_alert=tuple(
                PastDecision(time, action, reason, bool(blocked))
                for time, action, reason, blocked in same
            ),
        )

    def last_restart_times(self, *, dry_run: bool = False) -> dict[str, float]:
        """The time of each target's latest restart decision."""
        with self._guard("read"):
            rows = self._db.execute(
                f"SELECT d.target, MAX(d.time) FROM journal d "
                f"WHERE {_RESTART_LIKE} GROUP BY d.target",
                {"dry_run": dry_run},
            ).fetchall()
        return {target: time for target, time in rows}

    def controls(self) -> tuple[ControlEvent, ...]:
        """The control rows since the latest `resumed` (that one included), oldest first."""
        with self._guard("read"):
            rows = self._db.execute(
                "SELECT reason, time, detail, duration_seconds FROM journal "
                "WHERE decision = 'control' AND id >= COALESCE((SELECT MAX(id) FROM journal "
                "WHERE decision = 'control' AND reason = 'resumed'), 0) ORDER BY id"
            ).fetchall()
        return tuple(
            ControlEvent(kind, time, detail, duration)
            for kind, time, detail, duration in rows
            if kind in CONTROL_KINDS
        )

    def hold_events(self, since: float) -> tuple[HoldEvent, ...]:
        """The hold rows written since `since` (a hold cannot be longer than max_hold), oldest
        first."""
        with self._guard("read"):
            rows = self._db.execute(
                "SELECT reason, target, time, duration_seconds, detail FROM journal "
                "WHERE decision = 'hold' AND time >= ? ORDER BY id",
                (since,),
            ).fetchall()
        return tuple(
            HoldEvent(kind, target, time, duration or 0.0, detail)
            for kind, target, time, duration, detail in rows
            if kind in HOLD_KINDS
        )

    def hold_events_after(self, after_id: int, since: float) -> tuple[tuple[HoldEvent, ...], int]:
        """The hold rows after row `after_id` written since `since`, oldest first, and the id of
        the last of them (`after_id` when there is none): what followed since the last look."""
        with self._guard("read"):
            rows = self._db.execute(
                "SELECT id, reason, target, time, duration_seconds, detail FROM journal "
                "WHERE decision = 'hold' AND id > ? AND time >= ? ORDER BY id",
                (after_id, since),
            ).fetchall()
        events = tuple(
            HoldEvent(kind, target, time, duration or 0.0, detail)
            for _, kind, target, time, duration, detail in rows
            if kind in HOLD_KINDS
        )
        return events, rows[-1][0] if rows else after_id

    def window_events(self, since: float) -> tuple[WindowEvent, ...]:
        """The window rows written since `since`, oldest first."""
        with self._guard("read"):
            rows = self._db.execute(
                "SELECT reason, target, fingerprint, starts_at, alertname, time, "
                "duration_seconds FROM journal WHERE decision = 'window' AND time >= ? "
                "ORDER BY id",
                (since,),
            ).fetchall()
        return tuple(
            WindowEvent(kind, target, f"{fingerprint}@{starts_at}", alertname, time, duration or 0)
            for kind, target, fingerprint, starts_at, alertname, time, duration in rows
            if kind in WINDOW_KINDS
        )

    def routing_events(self, since: float) -> tuple[QuarantineEvent, ...]:
        """The routing rows written since `since`, oldest first: who went out of rotation and
        who came back (a restarted restarter keeps its quarantines)."""
        with self._guard("read"):
            rows = self._db.execute(
                "SELECT reason, target, time, result, detail FROM journal "
                "WHERE decision = 'routing' AND time >= ? ORDER BY id",
                (since,),
            ).fetchall()
        return tuple(
            QuarantineEvent(kind, target, time, result or "", detail=detail)
            for kind, target, time, result, detail in rows
            if kind in QUARANTINE_KINDS
        )

    def failed_actions_in_a_row(self, limit: int) -> int:
        """How many of the latest action results since the last resume failed, newest first,
        up to the first success (interrupted ones, cut short by the restarter's own stop,
        are left out), counting at most `limit`."""
        with self._guard("read"):
            rows = self._db.execute(
                "SELECT result FROM journal WHERE decision = 'action_result' "
                "AND result NOT IN (:interrupted, :blocked) AND id > COALESCE((SELECT MAX(id) "
                "FROM journal WHERE decision = 'control' AND reason = 'resumed'), 0) "
                "ORDER BY id DESC LIMIT :limit",
                {"interrupted": INTERRUPTED, "blocked": PDB_BLOCKED, "limit": limit},
            ).fetchall()
        failed = 0
        for (result,) in rows:
            if result == "success":
                break
            failed += 1
        return failed

    def firing_alerts(
        self, since: float, alertnames: tuple[str, ...]
    ) -> dict[tuple[str, str], float]:
        """Restart alerts whose latest row since `since` is a firing one (a decision about
        it), not `resolved`: (target, fingerprint) -> the time of that row."""
        if not alertnames:
            return {}
        marks = ", ".join("?" for _ in alertnames)
        with self._guard("read"):
            rows = self._db.execute(
                "SELECT target, fingerprint, decision, time FROM journal WHERE id IN "
                "(SELECT MAX(id) FROM journal "
                f"WHERE time > ? AND alertname IN ({marks}) AND target != '' "
                "AND decision IN ('restart', 'skip', 'resolved') GROUP BY fingerprint, target)",
                (since, *alertnames),
            ).fetchall()
        return {
            (target, fingerprint): time
            for target, fingerprint, decision, time in rows
            if decision != "resolved"
        }

    def load_times(self) -> dict[str, float]:
        """Each target's latest measured model-load time."""
        with self._guard("read"):
            rows = self._db.execute(
                "SELECT target, duration_seconds FROM journal WHERE id IN (SELECT MAX(id) "
                "FROM journal WHERE decision = 'load_measured' GROUP BY target)"
            ).fetchall()
        return {target: seconds for target, seconds in rows}

    def recent(self, limit: int, *, target: str | None = None) -> list[JournalEntry]:
        """The latest `limit` rows (of `target` only, if given), newest first."""
        where = "" if target is None else "WHERE target = :target "
        with self._guard("read"):
            rows = self._db.execute(
                f"SELECT {', '.join(COLUMNS)} FROM journal {where}ORDER BY id DESC LIMIT :limit",
                {"limit": limit, "target": target},
            ).fetchall()
        return [JournalEntry(*row) for row in rows]

    def count(self, **equal: str) -> int:
        """Rows whose columns equal the given values (for tests and tooling)."""
        for name in equal:
            if name not in COLUMNS:
                raise ValueError(f"unknown column {name}")
        where = " AND ".join(f"{name} = :{name}" for name in equal) or "1"
        with self._guard("read"):
            row = self._db.execute(f"SELECT COUNT(*) FROM journal WHERE {where}", equal).fetchone()
        return int(row[0])
