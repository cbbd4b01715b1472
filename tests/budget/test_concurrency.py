"""Concurrency: a budget for exactly k queries, many more asking at once, from threads sharing one
ledger, threads with a ledger each, and processes sharing the store, under pure and zCDP accounting.

Tests taking the `store` or `ledger` fixture run on both stores: a SQLite file and a PostgreSQL table
(marked `postgres`; a table of their own in one database of the shared throwaway cluster; tests that
change the database itself use `pg_dsn`, a fresh empty one).
"""

from __future__ import annotations

import math
import multiprocessing
import threading

from dpproxy.budget import Ledger
from dpproxy.errors import BudgetExhausted
from dpproxy.privacy.accounting import Cost, zcdp_to_approx_dp
from tests.budget.stores import Store, open_store, race, statuses, try_reserve, zcdp


def test_threads_sharing_one_ledger_never_overspend(store: Store) -> None:
    ledger = store.open(max_connections=8) if store.kind == "postgres" else store.open()
    cost, limit = Cost(0.1, 1e-7), Cost(0.7, 1e-5)  # room for exactly 7
    assert race(lambda: try_reserve(ledger, cost, limit), contenders=24) == 7
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
        return try_reserve(ledger, cost, limit)

    assert race(reserve_one, contenders) == 5
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
            results.put("granted" if try_reserve(ledger, Cost(0.25), Cost(1.5, 0.0)) else "refused")
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
    assert race(lambda: _try_reserve_zcdp(ledger), contenders=24) == 7
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

    assert race(reserve_one, contenders) == 7
    assert ledgers[0].spent("alice") == Cost(0.0, 0.0, math.fsum([RACE_RHO] * 7))
