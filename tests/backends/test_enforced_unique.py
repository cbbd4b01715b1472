"""Which privacy-unit columns the database enforces unique, on PostgreSQL and DuckDB.

A unit reported unique makes the engine skip per-person bounding (r = g = 1): a wrong "unique" is a
sensitivity breach. A column counts only when it is unique over every row a plain `FROM table`
reads, under the equality GROUP BY and joins use. On PostgreSQL, an index on an inheritance parent
covers the parent's own rows while reading the parent includes its children's; on both engines, an
index comparing under another collation than the column's admits values SQL takes for one person.
"""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import psycopg
import pytest

from dpproxy.backends.duckdb import DuckDBBackend
from dpproxy.backends.postgres import PostgresBackend
from dpproxy.engine import Engine
from dpproxy.policy import parse_policy
from tests.certify import at_ceilings, certify

POLICY = """
version: 1
analysts: {alice: {epsilon: 10, delta: 1.0e-5}}
tables:
  people:
    privacy_unit: id
    columns: {id: {type: integer}, age: {type: integer, lower: 0, upper: 120}}
"""


def pg_unique(pg_conn: psycopg.Connection, pg_dsn: str, setup: list[str]) -> dict[str, set[str]]:
    for statement in setup:
        pg_conn.execute(statement)
    with PostgresBackend(pg_dsn, max_size=2) as backend:
        return backend.unique_columns()


# --- PostgreSQL: inheritance and partitions ------------------------------------------------------


def test_enforced_unique_inheritance_parent_index_does_not_cover_children(
    pg_conn: psycopg.Connection, pg_dsn: str
) -> None:
    unique = pg_unique(
        pg_conn,
        pg_dsn,
        [
            "CREATE TABLE people (id integer PRIMARY KEY, age integer)",
            "CREATE TABLE people_more () INHERITS (people)",
            "ALTER TABLE people_more ADD PRIMARY KEY (id)",
            "INSERT INTO people VALUES (1, 30)",
            "INSERT INTO people_more VALUES (1, 40)",
            "CREATE TABLE alone (id integer PRIMARY KEY)",
        ],
    )
    # Both primary keys hold, yet reading the parent gives person 1 twice.
    assert pg_conn.execute("SELECT count(*) FROM people WHERE id = 1").fetchone() == (2,)
    assert "people" not in unique
    assert unique["people_more"] == {"id"}  # a child without children of its own is read alone
    assert unique["alone"] == {"id"}


def test_enforced_unique_inheritance_partitioned_tables(pg_conn: psycopg.Connection, pg_dsn: str) -> None:
    unique = pg_unique(
        pg_conn,
        pg_dsn,
        [
            # A key on the partitioned table itself: PostgreSQL enforces it across partitions.
            "CREATE TABLE by_id (id integer, age integer) PARTITION BY RANGE (id)",
            "CREATE TABLE by_id_low PARTITION OF by_id FOR VALUES FROM (0) TO (100)",
            "CREATE TABLE by_id_high PARTITION OF by_id FOR VALUES FROM (100) TO (200)",
            "ALTER TABLE by_id ADD PRIMARY KEY (id)",
            # Keys on the partitions only: one person can have a row in each.
            "CREATE TABLE by_age (id integer NOT NULL, age integer) PARTITION BY LIST (age)",
            "CREATE TABLE by_age_1 PARTITION OF by_age FOR VALUES IN (1)",
            "CREATE TABLE by_age_2 PARTITION OF by_age FOR VALUES IN (2)",
            "ALTER TABLE by_age_1 ADD PRIMARY KEY (id)",
            "ALTER TABLE by_age_2 ADD PRIMARY KEY (id)",
            "INSERT INTO by_age VALUES (7, 1), (7, 2)",
            # An index ON ONLY the partitioned table stays invalid until every partition has one.
            "CREATE TABLE half (id integer NOT NULL) PARTITION BY RANGE (id)",
            "CREATE TABLE half_low PARTITION OF half FOR VALUES FROM (0) TO (100)",
            "CREATE UNIQUE INDEX half_only ON ONLY half (id)",
        ],
    )
    with pytest.raises(psycopg.errors.UniqueViolation):
        pg_conn.execute("INSERT INTO by_id VALUES (5, 1), (5, 2)")
    assert unique["by_id"] == unique["by_id_low"] == unique["by_id_high"] == {"id"}
    assert "by_age" not in unique
    assert unique["by_age_1"] == unique["by_age_2"] == {"id"}
    assert "half" not in unique


UNIQUE_CASES = {
    "primary key": (["CREATE TABLE t (id integer PRIMARY KEY)"], True),
    "unique not null": (["CREATE TABLE t (id integer NOT NULL UNIQUE)"], True),
    "include columns": (
        ["CREATE TABLE t (id integer NOT NULL, age integer, UNIQUE (id) INCLUDE (age))"],
        True,
    ),
    "nullable unique": (["CREATE TABLE t (id integer UNIQUE)"], False),
    "nulls not distinct, nullable": (["CREATE TABLE t (id integer UNIQUE NULLS NOT DISTINCT)"], False),
    "two columns": (["CREATE TABLE t (id integer, age integer, PRIMARY KEY (id, age))"], False),
    "partial": (
        ["CREATE TABLE t (id integer NOT NULL, age integer)", "CREATE UNIQUE INDEX ON t (id) WHERE age > 0"],
        False,
    ),
    "expression": (["CREATE TABLE t (id integer NOT NULL)", "CREATE UNIQUE INDEX ON t ((id % 10))"], False),
    "deferrable": (
        ["CREATE TABLE t (id integer NOT NULL, UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)"],
        False,
    ),
    "another operator class": (
        ["CREATE TABLE t (id text NOT NULL)", "CREATE UNIQUE INDEX ON t (id text_pattern_ops)"],
        False,
    ),
    "another collation": (
        [
            "CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
            "CREATE TABLE t (id text COLLATE ci NOT NULL)",
            'CREATE UNIQUE INDEX ON t (id COLLATE "C")',
            "INSERT INTO t VALUES ('A'), ('a')",  # one person to GROUP BY
        ],
        False,
    ),
    "the column's own collation": (['CREATE TABLE t (id text COLLATE "C" PRIMARY KEY)'], True),
    "materialized view": (
        ["CREATE MATERIALIZED VIEW t AS SELECT 1 AS id", "CREATE UNIQUE INDEX ON t (id)"],
        False,
    ),
    "view": (["CREATE TABLE base (id integer PRIMARY KEY)", "CREATE VIEW t AS SELECT id FROM base"], False),
}


@pytest.mark.parametrize("case", sorted(UNIQUE_CASES))
def test_enforced_unique_inheritance_other_index_conditions(
    case: str, pg_conn: psycopg.Connection, pg_dsn: str
) -> None:
    setup, expected = UNIQUE_CASES[case]
    assert ("id" in pg_unique(pg_conn, pg_dsn, setup).get("t", set())) is expected


def test_enforced_unique_inheritance_invalid_index(pg_conn: psycopg.Connection, pg_dsn: str) -> None:
    """A failed CREATE UNIQUE INDEX CONCURRENTLY leaves an invalid index over duplicate rows."""
    pg_conn.execute("CREATE TABLE t (id integer NOT NULL)")
    pg_conn.execute("INSERT INTO t VALUES (1), (1)")
    with pytest.raises(psycopg.errors.UniqueViolation):
        pg_conn.execute("CREATE UNIQUE INDEX CONCURRENTLY t_id ON t (id)")
    assert pg_conn.execute(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = 't_id'::regclass"
    ).fetchone() == (False,)
    assert "t" not in pg_unique(pg_conn, pg_dsn, [])


# --- DuckDB ----------------------------------------------------------------------------------------


def duckdb_unique(setup: list[str], conn: duckdb.DuckDBPyConnection | None = None) -> dict[str, set[str]]:
    conn = conn or duckdb.connect()
    for statement in setup:
        conn.execute(statement)
    with DuckDBBackend(conn) as backend:
        return backend.unique_columns()


def test_enforced_unique_inheritance_duckdb_constraints() -> None:
    unique = duckdb_unique(
        [
            "CREATE TABLE pk (id INTEGER PRIMARY KEY, name VARCHAR UNIQUE NOT NULL, note VARCHAR UNIQUE)",
            "CREATE TABLE pair (id INTEGER, age INTEGER, PRIMARY KEY (id, age))",
            "CREATE VIEW v AS SELECT id FROM pk",
        ]
    )
    assert unique == {"pk": {"id", "name"}}


def test_enforced_unique_inheritance_duckdb_collations() -> None:
    """DuckDB's unique indexes compare bytes; GROUP BY compares under the column's collation."""
    conn = duckdb.connect()
    unique = duckdb_unique(
        [
            "CREATE TABLE nocase (id VARCHAR COLLATE NOCASE PRIMARY KEY, n INTEGER NOT NULL UNIQUE)",
            "INSERT INTO nocase VALUES ('A', 1), ('a', 2)",
            "CREATE TABLE plain (id VARCHAR PRIMARY KEY, collated_at VARCHAR)",
        ],
        conn,
    )
    assert unique == {"nocase": {"n"}, "plain": {"id"}}
    # The primary key let both rows in; SQL counts them as one person.
    fresh = duckdb.connect()
    fresh.execute("CREATE TABLE nocase (id VARCHAR COLLATE NOCASE PRIMARY KEY)")
    fresh.execute("INSERT INTO nocase VALUES ('A'), ('a')")
    assert fresh.execute("SELECT count(*) FROM (SELECT id FROM nocase GROUP BY id)").fetchone() == (1,)
    # A default collation applies to every text column.
    collated = duckdb.connect()
    collated.execute("SET default_collation = 'nocase'")
    setup = ["CREATE TABLE d (id VARCHAR PRIMARY KEY, n INTEGER NOT NULL UNIQUE)"]
    assert duckdb_unique(setup, collated) == {"d": {"n"}}


# --- the engine: a parent with a key and a child holding a second row of a person -----------------


@pytest.fixture
def inherited_people(pg_conn: psycopg.Connection) -> Iterator[psycopg.Connection]:
    pg_conn.execute("CREATE TABLE people (id integer PRIMARY KEY, age integer)")
    pg_conn.execute("CREATE TABLE people_more () INHERITS (people)")
    pg_conn.execute("INSERT INTO people SELECT i, 20 + i FROM generate_series(0, 11) i")
    pg_conn.execute("INSERT INTO people_more SELECT i, 60 + i FROM generate_series(0, 3) i")
    yield pg_conn


def test_enforced_unique_inheritance_engine_bounds_per_person(
    inherited_people: psycopg.Connection, pg_dsn: str
) -> None:
    conn = inherited_people

    def run(sql: str, without: int | None) -> list[tuple]:
        with conn.transaction(force_rollback=True):
            if without is not None:
                conn.execute("DELETE FROM people WHERE id = %s", (without,))  # and from its child
            return conn.execute(sql).fetchall()

    sql = "SELECT COUNT(*), SUM(age) FROM people"
    with Engine(parse_policy(POLICY), PostgresBackend(pg_dsn, max_size=2), None) as engine:
        assert "id" not in engine.unique_columns.get("people", ())
        plan = engine.plan(sql, salt="s")
    assert not plan.query.unit_unique and not plan.query.row_level
    assert "per_unit" in plan.sql
    certify(plan, run, range(12))
    # What taking the parent's key for one row per person gives: person 0 moves COUNT(*) by 2.
    wrong = Engine(parse_policy(POLICY), None, unique_columns={"people": frozenset({"id"})}).plan(
        sql, salt="s"
    )
    assert wrong.query.unit_unique and wrong.sensitivities[0] == 1
    counts = [
        at_ceilings(wrong, wrong.measure(*(run(s, without) for s in wrong.statements))).components[0][0]
        for without in (None, 0)
    ]
    assert counts[0] - counts[1] == 2
    with pytest.raises(AssertionError):
        certify(wrong, run, range(12))
