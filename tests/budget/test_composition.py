"""zCDP composition: ρ adds up and is converted to ε once, at the δ the analyst has left; pure
entries compose sequentially with it, switching accounting resets nothing, and no sequence of costs
overspends.

Tests taking the `store` or `ledger` fixture run on both stores: a SQLite file and a PostgreSQL table
(marked `postgres`; a table of their own in one database of the shared throwaway cluster; tests that
change the database itself use `pg_dsn`, a fresh empty one).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpproxy.budget import Ledger, Reservation, epsilon_equivalent
from dpproxy.budget.sqlite import SQLiteLedger
from dpproxy.errors import BudgetExhausted, InvalidParameter
from dpproxy.privacy.accounting import FIT_RELATIVE_TOLERANCE, Cost, converted_epsilon, zcdp_to_approx_dp
from dpproxy.results import budget_figure
from tests.budget.stores import ZCDP_BUDGET, Store, zcdp


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
    # Figures as the notices show them: what is spent or costs rounded up, what is left down.
    up, down = (lambda v: budget_figure(v, up=True)), (lambda v: budget_figure(v, up=False))
    assert error.message == (
        f'privacy budget exhausted for analyst "alice": this query costs ρ=0.5 (ε={up(on_its_own)} on its '
        f"own) but with it the spending would be worth ε={up(worth_after)} of ε=5; spent so far: ρ=0.2, "
        f"δ=0, worth ε={up(worth_before)}; remaining: ε={down(5 - worth_before)}, δ=0.00001 of ε=5, "
        "δ=0.00001"
    )
    assert up(worth_before) == "2.81364" and down(5 - worth_before) == "2.18636"
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


def test_a_rho_too_large_to_convert_is_refused_with_a_sqlstate() -> None:
    """At ε = 100,000 per query (a policy's max_epsilon may allow it) the conversion's exp()
    overflowed in OpenDP and the statement failed with no SQLSTATE; it is refused with 22023."""
    assert zcdp_to_approx_dp(1000.0, 1e-6) > 0
    with pytest.raises(InvalidParameter) as caught:
        zcdp_to_approx_dp(1e5, 1e-3)
    assert caught.value.sqlstate == "22023" and "too large" in caught.value.message
