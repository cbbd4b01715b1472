"""What a release costs and how costs compose: Cost, pure and zCDP accounting, ρ ↔ ε.

This module owns the Cost of a query (or the limit of a budget) and its addition, rounded up so that
a sum of costs is never below the exact sum; the split of a total into shares whose rounded-up sum
stays within it; and OpenDP's conversion of ρ-zCDP into (ε, δ)-DP, both ways (the ε of a ρ at a δ,
and the largest ρ within an ε). The ledger (dpproxy.budget) composes costs with this module alone.

It never sees noise, samplers, selections or SQL: only numbers that are costs. How each mechanism's
cost is derived, and the neighbouring relation it holds under, is argued in docs/privacy.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import ClassVar

from dpproxy.errors import InvalidParameter
from dpproxy.privacy import opendp_names as dp
from dpproxy.privacy.calibration import I64_VECTORS
from dpproxy.privacy.checks import check_positive

# fits_within forgives this much relative excess, and only so that sums that differ from the limit
# by float rounding (0.1 + 0.2 vs 0.3) are not refused. It is not slack in the guarantee worth
# speaking of: spending ε(1 + 1e-9) instead of ε changes e^ε in the ninth digit.
FIT_RELATIVE_TOLERANCE = 1e-9


def _add_up(a: float, b: float) -> float:
    """a + b rounded towards +inf: never below the exact sum, so added-up costs are never understated."""
    total = a + b
    if math.isinf(total):
        return total
    # Knuth's TwoSum: `error` is exactly (a + b) - total for round-to-nearest floats.
    b_part = total - a
    a_part = total - b_part
    error = (a - a_part) + (b - b_part)
    return math.nextafter(total, math.inf) if error > 0 else total


def sum_up(values: Sequence[float]) -> float:
    """The sum of `values`, every addition rounded up: never below the exact sum."""
    total = 0.0
    for value in values:
        total = _add_up(total, value)
    return total


class Accounting(StrEnum):
    """How a deployment composes the costs of an analyst's queries.

    PURE: every query's cost is an (ε, δ) and ε, δ add up. Gaussian noise is converted to (ε, δ)
    query by query.
    ZCDP: every query's cost is a ρ (zero-concentrated DP, Bun & Steinke 2016) plus the δ of its
    partition selection (approximate zCDP); ρ and that δ add up across queries, and only the total is
    converted to (ε, δ) against the analyst's budget, with `converted_epsilon`. Noise is discrete
    Gaussian (Canonne, Kamath & Steinke 2020), as the US Census Bureau used for 2020.
    """

    PURE = "pure"
    ZCDP = "zcdp"


@dataclass(frozen=True)
class Cost:
    """What one query costs, or what a budget holds.

    Under pure accounting: (ε, δ) under sequential composition, rho = 0.
    Under zCDP accounting: the query is δ-approximately ρ-zCDP (Bun & Steinke 2016, Def. 8.1): `rho`
    and `delta` are what composes (both add up); `epsilon` is for display only, the ε at which the
    query alone is (ε, δ_request)-DP (see planning.QueryNoise.approx_dp).

    `a + b` rounds up, one ulp at most per field, so a sum of costs is never below the exact sum.
    """

    epsilon: float
    delta: float = 0.0
    rho: float = 0.0

    ZERO: ClassVar[Cost]

    def __post_init__(self) -> None:
        # Infinite limits are allowed (an unlimited budget); NaN would make every comparison false.
        for name, value in (("epsilon", self.epsilon), ("delta", self.delta), ("rho", self.rho)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"Cost.{name} must be a number, not {type(value).__name__}")
            if math.isnan(value) or value < 0:
                raise ValueError(f"Cost.{name} must be a number >= 0, not {value!r}")

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(
            _add_up(self.epsilon, other.epsilon),
            _add_up(self.delta, other.delta),
            _add_up(self.rho, other.rho),
        )

    def fits_within(self, limit: Cost) -> bool:
        """ε and δ are each at most the limit's, forgiving FIT_RELATIVE_TOLERANCE of float rounding.

        ρ is not compared: under zCDP accounting the ledger converts the total with converted_epsilon.
        """
        scale = 1.0 + FIT_RELATIVE_TOLERANCE
        return self.epsilon <= limit.epsilon * scale and self.delta <= limit.delta * scale


Cost.ZERO = Cost(0.0, 0.0, 0.0)


@lru_cache(maxsize=1024)
def even_share(total: float, parts: int) -> float:
    """The largest float s <= total/parts whose upward-rounded sum of `parts` copies is <= total
    (kept per (total, parts): a query's plan asks for the same shares many times, each a loop of
    `parts` additions)."""
    share = total / parts
    while sum_up([share] * parts) > total:
        share = math.nextafter(share, 0.0)
    return share


def remainder(total: float, spent: float) -> float:
    """The largest r <= total - spent with spent + r (rounded up) <= total."""
    rest = total - spent
    while _add_up(spent, rest) > total:
        rest = math.nextafter(rest, 0.0)
    return rest


@lru_cache(maxsize=1)
def _unit_gaussian() -> dp.Measurement:
    """A Gaussian of scale 1: its map, at d_in = √(2ρ), is a zCDP measurement costing ρ, for conversions."""
    return dp.m.make_gaussian(I64_VECTORS, dp.l2_distance(T="f64"), scale=1.0)


@lru_cache(maxsize=256)
def _unit_gaussian_at_delta(delta: float) -> dp.Measurement:
    return dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(_unit_gaussian()), delta)


@lru_cache(maxsize=4096)
def zcdp_to_approx_dp(rho: float, delta: float) -> float:
    """The ε that OpenDP's zCDP → (ε, δ) conversion gives a ρ-zCDP measurement at this δ.

    The conversion is applied to a Gaussian whose map is ρ, or one float above it (never below).
    """
    check_positive("rho", rho)
    check_positive("delta", delta)
    if delta >= 1:
        raise InvalidParameter(f"delta must be < 1, not {delta!r}")
    unit = _unit_gaussian()
    d_in = math.sqrt(2.0 * rho)
    while unit.map(d_in) < rho:
        d_in = math.nextafter(d_in, math.inf)
    try:
        epsilon, _ = _unit_gaussian_at_delta(delta).map(d_in)
    except dp.OpenDPException as error:  # exp() of the bound overflows a float: ρ in the thousands
        raise InvalidParameter(
            f"a zCDP cost of rho={rho:g} is too large to convert to (epsilon, delta) at delta={delta:g}",
            hint="ask for a smaller epsilon per query (SET dpproxy.epsilon, or the policy's max_epsilon)",
        ) from error
    return epsilon


def converted_epsilon(cost: Cost, delta: float) -> float:
    """The ε at which a zCDP-accounted cost (δ₀-approximately ρ-zCDP) is (ε, delta)-DP.

    ε = zcdp_to_approx_dp(ρ, delta − δ₀): the conversion OpenDP's make_zCDP_to_approxDP applies to an
    approximate-zCDP measurement (checked against make_gaussian_threshold in the tests). A cost with
    ρ = 0 converts to ε = 0. The ledger uses it on an analyst's summed cost against the budget's δ.
    """
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not cost.delta < delta < 1:
        raise InvalidParameter(
            f"delta {delta!r} must exceed the cost's own delta {cost.delta!r} (and be < 1) to convert zCDP"
        )
    if cost.rho == 0:
        return 0.0
    return zcdp_to_approx_dp(cost.rho, remainder(float(delta), cost.delta))


@lru_cache(maxsize=1024)
def rho_for(epsilon: float, delta: float) -> float:
    """The largest ρ (to ~1e-9 relative) whose OpenDP conversion gives at most epsilon at delta.

    Starts from Bun & Steinke's ρ + 2√(ρ ln(1/δ)) = ε, which OpenDP's tighter conversion (CKS20)
    affords, then brackets and runs regula falsi (Illinois), ~8 conversions of ~2 ms each.
    """

    def excess(rho: float) -> float:
        return zcdp_to_approx_dp(rho, delta) - epsilon

    log_term = math.log(1.0 / delta)
    low = (math.sqrt(log_term + epsilon) - math.sqrt(log_term)) ** 2
    f_low = excess(low)
    while f_low > 0:
        low /= 2.0
        f_low = excess(low)
    high = low * 2.0
    f_high = excess(high)
    while f_high <= 0:
        low, f_low = high, f_high
        high *= 2.0
        f_high = excess(high)
    side = 0
    for _ in range(100):
        if high / low - 1.0 < 1e-9 or -f_low <= 1e-9 * epsilon:
            break
        guess = (low * f_high - high * f_low) / (f_high - f_low)
        if not low < guess < high:
            guess = (low + high) / 2.0
        f_guess = excess(guess)
        if f_guess <= 0:
            low, f_low = guess, f_guess
            if side == -1:
                f_high /= 2.0
            side = -1
        else:
            high, f_high = guess, f_guess
            if side == 1:
                f_low /= 2.0
            side = 1
    return low
