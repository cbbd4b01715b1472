"""The PostgreSQL backend: a psycopg 3 connection pool whose sessions can only read.

This module owns the pool and the rules every session follows: read-only by default
(`default_transaction_read_only`), a statement timeout, autocommit, and each query run as a single
statement (extended protocol, which refuses `a; b`) inside its own `BEGIN READ ONLY … ROLLBACK`, so
that even a statement that changes a session setting is undone before the connection is reused.

It must never add noise or know about policies. The operator should still connect with a role that
may only SELECT the exposed tables: read-only transactions are a second lock, not the first.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import struct
from collections.abc import Iterator

import psycopg
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Loader
from psycopg.pq import Format
from psycopg_pool import ConnectionPool, PoolTimeout

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

DEFAULT_STATEMENT_TIMEOUT_MS = round(DEFAULT_STATEMENT_TIMEOUT_S * 1000)
# How long a query waits for a free pooled connection (all busy, or being replaced after the server
# dropped them) before the database counts as unreachable and the query fails without running.
DEFAULT_ACQUIRE_TIMEOUT_S = 30.0

_TABLES_SQL = """
SELECT c.relname, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), NOT a.attnotnull
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_attribute AS a ON a.attrelid = c.oid
WHERE n.nspname = %s
  AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
  AND a.attnum > 0
  AND NOT a.attisdropped
ORDER BY c.relname, a.attnum
"""

# Columns PostgreSQL keeps unique over every row a plain `FROM table` reads (without ONLY), under the
# equality GROUP BY and joins use. Each condition closes a way to get two rows of one unit value:
# - an ordinary table ('r') with no inheritance children: a parent's index covers its own rows only,
#   while reading it includes its children's. A partitioned table ('p') only through an index on the
#   partitioned table itself: PostgreSQL 15 requires such an index to contain the partition key (so
#   with one column, the partition key is that column and partitions hold disjoint values), keeps it
#   invalid until every partition has a matching index, and refuses foreign-table partitions under
#   it. A partition's own index covers only that partition. Views, materialized views and foreign
#   tables never count, whatever their indexes;
# - a valid, live index (not one half-built by a failed CREATE INDEX CONCURRENTLY, nor being dropped),
#   with one key column (INCLUDE columns do not take part in uniqueness), no predicate (a partial
#   index leaves the other rows free), no expression;
# - checked immediately: a DEFERRABLE constraint also holds on committed data, but is left out rather
#   than relied on (leaving a column out costs only speed and noise);
# - the operator class and collation the column itself compares with: a unique index under COLLATE
#   "C" (or text_pattern_ops) on a column with a case-insensitive collation admits 'A' and 'a', which
#   GROUP BY then takes for one person;
# - a NOT NULL column: UNIQUE lets NULLs repeat (unless NULLS NOT DISTINCT, moot without NULLs).
_UNIQUE_SQL = """
SELECT c.relname, a.attname
FROM pg_catalog.pg_index AS i
JOIN pg_catalog.pg_class AS c ON c.oid = i.indrelid
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_attribute AS a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]
JOIN pg_catalog.pg_opclass AS o ON o.oid = i.indclass[0]
WHERE n.nspname = %s
  AND (c.relkind = 'p'
       OR (c.relkind = 'r'
           AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_inherits AS h WHERE h.inhparent = c.oid)))
  AND i.indisunique AND i.indisvalid AND i.indislive AND i.indimmediate
  AND i.indnkeyatts = 1 AND i.indpred IS NULL AND i.indexprs IS NULL
  AND o.opcdefault AND i.indcollation[0] = a.attcollation
  AND a.attnotnull AND NOT a.attisdropped
"""

# The structure the shadow catalog shows (dpproxy/wire/catalog/structure.py), of ordinary and
# partitioned tables: PRIMARY KEY, UNIQUE and FOREIGN KEY constraints (never CHECK or exclusion
# constraints, whose expressions may hold literals), NOT NULL columns, and indexes on plain columns
# (never an expression or partial index: its text may hold literals). Names, columns and rules only:
# no reltuples, relpages, pg_stats or sizes.
_STRUCTURE_CONSTRAINTS_SQL = """
SELECT t.relname, c.conname, c.contype,
       ARRAY(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY AS k(attnum, i)
             JOIN pg_catalog.pg_attribute AS a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
             ORDER BY k.i),
       rn.nspname, rt.relname,
       ARRAY(SELECT a.attname::text FROM unnest(c.confkey) WITH ORDINALITY AS k(attnum, i)
             JOIN pg_catalog.pg_attribute AS a ON a.attrelid = c.confrelid AND a.attnum = k.attnum
             ORDER BY k.i),
       c.confupdtype, c.confdeltype, c.confmatchtype, c.condeferrable, c.condeferred,
       CASE WHEN c.contype IN ('p', 'u') THEN ci.relname END
FROM pg_catalog.pg_constraint AS c
JOIN pg_catalog.pg_class AS t ON t.oid = c.conrelid
JOIN pg_catalog.pg_namespace AS n ON n.oid = t.relnamespace
LEFT JOIN pg_catalog.pg_class AS rt ON rt.oid = c.confrelid
LEFT JOIN pg_catalog.pg_namespace AS rn ON rn.oid = rt.relnamespace
LEFT JOIN pg_catalog.pg_class AS ci ON ci.oid = c.conindid
WHERE n.nspname = %s AND t.relkind IN ('r', 'p') AND c.contype IN ('p', 'u', 'f')
ORDER BY t.relname, c.conname
"""

_STRUCTURE_NOT_NULL_SQL = """
SELECT c.relname, a.attname
FROM pg_catalog.pg_attribute AS a
JOIN pg_catalog.pg_class AS c ON c.oid = a.attrelid
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped AND a.attnotnull
"""

_STRUCTURE_INDEXES_SQL = """
SELECT t.relname, ci.relname, i.indisunique, i.indisprimary, am.amname, i.indnkeyatts,
       ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, i)
             JOIN pg_catalog.pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
             ORDER BY k.i),
       i.indoption::int2[]
FROM pg_catalog.pg_index AS i
JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
JOIN pg_catalog.pg_class AS ci ON ci.oid = i.indexrelid
JOIN pg_catalog.pg_namespace AS n ON n.oid = t.relnamespace
JOIN pg_catalog.pg_am AS am ON am.oid = ci.relam
WHERE n.nspname = %s AND t.relkind IN ('r', 'p')
  AND i.indexprs IS NULL AND i.indpred IS NULL AND NOT (0 = ANY (i.indkey::int2[]))
  AND i.indisvalid AND i.indislive AND NOT i.indisexclusion
ORDER BY t.relname, ci.relname
"""

# Server encodings every stored value of which converts to UTF-8 (the client encoding sessions pin).
_TOTAL_ENCODINGS = frozenset({"UTF8", "LATIN1"})

_CURSOR_NUMBERS = itertools.count()  # names of server-side cursors (each lives in its own transaction)

_NUMERIC_HEAD = struct.Struct("!HhHH")  # ndigits, weight, sign, dscale
_NUMERIC_FINITE_SIGNS = (0x0000, 0x4000)


class PostgresBackend(Backend):
    """A pool of read-only sessions to one PostgreSQL database."""

    dialect = "postgres"
    default_schema = "public"

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
        connect_timeout_s: float = 5.0,
        acquire_timeout_s: float = DEFAULT_ACQUIRE_TIMEOUT_S,
    ) -> None:
        self.description = _describe(dsn)
        self._statement_timeout_ms = int(statement_timeout_ms)
        connect_kwargs = {
            "autocommit": True,
            # Rewritten queries rarely repeat verbatim: server-side prepared statements would pile up.
            "prepare_threshold": None,
            # libpq takes whole seconds and treats 1 as 2.
            "connect_timeout": max(2, math.ceil(connect_timeout_s)),
            "fallback_application_name": "dpproxy",
        }
        # One direct connection first, so an unreachable server fails at once with libpq's reason
        # instead of after the pool has retried for connect_timeout_s.
        try:
            with psycopg.connect(dsn, **connect_kwargs) as first:
                encoding = first.info.parameter_status("server_encoding")
        except psycopg.Error as exc:
            raise BackendUnreachable(
                f"could not connect to {self.description}: {mask_password(str(exc), dsn)}"
            ) from exc
        if encoding is None or encoding.upper() not in _TOTAL_ENCODINGS:
            # Text is read as UTF-8. SQL_ASCII stores bytes unchecked, and WIN1252, LATIN3 and others
            # store bytes with no Unicode character: one person's such value would fail every query
            # that reads it (even in a group never released), and the failure would tell it is there.
            raise BackendError(
                f"{self.description} stores text as {encoding}, which does not convert to UTF-8 for "
                "every value: dpproxy reads text as UTF-8 and needs a database created with ENCODING "
                "'UTF8' (or LATIN1, every byte of which is a character)"
            )
        self._pool = ConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            kwargs=connect_kwargs,
            configure=self._configure,
            open=False,
            timeout=acquire_timeout_s,
            name="dpproxy-backend",
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
        except PoolTimeout as exc:
            self._pool.close()
            raise BackendUnreachable(f"could not open connections to {self.description}") from exc

    def _configure(self, conn: psycopg.Connection) -> None:
        conn.execute("SET default_transaction_read_only = on")
        conn.execute(f"SET statement_timeout = {self._statement_timeout_ms}")
        # Timestamps with time zone are truncated, extracted and compared in UTC, as on DuckDB.
        conn.execute("SET TimeZone = 'UTC'")
        # Text as the loaders read it, whatever the DSN or PGCLIENTENCODING/PGDATESTYLE asked: the
        # server encodings served (_TOTAL_ENCODINGS, checked at open) convert every value to UTF8, so
        # no stored value can fail its conversion and tell the analyst it is there.
        conn.execute("SET client_encoding = 'UTF8'")
        conn.execute("SET DateStyle = 'ISO, MDY'")
        conn.execute("SET IntervalStyle = 'postgres'")
        conn.execute("SET extra_float_digits = 3")
        conn.execute("SET bytea_output = 'hex'")
        conn.adapters.register_loader("numeric", _NumericLoader)

    def run(self, sql: str, *, cancel: Cancellation | None = None) -> list[tuple]:
        outcome = self._run_on_pooled_connection(sql, cancel)
        if isinstance(outcome, psycopg.OperationalError):
            # A server restart kills every pooled connection: test the idle ones, replace the
            # dead, and try once more. Nothing has run yet, so this cannot run the query twice.
            self._pool.check()
            outcome = self._run_on_pooled_connection(sql, cancel)
        if isinstance(outcome, psycopg.OperationalError):
            raise BackendUnreachable(f"lost the connection to {self.description}: {outcome}") from outcome
        return outcome

    def _run_on_pooled_connection(
        self, sql: str, cancel: Cancellation | None
    ) -> list[tuple] | psycopg.OperationalError:
        """The rows, or the error of a connection found dead before the query was sent."""
        if cancel is not None and cancel.cancelled:
            raise QueryCancelled.of(cancel, started=False)
        try:
            with self._pool.connection() as conn:
                try:
                    conn.execute("BEGIN READ ONLY")
                except psycopg.OperationalError as exc:
                    return exc
                with self._read_only(conn, cancel):
                    # binary=True forces the extended protocol: one statement, never `a; b`.
                    return conn.execute(sql, binary=True).fetchall()
        except PoolTimeout as exc:
            raise BackendUnreachable(f"no connection to {self.description} became free") from exc

    def stream(
        self, sql: str, *, cancel: Cancellation | None = None, batch_rows: int = STREAM_BATCH_ROWS
    ) -> Iterator[list[tuple]]:
        """The rows of one SELECT in batches, through a server-side cursor (DECLARE, declared with
        the extended protocol: one statement, never `a; b`, then FETCH FORWARD batch_rows) inside
        the same `BEGIN READ ONLY … ROLLBACK` as `run`. The session's statement_timeout applies to
        each FETCH (the first one does the sorting and aggregating). The pooled connection is held
        until the generator ends or is closed; the ROLLBACK then closes the cursor."""
        for attempt in itertools.count():
            if cancel is not None and cancel.cancelled:
                raise QueryCancelled.of(cancel, started=False)
            try:
                with self._pool.connection() as conn:
                    try:
                        conn.execute("BEGIN READ ONLY")
                    except psycopg.OperationalError as exc:
                        if attempt == 0:  # a dead pooled connection: nothing was sent, try once more
                            self._pool.check()
                            continue
                        raise BackendUnreachable(f"lost the connection to {self.description}: {exc}") from exc
                    with (
                        self._read_only(conn, cancel),
                        conn.cursor(name=f"dpproxy_stream_{next(_CURSOR_NUMBERS)}", binary=True) as cur,
                    ):
                        cur.execute(sql)
                        while True:
                            if cancel is not None and cancel.cancelled:
                                raise QueryCancelled.of(cancel, started=True)
                            rows = cur.fetchmany(batch_rows)
                            if not rows:
                                return
                            yield rows
            except PoolTimeout as exc:
                raise BackendUnreachable(f"no connection to {self.description} became free") from exc

    @contextlib.contextmanager
    def _read_only(self, conn: psycopg.Connection, cancel: Cancellation | None) -> Iterator[None]:
        """The body of a `BEGIN READ ONLY` transaction (begun by the caller): `cancel` interrupts it,
        a failure becomes what it means to the engine (`_failure`), and ROLLBACK ends it whatever
        happened, undoing anything the statement changed, session settings included."""
        try:
            if cancel is not None:
                cancel.attach(conn.cancel_safe)
            yield
        except psycopg.Error as exc:
            raise self._failure(exc, cancel) from exc
        finally:
            if cancel is not None:
                cancel.detach()
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")

    def _failure(self, exc: psycopg.Error, cancel: Cancellation | None) -> Exception:
        """What a statement's failure means to the engine: a cancel, the time limit, or an error."""
        if cancel is not None and cancel.cancelled:
            return QueryCancelled.of(cancel, started=True)
        if isinstance(exc, psycopg.errors.QueryCanceled) and self._statement_timeout_ms:
            # Nobody cancelled it: the session's statement_timeout (set in _configure).
            return QueryCancelled.by_time_limit(self._statement_timeout_ms / 1000)
        return BackendError(f"PostgreSQL failed: {exc}")

    def _catalog_rows(self, sql: str, schema: str | None, what: str) -> list[tuple]:
        """Rows of a catalog query over one schema (the default one unless given)."""
        try:
            with self._pool.connection() as conn:
                return conn.execute(sql, [schema or self.default_schema]).fetchall()
        except PoolTimeout as exc:
            raise BackendUnreachable(f"no connection to {self.description} became free") from exc
        except psycopg.Error as exc:
            raise BackendError(f"PostgreSQL failed to list {what}: {exc}") from exc

    def unique_columns(self, schema: str | None = None) -> dict[str, set[str]]:
        found = self._catalog_rows(_UNIQUE_SQL, schema, "constraints")
        unique: dict[str, set[str]] = {}
        for table_name, column_name in found:
            unique.setdefault(table_name, set()).add(column_name)
        return unique

    def tables(self, schema: str | None = None) -> dict[str, list[LiveColumn]]:
        found = self._catalog_rows(_TABLES_SQL, schema, "tables")
        tables: dict[str, list[LiveColumn]] = {}
        for table_name, column_name, sql_type, nullable in found:
            tables.setdefault(table_name, []).append(
                LiveColumn(column_name, normalise_type(sql_type), sql_type, bool(nullable))
            )
        return tables

    def structure(self, schema: str | None = None) -> LiveStructure:
        not_null: dict[str, set[str]] = {}
        for table_name, column_name in self._catalog_rows(_STRUCTURE_NOT_NULL_SQL, schema, "columns"):
            not_null.setdefault(table_name, set()).add(column_name)
        constraints = tuple(
            LiveConstraint(
                table=row[0],
                name=row[1],
                kind=row[2],
                columns=tuple(row[3]),
                referenced_schema=row[4],
                referenced_table=row[5],
                referenced_columns=tuple(row[6]),
                update_rule=row[7] or "a",
                delete_rule=row[8] or "a",
                match=row[9] or "s",
                deferrable=row[10],
                deferred=row[11],
                index=row[12],
            )
            for row in self._catalog_rows(_STRUCTURE_CONSTRAINTS_SQL, schema, "constraints")
        )
        indexes = tuple(
            LiveIndex(
                table=row[0],
                name=row[1],
                unique=row[2],
                primary=row[3],
                method=row[4],
                key_count=row[5],
                columns=tuple(row[6]),
                options=tuple(row[7][: row[5]]),
            )
            for row in self._catalog_rows(_STRUCTURE_INDEXES_SQL, schema, "indexes")
        )
        return LiveStructure({t: frozenset(c) for t, c in not_null.items()}, constraints, indexes)

    def usage(self) -> dict[str, int]:
        """The pool's connections in use and idle, and callers waiting for one (psycopg_pool's stats)."""
        stats = self._pool.get_stats()
        size, idle = stats.get("pool_size", 0), stats.get("pool_available", 0)
        return {"in_use": max(0, size - idle), "idle": idle, "waiting": stats.get("requests_waiting", 0)}

    def close(self) -> None:
        self._pool.close()


class _NumericLoader(Loader):
    """Binary numeric loader: display scale 0 (e.g. `sum(bigint)`) → int, anything else → Decimal.

    Keeps result types equal across backends: DuckDB returns such sums as HUGEINT, i.e. int.
    """

    format = Format.BINARY

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        decimal_loader = psycopg.adapters.get_loader(oid, Format.BINARY)
        assert decimal_loader is not None  # psycopg always registers one for numeric
        self._decimal_loader = decimal_loader(oid, context)

    def load(self, data: Buffer) -> object:
        value = self._decimal_loader.load(data)
        _ndigits, _weight, sign, dscale = _NUMERIC_HEAD.unpack_from(data)
        if dscale == 0 and sign in _NUMERIC_FINITE_SIGNS:
            return int(value)
        return value


def _describe(dsn: str) -> str:
    """Where a DSN points, without user or password, for operator messages."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "the PostgreSQL database (unparsable DSN)"
    host = params.get("host") or "local socket"
    port = params.get("port") or "5432"
    dbname = params.get("dbname") or "default database"
    return f"PostgreSQL database {dbname} at {host}:{port}"


def mask_password(text: str, dsn: str) -> str:
    """`text` (a driver's error, which may quote the DSN) with the DSN's password replaced by ***;
    when the DSN does not parse, libpq's message (which quotes the offending part, the password
    perhaps) is not shown at all."""
    try:
        password = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
    except psycopg.Error:
        return "the DSN could not be parsed (its text is not shown: it may hold a password)"
    return text.replace(str(password), "***") if password else text
