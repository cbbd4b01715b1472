"""The PostgreSQL backend's sessions: read-only even after a SET, a statement timeout, an unreachable
server reported quickly, and connections replaced after the server dropped them.
"""

from __future__ import annotations

import datetime as dt
import socket
import time
import uuid
from typing import Any

import psycopg
import pytest

from dpproxy.backends import BackendError, BackendUnreachable, QueryCancelled, open_backend
from dpproxy.backends.postgres import PostgresBackend


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
        # Its own limit: a started, cancelled query whose reason names the limit (57014 at the edge).
        assert isinstance(caught.value, QueryCancelled) and caught.value.started
        assert caught.value.reason == "dpproxy's time limit on backend queries (0.2 s)"
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


def test_postgres_waits_acquire_timeout_for_a_connection_then_is_unreachable(
    pg_cluster: Any, pg_dsn: str
) -> None:
    # The database is dropped under the pool: its connections die and none can replace them, so the
    # query waits for one as long as open_backend was told (the default is half a minute).
    with open_backend(pg_dsn, acquire_timeout_s=1) as backend:
        assert backend.run("SELECT 1") == [(1,)]
        with psycopg.connect(pg_cluster.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{pg_dsn.rsplit("/", 1)[1]}" WITH (FORCE)')
        started = time.monotonic()
        with pytest.raises(BackendUnreachable):
            backend.run("SELECT 1")
        assert time.monotonic() - started < 10


def test_text_is_read_as_utf8_whatever_the_dsn_asks(pg_conn: psycopg.Connection, pg_dsn: str) -> None:
    """A DSN (or PGCLIENTENCODING, PGDATESTYLE) may ask for LATIN1 and German dates: a value LATIN1
    cannot hold would then fail the query that reads it, telling the analyst it is there. Sessions
    pin the client encoding and the output styles the loaders read."""
    pg_conn.execute("CREATE TABLE t (name text, d date, i interval)")
    pg_conn.execute("INSERT INTO t VALUES ('Zoë €', '2024-03-01', '1 day 02:00')")
    options = "options=-c%20DateStyle%3DGerman%20-c%20IntervalStyle%3Dsql_standard"
    dsn = f"{pg_dsn}?client_encoding=LATIN1&{options}"
    with PostgresBackend(dsn, min_size=1, max_size=1) as backend:
        assert backend.run("SELECT name, d, i FROM t") == [
            ("Zoë €", dt.date(2024, 3, 1), dt.timedelta(days=1, hours=2))
        ]
        assert backend.run("SHOW client_encoding") == [("UTF8",)]


@pytest.mark.parametrize("encoding", ["SQL_ASCII", "WIN1252"])
def test_a_database_whose_text_may_not_convert_to_utf8_is_refused_at_open(pg_cluster, encoding: str) -> None:
    """SQL_ASCII keeps bytes unchecked, and WIN1252 stores 0x81, which has no Unicode character: one
    person's such value would fail every query reading it. Such a database is refused when the
    backend opens, naming what to do."""
    from tests.pgcluster import _admin, drop_database

    name = f"enc_{uuid.uuid4().hex[:8]}"
    with _admin(pg_cluster) as conn:
        conn.execute(
            f"CREATE DATABASE {name} ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
        )
    try:
        with pytest.raises(BackendError, match=encoding) as caught:
            open_backend(pg_cluster.dsn(name))
        assert "ENCODING 'UTF8'" in str(caught.value)
    finally:
        drop_database(pg_cluster, name)


@pytest.mark.parametrize("dsn", ["postgresql://u:SeCrEt%ZZ@localhost/db", "postgresql://u:SeCrEt@[::1/db"])
def test_an_unparsable_dsn_is_refused_without_quoting_its_password(dsn: str) -> None:
    """libpq's message for a DSN it cannot parse quotes the offending part, the password perhaps."""
    from dpproxy.budget import open_ledger
    from dpproxy.errors import DPProxyError

    for opener in (open_backend, open_ledger):
        with pytest.raises((BackendError, DPProxyError)) as caught:
            opener(dsn)
        assert "SeCrEt" not in str(caught.value) and "could not be parsed" in str(caught.value)
