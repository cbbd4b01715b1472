"""AVG's interval by test inversion (dpproxy.release.pivot): its two facts, checked exactly.

1. The tail bound is a bound: P(|X − rY| >= u) for the real discrete Laplace and discrete Gaussian
   noises (computed exactly from their probability mass functions, summed over Y) is never above
   RatioNoise.tail(u, r), whatever the scales, r and u.
2. The span holds every μ the test does not reject: for any noisy sum and count, every μ in the bounds
   with tail(|Ŝ − μN̂|, |μ|) > 5% lies within the ends span() returns, which lie within the bounds.

Coverage over draws of the real noise, and the width, are tests/release/test_error_bars.py's.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dpproxy.privacy import ERROR_ALPHA
from dpproxy.release.pivot import RatioNoise


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
    noise = RatioNoise(gaussian, sum_scale, count_scale, 0.0 if gaussian else 1.0, 0.0 if gaussian else 1.0)
    u = quantile * (sum_scale + r * count_scale)
    bound = float(noise.tail(np.array([u]), np.array([r]))[0])
    assert exact_tail(gaussian, sum_scale, count_scale, r, u) <= bound + 1e-12


def test_the_laplace_bound_is_close_at_the_95th_percentile() -> None:
    """Not a loose bound: where the two noises weigh alike, the half-width the bound gives at 95% is
    within 10% of the exact one, which interval arithmetic (each noise at 97.5%, added) overstates by
    more than half."""
    noise = RatioNoise(False, 20.0, 4.0, 1.0, 1.0)
    grid = np.arange(0, 400, 0.25)
    exact = grid[np.argmax(np.array([exact_tail(False, 20.0, 4.0, 5.0, u) for u in grid]) <= ERROR_ALPHA)]
    bounded = grid[np.argmax(noise.tail(grid, np.full(grid.shape, 5.0)) <= ERROR_ALPHA)]
    assert exact <= bounded <= 1.1 * exact
    union = 20.0 * math.log(40) + 5.0 * 4.0 * math.log(40)  # both at 97.5%: the old width
    assert union > 1.5 * exact


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
