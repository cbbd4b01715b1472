"""The ledger in one SQLite file: WAL mode, writes under BEGIN IMMEDIATE, owners as flock'd files.

This module is the SQLite store of dpproxy.budget.ledger.Ledger: its layout (entries, exact totals as
decimal text, stored answers, the audit log, the schema version), its one migration step of its
own, its transactions, and owner liveness: each live ledger instance holds an flock on a file of its
own beside the database, which the kernel drops when the process dies. What the ledger does with
them is written once, in dpproxy.budget.ledger.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from dpproxy.audit import Status
from dpproxy.budget.ledger import REPLAY_LIMIT, EntryStatus, Ledger, check_list
from dpproxy.errors import DPProxyError
from dpproxy.privacy.accounting import Cost

try:  # flock tells a live owner from a dead one; without it every other owner is taken as dead.
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]


class _OwnerLocks:
    """Owner liveness for a SQLite ledger: one flock'd file per live ledger instance.

    flock locks belong to an open file description, so the kernel drops them when the process
    dies, and two ledger instances in one process do not see each other's locks as their own.
    """

    def __init__(self, directory: Path) -> None:
        self._directory = directory

    def claim(self, owner: str) -> BinaryIO | None:
        """Lock a file for `owner`; a file object, so that dropping the ledger also frees it."""
        if fcntl is None:
            return None
        self._directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock_file = open(self._directory / owner, "ab", buffering=0)  # noqa: SIM115 - lives with the ledger
        try:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            lock_file.close()
            raise
        return lock_file

    def give_up(self, owner: str, lock_file: BinaryIO | None) -> None:
        if lock_file is None:
            return
        with suppress(FileNotFoundError):
            os.unlink(self._directory / owner)
        lock_file.close()

    @contextmanager
    def dead(self, owners: Iterable[str | None]) -> Iterator[list[str | None]]:
        """The owners among `owners` whose process is gone, held locked until the block ends."""
        dead: list[str | None] = []
        held: list[tuple[str, BinaryIO]] = []
        try:
            for owner in owners:
                if owner is None or fcntl is None or not _is_token(owner):
                    dead.append(owner)
                    continue
                try:
                    lock_file = open(self._directory / owner, "rb", buffering=0)  # noqa: SIM115
                except FileNotFoundError:
                    dead.append(owner)
                    continue
                try:
                    fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    lock_file.close()  # its owner is alive
                    continue
                held.append((owner, lock_file))
                dead.append(owner)
            yield dead
        finally:
            for owner, lock_file in held:
                self.give_up(owner, lock_file)


def _is_token(owner: str) -> bool:
    return re.fullmatch(r"[0-9a-f]{32}", owner) is not None


_SQLITE_TABLE = "dpproxy_ledger"
_SQLITE_META = "dpproxy_ledger_meta"
_SQLITE_TOTALS = "dpproxy_ledger_totals"
_SQLITE_REPLAY = "dpproxy_ledger_replay"
_SQLITE_AUDIT = "dpproxy_ledger_audit"

_SQLITE_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {_SQLITE_META} (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS {_SQLITE_TABLE} (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    analyst TEXT NOT NULL,
    epsilon REAL NOT NULL CHECK (epsilon >= 0),
    delta REAL NOT NULL CHECK (delta >= 0),
    rho REAL CHECK (rho IS NULL OR rho >= 0),
    status TEXT NOT NULL CHECK (status IN ({check_list(EntryStatus)})),
    statement TEXT NOT NULL DEFAULT '',
    owner TEXT,
    created_at TEXT NOT NULL,
    finished_at TEXT
);
CREATE INDEX IF NOT EXISTS {_SQLITE_TABLE}_analyst_status ON {_SQLITE_TABLE} (analyst, status);
CREATE INDEX IF NOT EXISTS {_SQLITE_TABLE}_reserved_owner ON {_SQLITE_TABLE} (owner)
    WHERE status = 'reserved';
CREATE TABLE IF NOT EXISTS {_SQLITE_TOTALS} (
    analyst TEXT PRIMARY KEY,
    -- exact decimal sums of the analyst's entries that are not released (ε: of those with ρ = 0)
    epsilon TEXT NOT NULL,
    delta TEXT NOT NULL,
    rho TEXT NOT NULL DEFAULT '0'
);
CREATE TABLE IF NOT EXISTS {_SQLITE_REPLAY} (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- age: the oldest are evicted first
    analyst TEXT NOT NULL,
    key TEXT NOT NULL,
    payload BLOB NOT NULL,
    created_at TEXT NOT NULL,
    UNIQUE (analyst, key)
);
CREATE INDEX IF NOT EXISTS {_SQLITE_REPLAY}_analyst_seq ON {_SQLITE_REPLAY} (analyst, seq);
CREATE TABLE IF NOT EXISTS {_SQLITE_AUDIT} (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,  -- UTC, ISO 8601 with microseconds: sorts as text
    analyst TEXT NOT NULL,
    client TEXT NOT NULL DEFAULT '',
    session_id TEXT NOT NULL DEFAULT '',
    statement_id INTEGER NOT NULL DEFAULT 0,
    statement TEXT NOT NULL DEFAULT '',
    parameters TEXT NOT NULL DEFAULT '[]',  -- JSON
    kind TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL
        CHECK (status IN ({check_list(Status)})),
    sqlstate TEXT,
    message TEXT,  -- a refused or failed statement's error message
    epsilon REAL NOT NULL DEFAULT 0,
    delta REAL NOT NULL DEFAULT 0,
    rho REAL NOT NULL DEFAULT 0,
    replayed INTEGER NOT NULL DEFAULT 0,
    rows INTEGER NOT NULL DEFAULT 0,
    duration REAL,
    stages TEXT NOT NULL DEFAULT '{{}}',  -- JSON: seconds per stage
    entry_id INTEGER UNIQUE  -- the ledger entry of its charge
);
CREATE INDEX IF NOT EXISTS {_SQLITE_AUDIT}_at ON {_SQLITE_AUDIT} (at);
CREATE INDEX IF NOT EXISTS {_SQLITE_AUDIT}_analyst_at ON {_SQLITE_AUDIT} (analyst, at);
"""


class SQLiteLedger(Ledger):
    """A ledger in one SQLite file (or ":memory:", which is neither shared nor persistent).

    One connection serves all threads under a lock; separate processes (or instances) are kept
    apart by SQLite's own write lock, taken up front with BEGIN IMMEDIATE. Beside the file, SQLite
    keeps `<file>-wal` and `<file>-shm`, and this ledger a directory `<file>-owners` with one locked
    file per live ledger instance: back up and move the ledger with all of them closed.
    """

    PLACEHOLDER = "?"
    FOR_UPDATE = ""  # the transaction holds the whole database's write lock

    def __init__(
        self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0, replay_limit: int = REPLAY_LIMIT
    ) -> None:
        self.path = os.fspath(path)
        super().__init__(
            tables=lambda suffix: _SQLITE_TABLE + suffix, where=self.path, replay_limit=replay_limit
        )
        in_memory = self._in_memory = self.path == ":memory:"
        self._mutex = threading.RLock()
        self._owner = uuid.uuid4().hex
        # One directory per file, however it is named (a symlink or another relative path to the same
        # ledger must see the same live owners, or their reservations would look abandoned).
        owners = Path(os.path.realpath(self.path) + "-owners")
        self._owner_locks = _OwnerLocks(owners) if not in_memory else None
        self._owner_file: BinaryIO | None = None
        if not in_memory:
            _create_private(self.path)
        self._conn: sqlite3.Connection | None = sqlite3.connect(
            self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            if not in_memory:
                self._use_wal(busy_timeout)
            # FULL: a reservation must be on disk before its query runs, even across power loss.
            self._conn.execute("PRAGMA synchronous=FULL")
            self._create_schema()
            if self._owner_locks is not None:
                self._owner_file = self._owner_locks.claim(self._owner)
            self._abandon_orphans()
        except BaseException:
            self._conn.close()
            self._conn = None
            if self._owner_locks is not None:
                self._owner_locks.give_up(self._owner, self._owner_file)
            raise

    def _use_wal(self, busy_timeout: float) -> None:
        assert self._conn is not None
        # Switching to WAL needs a moment of exclusive access and fails at once, without the busy
        # handler, while another opener holds the file: retry until the busy timeout. The mode then
        # sticks to the file, so later opens find it already set.
        deadline = time.monotonic() + busy_timeout
        while True:
            try:
                mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as exc:
                contended = "locked" in str(exc) or "busy" in str(exc)
                if not contended or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        if str(mode).lower() != "wal":
            raise DPProxyError(
                f"cannot put the privacy ledger {self.path} in WAL mode (it is in {mode!r} mode)",
                hint="the ledger must be on a local file system that supports SQLite's WAL mode",
            )

    def close(self) -> None:
        with self._mutex:
            if self._conn is None:
                return
            try:
                self._abandon_own()
            finally:
                self._conn.close()
                self._conn = None
                if self._owner_locks is not None:
                    self._owner_locks.give_up(self._owner, self._owner_file)
                    self._owner_file = None

    def __repr__(self) -> str:
        return f"SQLiteLedger({self.path!r})"

    # --- The store interface -------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """A write transaction that holds the database's write lock from its first statement."""
        with self._mutex:
            conn = self._open_connection()
            if not self._in_memory:
                conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _open_connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ValueError(f"the privacy ledger {self.path} is closed")
        return self._conn

    def _read(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._mutex:
            return self._open_connection().execute(query, params).fetchall()

    def _lock(self, conn: sqlite3.Connection, kind: str, analyst: str | None) -> None:
        pass  # BEGIN IMMEDIATE has already serialised every write transaction

    def _insert(self, conn: sqlite3.Connection, query: str, params: Sequence[Any]) -> int:
        row_id = conn.execute(query, params).lastrowid
        assert row_id is not None
        return row_id

    def _stamp(self, moment: datetime) -> str:
        # UTC, microseconds always: text order is time order.
        return moment.astimezone(UTC).isoformat(timespec="microseconds")

    def _moment(self, stored: Any) -> datetime:
        return datetime.fromisoformat(stored)

    def _change_totals(self, conn: sqlite3.Connection, analyst: str, cost: Cost, sign: int) -> None:
        # Decimal text: read, computed exactly, written back, all under the write lock.
        totals = self._totals(conn, analyst)
        self._write_totals(conn, analyst, totals.plus(cost) if sign > 0 else totals.minus(cost))

    @contextmanager
    def _dead_owners(self, conn: sqlite3.Connection, owners: list[str | None]) -> Iterator[list[str | None]]:
        if self._owner_locks is None:  # in memory: no other instance can have written here
            yield []
            return
        with self._owner_locks.dead(owners) as dead:
            yield dead

    def _schema(self) -> list[str]:
        return [statement for statement in _SQLITE_SCHEMA.split(";") if statement.strip()]

    def _add_audit_message(self, conn: sqlite3.Connection) -> None:
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({_SQLITE_AUDIT})")}
        if "message" not in columns:
            conn.execute(f"ALTER TABLE {_SQLITE_AUDIT} ADD COLUMN message TEXT")

    def _add_rho_total(self, conn: sqlite3.Connection) -> None:
        totals_columns = {row[1] for row in conn.execute(f"PRAGMA table_info({_SQLITE_TOTALS})")}
        if "rho" not in totals_columns:
            conn.execute(f"ALTER TABLE {_SQLITE_TOTALS} ADD COLUMN rho TEXT NOT NULL DEFAULT '0'")


def _create_private(path: str) -> None:
    """Create the ledger's file readable by its owner only (SQLite gives its -wal and -shm files the
    same mode): it holds the audit log's statements and the key of the decoy credentials. A file
    that exists keeps the mode its operator gave it, with a warning when others may read it."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        mode = os.stat(path).st_mode & 0o777
        if mode & 0o077:
            logging.getLogger("dpproxy.budget").warning(
                "the ledger %s can be read by other users (mode %04o), and it holds the audit log's "
                "statements: chmod 600 it (and its -wal and -shm files)",
                path,
                mode,
            )
