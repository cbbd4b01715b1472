"""Noisy aggregates of the released groups, with their 95% error bars.

This module owns steps 3 and 4 of a release: noise added to every component of every released group
(dpproxy.privacy owns the samplers), then COUNT, SUM, AVG, VAR and STDDEV computed from the noisy
components (rounding, clamping into the column's bounds), the exponential mechanism's picks for
quantiles and MODE, and randomized-response counts.

95% error bars. Every ± labelled 95% covers the true value with probability >= 95%, for each
released group: a value derived from k noisy components bounds each at level 1 − 5%/k
(dpproxy.privacy.component_alpha, the union bound), and derives its ± by interval arithmetic from
those bounds (AVG: S/N; VAR/STDDEV: Q/N − (S/N)², times N/(N − 1) for the sample versions, then √),
intersected with what the column's bounds allow. The per-column figure of the notice is the largest
over the released groups, so it covers each of them. Counts and sums have one noise scale for all
groups: their ± is the noise's own 95% bound, and clamping at 0 only moves a value towards the true
one.

It never chooses groups or orders rows, and returns no true value: only noisy ones and their bounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal, localcontext

from dpproxy.privacy import (
    ModeSpec,
    QuantileSpec,
    QueryNoise,
    RandomizedResponseCount,
    SelectorSpec,
    component_alpha,
)
from dpproxy.release.exact import ExactGroups
from dpproxy.release.requests import selectors
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
from dpproxy.sql.query import Aggregate, AggregateKind, PrivateQuery
from dpproxy.sql.types import PgType


@dataclass(frozen=True)
class ReleasedGroups:
    keys: list[tuple[object, ...]]
    aggregates: list[list[object]]  # [group][aggregate], noisy and post-processed
    # [aggregate] ± at 95% in the aggregate's unit that holds for every released group (the largest
    # of the groups' own), or a sentence for the exponential mechanism's releases (their error is in
    # ranks or counts, not in value units).
    errors: list[float | str | None]
    # [group][aggregate] the group's own ± at 95% where it depends on the group's noisy values (AVG,
    # VAR, STDDEV, randomized response); None where the column's figure is the same for every group.
    group_errors: list[list[float | None]] = field(default_factory=list)


def add_noise(groups: ExactGroups, noise: QueryNoise) -> list[list[int]]:
    """Noisy components, [group][component]."""
    n = len(groups.keys)
    noisy = [list(row) for row in groups.components]
    for c, spec in enumerate(noise.columns):
        draws = spec.sample(n)
        for g in range(n):
            noisy[g][c] += draws[g]
    return noisy


def _release_responses(groups: ExactGroups, responses: RandomizedResponseCount) -> ReleasedGroups:
    """COUNT by randomized response: the debiased estimate from the groups' noisy tallies of reports."""
    ones = [row[0] for row in groups.components]  # persons for whom the predicate holds
    zeros = [row[1] - row[0] for row in groups.components]  # the other persons of the group
    released = responses.release(ones, zeros)
    rows: list[list[object]] = [[max(0, round(r.estimate))] for r in released]
    # Rounding an estimate within ±e of an integer count lands within ±⌈e⌉ of it; clamping at 0 only
    # brings it nearer. The largest over groups holds for each (their ± depends on their noisy n).
    group_errors: list[list[float | None]] = [[float(math.ceil(r.error95))] for r in released]
    error = max((e for [e] in group_errors if e is not None), default=None)
    return ReleasedGroups(groups.keys, rows, [error], group_errors)


def _candidate(value: object, result_type: PgType) -> object:
    if isinstance(value, Decimal):
        if result_type.is_integer:
            return int(value)
        if result_type.is_float:
            return float(value)
    return value


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
) -> ReleasedGroups:
    if query.randomized_response:
        assert responses is not None
        return _release_responses(groups, responses)
    noisy = add_noise(groups, noise)
    # Each component's ± at the level a figure derived from 1, 2 (AVG) or 3 (VAR) of them needs.
    bounds = {k: _component_errors(noise, k) for k in {1, *(_parts(a) for a in query.aggregates)}}
    chosen_by = selectors(query).by_aggregate
    offsets = [
        _offsets(a) if a.kind.is_spread or a.kind is AggregateKind.AVG else None for a in query.aggregates
    ]
    released: list[list[object]] = []
    group_errors: list[list[float | None]] = []
    for g in range(len(groups.keys)):
        row: list[object] = []
        row_errors: list[float | None] = []
        for a, aggregate in enumerate(query.aggregates):
            error: float | None = None
            if aggregate.kind in (AggregateKind.QUANTILE, AggregateKind.MODE):
                # The exponential mechanism picks a candidate from the group's true histogram.
                histogram = query.histograms[aggregate.histogram]
                choice = noise.selectors[chosen_by[a]].select(groups.histograms[g][aggregate.histogram])
                value = _candidate(histogram.candidate(choice), aggregate.result_type)
            elif aggregate.kind in (
                AggregateKind.COUNT,
                AggregateKind.COUNT_VALUES,
                AggregateKind.COUNT_UNITS,
                AggregateKind.COUNT_DISTINCT,
            ):
                # Noise is integer: counts need no rounding, only clamping at zero.
                value = max(0, noisy[g][aggregate.components[0]])
            elif aggregate.kind is AggregateKind.SUM:
                value = _sum(aggregate, noisy[g])
            elif aggregate.kind.is_spread:
                value, error = _spread(aggregate, offsets[a], noisy[g], bounds[_parts(aggregate)])
            else:
                value, error = _average(aggregate, offsets[a], noisy[g], bounds[_parts(aggregate)])
            row.append(value)
            row_errors.append(error)
        released.append(row)
        group_errors.append(row_errors)
    errors = [
        _column_error(
            aggregate,
            noise.selectors[chosen_by[a]] if a in chosen_by else None,
            [row[a] for row in group_errors],
            bounds[1],
        )
        for a, aggregate in enumerate(query.aggregates)
    ]
    return ReleasedGroups(groups.keys, released, errors, group_errors)


def _parts(aggregate: Aggregate) -> int:
    """How many noisy components an aggregate's ± combines: AVG a centred sum and a count, VAR and
    STDDEV the centred squares too; counts and sums have one."""
    if aggregate.kind is AggregateKind.AVG or aggregate.kind.is_spread:
        return len(aggregate.components)
    return 1


def _component_errors(noise: QueryNoise, parts: int) -> list[float]:
    """Each component's ± (grid units) at level 1 − 5%/parts: the bounds a figure derived from
    `parts` components combines, all holding together with probability >= 95% (union bound)."""
    alpha = component_alpha(parts)
    return [spec.error_at(alpha) for spec in noise.columns]


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
    aggregate: Aggregate, offsets: Span, noisy: Sequence[int], errors: Sequence[float]
) -> tuple[object, float]:
    """AVG of one group, c + S/N from its noisy centred sum S and count N (grid units), clamped into
    the column's bounds, and its ± at 95% (`errors`: each component's ± at level 1 − 5%/2;
    `offsets`: the range of a value's offset from the centre c)."""
    assert aggregate.interval is not None
    centred_index, count_index = aggregate.components
    count = max(noisy[count_index], 1)
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
    return released, reach(released, means.shifted(aggregate.centre).scaleb(-aggregate.scale))


def _spread(
    aggregate: Aggregate, offsets: Span, noisy: Sequence[int], errors: Sequence[float]
) -> tuple[object, float | None]:
    """VAR/STDDEV of one group from its noisy centred squares Q, centred sum S and count N (grid
    units): Var = Q/N − (S/N)², clamped into [0, half-width²]; sample versions scale by N/(N−1) and
    are NULL when the noisy count is below 2, as PostgreSQL's are for fewer than 2 values. Also its
    ± at 95% (`errors`: each component's ± at level 1 − 5%/3; `offsets`: as for AVG); None with
    a NULL."""
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
    return released, reach(released, _spread_span(aggregate, offsets, noisy, errors))


def _spread_span(aggregate: Aggregate, offsets: Span, noisy: Sequence[int], errors: Sequence[float]) -> Span:
    """Where the true VAR/STDDEV lies (value units) when Q, S and N are within their bounds.

    Interval arithmetic on Q/N − (S/N)² over Q ∈ [max(Q̃ − eQ, 0), Q̃ + eQ], S ∈ [S̃ ± eS] and
    N ∈ [max(Ñ − eN, m), Ñ + eN], m the fewest values that have a variance (1, or 2 for the sample
    versions), within [0, half-width²], which bounds every population variance of values in bounds;
    then × N/(N − 1) and √ as the aggregate asks. When N may be below m, only the bounds are known.
    """
    squares_index, centred_index, count_index = aggregate.components
    ceiling = max(-offsets.lo, offsets.hi)
    sample = aggregate.kind in (AggregateKind.VAR_SAMP, AggregateKind.STDDEV_SAMP)
    least = Decimal(2 if sample else 1)
    bounded = Span(Decimal(0), CEILING.multiply(ceiling, ceiling))
    counts = noisy_span(noisy[count_index], errors[count_index])
    variance: Span | None = None
    if counts.lo >= least:
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


def _offsets(aggregate: Aggregate) -> Span:
    """The range of a value's offset from the centre (grid units): a mean of them lies in it too."""
    assert aggregate.interval is not None
    lo, hi = aggregate.interval.on_grid(aggregate.scale)
    return Span(Decimal(lo - aggregate.centre), Decimal(hi - aggregate.centre))
