"""AVG's 95% interval by inverting a test on its noisy sum and count (docs/privacy.md §6, "95% error
bars").

An average is released as c + Ŝ/N̂ from a noisy centred sum Ŝ = S + X and a noisy count N̂ = N + Y
(grid units; X and Y independent). Interval arithmetic bounds X and Y each at 97.5% and divides the
boxes, which adds the two noises' half-widths where one variable matters: at the true mean offset
μ = S/N, Ŝ − μN̂ = X − μY exactly, whose law depends on μ alone. Every μ at which |Ŝ − μN̂| lies
beyond a 95% bound of |X − μY| is rejected; the μ not rejected hold the true one with probability
>= 95% (a confidence set by test inversion, as Fieller's for a ratio of normal means). The bounds:

- discrete Laplace (scales b_X, b_Y): under the quantile coupling a discrete Laplace's |X| lies within
  [E − 1, E + 1/2] of an exponential E of the same scale, so X lies within 1 of a continuous Laplace
  L_X and P(|X − μY| >= u) <= P(|L_X − μL_Y| >= u − 1 − |μ|); two independent Laplace variables of
  scales β1 >= β2 > 0 have P(|L1 + L2| >= v) = (β1²e^(−v/β1) − β2²e^(−v/β2)) / (β1² − β2²) (their
  characteristic functions' product split into partial fractions);
- discrete Gaussian (σ_X, σ_Y): each is σ²-subgaussian (Canonne, Kamath & Steinke 2020), so X − μY is
  (σ_X² + μ²σ_Y²)-subgaussian and P(|X − μY| >= v) <= 2·exp(−v²/(2(σ_X² + μ²σ_Y²))).

A component computed on the fine grid and brought back to its own is its fine noise divided by FINE
plus a rounding of at most 1/2: its slack is 1/2 + 1/FINE (Laplace) or 1/2 (Gaussian) instead of 1
or 0, with the fine scale divided by FINE.

Both bounds fall as u grows and grow with |μ| (for the first by Anderson's inequality: a symmetric
unimodal law spread wider puts more mass outside a symmetric interval). The hull of the set not
rejected is found by cells: a cell [m1, m2] above Ŝ/N̂ holds no μ that is not rejected when the bound
at u = m1·N̂ − Ŝ and |μ| = max(|m1|, |m2|) is at most 5%. From the interval arithmetic's end inwards,
the span is split 4 ways three times, each time into the highest cell not ruled out, so the end kept
is at most 1/64 of the way beyond the exact hull's.

The interval released is the intersection with the interval arithmetic's, which is the set its own
test (|Ŝ − μN̂| <= e_X + |μ|·e_Y, each e at 97.5%) does not reject: the intersection is the set not
rejected by the test whose threshold at each μ is the smaller of the two, and P(|X − μY| > min(t1, t2))
is one of the two tails, each at most 5%. So it is never wider, and still holds the true mean with
probability >= 95% in every group. Floats are used with allowances far above their rounding (every
cell test is made more lenient, every end moved outwards): the ends are bounds, not estimates.

It sees noisy values, scales and bounds only: never a true value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpproxy.policy import Mechanism
from dpproxy.privacy import ERROR_ALPHA, QueryNoise
from dpproxy.sql.query import FINE, Aggregate

_SPLIT = 4  # cells per refinement
_LEVELS = 3  # refinements: the end is within (1/4)^3 of the searched span beyond the exact hull's
_SAFE = 1e-9  # relative allowance for float rounding, far above the ~1e-14 these few operations make


@dataclass(frozen=True)
class RatioNoise:
    """The noise of an AVG's centred sum (X) and count (Y), in their own grid units: scales (Laplace b
    or Gaussian σ) and slacks (what rounding and discreteness add to the continuous law bounded)."""

    gaussian: bool
    sum_scale: float
    count_scale: float
    sum_slack: float
    count_slack: float

    def tail(self, u: np.ndarray, r: np.ndarray) -> np.ndarray:
        """An upper bound on P(|X − rY| >= u), elementwise (r >= 0), rounded up."""
        v = u - self.sum_slack - r * self.count_slack
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            if self.gaussian:
                variance = self.sum_scale**2 + (r * self.count_scale) ** 2
                bound = 2.0 * np.exp(-(v * v) / (2.0 * variance))
            else:
                first, second = self.sum_scale, r * self.count_scale
                big, small = np.maximum(first, second), np.minimum(first, second)
                ratio = v / big
                # (β1²e^(−v/β1) − β2²e^(−v/β2))/(β1² − β2²) = e^(−v/β1)·(1 + φ(d)·(v/β1)·β2/(β1 + β2)),
                # d = v(1/β2 − 1/β1), φ(d) = (1 − e^(−d))/d: no cancellation when β1 ≈ β2.
                d = np.where(small > 0, v * (big - small) / (big * np.where(small > 0, small, 1.0)), np.inf)
                phi = np.where(d < 1e-8, 1.0 - d / 2, -np.expm1(-d) / np.where(d > 0, d, 1.0))
                phi = np.where(np.isinf(d), 0.0, phi)
                bound = np.exp(-ratio) * (1.0 + phi * ratio * (small / (big + small)))
            bound = np.where(v > 0, bound * (1 + _SAFE), 1.0)
        return np.where(np.isnan(bound), 1.0, bound)

    def _ruled_out(self, sums: np.ndarray, counts: np.ndarray, m1: np.ndarray, m2: np.ndarray) -> np.ndarray:
        """Whether no μ in [m1, m2] (all above Ŝ/N̂) escapes rejection at 5%."""
        product = m1 * counts
        u = (product - sums) - _SAFE * (np.abs(product) + np.abs(sums))
        r = np.maximum(np.abs(m1), np.abs(m2)) * (1 + _SAFE)
        return self.tail(u, r) <= ERROR_ALPHA

    def upper_ends(
        self, sums: np.ndarray, counts: np.ndarray, low: np.ndarray, high: np.ndarray
    ) -> np.ndarray:
        """Per group, an m <= high above which no μ in [low, high] escapes rejection (counts > 0)."""
        centre = np.clip(sums / counts, low, high)
        bottom, top = centre.copy(), high.astype(np.float64).copy()
        for _ in range(_LEVELS):
            width = (top - bottom) / _SPLIT
            edges = [bottom + k * width for k in range(_SPLIT)] + [top]
            chosen = np.full(bottom.shape, -1)
            for k in range(_SPLIT):
                open_cell = ~self._ruled_out(sums, counts, edges[k], edges[k + 1])
                chosen = np.where(open_cell, k, chosen)
            found = chosen >= 0  # else every cell was ruled out: keep the cell (its top still bounds)
            index = np.maximum(chosen, 0)
            stacked = np.stack(edges)
            columns = np.arange(bottom.shape[0])
            bottom = np.where(found, stacked[index, columns], bottom)
            top = np.where(found, stacked[index + 1, columns], top)
        return top

    def span(
        self,
        sums: np.ndarray,
        counts: np.ndarray,
        errors: tuple[float, float],
        low: float,
        high: float,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per group, [lo, hi] within the bounds' offsets [low, high] (grid units from the centre,
        floats) holding every μ the test does not reject, searched within a float span that holds
        the interval arithmetic's (`errors`: the sum's and the count's ± at 97.5%); where the test
        rejects every μ (the 5% case happened), that span. Counts must be >= 1. The same numbers give
        the same ends, whichever path (numpy columns or one group) asks."""
        sums = np.asarray(sums, dtype=np.float64)
        counts = np.asarray(counts, dtype=np.float64)
        e_sum, e_count = errors
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            corners = [
                (sums + ds * e_sum) / (counts + dn * e_count) for ds in (-1.0, 1.0) for dn in (-1.0, 1.0)
            ]
            known = counts - e_count >= 1
            first, last = np.minimum.reduce(corners), np.maximum.reduce(corners)
            first = first - _SAFE * (np.abs(first) + 1)
            last = last + _SAFE * (np.abs(last) + 1)
        start = np.where(known & (first > low), first, low)
        stop = np.where(known & (last < high), last, high)
        wide = ~(start <= stop)  # NaN, or a span outside the bounds: the bounds, as the arithmetic does
        start, stop = np.where(wide, low, start), np.where(wide, high, stop)
        hi = self.upper_ends(sums, counts, start, stop)
        lo = -self.upper_ends(-sums, counts, -stop, -start)
        empty = ~(lo <= hi)
        return np.where(empty, start, lo), np.where(empty, stop, hi)


def distances(
    ends: tuple[np.ndarray, np.ndarray], at: np.ndarray, unit: float
) -> tuple[np.ndarray, np.ndarray]:
    """From released offsets `at` (grid units from the centre) to the ends of a span, below and
    above, in value units (grid units / `unit`), rounded up."""
    lo, hi = ends
    below = (at - lo) + _SAFE * (np.abs(at) + np.abs(lo))
    above = (hi - at) + _SAFE * (np.abs(at) + np.abs(hi))
    return below / unit, above / unit  # the allowances dwarf the division's rounding


def ratio_noise(noise: QueryNoise, aggregate: Aggregate, fine: frozenset[int]) -> RatioNoise:
    """The RatioNoise of an AVG (components: centred sum, count) under `noise`; `fine`: the
    components noised on the fine grid (release.aggregates.fine_components)."""
    centred, count = aggregate.components
    gaussian = noise.columns[centred].mechanism == Mechanism.GAUSSIAN
    assert noise.columns[count].mechanism == noise.columns[centred].mechanism

    def scale(c: int) -> float:
        return noise.columns[c].scale / FINE if c in fine else noise.columns[c].scale

    def slack(c: int) -> float:
        if c in fine:
            return 0.5 if gaussian else 0.5 + 1 / FINE
        return 0.0 if gaussian else 1.0

    return RatioNoise(gaussian, scale(centred), scale(count), slack(centred), slack(count))
