"""Backends: run one SQL statement on the backing database and hand back its rows.

This package owns the connection to the backing database (embedded DuckDB, PostgreSQL, or Apache
Spark through Spark Connect), the lock-down of that connection (read-only, no file or network access
from SQL), and the list of live tables and columns with their types normalised to `ColumnType` (by
`normalise_type`, which lives with the type names in `dpproxy.policy.types` and is re-exported here).

A backend must never see noise, policies, budgets or analysts: it runs the SQL the engine wrote and
returns the true rows. Its exceptions (`BackendError`) carry the driver's text for the operator's
logs only; the engine replaces them with a fixed message before anything reaches an analyst, since
a database's error text can depend on protected values.

`Backend.stream` hands back the rows of one SELECT in batches (a generator), so that an answer of
millions of rows is never held whole in Python: DuckDB fetches them from its result in chunks,
PostgreSQL through a server-side cursor, Spark (for now) slices its collected rows. Closing the
generator stops the query and frees its connection.

Python values returned by `Backend.run` and `Backend.stream` are the same on every backend: int for
integers and for exact numerics of scale 0 (so PostgreSQL's `sum(bigint)`, a numeric, comes back as
int like DuckDB's HUGEINT does), Decimal for other exact numerics, float, str, bool, date and datetime.
"""

from __future__ import annotations

import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# The one table of type names: a live column's type means what the same name means in a policy.
from dpproxy import watchdog
from dpproxy.policy.types import ColumnType, normalise_type


@dataclass(frozen=True)
class LiveColumn:
    """A column as the backing database reports it."""

    name: str
    # None when dpproxy cannot handle the type (json, arrays, structs, hugeint, …).
    type: ColumnType | None
    # The native type text, e.g. "integer", "numeric(12,2)" (PostgreSQL) or "DECIMAL(12,2)" (DuckDB).
    sql_type: str
    # False when the database keeps the column NOT NULL (a view's columns: as it reports them).
    nullable: bool = True


@dataclass(frozen=True)
class LiveConstraint:
    """A PRIMARY KEY, UNIQUE or FOREIGN KEY constraint as the backing database declares it.

    Structure only: names, columns and rules. CHECK and exclusion constraints are not read (their
    expressions may hold literals chosen from the data), nor is any column DEFAULT."""

    table: str
    name: str
    kind: str  # "p" primary key, "u" unique, "f" foreign key: pg_constraint.contype
    columns: tuple[str, ...]
    referenced_schema: str | None = None  # foreign keys: the table and columns referenced
    referenced_table: str | None = None
    referenced_columns: tuple[str, ...] = ()
    update_rule: str = "a"  # pg_constraint.confupdtype / confdeltype / confmatchtype letters
    delete_rule: str = "a"
    match: str = "s"
    deferrable: bool = False
    deferred: bool = False
    index: str | None = None  # the index that enforces a primary key or unique constraint


@dataclass(frozen=True)
class LiveIndex:
    """An index on plain columns (no expression, no predicate: those may hold literals)."""

    table: str
    name: str
    columns: tuple[str, ...]  # key columns, then INCLUDE columns
    key_count: int
    unique: bool
    primary: bool
    method: str = "btree"  # pg_am.amname
    options: tuple[int, ...] = ()  # per key column: pg_index.indoption (1 DESC, 2 NULLS FIRST)


@dataclass(frozen=True)
class LiveStructure:
    """The declared structure of one schema's tables: never a statistic, a size or a value."""

    not_null: dict[str, frozenset[str]]  # per table, its NOT NULL columns
    constraints: tuple[LiveConstraint, ...]
    indexes: tuple[LiveIndex, ...]


class BackendError(Exception):
    """The backing database failed. Wraps the driver's exception; its text is for operators only."""


class BackendUnreachable(BackendError):
    """No connection to the backing database could be had, so nothing ran."""


# Rows per batch of `Backend.stream`: large enough that per-batch costs vanish, small enough that a
# batch of wide rows stays a few megabytes.
STREAM_BATCH_ROWS = 10_000

# Why a query was cancelled, as PostgreSQL words it after "canceling statement due to …".
USER_REQUEST = "user request"
STATEMENT_TIMEOUT = "statement timeout"


def backend_timeout_reason(seconds: float) -> str:
    """The reason of a query stopped by the backend's own time limit (`statement_timeout_s`)."""
    return f"dpproxy's time limit on backend queries ({seconds:g} s)"


BACKEND_TIMEOUT_HINT = (
    "the operator of dpproxy sets this limit (dpproxy serve --backend-timeout SECONDS); ask them to raise "
    "it, or ask a query that reads fewer rows"
)


class QueryCancelled(BackendError):
    """The query was cancelled through its Cancellation, or stopped by the backend's time limit.

    `started`: it had begun reading data. `reason` completes "canceling statement due to …" (the
    Cancellation's, or the backend's time limit); `hint` says what to do about it."""

    def __init__(
        self, message: str, *, started: bool, reason: str = USER_REQUEST, hint: str | None = None
    ) -> None:
        super().__init__(message)
        self.started = started
        self.reason = reason
        self.hint = hint

    @classmethod
    def by_time_limit(cls, seconds: float) -> QueryCancelled:
        """The exception for a query stopped by the backend's own time limit (`statement_timeout_s`)."""
        return cls(
            "stopped by the backend time limit",
            started=True,
            reason=backend_timeout_reason(seconds),
            hint=BACKEND_TIMEOUT_HINT,
        )

    @classmethod
    def of(cls, cancel: Cancellation, *, started: bool) -> QueryCancelled:
        """The exception for a query interrupted (or never started) through `cancel`."""
        message = "cancelled while running" if started else "cancelled before it started"
        return cls(message, started=started, reason=cancel.reason, hint=cancel.hint)


class Cancellation:
    """Lets another thread interrupt a running `Backend.run` (a client's CancelRequest, shutdown).

    The backend attaches an interrupt function while its query runs; `cancel()` calls it, or marks
    the query cancelled before it starts so that it never runs. The first cancel's `reason` (and
    `hint`) is the one reported. `cancel_after` arms a timer (statement_timeout); `disarm` stops it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._interrupt: Callable[[], None] | None = None
        self._timers: list[watchdog.Deadline] = []
        self.cancelled = False
        self.reason = USER_REQUEST
        self.hint: str | None = None

    def cancel(self, reason: str = USER_REQUEST, hint: str | None = None) -> None:
        with self._lock:
            if not self.cancelled:
                self.reason, self.hint = reason, hint
            self.cancelled = True
            interrupt = self._interrupt
        if interrupt is not None:
            interrupt()

    def cancel_after(self, seconds: float, reason: str, hint: str | None = None) -> None:
        """Cancel with `reason` once `seconds` have passed, unless `disarm` comes first. The deadline
        waits on the watchdog thread; the cancel itself runs in a thread of its own, since
        interrupting a backend query can wait on the network (PostgreSQL's cancel request)."""

        def fire() -> None:
            kwargs = {"reason": reason, "hint": hint}
            threading.Thread(target=self.cancel, kwargs=kwargs, name="dpproxy-cancel", daemon=True).start()

        deadline = watchdog.after(seconds, fire)
        with self._lock:
            self._timers.append(deadline)

    def disarm(self) -> None:
        with self._lock:
            timers, self._timers = self._timers, []
        for timer in timers:
            timer.cancel()

    def attach(self, interrupt: Callable[[], None]) -> None:
        with self._lock:
            self._interrupt = interrupt
            cancelled = self.cancelled
        if cancelled:
            interrupt()

    def detach(self) -> None:
        with self._lock:
            self._interrupt = None


class Backend(ABC):
    """Runs read-only SQL on one backing database. Thread-safe."""

    dialect: str  # sqlglot dialect name
    default_schema: str

    @abstractmethod
    def run(self, sql: str, *, cancel: Cancellation | None = None) -> list[tuple]:
        """Run one read-only SELECT and return all of its rows.

        `cancel` interrupts it from another thread: QueryCancelled is raised (started=False when
        the cancellation came before the query was sent)."""

    def stream(
        self, sql: str, *, cancel: Cancellation | None = None, batch_rows: int = STREAM_BATCH_ROWS
    ) -> Iterator[list[tuple]]:
        """Run one read-only SELECT and yield its rows in batches of at most `batch_rows`.

        The query is sent when the first batch is asked for; closing the generator early stops it.
        Cancellation and the time limit behave as in `run` (QueryCancelled, started=False only when
        the query was never sent); the time limit counts the backend's own work, not the time the
        caller spends between batches. This default runs `run` and slices its rows (a backend that
        can fetch in batches overrides it)."""
        rows = self.run(sql, cancel=cancel)
        for start in range(0, len(rows), batch_rows):
            yield rows[start : start + batch_rows]

    @abstractmethod
    def unique_columns(self, schema: str | None = None) -> dict[str, set[str]]:
        """Per table, the columns the database guarantees unique and not NULL on their own
        (a one-column PRIMARY KEY, or a one-column UNIQUE constraint on a NOT NULL column).

        The engine then takes each row read by a plain `FROM table` to be a different person and skips
        per-person bounding, so a column reported here must be unique over every such row, under the
        equality SQL groups and joins it by: when in doubt, leave it out (that costs only speed and noise)."""

    @abstractmethod
    def tables(self, schema: str | None = None) -> dict[str, list[LiveColumn]]:
        """Base tables and views of `schema` (default: `default_schema`), columns in ordinal order."""

    def structure(self, schema: str | None = None) -> LiveStructure:
        """The keys, unique constraints, NOT NULL columns and plain indexes of `schema`'s tables
        (default: `default_schema`), read once at start for the shadow catalog. A backend that cannot
        say reports none."""
        return LiveStructure({}, (), ())

    def usage(self) -> dict[str, int]:
        """Its connections by state, for the operator's metrics (dpproxy.metrics): "in_use",
        "idle" and "waiting" (callers queued for one). A backend that cannot say reports none."""
        return {}

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_PG_URL = re.compile(r"^postgres(ql)?://", re.IGNORECASE)
_PG_KEYWORDS = re.compile(r"(^|\s)(dbname|host)\s*=")
_DUCKDB_SUFFIXES = (".duckdb", ".db")

# The longest one backend query may run by default (`dpproxy serve --backend-timeout`).
DEFAULT_STATEMENT_TIMEOUT_S = 30.0

DSN_FORMS = (
    "a PostgreSQL URL (postgresql://user@host:5432/db), a libpq string (host=… dbname=…), "
    "a Spark Connect URL (sc://host:15002/;token=…;use_ssl=true), "
    "or a DuckDB file (duckdb:PATH, or a path ending in .duckdb or .db)"
)


def open_backend(
    dsn: str, *, acquire_timeout_s: float | None = None, statement_timeout_s: float | None = None
) -> Backend:
    """Open the backend a DSN names; DuckDB files are opened read-only and locked down.

    `acquire_timeout_s`: how long a PostgreSQL query waits for a pooled connection before the
    database counts as unreachable (None: `postgres.DEFAULT_ACQUIRE_TIMEOUT_S`). DuckDB has no pool
    and ignores it. `statement_timeout_s`: the longest one backend query may run before it is
    stopped with QueryCancelled (None: DEFAULT_STATEMENT_TIMEOUT_S; 0: no limit).
    """
    timeout_ms: int | None = round(
        (DEFAULT_STATEMENT_TIMEOUT_S if statement_timeout_s is None else statement_timeout_s) * 1000
    )
    # Imported here so that a DuckDB-only deployment never loads psycopg or pyspark, and vice versa.
    if dsn.strip().lower().startswith("sc://"):
        from dpproxy.backends.spark import SparkBackend

        return SparkBackend(dsn, statement_timeout_ms=timeout_ms or None)
    if _PG_URL.match(dsn) or _PG_KEYWORDS.search(dsn):
        from dpproxy.backends.postgres import DEFAULT_ACQUIRE_TIMEOUT_S, PostgresBackend

        if acquire_timeout_s is None:
            acquire_timeout_s = DEFAULT_ACQUIRE_TIMEOUT_S
        return PostgresBackend(dsn, acquire_timeout_s=acquire_timeout_s, statement_timeout_ms=timeout_ms or 0)
    path: str | None = None
    if dsn.startswith("duckdb:"):
        path = dsn.removeprefix("duckdb:")
    elif dsn.lower().endswith(_DUCKDB_SUFFIXES) or os.path.isfile(dsn):
        path = dsn
    if path:
        from dpproxy.backends.duckdb import DuckDBBackend

        return DuckDBBackend(Path(path), statement_timeout_ms=timeout_ms or None)
    # The DSN is not echoed: it may carry a password.
    raise ValueError(f"the backend DSN is not recognised: give {DSN_FORMS}")


__all__ = [
    "BACKEND_TIMEOUT_HINT",
    "DEFAULT_STATEMENT_TIMEOUT_S",
    "DSN_FORMS",
    "STATEMENT_TIMEOUT",
    "STREAM_BATCH_ROWS",
    "USER_REQUEST",
    "Backend",
    "BackendError",
    "BackendUnreachable",
    "Cancellation",
    "LiveColumn",
    "LiveConstraint",
    "LiveIndex",
    "LiveStructure",
    "QueryCancelled",
    "backend_timeout_reason",
    "normalise_type",
    "open_backend",
]
