"""The privacy-budget ledger: what each analyst has spent, kept persistently and changed atomically.

This module owns the ledger and sequential composition. A query's cost is reserved before it runs
(refused with BudgetExhausted if it does not fit), committed once it has run, or released if it never
touched data. An analyst's spending is the exact sum of every entry that is reserved, committed or
abandoned: ε and δ add up. Only a released entry, whose query provably never ran, gives its cost
back. The sum is kept exactly (decimal arithmetic, no rounding) in a per-analyst totals row updated in
the same transaction as the entries, so a reservation reads one row, however long the history.

Two stores share that contract: a SQLite file (the default, WAL mode, writes under BEGIN IMMEDIATE)
and a PostgreSQL table (a per-analyst advisory transaction lock). In both, no two reservations, from
threads or from separate processes sharing the store, can together overspend.

Crash safety: every ledger instance is an *owner* that holds a lock for as long as it lives (an
flock'd file beside the SQLite file, a session advisory lock in PostgreSQL). A reservation whose
owner is gone was left by a process that died mid-query; its query may have read data, so on the
next open it is marked 'abandoned' and stays spent for good. Reservations of owners that are still
alive (another server process on the same store) are left alone.

This module never sees SQL beyond an opaque statement string kept for audit, and never computes a
privacy cost: costs come from dpproxy.mechanisms, limits from the policy.
"""

from __future__ import annotations

import decimal
import math
import os
import re
import secrets
import sqlite3
import threading
import time
import uuid
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Self

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from dpproxy.errors import BudgetExhausted, DPProxyError
from dpproxy.mechanisms import Cost

try:  # flock tells a live owner from a dead one; without it every other owner is taken as dead.
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "SCHEMA_VERSION",
    "EntryStatus",
    "Ledger",
    "LedgerEntry",
    "PostgresLedger",
    "Reservation",
    "SQLiteLedger",
    "open_ledger",
]

# Version of the ledger's table layout, stored in the store's meta table. Bump it, and add a step to
# the store's migration, when the layout changes. 2: the per-analyst totals table.
SCHEMA_VERSION = 2

# Exact sums of doubles: every double is a finite decimal, and 400 digits hold any sum of the ε and δ
# values a ledger sees (magnitudes within 10^±150 of each other) without rounding.
_EXACT = decimal.Context(prec=400)


def _exact_add(total: decimal.Decimal, amount: float) -> decimal.Decimal:
    return _EXACT.add(total, decimal.Decimal(amount))


def _exact_sub(total: decimal.Decimal, amount: float) -> decimal.Decimal:
    return _EXACT.subtract(total, decimal.Decimal(amount))


EXHAUSTED_HINT = (
    "ask the data owner to raise the budget, or lower the per-query epsilon with SET dpproxy.epsilon"
)


class EntryStatus(StrEnum):
    RESERVED = "reserved"  # the query may be running: counted as spent
    COMMITTED = "committed"  # the query ran: spent for good
    RELEASED = "released"  # the query never touched data: not counted
    ABANDONED = "abandoned"  # its process died while it was reserved: spent for good


@dataclass(frozen=True)
class Reservation:
    """A cost held for one query; hand it back to commit or release exactly once."""

    id: int
    analyst: str
    cost: Cost
    # The analyst's spending with this reservation included (for the notice after the query).
    spent: Cost | None = None


@dataclass(frozen=True)
class LedgerEntry:
    id: int
    analyst: str
    epsilon: float
    delta: float
    status: str  # an EntryStatus value
    statement: str
    created_at: datetime
    finished_at: datetime | None

    @property
    def cost(self) -> Cost:
        return Cost(self.epsilon, self.delta)

    @property
    def counts_as_spent(self) -> bool:
        return self.status != EntryStatus.RELEASED


class Ledger(ABC):
    """Per-analyst privacy spending. Thread-safe; several processes may share one store."""

    def reserve(self, analyst: str, cost: Cost, limit: Cost, *, statement: str = "") -> Reservation:
        """Hold `cost` for one query if everything spent so far plus `cost` fits within `limit`.

        Atomic with every other reservation on the same store. Raises BudgetExhausted, leaving the
        ledger unchanged, when the cost does not fit in ε or in δ.
        """
        _check_analyst(analyst)
        _check_amount(cost, "cost", allow_infinite=False)
        _check_amount(limit, "limit", allow_infinite=True)
        if not isinstance(statement, str):
            raise TypeError(f"statement must be a str, not {type(statement).__name__}")
        return self._reserve(analyst, cost, limit, statement)

    def commit(self, reservation: Reservation) -> None:
        """The query ran: its cost is spent for good."""
        self._finish(reservation, EntryStatus.COMMITTED)

    def release(self, reservation: Reservation) -> None:
        """The query never touched data: its cost is given back."""
        self._finish(reservation, EntryStatus.RELEASED)

    @abstractmethod
    def spent(self, analyst: str) -> Cost:
        """Exact sum of the analyst's reserved, committed and abandoned entries."""

    def remaining(self, analyst: str, limit: Cost) -> Cost:
        """What is left of `limit` (never negative); for notices, not for deciding anything."""
        return _remaining(self.spent(analyst), limit)

    @abstractmethod
    def reset(self, analyst: str) -> int:
        """Operator action: delete every entry of the analyst; return how many there were."""

    @abstractmethod
    def history(self, analyst: str, limit: int = 50) -> list[LedgerEntry]:
        """The analyst's latest entries, newest first."""

    @abstractmethod
    def analysts(self) -> list[str]:
        """Every analyst with at least one entry, sorted."""

    @abstractmethod
    def close(self) -> None:
        """Close the store. Reservations of this instance still open are marked abandoned."""

    @abstractmethod
    def _reserve(self, analyst: str, cost: Cost, limit: Cost, statement: str) -> Reservation: ...

    @abstractmethod
    def _finish(self, reservation: Reservation, status: EntryStatus) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


# --------------------------------------------------------------------------------------------------
# Shared arithmetic and checks


def _check_analyst(analyst: str) -> None:
    if not isinstance(analyst, str) or not analyst:
        raise ValueError(f"analyst must be a non-empty string, not {analyst!r}")


def _check_amount(amount: Cost, what: str, *, allow_infinite: bool) -> None:
    if not isinstance(amount, Cost):
        raise TypeError(f"{what} must be a Cost, not {type(amount).__name__}")
    for name in ("epsilon", "delta"):
        value = getattr(amount, name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{what}.{name} must be a number, not {value!r}")
        if math.isnan(value) or value < 0 or (math.isinf(value) and not allow_infinite):
            bound = "a number >= 0" if allow_infinite else "a finite number >= 0"
            raise ValueError(f"{what}.{name} must be {bound}, not {value!r}")


def _remaining(spent: Cost, limit: Cost) -> Cost:
    return Cost(max(0.0, limit.epsilon - spent.epsilon), max(0.0, limit.delta - spent.delta))


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def _fmt_pair(cost: float, remains: float) -> tuple[str, str]:
    # "costs ε=0.5 but only ε=0.5 remain" would be nonsense: add digits until they differ.
    for precision in (6, 10, 17):
        a, b = f"{cost:.{precision}g}", f"{remains:.{precision}g}"
        if a != b:
            break
    return a, b


def _check_fits(
    analyst: str, total: tuple[decimal.Decimal, decimal.Decimal], cost: Cost, limit: Cost
) -> tuple[decimal.Decimal, decimal.Decimal]:
    """The totals with `cost` added, if they fit within `limit` in ε and in δ; else BudgetExhausted."""
    after = (_exact_add(total[0], cost.epsilon), _exact_add(total[1], cost.delta))
    if Cost(float(after[0]), float(after[1])).fits_within(limit):
        return after
    remains = _remaining(Cost(float(total[0]), float(total[1])), limit)
    cost_eps, remains_eps = _fmt_pair(cost.epsilon, remains.epsilon)
    cost_delta, remains_delta = _fmt_pair(cost.delta, remains.delta)
    raise BudgetExhausted(
        f'privacy budget exhausted for analyst "{analyst}": this query costs ε={cost_eps}, '
        f"δ={cost_delta} but only ε={remains_eps}, δ={remains_delta} remain of "
        f"ε={_fmt(limit.epsilon)}, δ={_fmt(limit.delta)}",
        hint=EXHAUSTED_HINT,
    )


def _exact_totals(amounts: Iterable[tuple[float, float]]) -> tuple[decimal.Decimal, decimal.Decimal]:
    epsilon = delta = decimal.Decimal(0)
    for e, d in amounts:
        epsilon, delta = _exact_add(epsilon, float(e)), _exact_add(delta, float(d))
    return epsilon, delta


def _finish_problem(
    reservation: Reservation, status: EntryStatus, row: tuple[str, float, float, str] | None
) -> str | None:
    """Why the stored entry `row` (analyst, ε, δ, status) cannot be finished, or None if it can."""
    verb = "committed" if status == EntryStatus.COMMITTED else "released"
    where = f"reservation {reservation.id} of analyst {reservation.analyst!r}"
    if row is None:
        return f"cannot mark {where} {verb}: no such ledger entry (never reserved, or removed by a reset)"
    analyst, epsilon, delta, current = row
    if (analyst, epsilon, delta) != (
        reservation.analyst,
        float(reservation.cost.epsilon),
        float(reservation.cost.delta),
    ):
        return (
            f"cannot mark {where} {verb}: it does not match ledger entry {reservation.id} "
            f"(analyst {analyst!r}, ε={epsilon!r}, δ={delta!r})"
        )
    if current != EntryStatus.RESERVED:
        return f"cannot mark {where} {verb}: it is already {current}"
    return None


def _now() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------------------------------
# SQLite


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
    epsilon TEXT NOT NULL,  -- exact decimal sums of the analyst's entries that are not released
    delta TEXT NOT NULL
);
"""


class SQLiteLedger(Ledger):
    """A ledger in one SQLite file (or ":memory:", which is neither shared nor persistent).

    One connection serves all threads under a lock; separate processes (or instances) are kept
    apart by SQLite's own write lock, taken up front with BEGIN IMMEDIATE. Beside the file, SQLite
    keeps `<file>-wal` and `<file>-shm`, and this ledger a directory `<file>-owners` with one locked
    file per live ledger instance: back up and move the ledger with all of them closed.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0) -> None:
        self.path = os.fspath(path)
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
            _check_schema_version(int(version), self.path)
            if int(version) < 2:
                # Version 1 had no totals: sum every analyst's entries once.
                conn.execute(f"DELETE FROM {_SQLITE_TOTALS}")
                for (analyst,) in conn.execute(f"SELECT DISTINCT analyst FROM {_SQLITE_TABLE}").fetchall():
                    epsilon, delta = _exact_totals(self._spending(conn, analyst))
                    conn.execute(
                        f"INSERT INTO {_SQLITE_TOTALS} (analyst, epsilon, delta) VALUES (?, ?, ?)",
                        (analyst, str(epsilon), str(delta)),
                    )
                conn.execute(
                    f"UPDATE {_SQLITE_META} SET value = ? WHERE key = 'schema_version'",
                    (str(SCHEMA_VERSION),),
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
                    conn.execute(
                        f"UPDATE {_SQLITE_TABLE} SET status = 'abandoned', finished_at = ? "
                        "WHERE status = 'reserved' AND owner IS ?",
                        (finished, owner),
                    )

    def _spending(self, conn: sqlite3.Connection, analyst: str) -> list[tuple[float, float]]:
        return conn.execute(
            f"SELECT epsilon, delta FROM {_SQLITE_TABLE} WHERE analyst = ? AND status != 'released'",
            (analyst,),
        ).fetchall()

    def _totals(self, conn: sqlite3.Connection, analyst: str) -> tuple[decimal.Decimal, decimal.Decimal]:
        row = conn.execute(
            f"SELECT epsilon, delta FROM {_SQLITE_TOTALS} WHERE analyst = ?", (analyst,)
        ).fetchone()
        return (
            (decimal.Decimal(row[0]), decimal.Decimal(row[1]))
            if row
            else (decimal.Decimal(0), decimal.Decimal(0))
        )

    def _store_totals(
        self, conn: sqlite3.Connection, analyst: str, totals: tuple[decimal.Decimal, decimal.Decimal]
    ) -> None:
        conn.execute(
            f"INSERT INTO {_SQLITE_TOTALS} (analyst, epsilon, delta) VALUES (?, ?, ?) "
            "ON CONFLICT (analyst) DO UPDATE SET epsilon = excluded.epsilon, delta = excluded.delta",
            (analyst, str(totals[0]), str(totals[1])),
        )

    def _reserve(self, analyst: str, cost: Cost, limit: Cost, statement: str) -> Reservation:
        with self._write() as conn:
            after = _check_fits(analyst, self._totals(conn, analyst), cost, limit)
            self._store_totals(conn, analyst, after)
            cursor = conn.execute(
                f"INSERT INTO {_SQLITE_TABLE} (analyst, epsilon, delta, status, statement, owner, "
                "created_at) VALUES (?, ?, ?, 'reserved', ?, ?, ?)",
                (
                    analyst,
                    float(cost.epsilon),
                    float(cost.delta),
                    statement,
                    self._owner,
                    _now().isoformat(),
                ),
            )
            entry_id = cursor.lastrowid
        assert entry_id is not None
        return Reservation(
            id=entry_id, analyst=analyst, cost=cost, spent=Cost(float(after[0]), float(after[1]))
        )

    def _finish(self, reservation: Reservation, status: EntryStatus) -> None:
        # Losing a commit to a machine crash is safe (the entry stays reserved, then abandoned: spent);
        # losing a release only keeps a cost that could have been returned. Neither needs an fsync.
        with self._write(durable=False) as conn:
            row = conn.execute(
                f"SELECT analyst, epsilon, delta, status FROM {_SQLITE_TABLE} WHERE id = ?",
                (reservation.id,),
            ).fetchone()
            problem = _finish_problem(reservation, status, row)
            if problem is not None:
                raise ValueError(problem)
            conn.execute(
                f"UPDATE {_SQLITE_TABLE} SET status = ?, finished_at = ? WHERE id = ?",
                (str(status), _now().isoformat(), reservation.id),
            )
            if status == EntryStatus.RELEASED:
                epsilon, delta = self._totals(conn, reservation.analyst)
                self._store_totals(
                    conn,
                    reservation.analyst,
                    (
                        _exact_sub(epsilon, reservation.cost.epsilon),
                        _exact_sub(delta, reservation.cost.delta),
                    ),
                )

    def spent(self, analyst: str) -> Cost:
        with self._mutex:
            epsilon, delta = self._totals(self._open_connection(), analyst)
        return Cost(float(epsilon), float(delta))

    def reset(self, analyst: str) -> int:
        with self._write() as conn:
            conn.execute(f"DELETE FROM {_SQLITE_TOTALS} WHERE analyst = ?", (analyst,))
            return conn.execute(f"DELETE FROM {_SQLITE_TABLE} WHERE analyst = ?", (analyst,)).rowcount

    def history(self, analyst: str, limit: int = 50) -> list[LedgerEntry]:
        if limit < 0:
            raise ValueError(f"history limit must be >= 0, not {limit}")
        rows = self._read(
            f"SELECT id, analyst, epsilon, delta, status, statement, created_at, finished_at "
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
            )
            for row in rows
        ]

    def analysts(self) -> list[str]:
        return [a for (a,) in self._read(f"SELECT DISTINCT analyst FROM {_SQLITE_TABLE} ORDER BY analyst")]

    def close(self) -> None:
        with self._mutex:
            if self._conn is None:
                return
            try:
                with self._write() as conn:
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


def _check_schema_version(version: int, where: str) -> None:
    if version > SCHEMA_VERSION:
        raise DPProxyError(
            f"the privacy ledger {where} has schema version {version}, newer than this dpproxy "
            f"understands ({SCHEMA_VERSION})",
            hint="upgrade dpproxy, or point it at another ledger",
        )
    # Older versions would be migrated here, one step per version, inside the schema transaction.


# --------------------------------------------------------------------------------------------------
# PostgreSQL


_PG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,55}")


def _lock_key(*parts: str) -> int:
    """A stable signed 32-bit key for pg_advisory_*lock(int, int)."""
    value = zlib.crc32("\x1f".join(parts).encode())
    return value - (1 << 32) if value >= 1 << 31 else value


def _read_committed(conn: psycopg.Connection[Any]) -> None:
    # Whatever the database's default: under REPEATABLE READ or SERIALIZABLE the snapshot would be
    # taken by the lock statement itself, before the lock is granted, and miss the reservation
    # committed by the previous holder. READ COMMITTED reads afresh after the lock.
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED


class PostgresLedger(Ledger):
    """A ledger in one PostgreSQL table (created on first open), shared by any number of processes.

    Reservations of one analyst are serialised by a transaction-scoped advisory lock; the owner of
    each ledger instance is a session advisory lock held on a dedicated connection. If that
    connection is lost while the instance lives on, another instance opening the table takes its
    open reservations for orphans and abandons them: still spent, but their commit then fails.
    """

    def __init__(self, dsn: str, *, table: str = "dpproxy_ledger", max_connections: int = 4) -> None:
        parts = table.split(".")
        if len(parts) > 2 or not all(_PG_NAME.fullmatch(p) for p in parts):
            raise ValueError(
                f"ledger table name {table!r} must be an identifier (letters, digits, _), "
                "optionally schema-qualified"
            )
        self.table = table
        self._table = sql.Identifier(*parts)
        self._meta = sql.Identifier(*parts[:-1], parts[-1] + "_meta")
        self._totals_table = sql.Identifier(*parts[:-1], parts[-1] + "_totals")
        self._index = sql.Identifier(parts[-1] + "_analyst_status")
        self._analyst_lock_class = _lock_key("dpproxy ledger analyst", table)
        self._owner_lock_class = _lock_key("dpproxy ledger owner", table)
        self._schema_lock_class = _lock_key("dpproxy ledger schema", table)
        self._closed = False
        try:
            self._owner_conn = psycopg.connect(dsn, autocommit=True)
        except psycopg.OperationalError as exc:
            raise DPProxyError(
                f"cannot connect to the PostgreSQL privacy ledger: {exc}",
                hint="check the ledger DSN and that the server is running",
            ) from exc
        self._pool: ConnectionPool | None = None
        try:
            self._owner = self._claim_owner()
            self._pool = ConnectionPool(
                dsn,
                min_size=1,
                max_size=max(1, max_connections),
                kwargs={"autocommit": True},
                configure=_read_committed,
                name=f"dpproxy-ledger-{table}",
                open=True,
            )
            self._create_schema()
            self._abandon_orphans()
        except BaseException:
            if self._pool is not None:
                self._pool.close()
            self._owner_conn.close()
            raise

    def _claim_owner(self) -> int:
        # Random ids may collide with a live owner: try until one is free (collisions are rare).
        while True:
            owner = secrets.randbits(31)
            (claimed,) = self._owner_conn.execute(
                "SELECT pg_try_advisory_lock(%s, %s)", (self._owner_lock_class, owner)
            ).fetchone()
            if claimed:
                return owner

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[Any]]:
        if self._closed or self._pool is None:
            raise ValueError(f"the privacy ledger table {self.table} is closed")
        with self._pool.connection() as conn, conn.transaction():
            yield conn

    def _create_schema(self) -> None:
        t, meta = self._table, self._meta
        with self._transaction() as conn:
            # Concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog: serialise it.
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (self._schema_lock_class,))
            conn.execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, value text NOT NULL)").format(
                    meta
                )
            )
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (key, value) VALUES ('schema_version', %s) ON CONFLICT (key) DO NOTHING"
                ).format(meta),
                (str(SCHEMA_VERSION),),
            )
            conn.execute(
                sql.SQL(
                    """CREATE TABLE IF NOT EXISTS {} (
                        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                        analyst text NOT NULL,
                        epsilon double precision NOT NULL CHECK (epsilon >= 0),
                        delta double precision NOT NULL CHECK (delta >= 0),
                        rho double precision CHECK (rho IS NULL OR rho >= 0),
                        status text NOT NULL
                            CHECK (status IN ('reserved', 'committed', 'released', 'abandoned')),
                        statement text NOT NULL DEFAULT '',
                        owner integer,
                        created_at timestamptz NOT NULL,
                        finished_at timestamptz
                    )"""
                ).format(t)
            )
            conn.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (analyst, status)").format(self._index, t)
            )
            # Exact sums (numeric) of each analyst's entries that are not released.
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (analyst text PRIMARY KEY, epsilon numeric NOT NULL, "
                    "delta numeric NOT NULL)"
                ).format(self._totals_table)
            )
            (version,) = conn.execute(
                sql.SQL("SELECT value FROM {} WHERE key = 'schema_version'").format(meta)
            ).fetchone()
            _check_schema_version(int(version), f"table {self.table}")
            if int(version) < 2:
                # Version 1 had no totals: sum every analyst's entries once (numeric sums are exact).
                conn.execute(sql.SQL("DELETE FROM {}").format(self._totals_table))
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (analyst, epsilon, delta) SELECT analyst, "
                        "COALESCE(SUM(epsilon::numeric) FILTER (WHERE status <> 'released'), 0), "
                        "COALESCE(SUM(delta::numeric) FILTER (WHERE status <> 'released'), 0) "
                        "FROM {} GROUP BY analyst"
                    ).format(self._totals_table, t)
                )
                conn.execute(
                    sql.SQL("UPDATE {} SET value = %s WHERE key = 'schema_version'").format(meta),
                    (str(SCHEMA_VERSION),),
                )

    def _abandon_orphans(self) -> None:
        with self._transaction() as conn:
            owners = [
                owner
                for (owner,) in conn.execute(
                    sql.SQL("SELECT DISTINCT owner FROM {} WHERE status = 'reserved'").format(self._table)
                )
                if owner != self._owner
            ]
            finished = _now()
            for owner in owners:
                if owner is not None:
                    # Succeeds only if no live session holds the owner's lock; released at commit.
                    (dead,) = conn.execute(
                        "SELECT pg_try_advisory_xact_lock(%s, %s)", (self._owner_lock_class, owner)
                    ).fetchone()
                    if not dead:
                        continue
                conn.execute(
                    sql.SQL(
                        "UPDATE {} SET status = 'abandoned', finished_at = %s "
                        "WHERE status = 'reserved' AND owner IS NOT DISTINCT FROM %s"
                    ).format(self._table),
                    (finished, owner),
                )

    def _totals(self, conn: psycopg.Connection[Any], analyst: str) -> tuple[decimal.Decimal, decimal.Decimal]:
        row = conn.execute(
            sql.SQL("SELECT epsilon, delta FROM {} WHERE analyst = %s").format(self._totals_table), (analyst,)
        ).fetchone()
        return (
            (decimal.Decimal(row[0]), decimal.Decimal(row[1]))
            if row
            else (decimal.Decimal(0), decimal.Decimal(0))
        )

    def _add_to_totals(self, conn: psycopg.Connection[Any], analyst: str, cost: Cost, sign: int) -> None:
        epsilon, delta = decimal.Decimal(cost.epsilon) * sign, decimal.Decimal(cost.delta) * sign
        conn.execute(
            sql.SQL(
                "INSERT INTO {t} (analyst, epsilon, delta) VALUES (%s, %s, %s) ON CONFLICT (analyst) "
                "DO UPDATE SET epsilon = {t}.epsilon + excluded.epsilon, delta = {t}.delta + excluded.delta"
            ).format(t=self._totals_table),
            (analyst, epsilon, delta),
        )

    def _lock_analyst(self, conn: psycopg.Connection[Any], analyst: str) -> None:
        conn.execute(
            "SELECT pg_advisory_xact_lock(%s, %s)",
            (self._analyst_lock_class, _lock_key(analyst)),
        )

    def _reserve(self, analyst: str, cost: Cost, limit: Cost, statement: str) -> Reservation:
        with self._transaction() as conn:
            # Read committed: every statement after the lock sees all reservations made before it.
            self._lock_analyst(conn, analyst)
            after = _check_fits(analyst, self._totals(conn, analyst), cost, limit)
            self._add_to_totals(conn, analyst, cost, 1)
            (entry_id,) = conn.execute(
                sql.SQL(
                    "INSERT INTO {} (analyst, epsilon, delta, status, statement, owner, created_at) "
                    "VALUES (%s, %s, %s, 'reserved', %s, %s, %s) RETURNING id"
                ).format(self._table),
                (analyst, float(cost.epsilon), float(cost.delta), statement, self._owner, _now()),
            ).fetchone()
        return Reservation(
            id=entry_id, analyst=analyst, cost=cost, spent=Cost(float(after[0]), float(after[1]))
        )

    def _finish(self, reservation: Reservation, status: EntryStatus) -> None:
        with self._transaction() as conn:
            row = conn.execute(
                sql.SQL("SELECT analyst, epsilon, delta, status FROM {} WHERE id = %s FOR UPDATE").format(
                    self._table
                ),
                (reservation.id,),
            ).fetchone()
            problem = _finish_problem(reservation, status, row)
            if problem is not None:
                raise ValueError(problem)
            conn.execute(
                sql.SQL("UPDATE {} SET status = %s, finished_at = %s WHERE id = %s").format(self._table),
                (str(status), _now(), reservation.id),
            )
            if status == EntryStatus.RELEASED:
                self._add_to_totals(conn, reservation.analyst, reservation.cost, -1)

    def spent(self, analyst: str) -> Cost:
        with self._transaction() as conn:
            epsilon, delta = self._totals(conn, analyst)
        return Cost(float(epsilon), float(delta))

    def reset(self, analyst: str) -> int:
        with self._transaction() as conn:
            self._lock_analyst(conn, analyst)
            conn.execute(sql.SQL("DELETE FROM {} WHERE analyst = %s").format(self._totals_table), (analyst,))
            cursor = conn.execute(
                sql.SQL("DELETE FROM {} WHERE analyst = %s").format(self._table), (analyst,)
            )
            return cursor.rowcount

    def history(self, analyst: str, limit: int = 50) -> list[LedgerEntry]:
        if limit < 0:
            raise ValueError(f"history limit must be >= 0, not {limit}")
        with self._transaction() as conn:
            rows = conn.execute(
                sql.SQL(
                    "SELECT id, analyst, epsilon, delta, status, statement, created_at, finished_at "
                    "FROM {} WHERE analyst = %s ORDER BY id DESC LIMIT %s"
                ).format(self._table),
                (analyst, limit),
            ).fetchall()
        return [
            LedgerEntry(
                id=row[0],
                analyst=row[1],
                epsilon=row[2],
                delta=row[3],
                status=EntryStatus(row[4]),
                statement=row[5],
                created_at=row[6].astimezone(UTC),
                finished_at=row[7].astimezone(UTC) if row[7] is not None else None,
            )
            for row in rows
        ]

    def analysts(self) -> list[str]:
        with self._transaction() as conn:
            rows = conn.execute(
                sql.SQL("SELECT DISTINCT analyst FROM {} ORDER BY analyst").format(self._table)
            ).fetchall()
        return [analyst for (analyst,) in rows]

    def close(self) -> None:
        if self._closed:
            return
        try:
            with self._transaction() as conn:
                conn.execute(
                    sql.SQL(
                        "UPDATE {} SET status = 'abandoned', finished_at = %s "
                        "WHERE status = 'reserved' AND owner = %s"
                    ).format(self._table),
                    (_now(), self._owner),
                )
        finally:
            self._closed = True
            self._pool.close()
            self._owner_conn.close()

    def __repr__(self) -> str:
        return f"PostgresLedger(table={self.table!r})"


# --------------------------------------------------------------------------------------------------


def open_ledger(spec: str | os.PathLike[str]) -> Ledger:
    """A PostgresLedger for a postgresql:// or postgres:// URL, else a SQLite file at that path."""
    if isinstance(spec, str) and spec.startswith(("postgresql://", "postgres://")):
        return PostgresLedger(spec)
    if os.fspath(spec) == ":memory:":
        return SQLiteLedger(":memory:")
    path = Path(spec).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    return SQLiteLedger(path)
