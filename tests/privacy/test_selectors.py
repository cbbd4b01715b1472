"""Selections by report-noisy-max (quantiles, MIN/MAX, MODE): their scores have the
sensitivity they declare, their costs are OpenDP's maps, neighbouring inputs are as
indistinguishable as the charged ε says (exactly, from the distributions, and empirically, from
OpenDP's draws), and their answers are as accurate as the error bounds shown to analysts promise.

Statistical checks use 5 or more standard errors (a false alarm is rarer than one in a million).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import opendp.prelude as dp
import pytest
from numpy.polynomial import polynomial

from dpproxy.errors import InvalidParameter
from dpproxy.privacy import (
    Accounting,
    ModeSpec,
    QuantileSpec,
    mode_mechanism,
    quantile_mechanism,
)
from tests.privacy.distributions import I64_VECTORS, SIGMAS, assert_privacy_loss_within

dp.enable_features("contrib")


def permute_and_flip(scores: list[int], scale: float) -> np.ndarray:
    """P(j) of report-noisy-max with exponential noise, which is permute-and-flip (McKenna & Sheldon
    2020; Ding et al. 2021): j is kept, when reached, with p_j = exp((q_j − q*)/scale); with uniform
    arrival times, P(j) = p_j ∫₀¹ Π_{i≠j}(1 − p_i·t) dt."""
    q = np.array(scores, dtype=float)
    p = np.exp((q - q.max()) / scale)
    out = []
    for j in range(len(q)):
        poly = np.array([1.0])
        for i in range(len(q)):
            if i != j:
                poly = polynomial.polymul(poly, [1.0, -p[i]])
        out.append(p[j] * polynomial.polyval(1.0, polynomial.polyint(poly)))
    return np.array(out)


def softmax(scores: list[int], scale: float) -> np.ndarray:
    """P(j) of report-noisy-max with Gumbel noise: the exponential mechanism."""
    return np.exp(log_softmax(scores, scale))


def log_softmax(scores: list[int], scale: float) -> np.ndarray:
    q = np.array(scores, dtype=float) / scale
    top = q.max()
    return q - top - math.log(np.exp(q - top).sum())


def exact_distribution(spec: QuantileSpec | ModeSpec, scores: list[int]) -> np.ndarray:
    if spec.accounting == Accounting.PURE:
        return permute_and_flip(scores, spec.scale)
    return softmax(scores, spec.scale)


def neighbours(histogram: list[int], r: int) -> list[list[int]]:
    """Every histogram with one more unit's r values (removal is the same pair the other way)."""
    result = []
    for bins in itertools.combinations_with_replacement(range(len(histogram)), r):
        added = list(histogram)
        for b in bins:
            added[b] += 1
        result.append(added)
    return result


def renyi(log_p: np.ndarray, log_q: np.ndarray, order: float) -> float:
    """D_order(P || Q), in log space: tiny probabilities must not overflow p**order."""
    terms = order * log_p + (1 - order) * log_q
    top = terms.max()
    return float((top + math.log(np.exp(terms - top).sum())) / (order - 1))


def draw_frequencies(select, argument, draws: int) -> Counter:
    return Counter(select(argument) for _ in range(draws))


@pytest.mark.parametrize(
    ("alpha", "r"),
    [
        (Fraction(1, 2), 1),
        (Fraction(1, 2), 3),
        (Fraction(1, 4), 2),
        (Fraction(9, 10), 1),
        (0, 1),
        (0, 2),
        (1, 2),
    ],
)
def test_quantile_scores_move_by_at_most_the_declared_sensitivity_and_by_that_much(
    alpha: Fraction, r: int
) -> None:
    spec = quantile_mechanism(alpha, 6, r, 1, 1.0)
    if alpha in (0, 1):
        assert spec.sensitivity == 2 * r  # half ranks: the target moves by r, 2·rank by up to 2r
    else:
        assert spec.sensitivity == r * max(alpha.numerator, alpha.denominator - alpha.numerator)
    rng = np.random.default_rng(7)
    largest = 0
    for _ in range(150):
        # Small groups and groups beyond 2t, where MIN/MAX aim at rank t rather than the median.
        high = 3 * max(spec.extreme_rank, 2)
        histogram = [int(c) for c in rng.integers(0, high, 6)]
        base = spec.scores(histogram)
        assert max(base) == 0 and min(base) <= 0  # some bin always holds the target rank
        for added in neighbours(histogram, r):
            change = max(abs(a - b) for a, b in zip(base, spec.scores(added), strict=True))
            largest = max(largest, change)
    assert largest <= spec.sensitivity
    assert largest == spec.sensitivity  # the declared sensitivity is exact, not padded


@pytest.mark.parametrize("accounting", [Accounting.PURE, Accounting.ZCDP])
@pytest.mark.parametrize(
    ("alpha", "r", "groups"), [(Fraction(1, 2), 1, 1), (0, 2, 3), (1, 1, 2), (0.3, 2, 1)]
)
def test_quantile_costs_are_opendp_maps_over_the_groups_a_unit_changes(
    accounting: Accounting, alpha: float, r: int, groups: int
) -> None:
    budget = 0.9
    if accounting == Accounting.PURE:
        spec = quantile_mechanism(alpha, 20, r, groups, budget)
        measure, total = dp.max_divergence(), spec.epsilon
        assert spec.rho == 0
    else:
        spec = quantile_mechanism(alpha, 20, r, groups, rho=budget)
        measure, total = dp.zero_concentrated_divergence(), spec.rho
        assert spec.epsilon == 0
    per_group = dp.m.make_noisy_max(I64_VECTORS, dp.linf_distance(T="i64"), measure, scale=spec.scale).map(
        spec.sensitivity
    )
    assert total == pytest.approx(groups * per_group, rel=1e-12)
    assert total <= budget
    assert total >= budget * (1 - 1e-9)  # the share asked for is the share used
    # Textbook: ε_group = 2Δ/scale (McSherry & Talwar); ρ_group = ε_group²/8 (Cesar & Rogers 2021).
    epsilon_group = 2 * spec.sensitivity / spec.scale
    expected = epsilon_group if accounting == Accounting.PURE else epsilon_group**2 / 8
    assert per_group == pytest.approx(expected, rel=1e-9)


def test_quantile_alpha_is_read_as_the_fraction_meant() -> None:
    assert quantile_mechanism(0.1, 10, 1, 1, 1.0).alpha == Fraction(1, 10)
    assert quantile_mechanism(0.95, 10, 1, 1, 1.0).alpha == Fraction(19, 20)
    assert quantile_mechanism(Fraction(1, 3), 10, 1, 1, 1.0).alpha == Fraction(1, 3)
    assert quantile_mechanism(0.5, 10, 1, 1, 1.0) is quantile_mechanism(Fraction(1, 2), 10, 1, 1, 1.0)


@pytest.mark.parametrize(
    ("arguments", "keywords", "message"),
    [
        ((1.5, 10, 1, 1, 1.0), {}, "between 0 and 1"),
        ((-0.1, 10, 1, 1, 1.0), {}, "between 0 and 1"),
        ((math.nan, 10, 1, 1, 1.0), {}, "between 0 and 1"),
        ((0.5, 0, 1, 1, 1.0), {}, "quantile candidates must be an integer >= 1"),
        ((0.5, 10, 0, 1, 1.0), {}, "sensitivity of a released value"),
        ((0.5, 10, 1, 1, 0.0), {}, "epsilon must be a finite number > 0"),
        ((0.5, 10, 1, 1), {}, "exactly one of epsilon"),
        ((0.5, 10, 1, 1, 1.0), {"rho": 0.1}, "exactly one of epsilon"),
    ],
)
def test_impossible_quantiles_are_refused(arguments: tuple, keywords: dict, message: str) -> None:
    with pytest.raises(InvalidParameter, match=message):
        quantile_mechanism(*arguments, **keywords)


def test_histograms_of_the_wrong_shape_are_refused_without_showing_counts() -> None:
    spec = quantile_mechanism(0.5, 4, 1, 1, 1.0)
    with pytest.raises(ValueError, match="4 candidates"):
        spec.select([1, 2, 3])
    with pytest.raises(ValueError) as raised:
        spec.select([5, -31337, 0, 1])
    assert "31337" not in str(raised.value)
    with pytest.raises(ValueError) as raised:
        mode_mechanism(3, 1, 1, 1.0).select([0, -4242, 1])
    assert "4242" not in str(raised.value)


@pytest.mark.parametrize("accounting", [Accounting.PURE, Accounting.ZCDP])
@pytest.mark.parametrize(("alpha", "r"), [(Fraction(1, 2), 1), (Fraction(1, 4), 2), (0, 1), (1, 2)])
def test_quantile_output_distributions_of_neighbours_are_within_the_charged_cost(
    accounting: Accounting, alpha: Fraction, r: int
) -> None:
    # Exact distributions of the noisy max OpenDP runs (checked against its draws below), over every
    # neighbour of many small histograms.
    if accounting == Accounting.PURE:
        spec = quantile_mechanism(alpha, 5, r, 1, 1.5)
    else:
        spec = quantile_mechanism(alpha, 5, r, 1, rho=0.3)
    rng = np.random.default_rng(11)
    worst = 0.0
    for _ in range(40):
        histogram = [int(c) for c in rng.integers(0, 2 * max(spec.extreme_rank, 1) + 2, 5)]
        scores = spec.scores(histogram)
        for added in neighbours(histogram, r):
            if accounting == Accounting.PURE:
                p = exact_distribution(spec, scores)
                q = exact_distribution(spec, spec.scores(added))
                worst = max(worst, float(np.max(np.abs(np.log(p / q)))))
            else:
                # ρ-zCDP: D_α(P || Q) <= ρ·α for every order α > 1, both ways.
                log_p = log_softmax(scores, spec.scale)
                log_q = log_softmax(spec.scores(added), spec.scale)
                for order in (1.5, 2.0, 4.0, 16.0, 64.0):
                    worst = max(worst, renyi(log_p, log_q, order) / order, renyi(log_q, log_p, order) / order)
    charged = spec.epsilon if accounting == Accounting.PURE else spec.rho
    assert worst <= charged * (1 + 1e-9)
    # Sharp enough that noise at half the scale (a sensitivity taken half too small) would fail above:
    # the pure loss would double, the Rényi divergence quadruple.
    assert worst > (0.5 if accounting == Accounting.PURE else 0.25) * charged


@pytest.mark.parametrize("accounting", [Accounting.PURE, Accounting.ZCDP])
def test_quantile_draws_between_neighbours_show_a_privacy_loss_within_epsilon(accounting: Accounting) -> None:
    # The median over 5 candidates; the neighbour adds one value to bin 3. Exactly, the loss is 0.83·ε
    # on candidate 4 (the search over neighbours above found it among the largest).
    if accounting == Accounting.PURE:
        spec = quantile_mechanism(0.5, 5, 1, 1, 1.0)
        epsilon = spec.epsilon
    else:
        spec = quantile_mechanism(0.5, 5, 1, 1, rho=1 / 8)
        epsilon = 2 * spec.sensitivity / spec.scale  # the exponential mechanism's pure ε: √(8ρ) = 1
    assert epsilon == pytest.approx(1.0)
    without_unit, with_unit = [1, 0, 0, 0, 0], [1, 0, 0, 1, 0]
    draws = 10_000
    counts = [draw_frequencies(spec.select, h, draws) for h in (without_unit, with_unit)]
    for histogram, observed in zip((without_unit, with_unit), counts, strict=True):
        expected = exact_distribution(spec, spec.scores(histogram))
        for j, p in enumerate(expected):  # OpenDP draws from the distribution the exact tests assume
            assert abs(observed[j] / draws - p) <= SIGMAS * math.sqrt(p * (1 - p) / draws)
    sharpest = assert_privacy_loss_within(counts[0], counts[1], epsilon)
    assert sharpest >= 0.5 * epsilon


def histogram_of(values: np.ndarray, candidates: int) -> list[int]:
    return [int(c) for c in np.bincount(values, minlength=candidates)]


def covered_ranks(histogram: list[int], j: int) -> tuple[int, int]:
    below = sum(histogram[:j])
    return below, below + histogram[j]


@pytest.mark.parametrize("accounting", [Accounting.PURE, Accounting.ZCDP])
@pytest.mark.parametrize("alpha", [Fraction(1, 2), Fraction(1, 10), Fraction(3, 4)])
def test_released_quantiles_are_within_their_rank_error_bound(
    accounting: Accounting, alpha: Fraction
) -> None:
    candidates = 200
    rng = np.random.default_rng(3)
    values = np.clip(rng.normal(80, 30, 3_000).round().astype(int), 0, candidates - 1)
    histogram = histogram_of(values, candidates)
    n = len(values)
    if accounting == Accounting.PURE:
        spec = quantile_mechanism(alpha, candidates, 1, 1, 0.05)
    else:
        spec = quantile_mechanism(alpha, candidates, 1, 1, rho=0.05**2 / 8)
    bound = spec.rank_error95()
    assert 0 < bound < n / 10  # a useful bound at this ε
    draws = 300
    misses = 0
    chosen = set()
    for _ in range(draws):
        j = spec.select(histogram)
        chosen.add(j)
        low, high = covered_ranks(histogram, j)
        misses += max(0.0, low - alpha * n, alpha * n - high) > bound
    # Promised: at most 5% misses. The union bound is loose, so even 5% observed would be alarming.
    assert misses <= 0.05 * draws
    assert len(chosen) >= 3  # noise was added: not always the same candidate
    assert spec.rank_error95(n=40) <= max(alpha, 1 - alpha) * 40  # a released n caps the bound


@pytest.mark.parametrize("accounting", [Accounting.PURE, Accounting.ZCDP])
def test_min_and_max_land_at_the_data_not_at_the_bounds(accounting: Accounting) -> None:
    # Ages 0..120 on a grid of 1; the group's ages lie in [30, 70]. A literal MIN (target rank 0) would
    # be uniform over [0, 30]; ours lands at the data's low end with at most rank_error95 values below.
    candidates = 121
    rng = np.random.default_rng(5)
    values = rng.integers(30, 71, 2_000)
    histogram = histogram_of(values, candidates)
    ordered = np.sort(values)
    for alpha in (0, 1):
        if accounting == Accounting.PURE:
            spec = quantile_mechanism(alpha, candidates, 1, 1, 0.5)
        else:
            spec = quantile_mechanism(alpha, candidates, 1, 1, rho=0.5**2 / 8)
        t = spec.extreme_rank
        assert 1 <= t < 100
        bound = spec.rank_error95()
        assert bound <= 2 * t
        outside = beyond_bound = 0
        draws = 200
        for _ in range(draws):
            j = spec.select(histogram)
            low, high = covered_ranks(histogram, j)
            if alpha == 0:
                outside += j < 30  # an empty stretch below the minimum
                beyond_bound += low > bound  # more values below the released MIN than promised
            else:
                outside += j > 70
                beyond_bound += len(values) - high > bound
        assert outside <= 0.05 * draws and beyond_bound <= 0.05 * draws
        # Exactly: the chance of an empty stretch is far below the 5% designed for.
        scores = spec.scores(histogram)
        p = exact_distribution(spec, scores)
        empty = p[:30].sum() if alpha == 0 else p[71:].sum()
        assert empty <= ERROR_SHARE
        # The answer aims at rank t from the extreme: the t-th smallest (largest) value's grid point.
        target_value = ordered[t - 1] if alpha == 0 else ordered[-t]
        assert scores[int(target_value)] == 0


ERROR_SHARE = 0.05


def test_min_of_a_small_group_aims_at_its_middle() -> None:
    # Fewer than 2t values: rank t would be beyond the data, so the target is n/2.
    spec = quantile_mechanism(0, 50, 1, 1, 0.5)
    histogram = [0] * 50
    histogram[20] = 3
    histogram[40] = 3  # n = 6 < 2t
    assert spec.extreme_rank > 3
    scores = spec.scores(histogram)
    assert [j for j, s in enumerate(scores) if s == 0] == list(range(20, 41))  # all medians of the 6
    assert scores[10] == scores[45] == -6  # 3 ranks from the middle, in half ranks


def test_an_empty_group_is_answered_at_random_not_refused() -> None:
    spec = quantile_mechanism(0.5, 8, 1, 1, 1.0)
    assert set(spec.scores([0] * 8)) == {0}
    assert 0 <= spec.select([0] * 8) < 8
    assert quantile_mechanism(0.5, 1, 1, 1, 1.0).select([7]) == 0


@pytest.mark.parametrize("accounting", [Accounting.PURE, Accounting.ZCDP])
def test_mode_costs_are_monotonic_maps_and_it_finds_a_clear_mode(accounting: Accounting) -> None:
    budget = 0.6 if accounting == Accounting.PURE else 0.06
    if accounting == Accounting.PURE:
        spec = mode_mechanism(6, 2, 3, budget)
        total, measure = spec.epsilon, dp.max_divergence()
    else:
        spec = mode_mechanism(6, 2, 3, rho=budget)
        total, measure = spec.rho, dp.zero_concentrated_divergence()
    assert spec.sensitivity == 2
    metric = dp.linf_distance(T="i64", monotonic=True)
    per_group = dp.m.make_noisy_max(I64_VECTORS, metric, measure, scale=spec.scale).map(2)
    assert total == pytest.approx(3 * per_group, rel=1e-12) and total <= budget
    # Within count_error95 of the top count at least 95% of the time...
    gap = spec.count_error95()
    counts = [10, 60, 3, 0, 58, 59]
    near = sum(counts[spec.select(counts)] >= 60 - gap for _ in range(200))
    assert near >= 0.95 * 200
    # ...and always the mode when it stands out by many noise scales (a miss has chance < 1e-12).
    far = math.ceil(spec.scale * math.log(5 / 1e-12))
    counts = [10, 10 + far, 3, 0, 10, 9]
    assert all(spec.select(counts) == 1 for _ in range(100))


def test_mode_draws_between_neighbours_show_a_privacy_loss_within_epsilon() -> None:
    spec = mode_mechanism(4, 1, 1, 1.0)
    # Monotonic: ε = Δ/scale, so the scale is half the general one's; a neighbour adds one unit's value.
    assert spec.scale == pytest.approx(1.0)
    without_unit, with_unit = [3, 3, 2, 3], [3, 4, 2, 3]
    draws = 10_000
    counts = [draw_frequencies(spec.select, h, draws) for h in (without_unit, with_unit)]
    for histogram, observed in zip((without_unit, with_unit), counts, strict=True):
        expected = permute_and_flip(histogram, spec.scale)
        for j, p in enumerate(expected):
            assert abs(observed[j] / draws - p) <= SIGMAS * math.sqrt(p * (1 - p) / draws)
    assert_privacy_loss_within(counts[0], counts[1], spec.epsilon)


def test_selector_specs_are_the_types_the_engine_dispatches_on() -> None:
    assert isinstance(quantile_mechanism(0.5, 3, 1, 1, 1.0), QuantileSpec)
    assert isinstance(mode_mechanism(3, 1, 1, 1.0), ModeSpec)
