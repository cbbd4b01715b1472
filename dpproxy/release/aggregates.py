"""Noisy aggregates of the released groups, with their 95% error bars.

This module owns steps 3 and 4 of a release: noise added to every component of every released group
(dpproxy.privacy owns the samplers), then COUNT, SUM, AVG, VAR and STDDEV computed from the noisy
components (rounding, clamping into the column's bounds), the exponential mechanism's picks for
quantiles and MODE, and randomized-response counts; the interval columns' ends are computed by
dpproxy.release.intervals, from what this module released.

95% error bars. Every ± labelled 95% covers the true value with probability >= 95%, for each
released group: a value derived from k noisy components bounds each at level 1 − 5%/k
(dpproxy.privacy.component_alpha, the union bound), and derives its ± by interval arithmetic from
those bounds (AVG: S/N; VAR/STDDEV: Q/N − (S/N)², times N/(N − 1) for the sample versions, then √),
intersected with what the column's bounds allow; AVG's span is then intersected with the means a
test on its noisy sum and count does not reject, and a spread's span is the one three tests of its
own give instead of the arithmetic's (dpproxy.release.pivot, which says why each
still holds at 95%). The per-column figure of the notice is the largest
over the released groups, so it covers each of them. Counts and sums have one noise scale for all
groups: their ± is the noise's own 95% bound, and clamping at 0 only moves a value towards the true
one.

Counts, sums and averages are computed column by column with numpy on exact integers (int64 where
no value can overflow, Python ints otherwise), with the same released values as the group-by-group
functions and error bars at least as tight and never below the exact ones (_average_column says
why); the other aggregates, and groups beyond the ranges where int64 and float64 are exact, go group
by group.

It never chooses groups or orders rows, and returns no true value: only noisy ones and their bounds.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from typing import TypeVar

import numpy as np

from dpproxy.privacy import (
    ModeSpec,
    QuantileSpec,
    QueryNoise,
    RandomizedResponseCount,
    SelectorSpec,
    component_alpha,
)
from dpproxy.release.exact import ExactGroups
from dpproxy.release.intervals import (
    COUNTS,
    candidate_value,
    centre_offsets,
    interval_column,
    quantile_interval_column,
)
from dpproxy.release.pivot import (
    RatioNoise,
    SpreadNoise,
    VarianceSpan,
    distances,
    mean_spans,
    pivot_of,
    ratio_noise,
    variance_spans,
)
from dpproxy.release.requests import Selectors, selectors
from dpproxy.release.spans import (
    CEILING,
    FLOOR,
    INFINITY,
    NON_NEGATIVE,
    Span,
    bessel,
    noisy_span,
    quotient,
    reach,
)
from dpproxy.sql.bounds import choosing, scaled_with_fixed_limits
from dpproxy.sql.postprocess.intervals import interval_slots
from dpproxy.sql.query import FINE, Aggregate, AggregateKind, PrivateQuery
from dpproxy.sql.types import PgType

_T = TypeVar("_T")


@dataclass(frozen=True)
class ReleasedGroups:
    """The released groups, kept a column at a time ([aggregate][group]) as they are computed; the
    row views ([group][aggregate]) are built when first asked for."""

    keys: list[tuple[object, ...]]
    # [aggregate][group], noisy and post-processed; then, for each interval end the query's
    # post-processing reads (dp_interval_low/high, in dpproxy.sql.postprocess.interval_slots' order),
    # that end per group (interval_columns): what PostProcessor reads as a row's released columns.
    columns: list[list[object]]
    # [aggregate] ± at 95% in the aggregate's unit that holds for every released group (the largest
    # of the groups' own), or a sentence for the exponential mechanism's releases (their error is in
    # ranks or counts, not in value units).
    errors: list[float | str | None]
    # [aggregate][group] each group's own ± at 95% where it depends on the group's noisy values
    # (AVG, VAR, STDDEV, randomized response); None where the column's figure is the same for
    # every group.
    error_columns: list[list[float | None]]

    @functools.cached_property
    def aggregates(self) -> list[list[object]]:
        """[group][aggregate]."""
        return _rows(self.columns, len(self.keys))

    @functools.cached_property
    def group_errors(self) -> list[list[float | None]]:
        """[group][aggregate]."""
        return _rows(self.error_columns, len(self.keys))


def _rows(columns: Sequence[list[_T]], n: int) -> list[list[_T]]:
    if not columns:  # a query without aggregates: one empty row per group
        return [[] for _ in range(n)]
    return [list(row) for row in zip(*columns, strict=True)]


# Integers below this in magnitude add in int64 without overflow; beyond, Python ints (object arrays).
_INT64_SAFE = 1 << 62
# Integers below this are exact in float64.
_FLOAT_EXACT = float(1 << 53)


def _integers(values: Sequence[int] | Sequence[Sequence[int]]) -> np.ndarray:
    """Exact integers as an int64 array, or an object array of Python ints when one is beyond int64."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return np.array(values, dtype=object)


def _exact_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b elementwise, exactly: in int64 when no sum can overflow, else with Python ints."""
    native = a.dtype != object and b.dtype != object
    if native and (a.size == 0 or max(_largest(a), _largest(b)) < _INT64_SAFE):
        return a + b
    return a.astype(object) + b.astype(object)


def _largest(a: np.ndarray) -> int:
    """The largest magnitude in an int64 array (|−2^63| included, which np.abs would overflow)."""
    return max(abs(int(a.max())), abs(int(a.min())))


def add_noise(groups: ExactGroups, noise: QueryNoise) -> np.ndarray:
    """Noisy components, [group][component]: exact integers, int64 (an object array of Python ints
    when some value is beyond int64's safe range). Noise is added exactly, never saturated."""
    n, k = len(groups.keys), len(noise.columns)
    try:  # the flat iterator is twice as fast as np.array of the rows
        flat = itertools.chain.from_iterable(groups.components)
        true = np.fromiter(flat, dtype=np.int64, count=n * k).reshape(n, k)
    except OverflowError:
        true = np.array(groups.components, dtype=object).reshape(n, k)
    columns = [_exact_sum(true[:, c], _integers(spec.sample(n))) for c, spec in enumerate(noise.columns)]
    if not columns:
        return true
    if any(column.dtype == object for column in columns):
        columns = [column.astype(object) for column in columns]
    return np.stack(columns, axis=1)


def _release_responses(groups: ExactGroups, responses: RandomizedResponseCount) -> ReleasedGroups:
    """COUNT by randomized response: the debiased estimate from the groups' noisy tallies of reports."""
    ones = [row[0] for row in groups.components]  # persons for whom the predicate holds
    zeros = [row[1] - row[0] for row in groups.components]  # the other persons of the group
    released = responses.release(ones, zeros)
    values: list[object] = [max(0, round(r.estimate)) for r in released]
    # Rounding an estimate within ±e of an integer count lands within ±⌈e⌉ of it; clamping at 0 only
    # brings it nearer. The largest over groups holds for each (their ± depends on their noisy n).
    group_errors: list[float | None] = [float(math.ceil(r.error95)) for r in released]
    error = max((e for e in group_errors if e is not None), default=None)
    return ReleasedGroups(groups.keys, [values], [error], [group_errors])


def _from_grid(value: Decimal | int, scale: int) -> Decimal:
    return Decimal(value).scaleb(-scale)


def _typed(value: Decimal, result_type: PgType, scale: int) -> object:
    if result_type.is_integer:
        return int(value.to_integral_value(ROUND_HALF_EVEN))
    if result_type.is_float:
        return float(value)
    return value.quantize(Decimal(1).scaleb(-scale)) if scale >= 0 else value


def release_aggregates(
    query: PrivateQuery,
    groups: ExactGroups,
    noise: QueryNoise,
    responses: RandomizedResponseCount | None = None,
    refined: dict[tuple[int, int], object] | None = None,
) -> ReleasedGroups:
    """`refined`: the values of refined quantiles by (group, aggregate) (dpproxy.release.quantiles)."""
    refined = refined or {}
    if query.randomized_response:
        assert responses is not None
        return _with_intervals(query, _release_responses(groups, responses), groups, noise, selectors(query))
    n = len(groups.keys)
    noisy = add_noise(groups, noise)
    if not isinstance(noisy, np.ndarray):  # rows from elsewhere (tests record them): exact integers
        noisy = _integers([[int(v) for v in row] for row in noisy]).reshape(n, len(noise.columns))
    fine = fine_components(query)
    if fine:
        noisy = _to_own_grid(noisy, fine)
    # Each component's ± at the level a figure derived from 1, 2 (AVG) or 3 (VAR) of them needs.
    bounds = {k: _component_errors(noise, k, fine) for k in {1, *(_parts(a) for a in query.aggregates)}}
    chosen = selectors(query)
    chosen_by = chosen.by_aggregate
    offsets = [
        centre_offsets(a) if a.kind.is_spread or a.kind is AggregateKind.AVG else None
        for a in query.aggregates
    ]
    pivots = [
        pivot_of(noise, a, fine, lambda alpha: _errors_at(noise, alpha, fine)) for a in query.aggregates
    ]
    rows: list[list[int]] | None = None  # noisy as Python ints, for the aggregates released group by group
    value_columns: list[list[object]] = []  # [aggregate][group]
    error_columns: list[list[float | None]] = []
    refined_aggregates = {a for _, a in refined}
    for a, aggregate in enumerate(query.aggregates):
        # Counts, sums and averages column by column (numpy, exact integers); the rest group by group.
        column = None
        if a not in refined_aggregates:
            pivot = pivots[a]
            column = _vector_column(
                aggregate, noisy, bounds[_parts(aggregate)], pivot if isinstance(pivot, RatioNoise) else None
            )
        if column is None:
            rows = noisy.tolist() if rows is None else rows
            column = _scalar_column(
                query, groups, noise, refined, a, offsets[a], rows, bounds, chosen_by, pivots[a]
            )
        values, column_group_errors = column
        value_columns.append(values)
        error_columns.append(column_group_errors)
    errors = [
        _column_error(
            aggregate, noise.selectors[chosen_by[a]] if a in chosen_by else None, error_columns[a], bounds[1]
        )
        for a, aggregate in enumerate(query.aggregates)
    ]
    released = ReleasedGroups(groups.keys, value_columns, errors, error_columns)
    return _with_intervals(query, released, groups, noise, chosen)


def _with_intervals(
    query: PrivateQuery, released: ReleasedGroups, groups: ExactGroups, noise: QueryNoise, chosen: Selectors
) -> ReleasedGroups:
    """The released groups with the interval ends the query reads appended to their columns (a
    quantile's from its own picks over the groups' histograms: `chosen.interval_ends`)."""
    ends = interval_slots(query.post_processing)
    if not ends:
        return released
    picks = chosen.interval_ends
    extra = []
    for a, end in ends:
        if a in picks:
            spec = noise.selectors[picks[a][0 if end == "low" else 1]]
            extra.append(quantile_interval_column(query, a, end, spec, groups, released.columns[a]))
            continue
        extra.append(
            interval_column(
                query.aggregates[a], end, released.columns[a], released.error_columns[a], released.errors[a]
            )
        )
    return ReleasedGroups(released.keys, [*released.columns, *extra], released.errors, released.error_columns)


def _scalar_column(
    query: PrivateQuery,
    groups: ExactGroups,
    noise: QueryNoise,
    refined: dict[tuple[int, int], object],
    a: int,
    offsets: Span | None,
    rows: list[list[int]],
    bounds: dict[int, list[float]],
    chosen_by: dict[int, int],
    pivot: RatioNoise | SpreadNoise | None = None,
) -> tuple[list[object], list[float | None]]:
    """One aggregate's values and group errors, group by group (every kind; Python ints and Decimals;
    `pivot`: an AVG's or a spread's noise, release.pivot)."""
    aggregate = query.aggregates[a]
    values: list[object] = []
    errors: list[float | None] = []
    variances = means = None
    if isinstance(pivot, SpreadNoise):
        assert offsets is not None
        variances = variance_spans(aggregate, offsets, rows, pivot)
    elif isinstance(pivot, RatioNoise):
        assert offsets is not None
        means = mean_spans(aggregate, offsets, rows, pivot, bounds[_parts(aggregate)])
    for g, row in enumerate(rows):
        error: float | None = None
        if (g, a) in refined:
            value = refined[g, a]
        elif aggregate.kind in (AggregateKind.QUANTILE, AggregateKind.MODE):
            # The exponential mechanism picks a candidate from the group's true histogram.
            histogram = query.histograms[aggregate.histogram]
            choice = noise.selectors[chosen_by[a]].select(groups.histograms[g][aggregate.histogram])
            value = candidate_value(histogram.candidate(choice), aggregate.result_type)
        elif aggregate.kind in COUNTS:
            # Noise is integer: counts need no rounding, only clamping at zero.
            value = max(0, row[aggregate.components[0]])
        elif aggregate.kind is AggregateKind.SUM:
            value = _sum(aggregate, row)
        elif aggregate.kind.is_spread:
            assert offsets is not None
            variance = None if variances is None else variances[g]
            value, error = _spread(aggregate, offsets, row, bounds[_parts(aggregate)], variance)
        else:
            assert offsets is not None
            value, error = _average(
                aggregate, offsets, row, bounds[_parts(aggregate)], None if means is None else means[g]
            )
        values.append(value)
        errors.append(error)
    return values, errors


def _vector_column(
    aggregate: Aggregate, noisy: np.ndarray, errors: Sequence[float], pivot: RatioNoise | None = None
) -> tuple[list[object], list[float | None]] | None:
    """One COUNT, SUM or AVG column computed with numpy over all groups at once, with exactly the
    values (and, for AVG, at least the error bars' coverage) of the group-by-group functions; None
    for other kinds. Elements outside the ranges where int64 and float64 are exact are computed by
    those functions instead."""
    n = noisy.shape[0]
    if aggregate.kind in COUNTS:
        column = noisy[:, aggregate.components[0]]
        return np.maximum(column, 0).tolist(), [None] * n
    if aggregate.kind is AggregateKind.SUM:
        return _sum_column(aggregate, noisy), [None] * n
    if aggregate.kind is AggregateKind.AVG and aggregate.interval is not None:
        return _average_column(aggregate, noisy, errors, pivot)
    return None


def _sum_column(aggregate: Aggregate, noisy: np.ndarray) -> list[object]:
    """_sum over every group: the clamp on the grid (where it is the same), then each typed value."""
    assert aggregate.interval is not None
    column = noisy[:, aggregate.components[0]]
    if aggregate.interval.lo >= 0:
        column = np.maximum(column, 0)
    elif aggregate.interval.hi <= 0:
        column = np.minimum(column, 0)
    values = column.tolist()
    scale = aggregate.scale
    if aggregate.result_type.is_integer and scale == 0:
        return values  # _typed of an integer on the unit grid is the integer itself
    # Values of at most 27 digits: Decimal(v).scaleb(−s) is exact under the context's 28 digits
    # (longer ones go through _typed, which rounds them as before).
    limit = 10**27
    if aggregate.result_type.is_float and 0 <= scale <= 22:
        power = 10**scale  # int / int is correctly rounded, as float(Decimal) is
        return [v / power if -limit < v < limit else _sum(aggregate, [v]) for v in values]
    if not aggregate.result_type.is_integer and not aggregate.result_type.is_float and scale >= 0:
        # Coefficient v and exponent −s: the value quantized to the scale, as _typed gives it.
        return [Decimal(v).scaleb(-scale) if -limit < v < limit else _sum(aggregate, [v]) for v in values]
    return [_sum(aggregate, [v]) for v in values]


def _average_column(
    aggregate: Aggregate, noisy: np.ndarray, errors: Sequence[float], pivot: RatioNoise | None = None
) -> tuple[list[object], list[float | None]] | None:
    """_average over every group, in int64 where it is exact (else per group by _average).

    The value. y = c + S/N' (grid units, N' = max(N, 1)) is released as M·10^−(s+4), M = y·10^4
    rounded half-even and clamped into the column's bounds rounded the same way (rounding is
    monotone, so clamping before or after it is the same). _average divides and adds at Decimal's
    28 digits first: when |c·N' + S| < 2^62/10^4 that rounding is at most ~1e−12/N' from y, while y
    is either a tie or at least 1/(2·10^4·N') from one, so the two round alike.

    The ±. The exact distance from the released value to the span _average's interval arithmetic
    bounds (the ends are quotients a/b of integers, whose order is decided by integer products),
    rounded up to a float exactly (a correctly rounded float quotient, then one step up when an
    error-free product shows it below the exact quotient): at most the figure _average gives (its
    ends are rounded outwards first) and never below the exact one, so at least as honest. Each side
    is then cut to the distance to the test inversion's end (`pivot`, release.pivot), computed in
    floats exactly as _average computes it from the same numbers. A float result is the float
    nearest M·10^−(s+4), as _average gives it; its ± adds that float's ulp.
    """
    result_type, scale = aggregate.result_type, aggregate.scale
    if result_type.is_integer or not 0 <= scale <= 11:
        return None
    if noisy.dtype == object or not all(float(e).is_integer() for e in errors):
        return None
    assert aggregate.interval is not None
    centred_index, count_index = aggregate.components
    n = noisy.shape[0]
    sums, counts = noisy[:, centred_index], noisy[:, count_index]
    centre = aggregate.centre
    grid_lo, grid_hi = aggregate.interval.on_grid(scale)
    low, high = grid_lo - centre, grid_hi - centre  # offsets, as integers
    e_sum, e_count = int(errors[centred_index]), int(errors[count_index])
    digits = scale + 4
    fine = 10**4
    clamp_lo = _half_even(Decimal(aggregate.interval.lo).scaleb(digits))
    clamp_hi = _half_even(Decimal(aggregate.interval.hi).scaleb(digits))
    # Elements whose every product below stays under 2^52 (exact in int64 and in float64).
    divisor = np.maximum(counts, 1)
    count_hi = counts + e_count
    # Every integer below is a sum of two terms each under 2^51 (so exact in int64 and float64):
    # denominators are at most |N| + e_N, the released offset R at most 10^4·(|c| + |low| + |high| + 2)
    # (it is clamped into the bounds), numerators a sum ± e_S or an offset bound.
    span = abs(low) + abs(high) + abs(centre) + 2
    limit = _FLOAT_EXACT / 4
    if not abs(clamp_lo) + abs(clamp_hi) + fine * span < limit:
        # Bounds beyond int64's exact range (an AVG of the constant −2^63): no group is computed here,
        # and the clamp below could not even hold them: every group goes group by group, exactly.
        return None

    def exact(reach_n: np.ndarray | float, sums_abs: np.ndarray | float) -> np.ndarray | bool:
        return (
            (fine * (abs(centre) * reach_n + sums_abs) < limit)
            & (fine * span * reach_n < limit)
            & (fine * (sums_abs + e_sum + span) < limit)
            & (10.0**digits * reach_n < limit)
            & (abs(clamp_lo) + abs(clamp_hi) + fine * span < limit)
        )

    # Usually the largest group is within range, and so every group is; else group by group.
    largest_n, largest_sum = (float(_largest(x)) if n else 0.0 for x in (counts, sums))
    every = bool(exact(largest_n + e_count + 1, largest_sum))
    fast = np.ones(n, dtype=bool)
    if not every:
        fast = np.asarray(exact(np.abs(counts) + (e_count + 1.0), np.abs(sums).astype(np.float64)))
        every = bool(fast.all())
    if not every:
        sums, counts, divisor, count_hi = (np.where(fast, x, 1) for x in (sums, counts, divisor, count_hi))
    # M = round_half_even(10^4·(c·N' + S)/N'), clamped.
    numerator = fine * (centre * divisor + sums)
    quotient, remainder = np.divmod(numerator, divisor)
    twice = 2 * remainder
    quotient += (twice > divisor) | ((twice == divisor) & (quotient % 2 == 1))
    released = np.clip(quotient, clamp_lo, clamp_hi)
    # The span of the mean offset: [lo_num/lo_den, hi_num/hi_den], or [low, high] when the count
    # may be below 1 or the quotients' span misses the offsets' range.
    count_lo = counts - e_count
    sum_lo, sum_hi = sums - e_sum, sums + e_sum
    lo_num, lo_den = sum_lo, np.where(sum_lo >= 0, count_hi, count_lo)
    hi_num, hi_den = sum_hi, np.where(sum_hi >= 0, count_lo, count_hi)
    unknown = (count_lo < 1) | (lo_num > high * lo_den) | (hi_num < low * hi_den)
    to_low = unknown | (lo_num < low * lo_den)
    to_high = unknown | (hi_num > high * hi_den)
    lo_num, lo_den = np.where(to_low, low, lo_num), np.where(to_low, 1, lo_den)
    hi_num, hi_den = np.where(to_high, high, hi_num), np.where(to_high, 1, hi_den)
    # Distances from the released value R (offset from the centre, 10^−4 grid units), value units.
    offset = released - fine * centre
    power = 10**digits
    below = _ceiling_quotient(offset * lo_den - fine * lo_num, power * lo_den)
    above = _ceiling_quotient(fine * hi_num - offset * hi_den, power * hi_den)
    if pivot is not None:  # narrowed to the test's span (release.pivot)
        ends = pivot.span(sums, np.maximum(counts, 1), (e_sum, e_count), float(low), float(high))
        pivot_below, pivot_above = distances(ends, offset / fine, 10.0**scale)
        below, above = np.minimum(below, pivot_below), np.minimum(above, pivot_above)
    distance = np.maximum(below, above)
    values: list[object]
    if result_type.is_float:
        # float(M·10^−(s+4)): M and 10^(s+4) are exact floats, so the quotient is correctly
        # rounded, as float(Decimal) is. It is within half an ulp of M·10^−(s+4), which the
        # distance above is from: one ulp more (and one step up for the sum's rounding) covers it.
        floats = released.astype(np.float64) / float(power)
        distance = np.nextafter(distance + np.spacing(np.abs(floats)), np.inf)
        values = floats.tolist()
    else:
        values = [Decimal(m).scaleb(-digits) for m in released.tolist()]
    group_errors: list[float | None] = distance.tolist()
    for g in np.flatnonzero(counts < 1).tolist():  # as _average: NULL below one value
        values[g], group_errors[g] = None, None
    if not every:
        offsets = centre_offsets(aggregate)
        row_errors = list(errors)
        slow = np.flatnonzero(~fast).tolist()
        rows = [[int(v) for v in noisy[g]] for g in slow]
        means = None if pivot is None else mean_spans(aggregate, offsets, rows, pivot, row_errors)
        for i, (g, row) in enumerate(zip(slow, rows, strict=True)):
            ends = None if means is None else means[i]
            values[g], group_errors[g] = _average(aggregate, offsets, row, row_errors, ends)
    assert len(values) == n
    return values, group_errors


def _half_even(value: Decimal) -> int:
    return int(value.to_integral_value(ROUND_HALF_EVEN))


def _ceiling_quotient(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """The least float64 >= numerator/denominator, for integer arrays below 2^53 in magnitude
    (denominators > 0): the correctly rounded float quotient q, stepped up when q·denominator,
    computed without error (Dekker's product), is below the numerator."""
    num = numerator.astype(np.float64)
    den = denominator.astype(np.float64)
    q = num / den
    product, error = _two_product(q, den)
    # product − num is exact (Sterbenz: product is within a few ulps of num); adding `error` rounds
    # to a float of the exact sum's sign.
    short = ((product - num) + error) < 0
    return np.where(short, np.nextafter(q, np.inf), q)


def _two_product(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """p, e with p = fl(a·b) and p + e = a·b exactly (Dekker 1971; no overflow at these sizes)."""
    p = a * b
    a_hi, a_lo = _split(a)
    b_hi, b_lo = _split(b)
    e = ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo
    return p, e


def _split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Veltkamp's split: a = hi + lo, each with at most 26 significant bits."""
    c = 134217729.0 * a  # 2^27 + 1
    hi = c - (c - a)
    return hi, a - hi


def _parts(aggregate: Aggregate) -> int:
    """How many noisy components an aggregate's ± combines: AVG a centred sum and a count, VAR and
    STDDEV the centred squares too; counts and sums have one."""
    if aggregate.kind.is_mean:
        return len(aggregate.components)
    return 1


def _component_errors(noise: QueryNoise, parts: int, fine: frozenset[int] = frozenset()) -> list[float]:
    """Each component's ± (grid units) at level 1 − 5%/parts: the bounds a figure derived from
    `parts` components combines, all holding together with probability >= 95% (union bound). A
    component noised on the fine grid (`fine`) and then rounded to its own: ⌈e/FINE + 1/2⌉."""
    return _errors_at(noise, component_alpha(parts), fine)


def _errors_at(noise: QueryNoise, alpha: float, fine: frozenset[int]) -> list[float]:
    """Each component's ± (grid units) at level 1 − alpha, a fine one's rounded to its own grid."""
    return [
        float(math.ceil(spec.error_at(alpha) / FINE + 0.5)) if c in fine else spec.error_at(alpha)
        for c, spec in enumerate(noise.columns)
    ]


def fine_components(query: PrivateQuery) -> frozenset[int]:
    """The components a query's main statement computes on the fine grid (dpproxy.sql.query.FINE:
    those scaled per person, with bounds chosen per query or fixed), whose noisy values are brought
    back to their own grid before use."""
    if not choosing(query):
        return scaled_with_fixed_limits(query)
    assert query.bounds is not None
    return frozenset(i for i, c in enumerate(query.components) if query.bounds.scaled(c))


def _to_own_grid(noisy: np.ndarray, fine: frozenset[int]) -> np.ndarray:
    """The fine components' noisy values divided by FINE, rounded half to even, exactly (int64 or
    Python ints alike): post-processing of noisy values."""
    out = noisy.copy()
    for c in fine:
        if noisy.dtype == object:  # Python ints beyond int64's safe range
            out[:, c] = [_half_even_quotient(int(v)) for v in noisy[:, c]]
            continue
        quotient, remainder = np.divmod(noisy[:, c], FINE)
        twice = 2 * remainder
        up = (twice > FINE) | ((twice == FINE) & (quotient % 2 == 1))
        out[:, c] = quotient + up
    return out


def _half_even_quotient(value: int) -> int:
    quotient, remainder = divmod(value, FINE)
    twice = 2 * remainder
    return quotient + (twice > FINE or (twice == FINE and quotient % 2 == 1))


def _column_error(
    aggregate: Aggregate,
    selector: SelectorSpec | None,
    group_errors: Sequence[float | None],
    errors95: Sequence[float],
) -> float | str | None:
    """The notice's 95% figure of one aggregate: one that holds for every released group."""
    if isinstance(selector, QuantileSpec):
        # Integer counts of values below a bound b are < b, so at most round(b); a rank distance
        # (a multiple of 1/den) below b is at most ⌈b⌉.
        bound = selector.rank_error95()
        if aggregate.alpha in (0, 1):
            side = "below" if aggregate.alpha == 0 else "above"
            return f"at most {bound:.0f} values {side} it"
        return f"rank ±{math.ceil(bound)}"
    if isinstance(selector, ModeSpec):
        return f"count within {selector.count_error95():.0f} of the top"
    if aggregate.kind.is_spread or aggregate.kind is AggregateKind.AVG:
        # Each group's ± depends on its own noisy count: the largest covers them all (a median
        # would leave the groups above it, the small ones, with less than 95%).
        known = [e for e in group_errors if e is not None]
        if known:
            return max(known)
        if aggregate.kind is AggregateKind.AVG and aggregate.interval is not None:
            return float(aggregate.interval.hi - aggregate.interval.lo)
        return None
    # Counts and sums: one noise scale for every group, so the noise's own bound holds for each.
    return errors95[aggregate.components[0]] / 10**aggregate.scale


def _sum(aggregate: Aggregate, noisy: Sequence[int]) -> object:
    """SUM from its noisy grid sum, clamped at 0 when every value has one sign (which the true sum
    then has too, so the clamp only brings the value nearer to it)."""
    assert aggregate.interval is not None
    value = _from_grid(noisy[aggregate.components[0]], aggregate.scale)
    if aggregate.interval.lo >= 0:
        value = max(value, Decimal(0))
    elif aggregate.interval.hi <= 0:
        value = min(value, Decimal(0))
    return _typed(value, aggregate.result_type, aggregate.scale)


def _average(
    aggregate: Aggregate,
    offsets: Span,
    noisy: Sequence[int],
    errors: Sequence[float],
    ends: tuple[float, float] | None = None,
) -> tuple[object, float | None]:
    """AVG of one group, c + S/N from its noisy centred sum S and count N (grid units), clamped into
    the column's bounds, and its ± at 95% (`errors`: each component's ± at level 1 − 5%/2;
    `offsets`: the range of a value's offset from the centre c; `ends`: the mean offset's span by
    the test on the two noises, which narrows the ±, release.pivot.mean_spans, computed for all
    groups at once). NULL when the noisy count is below
    1, as PostgreSQL's AVG over no values is (a zero-filled public key no row has, mostly)."""
    assert aggregate.interval is not None
    centred_index, count_index = aggregate.components
    if noisy[count_index] < 1:
        return None, None
    count = noisy[count_index]
    mean_grid = Decimal(aggregate.centre) + Decimal(noisy[centred_index]) / Decimal(count)
    value = _from_grid(mean_grid, aggregate.scale)
    value = min(max(value, aggregate.interval.lo), aggregate.interval.hi)
    digits = aggregate.scale + 4
    released = _typed(value.quantize(Decimal(1).scaleb(-digits)), aggregate.result_type, digits)
    counts = noisy_span(noisy[count_index], errors[count_index])
    means = offsets  # a count that may be below 1: nothing is known beyond the bounds
    if counts.lo >= 1:
        sums = noisy_span(noisy[centred_index], errors[centred_index])
        means = quotient(sums, counts).within(offsets) or offsets  # a tuple of two is never false
    span = means.shifted(aggregate.centre).scaleb(-aggregate.scale)
    if ends is None:
        return released, reach(released, span)
    # Narrowed to the test's span (release.pivot), its distances computed as _average_column's.
    value = Decimal(released) if isinstance(released, int | float) else released
    assert isinstance(value, Decimal)
    at = float(value.scaleb(aggregate.scale) - aggregate.centre)
    tested = (np.array([ends[0]]), np.array([ends[1]]))
    below, above = (float(x[0]) for x in distances(tested, np.array([at]), 10.0**aggregate.scale))
    below = min(reach(value, Span(span.lo, value)), below)
    above = min(reach(value, Span(value, span.hi)), above)
    return released, max(below, above)


def _spread(
    aggregate: Aggregate,
    offsets: Span,
    noisy: Sequence[int],
    errors: Sequence[float],
    tested: VarianceSpan | None = None,
) -> tuple[object, float | None]:
    """VAR/STDDEV of one group from its noisy centred squares Q, centred sum S and count N (grid
    units): Var = Q/N − (S/N)², clamped into [0, half-width²]; sample versions scale by N/(N−1) and
    are NULL when the noisy count is below 2, as PostgreSQL's are for fewer than 2 values. Also its
    ± at 95% (`errors`: each component's ± at level 1 − 5%/3; `offsets`: as for AVG; `tested`: the
    population variance's span by test inversion, release.pivot, used instead of interval
    arithmetic); None with a NULL."""
    squares_index, centred_index, count_index = aggregate.components
    half_width = max(-offsets.lo, offsets.hi)
    count = noisy[count_index]
    sample = aggregate.kind in (AggregateKind.VAR_SAMP, AggregateKind.STDDEV_SAMP)
    if count < (2 if sample else 1):
        return None, None
    with localcontext() as ctx:
        ctx.prec = 50
        n = Decimal(count)
        mean = Decimal(noisy[centred_index]) / n
        variance = Decimal(noisy[squares_index]) / n - mean * mean
        variance = min(max(variance, Decimal(0)), Decimal(half_width * half_width))
        if sample:
            variance = variance * n / (n - 1)
        value = variance.scaleb(-2 * aggregate.scale)
        if aggregate.kind in (AggregateKind.STDDEV_POP, AggregateKind.STDDEV_SAMP):
            value = value.sqrt()
    digits = aggregate.scale + 6
    released = float(value) if aggregate.result_type.is_float else value.quantize(Decimal(1).scaleb(-digits))
    return released, reach(released, _spread_span(aggregate, offsets, noisy, errors, tested))


def _spread_span(
    aggregate: Aggregate,
    offsets: Span,
    noisy: Sequence[int],
    errors: Sequence[float],
    tested: VarianceSpan | None = None,
) -> Span:
    """Where the true VAR/STDDEV lies (value units) when Q, S and N are within their bounds.

    Interval arithmetic on Q/N − (S/N)² over Q ∈ [max(Q̃ − eQ, 0), Q̃ + eQ], S ∈ [S̃ ± eS] and
    N ∈ [max(Ñ − eN, m), Ñ + eN], m the fewest values that have a variance (1, or 2 for the sample
    versions), within [0, half-width²], which bounds every population variance of values in bounds;
    then × N/(N − 1) and √ as the aggregate asks. When N may be below m, only the bounds are known.
    With `tested` (release.pivot), the population variance's span is the test's and N's lower bound
    its count's, and only those (their levels add up to 5%; a group whose count may be below m gets
    the bounds, which always hold).
    """
    squares_index, centred_index, count_index = aggregate.components
    ceiling = max(-offsets.lo, offsets.hi)
    sample = aggregate.kind in (AggregateKind.VAR_SAMP, AggregateKind.STDDEV_SAMP)
    least = Decimal(2 if sample else 1)
    bounded = Span(Decimal(0), CEILING.multiply(ceiling, ceiling))
    counts = noisy_span(noisy[count_index], errors[count_index])
    variance: Span | None = None
    if tested is not None:
        counts = Span(Decimal(tested.count_lo), INFINITY)
        if counts.lo >= least:
            variance = Span(Decimal(tested.lo), Decimal(tested.hi)).within(bounded)
    elif counts.lo >= least:
        squares = noisy_span(noisy[squares_index], errors[squares_index]).within(NON_NEGATIVE)
        means = quotient(noisy_span(noisy[centred_index], errors[centred_index]), counts).within(offsets)
        if squares is not None and means is not None:
            variance = quotient(squares, counts).minus(means.squared()).within(bounded)
    if variance is None:
        variance, counts = bounded, Span(least, INFINITY)
    if sample:
        variance = variance.times(Span(bessel(counts.hi, FLOOR), bessel(counts.lo, CEILING)))
    variance = variance.scaleb(-2 * aggregate.scale)
    if aggregate.kind in (AggregateKind.STDDEV_POP, AggregateKind.STDDEV_SAMP):
        return variance.root()
    return variance


def average_error(
    aggregate: Aggregate, noise: QueryNoise, count: int, *, fine_grid: bool = False
) -> float | None:
    """The ± at 95% AVG would be released with for a group whose noisy count is `count` and whose
    noisy sum puts its mean at the middle of the column's range (the console's accuracy planner:
    AVG's ± depends on the group's count)."""
    noisy = [0] * len(noise.columns)
    noisy[aggregate.components[1]] = max(count, 1)
    fine = frozenset(aggregate.components) if fine_grid else frozenset()
    errors = _component_errors(noise, 2, fine)
    offsets = centre_offsets(aggregate)
    pivot = ratio_noise(noise, aggregate.components, fine)
    ends = mean_spans(aggregate, offsets, [noisy], pivot, errors)[0]
    _, error = _average(aggregate, offsets, noisy, errors, ends)
    return error


def column_errors(
    query: PrivateQuery, noise: QueryNoise, group_errors: Sequence[Sequence[float | None]]
) -> list[float | str | None]:
    """The notice's 95% figure of each aggregate, as `release_aggregates` gives it, from the groups'
    own errors (`group_errors`, [group][aggregate]: or, for an answer released in batches, each
    batch's largest, which gives the same largest)."""
    errors95 = _component_errors(noise, 1, fine_components(query))
    chosen_by = selectors(query).by_aggregate
    return [
        _column_error(
            aggregate,
            noise.selectors[chosen_by[a]] if a in chosen_by else None,
            [row[a] for row in group_errors],
            errors95,
        )
        for a, aggregate in enumerate(query.aggregates)
    ]
