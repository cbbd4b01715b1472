"""Generated databases loaded into raw (test-only, unlocked) DuckDB and PostgreSQL connections.

`Loaded.run(sql, without)` runs one statement on the database D, or on D minus one person (their
rows deleted inside a transaction that is rolled back), which is how the sensitivity certificate
walks the neighbours. `RawBackend` lets an Engine use such a connection for the public queries it
runs itself (subqueries over public tables are answered first), and records every statement, so a
test can tell whether a refused query reached the data.
"""

from __future__ import annotations

import math
from decimal import Decimal

import duckdb

from dpproxy.backends import Backend, BackendError, Cancellation, LiveColumn, normalise_type
from tests.sql.language.schema import PROTECTED, TABLES, Database


def _normalise(value: object) -> object:
    """Values as the production backends return them: exact numerics of scale 0 as int."""
    if isinstance(value, Decimal) and value.is_finite() and value.as_tuple().exponent == 0:
        return int(value)
    return value


class Loaded:
    """One database in one engine."""

    def __init__(self, kind: str, conn) -> None:
        self.kind = kind
        self.conn = conn
        self.db: Database | None = None

    @property
    def mark(self) -> str:
        return "%s" if self.kind == "postgres" else "?"

    def load(self, db: Database) -> None:
        run = self.conn.execute
        if self.kind == "postgres":
            run("SET TIME ZONE 'UTC'")
        for table, columns in TABLES.items():
            run(f"DROP TABLE IF EXISTS {table}")
            run(f"CREATE TABLE {table} ({', '.join(f'{c} {t}' for c, t in columns)})")
            rows = [self._row(r) for r in db.rows[table]]
            if not rows:
                continue
            sql = f"INSERT INTO {table} VALUES ({', '.join([self.mark] * len(columns))})"
            if self.kind == "postgres":
                with self.conn.cursor() as cur:
                    cur.executemany(sql, rows)
            else:
                self.conn.executemany(sql, rows)
        self.db = db

    def _row(self, row: tuple) -> tuple:
        # PostgreSQL's float8 takes NaN and infinities from psycopg as floats already.
        return tuple(float(v) if isinstance(v, float) and not math.isfinite(v) else v for v in row)

    def run(self, sql: str, without: int | None = None) -> list[tuple]:
        """Rows of `sql` on D, or on D minus person `without` (a patient id or a survey rid)."""
        if without is None:
            return [tuple(_normalise(v) for v in row) for row in self.conn.execute(sql).fetchall()]
        deletes = [
            (
                f"DELETE FROM {table} WHERE {'rid' if table == 'survey' else 'patient_id'} = {self.mark}",
                without,
            )
            for table in PROTECTED
        ]
        if self.kind == "postgres":
            with self.conn.transaction(force_rollback=True):
                for statement, value in deletes:
                    self.conn.execute(statement, (value,))
                rows = self.conn.execute(sql).fetchall()
        else:
            self.conn.execute("BEGIN")
            try:
                for statement, value in deletes:
                    self.conn.execute(statement, [value])
                rows = self.conn.execute(sql).fetchall()
            finally:
                self.conn.execute("ROLLBACK")
        return [tuple(_normalise(v) for v in row) for row in rows]


class RawBackend(Backend):
    """A Backend over a Loaded connection, recording every statement it is asked to run."""

    def __init__(self, loaded: Loaded) -> None:
        self.loaded = loaded
        self.dialect = loaded.kind
        self.default_schema = "public" if loaded.kind == "postgres" else "main"
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
