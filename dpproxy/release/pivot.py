"""AVG's, VAR's and STDDEV's 95% intervals by inverting tests on their noisy components
(docs/privacy.md §6, "95% error bars").

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
- discrete Gaussian (σ_X, σ_Y): a discrete Gaussian X of parameter σ and a normal G of deviation σ
  have P(G >= n) <= P(X >= n) <= P(G >= n − 1) for every integer n >= 1 (the sum of e^(−x²/2σ²)
  over x >= n lies between the integrals from n and from n − 1, and its normalising sum is at least
  √(2π)·σ by Poisson summation; the first inequality needs the sum's excess over the integral to
  exceed what the normalising sum adds, which tests/release/test_pivot.py checks for σ from 0.05 to
  3,000), so under the quantile coupling X lies within 1 of G, and P(|X − μY| >= u) <=
  P(|G_X − μG_Y| >= u − 1 − |μ|) = erfc((u − 1 − |μ|)/√(2(σ_X² + μ²σ_Y²))): G_X − μG_Y is normal.

A component computed on the fine grid and brought back to its own is its fine noise divided by FINE
plus a rounding of at most 1/2: its slack is 1/2 + 1/FINE instead of 1, with the fine scale divided
by FINE.

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

VAR and STDDEV (SpreadNoise) get their span from three tests of their own, whose
levels add up to 5%: the mean's (as AVG's), the variance's (on Q̂ − 2μŜ + (μ² − v)N̂, whose noise is
Z − 2μX + (μ² − v)Y at the truth) and, for the sample versions, the count's lower bound; SpreadNoise
says how. Their span replaces interval arithmetic's instead of meeting it (the events differ).

It sees noisy values, scales and bounds only: never a true value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from dpproxy.policy import Mechanism
from dpproxy.privacy import ERROR_ALPHA, QueryNoise
from dpproxy.release.spans import Span
from dpproxy.sql.query import FINE, Aggregate, AggregateKind

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
        if self.gaussian:
            return _normal_sum_tail(v, [self.sum_scale, r * self.count_scale])
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            big, small = (
                np.maximum(self.sum_scale, r * self.count_scale),
                np.minimum(self.sum_scale, r * self.count_scale),
            )
            ratio = v / big
            # (β1²e^(−v/β1) − β2²e^(−v/β2))/(β1² − β2²) = e^(−v/β1)·(1 + φ(d)·(v/β1)·β2/(β1 + β2)),
            # d = v(1/β2 − 1/β1), φ(d) = (1 − e^(−d))/d: no cancellation when β1 ≈ β2.
            d = np.where(small > 0, v * (big - small) / (big * np.where(small > 0, small, 1.0)), np.inf)
            phi = np.where(d < 1e-8, 1.0 - d / 2, -np.expm1(-d) / np.where(d > 0, d, 1.0))
            phi = np.where(np.isinf(d), 0.0, phi)
            bound = np.exp(-ratio) * (1.0 + phi * ratio * (small / (big + small)))
            bound = np.where(v > 0, bound * (1 + _SAFE), 1.0)
        return np.where(np.isnan(bound), 1.0, bound)

    def _ruled_out(
        self, sums: np.ndarray, counts: np.ndarray, m1: np.ndarray, m2: np.ndarray, alpha: float
    ) -> np.ndarray:
        """Whether no μ in [m1, m2] (all above Ŝ/N̂) escapes rejection at level `alpha`."""
        product = m1 * counts
        u = (product - sums) - _SAFE * (np.abs(product) + np.abs(sums))
        r = np.maximum(np.abs(m1), np.abs(m2)) * (1 + _SAFE)
        return self.tail(u, r) <= alpha

    def upper_ends(
        self, sums: np.ndarray, counts: np.ndarray, low: np.ndarray, high: np.ndarray, alpha: float
    ) -> np.ndarray:
        """Per group, an m <= high above which no μ in [low, high] escapes rejection (counts > 0)."""
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            bottom = np.clip(sums / counts, low, high)
        return _highest_open(lambda m1, m2: self._ruled_out(sums, counts, m1, m2, alpha), bottom, high)

    def span(
        self,
        sums: np.ndarray,
        counts: np.ndarray,
        errors: tuple[float, float],
        low: float,
        high: float,
        alpha: float = ERROR_ALPHA,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per group, [lo, hi] within the bounds' offsets [low, high] (grid units from the centre,
        floats) holding every μ the test at level `alpha` does not reject, searched within a float
        span that holds the interval arithmetic's at that level (`errors`: the sum's and the count's ±
        at 1 − alpha/2); where the test rejects every μ (the `alpha` case happened), that span. Counts
        must be >= 1. The same numbers give the same ends, whichever path (numpy columns or one group)
        asks."""
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
        hi = self.upper_ends(sums, counts, start, stop, alpha)
        lo = -self.upper_ends(-sums, counts, -stop, -start, alpha)
        empty = ~(lo <= hi)
        return np.where(empty, start, lo), np.where(empty, stop, hi)


def _highest_open(
    ruled_out: Callable[[np.ndarray, np.ndarray], np.ndarray],
    bottom: np.ndarray,
    top: np.ndarray,
    doublings: int = 0,
) -> np.ndarray:
    """Per element, an end e <= top such that ruled_out holds for cells covering (e, top]: first,
    with `doublings`, cells of widths growing twofold from `bottom` (the first a 2^−doublings part of
    the span), then _LEVELS times the highest cell not ruled out split in _SPLIT. Cells share their
    float edges, so together they cover the span; a cell whose sub-cells are all ruled out is kept
    whole (its top still bounds)."""
    bottom = np.asarray(bottom, dtype=np.float64).copy()
    top = np.asarray(top, dtype=np.float64).copy()
    columns = np.arange(bottom.shape[0])

    def narrow(edges: list[np.ndarray], bottom: np.ndarray, top: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        chosen = np.full(bottom.shape, -1)
        for k in range(len(edges) - 1):
            chosen = np.where(~ruled_out(edges[k], edges[k + 1]), k, chosen)
        found = chosen >= 0
        index = np.maximum(chosen, 0)
        stacked = np.stack(edges)
        return np.where(found, stacked[index, columns], bottom), np.where(
            found, stacked[index + 1, columns], top
        )

    with np.errstate(all="ignore"):  # beyond the floats (inf − inf): NaN, never ruled out
        if doublings:
            span = top - bottom
            edges = [bottom] + [
                np.minimum(bottom + span * 2.0 ** (k - doublings), top) for k in range(doublings)
            ]
            bottom, top = narrow([*edges, top], bottom, top)
        for _ in range(_LEVELS):
            width = (top - bottom) / _SPLIT
            bottom, top = narrow([bottom + k * width for k in range(_SPLIT)] + [top], bottom, top)
    return top


def distances(
    ends: tuple[np.ndarray, np.ndarray], at: np.ndarray, unit: float
) -> tuple[np.ndarray, np.ndarray]:
    """From released offsets `at` (grid units from the centre) to the ends of a span, below and
    above, in value units (grid units / `unit`), rounded up."""
    lo, hi = ends
    below = (at - lo) + _SAFE * (np.abs(at) + np.abs(lo))
    above = (hi - at) + _SAFE * (np.abs(at) + np.abs(hi))
    return below / unit, above / unit  # the allowances dwarf the division's rounding


def ratio_noise(noise: QueryNoise, components: tuple[int, int], fine: frozenset[int]) -> RatioNoise:
    """The RatioNoise of a centred sum and a count (an AVG's components, or a spread's last two)
    under `noise`; `fine`: the components noised on the fine grid (release.aggregates.fine_components)."""
    centred, count = components
    gaussian = noise.columns[centred].mechanism == Mechanism.GAUSSIAN
    assert noise.columns[count].mechanism == noise.columns[centred].mechanism
    return RatioNoise(
        gaussian,
        _own_scale(noise, centred, fine),
        _own_scale(noise, count, fine),
        _slack(centred in fine),
        _slack(count in fine),
    )


def _own_scale(noise: QueryNoise, c: int, fine: frozenset[int]) -> float:
    return noise.columns[c].scale / FINE if c in fine else noise.columns[c].scale


def _slack(fine: bool) -> float:
    """How far a component's noise on its own grid may be from the continuous law bounded: the
    coupling (1, or 1/FINE on the fine grid) and a fine component's rounding back (1/2)."""
    return 0.5 + 1 / FINE if fine else 1.0


# VAR and STDDEV: the levels of their tests, which add up to 5% (union bound): the mean's (A), the
# variance's (B, the rest), and for the sample versions the count's lower bound (C).
SPREAD_MEAN_ALPHA = 0.015
SPREAD_COUNT_ALPHA = 0.005
# Twofold widths of the variance's first cells: the first is a 2^−40 part of its span.
_DOUBLINGS = 40


def _normal_sum_tail(v: np.ndarray, scales: list[np.ndarray] | list[float]) -> np.ndarray:
    """P(|G1 + … + Gk| >= v) for independent centred normal variables of these deviations, rounded
    up: their sum is normal, of variance Σσ², so erfc(v/√(2Σσ²))."""
    from scipy.special import erfc  # here, not at the package's import (as release/distinct.py)

    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        deviation = np.sqrt(2.0 * sum(s * s for s in scales))
        bound = np.where(v > 0, erfc(v / deviation * (1 - _SAFE)) * (1 + _SAFE), 1.0)
    return np.where(np.isnan(bound), 1.0, np.minimum(bound, 1.0))


def _laplace_sum_tail(v: np.ndarray, scales: list[np.ndarray]) -> np.ndarray:
    """An upper bound on P(|L1 + … + Lk| >= v) for independent Laplace variables of these scales.
    The scales are first raised — a tail only grows (Anderson) — to at least 10^−4 times the largest
    and 1.01 times the next smaller, so that the partial fractions of the characteristic function,
    Σ A_i e^(−v/β_i) with A_i = Π_{j≠i} β_i²/(β_i² − β_j²), lose at most a few of float64's digits
    to cancellation (|A_i| <= ~2,500 for k = 3: an absolute error near 10^−12, far below the 10^−9
    added)."""
    betas = np.sort(np.stack([np.asarray(s, dtype=np.float64) for s in scales]), axis=0)[::-1]
    betas = np.maximum(betas, betas[0] * 1e-4)
    for i in range(len(betas) - 2, -1, -1):
        betas[i] = np.maximum(betas[i], 1.01 * betas[i + 1])
    total = np.zeros(np.shape(v))
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        for i, beta in enumerate(betas):
            weight = np.ones(np.shape(v))
            for j, other in enumerate(betas):
                if j != i:
                    weight = weight * (beta * beta / (beta * beta - other * other))
            total = total + weight * np.exp(-v / beta)
        bound = np.where(v > 0, total * (1 + 1e-6) + 1e-9, 1.0)
    return np.where(np.isnan(bound), 1.0, np.minimum(bound, 1.0))


@dataclass(frozen=True)
class SpreadNoise:
    """The noise of a VAR's or STDDEV's centred squares (Z), centred sum (X) and count (Y), own grid
    units, and the ± the mean's and the count's tests start from.

    At the true mean offset μ and population variance v (grid units), the released Q̂, Ŝ, N̂ satisfy
    Q̂ − 2μŜ + (μ² − v)N̂ = Z − 2μX + (μ² − v)Y (as Q − 2μS + μ²N = N·v), and the left side is
    N̂(v̂ − v) + N̂(μ − μ̂)² with μ̂ = Ŝ/N̂ and v̂ = Q̂/N̂ − μ̂², the released variance unclamped. With μ
    within the mean's test span [m_lo, m_hi] (level A), so that (μ − μ̂)² lies in [δ_lo, δ_hi], the
    variances v with |N̂(v̂ − v + δ)| beyond the 95% bound of the three noises for every such δ and μ
    are rejected (level B): the bound is the sum of three Laplace (or normal) variables' tail,
    at scales b_Z, 2·max|μ|·b_X and max|μ² − v|·b_Y over the cell searched, plus the slacks."""

    mean: RatioNoise
    squares_scale: float
    squares_slack: float
    mean_errors: tuple[float, float]  # the sum's and the count's ± at 1 − SPREAD_MEAN_ALPHA/2
    count_error: float  # the count's ± at 1 − SPREAD_COUNT_ALPHA

    def tail(self, u: np.ndarray, mean: np.ndarray, gap: np.ndarray) -> np.ndarray:
        """An upper bound on P(|Z − 2μX + (μ² − v)Y| >= u) for |μ| <= mean and |μ² − v| <= gap."""
        noise = self.mean
        v = u - self.squares_slack - 2 * mean * noise.sum_slack - gap * noise.count_slack
        scales = [
            np.full(np.shape(v), self.squares_scale),
            2 * mean * noise.sum_scale,
            gap * noise.count_scale,
        ]
        return _normal_sum_tail(v, scales) if noise.gaussian else _laplace_sum_tail(v, scales)

    def variance_span(
        self,
        squares: np.ndarray,
        sums: np.ndarray,
        counts: np.ndarray,
        offsets: tuple[float, float],
        ceiling: float,
        alpha: float,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per group, [lo, hi] within [0, ceiling] (the population variance, grid units squared)
        holding every v the test at level `alpha` does not reject, when μ is within the mean's test
        span at SPREAD_MEAN_ALPHA (`offsets`: the bounds of a value's offset). Counts must be >= 1."""
        squares, sums, counts = (np.asarray(x, dtype=np.float64) for x in (squares, sums, counts))
        m_lo, m_hi = self.mean.span(sums, counts, self.mean_errors, *offsets, alpha=SPREAD_MEAN_ALPHA)
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            centre = sums / counts
            estimate = squares / counts - centre * centre
            inside = (m_lo <= centre) & (centre <= m_hi)
            near = np.where(inside, 0.0, np.minimum((m_lo - centre) ** 2, (m_hi - centre) ** 2))
            far = np.maximum((m_lo - centre) ** 2, (m_hi - centre) ** 2)
            # What rounding may have moved v̂ and the squares by, far above it.
            slack = _SAFE * (np.abs(squares / counts) + centre * centre + far + 1)
            largest = np.maximum(np.abs(m_lo), np.abs(m_hi)) * (1 + _SAFE)
            square_lo = np.where((m_lo <= 0) & (m_hi >= 0), 0.0, np.minimum(m_lo * m_lo, m_hi * m_hi))
            square_hi = np.maximum(m_lo * m_lo, m_hi * m_hi) * (1 + _SAFE)

            def up(v1: np.ndarray, v2: np.ndarray) -> np.ndarray:  # v in [v1, v2], above v̂ + far
                u = counts * ((v1 - estimate - far) - slack)
                return self.tail(u, largest, np.maximum(v2 - square_lo, square_hi - v1)) <= alpha

            def down(w1: np.ndarray, w2: np.ndarray) -> np.ndarray:  # v = −w in [−w2, −w1], below v̂ + near
                u = counts * ((estimate + near + w1) - slack)
                return self.tail(u, largest, np.maximum(-w1 - square_lo, square_hi + w2)) <= alpha

            start_hi = np.clip(estimate + far, 0.0, ceiling)
            start_lo = np.clip(estimate + near, 0.0, ceiling)
        hi = _highest_open(up, start_hi, np.full(start_hi.shape, ceiling), _DOUBLINGS)
        lo = -_highest_open(down, -start_lo, np.zeros(start_lo.shape), _DOUBLINGS)
        unknown = ~((lo >= 0) & (lo <= hi) & (hi <= ceiling))
        return np.where(unknown, 0.0, lo), np.where(unknown, ceiling, hi)


class VarianceSpan(NamedTuple):
    """One group's population variance span (grid units squared) by SpreadNoise.variance_span, and
    its count's lower bound at SPREAD_COUNT_ALPHA: a count that may be below the fewest values a
    variance needs (1, or 2 for the sample versions) leaves only the bounds."""

    lo: float
    hi: float
    count_lo: float


def spread_noise(
    noise: QueryNoise, aggregate: Aggregate, fine: frozenset[int], errors_at: Callable[[float], list[float]]
) -> SpreadNoise:
    """The SpreadNoise of a VAR or STDDEV (components: centred squares, centred sum, count);
    `errors_at(alpha)`: every component's ± at 1 − alpha, on its own grid."""
    squares, centred, count = aggregate.components
    mean = ratio_noise(noise, (centred, count), fine)
    own = errors_at(SPREAD_MEAN_ALPHA / 2)
    return SpreadNoise(
        mean,
        _own_scale(noise, squares, fine),
        _slack(squares in fine),
        (own[centred], own[count]),
        errors_at(SPREAD_COUNT_ALPHA)[count],
    )


def pivot_of(
    noise: QueryNoise, aggregate: Aggregate, fine: frozenset[int], errors_at: Callable[[float], list[float]]
) -> RatioNoise | SpreadNoise | None:
    """What this module needs of an AVG's or a spread's noise; None for other aggregates
    (`errors_at(alpha)`: every component's ± at 1 − alpha on its own grid)."""
    if aggregate.interval is None:
        return None
    if aggregate.kind is AggregateKind.AVG:
        return ratio_noise(noise, aggregate.components, fine)
    if aggregate.kind.is_spread:
        # A spread's span by test inversion replaces interval arithmetic's: with either noise, whose
        # tail bounds are near exact, it is narrower in every regime tested but one, a group at the
        # noise level, where it is a few percent wider (tests/release/test_error_bars.py).
        return spread_noise(noise, aggregate, fine, errors_at)
    return None


def mean_spans(
    aggregate: Aggregate,
    offsets: Span,
    rows: Sequence[Sequence[int]],
    pivot: RatioNoise,
    errors: Sequence[float],
) -> list[tuple[float, float]]:
    """Every group's mean offset span by test inversion, all at once (`rows`: the groups' noisy
    components; `errors`: each component's ± at 1 − 5%/2; a group whose noisy count is below 1 is
    NULL: its span is not used). Each group's ends are those RatioNoise.span gives it alone."""
    centred_index, count_index = aggregate.components
    counts = np.array([as_float(row[count_index]) for row in rows])
    lo, hi = pivot.span(
        np.array([as_float(row[centred_index]) for row in rows]),
        np.maximum(counts, 1.0),
        (errors[centred_index], errors[count_index]),
        float(offsets.lo),
        float(offsets.hi),
    )
    return list(zip(lo.tolist(), hi.tolist(), strict=True))


def variance_spans(
    aggregate: Aggregate, offsets: Span, rows: Sequence[Sequence[int]], pivot: SpreadNoise
) -> list[VarianceSpan]:
    """Every group's population variance span by test inversion, all at once (`rows`: the groups'
    noisy components; a group whose noisy count is below 1 is NULL: its span is not used)."""
    squares_index, centred_index, count_index = aggregate.components
    ceiling = max(-offsets.lo, offsets.hi)
    counts = np.array([as_float(row[count_index]) for row in rows])
    sample = aggregate.kind in (AggregateKind.VAR_SAMP, AggregateKind.STDDEV_SAMP)
    alpha = ERROR_ALPHA - SPREAD_MEAN_ALPHA - (SPREAD_COUNT_ALPHA if sample else 0.0)
    lo, hi = pivot.variance_span(
        np.array([as_float(row[squares_index]) for row in rows]),
        np.array([as_float(row[centred_index]) for row in rows]),
        np.maximum(counts, 1.0),
        (float(offsets.lo), float(offsets.hi)),
        float(ceiling * ceiling),
        alpha,
    )
    count_lo = np.nextafter(counts - pivot.count_error, -np.inf)  # rounded down: a lower bound
    return [VarianceSpan(*x) for x in zip(lo.tolist(), hi.tolist(), count_lo.tolist(), strict=True)]


def as_float(value: int) -> float:
    """An integer as a float, ±inf beyond the floats (the tests then rule nothing out)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf
