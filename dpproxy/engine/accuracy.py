"""Accuracy first: the least ε whose 95% interval meets the analyst's target (`SET
dpproxy.target_error = 50`), within the per-query cap, or a refusal that says what the target would
cost (README, "Accuracy first"; docs/privacy.md §8).

The target is read against the ± the NOTICE would report for each COUNT and SUM column: their noise
is the same for every group and is fixed by the plan alone (the calibration of ε, δ and the
sensitivities, at the ceilings when the bounds are chosen per query, so a chosen smaller bound only
narrows it). An average's, a spread's or a quantile's ± depends on its group's noisy count, that is on
the data: a target cannot be met for it without looking, so such a column does not steer the choice,
and a query with no COUNT or SUM is refused under a target. Choosing ε reads only the plan, never
data: it is free, and the ε chosen says nothing about the data.

The ± of a count or sum falls as ε grows (every calibration here is monotone in ε), so the least ε
is found by bisection between the policy's `min_epsilon` and the analyst's per-query cap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dpproxy.engine.plan import Plan, errors_at
from dpproxy.errors import InvalidParameter, NotSupported
from dpproxy.sql.query import AggregateKind

# Bisection steps: the bracket [min_epsilon, cap] shrinks 2⁻⁴⁰-fold, far below the 3 significant
# digits the chosen ε is rounded up to.
_STEPS = 40


def least_epsilon(plan: Plan, target: float, low: float, high: float) -> float:
    """The least ε in [low, high] (rounded up to 3 significant digits) at which every COUNT and SUM
    of `plan` has a ± at 95% of at most `target`. NotSupported (0A000) without such a column;
    InvalidParameter when even `high` does not meet the target (the message says about what would)."""
    columns = [a for a, agg in enumerate(plan.query.aggregates) if agg.kind in _STEERING]
    # A cap below the range's lower end (a session on an earlier policy whose min_epsilon exceeds
    # the cap now in force): the cap wins, the chosen ε is never above it.
    low = min(low, high)
    if not columns:
        raise NotSupported(
            "dpproxy.target_error applies to COUNT and SUM columns, whose ± the plan fixes; this query "
            "has none (the ± of an average, a spread or a quantile depends on its group's count)",
            hint="RESET dpproxy.target_error and choose ε with SET dpproxy.epsilon",
        )

    def worst(epsilon: float) -> float:
        return max(_numeric(errors_at(plan, epsilon), columns))

    at_cap = worst(high)
    if at_cap > target:
        # Most calibrations scale as 1/ε: an estimate of what the target would need, said as such.
        needed = high * at_cap / target
        raise InvalidParameter(
            f"dpproxy.target_error = {target:g} needs about ε = {_up3(needed):g} for this query, more "
            f"than the per-query cap ε = {high:g} (at the cap the ± is {at_cap:.6g})",
            hint="accept a wider interval, group more coarsely, or ask the data owner for a larger "
            "max_epsilon_per_query",
        )
    if worst(low) <= target:
        return low
    below, above = low, high
    for _ in range(_STEPS):
        middle = (below + above) / 2
        if worst(middle) <= target:
            above = middle
        else:
            below = middle
    chosen = min(_up3(above), high)
    return chosen if worst(chosen) <= target else high


_STEERING = (AggregateKind.COUNT, AggregateKind.SUM)


def _numeric(errors: Sequence[float | str | None], columns: Sequence[int]) -> list[float]:
    return [float(errors[a]) for a in columns if isinstance(errors[a], (int, float))]  # type: ignore[arg-type]


def _up3(value: float) -> float:
    """`value` rounded up to 3 significant digits (an ε the NOTICE and the ledger show as written)."""
    if value <= 0:
        return value
    exponent = math.floor(math.log10(value)) - 2
    return math.ceil(value / 10**exponent) * 10**exponent
