"""The privacy-budget ledger: exact composition, refusals, persistence, crash safety, concurrency,
zCDP composition and the replay store.

The common tests run on both stores: a SQLite file and a PostgreSQL table (marked `postgres`; a
table of their own in one database of the shared throwaway cluster; tests that change the database
itself use `pg_dsn`, a fresh empty one).
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
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpproxy.budget import (
    REPLAY_LIMIT,
    SCHEMA_VERSION,
    Ledger,
    LedgerEntry,
    PostgresLedger,
    Reservation,
    SQLiteLedger,
    epsilon_equivalent,
    open_ledger,
)
from dpproxy.errors import BudgetExhausted, DPProxyError
from dpproxy.mechanisms import FIT_RELATIVE_TOLERANCE, Cost, converted_epsilon, zcdp_to_approx_dp
from tests.conftest import PgCluster, create_database, drop_database

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


@pytest.fixture(scope="module")
def ledger_database(pg_cluster: PgCluster) -> Iterator[str]:
    """One database for this module's store tests (a fresh one per test would cost half a second each)."""
    name = create_database(pg_cluster, prefix="ledger")
    try:
        yield pg_cluster.dsn(name)
    finally:
        drop_database(pg_cluster, name)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        opened = Store("sqlite", str(tmp_path / "ledger.sqlite3"))
    else:
        # A table of its own (and so advisory lock keys of its own): tests share the database.
        opened = Store(
            "postgres", request.getfixturevalue("ledger_database"), f"ledger_{uuid.uuid4().hex[:10]}"
        )
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
        assert check.execute("SELECT value FROM dpproxy_ledger_meta").fetchone() == ("3",)
        assert check.execute(
            "SELECT analyst, rho FROM dpproxy_ledger_totals ORDER BY analyst"
        ).fetchall() == [
            ("alice", "0"),
            ("bob", "0"),
        ]


# --------------------------------------------------------------------------------------------------
# zCDP composition: ρ adds up and is converted to ε once, at the δ the analyst has left

ZCDP_BUDGET = Cost(5.0, 1e-5)


def zcdp(rho: float, delta: float = 0.0, shown: float = 0.0) -> Cost:
    """A zCDP cost: δ-approximately ρ-zCDP; `shown` is its display-only ε (see mechanisms.Cost)."""
    return Cost(shown, delta, rho)


def test_rho_adds_up_and_its_epsilon_grows_like_its_square_root(ledger: Ledger) -> None:
    worth = []
    for _ in range(4):
        reservation = ledger.reserve("alice", zcdp(0.05), ZCDP_BUDGET, accounting="zcdp")
        ledger.commit(reservation)
        assert reservation.spent == ledger.spent("alice")
        worth.append(ledger.spent_epsilon("alice", ZCDP_BUDGET, "zcdp"))
    assert ledger.spent("alice") == Cost(0.0, 0.0, math.fsum([0.05] * 4))
    # The whole history is converted once, at the analyst's whole δ: not four conversions added up.
    assert worth[0] == zcdp_to_approx_dp(0.05, 1e-5)
    assert worth[3] == zcdp_to_approx_dp(0.2, 1e-5) == epsilon_equivalent(ledger.spent("alice"), ZCDP_BUDGET)
    assert worth[3] < 0.2 + 2 * math.sqrt(0.2 * math.log(1 / 1e-5))  # Bun & Steinke's bound
    # Four times the ρ is worth about twice the ε (√4), far below four times it.
    assert 2.0 < worth[3] / worth[0] < 2.2
    assert worth == sorted(worth)
    assert ledger.remaining("alice", ZCDP_BUDGET) == Cost(5.0 - worth[3], 1e-5)
    assert ledger.spent_epsilon("bob", ZCDP_BUDGET, "zcdp") == 0.0


def test_zcdp_refuses_exactly_past_the_boundary(ledger: Ledger) -> None:
    limit = Cost(zcdp_to_approx_dp(0.25, 1e-6), 1e-6)
    ledger.commit(ledger.reserve("alice", zcdp(0.125), limit, accounting="zcdp"))
    ledger.commit(ledger.reserve("alice", zcdp(0.125), limit, accounting="zcdp"))  # exactly at the limit
    assert ledger.spent_epsilon("alice", limit, "zcdp") == limit.epsilon
    before = (ledger.spent("alice"), ledger.history("alice"))
    with pytest.raises(BudgetExhausted):
        ledger.reserve("alice", zcdp(1e-6), limit, accounting="zcdp")
    with pytest.raises(BudgetExhausted):
        ledger.reserve("alice", Cost(limit.epsilon * 2e-9), limit, accounting="zcdp")  # past the tolerance
    with pytest.raises(BudgetExhausted):
        ledger.reserve("alice", zcdp(0.0, delta=1e-12), limit, accounting="zcdp")  # less δ to convert at
    assert (ledger.spent("alice"), ledger.history("alice")) == before
    ledger.commit(ledger.reserve("alice", zcdp(0.0), limit, accounting="zcdp"))  # a free query still runs


def test_zcdp_needs_some_delta_left_to_convert_rho(ledger: Ledger) -> None:
    limit = Cost(100.0, 1e-6)
    ledger.commit(ledger.reserve("alice", Cost(0.5, 1e-6), limit, accounting="zcdp"))  # all of δ
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("alice", zcdp(1e-9), limit, accounting="zcdp")
    assert caught.value.message == (
        'privacy budget exhausted for analyst "alice": this query costs ρ=1e-09 but with it δ=1e-06 of '
        "δ=1e-06 would be spent, and converting ρ to ε needs some δ left; spent so far: ρ=0, δ=1e-06, "
        "ε=0.5 in pure-DP queries, worth ε=0.5; remaining: ε=99.5, δ=0 of ε=100, δ=1e-06"
    )
    ledger.commit(ledger.reserve("alice", Cost(0.5), limit, accounting="zcdp"))  # pure ε still fits
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("alice", Cost(0.5, 1e-7), limit, accounting="zcdp")
    assert caught.value.message.startswith(
        'privacy budget exhausted for analyst "alice": this query costs ε=0.5, δ=1e-07 but with it '
        "δ=1.1e-06 of δ=1e-06 would be spent; spent so far: ρ=0, δ=1e-06, ε=1 in pure-DP queries"
    )


def test_zcdp_refusal_shows_rho_and_epsilon_and_changes_nothing(ledger: Ledger) -> None:
    ledger.commit(ledger.reserve("alice", zcdp(0.2), ZCDP_BUDGET, accounting="zcdp", statement="SELECT 1"))
    before = (ledger.spent("alice"), ledger.history("alice"))
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("alice", zcdp(0.5, shown=2.0), ZCDP_BUDGET, accounting="zcdp", statement="SELECT 2")
    error = caught.value
    on_its_own = zcdp_to_approx_dp(0.5, 1e-5)
    worth_after = zcdp_to_approx_dp(0.7, 1e-5)
    worth_before = zcdp_to_approx_dp(0.2, 1e-5)
    assert error.sqlstate == "53400"
    assert error.message == (
        f'privacy budget exhausted for analyst "alice": this query costs ρ=0.5 (ε={on_its_own:.6g} on its '
        f"own) but with it the spending would be worth ε={worth_after:.6g} of ε=5; spent so far: ρ=0.2, "
        f"δ=0, worth ε={worth_before:.6g}; remaining: ε={5 - worth_before:.6g}, δ=1e-05 of ε=5, δ=1e-05"
    )
    assert error.hint is not None and "SET dpproxy.epsilon" in error.hint
    assert (ledger.spent("alice"), ledger.history("alice")) == before


def test_pure_entries_compose_sequentially_with_rho(ledger: Ledger) -> None:
    """Pure-accounting entries (ρ = 0) count in ε and use up δ the conversion of ρ could have had."""
    limit = Cost(3.0, 1e-5)
    ledger.commit(ledger.reserve("alice", Cost(0.5, 4e-6), limit, accounting="pure"))
    ledger.commit(ledger.reserve("alice", zcdp(0.05), limit, accounting="zcdp"))
    ledger.commit(ledger.reserve("alice", zcdp(0.05), limit, accounting="zcdp"))
    assert ledger.spent("alice") == Cost(0.5, 4e-6, 0.1)
    expected = 0.5 + zcdp_to_approx_dp(0.1, 1e-5 - 4e-6)
    assert ledger.spent_epsilon("alice", limit, "zcdp") == pytest.approx(expected, rel=1e-15)
    assert expected > 0.5 + zcdp_to_approx_dp(0.1, 1e-5)  # less δ left: the ρ is worth more ε

    # A zCDP query with partition selection is δ-approximately ρ-zCDP: its ρ and δ are charged, the ε
    # it shows on its own is not (that would count its conversion twice).
    selection = zcdp(0.01, delta=1e-6, shown=0.9)
    reservation = ledger.reserve("alice", selection, limit, accounting="zcdp")
    after = Cost(0.5, math.fsum([4e-6, 1e-6]), math.fsum([0.05, 0.05, 0.01]))
    assert reservation.spent == after == ledger.spent("alice")
    worth = ledger.spent_epsilon("alice", limit, "zcdp")
    assert worth == pytest.approx(0.5 + zcdp_to_approx_dp(after.rho, 5e-6), rel=1e-15)
    assert worth == pytest.approx(0.5 + converted_epsilon(after, limit.delta), rel=1e-15)
    assert epsilon_equivalent(reservation.spent, limit) == worth
    assert ledger.history("alice", limit=1)[0].cost == selection  # kept as given, for audit
    ledger.release(reservation)
    assert ledger.spent("alice") == Cost(0.5, 4e-6, 0.1)


def test_switching_back_to_pure_accounting_keeps_the_rho_spent(ledger: Ledger) -> None:
    limit = Cost(2.0, 1e-5)
    ledger.commit(ledger.reserve("alice", zcdp(0.05), limit, accounting="zcdp"))
    worth = zcdp_to_approx_dp(0.05, 1e-5)
    assert worth > 1.0
    # 1.0 alone would fit in ε=2 under pure composition; with the ρ already spent it does not.
    with pytest.raises(BudgetExhausted, match=r"spent so far: ρ=0\.05, δ=0, worth ε=1\.308"):
        ledger.reserve("alice", Cost(1.0), limit, accounting="pure")
    ledger.commit(ledger.reserve("alice", Cost(1.9 - worth), limit, accounting="pure"))
    assert ledger.spent_epsilon("alice", limit, "pure") == pytest.approx(1.9, rel=1e-12)


def test_pure_accounting_takes_no_rho_and_accounting_must_be_known(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="needs accounting='zcdp'"):
        ledger.reserve("alice", zcdp(0.01), ZCDP_BUDGET)
    with pytest.raises(ValueError, match="accounting must be one of pure, zcdp"):
        ledger.reserve("alice", zcdp(0.01), ZCDP_BUDGET, accounting="rdp")
    with pytest.raises(ValueError, match="accounting must be one of"):
        ledger.spent_epsilon("alice", ZCDP_BUDGET, "renyi")
    assert ledger.history("alice") == []


def test_zcdp_entries_keep_their_rho_for_audit_and_finishing(ledger: Ledger) -> None:
    first = ledger.reserve(
        "alice", zcdp(0.03, delta=1e-7, shown=1.5), ZCDP_BUDGET, accounting="zcdp", statement="q1"
    )
    ledger.commit(first)
    pending = ledger.reserve("alice", zcdp(0.02), ZCDP_BUDGET, accounting="zcdp", statement="q2")
    newest, oldest = ledger.history("alice")
    assert (oldest.rho, oldest.cost, oldest.status) == (0.03, Cost(1.5, 1e-7, 0.03), "committed")
    assert (newest.rho, newest.statement) == (0.02, "q2")
    with pytest.raises(ValueError, match="does not match"):
        ledger.release(Reservation(id=pending.id, analyst="alice", cost=zcdp(0.01)))
    with pytest.raises(ValueError, match="does not match"):
        ledger.release(Reservation(id=pending.id, analyst="alice", cost=zcdp(0.02, shown=0.1)))
    ledger.release(pending)
    assert ledger.spent("alice") == Cost(0.0, 1e-7, 0.03)  # the shown ε is not charged


def test_zcdp_spending_survives_reopen(store: Store) -> None:
    with store.open() as ledger:
        ledger.commit(ledger.reserve("alice", Cost(0.5), ZCDP_BUDGET, accounting="zcdp"))
        ledger.commit(
            ledger.reserve("alice", zcdp(0.1, delta=1e-6, shown=3.0), ZCDP_BUDGET, accounting="zcdp")
        )
    with store.open() as reopened:
        assert reopened.spent("alice") == Cost(0.5, 1e-6, 0.1)
        assert reopened.spent_epsilon("alice", ZCDP_BUDGET, "zcdp") == pytest.approx(
            0.5 + zcdp_to_approx_dp(0.1, 9e-6), rel=1e-15
        )


# A budget of exactly seven queries of ρ = 0.01 (at the analyst's whole δ of 1e-6).
RACE_RHO = 0.01
RACE_LIMIT = Cost(zcdp_to_approx_dp(math.fsum([RACE_RHO] * 7), 1e-6), 1e-6)


def _try_reserve_zcdp(ledger: Ledger) -> bool:
    try:
        reservation = ledger.reserve("alice", zcdp(RACE_RHO, shown=1.0), RACE_LIMIT, accounting="zcdp")
    except BudgetExhausted:
        return False
    ledger.commit(reservation)
    return True


def test_threads_sharing_one_ledger_never_overspend_in_zcdp(store: Store) -> None:
    ledger = store.open(max_connections=8) if store.kind == "postgres" else store.open()
    assert _race(lambda: _try_reserve_zcdp(ledger), contenders=24) == 7
    assert ledger.spent("alice") == Cost(0.0, 0.0, math.fsum([RACE_RHO] * 7))
    assert ledger.spent_epsilon("alice", RACE_LIMIT, "zcdp") <= RACE_LIMIT.epsilon


def test_threads_with_a_ledger_each_never_overspend_in_zcdp(store: Store) -> None:
    store.open().close()
    contenders = 20
    ledgers = [
        store.open(max_connections=1) if store.kind == "postgres" else store.open() for _ in range(contenders)
    ]
    it = iter(ledgers)
    lock = threading.Lock()

    def reserve_one() -> bool:
        with lock:
            ledger = next(it)
        return _try_reserve_zcdp(ledger)

    assert _race(reserve_one, contenders) == 7
    assert ledgers[0].spent("alice") == Cost(0.0, 0.0, math.fsum([RACE_RHO] * 7))


zcdp_operations = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=0.3, allow_nan=False, allow_subnormal=False),
        st.floats(min_value=0.0, max_value=3e-7, allow_nan=False, allow_subnormal=False),
        st.floats(min_value=0.0, max_value=0.05, allow_nan=False, allow_subnormal=False),
        st.sampled_from(["commit", "release", "leave"]),
    ),
    max_size=12,
)


@settings(deadline=None, max_examples=25)
@given(zcdp_operations)
def test_zcdp_never_overspends_and_refuses_only_what_does_not_fit(
    ops: list[tuple[float, float, float, str]],
) -> None:
    limit = Cost(3.0, 1e-6)
    counted: list[Cost] = []
    with SQLiteLedger(":memory:") as ledger:
        for i, (epsilon, delta, rho, then) in enumerate(ops):
            # Pure (ε, δ) costs and approximate zCDP (ρ, δ) costs showing an ε, in turn.
            cost = Cost(epsilon, delta, rho if i % 2 else 0.0)
            would = [*counted, cost]
            total_rho = math.fsum(c.rho for c in would)
            delta_left = limit.delta - math.fsum(c.delta for c in would)
            would_worth = math.fsum(c.epsilon for c in would if c.rho == 0) + (
                zcdp_to_approx_dp(total_rho, delta_left) if total_rho > 0 and delta_left > 0 else 0.0
            )
            clearly_fits = would_worth < limit.epsilon * (1 - 1e-9) and (
                delta_left > limit.delta * 1e-9 or (total_rho == 0 and delta_left >= 0)
            )
            try:
                reservation = ledger.reserve("alice", cost, limit, accounting="zcdp")
            except BudgetExhausted:
                assert not clearly_fits
                continue
            if then == "release":
                ledger.release(reservation)
            else:
                counted.append(cost)
                if then == "commit":
                    ledger.commit(reservation)
            spent = ledger.spent("alice")
            assert spent.rho == math.fsum(c.rho for c in counted)
            assert spent.epsilon == math.fsum(c.epsilon for c in counted if c.rho == 0)
            assert spent.delta <= limit.delta * (1 + FIT_RELATIVE_TOLERANCE)
            assert ledger.spent_epsilon("alice", limit, "zcdp") <= limit.epsilon * (
                1 + FIT_RELATIVE_TOLERANCE
            )


# --------------------------------------------------------------------------------------------------
# Migration from schema 2 (exact ε and δ totals, no ρ total, no replay store)


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
            assert check.execute("SELECT value FROM dpproxy_ledger_meta").fetchone() == ("3",)
    else:
        with psycopg.connect(store.spec) as check:
            assert check.execute(f"SELECT value FROM {store.table}_meta").fetchone() == ("3",)


# --------------------------------------------------------------------------------------------------
# Free replay: stored answers, per analyst


KEY_A, KEY_B = "a" * 64, "0123456789abcdef" * 4


def test_replay_returns_what_was_stored_and_nothing_else(ledger: Ledger) -> None:
    assert ledger.replay_get("alice", KEY_A) is None
    payload = bytes(range(256)) * 4000  # binary, with NULs, about 1 MB
    ledger.replay_put("alice", KEY_A, payload)
    assert ledger.replay_get("alice", KEY_A) == payload
    assert ledger.replay_get("alice", KEY_B) is None
    assert ledger.spent("alice") == Cost(0.0, 0.0)  # storing an answer charges nothing


def test_replay_first_writer_wins(ledger: Ledger) -> None:
    ledger.replay_put("alice", KEY_A, b'{"rows": [[1]]}')
    ledger.replay_put("alice", KEY_A, b'{"rows": [[2]]}')
    ledger.replay_put("alice", KEY_A, b'{"rows": [[1]]}')  # idempotent
    assert ledger.replay_get("alice", KEY_A) == b'{"rows": [[1]]}'


def test_replay_is_per_analyst(ledger: Ledger) -> None:
    ledger.replay_put("alice", KEY_A, b"alice's answer")
    assert ledger.replay_get("bob", KEY_A) is None
    ledger.replay_put("bob", KEY_A, b"bob's answer")
    assert ledger.replay_get("alice", KEY_A) == b"alice's answer"
    assert ledger.replay_get("bob", KEY_A) == b"bob's answer"


def test_replay_forget_and_reset_drop_one_analysts_answers(ledger: Ledger) -> None:
    ledger.replay_put("alice", KEY_A, b"1")
    ledger.replay_put("alice", KEY_B, b"2")
    ledger.replay_put("bob", KEY_A, b"3")
    assert ledger.replay_forget("alice") == 2
    assert ledger.replay_get("alice", KEY_A) is None and ledger.replay_get("alice", KEY_B) is None
    assert ledger.replay_get("bob", KEY_A) == b"3"
    assert ledger.replay_forget("alice") == 0

    ledger.replay_put("alice", KEY_A, b"4")
    ledger.commit(ledger.reserve("alice", Cost(0.5), BUDGET))
    assert ledger.reset("alice") == 1  # counts ledger entries, as before
    assert ledger.replay_get("alice", KEY_A) is None
    assert ledger.replay_get("bob", KEY_A) == b"3"
    ledger.replay_put("alice", KEY_A, b"5")  # a new answer after a reset is stored afresh
    assert ledger.replay_get("alice", KEY_A) == b"5"


def test_replay_keeps_the_newest_answers_per_analyst(store: Store) -> None:
    assert REPLAY_LIMIT == 10_000
    ledger = store.open(replay_limit=3)
    keys = [f"{i:032x}" for i in range(5)]
    ledger.replay_put("bob", keys[0], b"bob")
    for i, key in enumerate(keys):
        ledger.replay_put("alice", key, str(i).encode())
    assert [ledger.replay_get("alice", key) for key in keys] == [None, None, b"2", b"3", b"4"]
    ledger.replay_put("alice", keys[4], b"again")  # already stored: nothing new, nothing evicted
    assert [ledger.replay_get("alice", key) for key in keys] == [None, None, b"2", b"3", b"4"]
    ledger.replay_put("alice", keys[0], b"anew")  # an evicted answer bought again is the newest
    assert [ledger.replay_get("alice", key) for key in keys] == [b"anew", None, None, b"3", b"4"]
    assert ledger.replay_get("bob", keys[0]) == b"bob"  # another analyst's answers are not evicted


def test_replay_answers_survive_reopen(store: Store) -> None:
    with store.open() as ledger:
        ledger.replay_put("alice", KEY_A, b"stored")
    with store.open() as reopened:
        assert reopened.replay_get("alice", KEY_A) == b"stored"


def test_replay_puts_racing_on_one_key_keep_one_answer(store: Store) -> None:
    ledger = store.open(max_connections=8) if store.kind == "postgres" else store.open()
    payloads = iter(str(i).encode() for i in range(20))
    lock = threading.Lock()

    def put_one() -> bool:
        with lock:
            payload = next(payloads)
        ledger.replay_put("alice", KEY_A, payload)
        return ledger.replay_get("alice", KEY_A) is not None

    assert _race(put_one, contenders=20) == 20
    stored = ledger.replay_get("alice", KEY_A)
    assert stored in {str(i).encode() for i in range(20)}
    assert store.open().replay_get("alice", KEY_A) == stored


@pytest.mark.parametrize("key", ["", "ABCDEF0123456789", "abc", "g" * 32, "a" * 129, b"a" * 32, None])
def test_replay_keys_must_be_hex_digests(key: object) -> None:
    with SQLiteLedger(":memory:") as ledger:
        with pytest.raises(ValueError, match="replay key"):
            ledger.replay_put("alice", key, b"x")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="replay key"):
            ledger.replay_get("alice", key)  # type: ignore[arg-type]


def test_replay_payloads_are_bytes_and_the_limit_positive(tmp_path: Path) -> None:
    with SQLiteLedger(tmp_path / "ledger.sqlite3") as ledger:
        with pytest.raises(TypeError, match="payload must be bytes"):
            ledger.replay_put("alice", KEY_A, '{"rows": []}')  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="analyst"):
            ledger.replay_get("", KEY_A)
        ledger.replay_put("alice", KEY_A, bytearray(b"ok"))
        assert ledger.replay_get("alice", KEY_A) == b"ok"
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="replay_limit"):
            SQLiteLedger(tmp_path / "other.sqlite3", replay_limit=bad)  # type: ignore[arg-type]
