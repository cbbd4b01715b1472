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
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

from dpproxy.mechanisms import QueryNoise
from dpproxy.sql import postprocess
from dpproxy.sql.query import AggregateKind, Finish, PrivateQuery, SortKey
from dpproxy.sql.types import PgType


@dataclass(frozen=True)
class Measurement:
    """True per-group components, as the backend computed them. Never shown to an analyst."""

    keys: list[tuple[object, ...]]
    components: list[list[int]]  # [group][component]
    units: list[int]  # [group] distinct units present


@dataclass(frozen=True)
class ReleasedGroups:
    keys: list[tuple[object, ...]]
    aggregates: list[list[object]]  # [group][aggregate], noisy and post-processed
    errors: list[float | None]  # [aggregate] ± at 95%, in the aggregate's unit (median over groups)


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


def measure(query: PrivateQuery, rows: Sequence[Sequence[object]]) -> Measurement:
    n_keys, n_components = len(query.keys), len(query.components)
    keys, components, units = [], [], []
    for row in rows:
        keys.append(tuple(row[:n_keys]))
        components.append([_as_int(v) for v in row[n_keys : n_keys + n_components]])
        units.append(_as_int(row[n_keys + n_components]))
    if not query.keys and not rows:  # an aggregate without GROUP BY has one row; keep the promise
        keys, components, units = [()], [[0] * n_components], [0]
    return Measurement(keys, components, units)


def choose_groups(query: PrivateQuery, measured: Measurement, noise: QueryNoise) -> Measurement:
    """The released groups, in output order, with their true components (zeros for absent ones)."""
    if not query.keys:
        return measured
    if not query.needs_selection:
        domains = [k.public_values or () for k in query.keys]
        found = {key: i for i, key in enumerate(measured.keys)}
        zeros = [0] * len(query.components)
        keys, components, units = [], [], []
        for key in itertools.product(*domains):
            i = found.get(key)
            keys.append(key)
            components.append(measured.components[i] if i is not None else zeros)
            units.append(measured.units[i] if i is not None else 0)
        return Measurement(keys, components, units)
    assert noise.selection is not None
    kept = noise.selection.select(measured.units)
    return Measurement(
        [measured.keys[i] for i in kept],
        [measured.components[i] for i in kept],
        [measured.units[i] for i in kept],
    )


def add_noise(groups: Measurement, noise: QueryNoise) -> list[list[int]]:
    """Noisy components, [group][component]."""
    n = len(groups.keys)
    noisy = [list(row) for row in groups.components]
    for c, spec in enumerate(noise.columns):
        draws = spec.sample(n)
        for g in range(n):
            noisy[g][c] += draws[g]
    return noisy


def _from_grid(value: Decimal | int, scale: int) -> Decimal:
    return Decimal(value).scaleb(-scale)


def _typed(value: Decimal, result_type: PgType, scale: int) -> object:
    if result_type.is_integer:
        return int(value.to_integral_value(ROUND_HALF_EVEN))
    if result_type.is_float:
        return float(value)
    return value.quantize(Decimal(1).scaleb(-scale)) if scale >= 0 else value


def release_aggregates(query: PrivateQuery, groups: Measurement, noise: QueryNoise) -> ReleasedGroups:
    noisy = add_noise(groups, noise)
    errors95 = [spec.error95() for spec in noise.columns]
    released: list[list[object]] = []
    avg_errors: dict[int, list[float]] = {}
    for g in range(len(groups.keys)):
        row: list[object] = []
        for a, aggregate in enumerate(query.aggregates):
            if aggregate.kind in (AggregateKind.COUNT, AggregateKind.COUNT_VALUES, AggregateKind.COUNT_UNITS):
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
    errors: list[float | None] = []
    for a, aggregate in enumerate(query.aggregates):
        if aggregate.kind is AggregateKind.AVG:
            width = float(aggregate.interval.hi - aggregate.interval.lo) if aggregate.interval else None
            sample = avg_errors.get(a)
            value = statistics.median(sample) if sample else width
            errors.append(min(value, width) if value is not None and width is not None else value)
        else:
            errors.append(errors95[aggregate.components[0]] / 10**aggregate.scale)
    return ReleasedGroups(groups.keys, released, errors)


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
