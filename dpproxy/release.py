"""From the backend's exact, bounded components to released rows.

Order of operations, which is what makes the answer differentially private:
  1. `measure`: read the per-group components the rewritten SQL computed (exact integers).
  2. choose the released groups *without looking at values*: every combination of public keys
     (zero-filled), or DP partition selection on the noisy count of units per group.
  3. add noise to every component of every released group (mechanisms own the samplers).
  4. compute COUNT/SUM/AVG from noisy components (rounding, clamping into bounds).
  5. `finish`: projection, HAVING, ORDER BY, LIMIT — post-processing on released values only.
True values never leave this module: only steps 4–5's output is returned. `measure` is also the
test seam the sensitivity certificates use: it returns true components, and nothing in production
prints or returns them.

Canonical order. The backend returns groups in its own (hash-aggregate) order, which depends on the
whole table, groups never released included; partition selection only subsets it. So `finish_rows`
first puts the released rows in an order that depends on released values only: by group key tuple,
ascending, NULLs last (PostgreSQL's default ORDER BY), over a total, type-safe order (NaN after
every number, as PostgreSQL sorts it). HAVING filters, ORDER BY then sorts stably on top (ties keep
key order), and OFFSET/LIMIT cut last. LIMIT without ORDER BY therefore returns the first rows in
group-key order, never rows the backend happened to return first.

95% error bars. Every ± labelled 95% covers the true value with probability >= 95%, for each
released group: a value derived from k noisy components bounds each at level 1 − 5%/k
(mechanisms.component_alpha, the union bound), and derives its ± by interval arithmetic from those
bounds (AVG: S/N; VAR/STDDEV: Q/N − (S/N)², times N/(N − 1) for the sample versions, then √),
intersected with what the column's bounds allow. The per-column figure of the notice is the largest
over the released groups, so it covers each of them. Counts and sums have one noise scale for all
groups: their ± is the noise's own 95% bound, and clamping at 0 only moves a value towards the true
one.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_EVEN, Context, Decimal, localcontext
from typing import NamedTuple

from dpproxy.mechanisms import (
    ModeRequest,
    ModeSpec,
    QuantileRequest,
    QuantileSpec,
    QueryNoise,
    RandomizedResponseCount,
    SelectorRequest,
    SelectorSpec,
    TopKRequest,
    component_alpha,
)
from dpproxy.sql import postprocess
from dpproxy.sql.query import Aggregate, AggregateKind, Finish, PrivateQuery, SortKey
from dpproxy.sql.types import PgType


@dataclass(frozen=True)
class Measurement:
    """True per-group values, as the backend computed them. Never shown to an analyst."""

    keys: list[tuple[object, ...]]
    components: list[list[int]]  # [group][component]
    units: list[int]  # [group] distinct units present
    histograms: list[list[list[int]]] = field(default_factory=list)  # [group][histogram][candidate]

    def subset(self, indexes: Sequence[int]) -> Measurement:
        return Measurement(
            [self.keys[i] for i in indexes],
            [self.components[i] for i in indexes],
            [self.units[i] for i in indexes],
            [self.histograms[i] for i in indexes] if self.histograms else [],
        )


@dataclass(frozen=True)
class Selectors:
    """Which exponential-mechanism release (QueryNoise.selectors, in request order) serves what."""

    requests: tuple[SelectorRequest, ...]
    by_aggregate: dict[int, int]  # aggregate index -> selector index
    top_k: int | None  # selector index of the top-k selection


def selectors(query: PrivateQuery) -> Selectors:
    """The selector requests of a query, in a fixed order the plan and the release share."""
    requests: list[SelectorRequest] = []
    by_aggregate: dict[int, int] = {}
    r, g = query.max_rows, query.max_groups
    for a, aggregate in enumerate(query.aggregates):
        if aggregate.kind is AggregateKind.QUANTILE:
            assert aggregate.alpha is not None
            histogram = query.histograms[aggregate.histogram]
            by_aggregate[a] = len(requests)
            requests.append(QuantileRequest(aggregate.alpha, histogram.candidates, r, g))
        elif aggregate.kind is AggregateKind.MODE:
            histogram = query.histograms[aggregate.histogram]
            by_aggregate[a] = len(requests)
            requests.append(ModeRequest(histogram.candidates, r, g))
    top_k = None
    if query.top_k is not None:
        component_index, k = query.top_k
        component = query.components[component_index]
        lo, _hi = component.contribution_range(r)
        top_k = len(requests)
        # Counts, and sums of non-negative values, only grow when a person is added.
        requests.append(TopKRequest(k, component.sensitivity(r), monotonic=lo >= 0))
    return Selectors(tuple(requests), by_aggregate, top_k)


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


def _as_int(value: object) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, Decimal) and value == value.to_integral_value():
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    # A non-integral component would break the exact-sum promise: refuse rather than round.
    raise ValueError("backend returned a non-integral component")


def canonical_value(value: object) -> object:
    """A group key as a function of its value alone. GROUP BY keeps the first row's spelling of a
    key, and equal values can be spelled differently: -0.0 and 0.0, numeric 30 and 30.00 (PostgreSQL
    keeps each value's scale). The spelling would then say which row came first — whose presence
    noise never hides. Doubles lose the sign of zero; numerics their trailing fractional zeros."""
    if isinstance(value, float):
        return value + 0.0  # -0.0 + 0.0 is +0.0; other values, NaN included, are unchanged
    if isinstance(value, Decimal) and value.is_finite():
        if value == value.to_integral_value():
            return Decimal(int(value))
        return value.normalize()
    return value


def canonical_values(values: Sequence[object]) -> tuple[object, ...]:
    return tuple(canonical_value(v) for v in values)


def measure(query: PrivateQuery, *row_sets: Sequence[Sequence[object]]) -> Measurement:
    """The true per-group values from the rows of each statement of the plan: the main statement's
    (when the query has one), then the row pipeline's (distinct values first, if the query has any,
    then one statement per histogram)."""
    n_keys, n_components = len(query.keys), len(query.components)
    statements = list(row_sets)
    rows = statements.pop(0) if query.needs_main_statement else []
    keys, components, units = [], [], []
    for row in rows:
        keys.append(canonical_values(row[:n_keys]))
        components.append([_as_int(v) for v in row[n_keys : n_keys + n_components]])
        units.append(_as_int(row[n_keys + n_components]))
    if not query.keys and not keys:  # an aggregate without GROUP BY has one row; keep the promise
        keys, components, units = [()], [[0] * n_components], [0]
    index = {key: i for i, key in enumerate(keys)}
    histograms = [[[0] * h.candidates for h in query.histograms] for _ in keys]

    def group(row: Sequence[object]) -> int | None:
        """The group of a row pipeline's row. With a main statement, every group the bounded rows
        reach is one it has; without, the groups are those the row pipeline reaches (no group is
        selected by its count of units then: the keys are public or there are none)."""
        key = canonical_values(row[:n_keys])
        if key not in index and not query.needs_main_statement:
            index[key] = len(keys)
            keys.append(key)
            components.append([0] * n_components)
            units.append(0)
            histograms.append([[0] * h.candidates for h in query.histograms])
        return index.get(key)

    distinct = [i for i, c in enumerate(query.components) if c.kind.row_pipeline]
    if distinct:
        for row in statements.pop(0):
            g = group(row)
            if g is not None:
                for offset, i in enumerate(distinct):
                    components[g][i] = _as_int(row[n_keys + offset])
    for h, statement in enumerate(statements):
        for row in statement:
            g = group(row)
            if g is not None:
                histograms[g][h][_as_int(row[n_keys])] += _as_int(row[n_keys + 1])
    return Measurement(keys, components, units, histograms if query.histograms else [])


def choose_groups(query: PrivateQuery, measured: Measurement, noise: QueryNoise) -> Measurement:
    """The released groups with their true values (zeros for absent ones), in no meaningful order:
    finish_rows puts released rows in canonical order."""
    if not query.keys:
        return measured
    if not query.needs_selection:
        domains = [k.public_values or () for k in query.keys]
        found = {key: i for i, key in enumerate(measured.keys)}
        zeros = [0] * len(query.components)
        empty = [[0] * h.candidates for h in query.histograms]
        keys, components, units, histograms = [], [], [], []
        for key in itertools.product(*domains):
            i = found.get(key)
            keys.append(key)
            components.append(measured.components[i] if i is not None else zeros)
            units.append(measured.units[i] if i is not None else 0)
            histograms.append(measured.histograms[i] if i is not None and measured.histograms else empty)
        groups = Measurement(keys, components, units, histograms if query.histograms else [])
    else:
        assert noise.selection is not None
        groups = measured.subset(noise.selection.select(measured.units))
    plan = selectors(query)
    if plan.top_k is not None and query.top_k is not None:
        component_index, _k = query.top_k
        spec = noise.selectors[plan.top_k]
        groups = groups.subset(spec.select([row[component_index] for row in groups.components]))
    return groups


def add_noise(groups: Measurement, noise: QueryNoise) -> list[list[int]]:
    """Noisy components, [group][component]."""
    n = len(groups.keys)
    noisy = [list(row) for row in groups.components]
    for c, spec in enumerate(noise.columns):
        draws = spec.sample(n)
        for g in range(n):
            noisy[g][c] += draws[g]
    return noisy


def _release_responses(groups: Measurement, responses: RandomizedResponseCount) -> ReleasedGroups:
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
    groups: Measurement,
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
    aggregate: Aggregate, offsets: _Span, noisy: Sequence[int], errors: Sequence[float]
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
    counts = _noisy_span(noisy[count_index], errors[count_index])
    means = offsets  # a count that may be below 1: nothing is known beyond the bounds
    if counts.lo >= 1:
        sums = _noisy_span(noisy[centred_index], errors[centred_index])
        means = _quotient(sums, counts).within(offsets) or offsets  # a tuple of two is never false
    return released, _reach(released, means.shifted(aggregate.centre).scaleb(-aggregate.scale))


def _spread(
    aggregate: Aggregate, offsets: _Span, noisy: Sequence[int], errors: Sequence[float]
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
    return released, _reach(released, _spread_span(aggregate, offsets, noisy, errors))


def _spread_span(
    aggregate: Aggregate, offsets: _Span, noisy: Sequence[int], errors: Sequence[float]
) -> _Span:
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
    bounded = _Span(Decimal(0), _CEILING.multiply(ceiling, ceiling))
    counts = _noisy_span(noisy[count_index], errors[count_index])
    variance: _Span | None = None
    if counts.lo >= least:
        squares = _noisy_span(noisy[squares_index], errors[squares_index]).within(_NON_NEGATIVE)
        means = _quotient(_noisy_span(noisy[centred_index], errors[centred_index]), counts).within(offsets)
        if squares is not None and means is not None:
            variance = _quotient(squares, counts).minus(means.squared()).within(bounded)
    if variance is None:
        variance, counts = bounded, _Span(least, _INFINITY)
    if sample:
        variance = variance.times(_Span(_bessel(counts.hi, _FLOOR), _bessel(counts.lo, _CEILING)))
    variance = variance.scaleb(-2 * aggregate.scale)
    if aggregate.kind in (AggregateKind.STDDEV_POP, AggregateKind.STDDEV_SAMP):
        return variance.root()
    return variance


# --------------------------------------------------------------------------------------------------
# Interval arithmetic for error bars, rounded outwards: every span holds the exact one.

_FLOOR = Context(prec=60, rounding=ROUND_FLOOR)
_CEILING = Context(prec=60, rounding=ROUND_CEILING)
_EXACT = Context(prec=130)  # products of two 60-digit numbers, unrounded
_INFINITY = Decimal("Infinity")


class _Span(NamedTuple):
    """A closed interval [lo, hi] of Decimals (either end may be infinite). A tuple: error bars
    build several per group and aggregate, and tuples are the cheapest to build."""

    lo: Decimal
    hi: Decimal

    def within(self, other: _Span) -> _Span | None:
        """The intersection; None when empty (the bounds it came from did not all hold)."""
        lo, hi = max(self.lo, other.lo), min(self.hi, other.hi)
        return _Span(lo, hi) if lo <= hi else None

    def minus(self, other: _Span) -> _Span:
        return _Span(_FLOOR.subtract(self.lo, other.hi), _CEILING.subtract(self.hi, other.lo))

    def times(self, other: _Span) -> _Span:
        """The product of two spans of non-negative numbers."""
        assert self.lo >= 0 and other.lo >= 0
        return _Span(_FLOOR.multiply(self.lo, other.lo), _CEILING.multiply(self.hi, other.hi))

    def squared(self) -> _Span:
        low = min(abs(self.lo), abs(self.hi)) if self.lo > 0 or self.hi < 0 else Decimal(0)
        high = max(abs(self.lo), abs(self.hi))
        return _Span(_FLOOR.multiply(low, low), _CEILING.multiply(high, high))

    def root(self) -> _Span:
        """√ of a span of non-negative numbers."""
        return _Span(_root(self.lo, _FLOOR), _root(self.hi, _CEILING))

    def shifted(self, offset: int) -> _Span:
        return _Span(_FLOOR.add(self.lo, Decimal(offset)), _CEILING.add(self.hi, Decimal(offset)))

    def scaleb(self, exponent: int) -> _Span:
        """× 10^exponent, exact: from grid units to the column's."""
        return _Span(self.lo.scaleb(exponent, _FLOOR), self.hi.scaleb(exponent, _CEILING))


_NON_NEGATIVE = _Span(Decimal(0), _INFINITY)


def _root(value: Decimal, context: Context) -> Decimal:
    """√value rounded as `context` rounds (down or up). Decimal's sqrt rounds to nearest: the
    result is stepped once outwards when its exact square shows it on the wrong side."""
    if value.is_infinite() or value == 0:
        return value
    root = context.sqrt(value)
    square = _EXACT.multiply(root, root)
    if context.rounding == ROUND_FLOOR and square > value:
        return context.next_minus(root)
    if context.rounding == ROUND_CEILING and square < value:
        return context.next_plus(root)
    return root


def _noisy_span(noisy: int, error: float) -> _Span:
    """Where the true component lies when its noise is within ±error."""
    value, margin = Decimal(noisy), Decimal(error)
    return _Span(_FLOOR.subtract(value, margin), _CEILING.add(value, margin))


def _offsets(aggregate: Aggregate) -> _Span:
    """The range of a value's offset from the centre (grid units): a mean of them lies in it too."""
    assert aggregate.interval is not None
    lo, hi = aggregate.interval.on_grid(aggregate.scale)
    return _Span(Decimal(lo - aggregate.centre), Decimal(hi - aggregate.centre))


def _quotient(numerator: _Span, denominator: _Span) -> _Span:
    """{s/n} over the box, for a denominator > 0: s/n is monotone in n for each s, so the ends are
    at the corners, the lower one at the smallest s, the upper one at the largest."""
    assert denominator.lo > 0
    lows = (_FLOOR.divide(numerator.lo, n) for n in (denominator.lo, denominator.hi))
    highs = (_CEILING.divide(numerator.hi, n) for n in (denominator.lo, denominator.hi))
    return _Span(min(lows), max(highs))


def _bessel(count: Decimal, context: Context) -> Decimal:
    """N/(N − 1), the sample variance's factor (falling in N; 1 in the limit), rounded as `context`."""
    if count.is_infinite():
        return Decimal(1)
    return context.divide(count, count - 1)


def _reach(released: object, span: _Span) -> float:
    """The ± from a released value that reaches both ends of `span`: it covers every value in it.
    Rounded up to a float, so that the figure shown is never below the exact one."""
    value = Decimal(released) if isinstance(released, int | float) else released
    assert isinstance(value, Decimal)
    distance = max(_CEILING.subtract(value, span.lo), _CEILING.subtract(span.hi, value))
    figure = float(distance)
    return math.nextafter(figure, math.inf) if Decimal(figure) < distance else figure


def finish_rows(
    finish: Finish,
    key_types: Sequence[PgType],
    aggregate_types: Sequence[PgType],
    keys: Sequence[tuple[object, ...]],
    aggregates: Sequence[Sequence[object]],
) -> list[tuple[object, ...]]:
    """Projection, HAVING, ORDER BY and LIMIT/OFFSET over released values, in that order on rows
    first put in canonical order: by group key, so that nothing of the backend's order (which
    depends on unreleased data) survives, and LIMIT without ORDER BY keeps the first keys."""
    n_aggregates, n_keys = len(aggregate_types), len(key_types)
    types: dict[str, PgType] = {f"__agg_{i}": t for i, t in enumerate(aggregate_types)}
    types.update({f"__key_{j}": t for j, t in enumerate(key_types)})
    out_types = {f"__out_{i}": o.type for i, o in enumerate(finish.outputs)}
    all_types = {**types, **out_types}
    # A row of released values: aggregates, then keys, then the outputs computed from them.
    slots = {name: i for i, name in enumerate(all_types)}
    outputs = [(postprocess.compile_expression(o.expression, types, slots), o.type) for o in finish.outputs]
    having = (
        postprocess.compile_expression(finish.having, types, slots) if finish.having is not None else None
    )
    sort_keys = [postprocess.compile_expression(k.expression, all_types, slots) for k in finish.order_by]
    released = [
        [*values, *(_as_type(v, t) for v, t in zip(key, key_types, strict=True))]
        for key, values in zip(keys, aggregates, strict=True)
    ]
    if n_keys:
        released.sort(key=lambda row: canonical_key(row[n_aggregates:]))
    produced: list[list[object]] = []
    for row in released:
        if having is not None and having(row) is not True:
            continue
        row.extend(_as_type(compute(row), pg_type) for compute, pg_type in outputs)
        produced.append(row)
    if sort_keys:
        ordering = [[key(row) for key in sort_keys] for row in produced]
        order = sorted(range(len(produced)), key=functools.cmp_to_key(_comparator(finish.order_by, ordering)))
        produced = [produced[i] for i in order]
    first = n_aggregates + n_keys
    end = None if finish.limit is None else finish.offset + finish.limit
    return [tuple(row[first:]) for row in produced[finish.offset : end]]


_PYTHON_TYPES: dict[PgType, type] = {
    PgType.INT2: int,
    PgType.INT4: int,
    PgType.INT8: int,
    PgType.NUMERIC: Decimal,
    PgType.FLOAT8: float,
    PgType.FLOAT4: float,
    PgType.TEXT: str,
    PgType.VARCHAR: str,
    PgType.BOOL: bool,
}


def _as_type(value: object, pg_type: PgType) -> object:
    """A key value as its PostgreSQL type's Python value (cheap when it already is one)."""
    expected = _PYTHON_TYPES.get(pg_type)
    if value is None or (expected is not None and type(value) is expected):
        return value
    return postprocess.convert(value, pg_type)


def canonical_key(key: Sequence[object]) -> tuple[tuple[object, ...], ...]:
    """A group key's place in the canonical order: each column ascending, NULLs last, under the
    total order of `_orderable`; then, for keys equal there (which distinct groups never are after
    conversion to their column's type), their text, so that no tie is left to the input order."""
    ranks = tuple(_orderable(value) if value is not None else (2,) for value in key)
    return (*ranks, tuple(repr(value) for value in key))


def _orderable(value: object) -> tuple[object, ...]:
    """A non-NULL value as a tuple that compares totally and never across Python types: numbers
    by value, NaN after every number (as PostgreSQL sorts it), and values of different kinds
    (which one column never holds after conversion) by the name of their kind, not by value."""
    if (isinstance(value, float) and math.isnan(value)) or (isinstance(value, Decimal) and value.is_nan()):
        return (1,)
    if isinstance(value, int | float | Decimal) and not isinstance(value, bool):
        return (0, "number", value)
    kind = type(value).__name__
    if isinstance(value, dt.datetime) and value.utcoffset() is not None:
        kind += " with time zone"  # aware and naive datetimes do not compare
    return (0, kind, value)


def _comparator(order_by: Sequence[SortKey], values: list[list[object]]):
    def compare(i: int, j: int) -> int:
        for k, key in enumerate(order_by):
            a, b = values[i][k], values[j][k]
            if a is None or b is None:
                if a is None and b is None:
                    continue
                # NULL sorts as larger than any value unless NULLS FIRST says otherwise.
                a_first = (a is None) == key.nulls_first
                return -1 if a_first else 1
            rank_a, rank_b = _orderable(a), _orderable(b)
            if rank_a == rank_b:
                continue
            result = -1 if rank_a < rank_b else 1
            return -result if key.descending else result
        return 0

    return compare
