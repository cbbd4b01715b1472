"""DP partition selection: which group keys that are not public are released.

This module owns SelectionSpec: noise on each group's count of distinct units and a threshold, the
(ε, δ) (Laplace, pure accounting) or approximate-zCDP (ρ, δ) (discrete Gaussian, zCDP accounting)
of releasing the groups whose noisy count reaches it, read from OpenDP's maps with the workaround
_THRESHOLD_MAP_SHIFT explains, and the search for the smallest threshold that fits a δ. The noise is
drawn in bulk by dpproxy.privacy.sampling, from the distribution OpenDP's threshold measurement
draws (docs/privacy.md §5, "How the released set is drawn"); OpenDP's measurements give its
calibration and δ only.

It never sees group keys, values or SQL: only counts of units per group, by position, and it returns
the positions released.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dpproxy.errors import InvalidParameter
from dpproxy.policy import Mechanism
from dpproxy.privacy import opendp_names as dp
from dpproxy.privacy.calibration import calibrate_scale
from dpproxy.privacy.checks import check_positive, check_unit_limits
from dpproxy.privacy.sampling import BytesSource, sample_discrete_gaussian, sample_discrete_laplace

# Partition selection looks for its threshold at most this many noise scales above its starting
# point, where δ has fallen by e^-60 more: beyond, OpenDP's rounding floor is what stops it, not τ.
_SELECTION_SEARCH_SCALES = 60

_I64_COUNTS_BY_GROUP = dp.map_domain(dp.atom_domain(T="i64"), dp.atom_domain(T="i64"))


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


@dataclass(frozen=True)
class SelectionSpec:
    """DP partition selection for group keys that are not public.

    Noise on each group's count of distinct units; a group is released when its noisy count reaches
    the threshold. Laplace (pure accounting): OpenDP make_laplace_threshold, map input (l0, l1, l∞) =
    (g, g, 1): one unit is in at most g groups and adds one to each of their counts; cost (ε, δ).
    Gaussian (zCDP accounting): OpenDP make_gaussian_threshold, map input (l0, l2, l∞) = (g, g, 1)
    (OpenDP tightens l2 to √g·l∞), cost δ-approximate ρ-zCDP (Rogers 2023); under pure accounting a
    Gaussian spec carries that cost converted into (ε, δ) as well (privacy/planning.pure_selection).
    """

    max_groups: int
    scale: float
    threshold: int
    epsilon: float  # from the OpenDP map (Laplace); 0 for Gaussian, or its ρ converted (pure accounting)
    delta: float  # from the OpenDP map, read as _selection_map explains
    mechanism: Mechanism = Mechanism.LAPLACE
    rho: float = 0.0  # from the OpenDP map (Gaussian); 0 for Laplace

    def select(self, unit_counts: Sequence[int], bytes_source: BytesSource = os.urandom) -> list[int]:
        """Indexes (ascending) of the groups released. Counts are distinct units per group.

        The group of count c is released when c + Z >= threshold, Z drawn independently per group
        from the discrete Laplace (b = scale) or discrete Gaussian (σ = scale), the scale read as an
        exact rational: what OpenDP's make_laplace_threshold / make_gaussian_threshold on i64 counts
        do (they add Z to c exactly, as big integers, and keep the pairs not below the threshold),
        so the released set has their distribution, and their maps' (ε, δ) or (ρ, δ) hold for it
        (docs/privacy.md §5, "How the released set is drawn"). `bytes_source` is for tests only.
        """
        n = len(unit_counts)
        if n == 0:
            return []
        try:
            counts = np.fromiter(unit_counts, dtype=np.int64, count=n)
        except OverflowError:  # beyond int64 (no table has that many units): exact Python ints
            counts = np.array([int(c) for c in unit_counts], dtype=object)
        # No value in the message: counts are read from protected tables.
        if (counts < 0).any():
            raise ValueError("unit counts must be >= 0")
        if self.mechanism == Mechanism.LAPLACE:
            noise = sample_discrete_laplace(self.scale, n, bytes_source)
        else:
            noise = sample_discrete_gaussian(self.scale, n, bytes_source)
        # c + Z >= threshold, written so that no int64 overflows: threshold − c >= threshold − 2^63 + 1.
        # A group no unit is counted in is never released: the measurement's keys are those the data
        # has. With g chosen below the group ceiling, a group that persons rank only past their first
        # g is in the statement's rows with a count of 0; released on Z >= threshold, it would exist
        # on D and not on D minus one of them, a δ no threshold paid for (docs/privacy.md §5).
        released = (noise >= self.threshold - counts) & (counts > 0)
        return np.flatnonzero(released).tolist()


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
# tests/privacy/test_selection.py compares δ with the exact release probability either way.
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
    check_unit_limits(1, max_groups)
    check_positive("epsilon", epsilon)
    check_positive("delta", delta)
    scale = calibrate_scale(
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
    check_unit_limits(1, max_groups)
    check_positive("rho", rho)
    check_positive("delta", delta)
    guess_at = lambda sigma: max(2, math.ceil(2.0 + sigma * math.sqrt(2.0 * math.log(max_groups / delta))))  # noqa: E731
    scale = calibrate_scale(
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
