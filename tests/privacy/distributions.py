"""Exact distributions, and OpenDP measurements built here independently of dpproxy.privacy, to
compare draws, bounds, maps and privacy losses against.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import opendp.prelude as dp

from dpproxy.policy import Mechanism
from tests.tolerance import normal_slack

dp.enable_features("contrib")

LAPLACE = Mechanism.LAPLACE
GAUSSIAN = Mechanism.GAUSSIAN
I64_VECTORS = dp.vector_domain(dp.atom_domain(T="i64"))
# The tolerance of the σ-checks, in standard errors: the suite's one rule (tests/tolerance.py) for a
# test of up to 500 of them (6.0).
SIGMAS = normal_slack(500)


def threshold_measurement(scale: float, threshold: int) -> dp.Measurement:
    return dp.m.make_laplace_threshold(
        dp.map_domain(dp.atom_domain(T="i64"), dp.atom_domain(T="i64")),
        dp.l01inf_distance(dp.absolute_distance(T="i64")),
        scale=scale,
        threshold=threshold,
    )


def gaussian_threshold_measurement(scale: float, threshold: int) -> dp.Measurement:
    return dp.m.make_gaussian_threshold(
        dp.map_domain(dp.atom_domain(T="i64"), dp.atom_domain(T="i64")),
        dp.l02inf_distance(dp.absolute_distance(T="i64")),
        scale=scale,
        threshold=threshold,
    )


def laplace_probabilities(scale: float, support: np.ndarray) -> np.ndarray:
    """P[Z = k] for the discrete Laplace: (1 - p)/(1 + p) · p^|k|, p = e^(-1/b)."""
    p = math.exp(-1.0 / scale)
    return (1 - p) / (1 + p) * p ** np.abs(support)


def laplace_tail(scale: float, m: float) -> float:
    """P[Z >= m] for the discrete Laplace, m >= 1 an integer: p^m/(1 + p) (no p**m: it loses digits)."""
    return math.exp(-m / scale) / (1 + math.exp(-1.0 / scale))


def laplace_coverage(scale: float, e: float) -> float:
    """P[|Z| <= e] for the discrete Laplace, e >= 0 an integer."""
    return 1.0 - 2.0 * laplace_tail(scale, e + 1)


def selection_delta(groups: int, scale: float, threshold: int) -> float:
    """The exact δ of Laplace partition selection: some group of the unit's g, with one unit in it
    (count 1, absent from the neighbour), reaches the threshold."""
    return -math.expm1(groups * math.log1p(-laplace_tail(scale, threshold - 1)))


def gaussian_probabilities(sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """Support and P[Z = k] for the discrete Gaussian (mass beyond 14σ is below 1e-40)."""
    bound = math.ceil(14 * sigma) + 2
    support = np.arange(-bound, bound + 1)
    weights = np.exp(-(support.astype(float) ** 2) / (2 * sigma**2))
    return support, weights / weights.sum()


def moments(support: np.ndarray, probabilities: np.ndarray) -> tuple[float, float]:
    """Variance and fourth central moment of a zero-mean distribution."""
    x = support.astype(float)
    return float((probabilities * x**2).sum()), float((probabilities * x**4).sum())


def gaussian_tail(sigma: float, m: int) -> float:
    """P[Z >= m] for the discrete Gaussian, exactly (normalised sum over its support)."""
    support, probabilities = gaussian_probabilities(sigma)
    return float(probabilities[support >= m].sum())


def assert_privacy_loss_within(
    without_unit: Counter, with_unit: Counter, epsilon: float, *, minimum: int = 300
) -> float:
    """Per outcome seen often enough on both sides: |ln(a/b)| <= ε + 5 standard errors. Returns the
    largest loss seen less 2 standard errors, to show the check was sharp (less the full 5-error
    slack, a true loss of 0.83·ε over 10,000 draws fell under 0.5·ε about one run in four)."""
    sharpest = 0.0
    checked = 0
    for outcome in set(without_unit) | set(with_unit):
        a, b = without_unit[outcome], with_unit[outcome]
        if min(a, b) < minimum:
            continue
        slack = 5 * math.sqrt(1 / a + 1 / b)
        loss = abs(math.log(a / b))
        assert loss <= epsilon + slack, f"outcome {outcome}: privacy loss {loss:.3f} > ε = {epsilon:.3f}"
        sharpest = max(sharpest, loss - 0.4 * slack)
        checked += 1
    assert checked >= 2
    return sharpest
