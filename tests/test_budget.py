"""The privacy-budget ledger: exact composition, refusals, persistence, crash safety, concurrency.

The common tests run on both stores: a SQLite file and a PostgreSQL table (marked `postgres`; they
use the shared throwaway cluster's `pg_dsn`, a fresh empty database).
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpproxy.budget import (
    Ledger,
    LedgerEntry,
    PostgresLedger,
    Reservation,
    SQLiteLedger,
    open_ledger,
)
from dpproxy.errors import BudgetExhausted, DPProxyError
from dpproxy.mechanisms import Cost

BUDGET = Cost(10.0, 1e-5)


@dataclass
class Store:
    """One ledger store (a SQLite file or a PostgreSQL table) that tests can open many times."""

    kind: str
    spec: str
    table: str = "dpproxy_ledger"
    opened: list[Ledger] = field(default_factory=list)

    def open(self, **options: object) -> Ledger:
        ledger = open_store(self.kind, self.spec, self.table, **options)
        self.opened.append(ledger)
        return ledger

    def close_all(self) -> None:
        for ledger in self.opened:
            ledger.close()


def open_store(kind: str, spec: str, table: str, **options: object) -> Ledger:
    if kind == "sqlite":
        return SQLiteLedger(spec, **options)  # type: ignore[arg-type]
    return PostgresLedger(spec, table=table, **options)  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        opened = Store("sqlite", str(tmp_path / "ledger.sqlite3"))
    else:
        # A table of its own, so the tests hold even if the database were shared.
        opened = Store("postgres", request.getfixturevalue("pg_dsn"), f"ledger_{uuid.uuid4().hex[:10]}")
    yield opened
    opened.close_all()


@pytest.fixture
def ledger(store: Store) -> Ledger:
    return store.open()


def statuses(ledger: Ledger, analyst: str) -> list[str]:
    return [entry.status for entry in ledger.history(analyst, limit=1000)]


# --------------------------------------------------------------------------------------------------
# Arithmetic


def test_reservations_add_up_exactly(ledger: Ledger) -> None:
    # Ten queries of ε=0.1 spend exactly 1.0 (a naive float sum would give 0.9999999999999999).
    assert sum([0.1] * 10) != 1.0
    for i in range(10):
        reservation = ledger.reserve("alice", Cost(0.1, 1e-7), BUDGET, statement=f"q{i}")
        if i % 2 == 0:
            ledger.commit(reservation)
    assert ledger.spent("alice") == Cost(1.0, math.fsum([1e-7] * 10))
    assert ledger.spent("bob") == Cost(0.0, 0.0)


def test_reserved_and_committed_both_count_and_release_gives_back(ledger: Ledger) -> None:
    committed = ledger.reserve("alice", Cost(1.5, 1e-6), BUDGET)
    ledger.commit(committed)
    pending = ledger.reserve("alice", Cost(2.0, 0.0), BUDGET)
    assert ledger.spent("alice") == Cost(3.5, 1e-6)

    released = ledger.reserve("alice", Cost(0.25, 2e-6), BUDGET)
    assert ledger.spent("alice") == Cost(3.75, 3e-6)
    ledger.release(released)
    assert ledger.spent("alice") == Cost(3.5, 1e-6)
    assert statuses(ledger, "alice") == ["released", "reserved", "committed"]
    ledger.commit(pending)
    assert ledger.spent("alice") == Cost(3.5, 1e-6)


def test_released_budget_can_be_spent_again(ledger: Ledger) -> None:
    limit = Cost(1.0, 0.0)
    reservation = ledger.reserve("alice", Cost(1.0), limit)
    with pytest.raises(BudgetExhausted):
        ledger.reserve("alice", Cost(0.5), limit)
    ledger.release(reservation)
    ledger.commit(ledger.reserve("alice", Cost(1.0), limit))


def test_analysts_are_charged_separately(ledger: Ledger) -> None:
    limit = Cost(1.0, 0.0)
    ledger.commit(ledger.reserve("alice", Cost(1.0), limit))
    ledger.commit(ledger.reserve("bob", Cost(0.75), limit))
    with pytest.raises(BudgetExhausted):
        ledger.reserve("alice", Cost(0.01), limit)
    ledger.commit(ledger.reserve("bob", Cost(0.25), limit))
    assert ledger.analysts() == ["alice", "bob"]


# --------------------------------------------------------------------------------------------------
# Refusal


def test_refusal_explains_itself_and_changes_nothing(ledger: Ledger) -> None:
    ledger.commit(ledger.reserve("alice", Cost(9.8, 0.0), BUDGET, statement="SELECT 1"))
    before = (ledger.spent("alice"), ledger.history("alice"))

    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("alice", Cost(0.5, 1e-7), BUDGET, statement="SELECT 2")

    error = caught.value
    assert error.sqlstate == "53400"
    assert error.message == (
        'privacy budget exhausted for analyst "alice": this query costs ε=0.5, δ=1e-07 '
        "but only ε=0.2, δ=1e-05 remain of ε=10, δ=1e-05"
    )
    assert error.hint is not None and "SET dpproxy.epsilon" in error.hint
    assert (ledger.spent("alice"), ledger.history("alice")) == before


def test_delta_alone_can_exhaust_the_budget(ledger: Ledger) -> None:
    limit = Cost(10.0, 1e-6)
    ledger.commit(ledger.reserve("alice", Cost(0.1, 1e-6), limit))
    with pytest.raises(BudgetExhausted, match="δ=0 remain"):
        ledger.reserve("alice", Cost(0.1, 1e-9), limit)
    ledger.commit(ledger.reserve("alice", Cost(0.1, 0.0), limit))  # pure ε still fits


def test_exactly_at_the_limit_is_allowed_and_nothing_more(ledger: Ledger) -> None:
    limit = Cost(1.0, 1e-6)
    ledger.commit(ledger.reserve("alice", Cost(0.3, 5e-7), limit))
    ledger.commit(ledger.reserve("alice", Cost(0.7, 5e-7), limit))
    assert ledger.spent("alice").fits_within(limit)
    with pytest.raises(BudgetExhausted):
        ledger.reserve("alice", Cost(1e-6, 0.0), limit)
    ledger.commit(ledger.reserve("alice", Cost(0.0, 0.0), limit))  # a free query still runs


def test_a_cost_larger_than_the_whole_budget_is_refused_on_an_empty_ledger(ledger: Ledger) -> None:
    with pytest.raises(BudgetExhausted, match='analyst "carol"'):
        ledger.reserve("carol", Cost(0.5), Cost(0.25, 0.0))
    assert ledger.history("carol") == []
    assert ledger.analysts() == []


@pytest.mark.parametrize(
    ("epsilon", "delta"),
    [(-0.1, 0.0), (float("nan"), 0.0), (float("inf"), 0.0), (0.1, -1e-9)],
    ids=["negative", "nan", "infinite", "negative-delta"],
)
def test_malformed_costs_are_internal_errors(ledger: Ledger, epsilon: float, delta: float) -> None:
    # Refused by Cost itself or by the ledger; either way nothing is recorded.
    with pytest.raises(ValueError):
        ledger.reserve("alice", Cost(epsilon, delta), BUDGET)
    assert ledger.history("alice") == []


# --------------------------------------------------------------------------------------------------
# Commit and release happen once


def test_finishing_twice_or_finishing_the_unknown_is_an_error(ledger: Ledger) -> None:
    reservation = ledger.reserve("alice", Cost(1.0, 1e-7), BUDGET)
    ledger.commit(reservation)
    with pytest.raises(ValueError, match="already committed"):
        ledger.commit(reservation)
    with pytest.raises(ValueError, match="already committed"):
        ledger.release(reservation)

    released = ledger.reserve("alice", Cost(2.0), BUDGET)
    ledger.release(released)
    with pytest.raises(ValueError, match="already released"):
        ledger.release(released)
    with pytest.raises(ValueError, match="already released"):
        ledger.commit(released)

    with pytest.raises(ValueError, match="no such ledger entry"):
        ledger.commit(Reservation(id=987654, analyst="alice", cost=Cost(1.0)))
    # A reservation that does not match its entry (another analyst, another cost) is refused.
    pending = ledger.reserve("alice", Cost(3.0), BUDGET)
    with pytest.raises(ValueError, match="does not match"):
        ledger.release(Reservation(id=pending.id, analyst="alice", cost=Cost(0.5)))
    with pytest.raises(ValueError, match="does not match"):
        ledger.release(Reservation(id=pending.id, analyst="bob", cost=Cost(3.0)))

    assert ledger.spent("alice") == Cost(4.0, 1e-7)
    assert statuses(ledger, "alice") == ["reserved", "released", "committed"]


# --------------------------------------------------------------------------------------------------
# History, reset, audit


def test_history_is_newest_first_and_keeps_the_statement(ledger: Ledger) -> None:
    first = ledger.reserve("alice", Cost(0.5, 1e-7), BUDGET, statement="SELECT count(*) FROM t")
    ledger.commit(first)
    second = ledger.reserve("alice", Cost(0.25), BUDGET, statement="SELECT avg(age) FROM t")

    newest, oldest = ledger.history("alice")
    assert isinstance(newest, LedgerEntry)
    assert (newest.id, newest.status, newest.statement) == (second.id, "reserved", "SELECT avg(age) FROM t")
    assert newest.finished_at is None
    assert (oldest.id, oldest.status, oldest.epsilon, oldest.delta) == (first.id, "committed", 0.5, 1e-7)
    assert oldest.finished_at is not None and oldest.finished_at >= oldest.created_at
    assert oldest.created_at.tzinfo is not None
    assert ledger.history("alice", limit=1) == [newest]
    assert ledger.history("nobody") == []


def test_reset_forgets_one_analyst(ledger: Ledger) -> None:
    limit = Cost(1.0, 0.0)
    for _ in range(3):
        ledger.commit(ledger.reserve("alice", Cost(0.25), limit))
    pending = ledger.reserve("alice", Cost(0.25), limit)
    ledger.commit(ledger.reserve("bob", Cost(0.5), limit))

    assert ledger.reset("alice") == 4
    assert ledger.spent("alice") == Cost(0.0, 0.0)
    assert ledger.analysts() == ["bob"]
    assert ledger.spent("bob") == Cost(0.5, 0.0)
    with pytest.raises(ValueError, match="removed by a reset"):
        ledger.commit(pending)
    assert ledger.reset("alice") == 0
    ledger.commit(ledger.reserve("alice", Cost(1.0), limit))


# --------------------------------------------------------------------------------------------------
# Persistence and crashes


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
    os._exit(3)  # no close, no commit: the process dies mid-query


def test_reservation_of_a_crashed_process_is_abandoned_and_stays_spent(store: Store) -> None:
    store.open().close()  # the schema exists before the child starts
    context = multiprocessing.get_context("fork")
    done = context.SimpleQueue()
    child = context.Process(target=_reserve_then_crash, args=(store.kind, store.spec, store.table, done))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 3
    crashed_id = done.get()

    # PostgreSQL frees the dead client's session (and its owner lock) a moment after the exit.
    deadline = time.monotonic() + 10
    while True:
        with store.open() as reopened:
            entries = reopened.history("alice")
            assert reopened.spent("alice") == Cost(4.0, 1e-6)
        if entries[0].status == "abandoned" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert [(e.id, e.status, e.statement) for e in entries] == [(crashed_id, "abandoned", "SELECT crash")]
    assert entries[0].finished_at is not None

    with store.open() as ledger:
        with pytest.raises(ValueError, match="already abandoned"):
            ledger.release(Reservation(id=crashed_id, analyst="alice", cost=Cost(4.0, 1e-6)))
        with pytest.raises(BudgetExhausted):
            ledger.reserve("alice", Cost(6.5), BUDGET)


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


# --------------------------------------------------------------------------------------------------
# Concurrency: a budget for exactly k queries, many more asking at once


def _race(reserve_one: Callable[[], bool], contenders: int) -> int:
    """Run `reserve_one` in `contenders` threads released together; count the successes."""
    barrier = threading.Barrier(contenders)
    outcomes: list[bool] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def contend() -> None:
        try:
            barrier.wait(timeout=30)
            granted = reserve_one()
        except BaseException as exc:
            with lock:
                failures.append(exc)
            return
        with lock:
            outcomes.append(granted)

    threads = [threading.Thread(target=contend) for _ in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures
    assert len(outcomes) == contenders
    return sum(outcomes)


def _try_reserve(ledger: Ledger, cost: Cost, limit: Cost) -> bool:
    try:
        reservation = ledger.reserve("alice", cost, limit)
    except BudgetExhausted:
        return False
    ledger.commit(reservation)
    return True


def test_threads_sharing_one_ledger_never_overspend(store: Store) -> None:
    ledger = store.open(max_connections=8) if store.kind == "postgres" else store.open()
    cost, limit = Cost(0.1, 1e-7), Cost(0.7, 1e-5)  # room for exactly 7
    assert _race(lambda: _try_reserve(ledger, cost, limit), contenders=24) == 7
    assert ledger.spent("alice").fits_within(limit)
    assert statuses(ledger, "alice") == ["committed"] * 7


def test_threads_with_a_ledger_each_never_overspend(store: Store) -> None:
    store.open().close()
    contenders = 20
    ledgers = [
        store.open(max_connections=1) if store.kind == "postgres" else store.open() for _ in range(contenders)
    ]
    cost, limit = Cost(0.01, 1e-6), Cost(10.0, 5e-6)  # δ allows exactly 5
    it = iter(ledgers)
    lock = threading.Lock()

    def reserve_one() -> bool:
        with lock:
            ledger = next(it)
        return _try_reserve(ledger, cost, limit)

    assert _race(reserve_one, contenders) == 5
    assert ledgers[0].spent("alice") == Cost(0.05, math.fsum([1e-6] * 5))


def _reserve_in_process(
    kind: str,
    spec: str,
    table: str,
    barrier: threading.Barrier,
    results: multiprocessing.SimpleQueue,
) -> None:
    try:
        with open_store(kind, spec, table) as ledger:
            barrier.wait(timeout=60)
            results.put("granted" if _try_reserve(ledger, Cost(0.25), Cost(1.5, 0.0)) else "refused")
    except BaseException as exc:  # report rather than vanish
        results.put(f"error: {exc!r}")


def test_processes_sharing_the_store_never_overspend(store: Store) -> None:
    # No store yet: the processes also race to create it (schema, WAL mode) on their first open.
    contenders = 20
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(contenders)
    results = context.SimpleQueue()
    processes = [
        context.Process(
            target=_reserve_in_process, args=(store.kind, store.spec, store.table, barrier, results)
        )
        for _ in range(contenders)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    outcomes = sorted(results.get() for _ in range(contenders))
    assert outcomes == ["granted"] * 6 + ["refused"] * 14  # 1.5 / 0.25 = 6
    with store.open() as ledger:
        assert ledger.spent("alice") == Cost(1.5, 0.0)
        assert statuses(ledger, "alice") == ["committed"] * 6


# --------------------------------------------------------------------------------------------------
# Universal property: whatever the order of reserves, commits and releases, the ledger's total is the
# exact sum of what was not released, and never exceeds the limit.

operations = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=0.6, allow_nan=False, allow_subnormal=False),
        st.floats(min_value=0.0, max_value=3e-7, allow_nan=False, allow_subnormal=False),
        st.sampled_from(["commit", "release", "leave"]),
    ),
    max_size=30,
)


@settings(deadline=None)
@given(operations)
def test_spending_is_the_exact_sum_of_what_was_not_released(ops: list[tuple[float, float, str]]) -> None:
    limit = Cost(2.0, 1e-6)
    counted: list[Cost] = []
    with SQLiteLedger(":memory:") as ledger:
        for epsilon, delta, then in ops:
            cost = Cost(epsilon, delta)
            would_total = Cost(
                math.fsum([c.epsilon for c in counted] + [epsilon]),
                math.fsum([c.delta for c in counted] + [delta]),
            )
            try:
                reservation = ledger.reserve("alice", cost, limit)
            except BudgetExhausted:
                assert not would_total.fits_within(limit)
                continue
            assert would_total.fits_within(limit)
            if then == "release":
                ledger.release(reservation)
            else:
                counted.append(cost)
                if then == "commit":
                    ledger.commit(reservation)
            spent = ledger.spent("alice")
            assert spent == Cost(math.fsum(c.epsilon for c in counted), math.fsum(c.delta for c in counted))
            assert spent.fits_within(limit)


# --------------------------------------------------------------------------------------------------
# Store specifics


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
        assert "rho" in columns  # room for zCDP accounting


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
        assert _race(lambda: _try_reserve(ledger, cost, limit), contenders=20) == 4
        assert ledger.spent("alice") == Cost(1.0, 0.0)


def test_reserve_reports_the_spending_it_leads_to(ledger: Ledger) -> None:
    limit = Cost(10.0, 1e-5)
    first = ledger.reserve("alice", Cost(0.5, 1e-7), limit)
    second = ledger.reserve("alice", Cost(0.25, 0.0), limit)
    assert first.spent == Cost(0.5, 1e-7)
    assert second.spent == Cost(0.75, 1e-7) == ledger.spent("alice")
    ledger.release(second)
    assert ledger.spent("alice") == Cost(0.5, 1e-7)


def test_spending_stays_exact_over_many_entries(ledger: Ledger) -> None:
    """Running totals are exact sums: ten thousand tenths make exactly one thousand."""
    limit = Cost(2000.0, 1.0)
    for _ in range(200):
        ledger.commit(ledger.reserve("alice", Cost(0.1, 1e-9), limit))
    assert ledger.spent("alice") == Cost(math.fsum([0.1] * 200), math.fsum([1e-9] * 200))


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
        assert check.execute("SELECT value FROM dpproxy_ledger_meta").fetchone() == ("2",)
