"""Persistence and crashes: spending survives close and reopen, a reservation left open by a process
that died stays spent (abandoned), and a live instance's reservations are left alone.

Tests taking the `store` or `ledger` fixture run on both stores: a SQLite file and a PostgreSQL table
(marked `postgres`; a table of their own in one database of the shared throwaway cluster; tests that
change the database itself use `pg_dsn`, a fresh empty one).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from dpproxy.budget import Reservation
from dpproxy.budget.sqlite import SQLiteLedger
from dpproxy.errors import BudgetExhausted
from dpproxy.privacy.accounting import Cost, zcdp_to_approx_dp
from tests.budget.stores import BUDGET, Store, open_store, statuses


def test_the_ledger_survives_close_and_reopen(store: Store) -> None:
    with store.open() as ledger:
        ledger.commit(ledger.reserve("alice", Cost(2.5, 1e-6), BUDGET, statement="SELECT 1"))
        ledger.release(ledger.reserve("alice", Cost(1.0), BUDGET))
        ledger.commit(ledger.reserve("bob", Cost(1.0), BUDGET))
        before = ledger.history("alice")

    with store.open() as reopened:
        assert reopened.spent("alice") == Cost(2.5, 1e-6)
        assert reopened.spent("bob") == Cost(1.0, 0.0)
        assert reopened.history("alice") == before
        assert reopened.analysts() == ["alice", "bob"]
        with pytest.raises(BudgetExhausted):
            reopened.reserve("alice", Cost(7.6), BUDGET)


def test_closing_with_a_reservation_open_leaves_it_spent(store: Store) -> None:
    ledger = store.open()
    reservation = ledger.reserve("alice", Cost(3.0), BUDGET)
    ledger.close()
    ledger.close()  # idempotent

    with store.open() as reopened:
        assert statuses(reopened, "alice") == ["abandoned"]
        assert reopened.spent("alice") == Cost(3.0, 0.0)
        with pytest.raises(ValueError, match="already abandoned"):
            reopened.release(reservation)
        with pytest.raises(ValueError, match="already abandoned"):
            reopened.commit(reservation)
    with pytest.raises(ValueError, match="closed"):
        ledger.spent("alice")


def test_a_second_live_instance_does_not_abandon_the_first_ones_reservations(store: Store) -> None:
    first = store.open()
    reservation = first.reserve("alice", Cost(1.0), BUDGET)
    second = store.open()
    assert statuses(second, "alice") == ["reserved"]
    first.commit(reservation)
    assert second.spent("alice") == Cost(1.0, 0.0)
    assert statuses(second, "alice") == ["committed"]


def _reserve_then_crash(kind: str, spec: str, table: str, done: multiprocessing.SimpleQueue) -> None:
    ledger = open_store(kind, spec, table)
    reservation = ledger.reserve("alice", Cost(4.0, 1e-6), BUDGET, statement="SELECT crash")
    done.put(reservation.id)
    zcdp_reservation = ledger.reserve("bob", Cost(0.0, 0.0, 0.25), BUDGET, accounting="zcdp")
    done.put(zcdp_reservation.id)
    os._exit(3)  # no close, no commit: the process dies mid-query


def test_reservation_of_a_crashed_process_is_abandoned_and_stays_spent(store: Store) -> None:
    store.open().close()  # the schema exists before the child starts
    context = multiprocessing.get_context("fork")
    done = context.SimpleQueue()
    child = context.Process(target=_reserve_then_crash, args=(store.kind, store.spec, store.table, done))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 3
    crashed_id, zcdp_id = done.get(), done.get()

    # PostgreSQL frees the dead client's session (and its owner lock) a moment after the exit.
    deadline = time.monotonic() + 10
    while True:
        with store.open() as reopened:
            entries = reopened.history("alice")
            assert reopened.spent("alice") == Cost(4.0, 1e-6)
            assert reopened.spent("bob") == Cost(0.0, 0.0, 0.25)
            bob_entries = reopened.history("bob")
        if entries[0].status == "abandoned" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert [(e.id, e.status, e.statement) for e in entries] == [(crashed_id, "abandoned", "SELECT crash")]
    assert entries[0].finished_at is not None
    assert [(e.id, e.status, e.rho) for e in bob_entries] == [(zcdp_id, "abandoned", 0.25)]

    with store.open() as ledger:
        with pytest.raises(ValueError, match="already abandoned"):
            ledger.release(Reservation(id=crashed_id, analyst="alice", cost=Cost(4.0, 1e-6)))
        with pytest.raises(ValueError, match="already abandoned"):
            ledger.release(Reservation(id=zcdp_id, analyst="bob", cost=Cost(0.0, 0.0, 0.25)))
        with pytest.raises(BudgetExhausted):
            ledger.reserve("alice", Cost(6.5), BUDGET)
        # Bob's abandoned ρ is still worth its ε: a budget it alone nearly fills is refused more.
        bob_limit = Cost(zcdp_to_approx_dp(0.25, 1e-5) + 0.01, 1e-5)
        with pytest.raises(BudgetExhausted):
            ledger.reserve("bob", Cost(0.02), bob_limit, accounting="zcdp")


def test_sqlite_ledger_dropped_without_close_counts_as_crashed(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    ledger = SQLiteLedger(path)
    reservation = ledger.reserve("alice", Cost(1.25, 1e-7), BUDGET)
    del ledger
    gc.collect()

    with SQLiteLedger(path) as reopened:
        assert statuses(reopened, "alice") == ["abandoned"]
        assert reopened.spent("alice") == Cost(1.25, 1e-7)
        with pytest.raises(ValueError, match="already abandoned"):
            reopened.release(reservation)


def test_a_ledger_opened_through_a_symlink_sees_the_same_live_owners(tmp_path: Path) -> None:
    """Owners are kept beside the file itself, not beside the name it was opened by: `budget show
    --ledger alias.sqlite` (a symlink) took a live server's reservation for an orphan, and the
    server's answer then failed (an adversarial review)."""

    path = tmp_path / "ledger.sqlite"
    alias = tmp_path / "alias.sqlite"
    first = SQLiteLedger(path)
    alias.symlink_to(path)
    reservation = first.reserve("alice", Cost(1.0), BUDGET)
    with SQLiteLedger(alias) as second:
        assert statuses(second, "alice") == ["reserved"]
    first.commit(reservation)
    first.close()


def test_a_new_sqlite_ledger_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """It holds the audit log's statements and the key of the decoy credentials."""

    path = tmp_path / "ledger.sqlite"
    with SQLiteLedger(path) as ledger:
        ledger.commit(ledger.reserve("alice", Cost(0.5), BUDGET))
        modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir() if p.is_file()}
    assert modes and set(modes.values()) == {0o600}, modes


def test_a_ledger_other_users_can_read_is_opened_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.sqlite"
    SQLiteLedger(path).close()
    path.chmod(0o644)  # made by an earlier version, or by hand
    with caplog.at_level("WARNING", logger="dpproxy.budget"), SQLiteLedger(path):
        pass
    assert "can be read by other users (mode 0644)" in caplog.text
