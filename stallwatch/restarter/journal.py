"""The journal: every decision the restarter makes, durably, in SQLite; its schema and writes.

Cooldowns, budgets, duplicates and fleet windows are all computed from it (the queries are in
`journal_reader`), so they survive a restart of the restarter. Writes are small and synchronous
(one row, one commit), made in the event loop thread before the webhook answers: no other
coroutine can run between reading the history and writing the decision that depends on it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stallwatch.core.alert_plan import RoutingChange, WindowKind
from stallwatch.core.alerts import Alert
from stallwatch.core.fleet import CONTROL_KINDS, ControlKind
from stallwatch.core.holds import HOLD_KINDS, HoldKind
from stallwatch.core.policy import Decision
from stallwatch.core.restart_window import RestartWindow
from stallwatch.restarter.journal_reader import (
    DAMAGED_ADVICE,
    DECISIVE_ROWS,
    SCHEMA_VERSION,
    JournalError,
    JournalReader,
    check_journal,
)

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS journal (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    target TEXT NOT NULL,
    alertname TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    starts_at TEXT NOT NULL,
    decision TEXT NOT NULL,          -- restart | skip | resolved | action_result | control
                                     -- | load_measured | hold | routing | window
    reason TEXT NOT NULL,            -- skip reason; on action_result rows the result;
                                     -- on control rows breaker_open | paused | resumed;
                                     -- on hold rows hold | hold_released;
                                     -- on routing rows quarantined | refused |
                                     -- restarting | released (result: why)
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
# MIGRATIONS[n] brings a journal of schema version n to n + 1, inside the transaction that
# stamps the new version. Version 0 (no version stamped) has the table already, or nothing at
# all: SCHEMA creates what is missing. A change of the table is one more step here, and
# SCHEMA_VERSION one more.
MIGRATIONS: tuple[str, ...] = (SCHEMA,)


class JournalLock:
    """One running restarter's claim on its journal file: a second restarter on the same file
    is refused at start (both would act on one alert, and each would take the other's running
    actions for interrupted ones). An advisory `flock` on the file itself, dropped by the kernel
    when the process ends however it ends; `pause`, `hold` and `journal` from the command line
    do not take it, so they work beside a running restarter."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def take(cls, path: str | Path) -> JournalLock:
        """Claim the journal at `path` (created if missing); a JournalError if another holds it."""
        file = Path(path)
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(file, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as error:
            raise JournalError(f"journal {file}: cannot open: {error}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JournalError(
                f"journal {file} is in use by another running restarter: two restarters on one "
                "journal would both act on one alert; stop the other one, or give this one a "
                "journal of its own"
            ) from None
        except OSError as error:
            os.close(fd)
            raise JournalError(f"journal {file}: cannot lock: {error}") from None
        return cls(fd, file)

    def release(self) -> None:
        """Give the journal up (after the restarter has closed it); again is nothing."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Journal(JournalReader):
    """The journal file, read and written; every failure is a JournalError naming the file."""

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
            # Every check reads only: a file refused (newer, damaged, another program's) is
            # left as it was. Only then is it set up for writing and brought up to date.
            connection.execute("PRAGMA busy_timeout=5000")
            version = check_journal(connection, file)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")
            _migrate(connection, version)
        except sqlite3.Error as error:
            connection.close()
            raise JournalError(f"journal {file}: {error}{DAMAGED_ADVICE}") from None
        except JournalError:
            connection.close()
            raise
        return cls(connection, file)

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

    def record_hold(
        self, kind: HoldKind, target: str, detail: str, now: float, *, duration: float = 0.0
    ) -> int:
        """Write a hold row: `target` held for `duration` seconds, or its hold released."""
        if kind not in HOLD_KINDS:
            raise ValueError(f"unknown hold row {kind!r}")
        return self._insert(
            {
                "time": now,
                "target": target,
                "alertname": "",
                "fingerprint": "",
                "starts_at": "",
                "decision": "hold",
                "reason": kind,
                "detail": detail,
                "duration_seconds": duration,
            }
        )

    def record_routing(self, change: RoutingChange, now: float) -> int:
        """Write a routing row: a target out of rotation, refused leave, restarting, or back
        (`result`: why; `duration_seconds`: how long it was out, on a release)."""
        return self._insert(
            {
                "time": now,
                "target": change.target,
                "alertname": "",
                "fingerprint": "",
                "starts_at": "",
                "decision": "routing",
                "reason": change.move,
                "detail": change.detail,
                "result": change.reason,
                "duration_seconds": change.out_for if change.move == "released" else None,
            }
        )

    def record_window(
        self, kind: WindowKind, window: RestartWindow, alertname: str, now: float
    ) -> int:
        """Write a window row: `window` opened (at its opening time) or closed (now)."""
        fingerprint, _, starts_at = window.alert.partition("@")
        return self._insert(
            {
                "time": window.opened_at if kind == "opened" else now,
                "target": window.target,
                "alertname": alertname,
                "fingerprint": fingerprint,
                "starts_at": starts_at,
                "decision": "window",
                "reason": kind,
                "detail": f"restart window of {window.restart_after:g} s",
                "duration_seconds": window.restart_after,
            }
        )

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


def _migrate(connection: sqlite3.Connection, version: int) -> None:
    """Bring the journal from `version` to SCHEMA_VERSION in one transaction (none: all done)."""
    if version == SCHEMA_VERSION:
        return
    steps = "\n".join(MIGRATIONS[version:])
    connection.executescript(
        f"BEGIN IMMEDIATE;\n{steps}\nPRAGMA user_version = {SCHEMA_VERSION};\nCOMMIT;"
    )
