"""AVG's interval by test inversion (dpproxy.release.pivot): its two facts, checked exactly.

1. The tail bound is a bound: P(|X − rY| >= u) for the real discrete Laplace and discrete Gaussian
   noises (computed exactly from their probability mass functions, summed over Y) is never above
   RatioNoise.tail(u, r), whatever the scales, r and u.
2. The span holds every μ the test does not reject: for any noisy sum and count, every μ in the bounds
   with tail(|Ŝ − μN̂|, |μ|) > 5% lies within the ends span() returns, which lie within the bounds.
3. The same for VAR and STDDEV (SpreadNoise): the three noises' tail bound against draws, and the
   variance span against every variance some mean of the mean's span leaves unrejected.
4. The coupling the Gaussian bounds rest on: a discrete Gaussian lies within 1 of a normal variable.

Coverage over draws of the real noise, and the width, are tests/release/test_error_bars.py's.
"""

from __future__ import annotations

import math
import random
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import erfc

from dpproxy.privacy import ERROR_ALPHA
from dpproxy.release import ExactGroups, release_aggregates
from dpproxy.release.pivot import RatioNoise, SpreadNoise, _laplace_sum_tail
from dpproxy.sql.query import ComponentKind
from tests.release.test_error_bars import SPREADS, plan_for


def laplace_at_least(scale: float, k: np.ndarray) -> np.ndarray:
    """P(X >= k) for the discrete Laplace (P(x) ∝ e^(−|x|/b)), integer k (array)."""
    p = math.exp(-1 / scale)
    return np.where(k >= 1, p ** np.maximum(k, 0) / (1 + p), 1 - p ** np.maximum(1 - k, 0) / (1 + p))


def gaussian_mass(sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """The support (far enough that the rest is below 1e-15) and masses of the discrete Gaussian."""
    reach = int(sigma * 9) + 10
    support = np.arange(-reach, reach + 1)
    weights = np.exp(-(support.astype(float) ** 2) / (2 * sigma * sigma))
    return support, weights / weights.sum()


def exact_tail(gaussian: bool, sum_scale: float, count_scale: float, r: float, u: float) -> float:
    """P(|X − rY| >= u), X and Y independent discrete noises of these scales."""
    if gaussian:
        xs, px = gaussian_mass(sum_scale)
        ys, py = gaussian_mass(count_scale)
        x = xs[:, None].astype(float)
        shifted = np.abs(x - r * ys[None, :].astype(float)) >= u
        return float((px[:, None] * py[None, :] * shifted).sum())
    reach = int(count_scale * 40) + 10  # P(|Y| > reach) < e^(−40)
    ys = np.arange(-reach, reach + 1)
    p = math.exp(-1 / count_scale)
    py = (1 - p) / (1 + p) * p ** np.abs(ys)
    shift = r * ys.astype(float)
    # X >= rY + u, or X <= rY − u (i.e. −X >= u − rY): integer thresholds by ceilings.
    above = laplace_at_least(sum_scale, np.ceil(shift + u).astype(np.int64))
    below = laplace_at_least(sum_scale, np.ceil(u - shift).astype(np.int64))
    return float((py * np.minimum(above + below, 1.0)).sum())


scales = st.floats(min_value=0.3, max_value=25.0)


@settings(max_examples=300, deadline=None)
@given(
    gaussian=st.booleans(),
    sum_scale=scales,
    count_scale=scales,
    r=st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=30.0)),
    quantile=st.floats(min_value=0.0, max_value=12.0),
)
def test_the_tail_bound_is_above_the_exact_tail(
    gaussian: bool, sum_scale: float, count_scale: float, r: float, quantile: float
) -> None:
    noise = RatioNoise(gaussian, sum_scale, count_scale, 1.0, 1.0)
    u = quantile * (sum_scale + r * count_scale)
    bound = float(noise.tail(np.array([u]), np.array([r]))[0])
    assert exact_tail(gaussian, sum_scale, count_scale, r, u) <= bound + 1e-12


@pytest.mark.parametrize("gaussian", [False, True])
def test_the_bound_is_close_at_the_95th_percentile(gaussian: bool) -> None:
    """Not a loose bound: where the two noises weigh alike, the half-width the bound gives at 95% is
    within 10% of the exact one, which interval arithmetic (each noise at 97.5%, added) overstates by
    more than half."""
    noise = RatioNoise(gaussian, 60.0, 12.0, 1.0, 1.0)
    grid = np.arange(100, 400, 0.5)  # the exact 95% points: 166.5 (Gaussian), 247.5 (Laplace)
    exact = grid[np.argmax(np.array([exact_tail(gaussian, 60.0, 12.0, 5.0, u) for u in grid]) <= ERROR_ALPHA)]
    bounded = grid[np.argmax(noise.tail(grid, np.full(grid.shape, 5.0)) <= ERROR_ALPHA)]
    assert exact <= bounded <= 1.1 * exact
    each = 2.2414 if gaussian else math.log(40)  # a noise's 97.5% point, in scales (normal: z 0.9875)
    union = 60.0 * each + 5.0 * 12.0 * each  # both at 97.5%: the old width
    assert union > 1.5 * exact


@pytest.mark.parametrize("sigma", np.geomspace(0.05, 3000.0, 80).tolist())
def test_a_discrete_gaussian_lies_within_one_of_a_normal(sigma: float) -> None:
    """The coupling the Gaussian bound rests on: for the discrete Gaussian X of parameter σ and the
    normal G of deviation σ, P(G >= n) <= P(X >= n) <= P(G >= n − 1) for every n >= 1, so the
    quantile coupling keeps |X − G| <= 1. Exact tails (summed masses) out to 12σ, against erfc."""
    reach = int(sigma * 30) + 40
    support = np.arange(0, reach + 1)
    weights = np.exp(-(support.astype(float) ** 2) / (2 * sigma * sigma))
    tails = np.cumsum(weights[::-1])[::-1] / (2 * weights.sum() - 1)  # P(X >= n), n >= 0
    n = support[1 : int(sigma * 12) + 3]
    at_least = tails[1 : int(sigma * 12) + 3]
    shown = at_least > 1e-280
    below = 0.5 * erfc(n / (sigma * math.sqrt(2)))
    above = 0.5 * erfc((n - 1) / (sigma * math.sqrt(2)))
    assert np.all(below[shown] <= at_least[shown] * (1 + 1e-12))
    assert np.all(at_least[shown] <= above[shown] * (1 + 1e-12))


@settings(max_examples=200, deadline=None)
@given(
    gaussian=st.booleans(),
    sum_scale=st.floats(min_value=1.0, max_value=1e5),
    count_scale=st.floats(min_value=0.5, max_value=1e3),
    count=st.integers(min_value=1, max_value=10**6),
    mean=st.floats(min_value=-1.5, max_value=1.5),
    noise_draw=st.floats(min_value=-5.0, max_value=5.0),
    half_width=st.integers(min_value=1, max_value=10**5),
)
def test_the_span_holds_every_mean_the_test_does_not_reject(
    gaussian: bool,
    sum_scale: float,
    count_scale: float,
    count: int,
    mean: float,
    noise_draw: float,
    half_width: int,
) -> None:
    noise = RatioNoise(gaussian, sum_scale, count_scale, 0.5, 0.5)
    low, high = -float(half_width), float(half_width)
    noisy_sum = np.array([round(mean * half_width * count + noise_draw * sum_scale)], dtype=float)
    counts = np.array([float(count)])
    e_sum, e_count = sum_scale * math.log(40) + 1, count_scale * math.log(40) + 1
    lo, hi = noise.span(noisy_sum, counts, (e_sum, e_count), low, high)
    assert low <= lo[0] <= hi[0] <= high
    mus = np.linspace(low, high, 20_001)
    kept = noise.tail(np.abs(noisy_sum[0] - mus * counts[0]), np.abs(mus)) > ERROR_ALPHA
    # …and the interval arithmetic's own test, which the span is intersected with by the release:
    # only μ that both keep need to be inside.
    kept &= np.abs(noisy_sum[0] - mus * counts[0]) <= e_sum + np.abs(mus) * e_count
    if kept.any():
        assert lo[0] <= mus[kept].min() and mus[kept].max() <= hi[0]


def test_the_sum_of_three_laplace_tails_matches_draws() -> None:
    """The partial fractions of three Laplace variables' characteristic function, with the scales
    raised to be apart, bound the tail of their sum: checked against a million draws at points from
    the median to the 99.9th percentile (the bound is above the empirical tail less its sampling slack,
    and within 5% of it: raising the scales costs little)."""
    rng = np.random.default_rng(7)
    for scales in ((10.0, 10.0, 10.0), (50.0, 3.0, 0.0), (8.0, 6.0, 4.0), (1.0, 30.0, 1.0)):
        draws = np.abs(sum(rng.laplace(0, s, 1_000_000) if s else 0 for s in scales))
        points = np.quantile(draws, [0.5, 0.9, 0.95, 0.99, 0.999])
        bound = _laplace_sum_tail(points, [np.full(points.shape, s) for s in scales])
        empirical = np.array([(draws >= p).mean() for p in points])
        slack = 6 * np.sqrt(empirical * (1 - empirical) / 1_000_000)
        assert np.all(bound >= empirical - slack), (scales, bound, empirical)
        assert np.all(bound <= 1.05 * empirical + slack), (scales, bound, empirical)


@settings(max_examples=120, deadline=None)
@given(
    gaussian=st.booleans(),
    count=st.integers(min_value=1, max_value=10**5),
    mean=st.floats(min_value=-1.0, max_value=1.0),
    spread=st.floats(min_value=0.0, max_value=1.0),
    draws=st.tuples(*(st.floats(min_value=-4.0, max_value=4.0) for _ in range(3))),
    scales=st.tuples(
        st.floats(min_value=1.0, max_value=1e6), st.floats(min_value=1.0, max_value=1e4), st.floats(0.5, 50.0)
    ),
)
def test_the_variance_span_holds_every_variance_the_test_does_not_reject(
    gaussian: bool,
    count: int,
    mean: float,
    spread: float,
    draws: tuple[float, float, float],
    scales: tuple[float, float, float],
) -> None:
    """For noisy Q̂, Ŝ, N̂, every population variance v in [0, ceiling] that some μ of the mean's span
    leaves unrejected (|Q̂ − 2μŜ + (μ² − v)N̂| within the three noises' bound at that μ and v) lies
    within the span returned."""
    half = 1000.0
    q_scale, s_scale, n_scale = scales
    noise = SpreadNoise(
        RatioNoise(gaussian, s_scale, n_scale, 1.0, 1.0), q_scale, 1.0, (4 * s_scale, 4 * n_scale), 0.0
    )
    mu, var = mean * half, spread * (half * half - (mean * half) ** 2)
    squares = np.array([count * (var + mu * mu) + draws[0] * q_scale])
    sums = np.array([count * mu + draws[1] * s_scale])
    counts = np.array([max(1.0, round(count + draws[2] * n_scale))])
    alpha = 0.035
    lo, hi = noise.variance_span(squares, sums, counts, (-half, half), half * half, alpha)
    assert 0 <= lo[0] <= hi[0] <= half * half
    m_lo, m_hi = noise.mean.span(sums, counts, (4 * s_scale, 4 * n_scale), -half, half, alpha=0.015)
    mus = np.linspace(m_lo[0], m_hi[0], 201)[:, None]
    vs = np.linspace(0.0, half * half, 4001)[None, :]
    statistic = np.abs(squares[0] - 2 * mus * sums[0] + (mus * mus - vs) * counts[0])
    kept = noise.tail(statistic, np.abs(mus) + 0 * vs, np.abs(mus * mus - vs)) > alpha
    kept_v = vs[0][kept.any(axis=0)]
    if kept_v.size:
        assert lo[0] <= kept_v.min() and kept_v.max() <= hi[0]


def test_spreads_are_released_from_components_beyond_the_floats() -> None:
    """Noisy components as large as Python ints get (10^400: beyond float64) or as odd as negative
    counts: VAR and STDDEV are released with a ± no wider than the bounds allow, and no floating-point
    warning escapes the tests (what overflows rules nothing out)."""
    plan = plan_for(SPREADS)
    rng = random.Random(1)
    rows = [
        [
            count
            if c.kind in (ComponentKind.ROWS, ComponentKind.VALUES)
            else rng.randint(0 if c.kind is ComponentKind.CENTRED_SQUARES else -size, size)
            for c in plan.query.components
        ]
        for count in (-5, 0, 1, 2, 3, 10**6, 10**15, 10**30)
        for size in (0, 1, 10**6, 10**18, 10**40, 10**400)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        released = release_aggregates(
            plan.query, ExactGroups([(g,) for g in range(len(rows))], rows, [1] * len(rows)), plan.noise
        )
    # y in [0, 100]: a variance at most 50² (the sample's twice that), a standard deviation at most 50.
    assert released.errors[1:] == [2500.0, 5000.0, 50.0, pytest.approx(5000**0.5)]
