"""The ends of released aggregates' 95% intervals, as columns (dp_interval_low/high).

This module owns what an interval end is: for counts, sums, averages and spreads the released value
minus or plus its released ±, clamped as the value is and rounded outwards in the aggregate's result
type (interval_column); for MEDIAN and percentiles the edge of the bin an end's own pick chose
(quantile_interval_column, docs/privacy.md §6); and how a picked candidate or an end becomes a value
of the result type. It computes from released values, released ± and the plan's picks only: never a
true value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, localcontext

from dpproxy.privacy import QuantileSpec, SelectorSpec
from dpproxy.release.exact import ExactGroups
from dpproxy.release.spans import Span
from dpproxy.sql.datetimes import from_epoch_grid
from dpproxy.sql.query import Aggregate, AggregateKind, PrivateQuery
from dpproxy.sql.types import PgType

COUNTS = (
    AggregateKind.COUNT,
    AggregateKind.COUNT_VALUES,
    AggregateKind.COUNT_UNITS,
    AggregateKind.COUNT_DISTINCT,
)


def candidate_value(value: object, result_type: PgType) -> object:
    if isinstance(value, Decimal) and result_type.is_temporal:
        return from_epoch_grid(value, result_type)  # MIN/MAX of a date or time: its epoch grid
    if isinstance(value, Decimal):
        if result_type.is_integer:
            return int(value)
        if result_type.is_float:
            return float(value)
    return value


def quantile_interval_column(
    query: PrivateQuery,
    a: int,
    end: str,
    spec: SelectorSpec,
    groups: ExactGroups,
    values: Sequence[object],
) -> list[object]:
    """One end of each released group's 95% interval of a quantile (MEDIAN, PERCENTILE_CONT/DISC):
    the lower edge of the bin `spec` (the low end's pick, its target moved down by QuantileSpec.shift
    ranks) picks from the group's coarse histogram, or the upper edge of the high end's pick (the
    last bin holds only the range's upper bound: that bound). Each end lies beyond the true quantile
    with probability >= 97.5% in every group, whatever its size (privacy.selectors.interval_shift);
    the interval is widened to hold the released value, in the result type, rounded outwards."""
    aggregate = query.aggregates[a]
    histogram = query.histograms[aggregate.histogram]
    assert isinstance(spec, QuantileSpec) and spec.shift != 0
    low = end == "low"
    out: list[object] = []
    for g, value in enumerate(values):
        if value is None:
            out.append(None)
            continue
        j = spec.select(groups.histograms[g][aggregate.histogram])
        edge = histogram.candidate(j if low else min(j + 1, histogram.candidates - 1))
        reached = candidate_value(edge, aggregate.result_type)
        if aggregate.result_type.is_temporal:
            out.append(min(reached, value) if low else max(reached, value))  # type: ignore[type-var]
            continue
        with localcontext() as ctx:
            ctx.prec = 200
            released, bound = Decimal(value), Decimal(reached)  # type: ignore[arg-type]
            bound = min(bound, released) if low else max(bound, released)
            out.append(_outwards(bound, released, aggregate.result_type, low))
    return out


def interval_column(
    aggregate: Aggregate,
    end: str,
    values: Sequence[object],
    group_errors: Sequence[float | None],
    column_error: float | str | None,
) -> list[object]:
    """One end ("low" or "high") of each released group's 95% interval of an aggregate, for
    dp_interval_low/high: the released value minus or plus the group's own ± (AVG, VAR, STDDEV,
    randomized response), else the column's (counts and sums: one noise scale for every group),
    clamped as the value is (counts never below 0, averages within the column's bounds, …), in the
    aggregate's result type, rounded outwards. A function of released values and released ± only.

    It covers the true value whenever the ± does: the ± reaches past every end of the span the true
    value lies in with probability >= 95% (the module docstring), and the true value lies within
    the clamp too. NULL where the value is NULL or has no ±; the exponential mechanism's releases,
    whose bound is a text, are refused when the query is analysed
    (dpproxy.sql.postprocess.intervals)."""
    if aggregate.kind in (AggregateKind.QUANTILE, AggregateKind.MODE):
        raise ValueError("the exponential mechanism's releases have no interval of values")
    floor, ceiling = _interval_clamp(aggregate)
    clipped = _clipped_ends(aggregate)
    low = end == "low"
    out: list[object] = []
    for value, own in zip(values, group_errors, strict=True):
        error = own if own is not None else column_error
        if value is None or not isinstance(error, (int, float)) or not math.isfinite(error):
            out.append(None)
            continue
        with localcontext() as ctx:
            ctx.prec = 200  # exact: a value of at most ~60 digits, a float's exact expansion
            released = Decimal(value)  # type: ignore[arg-type]  # exact, floats included
            reached = released - Decimal(error) if low else released + Decimal(error)
            if clipped is not None:
                # An end at a bound the argument was clipped to: the values beyond it may pull the
                # average as asked anywhere up to the declared bound.
                (clip_low, reach_low), (clip_high, reach_high) = clipped
                if low and reached <= clip_low:
                    reached = reach_low
                if not low and reached >= clip_high:
                    reached = reach_high
            if floor is not None:
                reached = max(reached, floor)
            if ceiling is not None:
                reached = min(reached, ceiling)
            out.append(_outwards(reached, released, aggregate.result_type, low))
    return out


def _clipped_ends(aggregate: Aggregate) -> tuple[tuple[Decimal, Decimal], tuple[Decimal, Decimal]] | None:
    """An AVG whose argument was clipped to a range chosen per query: ((clipped lower bound, declared
    lower bound), (clipped upper, declared upper)); a spread's: ((0, 0), (the most the clipped
    values' spread can be, the most the declared range's can be)) — clipping only lowers a spread,
    so only its high end reaches on; None for any other aggregate."""
    if aggregate.reach is None or aggregate.interval is None:
        return None
    interval, reach = aggregate.interval, aggregate.reach
    if aggregate.kind is AggregateKind.AVG:
        return (interval.lo, reach.lo), (interval.hi, reach.hi)
    if aggregate.kind.is_spread:
        zero = Decimal(0)
        return (zero, zero), (_clipped_spread_ceiling(aggregate), _declared_spread_ceiling(aggregate))
    return None


def _clipped_spread_ceiling(aggregate: Aggregate) -> Decimal:
    """The most a population spread of the (clipped) argument's values can be: the half-width from
    its centre, squared for a variance."""
    offsets = centre_offsets(aggregate)
    half_width = Decimal(max(-offsets.lo, offsets.hi)).scaleb(-aggregate.scale)
    return half_width * half_width if _variance(aggregate) else half_width


def _declared_spread_ceiling(aggregate: Aggregate) -> Decimal:
    """The most a population spread of values within a clipped argument's declared range
    (Aggregate.reach) can be: half its width, squared for a variance."""
    assert aggregate.reach is not None
    half_width = (Decimal(aggregate.reach.hi) - Decimal(aggregate.reach.lo)) / 2
    return half_width * half_width if _variance(aggregate) else half_width


def _variance(aggregate: Aggregate) -> bool:
    return aggregate.kind in (AggregateKind.VAR_POP, AggregateKind.VAR_SAMP)


def _interval_clamp(aggregate: Aggregate) -> tuple[Decimal | None, Decimal | None]:
    """What the release clamps an aggregate's value into, which holds the true value as well (of an
    argument clipped to a range chosen per query, the true value of the statement as asked:
    Aggregate.reach)."""
    if aggregate.kind in COUNTS or aggregate.kind is AggregateKind.COUNT_RESPONSES:
        return Decimal(0), None
    interval = aggregate.interval
    if aggregate.kind is AggregateKind.SUM and interval is not None:
        return (Decimal(0) if interval.lo >= 0 else None), (Decimal(0) if interval.hi <= 0 else None)
    if aggregate.kind is AggregateKind.AVG and interval is not None:
        holds = aggregate.reach or interval
        return Decimal(holds.lo), Decimal(holds.hi)
    if aggregate.kind in (AggregateKind.VAR_POP, AggregateKind.STDDEV_POP) and interval is not None:
        # A population variance of values within the bounds is at most the half-width squared (of
        # an argument clipped per query, of its declared range: the spread as asked); the sample
        # versions' factor n/(n − 1) depends on the noisy count: only 0 bounds them.
        if aggregate.reach is not None:
            return Decimal(0), _declared_spread_ceiling(aggregate)
        return Decimal(0), _clipped_spread_ceiling(aggregate)
    if aggregate.kind.is_spread:
        return Decimal(0), None
    return None, None


def _outwards(value: Decimal, released: Decimal, result_type: PgType, low: bool) -> object:
    """An interval end as the aggregate's result type, rounded away from the interval's inside:
    integers, floats, or decimals at the released value's own number of decimals."""
    rounding = ROUND_FLOOR if low else ROUND_CEILING
    if result_type.is_integer:
        return int(value.to_integral_value(rounding))
    if result_type.is_float:
        nearest = float(value)
        if low and Decimal(nearest) > value:
            return math.nextafter(nearest, -math.inf)
        if not low and Decimal(nearest) < value:
            return math.nextafter(nearest, math.inf)
        return nearest
    exponent = released.as_tuple().exponent
    digits = -exponent if isinstance(exponent, int) and exponent < 0 else 0
    return value.quantize(Decimal(1).scaleb(-digits), rounding=rounding)


def centre_offsets(aggregate: Aggregate) -> Span:
    """The range of a value's offset from the centre (grid units): a mean of them lies in it too."""
    assert aggregate.interval is not None
    lo, hi = aggregate.interval.on_grid(aggregate.scale)
    return Span(Decimal(lo - aggregate.centre), Decimal(hi - aggregate.centre))
