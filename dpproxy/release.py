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
"""

from __future__ import annotations

import functools
import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal, localcontext

from dpproxy.mechanisms import (
    ModeRequest,
    QuantileRequest,
    QueryNoise,
    RandomizedResponseCount,
    SelectorRequest,
    TopKRequest,
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
    # [aggregate] ± at 95% in the aggregate's unit (median over groups), or a sentence for the
    # exponential mechanism's releases (their error is in ranks or counts, not in value units).
    errors: list[float | str | None]


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


def measure(query: PrivateQuery, *row_sets: Sequence[Sequence[object]]) -> Measurement:
    """The true per-group values from the rows of each statement of the plan: the main statement's
    (when the query has one), then the row pipeline's (distinct values first, if the query has any,
    then one statement per histogram)."""
    n_keys, n_components = len(query.keys), len(query.components)
    statements = list(row_sets)
    rows = statements.pop(0) if query.needs_main_statement else []
    keys, components, units = [], [], []
    for row in rows:
        keys.append(tuple(row[:n_keys]))
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
        key = tuple(row[:n_keys])
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
    """The released groups, in output order, with their true values (zeros for absent ones)."""
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
    error = statistics.median(r.error95 for r in released) if released else None
    return ReleasedGroups(groups.keys, rows, [error])


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
    errors95 = [spec.error95() for spec in noise.columns]
    chosen_by = selectors(query).by_aggregate
    released: list[list[object]] = []
    avg_errors: dict[int, list[float]] = {}
    for g in range(len(groups.keys)):
        row: list[object] = []
        for a, aggregate in enumerate(query.aggregates):
            if aggregate.kind in (AggregateKind.QUANTILE, AggregateKind.MODE):
                # The exponential mechanism picks a candidate from the group's true histogram.
                histogram = query.histograms[aggregate.histogram]
                choice = noise.selectors[chosen_by[a]].select(groups.histograms[g][aggregate.histogram])
                row.append(_candidate(histogram.candidate(choice), aggregate.result_type))
            elif aggregate.kind in (
                AggregateKind.COUNT,
                AggregateKind.COUNT_VALUES,
                AggregateKind.COUNT_UNITS,
                AggregateKind.COUNT_DISTINCT,
            ):
                # Noise is integer: counts need no rounding, only clamping at zero.
                row.append(max(0, noisy[g][aggregate.components[0]]))
            elif aggregate.kind is AggregateKind.SUM:
                assert aggregate.interval is not None
                value = _from_grid(noisy[g][aggregate.components[0]], aggregate.scale)
                if aggregate.interval.lo >= 0:
                    value = max(value, Decimal(0))
                elif aggregate.interval.hi <= 0:
                    value = min(value, Decimal(0))
                row.append(_typed(value, aggregate.result_type, aggregate.scale))
            elif aggregate.kind.is_spread:
                value, error = _spread(aggregate, noisy[g], errors95)
                row.append(value)
                avg_errors.setdefault(a, []).append(error)
            else:
                assert aggregate.interval is not None
                centred_index, count_index = aggregate.components
                count = max(noisy[g][count_index], 1)
                mean_grid = Decimal(aggregate.centre) + Decimal(noisy[g][centred_index]) / Decimal(count)
                value = _from_grid(mean_grid, aggregate.scale)
                value = min(max(value, aggregate.interval.lo), aggregate.interval.hi)
                digits = aggregate.scale + 4
                row.append(_typed(value.quantize(Decimal(1).scaleb(-digits)), aggregate.result_type, digits))
                avg_errors.setdefault(a, []).append(
                    _avg_error(
                        errors95[centred_index],
                        errors95[count_index],
                        float(mean_grid) - aggregate.centre,
                        count,
                    )
                    / 10**aggregate.scale
                )
        released.append(row)
    errors: list[float | str | None] = []
    for a, aggregate in enumerate(query.aggregates):
        if aggregate.kind is AggregateKind.QUANTILE:
            spec = noise.selectors[chosen_by[a]]
            bound = spec.rank_error95()
            if aggregate.alpha in (0, 1):
                side = "below" if aggregate.alpha == 0 else "above"
                errors.append(f"at most {bound:.0f} values {side} it")
            else:
                errors.append(f"rank ±{bound:.0f}")
        elif aggregate.kind is AggregateKind.MODE:
            errors.append(f"count within {noise.selectors[chosen_by[a]].count_error95():.0f} of the top")
        elif aggregate.kind.is_spread:
            sample = [e for e in avg_errors.get(a, []) if e is not None]
            errors.append(statistics.median(sample) if sample else None)
        elif aggregate.kind is AggregateKind.AVG:
            width = float(aggregate.interval.hi - aggregate.interval.lo) if aggregate.interval else None
            sample = avg_errors.get(a)
            value = statistics.median(sample) if sample else width
            errors.append(min(value, width) if value is not None and width is not None else value)
        else:
            errors.append(errors95[aggregate.components[0]] / 10**aggregate.scale)
    return ReleasedGroups(groups.keys, released, errors)


def _spread(
    aggregate: Aggregate, noisy: Sequence[int], errors95: Sequence[float]
) -> tuple[object, float | None]:
    """VAR/STDDEV of one group from its noisy centred squares Q, centred sum S and count N (grid
    units): Var = Q/N − (S/N)², clamped into [0, half-width²]; sample versions scale by N/(N−1) and
    are NULL when the noisy count is below 2, as PostgreSQL's are for fewer than 2 values."""
    assert aggregate.interval is not None
    squares_index, centred_index, count_index = aggregate.components
    lo, hi = aggregate.interval.on_grid(aggregate.scale)
    half_width = max(hi - aggregate.centre, aggregate.centre - lo)
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
        unit = Decimal(10) ** (2 * aggregate.scale)
        value = variance / unit
        # First-order error of Q/N − (S/N)² from the ± of Q, S and N (each at 95%).
        e_q, e_s, e_n = errors95[squares_index], errors95[centred_index], errors95[count_index]
        q_over_n = float(noisy[squares_index]) / count
        error = (e_q + 2 * abs(float(mean)) * e_s + abs(q_over_n - 2 * float(mean) ** 2) * e_n) / max(
            count - e_n, 1
        )
        error /= float(unit)
        if aggregate.kind in (AggregateKind.STDDEV_POP, AggregateKind.STDDEV_SAMP):
            root = value.sqrt()
            error = error / (2 * float(root)) if root > 0 else error**0.5
            value = root
    digits = aggregate.scale + 6
    if aggregate.result_type.is_float:
        return float(value), error
    return value.quantize(Decimal(1).scaleb(-digits)), error


def _avg_error(sum_error: float, count_error: float, centred_mean: float, count: int) -> float:
    """± of (c + S/N) when S and N are each within their own bound: (eS + |S/N|·eN) / (N − eN).

    The two 95% bounds hold together with probability ≥ 90%; this is the usual first-order
    estimate, documented as approximate.
    """
    denominator = max(count - count_error, 1.0)
    return (sum_error + abs(centred_mean) * count_error) / denominator


def finish_rows(
    finish: Finish,
    key_types: Sequence[PgType],
    aggregate_types: Sequence[PgType],
    keys: Sequence[tuple[object, ...]],
    aggregates: Sequence[Sequence[object]],
) -> list[tuple[object, ...]]:
    """Projection, HAVING, ORDER BY and LIMIT/OFFSET over released values."""
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
    produced: list[list[object]] = []
    for key, values in zip(keys, aggregates, strict=True):
        row: list[object] = [*values, *(_as_type(v, t) for v, t in zip(key, key_types, strict=True))]
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
            if a == b:
                continue
            less = a < b  # type: ignore[operator]
            result = -1 if less else 1
            return -result if key.descending else result
        return 0

    return compare
