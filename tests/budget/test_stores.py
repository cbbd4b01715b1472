"""What is particular to each store: open_ledger picks SQLite for a path (WAL mode, its tables) and
PostgreSQL for a URL, a store from a newer dpproxy is refused, PostgreSQL table names and isolation.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from dpproxy.budget import SCHEMA_VERSION, open_ledger
from dpproxy.budget.postgres import PostgresLedger
from dpproxy.budget.sqlite import SQLiteLedger
from dpproxy.errors import DPProxyError
from dpproxy.privacy.accounting import Cost
from tests.budget.stores import BUDGET, race, try_reserve


def test_open_ledger_makes_a_sqlite_file_and_its_directories(tmp_path: Path) -> None:
    path = tmp_path / "state" / "nested" / "ledger.sqlite3"
    with open_ledger(path) as ledger:
        assert isinstance(ledger, SQLiteLedger)
        ledger.commit(ledger.reserve("alice", Cost(1.0), BUDGET))
    assert path.is_file()
    with open_ledger(str(path)) as ledger:
        assert ledger.spent("alice") == Cost(1.0, 0.0)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        columns = {row[1] for row in raw.execute("PRAGMA table_info(dpproxy_ledger)")}
        assert "rho" in columns  # zCDP accounting
        totals = {row[1] for row in raw.execute("PRAGMA table_info(dpproxy_ledger_totals)")}
        assert totals == {"analyst", "epsilon", "delta", "rho"}
        replay = {row[1] for row in raw.execute("PRAGMA table_info(dpproxy_ledger_replay)")}
        assert {"analyst", "key", "payload"} <= replay
        assert raw.execute("SELECT value FROM dpproxy_ledger_meta").fetchone() == (str(SCHEMA_VERSION),)


def test_a_ledger_from_a_newer_dpproxy_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    SQLiteLedger(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE dpproxy_ledger_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(DPProxyError, match="schema version 99"):
        SQLiteLedger(path)


@pytest.mark.postgres
def test_open_ledger_recognises_postgres_urls(pg_dsn: str) -> None:
    assert pg_dsn.startswith(("postgresql://", "postgres://"))
    with open_ledger(pg_dsn) as ledger:
        assert isinstance(ledger, PostgresLedger)
        ledger.commit(ledger.reserve("alice", Cost(1.0), BUDGET))
    with open_ledger(pg_dsn) as ledger:
        assert ledger.spent("alice") == Cost(1.0, 0.0)


@pytest.mark.postgres
def test_postgres_ledgers_in_different_tables_are_independent(pg_dsn: str) -> None:
    with PostgresLedger(pg_dsn, table="ledger_a") as a, PostgresLedger(pg_dsn, table="ledger_b") as b:
        a.commit(a.reserve("alice", Cost(1.0), BUDGET))
        assert b.spent("alice") == Cost(0.0, 0.0)
        assert b.analysts() == []


def test_postgres_ledger_table_must_be_an_identifier() -> None:
    with pytest.raises(ValueError, match="identifier"):
        PostgresLedger("postgresql://localhost/unused", table="ledger; DROP TABLE x")


@pytest.mark.postgres
def test_postgres_ledger_never_overspends_whatever_the_default_isolation(pg_dsn: str) -> None:
    # A snapshot taken before the analyst's lock is granted would miss the reservation just made.
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        dbname = admin.info.dbname
        admin.execute(f"ALTER DATABASE \"{dbname}\" SET default_transaction_isolation = 'repeatable read'")
    with PostgresLedger(pg_dsn, max_connections=8) as ledger:
        cost, limit = Cost(0.25), Cost(1.0, 0.0)
        assert race(lambda: try_reserve(ledger, cost, limit), contenders=20) == 4
        assert ledger.spent("alice") == Cost(1.0, 0.0)
