"""Generated databases loaded into raw (test-only, unlocked) DuckDB, PostgreSQL and Spark connections.

`Loaded.run(sql, without)` runs one statement on the database D, or on D minus one person (their
rows deleted inside a transaction that is rolled back: their rows in each protected table, and the
notes of their visits), which is how the sensitivity certificate walks the neighbours. The
transaction stays open while the statements asked of that neighbour follow one another (a
certificate runs every statement of a plan on it), and is rolled back before another neighbour's
opens (on PostgreSQL, before anything else runs; on DuckDB, the neighbours are read through a second
connection, tests/certify.NeighbourReader, whose transaction D's never sees: optimizer off and each
statement prepared once, D itself read with the optimizer on, so DuckDB's optimizer is still
compared with PostgreSQL on every statement). The rows of a query already run on the same database
(D or a neighbour) are answered again from memory, as the database never changes once loaded.
Spark has no transactions: a database is loaded into a Spark database of its own (`lang_<name>`), and the
session reads it through temporary views named like the tables (unqualified names resolve to a
temporary view first), which leave out the rows of the person a session variable names (none: D
itself). `RawBackend` lets an Engine use such a connection for the public queries it
runs itself (subqueries over public tables are answered first), and records every statement, so a
test can tell whether a refused query reached the data.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import re
from collections.abc import Iterator
from decimal import Decimal

import duckdb
import psycopg

from dpproxy.backends import Backend, BackendError, Cancellation, LiveColumn, normalise_type
from dpproxy.lru import LRU
from tests.certify import NeighbourReader, certification_duckdb, insert_rows
from tests.pgcluster import PgCluster, create_database, drop_database
from tests.sql.language import schema
from tests.sql.language.schema import EACH_A_PERSON, PROTECTED, TABLES, Database

# A neighbour: D minus a person (a patient id or a survey rid), or minus a person without a unit of an
# EACH_A_PERSON table, all their rows: (table, index in Loaded.unitless[table]).
Neighbour = int | tuple[str, int]


def _normalise(value: object) -> object:
    """Values as the production backends return them: exact numerics of scale 0 as int."""
    if isinstance(value, Decimal) and value.is_finite() and value.as_tuple().exponent == 0:
        return int(value)
    return value


# The schema's column types as Spark spells them (PostgreSQL's timestamp has no time zone).
SPARK_TYPES = {
    "INTEGER": "INT",
    "BIGINT": "BIGINT",
    "NUMERIC(12, 2)": "DECIMAL(12, 2)",
    "DOUBLE PRECISION": "DOUBLE",
    "REAL": "FLOAT",
    "VARCHAR": "STRING",
    "DATE": "DATE",
    "BOOLEAN": "BOOLEAN",
    "TIMESTAMP": "TIMESTAMP_NTZ",
    "TIMESTAMPTZ": "TIMESTAMP",
}


def _unit_column(table: str) -> str:
    return "rid" if table == "survey" else "patient_id"


def _person_rows(table: str, value: str) -> str:
    """A condition true of the rows of `table` that belong to the person `value` names: for
    visit_notes, the notes of the person's visits; a note of no visit, or of a visit of nobody, is
    nobody's."""
    if table == "visit_notes":
        return f"visit_id IN (SELECT visit_id FROM visits WHERE patient_id = {value})"
    return f"{_unit_column(table)} = {value}"


# Statements whose rows may be answered again from memory: queries, never a statement with effects.
_QUERY = re.compile(r"\s*(SELECT|WITH|\(|VALUES)\b", re.IGNORECASE)
# The most answers kept in memory (the least recently used go first).
_ANSWERED = 20_000


class Loaded:
    """One database in one engine (for Spark, `conn` is a Spark Connect session of its own)."""

    def __init__(self, kind: str, conn) -> None:
        self.kind = kind
        self.conn = conn
        # DuckDB: the connection the neighbours are read through (module docstring).
        self.neighbours = NeighbourReader(conn) if kind == "duckdb" else None
        self.db: Database | None = None
        self._without: Neighbour | None = None  # the person the Spark views or the open transaction leave out
        # (query, without) → rows
        self._answered: LRU[tuple[str, Neighbour | None], list[tuple]] = LRU(_ANSWERED)
        # DuckDB and PostgreSQL: each EACH_A_PERSON table's persons without a unit under the policy
        # that makes each such row a person (rows alike in every column one person), each as the
        # physical ids of their rows (DuckDB's rowid, PostgreSQL's ctid).
        self.unitless: dict[str, list[list[object]]] = {}

    @property
    def mark(self) -> str:
        return "%s" if self.kind == "postgres" else "?"

    @property
    def row_id(self) -> str:
        """The column of a row's physical id: DuckDB's rowid, PostgreSQL's ctid."""
        return "ctid" if self.kind == "postgres" else "rowid"

    def load(self, db: Database) -> None:
        self._answered.clear()
        if self.kind == "spark":
            self._load_spark(db)
            return
        self._leave_out(None)  # no neighbour's transaction may outlive the tables it read
        if self.neighbours is not None:
            self.neighbours.forget()  # prepared on the tables this replaces
        run = self.conn.execute
        if self.kind == "postgres":
            run("SET TIME ZONE 'UTC'")
        for table, columns in TABLES.items():
            run(f"DROP TABLE IF EXISTS {table}")
            run(f"CREATE TABLE {table} ({', '.join(f'{c} {t}' for c, t in columns)})")
            insert_rows(self.conn, self.kind, table, [self._row(r) for r in db.rows[table]])
        self.unitless = {table: self._unitless(table) for table in EACH_A_PERSON}
        self.db = db

    def _unitless(self, table: str) -> list[list[object]]:
        """The physical ids of `table`'s rows whose unit is NULL, grouped by the row's values (the
        policy lists every column): one list per person. Values compared as written (repr), as the
        engine's digest compares their text."""
        persons: dict[tuple[str, ...], list[object]] = {}
        for rid, *values in self.conn.execute(
            f"SELECT {self.row_id}, * FROM {table} WHERE patient_id IS NULL ORDER BY {self.row_id}"
        ).fetchall():
            persons.setdefault(tuple(map(repr, values)), []).append(rid)
        return list(persons.values())

    def unitless_persons(self) -> list[Neighbour]:
        """The persons without a unit of the EACH_A_PERSON tables, as neighbours: (table, index)."""
        return [(table, i) for table, ids in self.unitless.items() for i in range(len(ids))]

    def _load_spark(self, db: Database) -> None:
        """Each table written into the Spark database `lang_<name>` (replaced), from Arrow columns of
        Spark's types; values Spark cannot hold (infinite dates, years past 9999) are refused."""
        import pyarrow as pa

        arrow_types = {
            "INTEGER": pa.int32(),
            "BIGINT": pa.int64(),
            "NUMERIC(12, 2)": pa.decimal128(12, 2),
            "DOUBLE PRECISION": pa.float64(),
            "REAL": pa.float32(),
            "VARCHAR": pa.string(),
            "DATE": pa.date32(),
            "BOOLEAN": pa.bool_(),
            "TIMESTAMP": pa.timestamp("us"),
            "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
        }
        database = "lang_" + re.sub(r"\W", "_", db.name)
        self.conn.sql(f"CREATE DATABASE IF NOT EXISTS {database}").collect()
        for table, columns in TABLES.items():
            for row in db.rows[table]:
                for value, (column, pg_type) in zip(row, columns, strict=True):
                    # Dates and times given as text are the ones Python cannot hold (schema.py).
                    if pg_type in ("DATE", "TIMESTAMP", "TIMESTAMPTZ") and isinstance(value, str):
                        raise ValueError(f"Spark cannot hold {table}.{column} = {value!r} ({db.name})")
            target = f"{database}.{table}"
            self.conn.sql(f"DROP TABLE IF EXISTS {target}").collect()
            spelled = ", ".join(f"{c} {SPARK_TYPES[t]}" for c, t in columns)
            self.conn.sql(f"CREATE TABLE {target} ({spelled}) USING parquet").collect()
            rows = db.rows[table]
            if rows:
                arrays = [
                    pa.array([self._spark_value(r[i], t) for r in rows], type=arrow_types[t])
                    for i, (_, t) in enumerate(columns)
                ]
                data = pa.Table.from_arrays(arrays, names=[c for c, _ in columns])
                self.conn.createDataFrame(data).write.insertInto(target)
        self.conn.sql("DECLARE OR REPLACE VARIABLE lang_without INT DEFAULT NULL").collect()
        for table in TABLES:
            source = f"SELECT * FROM {database}.{table}"
            if table == "visit_notes":
                # The notes of the person's visits (of the stored visits: the view leaves them out).
                source = (
                    f"SELECT n.* FROM {database}.visit_notes n LEFT ANTI JOIN {database}.visits v "
                    "ON n.visit_id = v.visit_id AND v.patient_id = lang_without"
                )
            elif table in PROTECTED:
                source += f" WHERE lang_without IS NULL OR NOT ({_unit_column(table)} <=> lang_without)"
            self.conn.sql(f"CREATE OR REPLACE TEMPORARY VIEW {table} AS {source}").collect()
        self._without = None
        self.db = db

    @staticmethod
    def _spark_value(value: object, pg_type: str) -> object:
        if pg_type == "TIMESTAMPTZ" and isinstance(value, dt.datetime) and value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value

    def _spark_views(self, without: int | None) -> None:
        """The temporary views over D, or over D minus person `without`."""
        if self._without != without:
            value = "NULL" if without is None else str(int(without))
            self.conn.sql(f"SET VARIABLE lang_without = {value}").collect()
            self._without = without

    def _row(self, row: tuple) -> tuple:
        # PostgreSQL's float8 takes NaN and infinities from psycopg as floats already.
        return tuple(float(v) if isinstance(v, float) and not math.isfinite(v) else v for v in row)

    def run(self, sql: str, without: Neighbour | None = None) -> list[tuple]:
        """Rows of `sql` on D, or on D minus person `without` (a patient id or a survey rid; on DuckDB
        and PostgreSQL also a person without a unit, `unitless_persons`)."""
        key = (sql, without)
        answered = self._answered.get(key)
        if answered is not None:
            return list(answered)
        if self.kind == "spark":
            from dpproxy.backends.spark import arrow_rows, query_arrow

            self._spark_views(without)
            rows = [tuple(_normalise(v) for v in row) for row in arrow_rows(query_arrow(self.conn, sql))]
        else:
            rows = [tuple(_normalise(v) for v in row) for row in self._execute(sql, without)]
        if _QUERY.match(sql):
            self._answered.put(key, rows)
        return list(rows)

    def _execute(self, sql: str, without: Neighbour | None) -> list[tuple]:
        """The rows of `sql` on D or on D minus `without`. On DuckDB, D on `conn` (which never sees
        a neighbour's transaction: that stays open) and a neighbour through `neighbours`, whose
        failed read is made again optimized (tests/certify.NeighbourReader)."""
        if self.neighbours is None or without is not None:
            self._leave_out(without)
        try:
            if self.neighbours is None or without is None:
                return self.conn.execute(sql).fetchall()
            try:
                return self.neighbours.rows(sql)
            except duckdb.Error:
                self._leave_out(None)  # the error aborted the transaction: open it again, optimized
                with self.neighbours.optimized():
                    self._leave_out(without)
                    try:
                        return self.neighbours.conn.execute(sql).fetchall()
                    finally:
                        self._leave_out(None)  # before the optimizer goes off (outside a transaction)
        except Exception:
            self._leave_out(None)  # a failed statement aborts the neighbour's transaction
            raise

    def _leave_out(self, without: Neighbour | None) -> None:
        """Make the neighbours' connection read D minus person `without` (D itself for None): the
        open neighbour's transaction rolled back, and a new one that deletes the person's rows."""
        if without == self._without:
            return
        conn = self.conn if self.neighbours is None else self.neighbours.conn
        if self._without is not None:
            self._without = None
            conn.execute("ROLLBACK")
        if without is None:
            return
        conn.execute("BEGIN")
        try:
            if isinstance(without, tuple):  # a person without a unit: their rows alike in every column
                # (visit_notes cannot say each_a_person: the notes of a visit without a person are
                # nobody's, left out whether or not the visit is there)
                table, index = without
                cast = "::tid" if self.kind == "postgres" else ""
                for value in self.unitless[table][index]:
                    conn.execute(f"DELETE FROM {table} WHERE {self.row_id} = {self.mark}{cast}", [value])
            for table in PROTECTED if isinstance(without, int) else ():
                conn.execute(f"DELETE FROM {table} WHERE {_person_rows(table, self.mark)}", [without])
        except Exception:
            conn.execute("ROLLBACK")
            raise
        self._without = without


class RawBackend(Backend):
    """A Backend over a Loaded connection, recording every statement it is asked to run."""

    def __init__(self, loaded: Loaded) -> None:
        self.loaded = loaded
        self.dialect = loaded.kind
        self.default_schema = {"postgres": "public", "spark": "default"}.get(loaded.kind, "main")
        self.statements: list[str] = []

    def run(self, sql: str, *, cancel: Cancellation | None = None) -> list[tuple]:
        self.statements.append(sql)
        try:
            return self.loaded.run(sql)
        except (duckdb.Error, Exception) as exc:  # the driver's error, as the real backends wrap it
            if self.loaded.kind == "postgres":
                self.loaded.conn.rollback() if not self.loaded.conn.autocommit else None
            raise BackendError(str(exc)) from exc

    def touched_protected_data(self) -> bool:
        return any(name in sql for sql in self.statements for name in PROTECTED)

    def unique_columns(self, schema: str | None = None) -> dict[str, set[str]]:
        return {}

    def tables(self, schema: str | None = None) -> dict[str, list[LiveColumn]]:
        return {
            table: [LiveColumn(c, normalise_type(t), t) for c, t in columns if c != "rid"]
            for table, columns in TABLES.items()
        }

    def close(self) -> None:
        pass


@contextlib.contextmanager
def adversarial_pair(pg_cluster: PgCluster, prefix: str) -> Iterator[dict[str, Loaded]]:
    """The adversarial database of the language tests in DuckDB and in PostgreSQL (a database of
    the test cluster named after `prefix`, dropped on exit), by engine name."""
    db = schema.adversarial(1)
    duck = Loaded("duckdb", certification_duckdb())
    duck.load(db)
    name = create_database(pg_cluster, prefix=prefix)
    conn = psycopg.connect(pg_cluster.dsn(name), autocommit=True)
    try:
        pg = Loaded("postgres", conn)
        pg.load(db)
        yield {"duckdb": duck, "postgres": pg}
    finally:
        conn.close()
        drop_database(pg_cluster, name)
