"""Post-processing of released rows: canonical order, projection, HAVING, ORDER BY, LIMIT.

Canonical order. The backend returns groups in its own (hash-aggregate) order, which depends on the
whole table, groups never released included; partition selection only subsets it. So `post_process`
first puts the released rows in an order that depends on released values only: by group key tuple,
ascending, NULLs last (PostgreSQL's default ORDER BY), over a total, type-safe order (NaN after
every number, as PostgreSQL sorts it). HAVING filters, ORDER BY then sorts stably on top (ties keep
key order), and OFFSET/LIMIT cut last. LIMIT without ORDER BY therefore returns the first rows in
group-key order, never rows the backend happened to return first.

This module only ever sees released values (noisy aggregates, released keys): never a true value,
noise or the backend's order.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from collections.abc import Sequence
from decimal import Decimal

from dpproxy.sql import postprocess
from dpproxy.sql.query import PostProcessing, SortKey
from dpproxy.sql.types import PgType


def post_process(
    post: PostProcessing,
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
    out_types = {f"__out_{i}": o.type for i, o in enumerate(post.outputs)}
    all_types = {**types, **out_types}
    # A row of released values: aggregates, then keys, then the outputs computed from them.
    slots = {name: i for i, name in enumerate(all_types)}
    outputs = [(postprocess.compile_expression(o.expression, types, slots), o.type) for o in post.outputs]
    having = postprocess.compile_expression(post.having, types, slots) if post.having is not None else None
    sort_keys = [postprocess.compile_expression(k.expression, all_types, slots) for k in post.order_by]
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
        order = sorted(range(len(produced)), key=functools.cmp_to_key(_comparator(post.order_by, ordering)))
        produced = [produced[i] for i in order]
    first = n_aggregates + n_keys
    end = None if post.limit is None else post.offset + post.limit
    return [tuple(row[first:]) for row in produced[post.offset : end]]


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
