"""Noise for released values: samples have the promised shape and distribution, error bounds keep
their promise at every scale, and neighbouring counts are as indistinguishable as the charged ε says.

Distribution and privacy-loss checks are statistical; every tolerance is 5 or more standard errors,
so a failure means a real problem (the chance of a false alarm is below one in a million per check).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import opendp.prelude as dp
import pytest

from dpproxy.errors import InvalidParameter
from dpproxy.privacy import NoiseSpec, component_alpha, gaussian_noise, laplace_noise, plan_query_noise
from tests.privacy.distributions import (
    GAUSSIAN,
    LAPLACE,
    SIGMAS,
    gaussian_probabilities,
    laplace_coverage,
    laplace_probabilities,
    moments,
)

dp.enable_features("contrib")


def test_sample_returns_n_python_ints_and_is_not_repeatable() -> None:
    spec = laplace_noise(1, 1, 0.1)
    assert spec.sample(0) == []
    draws = spec.sample(200)
    assert len(draws) == 200 and all(type(z) is int for z in draws)
    assert draws != spec.sample(200)  # same by chance with probability far below 1e-100
    with pytest.raises(ValueError):
        spec.sample(-1)


def test_discrete_laplace_draws_have_mean_zero_and_the_theoretical_variance() -> None:
    spec = laplace_noise(1, 1, 1 / 3)
    assert spec.scale == pytest.approx(3.0)
    n = 20_000
    draws = np.array(spec.sample(n), dtype=float)
    p = math.exp(-1 / spec.scale)
    variance = 2 * p / (1 - p) ** 2  # the discrete Laplace's variance
    support = np.arange(-400, 401)
    exact_variance, fourth = moments(support, laplace_probabilities(spec.scale, support))
    assert exact_variance == pytest.approx(variance, rel=1e-12)
    assert abs(draws.mean()) <= SIGMAS * math.sqrt(variance / n)
    assert abs(draws.var() - variance) <= SIGMAS * math.sqrt((fourth - variance**2) / n)


def test_discrete_gaussian_draws_have_variance_sigma_squared() -> None:
    spec = gaussian_noise(1, 1, 1 / 50)  # σ = 5
    assert spec.scale == pytest.approx(5.0)
    n = 20_000
    draws = np.array(spec.sample(n), dtype=float)
    support, probabilities = gaussian_probabilities(spec.scale)
    variance, fourth = moments(support, probabilities)
    assert variance == pytest.approx(spec.scale**2, rel=1e-6)
    assert abs(draws.mean()) <= SIGMAS * math.sqrt(variance / n)
    assert abs(draws.var() - variance) <= SIGMAS * math.sqrt((fourth - variance**2) / n)


@pytest.mark.parametrize(
    "spec", [laplace_noise(1, 1, 0.1), gaussian_noise(1, 1, 1 / 20_000)], ids=["laplace", "gaussian"]
)
def test_error95_covers_95_percent_of_draws(spec: NoiseSpec) -> None:
    e = spec.error95()
    assert e == math.floor(e)
    if spec.mechanism == LAPLACE:
        coverage = laplace_coverage(spec.scale, e)
    else:
        support, probabilities = gaussian_probabilities(spec.scale)
        coverage = float(probabilities[np.abs(support) <= e].sum())
    assert 0.95 <= coverage < 0.96  # a promise kept, and not by being needlessly wide
    n = 20_000
    draws = np.abs(np.array(spec.sample(n)))
    observed = float((draws <= e).mean())
    assert abs(observed - coverage) <= SIGMAS * math.sqrt(coverage * (1 - coverage) / n)
    assert 0.935 <= observed <= 0.97


@pytest.mark.parametrize("scale", [0.3, 1.0, 2.5, 10.0, 123.4, 1e4, 1e9])
def test_laplace_error95_keeps_its_promise_at_every_scale(scale: float) -> None:
    spec = NoiseSpec(LAPLACE, 1, 1, scale, 1.0, 1.0 / scale, 0.0)
    e = spec.error95()
    assert laplace_coverage(scale, e) >= 0.95
    assert laplace_coverage(scale, e - 1) < 0.95 or e == 0  # and is the tightest integer


@pytest.mark.parametrize("sigma", [0.4, 1.0, 7.5, 100.0, 9_999.0, 10_001.0, 25_000.0])
def test_gaussian_error95_keeps_its_promise_at_every_scale(sigma: float) -> None:
    spec = NoiseSpec(GAUSSIAN, 1, 1, sigma, 1.0, 0.0, 1 / (2 * sigma**2))
    e = spec.error95()
    support, probabilities = gaussian_probabilities(sigma)
    assert float(probabilities[np.abs(support) <= e].sum()) >= 0.95
    assert e <= 1.96 * sigma + 2  # not needlessly wide, on either side of the helper switch


@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("scale", [0.7, 3.0, 123.4, 25_000.0])
def test_error_at_a_split_level_keeps_its_promise_so_k_bounds_hold_together(parts: int, scale: float) -> None:
    """A figure derived from k noisy components bounds each at 1 − 5%/k: each bound keeps that
    promise exactly as error95 keeps 95%, so all k hold together with probability >= 95%."""
    alpha = component_alpha(parts)
    assert alpha == pytest.approx(0.05 / parts)
    laplace = NoiseSpec(LAPLACE, 1, 1, scale, 1.0, 1.0 / scale, 0.0)
    e = laplace.error_at(alpha)
    assert laplace_coverage(scale, e) >= 1 - alpha and e >= laplace.error95()
    assert laplace_coverage(scale, e - 1) < 1 - alpha or e == 0
    if scale <= 200:
        gaussian = NoiseSpec(GAUSSIAN, 1, 1, scale, 1.0, 0.0, 1 / (2 * scale**2))
        support, probabilities = gaussian_probabilities(scale)
        assert float(probabilities[np.abs(support) <= gaussian.error_at(alpha)].sum()) >= 1 - alpha


def test_component_alpha_needs_at_least_one_component() -> None:
    with pytest.raises(InvalidParameter):
        component_alpha(0)


def test_gaussian_error95_is_fast_at_huge_scales() -> None:
    # OpenDP's discrete-Gaussian helper is linear in σ (minutes at 1e9): a query must not hang on it.
    spec = NoiseSpec(GAUSSIAN, 1, 1, 3.3e9, 1.0, 0.0, 1e-20)
    assert spec.error95() == pytest.approx(1.96 * 3.3e9, rel=1e-3)


def test_count_noise_privacy_loss_between_neighbours_is_epsilon() -> None:
    epsilon = 1.0
    noise = plan_query_noise(LAPLACE, epsilon, 0.0, [(1, 1)], None)
    spec = noise.columns[0]
    assert noise.cost.epsilon == pytest.approx(epsilon)
    n = 100_000
    true_count = 41  # any value: noise is added outside OpenDP, with Python ints
    without_unit = Counter(true_count + z for z in spec.sample(n))
    with_unit = Counter(true_count + 1 + z for z in spec.sample(n))
    losses = []
    for outcome in set(without_unit) & set(with_unit):
        a, b = without_unit[outcome], with_unit[outcome]
        if min(a, b) < 1_000:
            continue
        loss = abs(math.log(a / b))
        slack = 5 * math.sqrt(1 / a + 1 / b)
        assert loss <= epsilon + slack, f"outcome {outcome}: privacy loss {loss:.3f} > ε"
        losses.append((loss, slack))
    assert len(losses) >= 5
    # The discrete Laplace at b = 1/ε is tight: every outcome shows a loss of ε. A mechanism
    # charged more than it spends (or noised less than it claims) would be caught either way.
    assert all(abs(loss - epsilon) <= slack for loss, slack in losses)
