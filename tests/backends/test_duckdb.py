"""The DuckDB backend's lock-down: no file, network, extension or Python variable reachable from SQL,
settings that cannot be undone, a statement timeout, and files opened read-only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pytest

from dpproxy.backends import BackendError, QueryCancelled, open_backend
from dpproxy.backends.duckdb import LOCKDOWN, DuckDBBackend
from tests.backends.people import SETUP


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
        with pytest.raises(BackendError) as caught:
            backend.run("SELECT count(*) FROM range(1000000000000) AS a(i) WHERE i % 7 = 3")
        assert time.monotonic() - started < 5
        assert isinstance(caught.value, QueryCancelled) and caught.value.started
        assert caught.value.reason == "dpproxy's time limit on backend queries (0.2 s)"
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
