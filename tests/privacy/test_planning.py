"""Planning a query: how (ε, δ) is split over components, selectors and partition selection, every
part calibrated against OpenDP's maps, under pure and zCDP accounting, and never overspending.
"""

from __future__ import annotations

import math
from fractions import Fraction

import opendp.prelude as dp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpproxy.errors import InvalidParameter
from dpproxy.policy import Mechanism
from dpproxy.privacy import (
    Accounting,
    Cost,
    ModeRequest,
    ModeSpec,
    QuantileRequest,
    QuantileSpec,
    QueryNoise,
    SelectorRequest,
    converted_epsilon,
    plan_query_noise,
)
from tests.privacy.distributions import GAUSSIAN, I64_VECTORS, LAPLACE, gaussian_threshold_measurement

dp.enable_features("contrib")

components_strategy = st.lists(
    st.tuples(st.integers(min_value=1, max_value=10**7), st.integers(min_value=1, max_value=20)),
    max_size=5,
)


@settings(max_examples=80, deadline=None)
@given(
    mechanism=st.sampled_from([LAPLACE, GAUSSIAN]),
    epsilon=st.floats(min_value=0.001, max_value=10.0),
    delta=st.floats(min_value=1e-12, max_value=1e-3),
    components=components_strategy,
    selection_groups=st.none() | st.integers(min_value=1, max_value=50),
)
def test_planned_cost_never_exceeds_the_request_and_wastes_nothing(
    mechanism: Mechanism,
    epsilon: float,
    delta: float,
    components: list[tuple[int, int]],
    selection_groups: int | None,
) -> None:
    noise = plan_query_noise(mechanism, epsilon, delta, components, selection_groups)
    assert noise.cost.epsilon <= epsilon and noise.cost.delta <= delta
    assert [(c.sensitivity, c.max_groups) for c in noise.columns] == components
    assert all(c.mechanism == mechanism for c in noise.columns)
    assert (noise.selection is None) == (selection_groups is None)
    if components or selection_groups is not None:
        assert noise.cost.epsilon >= epsilon * (1 - 1e-6)  # the budget asked for is the budget used
    else:
        assert noise.cost == Cost.ZERO


@settings(max_examples=40, deadline=None)
@given(
    epsilon=st.floats(min_value=0.001, max_value=10.0),
    delta=st.sampled_from([0.0, 1e-9, 1e-7, 1e-5]),
    components=components_strategy.filter(bool),
    with_selection=st.booleans(),
)
def test_laplace_cost_is_the_sum_of_opendp_maps(
    epsilon: float, delta: float, components: list[tuple[int, int]], with_selection: bool
) -> None:
    selection_groups = 3 if with_selection and delta > 0 else None
    noise = plan_query_noise(LAPLACE, epsilon, delta, components, selection_groups)
    share = epsilon / (len(components) + (selection_groups is not None))
    maps = []
    for (sensitivity, max_groups), column in zip(components, noise.columns, strict=True):
        d_in = sensitivity * max_groups
        assert column.d_in == d_in and column.rho == 0.0
        # A measurement built here, independently, agrees on the cost of the planned scale.
        measurement = dp.m.make_laplace(I64_VECTORS, dp.l1_distance(T="i64"), scale=column.scale)
        assert measurement.map(d_in) == column.epsilon <= share
        # b = Δ₁/ε (Dwork & Roth 2014), up to the tiny nudge that makes OpenDP's rounded-up map fit.
        assert column.scale >= d_in / share * (1 - 1e-15)
        assert column.scale == pytest.approx(d_in / share, rel=1e-12)
        maps.append(column.epsilon)
    if noise.selection is not None:
        maps.append(noise.selection.epsilon)
    assert noise.cost.epsilon == pytest.approx(math.fsum(maps), rel=1e-14)
    assert noise.cost.delta == (noise.selection.delta if noise.selection is not None else 0.0)


@settings(max_examples=30, deadline=None)
@given(
    epsilon=st.floats(min_value=0.01, max_value=5.0),
    delta=st.floats(min_value=1e-12, max_value=1e-3),
    components=components_strategy.filter(bool),
    selection_groups=st.none() | st.integers(min_value=1, max_value=10),
)
def test_gaussian_columns_are_calibrated_by_opendp_maps_and_converted_by_opendp(
    epsilon: float, delta: float, components: list[tuple[int, int]], selection_groups: int | None
) -> None:
    noise = plan_query_noise(GAUSSIAN, epsilon, delta, components, selection_groups)
    rhos = []
    for (sensitivity, max_groups), column in zip(components, noise.columns, strict=True):
        assert Fraction(column.d_in) ** 2 >= max_groups * sensitivity**2  # L2 never understated
        assert column.d_in == pytest.approx(math.sqrt(max_groups) * sensitivity, rel=1e-15)
        measurement = dp.m.make_gaussian(I64_VECTORS, dp.l2_distance(T="f64"), scale=column.scale)
        assert measurement.map(column.d_in) == column.rho
        # σ² = Δ₂²/(2ρ) (Bun & Steinke 2016), up to the nudge.
        assert column.scale == pytest.approx(column.d_in / math.sqrt(2 * column.rho), rel=1e-12)
        assert column.epsilon == 0.0
        rhos.append(column.rho)
    assert max(rhos) == pytest.approx(min(rhos), rel=1e-12)  # ρ split evenly
    delta_rest = delta if selection_groups is None else delta - delta / 2
    selection_cost = Cost.ZERO
    if noise.selection is not None:
        selection_cost = Cost(noise.selection.epsilon, noise.selection.delta)
    conversion = dp.c.make_fix_delta(
        dp.c.make_zCDP_to_approxDP(dp.m.make_gaussian(I64_VECTORS, dp.l2_distance(T="f64"), scale=1.0)),
        delta_rest,
    )
    epsilon_rest, _ = conversion.map(math.sqrt(2 * math.fsum(rhos)))
    assert noise.cost.epsilon == pytest.approx(selection_cost.epsilon + epsilon_rest, rel=1e-9)
    assert noise.cost.delta == pytest.approx(selection_cost.delta + delta_rest, rel=1e-12)


def test_splits_give_each_share_its_part() -> None:
    laplace = plan_query_noise(LAPLACE, 1.0, 1e-6, [(1, 1), (1, 1), (1, 1)], 1)
    assert [c.epsilon for c in laplace.columns] == pytest.approx([0.25] * 3)
    assert laplace.selection is not None and laplace.selection.epsilon == pytest.approx(0.25)
    assert laplace.cost.delta == laplace.selection.delta <= 1e-6
    gaussian = plan_query_noise(GAUSSIAN, 1.0, 1e-6, [(1, 1), (1, 1), (1, 1)], 1)
    assert gaussian.selection is not None and gaussian.selection.delta <= 0.5e-6
    assert gaussian.cost.epsilon == pytest.approx(1.0, rel=1e-6)
    # Nothing else to pay for: selection alone gets all of ε and δ.
    alone = plan_query_noise(GAUSSIAN, 1.0, 1e-6, [], 2)
    assert alone.columns == () and alone.cost == Cost(alone.selection.epsilon, alone.selection.delta)
    assert (
        alone.cost.epsilon == pytest.approx(1.0) and alone.selection.threshold < gaussian.selection.threshold
    )
    assert plan_query_noise(LAPLACE, 1.0, 0.0, [], None) == QueryNoise((), None, Cost.ZERO)


def test_plans_are_cached_and_accept_the_mechanism_by_name() -> None:
    first = plan_query_noise(GAUSSIAN, 0.7, 1e-7, [(3, 2), (1, 2)], None)
    assert plan_query_noise("gaussian", 0.7, 1e-7, ((3, 2), (1, 2)), None) is first


@pytest.mark.parametrize(
    ("mechanism", "epsilon", "delta", "components", "selection_groups", "message"),
    [
        (LAPLACE, 0.0, 1e-7, [(1, 1)], None, "epsilon must be a finite number > 0"),
        (LAPLACE, -1.0, 1e-7, [(1, 1)], None, "epsilon must be a finite number > 0"),
        (LAPLACE, math.nan, 1e-7, [(1, 1)], None, "epsilon must be a finite number > 0"),
        (LAPLACE, math.inf, 1e-7, [(1, 1)], None, "epsilon must be a finite number > 0"),
        (LAPLACE, 1.0, 1.0, [(1, 1)], None, "delta must be a number >= 0 and < 1"),
        (LAPLACE, 1.0, -1e-9, [(1, 1)], None, "delta must be a number >= 0 and < 1"),
        (LAPLACE, 1.0, 0.0, [(1, 1)], 2, "partition selection for GROUP BY keys without public_values"),
        (GAUSSIAN, 1.0, 0.0, [(1, 1)], None, "the gaussian mechanism needs delta > 0"),
        (LAPLACE, 1.0, 1e-7, [(0, 1)], None, "sensitivity of a released value must be an integer >= 1"),
        (LAPLACE, 1.0, 1e-7, [(1, 0)], None, "max_groups of a released value must be an integer >= 1"),
        (LAPLACE, 1.0, 1e-7, [(2**40, 2**30)], None, "too large to calibrate noise for"),
        ("uniform", 1.0, 1e-7, [(1, 1)], None, "unknown noise mechanism"),
        # OpenDP's δ cannot go below a few ulps of 1.0 per group, however high the threshold.
        (LAPLACE, 1.0, 1e-15, [], 10, "delta 1e-15 is too small for partition selection"),
    ],
)
def test_impossible_requests_are_rejected_with_what_to_do(
    mechanism: Mechanism,
    epsilon: float,
    delta: float,
    components: list[tuple[int, int]],
    selection_groups: int | None,
    message: str,
) -> None:
    with pytest.raises(InvalidParameter, match=message) as raised:
        plan_query_noise(mechanism, epsilon, delta, components, selection_groups)
    assert raised.value.sqlstate == "22023"
    if selection_groups is not None or mechanism == GAUSSIAN:
        assert "defaults.delta in the policy" in str(raised.value)


def test_laplace_with_public_keys_needs_no_delta() -> None:
    noise = plan_query_noise(LAPLACE, 0.5, 0.0, [(1, 3), (10, 3)], None)
    assert noise.cost == Cost(noise.cost.epsilon, 0.0) and noise.cost.epsilon <= 0.5


selector_requests = st.lists(
    st.one_of(
        st.builds(
            QuantileRequest,
            st.sampled_from([0, 1, Fraction(1, 2), Fraction(1, 10), Fraction(3, 4)]),
            st.integers(min_value=1, max_value=500),
            st.integers(min_value=1, max_value=5),
            st.integers(min_value=1, max_value=4),
        ),
        st.builds(
            ModeRequest,
            st.integers(min_value=1, max_value=50),
            st.integers(min_value=1, max_value=5),
            st.integers(min_value=1, max_value=4),
        ),
    ),
    max_size=3,
)


def selector_map(spec: QuantileSpec | ModeSpec) -> float:
    """The selector's cost from an OpenDP measurement built here, independently of the module."""
    measure = dp.max_divergence() if spec.accounting == Accounting.PURE else dp.zero_concentrated_divergence()
    metric = dp.linf_distance(T="i64", monotonic=isinstance(spec, ModeSpec))
    per_group = dp.m.make_noisy_max(I64_VECTORS, metric, measure, scale=spec.scale).map(spec.sensitivity)
    return spec.max_groups * per_group  # a unit changes at most g groups' draws


def request_matches(request: SelectorRequest, spec: QuantileSpec | ModeSpec) -> bool:
    if isinstance(request, QuantileRequest):
        return isinstance(spec, QuantileSpec) and (
            spec.alpha,
            spec.candidates,
            spec.max_contributions,
            spec.max_groups,
        ) == (request.alpha, request.candidates, request.max_contributions, request.max_groups)
    return isinstance(spec, ModeSpec) and (spec.candidates, spec.max_contributions, spec.max_groups) == (
        request.candidates,
        request.max_contributions,
        request.max_groups,
    )


@settings(max_examples=40, deadline=None)
@given(
    mechanism=st.sampled_from([LAPLACE, GAUSSIAN]),
    epsilon=st.floats(min_value=0.01, max_value=10.0),
    delta=st.floats(min_value=1e-12, max_value=1e-3),
    components=components_strategy,
    selection_groups=st.none() | st.integers(min_value=1, max_value=20),
    selectors=selector_requests,
)
def test_pure_plans_with_selectors_charge_their_maps_and_never_overspend(
    mechanism: Mechanism,
    epsilon: float,
    delta: float,
    components: list[tuple[int, int]],
    selection_groups: int | None,
    selectors: list[SelectorRequest],
) -> None:
    noise = plan_query_noise(mechanism, epsilon, delta, components, selection_groups, selectors=selectors)
    assert noise.accounting == Accounting.PURE and noise.cost.rho == 0.0
    assert noise.cost.epsilon <= epsilon and noise.cost.delta <= delta
    assert noise.approx_dp == Cost(noise.cost.epsilon, noise.cost.delta)
    assert len(noise.selectors) == len(selectors)
    assert all(request_matches(r, s) for r, s in zip(selectors, noise.selectors, strict=True))
    share = epsilon / max(1, len(components) + len(selectors) + (selection_groups is not None))
    for spec in noise.selectors:
        assert spec.accounting == Accounting.PURE and spec.rho == 0.0
        assert spec.epsilon == pytest.approx(selector_map(spec), rel=1e-12)
        assert spec.epsilon <= share * (1 + 1e-12)
    if components or selectors or selection_groups is not None:
        assert noise.cost.epsilon >= epsilon * (1 - 1e-6)
    if mechanism == LAPLACE:
        maps = [c.epsilon for c in noise.columns] + [s.epsilon for s in noise.selectors]
        if noise.selection is not None:
            maps.append(noise.selection.epsilon)
        assert noise.cost.epsilon == pytest.approx(math.fsum(maps), rel=1e-12)


@settings(max_examples=50, deadline=None)
@given(
    epsilon=st.floats(min_value=0.01, max_value=10.0),
    delta=st.floats(min_value=1e-12, max_value=1e-3),
    components=components_strategy,
    selection_groups=st.none() | st.integers(min_value=1, max_value=20),
    selectors=selector_requests,
    mechanism=st.sampled_from([LAPLACE, GAUSSIAN]),
)
def test_zcdp_plans_never_exceed_the_request_once_converted(
    epsilon: float,
    delta: float,
    components: list[tuple[int, int]],
    selection_groups: int | None,
    selectors: list[SelectorRequest],
    mechanism: Mechanism,
) -> None:
    noise = plan_query_noise(
        mechanism, epsilon, delta, components, selection_groups, accounting="zcdp", selectors=selectors
    )
    assert noise.accounting == Accounting.ZCDP
    if not (components or selectors or selection_groups is not None):
        assert noise.cost == Cost.ZERO
        return
    cost = noise.cost
    # What the ledger composes: ρ and the selection's δ, each the sum of OpenDP maps.
    maps = []
    for column in noise.columns:
        assert column.mechanism == GAUSSIAN  # zCDP accounting noises every component with the Gaussian
        measurement = dp.m.make_gaussian(I64_VECTORS, dp.l2_distance(T="f64"), scale=column.scale)
        maps.append(measurement.map(column.d_in))
    for spec in noise.selectors:
        assert spec.accounting == Accounting.ZCDP and spec.epsilon == 0.0
        assert spec.rho == pytest.approx(selector_map(spec), rel=1e-12)
        maps.append(spec.rho)
    native_delta = 0.0
    if selection_groups is not None:
        selection = noise.selection
        assert selection is not None and selection.mechanism == GAUSSIAN
        rho, native_delta = selection.rho, selection.delta
        threshold = gaussian_threshold_measurement(selection.scale, selection.threshold)
        assert threshold.map((selection_groups, selection_groups, 1))[0] == rho
        assert native_delta <= delta / 2
        maps.append(rho)
    else:
        assert noise.selection is None
    assert cost.rho == pytest.approx(math.fsum(maps), rel=1e-12) and cost.rho >= math.fsum(maps) * (1 - 1e-15)
    # ρ is split evenly; selection's integer threshold leaves δ over, which the others share.
    others = maps[:-1] if selection_groups is not None else maps
    if others:
        assert max(others) == pytest.approx(min(others), rel=1e-9)
        assert maps[-1] <= min(others) * (1 + 1e-9)
    assert cost.delta == native_delta < delta
    # Converted at the request's δ, the query alone never exceeds the request, and uses it (but for
    # selection alone, which cannot use the δ its threshold leaves over: a few % of ε at most).
    assert cost.epsilon == converted_epsilon(cost, delta) <= epsilon
    assert cost.epsilon >= epsilon * (1 - 1e-6 if others else 0.9)
    assert noise.approx_dp == Cost(cost.epsilon, delta)


def test_zcdp_selectors_are_charged_the_bounded_range_rho_not_the_pure_conversion() -> None:
    median = QuantileRequest(Fraction(1, 2), 10, 1, 1)
    noise = plan_query_noise(GAUSSIAN, 1.0, 1e-6, [], None, accounting="zcdp", selectors=[median])
    spec = noise.selectors[0]
    pure_epsilon = 2 * spec.sensitivity / spec.scale  # the same noise, as a pure ε-DP mechanism
    assert spec.rho == pytest.approx(pure_epsilon**2 / 8, rel=1e-9)  # Cesar & Rogers 2021
    converted = dp.c.make_pureDP_to_zCDP(
        dp.m.make_noisy_max(I64_VECTORS, dp.linf_distance(T="i64"), dp.max_divergence(), scale=spec.scale)
    ).map(spec.sensitivity)
    assert converted == pytest.approx(4 * spec.rho, rel=1e-9)  # what the generic conversion would charge


@pytest.mark.parametrize(
    ("accounting", "delta", "components", "selectors", "message"),
    [
        ("zcdp", 0.0, [(1, 1)], [], "zCDP accounting needs delta > 0"),
        ("zcdp", 0.0, [], [QuantileRequest(Fraction(1, 2), 10, 1, 1)], "zCDP accounting needs delta > 0"),
        ("renyi", 1e-6, [(1, 1)], [], "unknown privacy accounting 'renyi'"),
        ("pure", 1e-6, [], ["median"], "unknown selection request"),
    ],
)
def test_impossible_accounting_requests_are_rejected(
    accounting: str, delta: float, components: list, selectors: list, message: str
) -> None:
    with pytest.raises(InvalidParameter, match=message) as raised:
        plan_query_noise(LAPLACE, 1.0, delta, components, None, accounting=accounting, selectors=selectors)
    assert raised.value.sqlstate == "22023"


def test_pure_laplace_plans_without_selectors_are_unchanged_by_the_new_keywords() -> None:
    before = plan_query_noise(LAPLACE, 0.8, 1e-7, [(2, 3), (1, 3)], 3)
    after = plan_query_noise(LAPLACE, 0.8, 1e-7, [(2, 3), (1, 3)], 3, accounting="pure", selectors=())
    assert after is before and before.selectors == () and before.cost.rho == 0.0
    assert [c.epsilon for c in before.columns] == pytest.approx([0.8 / 3] * 2)
