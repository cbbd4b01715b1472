"""How an analyst's spending composes, kept exactly: the totals, whether a cost fits, and refusals.

A cost is a Cost(ε, δ, ρ) from dpproxy.privacy.accounting, of one of two kinds. With ρ = 0
it is (ε, δ)-DP (pure accounting, or a pure-DP query under zCDP accounting): ε and δ compose
sequentially and add up. With ρ > 0 it is δ-approximately ρ-zCDP (zCDP accounting, Gaussian noise):
ρ and δ add up, and its ε is only the display value of the query on its own, never charged. What an
analyst has spent is worth, in ε,

    ε-equivalent = Σε(entries with ρ = 0) + zcdp_to_approx_dp(Σρ, δ_budget − Σδ)

(with Σρ = 0 it is plain Σε, the pure accounting of old): the zCDP part is converted to (ε, δ)-DP
once, for the whole history, at all the δ its own δ and the sequential part leave (Bun & Steinke
2016; the conversion is OpenDP's), then composed sequentially with the rest, which is conservative.
A cost fits when, with it, the ε-equivalent is within the analyst's ε and Σδ within their δ
(strictly below it when Σρ > 0: the conversion needs some δ). Since √ρ, not ρ, drives the ε of a
Gaussian, many small zCDP queries are worth far less ε than the sum of their separate conversions:
that is why a deployment chooses `accounting: zcdp`. Entries from an earlier pure-accounting era
keep counting through Σε, whichever accounting the deployment uses now, and ρ left from a zCDP era
keeps counting after a switch back to pure accounting: switching never resets anything.

The totals are exact (decimal arithmetic, no rounding) and every float shown or compared is rounded
the conservative way. The argument for this composition is in docs/privacy.md.

This module never sees a store, SQL or a replay key, and never computes a query's cost: it adds up
costs computed by dpproxy.privacy and compares them with limits from the policy.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Iterable
from dataclasses import dataclass

from dpproxy.errors import BudgetExhausted
from dpproxy.privacy.accounting import FIT_RELATIVE_TOLERANCE, Cost, zcdp_to_approx_dp

# Exact sums of doubles: every double is a finite decimal whose digits lie between 10^308 and
# 10^-1074, so 1500 digits hold any sum or difference of them without rounding (400 did not: a
# double near 1e-231 alone has over 500). Should rounding ever be needed, Inexact is raised rather
# than a total silently rounded.
_EXACT = decimal.Context(prec=1500, Emin=-2000, Emax=2000, traps=[decimal.Inexact, decimal.InvalidOperation])
_ZERO = decimal.Decimal(0)

# The conversion takes δ < 1; a larger δ budget (an unlimited one) is converted at just below 1,
# which only overstates the ε.
_BELOW_ONE = math.nextafter(1.0, 0.0)


def _exact_add(total: decimal.Decimal, amount: float) -> decimal.Decimal:
    return _EXACT.add(total, decimal.Decimal(amount))


def _exact_sub(total: decimal.Decimal, amount: float) -> decimal.Decimal:
    return _EXACT.subtract(total, decimal.Decimal(amount))


def _float_up(value: decimal.Decimal) -> float:
    """The smallest float >= value."""
    nearest = float(value)
    return math.nextafter(nearest, math.inf) if decimal.Decimal(nearest) < value else nearest


def float_down(value: decimal.Decimal) -> float:
    """The largest float <= value."""
    nearest = float(value)
    return math.nextafter(nearest, -math.inf) if decimal.Decimal(nearest) > value else nearest


EXHAUSTED_HINT = (
    "ask the data owner to raise the budget, or lower the per-query epsilon with SET dpproxy.epsilon"
)


def epsilon_equivalent(spent: Cost, limit: Cost) -> float:
    """What spending, as Ledger.spent returns it, is worth in ε against `limit`'s δ, rounded up.

    spent.epsilon plus the conversion of spent.rho at the δ left (limit δ − spent.delta); infinite
    when ρ was spent and no δ is left (module doc).
    """
    return Totals(
        decimal.Decimal(spent.epsilon), decimal.Decimal(spent.delta), decimal.Decimal(spent.rho)
    ).worth(limit.delta)


def _charged_epsilon(cost: Cost) -> float:
    """The ε a cost adds to the sequential part: all of it when ρ = 0; none when ρ > 0 (display only)."""
    return cost.epsilon if cost.rho == 0 else 0.0


@dataclass(frozen=True)
class Totals:
    """Exact sums of one analyst's entries that are not released: ε of those with ρ = 0, all δ and ρ."""

    epsilon: decimal.Decimal = _ZERO
    delta: decimal.Decimal = _ZERO
    rho: decimal.Decimal = _ZERO

    def plus(self, cost: Cost) -> Totals:
        return Totals(
            _exact_add(self.epsilon, _charged_epsilon(cost)),
            _exact_add(self.delta, cost.delta),
            _exact_add(self.rho, cost.rho),
        )

    def minus(self, cost: Cost) -> Totals:
        return Totals(
            _exact_sub(self.epsilon, _charged_epsilon(cost)),
            _exact_sub(self.delta, cost.delta),
            _exact_sub(self.rho, cost.rho),
        )

    @property
    def spent(self) -> Cost:
        return Cost(float(self.epsilon), float(self.delta), float(self.rho))

    def delta_left(self, limit_delta: float) -> decimal.Decimal:
        return _EXACT.subtract(decimal.Decimal(limit_delta), self.delta)

    def worth(self, limit_delta: float) -> float:
        """The ε-equivalent (module doc), rounded up: Σε, plus Σρ converted at the δ left."""
        epsilon = _float_up(self.epsilon)
        if self.rho == 0:
            return epsilon
        delta_left = float_down(self.delta_left(limit_delta))
        if not delta_left > 0:
            return math.inf
        # The conversion grows with ρ and shrinks with δ: ρ rounded up and δ down only overstate it.
        converted = zcdp_to_approx_dp(_float_up(self.rho), min(delta_left, _BELOW_ONE))
        return _float_up(_EXACT.add(decimal.Decimal(epsilon), decimal.Decimal(converted)))

    def fits_within(self, limit: Cost) -> bool:
        if self.rho == 0:
            # Plain sequential composition, with Cost's forgiveness of float rounding.
            return Cost(float(self.epsilon), float(self.delta)).fits_within(limit)
        # Converting ρ needs some δ left over: Σδ strictly below the limit, compared exactly.
        if not self.delta < decimal.Decimal(limit.delta):
            return False
        if math.isinf(limit.epsilon):
            return True
        return self.worth(limit.delta) <= limit.epsilon * (1.0 + FIT_RELATIVE_TOLERANCE)


def _up(value: float, limit: float | None = None) -> str:
    """What a query costs or what was spent (of `limit`), as the notices, SHOW dpproxy.budget and
    `dpproxy budget show` print it (dpproxy.results): 6 significant digits, rounded up but for the
    float rounding the ledger forgives; δ = 1e-05 is 0.00001, δ = 1e-07 is 1e-07, 0 only if 0."""
    from dpproxy.results import budget_figure, spent_figure  # here: dpproxy.results imports this package

    return budget_figure(value, up=True) if limit is None else spent_figure(value, limit)


def _down(value: float, limit: float | None = None) -> str:
    """What is left of `limit` (or a limit itself), as the notices print it: rounded down."""
    from dpproxy.results import budget_figure, remaining_figure

    value = max(0.0, value)
    return budget_figure(value, up=False) if limit is None else remaining_figure(value, limit)


def _apart(first: float, second: float, first_text: str, second_text: str) -> tuple[str, str]:
    """Two amounts a message compares ("costs δ=… but only δ=… remain"), with digits added until
    they differ: "costs ε=0.5 but only ε=0.5 remain" would be nonsense."""
    for precision in (10, 17):
        if first_text != second_text or first == second:
            break
        first_text, second_text = f"{first:.{precision}g}", f"{second:.{precision}g}"
    return first_text, second_text


def check_fits(
    analyst: str, total: Totals, cost: Cost, limit: Cost, accounting: str, *, whose: str | None = None
) -> Totals:
    """The totals with `cost` added, if they fit within `limit`; else BudgetExhausted, whose message
    names the budget: the analyst's, or `whose` (the data set's)."""
    after = total.plus(cost)
    if after.fits_within(limit):
        return after
    named = whose or f'analyst "{analyst}"'
    if accounting == "pure" and after.rho == 0:
        raise _pure_refusal(named, total, cost, limit)
    raise _zcdp_refusal(named, total, after, cost, limit)


def _pure_refusal(named: str, total: Totals, cost: Cost, limit: Cost) -> BudgetExhausted:
    spent = total.spent
    remains_eps = max(0.0, limit.epsilon - spent.epsilon)
    remains_delta = max(0.0, limit.delta - spent.delta)
    cost_eps, remains_eps_text = _apart(
        cost.epsilon, remains_eps, _up(cost.epsilon), _down(remains_eps, limit.epsilon)
    )
    cost_delta, remains_delta_text = _apart(
        cost.delta, remains_delta, _up(cost.delta), _down(remains_delta, limit.delta)
    )
    return BudgetExhausted(
        f"privacy budget exhausted for {named}: this query costs ε={cost_eps}, "
        f"δ={cost_delta} but only ε={remains_eps_text}, δ={remains_delta_text} remain of "
        f"ε={_down(limit.epsilon)}, δ={_down(limit.delta)}",
        hint=EXHAUSTED_HINT,
    )


def _zcdp_refusal(named: str, total: Totals, after: Totals, cost: Cost, limit: Cost) -> BudgetExhausted:
    """Says what the query costs (ρ and its ε), what is spent (ρ and its ε-equivalent), what remains."""
    delta_after = float_down(after.delta_left(limit.delta))
    if cost.rho > 0:
        costs = f"ρ={_up(cost.rho)}" + (f", δ={_up(cost.delta)}" if cost.delta else "")
        if delta_after > 0:
            costs += f" (ε={_up(zcdp_to_approx_dp(cost.rho, min(delta_after, _BELOW_ONE)))} on its own)"
    else:
        costs = f"ε={_up(cost.epsilon)}" + (f", δ={_up(cost.delta)}" if cost.delta else "")
    if after.rho > 0 and not delta_after > 0:
        # All of δ spent is a reason here, so the two may well print alike.
        why = (
            f"with it δ={_up(float(after.delta), limit.delta)} of δ={_down(limit.delta)} would be spent, "
            "and converting "
            "ρ to ε needs some δ left"
        )
    elif not Cost(0.0, float(after.delta)).fits_within(limit):
        spent_delta, budget_delta = _apart(
            float(after.delta), limit.delta, _up(float(after.delta), limit.delta), _down(limit.delta)
        )
        why = f"with it δ={spent_delta} of δ={budget_delta} would be spent"
    else:
        worth = after.worth(limit.delta)
        worth_after, budget = _apart(worth, limit.epsilon, _up(worth, limit.epsilon), _down(limit.epsilon))
        why = f"with it the spending would be worth ε={worth_after} of ε={budget}"
    spent = total.spent
    spent_parts = [f"ρ={_up(spent.rho)}", f"δ={_up(spent.delta, limit.delta)}"]
    if spent.epsilon:
        spent_parts.append(f"ε={_up(spent.epsilon, limit.epsilon)} in pure-DP queries")
    worth_before = total.worth(limit.delta)
    return BudgetExhausted(
        f"privacy budget exhausted for {named}: this query costs {costs} but {why}; "
        f"spent so far: {', '.join(spent_parts)}, worth ε={_up(worth_before, limit.epsilon)}; remaining: "
        f"ε={_down(limit.epsilon - worth_before, limit.epsilon)}, "
        f"δ={_down(float_down(total.delta_left(limit.delta)), limit.delta)} of "
        f"ε={_down(limit.epsilon)}, δ={_down(limit.delta)}",
        hint=EXHAUSTED_HINT,
    )


def signed_amounts(cost: Cost, sign: int) -> tuple[decimal.Decimal, decimal.Decimal, decimal.Decimal]:
    """What `cost` adds to the totals (sign 1) or takes from them (sign -1), exactly: ε (as charged), δ, ρ."""
    # Through _EXACT: Decimal's default context would round the product to 28 digits.
    return (
        _EXACT.multiply(decimal.Decimal(_charged_epsilon(cost)), sign),
        _EXACT.multiply(decimal.Decimal(cost.delta), sign),
        _EXACT.multiply(decimal.Decimal(cost.rho), sign),
    )


def exact_totals(amounts: Iterable[tuple[float, float, float | None]]) -> Totals:
    totals = Totals()
    for e, d, r in amounts:
        totals = totals.plus(Cost(float(e), float(d), float(r or 0.0)))
    return totals
