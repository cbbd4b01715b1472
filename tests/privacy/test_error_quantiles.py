"""The ± of one noisy value is the exact integer quantile of its noise: the smallest integer w with
P(|Z| <= w) >= 1 − α, for the discrete Laplace and the discrete Gaussian, at every scale.

References are brute force: the discrete Gaussian's pmf summed term by term in float64 (math.fsum of
terms within an ulp, so within ~1e-15 of the truth; a case that close to α is skipped), and the
discrete Laplace's closed form P(|Z| > w) = 2q^(w+1)/(1 + q).
"""

from __future__ import annotations

import math
import time
from statistics import NormalDist

import numpy as np
import pytest

from dpproxy.policy import Mechanism
from dpproxy.privacy import NoiseSpec
from dpproxy.privacy.noise import _gaussian_error, _laplace_error

ALPHAS = [0.05, 0.025, 0.05 / 3, 0.0125]


def gaussian_tails(sigma: float) -> np.ndarray:
    """P(|Z| > w) for w = 0, 1, …, by summing the pmf (float64, terms below 1e-300 dropped)."""
    cut = int(40 * sigma) + 40
    k = np.arange(1, cut + 1, dtype=np.float64)
    terms = np.exp(-(k * k) / (2.0 * sigma * sigma))
    total = 1.0 + 2.0 * math.fsum(terms)
    suffix = np.array([math.fsum(terms[i:]) for i in range(len(terms))]) if cut < 2_000 else None
    if suffix is None:  # large σ: cumulative sums from the tail, then corrected against fsum
        suffix = np.cumsum(terms[::-1])[::-1]
    return 2.0 * suffix / total


def brute_gaussian(sigma: float, alpha: float) -> int | None:
    tails = gaussian_tails(sigma)
    w = int(np.argmax(tails <= alpha))
    if abs(tails[w] - alpha) < 1e-12 or (w > 0 and abs(tails[w - 1] - alpha) < 1e-12):
        return None  # too close to α for float64 to tell
    return w


def brute_laplace(scale: float, alpha: float) -> int | None:
    q = math.exp(-1.0 / scale)
    y = scale * math.log(2.0 / (alpha * (1.0 + q)))  # P(|Z| > w) <= α ⇔ w + 1 >= y
    if abs(y - round(y)) < 1e-9 * max(1.0, y):
        return None
    return max(0, math.ceil(y) - 1)


def test_gaussian_error_at_sigma_one_is_two() -> None:
    """±2 covers 99.1% at σ = 1 and ±1 only 88.3%: the exact 95% bound is 2 (the OpenDP helper's
    floor gave 3)."""
    tails = gaussian_tails(1.0)
    assert tails[1] > 0.05 > tails[2]
    assert tails[2] == pytest.approx(1 - 0.99087, abs=1e-5) and tails[1] == pytest.approx(
        1 - 0.88288, abs=1e-5
    )
    assert NoiseSpec(Mechanism.GAUSSIAN, 1, 1, 1.0, 1.0, 0.0, 0.5).error95() == 2.0
    assert _gaussian_error(0.3) == 0.0  # σ = 0.3: Z = 0 with probability 0.992


def test_gaussian_error_is_the_exact_quantile_at_small_and_medium_sigma() -> None:
    rng = np.random.default_rng(1)
    sigmas = [
        0.3,
        0.5,
        1.0,
        2.0,
        7.999,
        8.0,
        8.001,
        *rng.uniform(0.05, 12.0, 60),
        *rng.uniform(12.0, 300.0, 20),
    ]
    checked = 0
    for sigma in sigmas:
        for alpha in ALPHAS:
            expected = brute_gaussian(float(sigma), alpha)
            if expected is not None:
                assert _gaussian_error(float(sigma), alpha) == expected, (sigma, alpha)
                checked += 1
    assert checked >= 0.99 * len(sigmas) * len(ALPHAS)


@pytest.mark.parametrize("sigma", [1_234.5, 10_000.3, 123_456.7])
def test_gaussian_error_is_the_exact_quantile_at_large_sigma(sigma: float) -> None:
    for alpha in (0.05, 0.0125):
        expected = brute_gaussian(sigma, alpha)
        assert expected is not None and _gaussian_error(sigma, alpha) == expected


@pytest.mark.parametrize("sigma", [3.3e9, 1e12, 1e15, 1e100, 1e300])
def test_gaussian_error_at_huge_sigma_is_prompt_and_next_to_the_normal_quantile(sigma: float) -> None:
    start = time.perf_counter()
    w = _gaussian_error(sigma * (1 + 2**-40), 0.05)  # a σ no other test has cached
    assert time.perf_counter() - start < 5.0
    z = NormalDist().inv_cdf(0.975)
    assert abs(w - (sigma * (1 + 2**-40) * z - 0.5)) <= max(1.0, 1e-14 * sigma)
    assert w == math.floor(w)


def test_laplace_error_is_the_exact_quantile() -> None:
    rng = np.random.default_rng(2)
    scales = [0.01, 0.3, 0.5, 1.0, 2.0, 3.7, *(10.0 ** rng.uniform(-2, 6, 200))]
    for scale in scales:
        for alpha in ALPHAS:
            expected = brute_laplace(float(scale), alpha)
            if expected is not None:
                assert _laplace_error(float(scale), alpha) == expected, (scale, alpha)


@pytest.mark.parametrize("scale", [1e12, 1e15, 1e100])
def test_laplace_error_at_huge_scales(scale: float) -> None:
    w = _laplace_error(scale, 0.05)  # ceil(b·ln(2/(α(1 + q)))) − 1, q = e^(−1/b) ≈ 1
    assert (
        w == math.floor(w)
        and abs(w - scale * math.log(40.0 / (1.0 + math.exp(-1.0 / scale)))) <= 1e-12 * scale
    )


def test_bad_significance_is_refused() -> None:
    for alpha in (0.0, 1.0, -0.1, math.nan):
        with pytest.raises(ValueError):
            _gaussian_error(2.0, alpha)
        with pytest.raises(ValueError):
            _laplace_error(2.0, alpha)
