"""The maths of privacy, in one place: samplers, calibration, privacy cost, thresholds, error bounds.

This module owns how a query's (ε, δ) is split over the values it releases, the noise scale each of
them gets, the threshold of DP partition selection, the selections made by the exponential mechanism
(quantiles, MIN/MAX, MODE, top-k), randomized response, how costs compose under pure or zCDP
accounting, the error bounds shown to analysts, and the draws themselves. It never sees SQL, policies
or data rows: only sensitivities, group limits and the numeric vectors handed to it (unit counts for
partition selection, per-group histograms and scores for the selectors, tallies of bits).

Two rules keep it honest:

* Everything random comes from OpenDP: discrete Laplace / discrete Gaussian samplers on integers
  (exact, no floating-point noise, so no Mironov-style attacks), exact exponential / Gumbel noise for
  report-noisy-max, and exact Bernoulli coins for randomized response, all drawing from the OS CSPRNG.
* Every privacy cost is read from an OpenDP measurement's privacy map (`meas.map(d_in)`). Textbook
  formulas (Laplace b = Δ/ε, Gaussian σ = Δ/√(2ρ)) only give a starting parameter; the map then has
  the last word, and the parameter is nudged until the map says the cost fits. OpenDP rounds maps up
  (`map(3)` at Laplace scale 10 is 0.30000000000000004), so the nudging is not cosmetic. Two known
  OpenDP bugs are worked around, still with OpenDP's own maps: see _THRESHOLD_MAP_SHIFT.

Released values live on an integer grid (counts, integer sums, fixed-point sums scaled by 10^s), so
noise is an integer vector that callers add with Python ints: no saturation, no rounding. Selectors
score candidates with integers too, and return indexes into a candidate list the caller owns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from functools import lru_cache
from typing import ClassVar

import numpy as np
import opendp.prelude as dp

from dpproxy.errors import InvalidParameter
from dpproxy.policy import Mechanism

dp.enable_features("contrib")

# The two-sided significance of the error bounds shown to analysts: ± covers the noise 95% of the time.
ERROR_ALPHA = 0.05

# fits_within forgives this much relative excess, and only so that sums that differ from the limit
# by float rounding (0.1 + 0.2 vs 0.3) are not refused. It is not slack in the guarantee worth
# speaking of: spending ε(1 + 1e-9) instead of ε changes e^ε in the ninth digit.
FIT_RELATIVE_TOLERANCE = 1e-9

# Above this σ, OpenDP's discrete-Gaussian accuracy helper sums the pmf term by term (linear in σ:
# 24 ms at σ = 1e5, minutes at 1e9), so the continuous helper is used instead; see _gaussian_error.
_DISCRETE_GAUSSIAN_ACCURACY_MAX_SCALE = 1e4

# Calibration nudges a scale up by a factor 1 + 2^(step - 50): the first steps move it by a few ulps
# (all OpenDP's upward rounding ever needs), later ones by whole factors, so the search always ends.
_MAX_CALIBRATION_STEPS = 60

# Partition selection looks for its threshold at most this many noise scales above its starting
# point, where δ has fallen by e^-60 more: beyond, OpenDP's rounding floor is what stops it, not τ.
_SELECTION_SEARCH_SCALES = 60

# OpenDP's L1 distance on i64 vectors is itself an i64.
_MAX_L1_SENSITIVITY = 2**62

# Selector scores are i64 for OpenDP. Scores below -2^62 are raised to it: max(score, c) changes by no
# more than the score does, so the sensitivity (and the cost) is unchanged, and a candidate 2^62 noise
# scales below the best is never chosen either way (see _SCORE_FLOOR uses).
_SCORE_FLOOR = -(2**62)

# A quantile's α is kept as a fraction num/den with den at most this, so that den·n stays exact.
_MAX_QUANTILE_DENOMINATOR = 10**6

# The classic survey protocol: a fair coin says "answer truthfully" or "answer by a second fair coin".
RANDOMIZED_RESPONSE_TRUTH = 0.75

_I64_VECTORS = dp.vector_domain(dp.atom_domain(T="i64"))
_I64_COUNTS_BY_GROUP = dp.map_domain(dp.atom_domain(T="i64"), dp.atom_domain(T="i64"))


# --------------------------------------------------------------------------------------------------
# Cost


def _add_up(a: float, b: float) -> float:
    """a + b rounded towards +inf: never below the exact sum, so added-up costs are never understated."""
    total = a + b
    if math.isinf(total):
        return total
    # Knuth's TwoSum: `error` is exactly (a + b) - total for round-to-nearest floats.
    b_part = total - a
    a_part = total - b_part
    error = (a - a_part) + (b - b_part)
    return math.nextafter(total, math.inf) if error > 0 else total


def _sum_up(values: Sequence[float]) -> float:
    total = 0.0
    for value in values:
        total = _add_up(total, value)
    return total


class Accounting(StrEnum):
    """How a deployment composes the costs of an analyst's queries.

    PURE: every query's cost is an (ε, δ) and ε, δ add up. Gaussian noise is converted to (ε, δ)
    query by query.
    ZCDP: every query's cost is a ρ (zero-concentrated DP, Bun & Steinke 2016) plus the δ of its
    partition selection (approximate zCDP); ρ and that δ add up across queries, and only the total is
    converted to (ε, δ) against the analyst's budget, with `converted_epsilon`. Noise is discrete
    Gaussian (Canonne, Kamath & Steinke 2020), as the US Census Bureau used for 2020.
    """

    PURE = "pure"
    ZCDP = "zcdp"


@dataclass(frozen=True)
class Cost:
    """What one query costs, or what a budget holds.

    Under pure accounting: (ε, δ) under sequential composition, rho = 0.
    Under zCDP accounting: the query is δ-approximately ρ-zCDP (Bun & Steinke 2016, Def. 8.1): `rho`
    and `delta` are what composes (both add up); `epsilon` is for display only, the ε at which the
    query alone is (ε, δ_request)-DP (see QueryNoise.approx_dp).

    `a + b` rounds up, one ulp at most per field, so a sum of costs is never below the exact sum.
    """

    epsilon: float
    delta: float = 0.0
    rho: float = 0.0

    ZERO: ClassVar[Cost]

    def __post_init__(self) -> None:
        # Infinite limits are allowed (an unlimited budget); NaN would make every comparison false.
        for name, value in (("epsilon", self.epsilon), ("delta", self.delta), ("rho", self.rho)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"Cost.{name} must be a number, not {type(value).__name__}")
            if math.isnan(value) or value < 0:
                raise ValueError(f"Cost.{name} must be a number >= 0, not {value!r}")

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(
            _add_up(self.epsilon, other.epsilon),
            _add_up(self.delta, other.delta),
            _add_up(self.rho, other.rho),
        )

    def fits_within(self, limit: Cost) -> bool:
        """ε and δ are each at most the limit's, forgiving FIT_RELATIVE_TOLERANCE of float rounding.

        ρ is not compared: under zCDP accounting the ledger converts the total with converted_epsilon.
        """
        scale = 1.0 + FIT_RELATIVE_TOLERANCE
        return self.epsilon <= limit.epsilon * scale and self.delta <= limit.delta * scale


Cost.ZERO = Cost(0.0, 0.0, 0.0)


def _accounting(value: Accounting | str) -> Accounting:
    if isinstance(value, Accounting):
        return value
    try:
        return Accounting(value)
    except ValueError:
        raise InvalidParameter(f"unknown privacy accounting {value!r}: use pure or zcdp") from None


# --------------------------------------------------------------------------------------------------
# OpenDP measurements, built once per parameter set (construction and maps cost ~0.05-0.3 ms each)


@lru_cache(maxsize=4096)
def _vector_measurement(mechanism: Mechanism, scale: float) -> dp.Measurement:
    """Additive integer noise on an i64 vector: discrete Laplace (L1, ε) or discrete Gaussian (L2, ρ)."""
    if mechanism == Mechanism.LAPLACE:
        return dp.m.make_laplace(_I64_VECTORS, dp.l1_distance(T="i64"), scale=scale)
    # The L2 distance is a float: √g·sensitivity is not an integer, and rounding it up would waste budget.
    return dp.m.make_gaussian(_I64_VECTORS, dp.l2_distance(T="f64"), scale=scale)


@lru_cache(maxsize=1024)
def _threshold_measurement(scale: float, threshold: int) -> dp.Measurement:
    """Laplace noise on each group's unit count; keeps the groups whose noisy count reaches threshold."""
    return dp.m.make_laplace_threshold(
        _I64_COUNTS_BY_GROUP,
        dp.l01inf_distance(dp.absolute_distance(T="i64")),
        scale=scale,
        threshold=threshold,
    )


@lru_cache(maxsize=1024)
def _gaussian_threshold_measurement(scale: float, threshold: int) -> dp.Measurement:
    """Discrete Gaussian noise on each group's unit count, keeping those reaching threshold; its map
    is approximate zCDP (ρ, δ) at (l0, l2, l∞)."""
    return dp.m.make_gaussian_threshold(
        _I64_COUNTS_BY_GROUP,
        dp.l02inf_distance(dp.absolute_distance(T="i64")),
        scale=scale,
        threshold=threshold,
    )


@lru_cache(maxsize=4096)
def _noisy_max_measurement(accounting: Accounting, scale: float, monotonic: bool, k: int) -> dp.Measurement:
    """Report-noisy-max (k = 1) or one-shot report-noisy-top-k over an i64 score vector.

    Pure: exponential noise (report-noisy-max with exponential noise is permute-and-flip, McKenna &
    Sheldon 2020), map ε = k·2Δ/scale (k·Δ/scale for monotonic scores). zCDP: Gumbel noise (the
    exponential mechanism; Durfee & Rogers 2019 for top-k), map ρ = k·(2Δ/scale)²/8, the bounded-range
    bound of Cesar & Rogers 2021 (a quarter of the ε²/2 that make_pureDP_to_zCDP would charge).
    """
    space = (_I64_VECTORS, dp.linf_distance(T="i64", monotonic=monotonic))
    measure = dp.max_divergence() if accounting == Accounting.PURE else dp.zero_concentrated_divergence()
    if k == 1:
        return dp.m.make_noisy_max(*space, measure, scale=scale)
    return dp.m.make_noisy_top_k(*space, measure, k=k, scale=scale)


@lru_cache(maxsize=1)
def _unit_gaussian() -> dp.Measurement:
    """A Gaussian of scale 1: its map, at d_in = √(2ρ), is a zCDP measurement costing ρ, for conversions."""
    return dp.m.make_gaussian(_I64_VECTORS, dp.l2_distance(T="f64"), scale=1.0)


@lru_cache(maxsize=256)
def _unit_gaussian_at_delta(delta: float) -> dp.Measurement:
    return dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(_unit_gaussian()), delta)


def _calibrate_scale(start: float, cost_at: Callable[[float], float], target: float) -> float:
    """The first scale from `start` upwards, by tiny factors, whose OpenDP cost is <= target."""
    scale = start
    for step in range(_MAX_CALIBRATION_STEPS):
        if cost_at(scale) <= target:
            return scale
        scale *= 1.0 + 2.0 ** (step - 50)
    raise AssertionError(f"no noise scale near {start!r} brings the OpenDP map to {target!r}")


def _even_share(total: float, parts: int) -> float:
    """The largest float s <= total/parts whose upward-rounded sum of `parts` copies is <= total."""
    share = total / parts
    while _sum_up([share] * parts) > total:
        share = math.nextafter(share, 0.0)
    return share


def _l2_sensitivity(sensitivity: int, max_groups: int) -> float:
    """√g · sensitivity as a float never below the exact value (it is the map's input)."""
    exact_square = max_groups * sensitivity * sensitivity
    d_in = math.sqrt(max_groups) * sensitivity
    while Fraction(d_in) ** 2 < exact_square:
        d_in = math.nextafter(d_in, math.inf)
    return d_in


# --------------------------------------------------------------------------------------------------
# Noise for released values


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

    def sample(self, n: int) -> list[int]:
        """n independent draws of the noise, as Python ints, to add to the true values.

        OpenDP's measurement on an i64 vector x returns x + Z, Z drawn independently of x
        (saturating at the i64 range). So M(0) = Z has exactly the noise distribution, and
        x + M(0) computed with Python ints is distributed as the additive mechanism x + Z whose
        privacy the map certifies, for every x, without the saturation that values beyond the i64
        range would hit: the caller's addition is the mechanism, not a post-processing of it.
        """
        if n < 0:
            raise ValueError("the number of draws must be >= 0")
        if n == 0:
            return []
        return [int(z) for z in _vector_measurement(self.mechanism, self.scale)([0] * n)]

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
    _check_count("the number of noisy components", components)
    return ERROR_ALPHA / components


def _check_unit_limits(sensitivity: int, max_groups: int) -> None:
    for name, value in (("sensitivity", sensitivity), ("max_groups", max_groups)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidParameter(f"{name} of a released value must be an integer >= 1, not {value!r}")
    if sensitivity * max_groups > _MAX_L1_SENSITIVITY:
        raise InvalidParameter(
            f"sensitivity {sensitivity} over {max_groups} group(s) is too large to calibrate noise for",
            hint="tighten the column bounds, max_rows_per_unit or max_groups_per_unit in the policy",
        )


def _check_positive(name: str, value: float) -> None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value <= 0:
        raise InvalidParameter(f"{name} must be a finite number > 0, not {value!r}")


def _check_count(name: str, value: int, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidParameter(f"{name} must be an integer >= {minimum}, not {value!r}")


@lru_cache(maxsize=4096)
def laplace_noise(sensitivity: int, max_groups: int, epsilon: float) -> NoiseSpec:
    """Discrete Laplace noise whose OpenDP map, at L1 = g·sensitivity, is at most epsilon.

    Starts at the textbook b = L1/ε (Dwork & Roth 2014) and nudges b up until the map agrees.
    """
    _check_unit_limits(sensitivity, max_groups)
    _check_positive("epsilon", epsilon)
    d_in = max_groups * sensitivity
    scale = _calibrate_scale(
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
    _check_unit_limits(sensitivity, max_groups)
    _check_positive("rho", rho)
    d_in = _l2_sensitivity(sensitivity, max_groups)
    scale = _calibrate_scale(
        d_in / math.sqrt(2.0 * rho), lambda s: _vector_measurement(Mechanism.GAUSSIAN, s).map(d_in), rho
    )
    cost = _vector_measurement(Mechanism.GAUSSIAN, scale).map(d_in)
    return NoiseSpec(Mechanism.GAUSSIAN, sensitivity, max_groups, scale, d_in, 0.0, cost)


@lru_cache(maxsize=4096)
def zcdp_to_approx_dp(rho: float, delta: float) -> float:
    """The ε that OpenDP's zCDP → (ε, δ) conversion gives a ρ-zCDP measurement at this δ.

    The conversion is applied to a Gaussian whose map is ρ, or one float above it (never below).
    """
    _check_positive("rho", rho)
    _check_positive("delta", delta)
    if delta >= 1:
        raise InvalidParameter(f"delta must be < 1, not {delta!r}")
    unit = _unit_gaussian()
    d_in = math.sqrt(2.0 * rho)
    while unit.map(d_in) < rho:
        d_in = math.nextafter(d_in, math.inf)
    epsilon, _ = _unit_gaussian_at_delta(delta).map(d_in)
    return epsilon


def converted_epsilon(cost: Cost, delta: float) -> float:
    """The ε at which a zCDP-accounted cost (δ₀-approximately ρ-zCDP) is (ε, delta)-DP.

    ε = zcdp_to_approx_dp(ρ, delta − δ₀): the conversion OpenDP's make_zCDP_to_approxDP applies to an
    approximate-zCDP measurement (checked against make_gaussian_threshold in the tests). A cost with
    ρ = 0 converts to ε = 0. The ledger uses it on an analyst's summed cost against the budget's δ.
    """
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not cost.delta < delta < 1:
        raise InvalidParameter(
            f"delta {delta!r} must exceed the cost's own delta {cost.delta!r} (and be < 1) to convert zCDP"
        )
    if cost.rho == 0:
        return 0.0
    return zcdp_to_approx_dp(cost.rho, _remainder(float(delta), cost.delta))


@lru_cache(maxsize=1024)
def _rho_for(epsilon: float, delta: float) -> float:
    """The largest ρ (to ~1e-9 relative) whose OpenDP conversion gives at most epsilon at delta.

    Starts from Bun & Steinke's ρ + 2√(ρ ln(1/δ)) = ε, which OpenDP's tighter conversion (CKS20)
    affords, then brackets and runs regula falsi (Illinois), ~8 conversions of ~2 ms each.
    """

    def excess(rho: float) -> float:
        return zcdp_to_approx_dp(rho, delta) - epsilon

    log_term = math.log(1.0 / delta)
    low = (math.sqrt(log_term + epsilon) - math.sqrt(log_term)) ** 2
    f_low = excess(low)
    while f_low > 0:
        low /= 2.0
        f_low = excess(low)
    high = low * 2.0
    f_high = excess(high)
    while f_high <= 0:
        low, f_low = high, f_high
        high *= 2.0
        f_high = excess(high)
    side = 0
    for _ in range(100):
        if high / low - 1.0 < 1e-9 or -f_low <= 1e-9 * epsilon:
            break
        guess = (low * f_high - high * f_low) / (f_high - f_low)
        if not low < guess < high:
            guess = (low + high) / 2.0
        f_guess = excess(guess)
        if f_guess <= 0:
            low, f_low = guess, f_guess
            if side == -1:
                f_high /= 2.0
            side = -1
        else:
            high, f_high = guess, f_guess
            if side == 1:
                f_low /= 2.0
            side = 1
    return low


# --------------------------------------------------------------------------------------------------
# Partition selection


@dataclass(frozen=True)
class SelectionSpec:
    """DP partition selection for group keys that are not public.

    Noise on each group's count of distinct units; a group is released when its noisy count reaches
    the threshold. Laplace (pure accounting): OpenDP make_laplace_threshold, map input (l0, l1, l∞) =
    (g, g, 1): one unit is in at most g groups and adds one to each of their counts; cost (ε, δ).
    Gaussian (zCDP accounting): OpenDP make_gaussian_threshold, map input (l0, l2, l∞) = (g, g, 1)
    (OpenDP tightens l2 to √g·l∞), cost δ-approximate ρ-zCDP (Rogers 2023).
    """

    max_groups: int
    scale: float
    threshold: int
    epsilon: float  # from the OpenDP map (Laplace); 0 for Gaussian
    delta: float  # from the OpenDP map, read as _selection_map explains
    mechanism: Mechanism = Mechanism.LAPLACE
    rho: float = 0.0  # from the OpenDP map (Gaussian); 0 for Laplace

    def select(self, unit_counts: Sequence[int]) -> list[int]:
        """Indexes (in input order) of the groups released. Counts are distinct units per group."""
        counts = {i: int(c) for i, c in enumerate(unit_counts)}
        # No value in the message: counts are read from protected tables.
        if any(c < 0 for c in counts.values()):
            raise ValueError("unit counts must be >= 0")
        if not counts:
            return []
        if self.mechanism == Mechanism.LAPLACE:
            measurement = _threshold_measurement(self.scale, self.threshold)
        else:
            measurement = _gaussian_threshold_measurement(self.scale, self.threshold)
        return sorted(measurement(counts))


# OpenDP 0.16 understates the δ of its threshold measurements: they release a group when
# count + Z >= threshold, so a group only one unit is in (count 1) comes out with probability
# P[Z >= threshold - 1].
# * make_laplace_threshold charges P[Z > threshold - 1] = P[Z >= threshold] (opendp/opendp#2922,
#   open), a factor e^(1/b) too small.
# * make_gaussian_threshold charges the continuous Gaussian's P[Y >= threshold - 1], but the discrete
#   Gaussian's integer tail is heavier: P[Z >= m] is about P[Y >= m - 1/2].
# The map of the same measurement one step lower charges P[Z >= threshold - 1] exactly (Laplace), or
# P[Y >= threshold - 2] >= P[Z >= threshold - 1] (Gaussian: Σ_{k>=m} e^(-k²/2σ²) is at most the integral
# from m - 1, and the discrete normaliser is at least √(2π)σ, Canonne-Kamath-Steinke 2020), so that is
# the δ taken for a threshold. If OpenDP fixes either, this over-charges a little: safe, and
# tests/test_mechanisms.py compares δ with the exact release probability either way.
_THRESHOLD_MAP_SHIFT = 1


def _selection_map(max_groups: int, scale: float, threshold: int) -> tuple[float, float]:
    """(ε, δ) of releasing groups whose noisy unit count reaches `threshold` (>= 2), from OpenDP maps."""
    d_in = (max_groups, max_groups, 1)
    epsilon, _ = _threshold_measurement(scale, threshold).map(d_in)
    _, delta = _threshold_measurement(scale, threshold - _THRESHOLD_MAP_SHIFT).map(d_in)
    return epsilon, delta


def _gaussian_selection_map(max_groups: int, scale: float, threshold: int) -> tuple[float, float]:
    """(ρ, δ) of releasing groups whose discrete-Gaussian-noised unit count reaches `threshold` (>= 2)."""
    d_in = (max_groups, max_groups, 1)
    rho, _ = _gaussian_threshold_measurement(scale, threshold).map(d_in)
    _, delta = _gaussian_threshold_measurement(scale, threshold - _THRESHOLD_MAP_SHIFT).map(d_in)
    return rho, delta


def _wilson_threshold(max_groups: int, scale: float, delta: float) -> int:
    """τ = 1 + b·ln(g/(2δ)) rounded up (Wilson et al. 2020); at least 2.

    At least 2 because a group of one unit must not be released for sure, and because the shifted
    map (see _THRESHOLD_MAP_SHIFT) needs a threshold of at least the l-infinity distance, 1.
    """
    return max(2, math.ceil(1.0 + scale * math.log(max_groups / (2.0 * delta))))


def _too_small_delta(delta: float, max_groups: int) -> InvalidParameter:
    return InvalidParameter(
        f"delta {delta:g} is too small for partition selection over up to {max_groups} group(s) "
        "per unit: OpenDP cannot certify it: raise defaults.delta in the policy",
        hint="or declare public_values for the GROUP BY columns, or lower max_groups_per_unit",
    )


def _smallest_fitting(fits: Callable[[int], bool], not_fit: int, fit: int) -> int:
    """The smallest t in (not_fit, fit] with fits(t), for fits monotone in t and fits(fit) true."""
    while fit - not_fit > 1:
        middle = (not_fit + fit) // 2
        if fits(middle):
            fit = middle
        else:
            not_fit = middle
    return fit


def _search_threshold(
    fits: Callable[[int], bool], start: int, scale: float, delta: float, max_groups: int
) -> int:
    """The smallest threshold above start that fits, for δ falling at least geometrically in it:
    gallop up from start, then bisect (not_fit < answer <= fit). Refuses a δ no threshold within
    _SELECTION_SEARCH_SCALES noise scales of start can reach."""
    ceiling = start + math.ceil(_SELECTION_SEARCH_SCALES * scale)
    if not fits(ceiling):
        raise _too_small_delta(delta, max_groups)
    not_fit, fit = start, ceiling
    step = 1
    while start + step < ceiling:
        if fits(start + step):
            fit = start + step
            break
        not_fit = start + step
        step *= 2
    return _smallest_fitting(fits, not_fit, fit)


@lru_cache(maxsize=1024)
def partition_selection(max_groups: int, epsilon: float, delta: float) -> SelectionSpec:
    """Selection whose OpenDP map is within (epsilon, delta) for units in at most max_groups groups.

    The scale starts at g/ε and is nudged until the map's ε fits; the threshold is the smallest
    integer from Wilson et al.'s τ upwards whose map's δ fits (δ read as _selection_map explains).
    """
    _check_unit_limits(1, max_groups)
    _check_positive("epsilon", epsilon)
    _check_positive("delta", delta)
    scale = _calibrate_scale(
        max_groups / epsilon,
        lambda b: _selection_map(max_groups, b, _wilson_threshold(max_groups, b, delta))[0],
        epsilon,
    )
    start = _wilson_threshold(max_groups, scale, delta)

    def fits(threshold: int) -> bool:
        eps, dlt = _selection_map(max_groups, scale, threshold)
        return eps <= epsilon and dlt <= delta

    threshold = start
    if not fits(start):
        # OpenDP computes 1 - (1 - δ₁)^g rounding outwards, which cannot go below a few ulps of 1.0
        # per group however high the threshold: a δ under that floor is refused, not searched for.
        threshold = _search_threshold(fits, start, scale, delta, max_groups)
    eps, dlt = _selection_map(max_groups, scale, threshold)
    return SelectionSpec(max_groups, scale, threshold, eps, dlt)


@lru_cache(maxsize=1024)
def gaussian_partition_selection(max_groups: int, rho: float, delta: float) -> SelectionSpec:
    """Selection by discrete Gaussian noise whose OpenDP map is within (ρ, δ) approximate zCDP.

    σ starts at √g/√(2ρ) and is nudged until the map's ρ fits; the threshold is the smallest integer
    >= 2 whose map's δ (read as _selection_map explains) fits, searched from 1 + σ·√(2 ln(g/δ)).
    """
    _check_unit_limits(1, max_groups)
    _check_positive("rho", rho)
    _check_positive("delta", delta)
    guess_at = lambda sigma: max(2, math.ceil(2.0 + sigma * math.sqrt(2.0 * math.log(max_groups / delta))))  # noqa: E731
    scale = _calibrate_scale(
        math.sqrt(max_groups / (2.0 * rho)),
        lambda s: _gaussian_selection_map(max_groups, s, guess_at(s))[0],
        rho,
    )

    def fits(threshold: int) -> bool:
        rho_map, delta_map = _gaussian_selection_map(max_groups, scale, threshold)
        return rho_map <= rho and delta_map <= delta

    start = guess_at(scale)
    if fits(2):
        threshold = 2
    elif fits(start):
        threshold = _smallest_fitting(fits, 2, start)
    else:
        threshold = _search_threshold(fits, start, scale, delta, max_groups)
    rho_map, delta_map = _gaussian_selection_map(max_groups, scale, threshold)
    return SelectionSpec(max_groups, scale, threshold, 0.0, delta_map, Mechanism.GAUSSIAN, rho_map)


# --------------------------------------------------------------------------------------------------
# Selectors: releases chosen by report-noisy-max (the exponential mechanism's family)
#
# Every selector scores its candidates with integers whose L∞ sensitivity (add/remove one unit) is
# proven below, and hands them to OpenDP's report-noisy-max, whose map gives the cost. With the best
# score q*, any noisy-max variant used here picks candidate j with probability at most
# exp((q_j − q*)/scale): for Gumbel noise that is the softmax itself; for exponential noise
# (permute-and-flip) j is kept, when reached, with exactly that probability. Summed over at most K − 1
# candidates this gives the 95% bounds: P(picked score <= q* − x) <= (K − 1)·exp(−x/scale).


def _selection_tail(scale: float, candidates: int, picks: int = 1) -> float:
    """x with (candidates − 1)·picks·exp(−x/scale) = ERROR_ALPHA (0 when there is nothing to confuse)."""
    rivals = (candidates - 1) * picks
    if rivals <= 0:
        return 0.0
    return scale * math.log(rivals / ERROR_ALPHA)


def _calibrate_selector(
    accounting: Accounting, d_in: int, budget: float, *, monotonic: bool = False, k: int = 1
) -> tuple[float, float]:
    """(scale, cost) of noisy max/top-k over scores of L∞ sensitivity d_in whose map is <= budget.

    Pure maps are proportional to 1/scale and zCDP maps to 1/scale², so the map at scale 1 gives the
    starting point exactly; the usual nudging absorbs OpenDP's upward rounding.
    """
    if d_in > _MAX_L1_SENSITIVITY:
        raise InvalidParameter(
            f"score sensitivity {d_in} is too large to calibrate a selection for",
            hint="tighten max_rows_per_unit in the policy or use a simpler quantile",
        )
    unit = _noisy_max_measurement(accounting, 1.0, monotonic, k).map(d_in)
    start = unit / budget if accounting == Accounting.PURE else math.sqrt(unit / budget)
    scale = _calibrate_scale(
        start, lambda s: _noisy_max_measurement(accounting, s, monotonic, k).map(d_in), budget
    )
    return scale, _noisy_max_measurement(accounting, scale, monotonic, k).map(d_in)


def _budget_arguments(epsilon: float | None, rho: float | None) -> tuple[Accounting, float]:
    """Exactly one of ε (pure accounting) or ρ (zCDP accounting) pays for a selector."""
    if (epsilon is None) == (rho is None):
        raise InvalidParameter("a selection is paid for by exactly one of epsilon (pure) or rho (zCDP)")
    if epsilon is not None:
        _check_positive("epsilon", epsilon)
        return Accounting.PURE, float(epsilon)
    assert rho is not None
    _check_positive("rho", rho)
    return Accounting.ZCDP, float(rho)


def _check_histogram(values: Sequence[int], length: int | None, what: str) -> list[int]:
    """Integer, non-negative, and as many as the candidates. Messages never show values (they are
    read from protected tables)."""
    counts = [int(v) for v in values]
    if length is not None and len(counts) != length:
        raise ValueError(f"{what} has {len(counts)} entries for {length} candidates")
    if any(c < 0 for c in counts):
        raise ValueError(f"{what} must be >= 0")
    return counts


def _i64_scores(scores: Sequence[int]) -> list[int]:
    """Scores as OpenDP's i64, keeping their order and differences where they fit.

    Report-noisy-max is invariant under adding one constant to every score, so scores are shifted
    so that the best is 0, and any below _SCORE_FLOOR raised to it (1-Lipschitz, monotone: the L∞
    sensitivity, and monotonicity, are unchanged). Values are never shown in errors.
    """
    values = [int(s) for s in scores]
    top, bottom = max(values), min(values)
    if bottom > -(2**62) and top < 2**62:
        return values
    return [max(v - top, _SCORE_FLOOR) for v in values]


def _fraction(alpha: Fraction | float) -> Fraction:
    if isinstance(alpha, bool) or not isinstance(alpha, Fraction | int | float):
        raise InvalidParameter(f"a quantile must be a number between 0 and 1, not {alpha!r}")
    if isinstance(alpha, float) and not math.isfinite(alpha):
        raise InvalidParameter(f"a quantile must be a number between 0 and 1, not {alpha!r}")
    value = Fraction(alpha)
    if not 0 <= value <= 1:
        raise InvalidParameter(f"a quantile must be between 0 and 1, not {float(value):g}")
    # 0.1 is 3602879701896397/2^55 as a float; the fraction the user meant is the nearest simple one.
    return value.limit_denominator(_MAX_QUANTILE_DENOMINATOR)


@dataclass(frozen=True)
class QuantileSpec:
    """One quantile per group, chosen by report-noisy-max over candidates c_0 < … < c_{K−1} (the
    column's bounded domain on a grid). Used for PERCENTILE_CONT, PERCENTILE_DISC, MEDIAN, MIN and MAX.

    The caller hands one group's histogram: bin_counts[j] = number of values v with c_j <= v < c_{j+1}
    (the last bin holds the values equal to c_{K−1}), after clipping and contribution bounding. Write
    rank_j = sum(bin_counts[:j]) (values below c_j), n = the number of values. Bin j covers the ranks
    [rank_j, rank_{j+1}]: the bin that holds the target rank scores best.

    0 < α = num/den < 1: score(j) = −dist(num·n, [den·rank_j, den·rank_{j+1}]) (dist to an interval,
    0 inside it). Adding a unit's r values raises n by r and each rank_j by some i in [0, r] (rank_{j+1}
    by at least as much), so den·rank_j − num·n moves by den·i − num·r ∈ [−num·r, (den−num)·r], and
    num·n − den·rank_{j+1} likewise within [−(den−num)·r, num·r]: the L∞ sensitivity of the scores is
    r·max(num, den − num) (removal is the same change backwards). Scoring intervals rather than
    −|den·rank_j − num·n| costs nothing and keeps the answer right when many values share a grid point
    (ages): the point that holds the median scores 0, not a neighbour whose rank happens to be closer.

    MIN (α = 0) and MAX (α = 1). Taken literally, every candidate below the minimum would hold the
    target rank 0 and tie, and the answer would be uniform between the lower bound and the minimum.
    Width weights à la Smith 2011 do not help: on a regular grid they are equal, and they are what
    makes an empty stretch win in proportion to its length. What separates the minimum from an empty
    stretch is only ranks, so MIN targets a small rank t instead of 0: target min(t, n/2) (in half
    ranks: T = min(2t, n), intervals [2·rank_j, 2·rank_{j+1}]), MAX mirrors it (T = max(2n − 2t, n)).
    An empty stretch below the data then lies t ranks from the target, and t = ⌈x95⌉, with x95 the
    rank distance the noise reaches with probability 5% over K candidates (rank_error95's tail). So,
    in a group of n >= 2t values, with probability >= 95% the answer is not in an empty stretch beyond
    the data: MIN is at or above the grid floor of the true minimum with at most t + x95 <= 2t values
    below it (MAX mirrored). MIN/MAX therefore mean "a value near the t-th smallest (largest)", t being
    public (extreme_rank). For groups of fewer than 2t values the target becomes the median (n/2), and
    the 95% statement lapses: DP cannot tell the minimum of so few values apart from their middle.
    Sensitivity in half ranks: T moves by at most r and 2·rank by at most 2r, so 2r (exact).

    Per group, ε_group (or ρ_group) = the selector's share / g: a unit changes at most g groups'
    histograms and the others' draws are independent of it. `epsilon` / `rho` are the totals over those
    g groups from OpenDP's map (make_noisy_max: exponential noise under pure accounting, Gumbel noise
    under zCDP), at d_in = `sensitivity`.
    """

    alpha: Fraction
    candidates: int  # K
    max_contributions: int  # r
    max_groups: int  # g
    epsilon: float  # total over a unit's g groups (pure accounting), from the map; 0 under zCDP
    rho: float  # total over a unit's g groups (zCDP accounting), from the map; 0 under pure
    accounting: Accounting
    scale: float  # noise scale on the integer scores (per group)
    sensitivity: int  # L∞ sensitivity of the scores (the map's input)
    extreme_rank: int  # MIN/MAX: t, the target rank from the extreme; 0 for 0 < α < 1

    @property
    def is_extreme(self) -> bool:
        return self.alpha in (0, 1)

    def _width(self) -> int:
        """Score units per rank: den for 0 < α < 1, 2 (half ranks) for MIN/MAX."""
        return 2 if self.is_extreme else self.alpha.denominator

    def scores(self, bin_counts: Sequence[int]) -> list[int]:
        """The integer score of each candidate for one group's histogram (<= 0; 0 for the best)."""
        counts = _check_histogram(bin_counts, self.candidates, "a quantile histogram")
        n = sum(counts)
        width = self._width()
        if self.alpha == 0:
            target = min(2 * self.extreme_rank, n)
        elif self.alpha == 1:
            target = max(2 * (n - self.extreme_rank), n)
        else:
            target = self.alpha.numerator * n
        scores = []
        below = 0
        for count in counts:
            above = below + count
            low, high = width * below, width * above
            distance = low - target if target < low else max(0, target - high)
            scores.append(max(-distance, _SCORE_FLOOR))
            below = above
        return scores

    def select(self, bin_counts: Sequence[int]) -> int:
        """Index j of the released candidate c_j for ONE group (its histogram, as the class says)."""
        scores = self.scores(bin_counts)
        if len(scores) == 1:
            return 0
        measurement = _noisy_max_measurement(self.accounting, self.scale, False, 1)
        return int(measurement(scores))

    def rank_error95(self, n: int | None = None) -> float:
        """The rank error bound, in ranks, that holds with probability >= 95%.

        0 < α < 1: the released candidate's bin covers ranks within this distance of α·n (±).
        MIN / MAX: at most this many values lie below the MIN (above the MAX) released.
        From the union bound over the K − 1 other candidates (see above). `n`, when given, only caps
        the bound; pass a released (noisy) count, never the true one: the bound is shown to analysts.
        """
        tail = _selection_tail(self.scale, self.candidates) / self._width()
        if self.is_extreme:
            target = self.extreme_rank if n is None else min(self.extreme_rank, n / 2)
            bound = target + tail
            return bound if n is None else min(bound, float(n))
        if n is None:
            return tail
        return min(tail, float(max(self.alpha, 1 - self.alpha) * n))


@lru_cache(maxsize=1024)
def _quantile(
    alpha: Fraction,
    candidates: int,
    max_contributions: int,
    max_groups: int,
    accounting: Accounting,
    budget: float,
) -> QuantileSpec:
    _check_count("the number of quantile candidates", candidates)
    _check_unit_limits(max_contributions, max_groups)
    if alpha in (0, 1):
        sensitivity = 2 * max_contributions
    else:
        sensitivity = max_contributions * max(alpha.numerator, alpha.denominator - alpha.numerator)
    scale, per_group = _calibrate_selector(accounting, sensitivity, _even_share(budget, max_groups))
    total = _sum_up([per_group] * max_groups)
    extreme_rank = 0
    if alpha in (0, 1):
        extreme_rank = max(1, math.ceil(_selection_tail(scale, candidates) / 2))
    epsilon, rho = (total, 0.0) if accounting == Accounting.PURE else (0.0, total)
    return QuantileSpec(
        alpha,
        candidates,
        max_contributions,
        max_groups,
        epsilon,
        rho,
        accounting,
        scale,
        sensitivity,
        extreme_rank,
    )


def quantile_mechanism(
    alpha: Fraction | float,
    candidates: int,
    max_contributions: int,
    max_groups: int,
    epsilon: float | None = None,
    *,
    rho: float | None = None,
) -> QuantileSpec:
    """The α-quantile (MIN at α = 0, MAX at α = 1) per group, costing at most epsilon (pure
    accounting) or rho (zCDP accounting) over the g groups one unit can change. See QuantileSpec."""
    accounting, budget = _budget_arguments(epsilon, rho)
    return _quantile(_fraction(alpha), candidates, max_contributions, max_groups, accounting, budget)


@dataclass(frozen=True)
class ModeSpec:
    """MODE() WITHIN GROUP per group: report-noisy-max over a candidate value domain.

    The caller hands one group's counts per candidate value (after contribution bounding). Adding a
    unit adds at most r to those counts (possibly all to one candidate) and lowers none: L∞ sensitivity
    r, monotonic (OpenDP's monotonic L∞ map, ε = Δ/scale, half the general one). Per group the share
    is divided by g, as for quantiles; `epsilon` / `rho` are the totals from the map.
    """

    candidates: int  # K
    max_contributions: int  # r
    max_groups: int  # g
    epsilon: float
    rho: float
    accounting: Accounting
    scale: float
    sensitivity: int  # = r

    def select(self, counts: Sequence[int]) -> int:
        """Index of the released candidate for ONE group."""
        values = _check_histogram(counts, self.candidates, "mode counts")
        if len(values) == 1:
            return 0
        return int(_noisy_max_measurement(self.accounting, self.scale, True, 1)(_i64_scores(values)))

    def count_error95(self) -> float:
        """With probability >= 95%, the released candidate's count is within this of the top count."""
        return _selection_tail(self.scale, self.candidates)


@lru_cache(maxsize=1024)
def _mode(
    candidates: int, max_contributions: int, max_groups: int, accounting: Accounting, budget: float
) -> ModeSpec:
    _check_count("the number of mode candidates", candidates)
    _check_unit_limits(max_contributions, max_groups)
    scale, per_group = _calibrate_selector(
        accounting, max_contributions, _even_share(budget, max_groups), monotonic=True
    )
    total = _sum_up([per_group] * max_groups)
    epsilon, rho = (total, 0.0) if accounting == Accounting.PURE else (0.0, total)
    return ModeSpec(
        candidates, max_contributions, max_groups, epsilon, rho, accounting, scale, max_contributions
    )


def mode_mechanism(
    candidates: int,
    max_contributions: int,
    max_groups: int,
    epsilon: float | None = None,
    *,
    rho: float | None = None,
) -> ModeSpec:
    """MODE per group over `candidates` values, costing at most epsilon (pure) or rho (zCDP)."""
    accounting, budget = _budget_arguments(epsilon, rho)
    return _mode(candidates, max_contributions, max_groups, accounting, budget)


@dataclass(frozen=True)
class TopKSpec:
    """The k best-scoring candidates by one-shot report-noisy-top-k (Durfee & Rogers 2019; OpenDP
    make_noisy_top_k), for scores with L∞ sensitivity `sensitivity`: one unit changes any number of
    scores (e.g. the counts of all g groups it is in) by at most that much each. `monotonic` scores
    (counts: adding a unit never lowers one) halve the cost. Charged k·(per-pick cost), as the map says.
    """

    k: int
    sensitivity: int
    epsilon: float
    rho: float
    accounting: Accounting
    scale: float
    monotonic: bool

    def select(self, scores: Sequence[int]) -> list[int]:
        """Indexes of the chosen candidates, best first (k, or all when there are fewer)."""
        values = [int(s) for s in scores]
        if not values:
            return []
        if len(values) == 1:
            return [0]
        # Fewer picks at the same scale cost less than k picks: the charged cost covers them.
        picks = min(self.k, len(values))
        measurement = _noisy_max_measurement(self.accounting, self.scale, self.monotonic, picks)
        chosen = measurement(_i64_scores(values))
        return [int(chosen)] if picks == 1 else [int(i) for i in chosen]

    def score_error95(self, candidates: int) -> float:
        """With probability >= 95%, every chosen candidate's score is within this of the true k-th best.

        A chosen c below the k-th best by x leaves out some true top-k candidate d whose noisy score it
        beat: noise_c − noise_d > x, probability <= exp(−x/scale) for exponential or Gumbel noise;
        union over the k·(K − 1) pairs.
        """
        return _selection_tail(self.scale, candidates, self.k)


@lru_cache(maxsize=1024)
def _top_k(k: int, sensitivity: int, monotonic: bool, accounting: Accounting, budget: float) -> TopKSpec:
    _check_count("k of a top-k selection", k)
    _check_count("the sensitivity of top-k scores", sensitivity)
    scale, cost = _calibrate_selector(accounting, sensitivity, budget, monotonic=monotonic, k=k)
    epsilon, rho = (cost, 0.0) if accounting == Accounting.PURE else (0.0, cost)
    return TopKSpec(k, sensitivity, epsilon, rho, accounting, scale, monotonic)


def top_k_mechanism(
    k: int,
    sensitivity: int,
    epsilon: float | None = None,
    *,
    rho: float | None = None,
    monotonic: bool = False,
) -> TopKSpec:
    """Top-k by one-shot report-noisy-top-k, costing at most epsilon (pure) or rho (zCDP)."""
    accounting, budget = _budget_arguments(epsilon, rho)
    return _top_k(k, sensitivity, monotonic, accounting, budget)


@dataclass(frozen=True)
class QuantileRequest:
    """A quantile (MIN α = 0, MAX α = 1) per group that a query releases; see QuantileSpec."""

    alpha: Fraction
    candidates: int
    max_contributions: int
    max_groups: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", _fraction(self.alpha))


@dataclass(frozen=True)
class ModeRequest:
    """MODE() WITHIN GROUP per group that a query releases; see ModeSpec."""

    candidates: int
    max_contributions: int
    max_groups: int


@dataclass(frozen=True)
class TopKRequest:
    """A top-k selection a query releases (e.g. ORDER BY COUNT(*) DESC LIMIT k); see TopKSpec."""

    k: int
    sensitivity: int
    monotonic: bool = False


SelectorRequest = QuantileRequest | ModeRequest | TopKRequest
SelectorSpec = QuantileSpec | ModeSpec | TopKSpec


def _selector(request: SelectorRequest, accounting: Accounting, budget: float) -> SelectorSpec:
    if isinstance(request, QuantileRequest):
        return _quantile(
            request.alpha,
            request.candidates,
            request.max_contributions,
            request.max_groups,
            accounting,
            budget,
        )
    if isinstance(request, ModeRequest):
        return _mode(request.candidates, request.max_contributions, request.max_groups, accounting, budget)
    if isinstance(request, TopKRequest):
        return _top_k(request.k, request.sensitivity, request.monotonic, accounting, budget)
    raise InvalidParameter(f"unknown selection request {request!r}")


# --------------------------------------------------------------------------------------------------
# Randomized response


@lru_cache(maxsize=1)
def _randomized_response_bit() -> dp.Measurement:
    return dp.m.make_randomized_response_bool(RANDOMIZED_RESPONSE_TRUTH)


@lru_cache(maxsize=256)
def _randomized_response_bits(length: int) -> dp.Measurement:
    # RAPPOR's flip: with probability f a bit is replaced by a fair coin, so it is reported truthfully
    # with probability 1 − f/2: f = 1/2 is the survey protocol's 3/4, bit by bit, independently.
    return dp.m.make_randomized_response_bitvec(
        dp.bitvector_domain(max_weight=length), dp.discrete_distance(), f=2 * (1 - RANDOMIZED_RESPONSE_TRUTH)
    )


# Bernoulli(q) centred is sub-Gaussian with variance proxy (1 − 2q)/(2 ln((1 − q)/q)) (Kearns & Saul
# 1998, optimal; Berend & Kontorovich 2013): for q = 1/4 or 3/4, 1/(4 ln 3) ≈ 0.228 (Hoeffding: 1/4).
_RESPONSE_VARIANCE_PROXY = 1.0 / (4.0 * math.log(3.0))


@dataclass(frozen=True)
class RandomizedResponseSpec:
    """The classic survey protocol (Warner 1965): each unit's bit is reported truthfully with
    probability 3/4 (a fair coin says truth; else a second fair coin is the answer).

    What it guarantees: ε = ln 3 (OpenDP make_randomized_response_bool(3/4), its map at d_in = 1)
    against a change of one unit's bit, even to someone who sees every reported bit; the reports are
    a post-processing of each unit's own coin, so that holds for anything computed from them.
    What it does not: under add/remove of a unit (our neighbouring relation) the reports alone are not
    DP at all. The number of respondents n changes by one with certainty, and even the count of
    reported 1s alone gives it away in small groups (n = 0: no 1 is ever reported; n = 1: one is, with
    probability >= 1/4). RandomizedResponseCount adds what is needed for that.

    Estimator of the true count of 1s: E[reported 1s] = (3/4)m + (1/4)(n − m), so m = 2·reported − n/2.
    """

    epsilon: float  # ln 3, per unit, against a change of its bit (from the map)

    def respond(self, bits: Sequence[bool]) -> list[bool]:
        """Each bit reported through the protocol, independently (one OpenDP draw per bit)."""
        flags = np.fromiter((bool(b) for b in bits), dtype=bool)
        return [bool(b) for b in self._respond(flags)]

    def respond_tallies(self, ones: Sequence[int], zeros: Sequence[int]) -> list[int]:
        """Reported 1s per group of `ones[i]` units whose bit is 1 and `zeros[i]` whose bit is 0.

        The sum of independent reports depends on the bits only through these counts, so this is
        distributed exactly as responding unit by unit: a group's bits never need to leave the database.
        """
        ones_list = _check_histogram(ones, None, "tallies of 1s")
        zeros_list = _check_histogram(zeros, len(ones_list), "tallies of 0s")
        sizes = np.array([a + b for a, b in zip(ones_list, zeros_list, strict=True)], dtype=np.int64)
        ends = np.cumsum(sizes)
        starts = ends - sizes
        flags = np.zeros(int(ends[-1]) if len(ends) else 0, dtype=bool)
        for start, count in zip(starts.tolist(), ones_list, strict=True):
            flags[start : start + count] = True
        reported = np.concatenate([[0], np.cumsum(self._respond(flags), dtype=np.int64)])
        return [int(reported[end] - reported[start]) for start, end in zip(starts, ends, strict=True)]

    @staticmethod
    def _respond(flags: np.ndarray) -> np.ndarray:
        if len(flags) == 0:
            return flags
        packed = np.packbits(flags).tobytes()
        released = _randomized_response_bits(len(flags))(packed)
        return np.unpackbits(np.frombuffer(released, dtype=np.uint8), count=len(flags)).astype(bool)

    @staticmethod
    def estimate(reported_ones: float, n: float) -> float:
        """Unbiased estimate of the number of units whose bit is 1: 2·reported − n/2."""
        return 2.0 * reported_ones - n / 2.0

    @staticmethod
    def error95(n: float) -> float:
        """± on `estimate` from the protocol's coins alone, at 95%, for n respondents (sub-Gaussian
        tail with Kearns-Saul's variance proxy). Pass a released n, never the true one."""
        return _response_error(max(float(n), 0.0), ERROR_ALPHA)


def _response_error(n: float, alpha: float) -> float:
    # 2·Σ(Y_i − q_i): P(|Σ| >= s) <= 2·exp(−s²/(2nσ²)).
    return 2.0 * math.sqrt(2.0 * n * _RESPONSE_VARIANCE_PROXY * math.log(2.0 / alpha))


@lru_cache(maxsize=1)
def randomized_response() -> RandomizedResponseSpec:
    return RandomizedResponseSpec(_randomized_response_bit().map(1))


@dataclass(frozen=True)
class RandomizedResponseRelease:
    """One group's released tallies, and what is estimated from them."""

    reported_ones: int  # noisy tally of reported 1s
    reported_zeros: int  # noisy tally of reported 0s
    respondents: int  # their sum: the noisy number of units n
    estimate: float  # of the number of units whose bit is 1: 1.5·ones − 0.5·zeros
    error95: float  # ± on estimate, protocol coins and tally noise together, at 95%


@dataclass(frozen=True)
class RandomizedResponseCount:
    """A count of units whose bit is 1, by randomized response, that is DP under add/remove.

    Construction: every unit's bit goes through the protocol (RandomizedResponseSpec), then each group
    releases its two tallies, reported 1s and reported 0s, each with independent noise from `noise`
    (one component of sensitivity 1 over g groups). Adding a unit adds exactly 1 to one of the two
    tallies of each of its (at most g) groups, whatever its coins said, so the tally vector moves by
    L1 = g (L2 = √g): for every outcome of the unit's coins the release is ε-DP (or ρ-zCDP) by the
    noise's map, and so is the mixture over them. Hence the cost is noise.cost, δ = 0 under pure
    accounting, and nothing needs a tail bound on n. Per unit, against a change of its bit, the release
    is also at most ln 3-DP (g·ln 3 over g groups), being a post-processing of the reports, whatever the
    noise. Noising (reported 1s, n) instead would move by L1 = 2 per group, twice the noise.
    """

    response: RandomizedResponseSpec
    noise: QueryNoise  # one component (1, g); its cost is what the ledger charges

    @property
    def tally_noise(self) -> NoiseSpec:
        return self.noise.columns[0]

    def release(self, ones: Sequence[int], zeros: Sequence[int]) -> list[RandomizedResponseRelease]:
        """Per group: `ones[i]` units whose bit is 1, `zeros[i]` whose bit is 0 (distinct units)."""
        reported = self.response.respond_tallies(ones, zeros)
        draws = self.tally_noise.sample(2 * len(reported))
        # The error bound: tally noise within a on both tallies (probability >= 1 − 2·α/4), then n is
        # at most the released n + 2a, and the coins' part at that n holds with probability 1 − α/2.
        a = self.tally_noise.error_at(ERROR_ALPHA / 4)
        releases = []
        for i, (reported_ones, group_ones, group_zeros) in enumerate(zip(reported, ones, zeros, strict=True)):
            noisy_ones = reported_ones + draws[2 * i]
            noisy_zeros = int(group_ones) + int(group_zeros) - reported_ones + draws[2 * i + 1]
            respondents = noisy_ones + noisy_zeros
            error = _response_error(max(respondents, 0) + 2 * a, ERROR_ALPHA / 2) + 2 * a
            estimate = self.response.estimate(noisy_ones, respondents)
            releases.append(RandomizedResponseRelease(noisy_ones, noisy_zeros, respondents, estimate, error))
        return releases


def randomized_response_count_plan(
    epsilon: float,
    delta: float = 0.0,
    *,
    max_groups: int = 1,
    mechanism: Mechanism | str = Mechanism.LAPLACE,
    accounting: Accounting | str = Accounting.PURE,
) -> RandomizedResponseCount:
    """The plan of a randomized-response count over groups (see RandomizedResponseCount), within the
    request's (epsilon, delta) as plan_query_noise splits it. A query releasing more than this count
    can instead pass the component (1, max_groups) to plan_query_noise itself and draw two values of
    that component's noise per group."""
    noise = plan_query_noise(mechanism, epsilon, delta, [(1, max_groups)], None, accounting=accounting)
    return RandomizedResponseCount(randomized_response(), noise)


# --------------------------------------------------------------------------------------------------
# One query


@dataclass(frozen=True)
class QueryNoise:
    columns: tuple[NoiseSpec, ...]  # one per released aggregate component, in the order requested
    selection: SelectionSpec | None
    cost: Cost  # what the ledger charges: (ε, δ) under pure accounting; (ρ, δ) (+ display ε) under zCDP
    selectors: tuple[SelectorSpec, ...] = ()  # one per SelectorRequest, in the order requested
    accounting: Accounting = Accounting.PURE
    conversion_delta: float = 0.0  # zCDP: the δ at which cost.epsilon holds (the request's)

    @property
    def approx_dp(self) -> Cost:
        """The (ε, δ) this query alone satisfies, for display."""
        if self.accounting == Accounting.PURE:
            return Cost(self.cost.epsilon, self.cost.delta)
        return Cost(self.cost.epsilon, self.conversion_delta)


def plan_query_noise(
    mechanism: Mechanism | str,
    epsilon: float,
    delta: float,
    components: Sequence[tuple[int, int]],
    selection_groups: int | None,
    *,
    accounting: Accounting | str = Accounting.PURE,
    selectors: Sequence[SelectorRequest] = (),
) -> QueryNoise:
    """The noise for every value a query releases, and what the query costs.

    `components` holds (sensitivity, max_groups) per released aggregate component, in grid units;
    `selection_groups` is g for partition selection, None when every key is public or there is no
    GROUP BY; `selectors` the quantiles, modes and top-k selections the query releases.

    Rules:
    * ε is split equally over the k components, the s selectors, and one share for partition
      selection if present. Shares are rounded down so that their upward-rounded sum is within ε.
    * Selectors (pure accounting) get ε_i = share, as their map says (per group share/g for
      quantiles and modes).
    * Laplace: each component gets ε_i = share; its scale starts at b = d_in/ε_i and grows by tiny
      factors until the OpenDP map is <= ε_i.
    * Selection gets its ε share and all of δ (Laplace) or half of δ (Gaussian); its threshold is the
      smallest integer, from ceil(1 + b·ln(g/(2δ))) (Wilson et al. 2020) upwards, whose OpenDP map
      gives δ <= its δ share. With no component to pay for, selection gets all of ε and δ.
    * Gaussian (pure accounting): the components together must convert to (ε_rest, δ_rest), ε_rest =
      ε minus the selection's and selectors' shares, δ_rest = δ minus the selection's δ share. The total
      ρ is the largest (found by bracketing and regula falsi) whose OpenDP zCDP → (ε, δ) conversion gives
      ε <= ε_rest at δ_rest; each component gets ρ/k and σ from its map (starting at σ = d_in/√(2ρ_i)).
      Cost = Σ Laplace map ε + selectors' and selection's map (ε, δ) + the OpenDP conversion of the
      components' summed ρ at δ_rest.
    * zCDP accounting (`mechanism` is then ignored: every component is discrete Gaussian): partition
      selection is Gaussian (make_gaussian_threshold) and gets half of δ as its approximate-zCDP δ; the
      rest of δ, δ_conv, is for converting. The query's ρ is the largest whose conversion at δ_conv is
      <= ε, split equally (in ρ) over components, selectors and selection. Cost = (Σ map ρ, selection's
      map δ), with epsilon = the OpenDP conversion of that ρ at δ − that δ: the query alone is
      (epsilon, δ)-DP.
    * The cost never exceeds (epsilon, delta) (converted, under zCDP); that is checked, not assumed.

    Impossible requests raise InvalidParameter. Results are cached: the same request is a lookup.
    """
    if not isinstance(mechanism, Mechanism):
        try:
            mechanism = Mechanism(mechanism)
        except ValueError:
            raise InvalidParameter(
                f"unknown noise mechanism {mechanism!r}: use laplace or gaussian"
            ) from None
    accounting = _accounting(accounting)
    _check_positive("epsilon", epsilon)
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 <= delta < 1:
        raise InvalidParameter(f"delta must be a number >= 0 and < 1, not {delta!r}")
    frozen = tuple((sensitivity, max_groups) for sensitivity, max_groups in components)
    for sensitivity, max_groups in frozen:
        _check_unit_limits(sensitivity, max_groups)
    requests = tuple(selectors)
    for request in requests:
        if not isinstance(request, QuantileRequest | ModeRequest | TopKRequest):
            raise InvalidParameter(f"unknown selection request {request!r}")
    if selection_groups is not None:
        _check_unit_limits(1, selection_groups)
        if delta == 0:
            raise InvalidParameter(
                "partition selection for GROUP BY keys without public_values needs delta > 0: "
                "set defaults.delta in the policy",
                hint="or declare public_values for the GROUP BY columns: their keys need no selection",
            )
    if accounting == Accounting.ZCDP:
        if delta == 0 and (frozen or requests):
            raise InvalidParameter(
                "zCDP accounting needs delta > 0 to convert ρ into (ε, δ): set defaults.delta in the policy",
                hint="or use pure accounting with mechanism: laplace, which needs no delta",
            )
        mechanism = Mechanism.GAUSSIAN
    elif mechanism == Mechanism.GAUSSIAN and frozen and delta == 0:
        raise InvalidParameter(
            "the gaussian mechanism needs delta > 0: set defaults.delta in the policy",
            hint="or use mechanism: laplace, which needs no delta",
        )
    return _plan(mechanism, accounting, float(epsilon), float(delta), frozen, selection_groups, requests)


@lru_cache(maxsize=4096)
def _plan(
    mechanism: Mechanism,
    accounting: Accounting,
    epsilon: float,
    delta: float,
    components: tuple[tuple[int, int], ...],
    selection_groups: int | None,
    requests: tuple[SelectorRequest, ...],
) -> QueryNoise:
    if accounting == Accounting.ZCDP:
        return _plan_zcdp(epsilon, delta, components, selection_groups, requests)
    k = len(components)
    shares = k + len(requests) + (1 if selection_groups is not None else 0)
    if shares == 0:
        return QueryNoise((), None, Cost.ZERO)
    share = _even_share(epsilon, shares)
    selectors = tuple(_selector(request, Accounting.PURE, share) for request in requests)
    cost = Cost.ZERO
    for selector in selectors:
        cost = cost + Cost(selector.epsilon)

    if mechanism == Mechanism.LAPLACE:
        columns = tuple(laplace_noise(s, g, share) for s, g in components)
        selection = None if selection_groups is None else partition_selection(selection_groups, share, delta)
        for column in columns:
            cost = cost + Cost(column.epsilon)
        if selection is not None:
            cost = cost + Cost(selection.epsilon, selection.delta)
    else:
        selection = None
        epsilon_rest, delta_rest = epsilon, delta
        pure_shares = len(requests) + (1 if selection_groups is not None else 0)
        if selection_groups is not None:
            delta_share = delta if k == 0 else delta / 2.0
            selection = partition_selection(selection_groups, share, delta_share)
            delta_rest = _remainder(delta, delta_share)
            cost = cost + Cost(selection.epsilon, selection.delta)
        if pure_shares:
            epsilon_rest = _remainder(epsilon, _sum_up([share] * pure_shares))
        columns = ()
        if k:
            rho = _rho_for(epsilon_rest, delta_rest)
            columns = tuple(gaussian_noise(s, g, _even_share(rho, k)) for s, g in components)
            total_rho = _sum_up([column.rho for column in columns])
            cost = cost + Cost(zcdp_to_approx_dp(total_rho, delta_rest), delta_rest)

    if not (cost.epsilon <= epsilon and cost.delta <= delta):
        raise AssertionError(f"planned cost {cost} exceeds the requested (ε={epsilon!r}, δ={delta!r})")
    return QueryNoise(columns, selection, cost, selectors)


def _plan_zcdp(
    epsilon: float,
    delta: float,
    components: tuple[tuple[int, int], ...],
    selection_groups: int | None,
    requests: tuple[SelectorRequest, ...],
) -> QueryNoise:
    shares = len(components) + len(requests) + (1 if selection_groups is not None else 0)
    if shares == 0:
        return QueryNoise((), None, Cost.ZERO, (), Accounting.ZCDP)
    # Partition selection's δ is spent for sure (up to half of δ); the rest converts ρ into ε.
    selection = None
    native_delta = 0.0
    spent_rho: list[float] = []
    if selection_groups is None:
        share = _even_share(_rho_for(epsilon, delta), shares)
    else:
        delta_selection = delta / 2.0
        share = _even_share(_rho_for(epsilon, _remainder(delta, delta_selection)), shares)
        selection = gaussian_partition_selection(selection_groups, share, delta_selection)
        native_delta = selection.delta
        spent_rho.append(selection.rho)
        if shares > 1:
            # Its integer threshold spends less δ than half: what is left converts into more ρ, which
            # the other values share.
            total = _rho_for(epsilon, _remainder(delta, native_delta))
            share = max(share, _even_share(_remainder(total, selection.rho), shares - 1))
    columns = tuple(gaussian_noise(s, g, share) for s, g in components)
    selectors = tuple(_selector(request, Accounting.ZCDP, share) for request in requests)
    rho = _sum_up(spent_rho + [c.rho for c in columns] + [s.rho for s in selectors])
    converted = zcdp_to_approx_dp(rho, _remainder(delta, native_delta))
    cost = Cost(converted, native_delta, rho)
    if not (converted <= epsilon and native_delta < delta):
        raise AssertionError(f"planned cost {cost} exceeds the requested (ε={epsilon!r}, δ={delta!r})")
    return QueryNoise(columns, selection, cost, selectors, Accounting.ZCDP, delta)


def _remainder(total: float, spent: float) -> float:
    """The largest r <= total - spent with spent + r (rounded up) <= total."""
    rest = total - spent
    while _add_up(spent, rest) > total:
        rest = math.nextafter(rest, 0.0)
    return rest
