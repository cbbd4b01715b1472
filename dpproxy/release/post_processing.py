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
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal

from sqlglot import exp

from dpproxy.errors import DPProxyError, over_released
from dpproxy.sql import postprocess
from dpproxy.sql.postprocess.intervals import interval_slots, slot_name
from dpproxy.sql.query import PostProcessing, SortKey
from dpproxy.sql.types import PgType


def post_process(
    post: PostProcessing,
    key_types: Sequence[PgType],
    aggregate_types: Sequence[PgType],
    keys: Sequence[tuple[object, ...]],
    aggregates: Sequence[Sequence[object]],
    *,
    by_column: bool = False,
) -> list[tuple[object, ...]]:
    """Projection, HAVING, ORDER BY and LIMIT/OFFSET over released values, in that order on rows
    first put in canonical order: by group key, so that nothing of the backend's order (which
    depends on unreleased data) survives, and LIMIT without ORDER BY keeps the first keys.

    `aggregates` is [group][aggregate], or [aggregate][group] with `by_column`; after the aggregates
    come the interval ends the query reads (ReleasedGroups.columns)."""
    processor = PostProcessor(post, key_types, aggregate_types)
    end = None if post.limit is None else post.offset + post.limit
    columns = aggregates if by_column else None
    if processor.project is not None:  # outputs are released columns as they are: a column at a time
        if columns is None:
            columns = [[row[a] for row in aggregates] for a in range(processor.n_aggregates)]
        return processor.project(keys, columns, post.offset, end)
    if columns is not None:
        aggregates = [list(row) for row in zip(*columns, strict=True)] if columns else [[] for _ in keys]
    released = [processor.released(key, values) for key, values in zip(keys, aggregates, strict=True)]
    if key_types:
        released.sort(key=_plain_key(processor, released) or processor.canonical)
    produced = [row for row in released if processor.produce(row)]
    if processor.sort_keys:
        ordering = [[key(row) for key in processor.sort_keys] for row in produced]
        order = sorted(range(len(produced)), key=functools.cmp_to_key(_comparator(post.order_by, ordering)))
        produced = [produced[i] for i in order]
    return [processor.output(row) for row in produced[post.offset : end]]


_Columns = Sequence[Sequence[object]]
_Rows = list[tuple[object, ...]]
# PostProcessor.project: (keys, aggregate columns, offset, end) → the answer's rows.
_Projection = Callable[[_Columns, _Columns, int, int | None], _Rows]
# PostProcessor.emit: (typed key columns, aggregate columns, which groups) → their rows.
_Emission = Callable[[_Columns, _Columns, Sequence[int]], _Rows]


def refuse_constant_errors(post: PostProcessing) -> None:
    """Refuse, before anything is read or charged, a query whose SELECT list, HAVING or ORDER BY
    holds a constant that fails (CAST(32767 AS smallint) + CAST(1 AS smallint): 22003), as
    PostgreSQL's planner does when it folds constants; over released values it would fail after the
    charge. Only the maximal parts without a released value are evaluated."""
    expressions = [o.expression for o in post.outputs] + [k.expression for k in post.order_by]
    if post.having is not None:
        expressions.append(post.having)
    for expression in expressions:
        for part in _constant_parts(expression):
            try:
                postprocess.evaluate(part, {}, {})
            except DPProxyError as error:
                raise error.add_hint("nothing was read or charged") from None


def _constant_parts(node: exp.Expression) -> Iterator[exp.Expression]:
    """The largest computed parts of `node` that read no released value (a column placeholder)."""
    if node.find(exp.Column) is None:
        if isinstance(node, (exp.Binary, exp.Unary, exp.Func, exp.Case)):  # computed, not a literal
            yield node
        return
    for child in node.iter_expressions():
        yield from _constant_parts(child)


def _compiled(
    expression: exp.Expression, types: dict[str, PgType], slots: dict[str, int]
) -> Callable[[Sequence[object]], object]:
    """An expression over a row of released values; its errors (a cast or integer arithmetic that
    leaves its type) are the analyst's, after the charge (errors.over_released)."""
    compute = postprocess.compile_expression(expression, types, slots)

    def over_row(row: Sequence[object]) -> object:
        try:
            return compute(row)
        except DPProxyError as error:
            raise over_released(error) from None

    return over_row


class PostProcessor:
    """One query's post-processing, compiled once, applied row by row: what `post_process` does to
    a whole answer, and what a streamed answer (dpproxy.release.stream) does batch by batch."""

    def __init__(
        self, post: PostProcessing, key_types: Sequence[PgType], aggregate_types: Sequence[PgType]
    ) -> None:
        self.post = post
        self.key_types = tuple(key_types)
        # The released columns of a row: the aggregates, then the interval ends post-processing
        # reads (dp_interval_low/high: dpproxy.sql.postprocess.intervals), as the release gives them.
        ends = interval_slots(post)
        self.n_aggregates = len(aggregate_types) + len(ends)
        types: dict[str, PgType] = {f"__agg_{i}": t for i, t in enumerate(aggregate_types)}
        types.update({slot_name(a, end): aggregate_types[a] for a, end in ends})
        types.update({f"__key_{j}": t for j, t in enumerate(key_types)})
        out_types = {f"__out_{i}": o.type for i, o in enumerate(post.outputs)}
        all_types = {**types, **out_types}
        # A row of released values: aggregates, then keys, then the outputs computed from them.
        slots = {name: i for i, name in enumerate(all_types)}
        self.outputs = [(_compiled(o.expression, types, slots), o.type) for o in post.outputs]
        self.having = _compiled(post.having, types, slots) if post.having is not None else None
        self.sort_keys = [_compiled(k.expression, all_types, slots) for k in post.order_by]
        self.first_output = self.n_aggregates + len(self.key_types)
        # Each key's and output's Python type, when values of it need no conversion (_as_type).
        first_key = self.n_aggregates
        self._keys_as = [(j, t, _PYTHON_TYPES.get(t)) for j, t in enumerate(self.key_types, first_key)]
        self._outputs_as = [(compute, t, _PYTHON_TYPES.get(t)) for compute, t in self.outputs]
        # Without HAVING or ORDER BY, outputs that are each a released column (`SELECT k, COUNT(*)
        # … GROUP BY k`, the commonest shape) are taken a column at a time (`project`).
        columns = [o.expression for o in post.outputs]
        self.project: _Projection | None = None
        self._layout: list[tuple[int, PgType]] = []  # each output's released slot and type
        # The same for groups already in canonical order, their keys typed: (key columns, aggregate
        # columns, which groups) → rows (a streamed batch, dpproxy.release.stream).
        self.emit: _Emission | None = None
        if (
            self.having is None
            and not self.sort_keys
            and all(isinstance(c, exp.Column) and c.name in types for c in columns)
        ):
            self._layout = [(slots[c.name], o.type) for c, o in zip(columns, post.outputs, strict=True)]
            self.project = self._project
            self.emit = self._emit

    def released(self, key: Sequence[object], values: Sequence[object]) -> list[object]:
        """A released group as a row: its aggregates, then its key values as their columns' types."""
        if len(key) != len(self.key_types):
            raise ValueError("a group key has the wrong number of columns")
        row = [*values, *key]
        for j, pg_type, expected in self._keys_as:
            value = row[j]
            if value is not None and type(value) is not expected:
                row[j] = _as_type(value, pg_type)
        return row

    def canonical(self, row: Sequence[object]) -> tuple[tuple[object, ...], ...]:
        """A released row's place in the canonical order (its key's)."""
        return canonical_key(row[self.n_aggregates : self.first_output])

    def produce(self, row: list[object]) -> bool:
        """Whether HAVING keeps a released row; if so, its output columns are appended to it."""
        if self.having is not None and self.having(row) is not True:
            return False
        for compute, pg_type, expected in self._outputs_as:
            value = compute(row)
            row.append(value if value is None or type(value) is expected else _as_type(value, pg_type))
        return True

    def output(self, row: Sequence[object]) -> tuple[object, ...]:
        return tuple(row[self.first_output :])

    def typed_key_columns(self, keys: Sequence[Sequence[object]]) -> list[list[object]]:
        """The keys' columns, each value as its column's type (`released` does it row by row)."""
        if keys and set(map(len, keys)) != {len(self.key_types)}:
            raise ValueError("a group key has the wrong number of columns")
        columns = [list(column) for column in zip(*keys, strict=True)] if keys else []
        if not keys:
            columns = [[] for _ in self.key_types]
        return [_converted(c, t) for c, t in zip(columns, self.key_types, strict=True)]

    def _project(self, keys: _Columns, columns: _Columns, offset: int, end: int | None) -> _Rows:
        """What `released`, the canonical sort, `produce` and `output` give row by row, a column
        at a time, when each output is a released column: key columns converted to their types,
        rows in canonical order (by the values when `plain_columns`, else by `canonical_key`), then
        OFFSET/LIMIT, then each output column converted to the output's type where a value is not
        of it already."""
        if any(len(column) != len(keys) for column in columns):
            raise ValueError("released keys and aggregates differ in length")
        key_columns = self.typed_key_columns(keys)
        order: Sequence[int] = range(len(keys))
        if self.key_types and keys:
            rows = list(zip(*key_columns, strict=True))
            sort_key = rows.__getitem__ if plain_columns(key_columns) else lambda i: canonical_key(rows[i])
            order = sorted(order, key=sort_key)
        return self._emit(key_columns, columns, order[offset:end])

    def _emit(self, key_columns: _Columns, columns: _Columns, order: Sequence[int]) -> _Rows:
        """The output rows of the groups at `order` (key columns already typed): each output column
        converted to the output's type where a value is not of it already."""
        outputs = []
        for index, pg_type in self._layout:
            first_key = self.n_aggregates
            source = columns[index] if index < first_key else key_columns[index - first_key]
            outputs.append(_converted([source[i] for i in order], pg_type))
        return list(zip(*outputs, strict=True)) if outputs else [() for _ in order]


def _converted(values: list[object], pg_type: PgType) -> list[object]:
    """A column's values as its PostgreSQL type's Python values (`_as_type`), copied only if needed."""
    expected = _PYTHON_TYPES.get(pg_type)
    if expected is not None and set(map(type, values)) <= {expected, type(None)}:
        return values
    return [_as_type(v, pg_type) for v in values]


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


def canonical_ranks(key: Sequence[object]) -> tuple[tuple[object, ...], ...]:
    """A group key's ranks in the canonical order: each column ascending, NULLs last, under the
    total order of `_orderable`."""
    return tuple(_orderable(value) if value is not None else (2,) for value in key)


def canonical_key(key: Sequence[object]) -> tuple[tuple[object, ...], ...]:
    """A group key's place in the canonical order: its ranks; then, for keys equal there (which
    distinct groups never are after conversion to their column's type), their text, so that no tie
    is left to the input order."""
    return (*canonical_ranks(key), tuple(repr(value) for value in key))


def plain_columns(key_columns: Sequence[Sequence[object]]) -> bool:
    """Whether every key column holds only str or only int values (never NULL): canonical order is
    then the order of the values themselves (their ranks are (0, kind, value) with one kind per
    column, and keys equal there are equal in text too)."""
    return all(set(map(type, column)) in ({str}, {int}) for column in key_columns)


def _plain_key(
    processor: PostProcessor, rows: Sequence[Sequence[object]]
) -> Callable[[Sequence[object]], Sequence[object]] | None:
    """A faster sort key giving the canonical order when the keys are `plain_columns` (keys equal
    in value stay in input order either way, as a stable sort keeps them). None otherwise."""
    start, end = processor.n_aggregates, processor.first_output
    if not plain_columns([[row[j] for row in rows] for j in range(start, end)]):
        return None
    return lambda row: row[start:end]


def _orderable(value: object) -> tuple[object, ...]:
    """A non-NULL value as a tuple that compares totally and never across Python types: numbers
    by value, NaN after every number (as PostgreSQL sorts it), and values of different kinds
    (which one column never holds after conversion) by the name of their kind, not by value."""
    exact_type = type(value)
    if exact_type is str:  # the commonest keys first: the same tuples as below, sooner
        return (0, "str", value)
    if exact_type is int:
        return (0, "number", value)
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
