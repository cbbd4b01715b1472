"""Releases chosen by report-noisy-max (the exponential mechanism's family): quantiles, MIN/MAX
and MODE.

Every selector scores its candidates with integers whose L∞ sensitivity (add/remove one unit) is
proven in its spec, and hands them to OpenDP's report-noisy-max (exact exponential or Gumbel noise),
whose map gives the cost. With the best score q*, any noisy-max variant used here picks candidate j
with probability at most exp((q_j − q*)/scale): for Gumbel noise that is the softmax itself; for
exponential noise (permute-and-flip) j is kept, when reached, with exactly that probability. Summed
over at most K − 1 candidates this gives the 95% bounds: P(picked score <= q* − x) <= (K − 1)·exp(−x/scale).

This module owns the scores, their sensitivities, each selector's calibration and cost, the requests
a query makes of them (QuantileRequest, ModeRequest) and the rank and count bounds shown
to analysts. It never sees candidate values or SQL: it scores the histograms and score vectors it is
handed and returns indexes into a candidate list the caller owns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from dpproxy.errors import InvalidParameter
from dpproxy.privacy import opendp_names as dp
from dpproxy.privacy.accounting import Accounting, even_share, remainder, sum_up
from dpproxy.privacy.calibration import I64_VECTORS, calibrate_scale
from dpproxy.privacy.checks import (
    MAX_L1_SENSITIVITY,
    check_count,
    check_histogram,
    check_positive,
    check_unit_limits,
)
from dpproxy.privacy.noise import ERROR_ALPHA

# Selector scores are i64 for OpenDP. Scores below -2^62 are raised to it: max(score, c) changes by no
# more than the score does, so the sensitivity (and the cost) is unchanged, and a candidate 2^62 noise
# scales below the best is never chosen either way (see _SCORE_FLOOR uses).
_SCORE_FLOOR = -(2**62)

# A quantile's α is kept as a fraction num/den with den at most this, so that den·n stays exact.
_MAX_QUANTILE_DENOMINATOR = 10**6

# A refined quantile (QuantileSpec.refined) spends this fraction of its share on the coarse pick that
# places the fine window, and the rest on the final pick (docs/privacy.md, quantiles).
COARSE_SHARE = 0.25


@lru_cache(maxsize=4096)
def _noisy_max_measurement(accounting: Accounting, scale: float, monotonic: bool) -> dp.Measurement:
    """Report-noisy-max over an i64 score vector.

    Pure: exponential noise (report-noisy-max with exponential noise is permute-and-flip, McKenna &
    Sheldon 2020), map ε = 2Δ/scale (Δ/scale for monotonic scores). zCDP: Gumbel noise (the
    exponential mechanism), map ρ = (2Δ/scale)²/8, the bounded-range
    bound of Cesar & Rogers 2021 (a quarter of the ε²/2 that make_pureDP_to_zCDP would charge).
    """
    space = (I64_VECTORS, dp.linf_distance(T="i64", monotonic=monotonic))
    measure = dp.max_divergence() if accounting == Accounting.PURE else dp.zero_concentrated_divergence()
    return dp.m.make_noisy_max(*space, measure, scale=scale)


def _selection_tail(scale: float, candidates: int, picks: int = 1) -> float:
    """x with (candidates − 1)·picks·exp(−x/scale) = ERROR_ALPHA (0 when there is nothing to confuse)."""
    rivals = (candidates - 1) * picks
    if rivals <= 0:
        return 0.0
    return scale * math.log(rivals / ERROR_ALPHA)


def _calibrate_selector(
    accounting: Accounting, d_in: int, budget: float, *, monotonic: bool = False
) -> tuple[float, float]:
    """(scale, cost) of noisy max over scores of L∞ sensitivity d_in whose map is <= budget.

    Pure maps are proportional to 1/scale and zCDP maps to 1/scale², so the map at scale 1 gives the
    starting point exactly; the usual nudging absorbs OpenDP's upward rounding.
    """
    if d_in > MAX_L1_SENSITIVITY:
        raise InvalidParameter(
            f"score sensitivity {d_in} is too large to calibrate a selection for",
            hint="tighten max_rows_per_unit in the policy or use a simpler quantile",
        )
    unit = _noisy_max_measurement(accounting, 1.0, monotonic).map(d_in)
    start = unit / budget if accounting == Accounting.PURE else math.sqrt(unit / budget)
    scale = calibrate_scale(
        start, lambda s: _noisy_max_measurement(accounting, s, monotonic).map(d_in), budget
    )
    return scale, _noisy_max_measurement(accounting, scale, monotonic).map(d_in)


def _budget_arguments(epsilon: float | None, rho: float | None) -> tuple[Accounting, float]:
    """Exactly one of ε (pure accounting) or ρ (zCDP accounting) pays for a selector."""
    if (epsilon is None) == (rho is None):
        raise InvalidParameter("a selection is paid for by exactly one of epsilon (pure) or rho (zCDP)")
    if epsilon is not None:
        check_positive("epsilon", epsilon)
        return Accounting.PURE, float(epsilon)
    assert rho is not None
    check_positive("rho", rho)
    return Accounting.ZCDP, float(rho)


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
    # Hierarchical refinement (0 < α < 1 only): this spec is the first, coarse pick, made at
    # COARSE_SHARE of the budget over the K coarse bins; `refined` is the second pick, made at the rest
    # over a partition of the same domain into the coarse bins outside a window around the first pick
    # and finer bins inside it (its `candidates`: the most any window gives). The window is public once
    # the first pick is released, so the second pick's scores are this class's scores over another
    # fixed partition: the same sensitivity. `epsilon`/`rho` here are the total of both picks
    # (sequential composition); the rank bound is the second pick's, whose partition covers the domain.
    refined: QuantileSpec | None = None
    # An end of the quantile's interval of values (dp_interval_low/high; 0 < α < 1 only): the target
    # rank moved by `shift` ranks, −s for the low end and +s for the high one (interval_shift), and
    # the edge bin of that side (the first for the low end, the last for the high one) scored at
    # least −(s − 2)/2 ranks. The low end is the picked bin's lower edge, the high end its upper edge:
    # each lies beyond the true quantile with probability >= 97.5% in every group (the argument at
    # interval_shift), both together >= 95%. A constant shift of the target, and the max of a score
    # with a constant, leave the scores' sensitivity as it is.
    shift: int = 0

    @property
    def is_extreme(self) -> bool:
        return self.alpha in (0, 1)

    def _width(self) -> int:
        """Score units per rank: den for 0 < α < 1, 2 (half ranks) for MIN/MAX."""
        return 2 if self.is_extreme else self.alpha.denominator

    def scores(self, bin_counts: Sequence[int]) -> list[int]:
        """The integer score of each candidate for one group's histogram (<= 0; 0 for the best)."""
        counts = check_histogram(bin_counts, self.candidates, "a quantile histogram")
        n = sum(counts)
        width = self._width()
        if self.alpha == 0:
            target = min(2 * self.extreme_rank, n)
        elif self.alpha == 1:
            target = max(2 * (n - self.extreme_rank), n)
        else:
            target = self.alpha.numerator * n + self.alpha.denominator * self.shift
        scores = []
        below = 0
        for count in counts:
            above = below + count
            low, high = width * below, width * above
            distance = low - target if target < low else max(0, target - high)
            scores.append(max(-distance, _SCORE_FLOOR))
            below = above
        if self.shift:
            edge = -width * ((abs(self.shift) - 2) // 2)
            side = 0 if self.shift < 0 else -1
            scores[side] = max(scores[side], edge)
        return scores

    def select(self, bin_counts: Sequence[int]) -> int:
        """Index j of the released candidate c_j for ONE group (its histogram, as the class says)."""
        scores = self.scores(bin_counts)
        if len(scores) == 1:
            return 0
        measurement = _noisy_max_measurement(self.accounting, self.scale, False)
        return int(measurement(scores))

    def rank_error95(self, n: int | None = None) -> float:
        """The rank error bound, in ranks, that holds with probability >= 95%.

        0 < α < 1: the released candidate's bin covers ranks within this distance of α·n (±).
        MIN / MAX: at most this many values lie below the MIN (above the MAX) released.
        From the union bound over the K − 1 other candidates (see above). `n`, when given, only caps
        the bound; pass a released (noisy) count, never the true one: the bound is shown to analysts.
        A refined quantile's answer is the second pick's, over a partition of the whole domain: its
        bound alone holds, whatever the first pick was.
        """
        if self.refined is not None:
            return self.refined.rank_error95(n)
        tail = _selection_tail(self.scale, self.candidates) / self._width()
        if self.is_extreme:
            target = self.extreme_rank if n is None else min(self.extreme_rank, n / 2)
            bound = target + tail
            return bound if n is None else min(bound, float(n))
        if n is None:
            return tail
        return min(tail, float(max(self.alpha, 1 - self.alpha) * n))


def interval_shift(scale: float, candidates: int, alpha: Fraction) -> int:
    """s = 2y + 2, the ranks an interval end's pick moves its target by (QuantileSpec.shift), with
    y = ⌈x⌉ and x the rank distance the pick's noise reaches with probability 2.5% over the K − 1
    rivals ((K − 1)·exp(−den·x/scale) = 2.5%, den the score units per rank).

    The low end: target T = α·n − s; the released end is c_j, the lower edge of the picked bin j.
    The true quantile v* (PERCENTILE_CONT's interpolation, PERCENTILE_DISC's value) is at least the
    value of 0-based rank ⌊α(n − 1)⌋, and α(n − 1) >= α·n − 1. A bin with c_j > v* ("bad") has every
    value up to v* below c_j, so rank_j >= α·n − 1 and its distance to T is at least s − 1 ranks: it
    scores at most −(2y + 1) ranks. The first bin is never bad (c_0 is the range's lower bound, at
    most every clipped value), and scores at least −y: the best score is at least −y, every bad bin
    at least y + 1 >= x below it, so one is picked with probability <= 2.5%. Whatever n is: a group
    too small for its target to lie among its ranks has the first bin win, a wide but true end. The
    high end mirrors it with the last bin and upper edges (v* is at most the value of 0-based rank
    ⌈α·n⌉ − 1, so a bin with c_{j+1} < v* has rank_{j+1} <= α·n, at least s ranks from α·n + s; the
    last bin's upper edge is the range's upper bound)."""
    x = _selection_tail(scale, candidates, picks=2) / alpha.denominator
    return 2 * math.ceil(x) + 2


@lru_cache(maxsize=1024)
def _quantile(
    alpha: Fraction,
    candidates: int,
    max_contributions: int,
    max_groups: int,
    accounting: Accounting,
    budget: float,
    fine_candidates: int = 0,
    end: int = 0,
) -> QuantileSpec:
    check_count("the number of quantile candidates", candidates)
    if end and alpha in (0, 1):
        raise InvalidParameter("MIN and MAX have no interval of values")
    check_unit_limits(max_contributions, max_groups)
    if alpha in (0, 1):
        sensitivity = 2 * max_contributions
    else:
        sensitivity = max_contributions * max(alpha.numerator, alpha.denominator - alpha.numerator)
    refined = None
    if fine_candidates and alpha not in (0, 1) and not end:
        # Sequential composition: the coarse pick's total, then the fine pick's at what is left.
        first = _quantile(alpha, candidates, max_contributions, max_groups, accounting, budget * COARSE_SHARE)
        refined = _quantile(
            alpha,
            fine_candidates,
            max_contributions,
            max_groups,
            accounting,
            remainder(budget, first.epsilon + first.rho),
        )
        return QuantileSpec(
            alpha,
            candidates,
            max_contributions,
            max_groups,
            sum_up([first.epsilon, refined.epsilon]),
            sum_up([first.rho, refined.rho]),
            accounting,
            first.scale,
            sensitivity,
            0,
            refined,
        )
    scale, per_group = _calibrate_selector(accounting, sensitivity, even_share(budget, max_groups))
    total = sum_up([per_group] * max_groups)
    extreme_rank = 0
    if alpha in (0, 1):
        extreme_rank = max(1, math.ceil(_selection_tail(scale, candidates) / 2))
    epsilon, rho = (total, 0.0) if accounting == Accounting.PURE else (0.0, total)
    shift = end * interval_shift(scale, candidates, alpha) if end else 0
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
        shift=shift,
    )


def quantile_mechanism(
    alpha: Fraction | float,
    candidates: int,
    max_contributions: int,
    max_groups: int,
    epsilon: float | None = None,
    *,
    rho: float | None = None,
    fine_candidates: int = 0,
) -> QuantileSpec:
    """The α-quantile (MIN at α = 0, MAX at α = 1) per group, costing at most epsilon (pure
    accounting) or rho (zCDP accounting) over the g groups one unit can change. See QuantileSpec;
    `fine_candidates` > 0 refines a 0 < α < 1 quantile in a second pick over that many candidates."""
    accounting, budget = _budget_arguments(epsilon, rho)
    return _quantile(
        _fraction(alpha), candidates, max_contributions, max_groups, accounting, budget, fine_candidates
    )


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
        values = check_histogram(counts, self.candidates, "mode counts")
        if len(values) == 1:
            return 0
        return int(_noisy_max_measurement(self.accounting, self.scale, True)(_i64_scores(values)))

    def count_error95(self) -> float:
        """With probability >= 95%, the released candidate's count is within this of the top count."""
        return _selection_tail(self.scale, self.candidates)


@lru_cache(maxsize=1024)
def _mode(
    candidates: int, max_contributions: int, max_groups: int, accounting: Accounting, budget: float
) -> ModeSpec:
    check_count("the number of mode candidates", candidates)
    check_unit_limits(max_contributions, max_groups)
    scale, per_group = _calibrate_selector(
        accounting, max_contributions, even_share(budget, max_groups), monotonic=True
    )
    total = sum_up([per_group] * max_groups)
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
class QuantileRequest:
    """A quantile (MIN α = 0, MAX α = 1) per group that a query releases; see QuantileSpec."""

    alpha: Fraction
    candidates: int
    max_contributions: int
    max_groups: int
    fine_candidates: int = 0  # > 0: refined in a second pass (QuantileSpec.refined)
    end: int = 0  # −1 / +1: the low / high end of its interval of values (QuantileSpec.shift)

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", _fraction(self.alpha))


@dataclass(frozen=True)
class ModeRequest:
    """MODE() WITHIN GROUP per group that a query releases; see ModeSpec."""

    candidates: int
    max_contributions: int
    max_groups: int


SelectorRequest = QuantileRequest | ModeRequest
SelectorSpec = QuantileSpec | ModeSpec


def selector_for(request: SelectorRequest, accounting: Accounting, budget: float) -> SelectorSpec:
    """The selector serving `request`, paid for by `budget`: ε under pure accounting, ρ under zCDP."""
    if isinstance(request, QuantileRequest):
        return _quantile(
            request.alpha,
            request.candidates,
            request.max_contributions,
            request.max_groups,
            accounting,
            budget,
            request.fine_candidates,
            request.end,
        )
    if isinstance(request, ModeRequest):
        return _mode(request.candidates, request.max_contributions, request.max_groups, accounting, budget)
    raise InvalidParameter(f"unknown selection request {request!r}")
