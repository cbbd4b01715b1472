"""Backends: what they return, what they list, and what they refuse to do."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import psycopg
import pytest

from dpproxy.backends import Backend, BackendError, BackendUnreachable, normalise_type, open_backend
from dpproxy.backends.duckdb import LOCKDOWN, DuckDBBackend
from dpproxy.backends.postgres import PostgresBackend
from dpproxy.policy import ColumnType

# Valid on both engines. `notes` lives in another schema; `people_view` is a view.
SETUP = [
    """CREATE TABLE people (
        id integer PRIMARY KEY, small smallint, name varchar(20), born date, score numeric(12,2),
        big bigint, active boolean, weight real, height double precision, note text,
        seen timestamp, seen_tz timestamptz, tags integer[]
    )""",
    """INSERT INTO people VALUES
        (1, 7, 'ann', DATE '1980-02-29', 1234.50, 5000000000, true, 1.5, 2.25, 'a',
         TIMESTAMP '2024-01-02 03:04:05', NULL, NULL),
        (2, -3, 'bob', DATE '1999-12-31', 0.25, 5000000001, false, 2.5, 3.5, NULL, NULL, NULL, NULL),
        (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)""",
    "CREATE VIEW people_view AS SELECT id, name FROM people",
    "CREATE SCHEMA other",
    "CREATE TABLE other.notes (note_id bigint, body text)",
]

EXPECTED_TYPES = {
    "id": ColumnType.INTEGER,
    "small": ColumnType.SMALLINT,
    "name": ColumnType.VARCHAR,
    "born": ColumnType.DATE,
    "score": ColumnType.NUMERIC,
    "big": ColumnType.BIGINT,
    "active": ColumnType.BOOLEAN,
    "weight": ColumnType.REAL,
    "height": ColumnType.DOUBLE,
    "seen": ColumnType.TIMESTAMP,
    "seen_tz": ColumnType.TIMESTAMPTZ,
    "tags": None,
}


@pytest.fixture(params=["duckdb", "postgres"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "duckdb":
        opened: Backend = DuckDBBackend.from_statements(SETUP)
    else:
        pg_dsn = request.getfixturevalue("pg_dsn")
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for statement in SETUP:
                conn.execute(statement)
        opened = PostgresBackend(pg_dsn, max_size=5)
    with opened:
        yield opened


def test_run_returns_python_values(backend: Backend) -> None:
    rows = backend.run("SELECT id, small, name, born, score, big, active, seen FROM people ORDER BY id")
    assert rows[0] == (
        1,
        7,
        "ann",
        date(1980, 2, 29),
        Decimal("1234.50"),
        5000000000,
        True,
        datetime(2024, 1, 2, 3, 4, 5),
    )
    assert rows[2] == (3, None, None, None, None, None, None, None)
    assert isinstance(rows[0], tuple)
    assert [type(v) for v in rows[1][:7]] == [int, int, str, date, Decimal, int, bool]


def test_sums_of_integers_are_exact_ints_and_sums_of_numerics_exact_decimals(backend: Backend) -> None:
    [(big_sum, id_sum, rows, score_sum)] = backend.run(
        "SELECT sum(big), sum(id), count(*), sum(score) FROM people"
    )
    assert (big_sum, id_sum, rows) == (10000000001, 6, 3)
    assert type(big_sum) is int and type(id_sum) is int and type(rows) is int
    assert score_sum == Decimal("1234.75") and isinstance(score_sum, Decimal)


def test_timestamptz_values_are_aware_datetimes(backend: Backend) -> None:
    if isinstance(backend, DuckDBBackend):
        pytest.importorskip("pytz", reason="DuckDB needs pytz to return TIMESTAMPTZ values")
    [(moment,)] = backend.run("SELECT CAST('2024-01-01 10:00:00+02' AS timestamptz)")
    assert moment.utcoffset() is not None
    assert moment == datetime(2024, 1, 1, 8, 0, tzinfo=UTC)


def test_empty_result_is_an_empty_list(backend: Backend) -> None:
    assert backend.run("SELECT id FROM people WHERE id > 100") == []


def test_tables_lists_columns_in_order_with_normalised_types(backend: Backend) -> None:
    tables = backend.tables()
    assert set(tables) == {"people", "people_view"}
    people = tables["people"]
    assert [c.name for c in people] == [
        *("id", "small", "name", "born", "score", "big", "active", "weight", "height"),
        *("note", "seen", "seen_tz", "tags"),
    ]
    by_name = {c.name: c for c in people}
    for name, expected in EXPECTED_TYPES.items():
        assert by_name[name].type == expected, name
    note_type = by_name["note"].type
    assert note_type is not None and note_type.is_text
    score_sql_type = by_name["score"].sql_type.lower().replace(" ", "")
    assert score_sql_type in ("numeric(12,2)", "decimal(12,2)")
    assert [(c.name, c.type) for c in tables["people_view"]] == [
        ("id", ColumnType.INTEGER),
        ("name", ColumnType.VARCHAR),
    ]


def test_tables_of_another_schema(backend: Backend) -> None:
    notes = backend.tables("other")
    assert list(notes) == ["notes"]
    note_id, body = notes["notes"]
    assert (note_id.name, note_id.type) == ("note_id", ColumnType.BIGINT)
    assert body.name == "body" and body.type is not None and body.type.is_text
    assert backend.tables("no_such_schema") == {}


def test_concurrent_queries_from_many_threads(backend: Backend) -> None:
    threads = 20
    start = threading.Barrier(threads)

    def work(i: int) -> list[list[tuple]]:
        start.wait()
        return [
            backend.run(f"SELECT count(*), sum(id) + {i} FROM people WHERE id >= {k}") for k in range(1, 4)
        ]

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(work, range(threads)))
    for i, result in enumerate(results):
        assert result == [[(3, 6 + i)], [(2, 5 + i)], [(1, 3 + i)]]


def test_errors_are_backend_errors(backend: Backend) -> None:
    with pytest.raises(BackendError):
        backend.run("SELECT no_such_column FROM people")
    with pytest.raises(BackendError):
        backend.run("SELECT 1; SELECT 2")
    # The backend is still usable after failures.
    assert backend.run("SELECT count(*) FROM people") == [(3,)]


def test_writes_are_refused(backend: Backend) -> None:
    for statement in (
        "INSERT INTO people (id) VALUES (99)",
        "UPDATE people SET name = 'eve'",
        "DELETE FROM people",
        "CREATE TABLE evil (x integer)",
        "DROP TABLE people",
    ):
        with pytest.raises(BackendError):
            backend.run(statement)
    assert backend.run("SELECT count(*), count(*) FILTER (WHERE name = 'eve') FROM people") == [(3, 0)]
    assert "evil" not in backend.tables()


# --- DuckDB lock-down ---------------------------------------------------------------------------


@pytest.fixture(params=["file", "memory"])
def locked_duckdb(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DuckDBBackend]:
    if request.param == "memory":
        opened = DuckDBBackend.from_statements(SETUP[:2])
    else:
        path = tmp_path / "locked.duckdb"
        with duckdb.connect(str(path)) as conn:
            for statement in SETUP[:2]:
                conn.execute(statement)
        opened = open_backend(f"duckdb:{path}")
        assert isinstance(opened, DuckDBBackend)
    with opened:
        yield opened


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/passwd')",
        "SELECT * FROM glob('/etc/*')",
        "SELECT * FROM '/etc/passwd'",
        "SELECT * FROM read_parquet('http://127.0.0.1:9/x.parquet')",
        "COPY people TO '{tmp}/stolen.csv'",
        "COPY (SELECT * FROM people) TO '{tmp}/stolen.csv'",
        "EXPORT DATABASE '{tmp}/export'",
        "ATTACH '{tmp}/other.duckdb' AS other",
        "ATTACH ':memory:' AS scratch",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
        "SET temp_directory = '{tmp}/spill'",
        "RESET enable_external_access",
        "PRAGMA enable_profiling",
    ],
)
def test_duckdb_refuses_the_outside_world(locked_duckdb: DuckDBBackend, sql: str, tmp_path: Path) -> None:
    with pytest.raises(BackendError):
        locked_duckdb.run(sql.format(tmp=tmp_path))
    assert not (tmp_path / "stolen.csv").exists()
    assert not (tmp_path / "export").exists()
    assert not (tmp_path / "other.duckdb").exists()


def test_duckdb_does_not_read_python_variables(locked_duckdb: DuckDBBackend) -> None:
    secret_rows = {"ssn": np.array([123456789])}
    # An ordinary DuckDB connection would read the variable by its name…
    with duckdb.connect() as plain:
        assert plain.execute("SELECT * FROM secret_rows").fetchall() == [(123456789,)]
    # …the backend must not, from its own frame or any caller's.
    with pytest.raises(BackendError):
        locked_duckdb.run("SELECT * FROM secret_rows")
    assert secret_rows  # keeps the variable alive and named in this frame


def test_duckdb_lockdown_settings_hold(locked_duckdb: DuckDBBackend) -> None:
    for name, value in {**LOCKDOWN, "lock_configuration": True}.items():
        assert locked_duckdb.run(f"SELECT current_setting('{name}')") == [(value,)], name


def test_duckdb_locks_a_connection_it_is_given(tmp_path: Path) -> None:
    # The configuration itself is locked, not only the statement check in run(): the connection
    # handed over cannot be used to reopen the doors either.
    conn = duckdb.connect()
    conn.execute("CREATE TABLE t AS SELECT 1 AS x")
    with DuckDBBackend(conn) as backend:
        assert backend.run("SELECT x FROM t") == [(1,)]
        for sql in (
            "SET enable_external_access = true",
            "SET python_enable_replacements = true",
            "SET lock_configuration = false",
            f"COPY t TO '{tmp_path}/stolen.csv'",
            f"ATTACH '{tmp_path}/other.duckdb'",
            "INSTALL httpfs",
            "SELECT * FROM read_csv('/etc/passwd')",
        ):
            with pytest.raises(duckdb.Error):
                conn.execute(sql)
    assert list(tmp_path.iterdir()) == []


def test_duckdb_statement_timeout_interrupts_and_recovers() -> None:
    with DuckDBBackend.from_statements([], statement_timeout_ms=200) as backend:
        started = time.monotonic()
        with pytest.raises(BackendError):
            backend.run("SELECT count(*) FROM range(1000000000000) AS a(i) WHERE i % 7 = 3")
        assert time.monotonic() - started < 5
        assert backend.run("SELECT 42") == [(42,)]


def test_duckdb_file_is_opened_read_only(tmp_path: Path) -> None:
    path = tmp_path / "data.db"
    with duckdb.connect(str(path)) as conn:
        conn.execute("CREATE TABLE t AS SELECT 1 AS x")
    with open_backend(str(path)) as backend:
        assert backend.run("SELECT x FROM t") == [(1,)]
        with pytest.raises(BackendError):
            backend.run("INSERT INTO t VALUES (2)")
    with duckdb.connect(str(path), read_only=True) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchall() == [(1,)]


# --- PostgreSQL sessions ------------------------------------------------------------------------


def test_postgres_sessions_are_read_only_even_after_a_set(pg_conn: psycopg.Connection, pg_dsn: str) -> None:
    pg_conn.execute("CREATE TABLE t (x integer)")
    with PostgresBackend(pg_dsn, min_size=1, max_size=1) as backend:
        with pytest.raises(BackendError):
            backend.run("INSERT INTO t VALUES (1)")
        # A statement that turns the session writable is rolled back with its transaction…
        with pytest.raises(BackendError):
            backend.run("SET default_transaction_read_only = off")  # runs, but returns no rows
        assert backend.run("SELECT set_config('default_transaction_read_only', 'off', false)") == [("off",)]
        # …so the next statement on the same (only) connection still cannot write.
        with pytest.raises(BackendError):
            backend.run("INSERT INTO t VALUES (2)")
        assert backend.run("SHOW default_transaction_read_only") == [("on",)]
    assert pg_conn.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_postgres_statement_timeout(pg_dsn: str) -> None:
    with PostgresBackend(pg_dsn, statement_timeout_ms=200) as backend:
        started = time.monotonic()
        with pytest.raises(BackendError) as caught:
            backend.run("SELECT pg_sleep(10)")
        assert time.monotonic() - started < 5
        assert not isinstance(caught.value, BackendUnreachable)
        assert backend.run("SELECT 1") == [(1,)]


def test_postgres_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        started = time.monotonic()
        with pytest.raises(BackendUnreachable) as caught:
            open_backend(f"postgresql://nobody:hunter2@127.0.0.1:{port}/nothing")
        assert time.monotonic() - started < 10
    assert "hunter2" not in str(caught.value)


def test_postgres_recovers_from_dropped_connections(pg_conn: psycopg.Connection, pg_dsn: str) -> None:
    with PostgresBackend(pg_dsn, min_size=2, max_size=2) as backend:
        assert backend.run("SELECT 1") == [(1,)]
        pg_conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert backend.run("SELECT 2") == [(2,)]


# --- DSNs and type names ------------------------------------------------------------------------


def test_open_backend_rejects_unknown_forms_with_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match="postgresql://") as caught:
        open_backend("mysql://root:secret@db/app")
    assert "duckdb:" in str(caught.value)
    assert "secret" not in str(caught.value)


def test_open_backend_missing_duckdb_file(tmp_path: Path) -> None:
    with pytest.raises(BackendUnreachable):
        open_backend(str(tmp_path / "missing.duckdb"))
    assert not (tmp_path / "missing.duckdb").exists()


def test_open_backend_libpq_keyword_string(pg_cluster: Any) -> None:
    dsn = f"host={pg_cluster.host} port={pg_cluster.port} user={pg_cluster.superuser} dbname=postgres"
    with open_backend(dsn) as backend:
        assert isinstance(backend, PostgresBackend)
        assert backend.run("SELECT 1 + 1") == [(2,)]


@pytest.mark.parametrize(
    ("sql_type", "expected"),
    [
        ("int2", ColumnType.SMALLINT),
        ("SMALLINT", ColumnType.SMALLINT),
        ("int4", ColumnType.INTEGER),
        ("INTEGER", ColumnType.INTEGER),
        ("int8", ColumnType.BIGINT),
        ("BIGINT", ColumnType.BIGINT),
        ("HUGEINT", None),
        ("UBIGINT", None),
        ("numeric", ColumnType.NUMERIC),
        ("numeric(12,2)", ColumnType.NUMERIC),
        ("DECIMAL(18,3)", ColumnType.NUMERIC),
        ("real", ColumnType.REAL),
        ("FLOAT", ColumnType.REAL),
        ("double precision", ColumnType.DOUBLE),
        ("DOUBLE", ColumnType.DOUBLE),
        ("text", ColumnType.TEXT),
        ("VARCHAR", ColumnType.VARCHAR),
        ("character varying(20)", ColumnType.VARCHAR),
        ("character(1)", ColumnType.VARCHAR),
        ("boolean", ColumnType.BOOLEAN),
        ("BOOLEAN", ColumnType.BOOLEAN),
        ("date", ColumnType.DATE),
        ("timestamp without time zone", ColumnType.TIMESTAMP),
        ("timestamp(3) without time zone", ColumnType.TIMESTAMP),
        ("TIMESTAMP", ColumnType.TIMESTAMP),
        ("timestamp with time zone", ColumnType.TIMESTAMPTZ),
        ("TIMESTAMP WITH TIME ZONE", ColumnType.TIMESTAMPTZ),
        ("jsonb", None),
        ("JSON", None),
        ("integer[]", None),
        ("INTEGER[3]", None),
        ("STRUCT(x INTEGER)", None),
        ("uuid", None),
        ("interval", None),
    ],
)
def test_normalise_type(sql_type: str, expected: ColumnType | None) -> None:
    assert normalise_type(sql_type) == expected
