"""Exact numbers a double or DECIMAL(38, 10) cannot hold never fail a query (docs/privacy.md §7).

A numeric column without bounds may hold 1e400 or 1e-400 on PostgreSQL and 10^37 in a DuckDB
DECIMAL(38, 0). A comparison with a double, or CAST(z AS numeric), used to convert such a value in a
way that fails (float8 input out of range; DECIMAL(38, 10) overflow), so one person's stored value
decided whether the query failed: a CASE on their age made it one noiseless bit about them. Every
query here must answer on the database with that person as on the one without.
"""

from __future__ import annotations

import duckdb
import psycopg
import pytest

from dpproxy.engine import Engine
from dpproxy.policy import parse_policy

POLICY = """
version: 1
defaults: {epsilon: 1.0, max_epsilon: 10, replay: false}
analysts: {alice: {epsilon: 1000000, delta: 0.9}}
tables:
  t:
    privacy_unit: id
    columns:
      id: {type: integer}
      age: {type: integer, lower: 0, upper: 120}
      z: {type: numeric, summable: false}
      f: {type: double precision, lower: 0, upper: 10}
      y: {type: numeric, lower: 0, upper: 100}
"""

QUERIES = [
    "SELECT COUNT(*) FROM t WHERE z > 5",
    "SELECT COUNT(*) FROM t WHERE CASE WHEN age = 99 THEN z > f ELSE false END",
    "SELECT COUNT(*) FROM t WHERE CAST(z AS numeric) > 1",
    "SELECT COUNT(*) FROM t WHERE z = 0.5 OR z BETWEEN f AND 2.5 OR z IN (1.5, f)",
    "SELECT COUNT(*) FROM t WHERE coalesce(z, f) > 1 AND greatest(z, f) > 0",
    "SELECT COUNT(*) FROM t WHERE round(z) > 1 OR floor(z) < 0",
    "SELECT CAST(z AS double precision), COUNT(*) FROM t GROUP BY 1",
    "SELECT COUNT(*) FROM t WHERE y / 3 > 1",  # y is bounded, and 1e-400 lies within its bounds
    "SELECT AVG(y / 7) FROM t",
]
SMALL = [(i, 20 + i, f"{i}.5", 1.0, f"{i}.5") for i in range(1, 40)]


@pytest.mark.parametrize("extreme", ["1e400", "-1e400", "1e-400", "NaN", "1e30"])
def test_extreme_numerics_on_postgres_never_fail_a_query(
    pg_conn: psycopg.Connection, pg_dsn: str, extreme
) -> None:
    pg_conn.execute("CREATE TABLE t (id integer, age integer, z numeric, f double precision, y numeric)")
    with pg_conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO t VALUES (%s, %s, %s::numeric, %s, %s::numeric)",
            [*SMALL, (999, 99, extreme, 1.0, extreme)],
        )
    _answers_every_query(Engine.open(parse_policy(POLICY), pg_dsn, ":memory:"))


def test_extreme_numerics_on_duckdb_never_fail_a_query(tmp_path) -> None:
    path = tmp_path / "t.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE t (id INTEGER, age INTEGER, z DECIMAL(38, 0), f DOUBLE, y DECIMAL(38, 0))")
        rows = [(i, a, round(float(z)), f, round(float(y))) for i, a, z, f, y in SMALL]
        con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?)", [*rows, (999, 99, 10**37, 1.0, 10**37)])
    _answers_every_query(Engine.open(parse_policy(POLICY), str(path), ":memory:"))


def _answers_every_query(engine: Engine) -> None:
    try:
        for sql in QUERIES:
            engine.execute(sql, analyst="alice")
    finally:
        engine.close()
