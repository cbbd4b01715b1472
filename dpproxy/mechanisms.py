"""The maths of privacy, in one place: samplers, calibration, privacy cost, thresholds, error bounds.

This module owns how a query's (ε, δ) is split over the values it releases, the noise scale each of
them gets, the threshold of DP partition selection, the 95% error bound shown to analysts, and the
draws themselves. It never sees SQL, policies or data rows: only sensitivities, group limits and the
numeric vectors handed to it (unit counts for partition selection).

Two rules keep it honest:

* Everything random comes from OpenDP: discrete Laplace / discrete Gaussian samplers on integers
  (exact, no floating-point noise, so no Mironov-style attacks) drawing from the OS CSPRNG.
* Every privacy cost is read from an OpenDP measurement's privacy map (`meas.map(d_in)`). Textbook
  formulas (REFERENCES.md) only give a starting parameter; the map then has the last word, and the
  parameter is nudged until the map says the cost fits. OpenDP rounds maps up (`map(3)` at Laplace
  scale 10 is 0.30000000000000004), so the nudging is not cosmetic. One known OpenDP bug is worked
  around, still with OpenDP's own map: see _THRESHOLD_MAP_SHIFT.

Released values live on an integer grid (counts, integer sums, fixed-point sums scaled by 10^s), so
noise is an integer vector that callers add with Python ints: no saturation, no rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import ClassVar

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

# Partition selection looks for its threshold at most this many noise scales above Wilson's τ,
# where δ has fallen by e^-60 more: beyond, OpenDP's rounding floor is what stops it, not τ.
_SELECTION_SEARCH_SCALES = 60

# OpenDP's L1 distance on i64 vectors is itself an i64.
_MAX_L1_SENSITIVITY = 2**62

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


@dataclass(frozen=True)
class Cost:
    """What one query costs, or what a budget holds: (ε, δ) under sequential composition.

    `a + b` rounds up, one ulp at most, so a sum of costs is never below the exact sum.
    """

    epsilon: float
    delta: float = 0.0

    ZERO: ClassVar[Cost]

    def __post_init__(self) -> None:
        # Infinite limits are allowed (an unlimited budget); NaN would make every comparison false.
        for name, value in (("epsilon", self.epsilon), ("delta", self.delta)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"Cost.{name} must be a number, not {type(value).__name__}")
            if math.isnan(value) or value < 0:
                raise ValueError(f"Cost.{name} must be a number >= 0, not {value!r}")

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(_add_up(self.epsilon, other.epsilon), _add_up(self.delta, other.delta))

    def fits_within(self, limit: Cost) -> bool:
        """ε and δ are each at most the limit's, forgiving FIT_RELATIVE_TOLERANCE of float rounding."""
        scale = 1.0 + FIT_RELATIVE_TOLERANCE
        return self.epsilon <= limit.epsilon * scale and self.delta <= limit.delta * scale


Cost.ZERO = Cost(0.0, 0.0)


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
        if self.mechanism == Mechanism.LAPLACE:
            return _laplace_error(self.scale)
        return _gaussian_error(self.scale)


@lru_cache(maxsize=4096)
def _laplace_error(scale: float) -> float:
    # The helper's accuracy a has P(|Z| >= a) = α; for an integer Z, |Z| <= floor(a) iff |Z| < a
    # (or a is itself an integer and the event is larger), so floor(a) keeps the coverage.
    return float(math.floor(dp.discrete_laplacian_scale_to_accuracy(scale, ERROR_ALPHA)))


@lru_cache(maxsize=4096)
def _gaussian_error(scale: float) -> float:
    if scale <= _DISCRETE_GAUSSIAN_ACCURACY_MAX_SCALE:
        return float(math.floor(dp.discrete_gaussian_scale_to_accuracy(scale, ERROR_ALPHA)))
    # For larger σ use the continuous helper's a (P(|Y| >= a) = α for Y ~ N(0, σ²)) rounded up:
    # for an integer m >= 1, P(Z >= m) = Σ_{k>=m} exp(-k²/2σ²) / N with N >= √(2π)·σ (Poisson
    # summation, Canonne-Kamath-Steinke 2020), and the sum of a decreasing function is at most its
    # integral from m - 1; so P(|Z| >= e + 1) <= P(|Y| >= e) <= α once e >= a.
    return float(math.ceil(dp.gaussian_scale_to_accuracy(scale, ERROR_ALPHA)))


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


@lru_cache(maxsize=4096)
def laplace_noise(sensitivity: int, max_groups: int, epsilon: float) -> NoiseSpec:
    """Discrete Laplace noise whose OpenDP map, at L1 = g·sensitivity, is at most epsilon.

    Starts at b = L1/ε (REFERENCES.md) and nudges b up until the map agrees.
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

    Laplace noise on each group's count of distinct units; a group is released when its noisy count
    reaches the threshold (OpenDP make_laplace_threshold; map input (l0, l1, linf) = (g, g, 1): one
    unit is in at most g groups and adds one to each of their counts).
    """

    max_groups: int
    scale: float
    threshold: int
    epsilon: float  # from the OpenDP map
    delta: float  # from the OpenDP map

    def select(self, unit_counts: Sequence[int]) -> list[int]:
        """Indexes (in input order) of the groups released. Counts are distinct units per group."""
        counts = {i: int(c) for i, c in enumerate(unit_counts)}
        # No value in the message: counts are read from protected tables.
        if any(c < 0 for c in counts.values()):
            raise ValueError("unit counts must be >= 0")
        if not counts:
            return []
        return sorted(_threshold_measurement(self.scale, self.threshold)(counts))


# OpenDP 0.16 understates make_laplace_threshold's δ (opendp/opendp#2922, open): the measurement
# releases a group when count + Z >= threshold, so a group only one unit is in (count 1) comes out
# with probability P[Z >= threshold - 1], but the map charges the tail beyond the threshold's own
# distance, P[Z > threshold - 1] = P[Z >= threshold], a factor e^(1/b) too small (e^ε at g = 1).
# The map of the same measurement one step lower charges exactly the right tail, so that is the δ
# taken for a threshold. If OpenDP fixes the bug this over-charges by that factor: safe, and
# tests/test_mechanisms.py compares δ with the exact release probability either way.
_THRESHOLD_MAP_SHIFT = 1


def _selection_map(max_groups: int, scale: float, threshold: int) -> tuple[float, float]:
    """(ε, δ) of releasing groups whose noisy unit count reaches `threshold` (>= 2), from OpenDP maps."""
    d_in = (max_groups, max_groups, 1)
    epsilon, _ = _threshold_measurement(scale, threshold).map(d_in)
    _, delta = _threshold_measurement(scale, threshold - _THRESHOLD_MAP_SHIFT).map(d_in)
    return epsilon, delta


def _wilson_threshold(max_groups: int, scale: float, delta: float) -> int:
    """τ = 1 + b·ln(g/(2δ)) rounded up (REFERENCES.md, Wilson et al. 2020); at least 2.

    At least 2 because a group of one unit must not be released for sure, and because the shifted
    map (see _THRESHOLD_MAP_SHIFT) needs a threshold of at least the l-infinity distance, 1.
    """
    return max(2, math.ceil(1.0 + scale * math.log(max_groups / (2.0 * delta))))


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
        ceiling = start + math.ceil(_SELECTION_SEARCH_SCALES * scale)
        if not fits(ceiling):
            raise InvalidParameter(
                f"delta {delta:g} is too small for partition selection over up to {max_groups} group(s) "
                "per unit: OpenDP cannot certify it: raise defaults.delta in the policy",
                hint="or declare public_values for the GROUP BY columns, or lower max_groups_per_unit",
            )
        # δ falls geometrically in the threshold: gallop up, then bisect (not_fit < answer <= fit).
        not_fit, fit = start, ceiling
        step = 1
        while start + step < ceiling:
            if fits(start + step):
                fit = start + step
                break
            not_fit = start + step
            step *= 2
        while fit - not_fit > 1:
            middle = (not_fit + fit) // 2
            if fits(middle):
                fit = middle
            else:
                not_fit = middle
        threshold = fit
    eps, dlt = _selection_map(max_groups, scale, threshold)
    return SelectionSpec(max_groups, scale, threshold, eps, dlt)


# --------------------------------------------------------------------------------------------------
# One query


@dataclass(frozen=True)
class QueryNoise:
    columns: tuple[NoiseSpec, ...]  # one per released aggregate component, in the order requested
    selection: SelectionSpec | None
    cost: Cost  # the total (ε, δ) the ledger charges for the query


def plan_query_noise(
    mechanism: Mechanism,
    epsilon: float,
    delta: float,
    components: Sequence[tuple[int, int]],
    selection_groups: int | None,
) -> QueryNoise:
    """The noise for every value a query releases, and what the query costs.

    `components` holds (sensitivity, max_groups) per released aggregate component, in grid units;
    `selection_groups` is g for partition selection, None when every key is public or there is no
    GROUP BY.

    Rules:
    * ε is split equally over the k components, plus one share for partition selection if present
      (k + 1 shares). Shares are rounded down so that their upward-rounded sum is within ε.
    * Laplace: each component gets ε_i = share; its scale starts at b = d_in/ε_i and grows by tiny
      factors until the OpenDP map is <= ε_i.
    * Selection gets its ε share and all of δ (Laplace) or half of δ (Gaussian); its threshold is the
      smallest integer, from ceil(1 + b·ln(g/(2δ))) (Wilson et al. 2020) upwards, whose OpenDP map
      gives δ <= its δ share. With no component to pay for, selection gets all of ε and δ.
    * Gaussian (zCDP): the components together must convert to (ε_rest, δ_rest), ε_rest = ε minus the
      selection's share, δ_rest = δ minus the selection's δ share. The total ρ is the largest (found by
      bracketing and regula falsi) whose OpenDP zCDP → (ε, δ) conversion gives ε <= ε_rest at δ_rest;
      each component gets ρ/k and σ from its map (starting at σ = d_in/√(2ρ_i)).
    * Cost = Σ Laplace map ε + selection map (ε, δ) + the OpenDP conversion of the components' summed
      ρ at δ_rest. It never exceeds (epsilon, delta); that is checked, not assumed.

    Impossible requests raise InvalidParameter. Results are cached: the same request is a lookup.
    """
    if not isinstance(mechanism, Mechanism):
        try:
            mechanism = Mechanism(mechanism)
        except ValueError:
            raise InvalidParameter(
                f"unknown noise mechanism {mechanism!r}: use laplace or gaussian"
            ) from None
    _check_positive("epsilon", epsilon)
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 <= delta < 1:
        raise InvalidParameter(f"delta must be a number >= 0 and < 1, not {delta!r}")
    frozen = tuple((sensitivity, max_groups) for sensitivity, max_groups in components)
    for sensitivity, max_groups in frozen:
        _check_unit_limits(sensitivity, max_groups)
    if selection_groups is not None:
        _check_unit_limits(1, selection_groups)
        if delta == 0:
            raise InvalidParameter(
                "partition selection for GROUP BY keys without public_values needs delta > 0: "
                "set defaults.delta in the policy",
                hint="or declare public_values for the GROUP BY columns: their keys need no selection",
            )
    if mechanism == Mechanism.GAUSSIAN and frozen and delta == 0:
        raise InvalidParameter(
            "the gaussian mechanism needs delta > 0: set defaults.delta in the policy",
            hint="or use mechanism: laplace, which needs no delta",
        )
    return _plan(mechanism, float(epsilon), float(delta), frozen, selection_groups)


@lru_cache(maxsize=4096)
def _plan(
    mechanism: Mechanism,
    epsilon: float,
    delta: float,
    components: tuple[tuple[int, int], ...],
    selection_groups: int | None,
) -> QueryNoise:
    k = len(components)
    shares = k + (1 if selection_groups is not None else 0)
    if shares == 0:
        return QueryNoise((), None, Cost.ZERO)
    share = _even_share(epsilon, shares)

    if mechanism == Mechanism.LAPLACE:
        columns = tuple(laplace_noise(s, g, share) for s, g in components)
        selection = None if selection_groups is None else partition_selection(selection_groups, share, delta)
        cost = Cost.ZERO
        for column in columns:
            cost = cost + Cost(column.epsilon)
        if selection is not None:
            cost = cost + Cost(selection.epsilon, selection.delta)
    else:
        selection = None
        epsilon_rest, delta_rest = epsilon, delta
        if selection_groups is not None:
            delta_share = delta if k == 0 else delta / 2.0
            selection = partition_selection(selection_groups, share, delta_share)
            epsilon_rest = _remainder(epsilon, share)
            delta_rest = _remainder(delta, delta_share)
        cost = Cost.ZERO if selection is None else Cost(selection.epsilon, selection.delta)
        columns = ()
        if k:
            rho = _rho_for(epsilon_rest, delta_rest)
            columns = tuple(gaussian_noise(s, g, _even_share(rho, k)) for s, g in components)
            total_rho = _sum_up([column.rho for column in columns])
            cost = cost + Cost(zcdp_to_approx_dp(total_rho, delta_rest), delta_rest)

    if not (cost.epsilon <= epsilon and cost.delta <= delta):
        raise AssertionError(f"planned cost {cost} exceeds the requested (ε={epsilon!r}, δ={delta!r})")
    return QueryNoise(columns, selection, cost)


def _remainder(total: float, spent: float) -> float:
    """The largest r <= total - spent with spent + r (rounded up) <= total."""
    rest = total - spent
    while _add_up(spent, rest) > total:
        rest = math.nextafter(rest, 0.0)
    return rest
