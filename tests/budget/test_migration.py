"""Migration of older layouts: schema 1 (no totals) gets its totals summed once, exactly; schema 2
(exact ε and δ totals, no ρ total, no replay store) is brought to schema 3 on both stores.

Tests taking the `store` or `ledger` fixture run on both stores: a SQLite file and a PostgreSQL table
(marked `postgres`; a table of their own in one database of the shared throwaway cluster; tests that
change the database itself use `pg_dsn`, a fresh empty one).
"""

from __future__ import annotations

import math
import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dpproxy.budget import SCHEMA_VERSION
from dpproxy.budget.sqlite import SQLiteLedger
from dpproxy.errors import BudgetExhausted
from dpproxy.privacy.accounting import Cost, zcdp_to_approx_dp
from tests.budget.stores import Store, zcdp


def test_version_1_ledger_is_migrated_with_exact_totals(tmp_path: Path) -> None:
    """A ledger written before the totals table (schema 1) gets its totals summed once on open."""
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE dpproxy_ledger_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO dpproxy_ledger_meta VALUES ('schema_version', '1');
        CREATE TABLE dpproxy_ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, analyst TEXT NOT NULL,
            epsilon REAL NOT NULL, delta REAL NOT NULL, rho REAL, status TEXT NOT NULL,
            statement TEXT NOT NULL DEFAULT '', owner TEXT, created_at TEXT NOT NULL, finished_at TEXT);
        INSERT INTO dpproxy_ledger (analyst, epsilon, delta, status, created_at) VALUES
            ('alice', 0.1, 0.0, 'committed', '2026-01-01'), ('alice', 0.2, 1e-7, 'abandoned', '2026-01-01'),
            ('alice', 5.0, 0.0, 'released', '2026-01-01'), ('bob', 1.5, 0.0, 'committed', '2026-01-01');
        """
    )
    conn.close()
    with SQLiteLedger(path) as ledger:
        assert ledger.spent("alice") == Cost(math.fsum([0.1, 0.2]), 1e-7)
        assert ledger.spent("bob") == Cost(1.5, 0.0)
        with pytest.raises(BudgetExhausted):
            ledger.reserve("bob", Cost(0.6, 0.0), Cost(2.0, 0.0))
    with sqlite3.connect(path) as check:
        assert check.execute("SELECT value FROM dpproxy_ledger_meta").fetchone() == (str(SCHEMA_VERSION),)
        assert check.execute(
            "SELECT analyst, rho FROM dpproxy_ledger_totals ORDER BY analyst"
        ).fetchall() == [
            ("alice", "0"),
            ("bob", "0"),
        ]


def _v2_sqlite(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE dpproxy_ledger_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO dpproxy_ledger_meta VALUES ('schema_version', '2');
        CREATE TABLE dpproxy_ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, analyst TEXT NOT NULL,
            epsilon REAL NOT NULL, delta REAL NOT NULL, rho REAL, status TEXT NOT NULL,
            statement TEXT NOT NULL DEFAULT '', owner TEXT, created_at TEXT NOT NULL, finished_at TEXT);
        CREATE TABLE dpproxy_ledger_totals (analyst TEXT PRIMARY KEY, epsilon TEXT NOT NULL,
            delta TEXT NOT NULL);
        """
    )
    _fill_v2(conn, "?")
    conn.commit()
    conn.close()


def _v2_postgres(dsn: str, table: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table}_meta (key text PRIMARY KEY, value text NOT NULL)")
        conn.execute(f"INSERT INTO {table}_meta VALUES ('schema_version', '2')")
        conn.execute(
            f"""CREATE TABLE {table} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                analyst text NOT NULL, epsilon double precision NOT NULL, delta double precision NOT NULL,
                rho double precision, status text NOT NULL, statement text NOT NULL DEFAULT '',
                owner integer, created_at timestamptz NOT NULL, finished_at timestamptz)"""
        )
        conn.execute(
            f"CREATE TABLE {table}_totals (analyst text PRIMARY KEY, epsilon numeric NOT NULL, "
            "delta numeric NOT NULL)"
        )
        with conn.cursor() as cursor:
            _fill_v2(cursor, "%s", table)


def _fill_v2(conn: Any, mark: str, table: str = "dpproxy_ledger") -> None:
    entries = [
        ("alice", 0.1, 0.0, "committed"),
        ("alice", 0.2, 1e-7, "abandoned"),
        ("alice", 5.0, 0.0, "released"),
        ("bob", 1.5, 0.0, "committed"),
    ]
    for analyst, epsilon, delta, status in entries:
        conn.execute(
            f"INSERT INTO {table} (analyst, epsilon, delta, status, created_at) "
            f"VALUES ({mark}, {mark}, {mark}, {mark}, '2026-01-01')",
            (analyst, epsilon, delta, status),
        )
    # Exact sums of the doubles, as schema 2 kept them.
    totals = [
        ("alice", Decimal(float("0.1")) + Decimal(float("0.2")), Decimal(float("1e-7"))),
        ("bob", Decimal("1.5"), Decimal(0)),
    ]
    for analyst, epsilon, delta in totals:
        conn.execute(
            f"INSERT INTO {table}_totals (analyst, epsilon, delta) VALUES ({mark}, {mark}, {mark})",
            (analyst, str(epsilon), str(delta)),
        )


def test_version_2_ledger_is_migrated_to_version_3(store: Store) -> None:
    if store.kind == "sqlite":
        _v2_sqlite(Path(store.spec))
    else:
        _v2_postgres(store.spec, store.table)
    with store.open() as ledger:
        assert ledger.spent("alice") == Cost(math.fsum([0.1, 0.2]), 1e-7, 0.0)
        assert ledger.spent("bob") == Cost(1.5, 0.0, 0.0)
        assert [entry.rho for entry in ledger.history("alice")] == [0.0, 0.0, 0.0]
        # The pure-era spending counts under zCDP accounting; the new ρ total and replay store work.
        limit = Cost(2.0, 1e-6)
        ledger.commit(ledger.reserve("bob", zcdp(0.001), limit, accounting="zcdp"))
        assert ledger.spent("bob") == Cost(1.5, 0.0, 0.001)
        assert ledger.spent_epsilon("bob", limit, "zcdp") == 1.5 + zcdp_to_approx_dp(0.001, 1e-6)
        with pytest.raises(BudgetExhausted):
            ledger.reserve("bob", zcdp(0.01), limit, accounting="zcdp")
        ledger.replay_put("bob", "ab" * 16, b"answer")
    with store.open() as reopened:
        assert reopened.spent("alice") == Cost(math.fsum([0.1, 0.2]), 1e-7, 0.0)
        assert reopened.replay_get("bob", "ab" * 16) == b"answer"
    if store.kind == "sqlite":
        with sqlite3.connect(store.spec) as check:
            assert check.execute("SELECT value FROM dpproxy_ledger_meta").fetchone() == (str(SCHEMA_VERSION),)
    else:
        with psycopg.connect(store.spec) as check:
            assert check.execute(f"SELECT value FROM {store.table}_meta").fetchone() == (str(SCHEMA_VERSION),)


def test_version_5_ledger_keeps_what_analysts_reset_before_it_spent_of_the_data_set(tmp_path: Path) -> None:
    """Version 5's reset deleted the analyst's entries while the data set's total kept their cost:
    a data-set window rebuilt from the entries after a change of refresh would have missed it (0.9
    spent, then 0.9 more granted against 1.0). Migration enters the difference once."""
    from dpproxy.budget import SharedBudget
    from dpproxy.policy import DATASET, Refresh

    path = tmp_path / "v5.sqlite"
    shared = SharedBudget(Cost(1.0, 1e-5))
    with SQLiteLedger(path) as ledger:
        ledger.commit(ledger.reserve("alice", Cost(0.9, 0.0), Cost(10.0, 1e-5), shared=shared))
    with sqlite3.connect(path) as raw:  # what version 5's `budget reset alice` left
        raw.execute("DELETE FROM dpproxy_ledger WHERE analyst = 'alice'")
        raw.execute("DELETE FROM dpproxy_ledger_totals WHERE analyst = 'alice'")
        raw.execute("DELETE FROM dpproxy_ledger_meta WHERE key LIKE 'refresh:%'")
        raw.execute("UPDATE dpproxy_ledger_meta SET value = '5' WHERE key = 'schema_version'")
    with SQLiteLedger(path) as ledger:
        assert ledger.spent(DATASET).epsilon == pytest.approx(0.9)
        for refresh in (Refresh.NEVER, Refresh.MONTHLY, Refresh.NEVER):  # the last one rebuilt
            with pytest.raises(BudgetExhausted):
                ledger.reserve(
                    "bob", Cost(0.9, 0.0), Cost(10.0, 1e-5), shared=SharedBudget(Cost(1.0, 1e-5), refresh)
                )
        assert ledger.analysts() == []


def test_a_budget_charged_before_refreshes_were_followed_under_another_window_is_rebuilt(
    tmp_path: Path,
) -> None:
    """Upgraded from version 5 (no refresh marker), alice spent 1.0 under `monthly`, then the policy
    says `never`: her lifetime key "alice" is new, and only a window key "alice@…" holds the 1.0. The
    check for her key must be exact (a prefix test took "alice@…" for "alice" and adopted an empty
    total)."""
    from dpproxy.policy import Refresh

    path = tmp_path / "v5.sqlite"
    limit = Cost(1.0, 1e-5)
    with SQLiteLedger(path) as ledger:
        ledger.commit(ledger.reserve("alice", Cost(1.0, 0.0), limit, refresh=Refresh.MONTHLY))
    with sqlite3.connect(path) as raw:  # version 5 kept no refresh marker
        raw.execute("DELETE FROM dpproxy_ledger_meta WHERE key LIKE 'refresh:%'")
    with SQLiteLedger(path) as ledger, pytest.raises(BudgetExhausted):
        ledger.reserve("alice", Cost(0.5, 0.0), limit, refresh=Refresh.NEVER)
