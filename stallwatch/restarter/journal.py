"""The journal: every decision the restarter makes, durably, in SQLite.

Cooldowns, budgets, duplicates and fleet windows are all computed from it, so they survive a
restart of the restarter. Writes are small and synchronous (one row, one commit), made in
the event loop thread before the webhook answers: no other coroutine can run between
reading the history and writing the decision that depends on it.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stallwatch.core.alerts import Alert
from stallwatch.core.fleet import CONTROL_KINDS, ControlEvent, ControlKind
from stallwatch.core.policy import Decision, History, PastDecision, PastRestart

# The rows the duplicate rule reads: restarts (dry-run ones too) and refusals by confirmation.
DECISIVE_ROWS = "decision = 'restart' OR reason = 'dry_run' OR reason LIKE 'not_confirmed_%'"

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS journal (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    target TEXT NOT NULL,
    alertname TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    starts_at TEXT NOT NULL,
    decision TEXT NOT NULL,          -- restart | skip | resolved | action_result | control
                                     -- | load_measured
    reason TEXT NOT NULL,            -- skip reason; on action_result rows the result;
                                     -- on control rows breaker_open | paused | resumed
    detail TEXT NOT NULL,
    result TEXT,                     -- action_result rows: success|failure|timeout|interrupted
    duration_seconds REAL,           -- action_result and load_measured rows; a pause's length
    restart_id INTEGER,              -- action_result rows: the restart row they finish
    receiver TEXT NOT NULL DEFAULT '',
    external_url TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS journal_alert ON journal (fingerprint, starts_at);
CREATE INDEX IF NOT EXISTS journal_alert_decisive ON journal (fingerprint, starts_at)
    WHERE {DECISIVE_ROWS};
CREATE INDEX IF NOT EXISTS journal_decision_time ON journal (decision, time);
CREATE INDEX IF NOT EXISTS journal_restart_id ON journal (restart_id);
"""

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


def printable(text: str) -> str:
    """`text` with control and invisible characters escaped, safe for a log or a terminal
    (a label holding ESC or a newline could otherwise forge lines)."""
    if text.isprintable():
        return text
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in text
    )


class JournalError(Exception):
    """The journal cannot be read or written; the message names the file."""


class Journal:
    """The journal file; every failure to read or write it is a JournalError naming the file.

    `failure` holds the last error until a write succeeds again: while it is set the journal
    cannot be trusted to record a restart, so the restarter acts on nothing and says so.
    """

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self._db = connection
        self.path = path
        self.failure: str | None = None

    @classmethod
    def open(cls, path: str | Path) -> Journal:
        """Open (creating if needed) the journal at `path`; refuse one that is damaged."""
        file = Path(path)
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise JournalError(f"journal {file}: cannot create its directory: {error}") from None
        try:
            connection = sqlite3.connect(str(file), isolation_level=None, check_same_thread=False)
        except sqlite3.Error as error:
            raise JournalError(f"journal {file}: cannot open: {error}") from None
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")
            connection.execute("PRAGMA busy_timeout=5000")
            _check_integrity(connection, file)
            connection.executescript(SCHEMA)
        except sqlite3.Error as error:
            connection.close()
            raise JournalError(f"journal {file}: {error}{_DAMAGED_ADVICE}") from None
        except JournalError:
            connection.close()
            raise
        return cls(connection, file)

    @classmethod
    def open_read_only(cls, path: str | Path) -> Journal:
        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(f"no journal at {file}")
        try:
            connection = sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True)
        except sqlite3.Error as error:
            raise JournalError(f"journal {file}: cannot open: {error}") from None
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

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Make the writes inside one commit (one wait for the disk); none of them on error."""
        with self._guard("begin a transaction"):
            self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
            raise
        with self._guard("commit", writes=True):
            self._db.execute("COMMIT")

    def _insert(self, values: dict[str, Any]) -> int:
        names = ", ".join(values)
        marks = ", ".join(f":{name}" for name in values)
        with self._guard("write a row", writes=not self._db.in_transaction):
            cursor = self._db.execute(f"INSERT INTO journal ({names}) VALUES ({marks})", values)
        row_id = cursor.lastrowid
        assert row_id is not None
        return row_id

    def record_decision(
        self,
        alert: Alert,
        decision: Decision | None,
        now: float,
        *,
        receiver: str = "",
        external_url: str = "",
    ) -> int:
        """Write one decision (None: a resolved alert, journaled and not acted on)."""
        row = self._decision_row(alert, decision, now, receiver, external_url)
        if decision is not None and decision.reason == "duplicate" and not self._db.in_transaction:
            # A duplicate changes no later decision (history() leaves duplicates out), so it is
            # written without waiting for the disk: a storm of repeat deliveries then costs no
            # fsync each. Every other decision is on disk before the webhook answers.
            with self._guard("write a row"):
                self._db.execute("PRAGMA synchronous=NORMAL")
            try:
                return self._insert(row)
            finally:
                with self._guard("write a row"):
                    self._db.execute("PRAGMA synchronous=FULL")
        return self._insert(row)

    @staticmethod
    def _decision_row(
        alert: Alert, decision: Decision | None, now: float, receiver: str, external_url: str
    ) -> dict[str, Any]:
        return {
            "time": now,
            "target": alert.target or "",
            "alertname": alert.alertname,
            "fingerprint": alert.fingerprint,
            "starts_at": alert.starts_at,
            "decision": "resolved" if decision is None else decision.action,
            "reason": "resolved" if decision is None else decision.reason,
            "detail": "" if decision is None else decision.detail,
            "receiver": receiver,
            "external_url": external_url,
        }

    def record_action_result(
        self, restart_id: int, result: str, detail: str, duration: float | None, now: float
    ) -> int:
        """Write the outcome of the action started by restart row `restart_id`."""
        with self._guard("read a row"):
            row = self._db.execute(
                "SELECT target, alertname, fingerprint, starts_at, receiver, external_url "
                "FROM journal WHERE id = ?",
                (restart_id,),
            ).fetchone()
        if row is None:
            raise KeyError(f"no journal row {restart_id}")
        target, alertname, fingerprint, starts_at, receiver, external_url = row
        return self._insert(
            {
                "time": now,
                "target": target,
                "alertname": alertname,
                "fingerprint": fingerprint,
                "starts_at": starts_at,
                "decision": "action_result",
                "reason": result,
                "detail": detail,
                "result": result,
                "duration_seconds": duration,
                "restart_id": restart_id,
                "receiver": receiver,
                "external_url": external_url,
            }
        )

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
                "CASE WHEN d.decision = 'skip' THEN d.time ELSE r.time END "
                "FROM journal d LEFT JOIN journal r "
                "ON r.restart_id = d.id AND r.decision = 'action_result' "
                f"WHERE {_RESTART_LIKE} AND d.time > :since ORDER BY d.time",
                {"since": since, "dry_run": dry_run},
            ).fetchall()
        return tuple(PastRestart(target, decided, finished) for target, decided, finished in rows)

    def history(self, alert: Alert, *, since: float, dry_run: bool = False) -> History:
        """What `policy.decide` needs to judge `alert`."""
        with self._guard("read"):
            same = self._db.execute(
                # Only the rows the duplicate rule reads: restarts (dry-run ones too) and
                # refusals by confirmation. Earlier duplicates are left out, so a storm of
                # deliveries of one alert costs the same per delivery however long it lasts.
                "SELECT time, decision, reason FROM journal "
                "WHERE fingerprint = ? AND starts_at = ? "
                f"AND ({DECISIVE_ROWS}) "
                "ORDER BY time",
                (alert.fingerprint, alert.starts_at),
            ).fetchall()
        return History(
            restarts=self.restarts_since(since, dry_run=dry_run),
            same_alert=tuple(PastDecision(time, action, reason) for time, action, reason in same),
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

    def record_control(
        self, kind: ControlKind, detail: str, now: float, *, duration: float | None = None
    ) -> int:
        """Write a control row: the breaker opened, a pause began, or an operator resumed."""
        if kind not in CONTROL_KINDS:
            raise ValueError(f"unknown control {kind!r}")
        return self._insert(
            {
                "time": now,
                "target": "",
                "alertname": "",
                "fingerprint": "",
                "starts_at": "",
                "decision": "control",
                "reason": kind,
                "detail": detail,
                "duration_seconds": duration,
            }
        )

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

    def failed_actions_in_a_row(self, limit: int) -> int:
        """How many of the latest action results since the last resume failed, newest first,
        up to the first success (interrupted ones, cut short by the restarter's own stop,
        are left out), counting at most `limit`."""
        with self._guard("read"):
            rows = self._db.execute(
                "SELECT result FROM journal WHERE decision = 'action_result' "
                "AND result != :interrupted AND id > COALESCE((SELECT MAX(id) FROM journal "
                "WHERE decision = 'control' AND reason = 'resumed'), 0) "
                "ORDER BY id DESC LIMIT :limit",
                {"interrupted": INTERRUPTED, "limit": limit},
            ).fetchall()
        failed = 0
        for (result,) in rows:
            if result == "success":
                break
            failed += 1
        return failed

    def stalled_targets(self, since: float, alertnames: tuple[str, ...]) -> frozenset[str]:
        """Targets with a restart alert whose latest row since `since` is a firing one (a
        decision about it), not `resolved`: the servers stalled now, as far as alerts tell."""
        if not alertnames:
            return frozenset()
        marks = ", ".join("?" for _ in alertnames)
        with self._guard("read"):
            rows = self._db.execute(
                "SELECT j.target, j.decision FROM journal j "
                f"WHERE j.time > ? AND j.alertname IN ({marks}) AND j.target != '' "
                "AND j.decision IN ('restart', 'skip', 'resolved') "
                "AND j.id = (SELECT MAX(k.id) FROM journal k WHERE k.fingerprint = j.fingerprint "
                "AND k.target = j.target AND k.decision IN ('restart', 'skip', 'resolved'))",
                (since, *alertnames),
            ).fetchall()
        return frozenset(target for target, decision in rows if decision != "resolved")

    def record_load_time(self, restart_id: int, seconds: float, now: float) -> int:
        """Write how long the target restarted by row `restart_id` took to serve metrics again."""
        with self._guard("read a row"):
            row = self._db.execute(
                "SELECT target, alertname, fingerprint, starts_at FROM journal WHERE id = ?",
                (restart_id,),
            ).fetchone()
        if row is None:
            raise KeyError(f"no journal row {restart_id}")
        target, alertname, fingerprint, starts_at = row
        return self._insert(
            {
                "time": now,
                "target": target,
                "alertname": alertname,
                "fingerprint": fingerprint,
                "starts_at": starts_at,
                "decision": "load_measured",
                "reason": "ready",
                "detail": f"first read with engine metrics {seconds:.0f} s after the restart",
                "duration_seconds": seconds,
                "restart_id": restart_id,
            }
        )

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


_DAMAGED_ADVICE = (
    "; the restarter will not act on a journal it cannot trust: move the file aside "
    "(a new journal is created) or restore it from a backup"
)


def _check_integrity(connection: sqlite3.Connection, file: Path) -> None:
    """Refuse a journal whose pages are damaged, before any decision is made from it."""
    problems = [row[0] for row in connection.execute("PRAGMA quick_check").fetchall()]
    if problems != ["ok"]:
        raise JournalError(f"journal {file} is damaged: {problems[0]}{_DAMAGED_ADVICE}")
