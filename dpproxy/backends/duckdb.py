"""The embedded DuckDB backend, opened locked down.

This module owns the DuckDB connection and its lock-down: files are opened read-only, SQL cannot
reach the file system or the network (no read_csv, COPY, ATTACH of files, httpfs), cannot install or
load extensions, cannot read Python variables by name (replacement scans), and cannot undo any of
this because the configuration is locked before the first query. `run` also refuses anything but a
single SELECT, so an in-memory database (which cannot be opened read-only) is read-only through it.

It must never add noise, know about policies, or let a DuckDB connection be used by two threads at
once (each query takes a cursor of its own from a small pool).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Generic, TypeVar

import duckdb
import sqlglot
from sqlglot import exp

from dpproxy import watchdog
from dpproxy.backends import (
    DEFAULT_STATEMENT_TIMEOUT_S,
    STREAM_BATCH_ROWS,
    Backend,
    BackendError,
    BackendUnreachable,
    Cancellation,
    LiveColumn,
    LiveConstraint,
    LiveIndex,
    LiveStructure,
    QueryCancelled,
)
from dpproxy.policy.types import normalise_type

# Settings that close every door from SQL to the outside; `lock_configuration` then freezes them.
LOCKDOWN: dict[str, bool | str] = {
    # No spill directory: with external access off DuckDB still lets SQL reach its temp directory.
    # First: it can no longer be changed once external access is off.
    "temp_directory": "",
    "enable_external_access": False,  # read_csv/parquet/json, COPY, ATTACH of files, httpfs, INSTALL
    "python_enable_replacements": False,  # `FROM name` must not find a Python variable called name
    "python_scan_all_frames": False,  # …nor look for one in the frames of run()'s callers
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "allow_unsigned_extensions": False,
    # Timestamps with time zone are truncated, extracted and compared in UTC, as on PostgreSQL
    # (whose sessions dpproxy also sets to UTC): both engines then compute the same values.
    "TimeZone": "UTC",
}

T = TypeVar("T")
S = TypeVar("S")  # what a pooled cursor carries (CursorPool)

DEFAULT_STATEMENT_TIMEOUT_MS = round(DEFAULT_STATEMENT_TIMEOUT_S * 1000)

_SCALE_ZERO_DECIMAL = re.compile(r"^DECIMAL\(\d+,\s*0\)$")

_TABLES_SQL = """
SELECT c.table_name, c.column_name, c.data_type, c.is_nullable
FROM information_schema.columns AS c
JOIN information_schema.tables AS t
  ON t.table_catalog = c.table_catalog AND t.table_schema = c.table_schema AND t.table_name = c.table_name
WHERE c.table_catalog = current_database()
  AND c.table_schema = ?
  AND t.table_type IN ('BASE TABLE', 'VIEW', 'LOCAL TEMPORARY')
ORDER BY c.table_name, c.ordinal_position
"""


# The structure the shadow catalog shows (dpproxy/wire/catalog/structure.py): PRIMARY KEY, UNIQUE,
# FOREIGN KEY and NOT NULL constraints (never CHECK: its expression may hold literals), and indexes
# on plain columns. Names, columns and rules only, never a statistic.
_STRUCTURE_CONSTRAINTS_SQL = """
SELECT table_name, constraint_type, constraint_column_names, referenced_table, referenced_column_names
FROM duckdb_constraints()
WHERE database_name = current_database() AND schema_name = ?
  AND constraint_type IN ('PRIMARY KEY', 'UNIQUE', 'FOREIGN KEY', 'NOT NULL')
ORDER BY table_name, constraint_index
"""

_STRUCTURE_INDEXES_SQL = """
SELECT table_name, index_name, is_unique, is_primary, sql
FROM duckdb_indexes()
WHERE database_name = current_database() AND schema_name = ?
ORDER BY table_name, index_name
"""

# One-column PRIMARY KEY, UNIQUE and NOT NULL constraints, each with whether its column may compare
# under a collation. DuckDB's unique indexes compare the bytes while GROUP BY and joins compare under
# the column's collation (COLLATE NOCASE, or the `default_collation` setting): a primary key admits
# 'A' and 'a', which SQL then takes for one person. Only VARCHAR columns take a collation, and a
# table's `sql` is rebuilt from the catalog, so a COLLATE anywhere in it marks its text columns.
_CONSTRAINTS_SQL = r"""
SELECT k.table_name, k.constraint_type, k.constraint_column_names,
       coalesce(
           c.data_type = 'VARCHAR'
           AND (regexp_matches(t.sql, '\bCOLLATE\b', 'i') OR current_setting('default_collation') <> ''),
           true
       ) AS collated
FROM duckdb_constraints() AS k
JOIN duckdb_tables() AS t ON t.table_oid = k.table_oid
LEFT JOIN duckdb_columns() AS c
  ON c.table_oid = k.table_oid AND c.column_name = k.constraint_column_names[1]
WHERE k.database_name = current_database() AND k.schema_name = ?
  AND k.constraint_type IN ('PRIMARY KEY', 'UNIQUE', 'NOT NULL')
"""


class InterruptGuard:
    """Interrupts one statement on a checked-out cursor (a cancel, the time limit), and never a
    later statement on the same cursor: once `finish` is called, `interrupt` does nothing. Also the
    shadow catalog's (dpproxy.wire.catalog.shadow), whose cursors are DuckDB's too."""

    def __init__(self, cursor: duckdb.DuckDBPyConnection) -> None:
        self._cursor = cursor
        self._lock = threading.Lock()
        self._finished = False
        self.timed_out = False

    def interrupt(self) -> None:
        with self._lock:
            if not self._finished:
                self._cursor.interrupt()

    def time_out(self) -> None:
        self.timed_out = True
        self.interrupt()

    def finish(self) -> None:
        with self._lock:
            self._finished = True


class CursorPool(Generic[S]):
    """The cursors of one DuckDB database's concurrent calls: DuckDB connections are not safe to
    share between threads, so each call checks out a cursor of its own (another connection to the
    same database) and idle ones are kept for the next. Each cursor carries a state of its user's
    (`fresh` gives a new cursor's; the shadow catalog's is whose session variables it holds).
    Closing closes the idle cursors and the database; a cursor checked in after that is closed.
    The backend's pool and the shadow catalog's (dpproxy.wire.catalog.shadow)."""

    def __init__(
        self, conn: duckdb.DuckDBPyConnection, fresh: Callable[[], S], closed: Callable[[], Exception]
    ) -> None:
        self._conn = conn
        self._fresh = fresh
        self._closed_error = closed  # what a checkout after close raises
        self._lock = threading.Lock()
        self._idle: list[tuple[duckdb.DuckDBPyConnection, S]] = []
        self._busy = 0  # cursors checked out (usage)
        self._closed = False

    def checkout(self) -> tuple[duckdb.DuckDBPyConnection, S]:
        with self._lock:
            if self._closed:
                raise self._closed_error()
            self._busy += 1
            return self._idle.pop() if self._idle else (self._conn.cursor(), self._fresh())

    def checkin(self, cursor: duckdb.DuckDBPyConnection, state: S) -> None:
        with self._lock:
            self._busy -= 1
            if not self._closed:
                self._idle.append((cursor, state))
                return
        cursor.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle, self._idle = self._idle, []
        for cursor, _ in idle:
            cursor.close()
        self._conn.close()

    def usage(self) -> dict[str, int]:
        """Cursors running a call, and idle ones kept."""
        with self._lock:
            return {"in_use": self._busy, "idle": len(self._idle), "waiting": 0}


def _single_select(cursor: duckdb.DuckDBPyConnection, sql: str) -> duckdb.Statement:
    statements = cursor.extract_statements(sql)
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        raise BackendError("the backend runs exactly one SELECT statement per call")
    return statements[0]


def _integral_columns(description: Sequence[Sequence[object]]) -> list[int]:
    """Result columns of DECIMAL(p, 0): their values are returned as ints."""
    return [i for i, column in enumerate(description) if _SCALE_ZERO_DECIMAL.match(str(column[1]))]


class DuckDBBackend(Backend):
    """A DuckDB database file opened read-only and locked down, or an existing connection locked down.

    `statement_timeout_ms` interrupts a query that runs longer (None: no limit).
    """

    dialect = "duckdb"
    default_schema = "main"

    def __init__(
        self,
        database: str | Path | duckdb.DuckDBPyConnection,
        *,
        statement_timeout_ms: int | None = DEFAULT_STATEMENT_TIMEOUT_MS,
    ) -> None:
        if isinstance(database, duckdb.DuckDBPyConnection):
            self._conn = database
            _lock_down(self._conn)
            self.description = "DuckDB connection"
        else:
            path = Path(database)
            self.description = f"DuckDB file {path}"
            try:
                # DuckDB applies connect-time settings in its own order, and refuses temp_directory
                # once external access is off: lock down with ordered SETs before any query instead.
                self._conn = duckdb.connect(str(path), read_only=True, config={"temp_directory": ""})
            except duckdb.Error as exc:
                raise BackendUnreachable(f"could not open the DuckDB file {path}: {exc}") from exc
            try:
                _lock_down(self._conn)
            except BaseException:
                self._conn.close()
                raise
        self._statement_timeout_ms = statement_timeout_ms
        self._cursors: CursorPool[None] = CursorPool(
            self._conn, lambda: None, lambda: BackendUnreachable("the DuckDB backend is closed")
        )

    @classmethod
    def from_statements(
        cls, statements: Iterable[str], *, statement_timeout_ms: int | None = DEFAULT_STATEMENT_TIMEOUT_MS
    ) -> DuckDBBackend:
        """An in-memory database built by running trusted DDL/INSERT statements, then locked down.

        For tests and examples: the statements run before the lock-down, with full access.
        """
        conn = duckdb.connect(":memory:")
        try:
            for statement in statements:
                conn.execute(statement)
        except BaseException:
            conn.close()
            raise
        return cls(conn, statement_timeout_ms=statement_timeout_ms)

    def run(self, sql: str, *, cancel: Cancellation | None = None) -> list[tuple]:
        if cancel is not None and cancel.cancelled:
            raise QueryCancelled.of(cancel, started=False)
        cursor = self._checkout()
        guard = InterruptGuard(cursor)
        deadline: watchdog.Deadline | None = None
        try:
            statement = _single_select(cursor, sql)
            if self._statement_timeout_ms is not None:
                deadline = watchdog.after(self._statement_timeout_ms / 1000, guard.time_out)
            if cancel is not None:
                cancel.attach(guard.interrupt)
            result = cursor.execute(statement)
            description = result.description or []
            rows = result.fetchall()
        except duckdb.Error as exc:
            raise self._failure(exc, cancel, timed_out=guard.timed_out) from exc
        finally:
            if deadline is not None:
                deadline.cancel()
            self._finished(cursor, guard, cancel)
        integral = _integral_columns(description)
        if integral:
            rows = [_decimals_to_int(row, integral) for row in rows]
        return rows

    def stream(
        self, sql: str, *, cancel: Cancellation | None = None, batch_rows: int = STREAM_BATCH_ROWS
    ) -> Iterator[list[tuple]]:
        """The rows of one SELECT in batches, fetched from DuckDB's result chunk by chunk. The time
        limit counts only the time spent inside DuckDB (executing and fetching), summed over the
        batches; the cursor stays checked out until the generator ends or is closed."""
        if cancel is not None and cancel.cancelled:
            raise QueryCancelled.of(cancel, started=False)
        cursor = self._checkout()
        guard = InterruptGuard(cursor)
        left = None if self._statement_timeout_ms is None else self._statement_timeout_ms / 1000

        def timed(step: Callable[[], T]) -> T:
            """One call into DuckDB under what is left of the time limit."""
            nonlocal left
            if cancel is not None and cancel.cancelled:
                raise QueryCancelled.of(cancel, started=True)
            if left is None:
                return step()
            if left <= 0:
                guard.timed_out = True
                raise QueryCancelled.by_time_limit(self._statement_timeout_ms / 1000)  # type: ignore[operator]
            deadline = watchdog.after(left, guard.time_out)
            began = time.monotonic()
            try:
                return step()
            finally:
                deadline.cancel()
                left -= time.monotonic() - began

        try:
            statement = _single_select(cursor, sql)
            if cancel is not None:
                cancel.attach(guard.interrupt)
            result = timed(lambda: cursor.execute(statement))
            integral = _integral_columns(result.description or [])
            while True:
                rows = timed(lambda: result.fetchmany(batch_rows))
                if not rows:
                    return
                yield [_decimals_to_int(row, integral) for row in rows] if integral else rows
        except duckdb.Error as exc:
            raise self._failure(exc, cancel, timed_out=guard.timed_out) from exc
        finally:
            self._finished(cursor, guard, cancel)

    def _finished(
        self, cursor: duckdb.DuckDBPyConnection, guard: InterruptGuard, cancel: Cancellation | None
    ) -> None:
        """A statement on `cursor` is over: nothing may interrupt it any more, and it goes back."""
        if cancel is not None:
            cancel.detach()
        guard.finish()
        self._checkin(cursor)

    def _failure(self, exc: duckdb.Error, cancel: Cancellation | None, *, timed_out: bool) -> Exception:
        """What a statement's failure means to the engine: a cancel, the time limit, or an error."""
        if cancel is not None and cancel.cancelled:
            return QueryCancelled.of(cancel, started=True)
        if timed_out and self._statement_timeout_ms is not None:
            return QueryCancelled.by_time_limit(self._statement_timeout_ms / 1000)
        return BackendError(f"DuckDB failed: {exc}")

    def _catalog_rows(self, sql: str, schema: str | None, what: str) -> list[tuple]:
        """Rows of a catalog query over one schema (the default one unless given)."""
        cursor = self._checkout()
        try:
            return cursor.execute(sql, [schema or self.default_schema]).fetchall()
        except duckdb.Error as exc:
            raise BackendError(f"DuckDB failed to list {what}: {exc}") from exc
        finally:
            self._checkin(cursor)

    def unique_columns(self, schema: str | None = None) -> dict[str, set[str]]:
        found = self._catalog_rows(_CONSTRAINTS_SQL, schema, "constraints")
        unique: dict[str, set[str]] = {}
        not_null: dict[str, set[str]] = {}
        for table_name, kind, columns, collated in found:
            if len(columns) != 1 or (collated and kind != "NOT NULL"):
                continue
            if kind == "PRIMARY KEY":
                unique.setdefault(table_name, set()).add(columns[0])
                not_null.setdefault(table_name, set()).add(columns[0])
            elif kind == "UNIQUE":
                unique.setdefault(table_name, set()).add(columns[0])
            elif kind == "NOT NULL":
                not_null.setdefault(table_name, set()).add(columns[0])
        enforced = {t: cols & not_null.get(t, set()) for t, cols in unique.items()}
        return {t: cols for t, cols in enforced.items() if cols}

    def structure(self, schema: str | None = None) -> LiveStructure:
        """DuckDB's constraints under the names PostgreSQL would give them (`patients_pkey`,
        `visits_patient_id_fkey`, `t_a_b_key`), each primary key and unique constraint with the
        index PostgreSQL would create for it; DuckDB's ART indexes are shown as btree indexes."""
        not_null: dict[str, set[str]] = {}
        constraints: list[LiveConstraint] = []
        indexes: list[LiveIndex] = []
        own_schema = schema or self.default_schema
        for table, kind, columns, referenced, referenced_columns in self._catalog_rows(
            _STRUCTURE_CONSTRAINTS_SQL, schema, "constraints"
        ):
            columns = tuple(columns)
            if kind == "NOT NULL":
                not_null.setdefault(table, set()).update(columns)
            elif kind in ("PRIMARY KEY", "UNIQUE"):
                primary = kind == "PRIMARY KEY"
                name = f"{table}_pkey" if primary else f"{table}_{'_'.join(columns)}_key"
                constraints.append(LiveConstraint(table, name, "p" if primary else "u", columns, index=name))
                indexes.append(LiveIndex(table, name, columns, len(columns), True, primary))
            elif referenced:
                constraints.append(
                    LiveConstraint(
                        table,
                        f"{table}_{'_'.join(columns)}_fkey",
                        "f",
                        columns,
                        referenced_schema=own_schema,
                        referenced_table=referenced,
                        referenced_columns=tuple(referenced_columns),
                    )
                )
        found = self._catalog_rows(_STRUCTURE_INDEXES_SQL, schema, "indexes")
        for table, name, unique, primary, sql in found:
            columns = _plain_index_columns(sql)
            if columns:
                indexes.append(LiveIndex(table, name, columns, len(columns), bool(unique), bool(primary)))
        return LiveStructure(
            {t: frozenset(c) for t, c in not_null.items()}, tuple(constraints), tuple(indexes)
        )

    def tables(self, schema: str | None = None) -> dict[str, list[LiveColumn]]:
        found = self._catalog_rows(_TABLES_SQL, schema, "tables")
        tables: dict[str, list[LiveColumn]] = {}
        for table_name, column_name, data_type, nullable in found:
            tables.setdefault(table_name, []).append(
                LiveColumn(column_name, normalise_type(data_type), data_type, nullable != "NO")
            )
        return tables

    def close(self) -> None:
        self._cursors.close()

    def usage(self) -> dict[str, int]:
        """Cursors (DuckDB connections to the one database) running a query, and idle ones kept."""
        return self._cursors.usage()

    def _checkout(self) -> duckdb.DuckDBPyConnection:
        return self._cursors.checkout()[0]

    def _checkin(self, cursor: duckdb.DuckDBPyConnection) -> None:
        self._cursors.checkin(cursor, None)


def _plain_index_columns(sql: str | None) -> tuple[str, ...]:
    """The columns of `CREATE [UNIQUE] INDEX … ON t (a, "b")`; empty when any key is an expression
    (its text may hold literals) or the statement cannot be read."""
    try:
        created = sqlglot.parse_one(sql or "", read="duckdb")
    except sqlglot.errors.SqlglotError:
        return ()
    params = created.this.args.get("params") if isinstance(created, exp.Create) else None
    keys = params.args.get("columns") if params is not None else None
    columns: list[str] = []
    for key in keys or ():
        column = key.this if isinstance(key, exp.Ordered) else key
        if not isinstance(column, exp.Column) or column.table:
            return ()
        columns.append(column.name)
    return tuple(columns)


def _lock_down(conn: duckdb.DuckDBPyConnection) -> None:
    """Apply LOCKDOWN to an open connection's database, lock it, and check that every setting holds."""
    try:
        # GLOBAL: a plain SET of the python_* settings changes only this connection, and every
        # query runs on a cursor, which is a connection of its own.
        for name, value in LOCKDOWN.items():
            literal = f"'{value}'" if isinstance(value, str) else str(value).lower()
            conn.execute(f"SET GLOBAL {name} = {literal}")
        conn.execute("SET GLOBAL lock_configuration = true")
        with conn.cursor() as cursor:
            for name, value in {**LOCKDOWN, "lock_configuration": True}.items():
                (actual,) = cursor.execute("SELECT current_setting(?)", [name]).fetchone() or (None,)
                if actual != value or type(actual) is not type(value):
                    raise BackendError(f"DuckDB setting {name} is {actual!r}, not {value!r}")
    except duckdb.Error as exc:
        raise BackendError(f"could not lock down the DuckDB connection: {exc}") from exc


def _decimals_to_int(row: tuple, columns: list[int]) -> tuple:
    values = list(row)
    for i in columns:
        if values[i] is not None:
            values[i] = int(values[i])
    return tuple(values)
