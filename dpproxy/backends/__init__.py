"""Backends: run one SQL statement on the backing database and hand back its rows.

This package owns the connection to the backing database (embedded DuckDB or PostgreSQL), the
lock-down of that connection (read-only, no file or network access from SQL), and the list of live
tables and columns with their types normalised to `ColumnType` (by `normalise_type`, which lives with
the type names in `dpproxy.policy.types` and is re-exported here).

A backend must never see noise, policies, budgets or analysts: it runs the SQL the engine wrote and
returns the true rows. Its exceptions (`BackendError`) carry the driver's text for the operator's
logs only; the engine replaces them with a fixed message before anything reaches an analyst, since
a database's error text can depend on protected values.

Python values returned by `Backend.run` are the same on every backend: int for integers and for
exact numerics of scale 0 (so PostgreSQL's `sum(bigint)`, a numeric, comes back as int like DuckDB's
HUGEINT does), Decimal for other exact numerics, float, str, bool, date and datetime.
"""

from __future__ import annotations

import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

# The one table of type names: a live column's type means what the same name means in a policy.
from dpproxy.policy.types import ColumnType, normalise_type


@dataclass(frozen=True)
class LiveColumn:
    """A column as the backing database reports it."""

    name: str
    # None when dpproxy cannot handle the type (json, arrays, structs, hugeint, …).
    type: ColumnType | None
    # The native type text, e.g. "integer", "numeric(12,2)" (PostgreSQL) or "DECIMAL(12,2)" (DuckDB).
    sql_type: str


class BackendError(Exception):
    """The backing database failed. Wraps the driver's exception; its text is for operators only."""


class BackendUnreachable(BackendError):
    """No connection to the backing database could be had, so nothing ran."""


class QueryCancelled(BackendError):
    """The query was cancelled through its Cancellation. `started`: it had begun reading data."""

    def __init__(self, message: str, *, started: bool) -> None:
        super().__init__(message)
        self.started = started


class Cancellation:
    """Lets another thread interrupt a running `Backend.run` (a client's CancelRequest, shutdown).

    The backend attaches an interrupt function while its query runs; `cancel()` calls it, or marks
    the query cancelled before it starts so that it never runs.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._interrupt: Callable[[], None] | None = None
        self.cancelled = False

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            interrupt = self._interrupt
        if interrupt is not None:
            interrupt()

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

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Backend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_PG_URL = re.compile(r"^postgres(ql)?://", re.IGNORECASE)
_PG_KEYWORDS = re.compile(r"(^|\s)(dbname|host)\s*=")
_DUCKDB_SUFFIXES = (".duckdb", ".db")

DSN_FORMS = (
    "a PostgreSQL URL (postgresql://user@host:5432/db), a libpq string (host=… dbname=…), "
    "or a DuckDB file (duckdb:PATH, or a path ending in .duckdb or .db)"
)


def open_backend(dsn: str, *, acquire_timeout_s: float | None = None) -> Backend:
    """Open the backend a DSN names; DuckDB files are opened read-only and locked down.

    `acquire_timeout_s`: how long a PostgreSQL query waits for a pooled connection before the
    database counts as unreachable (None: `postgres.DEFAULT_ACQUIRE_TIMEOUT_S`). DuckDB has no pool
    and ignores it.
    """
    # Imported here so that a DuckDB-only deployment never loads psycopg and vice versa.
    if _PG_URL.match(dsn) or _PG_KEYWORDS.search(dsn):
        from dpproxy.backends.postgres import DEFAULT_ACQUIRE_TIMEOUT_S, PostgresBackend

        if acquire_timeout_s is None:
            acquire_timeout_s = DEFAULT_ACQUIRE_TIMEOUT_S
        return PostgresBackend(dsn, acquire_timeout_s=acquire_timeout_s)
    path: str | None = None
    if dsn.startswith("duckdb:"):
        path = dsn.removeprefix("duckdb:")
    elif dsn.lower().endswith(_DUCKDB_SUFFIXES) or os.path.isfile(dsn):
        path = dsn
    if path:
        from dpproxy.backends.duckdb import DuckDBBackend

        return DuckDBBackend(Path(path))
    # The DSN is not echoed: it may carry a password.
    raise ValueError(f"the backend DSN is not recognised: give {DSN_FORMS}")


__all__ = [
    "DSN_FORMS",
    "Backend",
    "BackendError",
    "BackendUnreachable",
    "Cancellation",
    "LiveColumn",
    "QueryCancelled",
    "normalise_type",
    "open_backend",
]
