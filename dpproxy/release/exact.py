"""The true per-group values, read from the rows the backend returned for a plan's statements.

This module owns ExactGroups (keys, exact integer components, distinct units and histograms per
group) and how the rows of each statement become them: integers checked to be integral, group keys
spelled as a function of their value alone (canonical_value). These are the values before any noise.

Nothing here is ever shown to an analyst: ExactGroups goes to group choice and the noisy release
only. `exact_groups` is also the seam the sensitivity certificates test (through Plan.measure).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from dpproxy.sql.query import PrivateQuery


@dataclass(frozen=True)
class ExactGroups:
    """True per-group values, as the backend computed them, before any noise. Never shown to an analyst."""

    keys: list[tuple[object, ...]]
    components: list[list[int]]  # [group][component]
    units: list[int]  # [group] distinct units present
    histograms: list[list[list[int]]] = field(default_factory=list)  # [group][histogram][candidate]

    def subset(self, indexes: Sequence[int]) -> ExactGroups:
        return ExactGroups(
            [self.keys[i] for i in indexes],
            [self.components[i] for i in indexes],
            [self.units[i] for i in indexes],
            [self.histograms[i] for i in indexes] if self.histograms else [],
        )


def _as_int(value: object) -> int:
    if type(value) is int:  # the common case, first: a million groups read millions of these
        return value
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
    if type(value) in _SPELLED_ONE_WAY:
        return value
    if isinstance(value, float):
        return value + 0.0  # -0.0 + 0.0 is +0.0; other values, NaN included, are unchanged
    if isinstance(value, Decimal) and value.is_finite():
        if value == value.to_integral_value():
            return Decimal(int(value))
        return value.normalize()
    return value


# Types whose equal values have one spelling (checked first: the common keys).
_SPELLED_ONE_WAY = frozenset({str, int, bool, type(None)})


def _canonical_column(values: Sequence[object]) -> Sequence[object]:
    """canonical_value of each value of a column (the column itself when no value needs it)."""
    if set(map(type, values)) <= _SPELLED_ONE_WAY:
        return values
    return [canonical_value(v) for v in values]


def _int_column(values: Sequence[object]) -> Sequence[int]:
    """_as_int of each value of a column (the column itself when every value is an int)."""
    if set(map(type, values)) <= {int}:
        return values  # type: ignore[return-value]
    return [_as_int(v) for v in values]


def canonical_values(values: Sequence[object]) -> tuple[object, ...]:
    return tuple(canonical_value(v) for v in values)


def exact_groups(query: PrivateQuery, *row_sets: Sequence[Sequence[object]]) -> ExactGroups:
    """The true per-group values from the rows of each statement of the plan: the main statement's
    (when the query has one), then the row pipeline's (distinct values first, if the query has any,
    then one statement per histogram)."""
    n_keys, n_components = len(query.keys), len(query.components)
    statements = list(row_sets)
    rows = statements.pop(0) if query.needs_main_statement else []
    keys: list[tuple[object, ...]] = []
    components: list[list[int]] = []
    units: list[int] = []
    if rows:  # a column at a time: a million groups are read as often as that
        columns = list(zip(*rows, strict=True))
        key_columns = [_canonical_column(column) for column in columns[:n_keys]]
        keys = list(zip(*key_columns, strict=True)) if n_keys else [() for _ in rows]
        counts = [_int_column(column) for column in columns[n_keys : n_keys + n_components]]
        components = [list(row) for row in zip(*counts, strict=True)] if n_components else [[] for _ in rows]
        units = list(_int_column(columns[n_keys + n_components]))
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
    return ExactGroups(keys, components, units, histograms if query.histograms else [])
