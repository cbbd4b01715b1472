"""The ledger in one SQLite file: WAL mode, writes under BEGIN IMMEDIATE, owners as flock'd files.

This module owns the SQLite layout of the ledger (entries, exact totals, stored answers, the schema
version and its migration), its transactions, and owner liveness: each live ledger instance holds an
flock on a file of its own beside the database, which the kernel drops when the process dies.

It never decides whether a cost fits (dpproxy.budget.composition does, called inside the store's
write transaction) and never reads a replay key or payload beyond storing it.
"""

from __future__ import annotations

import decimal
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

from dpproxy.audit import (
    ABANDONED,
    AUDIT_COLUMNS,
    AUDIT_FINISH_COLUMNS,
    RUNNING,
    AuditEntry,
    StatementRecord,
    audit_entry,
    audit_finish_values,
    audit_values,
)
from dpproxy.budget import (
    REPLAY_LIMIT,
    SCHEMA_VERSION,
    EntryStatus,
    Ledger,
    LedgerEntry,
    Reservation,
    check_replay_limit,
    check_schema_version,
    finish_problem,
)
from dpproxy.budget.composition import Totals, check_fits, exact_totals
from dpproxy.errors import DPProxyError
from dpproxy.privacy.accounting import Cost

try:  # flock tells a live owner from a dead one; without it every other owner is taken as dead.
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]


def _now() -> datetime:
    return datetime.now(UTC)


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
    status TEXT NOT NULL CHECK (status IN ('reserved', 'committed', 'released', 'abandoned')),
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
        CHECK (status IN ('ok', 'refused', 'failed', 'running', 'abandoned')),
    sqlstate TEXT,
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


def _stamp(moment: datetime) -> str:
    """A moment as the audit table stores it: UTC, microseconds always (so text order is time order)."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


_AUDIT_INSERT = (
    f"INSERT INTO {_SQLITE_AUDIT} ({', '.join(AUDIT_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in AUDIT_COLUMNS)})"
)
_AUDIT_FINISH = (
    f"UPDATE {_SQLITE_AUDIT} SET {', '.join(c + ' = ?' for c in AUDIT_FINISH_COLUMNS)} WHERE id = ?"
)
# Marks the audit rows of the reserved entries of one owner abandoned (before the entries are).
_AUDIT_ABANDON = (
    f"UPDATE {_SQLITE_AUDIT} SET status = '{ABANDONED}' WHERE status = '{RUNNING}' AND entry_id IN "
    f"(SELECT id FROM {_SQLITE_TABLE} WHERE status = 'reserved' AND owner IS ?)"
)


def _audit_row(record: StatementRecord, *, status: str | None = None) -> tuple[Any, ...]:
    values = list(audit_values(record, status=status))
    values[0] = _stamp(values[0])
    values[13] = int(values[13])  # replayed
    return tuple(values)


def _audit_finish_row(record: StatementRecord) -> tuple[Any, ...]:
    values = list(audit_finish_values(record))
    values[5] = int(values[5])  # replayed
    return (*values, record.audit_id)


class SQLiteLedger(Ledger):
    """A ledger in one SQLite file (or ":memory:", which is neither shared nor persistent).

    One connection serves all threads under a lock; separate processes (or instances) are kept
    apart by SQLite's own write lock, taken up front with BEGIN IMMEDIATE. Beside the file, SQLite
    keeps `<file>-wal` and `<file>-shm`, and this ledger a directory `<file>-owners` with one locked
    file per live ledger instance: back up and move the ledger with all of them closed.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0, replay_limit: int = REPLAY_LIMIT
    ) -> None:
        self.path = os.fspath(path)
        self.replay_limit = check_replay_limit(replay_limit)
        in_memory = self._in_memory = self.path == ":memory:"
        self._mutex = threading.RLock()
        self._owner = uuid.uuid4().hex
        self._owner_locks = _OwnerLocks(Path(self.path + "-owners")) if not in_memory else None
        self._owner_file: BinaryIO | None = None
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

    def _create_schema(self) -> None:
        with self._write() as conn:
            for statement in _SQLITE_SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                f"INSERT OR IGNORE INTO {_SQLITE_META} (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
            (version,) = conn.execute(
                f"SELECT value FROM {_SQLITE_META} WHERE key = 'schema_version'"
            ).fetchone()
            check_schema_version(int(version), self.path)
            if int(version) < SCHEMA_VERSION:
                self._migrate(conn, int(version))

    def _migrate(self, conn: sqlite3.Connection, version: int) -> None:
        """Bring a version 1, 2 or 3 store to SCHEMA_VERSION, inside the schema transaction.

        Version 1 had no totals, version 2 no ρ total (and no replay table, created above): sum every
        analyst's entries once, exactly. For version 2 the ε and δ sums come out as they were.
        Version 3 had no audit table (created above, empty: entries before it have no records).
        """
        if version >= 3:
            conn.execute(
                f"UPDATE {_SQLITE_META} SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),)
            )
            return
        totals_columns = {row[1] for row in conn.execute(f"PRAGMA table_info({_SQLITE_TOTALS})")}
        if "rho" not in totals_columns:
            conn.execute(f"ALTER TABLE {_SQLITE_TOTALS} ADD COLUMN rho TEXT NOT NULL DEFAULT '0'")
        conn.execute(f"DELETE FROM {_SQLITE_TOTALS}")
        for (analyst,) in conn.execute(f"SELECT DISTINCT analyst FROM {_SQLITE_TABLE}").fetchall():
            self._store_totals(conn, analyst, exact_totals(self._spending(conn, analyst)))
        conn.execute(
            f"UPDATE {_SQLITE_META} SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),)
        )

    @contextmanager
    def _write(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """A write transaction that holds the database's write lock from its first statement.

        durable=False skips the fsync at commit (a crash of the machine may lose the change, not a
        crash of the process): only for changes whose loss leaves the ledger conservative.
        """
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

    def _abandon_orphans(self) -> None:
        with self._write() as conn:
            owners = [
                owner
                for (owner,) in conn.execute(
                    f"SELECT DISTINCT owner FROM {_SQLITE_TABLE} WHERE status = 'reserved'"
                )
                if owner != self._owner
            ]
            if not owners or self._owner_locks is None:
                return
            with self._owner_locks.dead(owners) as dead:
                finished = _now().isoformat()
                for owner in dead:
                    conn.execute(_AUDIT_ABANDON, (owner,))
                    conn.execute(
                        f"UPDATE {_SQLITE_TABLE} SET status = 'abandoned', finished_at = ? "
                        "WHERE status = 'reserved' AND owner IS ?",
                        (finished, owner),
                    )

    def _spending(self, conn: sqlite3.Connection, analyst: str) -> list[tuple[float, float, float | None]]:
        return conn.execute(
            f"SELECT epsilon, delta, rho FROM {_SQLITE_TABLE} WHERE analyst = ? AND status != 'released'",
            (analyst,),
        ).fetchall()

    def _totals(self, conn: sqlite3.Connection, analyst: str) -> Totals:
        row = conn.execute(
            f"SELECT epsilon, delta, rho FROM {_SQLITE_TOTALS} WHERE analyst = ?", (analyst,)
        ).fetchone()
        if row is None:
            return Totals()
        return Totals(decimal.Decimal(row[0]), decimal.Decimal(row[1]), decimal.Decimal(row[2]))

    def _store_totals(self, conn: sqlite3.Connection, analyst: str, totals: Totals) -> None:
        conn.execute(
            f"INSERT INTO {_SQLITE_TOTALS} (analyst, epsilon, delta, rho) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (analyst) DO UPDATE SET epsilon = excluded.epsilon, delta = excluded.delta, "
            "rho = excluded.rho",
            (analyst, str(totals.epsilon), str(totals.delta), str(totals.rho)),
        )

    def _totals_of(self, analyst: str) -> Totals:
        with self._mutex:
            return self._totals(self._open_connection(), analyst)

    def _reserve(
        self,
        analyst: str,
        cost: Cost,
        limit: Cost,
        statement: str,
        accounting: str,
        record: StatementRecord | None = None,
    ) -> Reservation:
        with self._write() as conn:
            after = check_fits(analyst, self._totals(conn, analyst), cost, limit, accounting)
            self._store_totals(conn, analyst, after)
            cursor = conn.execute(
                f"INSERT INTO {_SQLITE_TABLE} (analyst, epsilon, delta, rho, status, statement, owner, "
                "created_at) VALUES (?, ?, ?, ?, 'reserved', ?, ?, ?)",
                (
                    analyst,
                    float(cost.epsilon),
                    float(cost.delta),
                    float(cost.rho),
                    statement,
                    self._owner,
                    _now().isoformat(),
                ),
            )
            entry_id = cursor.lastrowid
            if record is not None:
                record.entry_id = entry_id
                record.audit_id = conn.execute(_AUDIT_INSERT, _audit_row(record, status=RUNNING)).lastrowid
        assert entry_id is not None
        return Reservation(id=entry_id, analyst=analyst, cost=cost, spent=after.spent)

    def _finish(
        self, reservation: Reservation, status: EntryStatus, record: StatementRecord | None = None
    ) -> None:
        # Losing a commit to a machine crash is safe (the entry stays reserved, then abandoned: spent);
        # losing a release only keeps a cost that could have been returned. Neither needs an fsync.
        with self._write(durable=False) as conn:
            row = conn.execute(
                f"SELECT analyst, epsilon, delta, rho, status FROM {_SQLITE_TABLE} WHERE id = ?",
                (reservation.id,),
            ).fetchone()
            problem = finish_problem(reservation, status, row)
            if problem is not None:
                raise ValueError(problem)
            conn.execute(
                f"UPDATE {_SQLITE_TABLE} SET status = ?, finished_at = ? WHERE id = ?",
                (str(status), _now().isoformat(), reservation.id),
            )
            if status == EntryStatus.RELEASED:
                totals = self._totals(conn, reservation.analyst)
                self._store_totals(conn, reservation.analyst, totals.minus(reservation.cost))
            if record is not None and record.audit_id is not None:
                conn.execute(_AUDIT_FINISH, _audit_finish_row(record))

    def reset(self, analyst: str) -> int:
        with self._write() as conn:
            # A query still running loses its entry: its record can never be finished, so it ends here.
            conn.execute(
                f"UPDATE {_SQLITE_AUDIT} SET status = ? WHERE status = ? AND analyst = ?",
                (ABANDONED, RUNNING, analyst),
            )
            conn.execute(f"DELETE FROM {_SQLITE_REPLAY} WHERE analyst = ?", (analyst,))
            conn.execute(f"DELETE FROM {_SQLITE_TOTALS} WHERE analyst = ?", (analyst,))
            return conn.execute(f"DELETE FROM {_SQLITE_TABLE} WHERE analyst = ?", (analyst,)).rowcount

    def _replay_get(self, analyst: str, key: str) -> bytes | None:
        rows = self._read(
            f"SELECT payload FROM {_SQLITE_REPLAY} WHERE analyst = ? AND key = ?", (analyst, key)
        )
        return bytes(rows[0][0]) if rows else None

    def _replay_put(self, analyst: str, key: str, payload: bytes) -> None:
        # Losing a stored answer to a machine crash only means buying it again: no fsync needed.
        with self._write(durable=False) as conn:
            inserted = conn.execute(
                f"INSERT OR IGNORE INTO {_SQLITE_REPLAY} (analyst, key, payload, created_at) "
                "VALUES (?, ?, ?, ?)",
                (analyst, key, payload, _now().isoformat()),
            ).rowcount
            if inserted:
                conn.execute(
                    f"DELETE FROM {_SQLITE_REPLAY} WHERE analyst = ? AND seq <= (SELECT seq FROM "
                    f"{_SQLITE_REPLAY} WHERE analyst = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)",
                    (analyst, analyst, self.replay_limit),
                )

    def _replay_forget(self, analyst: str) -> int:
        with self._write() as conn:
            return conn.execute(f"DELETE FROM {_SQLITE_REPLAY} WHERE analyst = ?", (analyst,)).rowcount

    def history(self, analyst: str, limit: int = 50) -> list[LedgerEntry]:
        if limit < 0:
            raise ValueError(f"history limit must be >= 0, not {limit}")
        rows = self._read(
            f"SELECT id, analyst, epsilon, delta, status, statement, created_at, finished_at, rho "
            f"FROM {_SQLITE_TABLE} WHERE analyst = ? ORDER BY id DESC LIMIT ?",
            (analyst, limit),
        )
        return [
            LedgerEntry(
                id=row[0],
                analyst=row[1],
                epsilon=row[2],
                delta=row[3],
                status=EntryStatus(row[4]),
                statement=row[5],
                created_at=datetime.fromisoformat(row[6]),
                finished_at=datetime.fromisoformat(row[7]) if row[7] is not None else None,
                rho=row[8] or 0.0,
            )
            for row in rows
        ]

    def _audit_write(self, records: list[StatementRecord]) -> None:
        # Losing records to a machine crash loses no charge (a charge's record is written with it).
        with self._write(durable=False) as conn:
            for record in records:
                if record.audit_id is None:
                    record.audit_id = conn.execute(_AUDIT_INSERT, _audit_row(record)).lastrowid
                else:
                    # Only while its charge is finished: an abandoned record stays so.
                    conn.execute(
                        _AUDIT_FINISH + f" AND status != '{RUNNING}' AND status != '{ABANDONED}'",
                        _audit_finish_row(record),
                    )

    def _audit_entries(
        self,
        analyst: str | None,
        since: datetime | None,
        until: datetime | None,
        status: str | None,
        limit: int,
    ) -> list[AuditEntry]:
        where, params = [], []
        if analyst is not None:
            where.append("analyst = ?")
            params.append(analyst)
        if since is not None:
            where.append("at >= ?")
            params.append(_stamp(since))
        if until is not None:
            where.append("at < ?")
            params.append(_stamp(until))
        if status is not None:
            where.append("status = ?")
            params.append(status)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        rows = self._read(
            f"SELECT id, {', '.join(AUDIT_COLUMNS)} FROM {_SQLITE_AUDIT} {clause}"
            "ORDER BY at DESC, id DESC LIMIT ?",
            (*params, limit),
        )
        return [audit_entry(row, datetime.fromisoformat(row[1])) for row in rows]

    def _prune_audit(self, before: datetime) -> int:
        with self._write(durable=False) as conn:
            return conn.execute(
                f"DELETE FROM {_SQLITE_AUDIT} WHERE at < ? AND status != '{RUNNING}'", (_stamp(before),)
            ).rowcount

    def analysts(self) -> list[str]:
        return [a for (a,) in self._read(f"SELECT DISTINCT analyst FROM {_SQLITE_TABLE} ORDER BY analyst")]

    def close(self) -> None:
        with self._mutex:
            if self._conn is None:
                return
            try:
                with self._write() as conn:
                    conn.execute(_AUDIT_ABANDON, (self._owner,))
                    conn.execute(
                        f"UPDATE {_SQLITE_TABLE} SET status = 'abandoned', finished_at = ? "
                        "WHERE status = 'reserved' AND owner = ?",
                        (_now().isoformat(), self._owner),
                    )
            finally:
                self._conn.close()
                self._conn = None
                if self._owner_locks is not None:
                    self._owner_locks.give_up(self._owner, self._owner_file)
                    self._owner_file = None

    def __repr__(self) -> str:
        return f"SQLiteLedger({self.path!r})"
