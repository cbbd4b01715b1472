"""The ledger's contract: reservations add up exactly, a cost that does not fit is refused with an
explanation and changes nothing, commit and release happen once, history and reset, and whatever the
order of reserves, commits and releases, the total is the exact sum of what was not released and
never exceeds the limit.

Tests taking the `store` or `ledger` fixture run on both stores: a SQLite file and a PostgreSQL table
(marked `postgres`; a table of their own in one database of the shared throwaway cluster; tests that
change the database itself use `pg_dsn`, a fresh empty one).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpproxy.budget import Ledger, LedgerEntry, Reservation
from dpproxy.budget.sqlite import SQLiteLedger
from dpproxy.errors import BudgetExhausted
from dpproxy.privacy.accounting import Cost
from tests.budget.stores import BUDGET, statuses


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


def test_refusal_explains_itself_and_changes_nothing(ledger: Ledger) -> None:
    ledger.commit(ledger.reserve("alice", Cost(9.8, 0.0), BUDGET, statement="SELECT 1"))
    before = (ledger.spent("alice"), ledger.history("alice"))

    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("alice", Cost(0.5, 1e-7), BUDGET, statement="SELECT 2")

    error = caught.value
    assert error.sqlstate == "53400"
    assert error.message == (
        'privacy budget exhausted for analyst "alice": this query costs ε=0.5, δ=1e-07 '
        "but only ε=0.2, δ=0.00001 remain of ε=10, δ=0.00001"
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
