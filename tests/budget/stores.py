"""What the ledger tests share: a store that can be opened many times, the budgets they charge
against, and a race of threads for a budget with room for exactly k queries.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from dpproxy.budget import Ledger
from dpproxy.budget.postgres import PostgresLedger
from dpproxy.budget.sqlite import SQLiteLedger
from dpproxy.errors import BudgetExhausted
from dpproxy.privacy.accounting import Cost

BUDGET = Cost(10.0, 1e-5)
ZCDP_BUDGET = Cost(5.0, 1e-5)


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


def statuses(ledger: Ledger, analyst: str) -> list[str]:
    return [entry.status for entry in ledger.history(analyst, limit=1000)]


def race(reserve_one: Callable[[], bool], contenders: int) -> int:
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


def try_reserve(ledger: Ledger, cost: Cost, limit: Cost) -> bool:
    try:
        reservation = ledger.reserve("alice", cost, limit)
    except BudgetExhausted:
        return False
    ledger.commit(reservation)
    return True


def zcdp(rho: float, delta: float = 0.0, shown: float = 0.0) -> Cost:
    """A zCDP cost: δ-approximately ρ-zCDP; `shown` is its display-only ε (see dpproxy.privacy.accounting.Cost)."""
    return Cost(shown, delta, rho)
