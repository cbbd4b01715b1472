"""Additive integer noise for released values: calibration, samplers and 95% error bounds.

This module owns NoiseSpec, the discrete Laplace or discrete Gaussian noise of one released column:
its calibration against OpenDP's map (laplace_noise: ε at L1 = g·Δ; gaussian_noise: ρ at
L2 = √g·Δ), the draws themselves (dpproxy.privacy.sampling's exact, vectorised samplers of the same
distributions OpenDP's integer measurements sample, so no floating-point noise and no Mironov-style
attacks, drawing from the OS CSPRNG in bulk; docs/privacy.md, "How noise is drawn"), and the
half-widths shown to analysts as ± at 95% (error_at; component_alpha for a figure derived from
several noisy values).

Released values live on an integer grid (counts, integer sums, fixed-point sums scaled by 10^s), so
noise is an integer vector that callers add with Python ints: no saturation, no rounding.

Samplers never see SQL, true values or group keys: only sensitivities, group limits, a budget and
how many draws to make.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import opendp.prelude as dp

from dpproxy.policy import Mechanism
from dpproxy.privacy.calibration import I64_VECTORS, calibrate_scale
from dpproxy.privacy.checks import check_count, check_positive, check_unit_limits
from dpproxy.privacy.sampling import BytesSource, sample_discrete_gaussian, sample_discrete_laplace

# The two-sided significance of the error bounds shown to analysts: ± covers the noise 95% of the time.
ERROR_ALPHA = 0.05

# Above this σ, OpenDP's discrete-Gaussian accuracy helper sums the pmf term by term (linear in σ:
# 24 ms at σ = 1e5, minutes at 1e9), so the continuous helper is used instead; see _gaussian_error.
_DISCRETE_GAUSSIAN_ACCURACY_MAX_SCALE = 1e4


@lru_cache(maxsize=4096)
def _vector_measurement(mechanism: Mechanism, scale: float) -> dp.Measurement:
    """Additive integer noise on an i64 vector: discrete Laplace (L1, ε) or discrete Gaussian (L2, ρ)."""
    if mechanism == Mechanism.LAPLACE:
        return dp.m.make_laplace(I64_VECTORS, dp.l1_distance(T="i64"), scale=scale)
    # The L2 distance is a float: √g·sensitivity is not an integer, and rounding it up would waste budget.
    return dp.m.make_gaussian(I64_VECTORS, dp.l2_distance(T="f64"), scale=scale)


def _l2_sensitivity(sensitivity: int, max_groups: int) -> float:
    """√g · sensitivity as a float never below the exact value (it is the map's input)."""
    exact_square = max_groups * sensitivity * sensitivity
    d_in = math.sqrt(max_groups) * sensitivity
    while Fraction(d_in) ** 2 < exact_square:
        d_in = math.nextafter(d_in, math.inf)
    return d_in


@dataclass(frozen=True)
class NoiseSpec:
    """Additive integer noise for one released column: a vector with one value per released group."""

    mechanism: Mechanism
    sensitivity: int  # per-group L-infinity sensitivity, in grid units (>= 1)
    max_groups: int  # groups one unit can change (g >= 1)
    scale: float  # Laplace b or Gaussian σ, in grid units
    d_in: float  # the map's input: L1 = g·sensitivity (Laplace) or L2 = √g·sensitivity (Gaussian)
    epsilon: float  # Laplace: map(d_in); Gaussian: 0 (its cost is rho)
    rho: float  # Gaussian: zCDP ρ = map(d_in); Laplace: 0

    def sample(self, n: int, bytes_source: BytesSource = os.urandom) -> list[int]:
        """n independent draws of the noise, as Python ints, to add to the true values.

        OpenDP's measurement on an i64 vector x returns x + Z, Z drawn independently of x from the
        discrete Laplace (P(z) ∝ exp(−|z|/b)) or discrete Gaussian (P(z) ∝ exp(−z²/2σ²)) with the
        scale read as an exact rational; its map certifies that additive mechanism. Z is drawn here
        from exactly that distribution (dpproxy.privacy.sampling, tested against OpenDP's draws),
        and x + Z computed with Python ints is the mechanism, for every x, without the saturation at
        the i64 range OpenDP's output would hit. `bytes_source` is for tests only.
        """
        if n < 0:
            raise ValueError("the number of draws must be >= 0")
        if n == 0:
            return []
        if self.mechanism == Mechanism.LAPLACE:
            return sample_discrete_laplace(self.scale, n, bytes_source).tolist()
        return sample_discrete_gaussian(self.scale, n, bytes_source).tolist()

    def error95(self) -> float:
        """Half-width e (grid units) with P(|noise| <= e) >= 0.95, from OpenDP's accuracy helpers."""
        return self.error_at(ERROR_ALPHA)

    def error_at(self, alpha: float) -> float:
        """Half-width e (grid units) with P(|noise| <= e) >= 1 - alpha."""
        if self.mechanism == Mechanism.LAPLACE:
            return _laplace_error(self.scale, alpha)
        return _gaussian_error(self.scale, alpha)


@lru_cache(maxsize=4096)
def _laplace_error(scale: float, alpha: float = ERROR_ALPHA) -> float:
    # The helper's accuracy a has P(|Z| >= a) = α; for an integer Z, |Z| <= floor(a) iff |Z| < a
    # (or a is itself an integer and the event is larger), so floor(a) keeps the coverage.
    return float(math.floor(dp.discrete_laplacian_scale_to_accuracy(scale, alpha)))


@lru_cache(maxsize=4096)
def _gaussian_error(scale: float, alpha: float = ERROR_ALPHA) -> float:
    if scale <= _DISCRETE_GAUSSIAN_ACCURACY_MAX_SCALE:
        return float(math.floor(dp.discrete_gaussian_scale_to_accuracy(scale, alpha)))
    # For larger σ use the continuous helper's a (P(|Y| >= a) = α for Y ~ N(0, σ²)) rounded up:
    # for an integer m >= 1, P(Z >= m) = Σ_{k>=m} exp(-k²/2σ²) / N with N >= √(2π)·σ (Poisson
    # summation, Canonne-Kamath-Steinke 2020), and the sum of a decreasing function is at most its
    # integral from m - 1; so P(|Z| >= e + 1) <= P(|Y| >= e) <= α once e >= a.
    return float(math.ceil(dp.gaussian_scale_to_accuracy(scale, alpha)))


def component_alpha(components: int) -> float:
    """The significance each of `components` noisy values gets when one released figure is derived
    from all of them (AVG from a sum and a count; VAR and STDDEV from three): by the union bound,
    all of them lie within their error_at(component_alpha(k)) together with probability
    >= 1 − ERROR_ALPHA, so the figure's ± derived from those bounds is a true 95% bound. Bounding
    each at 95% instead would only guarantee 1 − k·5% jointly (90% for AVG, 85% for VAR)."""
    check_count("the number of noisy components", components)
    return ERROR_ALPHA / components


@lru_cache(maxsize=4096)
def laplace_noise(sensitivity: int, max_groups: int, epsilon: float) -> NoiseSpec:
    """Discrete Laplace noise whose OpenDP map, at L1 = g·sensitivity, is at most epsilon.

    Starts at the textbook b = L1/ε (Dwork & Roth 2014) and nudges b up until the map agrees.
    """
    check_unit_limits(sensitivity, max_groups)
    check_positive("epsilon", epsilon)
    d_in = max_groups * sensitivity
    scale = calibrate_scale(
        d_in / epsilon, lambda b: _vector_measurement(Mechanism.LAPLACE, b).map(d_in), epsilon
    )
    cost = _vector_measurement(Mechanism.LAPLACE, scale).map(d_in)
    return NoiseSpec(Mechanism.LAPLACE, sensitivity, max_groups, scale, float(d_in), cost, 0.0)


@lru_cache(maxsize=4096)
def gaussian_noise(sensitivity: int, max_groups: int, rho: float) -> NoiseSpec:
    """Discrete Gaussian noise whose OpenDP map (zCDP), at L2 = √g·sensitivity, is at most rho.

    Starts at σ = L2/√(2ρ) (Bun & Steinke 2016; Canonne, Kamath & Steinke 2020 for the discrete
    Gaussian) and nudges σ up until the map agrees.
    """
    check_unit_limits(sensitivity, max_groups)
    check_positive("rho", rho)
    d_in = _l2_sensitivity(sensitivity, max_groups)
    scale = calibrate_scale(
        d_in / math.sqrt(2.0 * rho), lambda s: _vector_measurement(Mechanism.GAUSSIAN, s).map(d_in), rho
    )
    cost = _vector_measurement(Mechanism.GAUSSIAN, scale).map(d_in)
    return NoiseSpec(Mechanism.GAUSSIAN, sensitivity, max_groups, scale, d_in, 0.0, cost)
