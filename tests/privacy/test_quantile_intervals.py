"""The ends of a quantile's interval (dp_interval_low/high of MEDIAN and percentiles): each end is a
report-noisy-max pick over the group's histogram with its target moved by s ranks and its edge bin
scored at least −y ranks (dpproxy.privacy.selectors.interval_shift). Checked exactly, from each
pick's distribution: in groups of every size the probability that an end lies on the wrong side of
the true quantile (PERCENTILE_CONT's and PERCENTILE_DISC's) is at most 2.5%, so both ends hold it
with probability >= 95%; without the shift the same check fails (it has the power to); the ends'
scores keep the quantile's sensitivity; a pair of ends costs one share of the query's budget."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dpproxy.privacy import Accounting, QuantileRequest, QuantileSpec, plan_query_noise
from dpproxy.privacy.selectors import selector_for
from tests.privacy.test_selectors import exact_distribution, neighbours

K = 12  # candidates: bin j holds the value j (the grid's points), so c_j = j


def true_quantiles(histogram: list[int], alpha: Fraction) -> tuple[float, float]:
    """(PERCENTILE_CONT, PERCENTILE_DISC) of the values the histogram holds, as PostgreSQL defines them."""
    values = [j for j, count in enumerate(histogram) for _ in range(count)]
    n = len(values)
    position = alpha * (n - 1)
    below = math.floor(position)
    above = min(below + 1, n - 1)
    cont = values[below] + float(position - below) * (values[above] - values[below])
    disc = values[max(math.ceil(alpha * n) - 1, 0)]
    return cont, float(disc)


def wrong_side(spec: QuantileSpec, histogram: list[int], alpha: Fraction) -> float:
    """The probability that the end `spec` picks lies strictly inside the true quantiles' side:
    the low end's c_j above the smaller of the two, the high end's c_{j+1} below the larger."""
    p = exact_distribution(spec, spec.scores(histogram))
    cont, disc = true_quantiles(histogram, alpha)
    if spec.shift < 0:
        return float(sum(p[j] for j in range(K) if j > min(cont, disc)))
    return float(sum(p[j] for j in range(K) if min(j + 1, K - 1) < max(cont, disc)))


def histograms(rng: np.random.Generator) -> list[list[int]]:
    """Groups of 1 to a few hundred values: spread, in one bin, at the edges, in two distant bins."""
    found: list[list[int]] = []
    for n in (1, 2, 3, 5, 8, 20, 60, 200, 600):
        found.append([int(c) for c in rng.multinomial(n, [1 / K] * K)])
        found.append([n if j == K // 2 else 0 for j in range(K)])
        found.append([n if j == K - 1 else 0 for j in range(K)])
        found.append([n if j == 0 else 0 for j in range(K)])
        found.append([n // 2 if j == 1 else (n - n // 2 if j == K - 2 else 0) for j in range(K)])
    return found


def end_spec(alpha: Fraction, end: int, accounting: Accounting, budget: float, r: int = 1) -> QuantileSpec:
    spec = selector_for(QuantileRequest(alpha, K, r, 1, end=end), accounting, budget)
    assert isinstance(spec, QuantileSpec) and spec.shift == end * abs(spec.shift) != 0
    return spec


@pytest.mark.parametrize("accounting", [Accounting.PURE, Accounting.ZCDP])
@pytest.mark.parametrize("alpha", [Fraction(1, 2), Fraction(1, 10), Fraction(9, 10)])
@pytest.mark.parametrize("budget", [0.02, 0.3, 3.0])
def test_each_end_is_on_the_wrong_side_with_probability_at_most_2_5_percent(
    accounting: Accounting, alpha: Fraction, budget: float
) -> None:
    rng = np.random.default_rng(11)
    for end in (-1, 1):
        spec = end_spec(alpha, end, accounting, budget if accounting == Accounting.PURE else budget**2 / 8)
        worst = max(wrong_side(spec, h, alpha) for h in histograms(rng))
        assert worst <= 0.025 + 1e-12, f"end {end}: {worst:.4f}"


@pytest.mark.parametrize("accounting", [Accounting.PURE, Accounting.ZCDP])
def test_the_check_has_power_the_unshifted_pick_fails_it(accounting: Accounting) -> None:
    """The quantile's own pick (target α·n, no edge floor) read as an end is on the wrong side often."""
    budget = 0.3 if accounting == Accounting.PURE else 0.3**2 / 8
    point = selector_for(QuantileRequest(Fraction(1, 2), K, 1, 1), accounting, budget)
    assert isinstance(point, QuantileSpec) and point.shift == 0
    low = QuantileSpec(**{**point.__dict__, "shift": 0})
    spread = [5] * K
    p = exact_distribution(low, low.scores(spread))
    cont, disc = true_quantiles(spread, Fraction(1, 2))
    assert sum(p[j] for j in range(K) if j > min(cont, disc)) > 0.3


@pytest.mark.parametrize("alpha", [Fraction(1, 2), Fraction(1, 4), Fraction(9, 10)])
@pytest.mark.parametrize("r", [1, 2])
def test_end_scores_move_by_at_most_the_quantiles_sensitivity(alpha: Fraction, r: int) -> None:
    rng = np.random.default_rng(5)
    for end in (-1, 1):
        spec = end_spec(alpha, end, Accounting.PURE, 0.5, r)
        assert spec.sensitivity == r * max(alpha.numerator, alpha.denominator - alpha.numerator)
        for _ in range(60):
            histogram = [int(c) for c in rng.integers(0, 4, K)]
            base = spec.scores(histogram)
            for added in neighbours(histogram, r):
                change = max(abs(a - b) for a, b in zip(base, spec.scores(added), strict=True))
                assert change <= spec.sensitivity


def test_an_interval_costs_one_share_and_leaves_the_quantiles_pick_as_it_was() -> None:
    median = QuantileRequest(Fraction(1, 2), K, 1, 1)
    ends = (QuantileRequest(Fraction(1, 2), K, 1, 1, end=-1), QuantileRequest(Fraction(1, 2), K, 1, 1, end=1))
    alone = plan_query_noise("laplace", 1.0, 0.0, [(1, 1)], None, selectors=[median, median])
    with_interval = plan_query_noise("laplace", 1.0, 0.0, [(1, 1)], None, selectors=[median, *ends])
    # Three shares either way: a second median, or the pair of ends at half a share each.
    assert with_interval.selectors[0] == alone.selectors[0]
    assert with_interval.columns == alone.columns
    assert with_interval.cost.epsilon <= 1.0
    low, high = with_interval.selectors[1:]
    assert isinstance(low, QuantileSpec) and isinstance(high, QuantileSpec)
    assert low.epsilon == pytest.approx(alone.selectors[1].epsilon / 2, rel=1e-9)
    assert (low.shift, high.shift) == (-abs(low.shift), abs(low.shift))
    with pytest.raises(Exception, match="MIN and MAX have no interval"):
        selector_for(QuantileRequest(Fraction(0), K, 1, 1, end=-1), Accounting.PURE, 1.0)
