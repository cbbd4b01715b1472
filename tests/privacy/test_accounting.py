"""What a release costs and how costs compose: costs add up (never understated) and fit, and
OpenDP's zCDP → (ε, δ) conversion is what the accounting uses.
"""

from __future__ import annotations

import math
from fractions import Fraction

import opendp.prelude as dp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpproxy.errors import InvalidParameter
from dpproxy.privacy import Cost, converted_epsilon, plan_query_noise, zcdp_to_approx_dp
from tests.privacy.distributions import GAUSSIAN, I64_VECTORS, gaussian_threshold_measurement

dp.enable_features("contrib")


def test_costs_add_up_and_zero_is_neutral() -> None:
    total = Cost(0.1, 1e-7) + Cost(0.2, 2e-7)
    assert total.epsilon == pytest.approx(0.3) and total.delta == pytest.approx(3e-7)
    assert Cost(0.25, 1e-8) + Cost.ZERO == Cost(0.25, 1e-8)
    assert sum([Cost(0.5), Cost(0.25), Cost(0.125)], Cost.ZERO) == Cost(0.875, 0.0)


@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=10.0, allow_subnormal=False),
            st.floats(min_value=0.0, max_value=1e-5, allow_subnormal=False),
        ),
        max_size=30,
    )
)
def test_summed_costs_never_understate_what_was_spent(parts: list[tuple[float, float]]) -> None:
    total = Cost.ZERO
    for epsilon, delta in parts:
        total = total + Cost(epsilon, delta, rho=epsilon / 3)  # ρ adds up like ε
    exact_epsilon = sum((Fraction(e) for e, _ in parts), Fraction(0))
    exact_delta = sum((Fraction(d) for _, d in parts), Fraction(0))
    exact_rho = sum((Fraction(e / 3) for e, _ in parts), Fraction(0))
    assert Fraction(total.epsilon) >= exact_epsilon
    assert Fraction(total.delta) >= exact_delta
    assert Fraction(total.rho) >= exact_rho
    # ...and overstate it by rounding only: at most one ulp per addition.
    assert total.epsilon <= float(exact_epsilon) * (1 + 2**-51) ** (len(parts) + 1)


def test_fits_within_forgives_float_rounding_only() -> None:
    limit = Cost(0.3, 3e-7)
    assert (Cost(0.1, 1e-7) + Cost(0.2, 2e-7)).fits_within(limit)  # 0.30000000000000004 > 0.3
    assert Cost(0.3, 3e-7).fits_within(limit)
    assert not Cost(0.3 * (1 + 1e-8), 0.0).fits_within(limit)
    assert not Cost(0.0, 3e-7 * (1 + 1e-8)).fits_within(limit)
    assert not Cost(0.1, 1e-12).fits_within(Cost(1.0, 0.0))  # no δ to spend means none
    assert Cost(1.0).fits_within(Cost(1.0, 0.0))
    assert Cost(5.0, 1e-3).fits_within(Cost(math.inf, math.inf))


@pytest.mark.parametrize(
    ("epsilon", "delta", "rho"),
    [(-0.1, 0.0, 0.0), (math.nan, 0.0, 0.0), (0.1, -1e-9, 0.0), (0.1, math.nan, 0.0), (0.1, 0.0, -1e-3)],
)
def test_malformed_costs_are_refused(epsilon: float, delta: float, rho: float) -> None:
    with pytest.raises(ValueError):
        Cost(epsilon, delta, rho)
    with pytest.raises(TypeError):
        Cost(0.1, 0.0, "0.5")  # type: ignore[arg-type]


def test_rho_is_a_third_field_that_leaves_epsilon_delta_costs_as_they_were() -> None:
    assert Cost(0.5, 1e-6) == Cost(0.5, 1e-6, 0.0) and Cost(0.5).rho == 0.0
    total = Cost(0.1, 0.0, 0.02) + Cost(0.2, 1e-7, 0.03)
    assert (total.epsilon, total.delta, total.rho) == (pytest.approx(0.3), 1e-7, pytest.approx(0.05))
    # fits_within compares (ε, δ) only: under zCDP the ledger converts ρ with converted_epsilon.
    assert Cost(0.5, 0.0, 100.0).fits_within(Cost(1.0, 0.0))


def test_converted_epsilon_is_opendps_conversion_of_approximate_zcdp() -> None:
    measurement = gaussian_threshold_measurement(3.0, 20)
    rho, delta_native = measurement.map((2, 2, 1))
    assert rho > 0 and delta_native > 0
    expected, _ = dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(measurement), 1e-5).map((2, 2, 1))
    assert converted_epsilon(Cost(0.0, delta_native, rho), 1e-5) == pytest.approx(expected, rel=1e-9)
    assert converted_epsilon(Cost(0.0, 0.0, rho), 1e-5) == zcdp_to_approx_dp(rho, 1e-5)
    assert converted_epsilon(Cost.ZERO, 1e-6) == 0.0
    with pytest.raises(InvalidParameter, match="must exceed the cost's own delta"):
        converted_epsilon(Cost(0.0, 1e-5, 0.1), 1e-5)


def test_zcdp_composes_queries_far_more_cheaply_than_adding_their_epsilons() -> None:
    # What the ledger gains by keeping ρ: 20 queries of ε = 0.5 each at δ = 1e-6.
    noise = plan_query_noise(GAUSSIAN, 0.5, 1e-6, [(1, 1)], None, accounting="zcdp")
    assert noise.cost.epsilon <= 0.5 and noise.cost.rho > 0 and noise.cost.delta == 0
    total = sum([noise.cost] * 20, Cost.ZERO)
    assert converted_epsilon(total, 1e-6) < 0.35 * (20 * 0.5)


@pytest.mark.parametrize(("rho", "delta"), [(0.005, 1e-7), (1e-6, 1e-9), (0.5, 1e-5), (2.0, 0.01)])
def test_zcdp_conversion_is_opendps_and_beats_the_bun_steinke_bound(rho: float, delta: float) -> None:
    epsilon = zcdp_to_approx_dp(rho, delta)
    sigma = 3.0
    gaussian = dp.m.make_gaussian(I64_VECTORS, dp.l2_distance(T="f64"), scale=sigma)
    d_in = sigma * math.sqrt(2 * rho)
    expected, _ = dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(gaussian), delta).map(d_in)
    assert epsilon == pytest.approx(expected, rel=1e-9)
    assert epsilon <= rho + 2 * math.sqrt(rho * math.log(1 / delta))  # Bun & Steinke 2016, Prop. 1.3
    assert zcdp_to_approx_dp(rho * 1.01, delta) > epsilon
