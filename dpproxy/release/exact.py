"""The true per-group values, read from the rows the backend returned for a plan's statements.

This module owns ExactGroups (keys, exact integer components, distinct units and histograms per
group) and how the rows of each statement become them: integers checked to be integral, group keys
spelled as a function of their value alone (canonical_value). These are the values before any noise.

Nothing here is ever shown to an analyst: ExactGroups goes to group choice and the noisy release
only. `exact_groups` is also the seam the sensitivity certificates test (through Plan.measure).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Context, Decimal

from dpproxy.release.distinct import carried_per_group
from dpproxy.sql.bounds import distinct_bounds, estimates_removed, mean_components
from dpproxy.sql.query import ComponentKind, PrivateQuery
from dpproxy.sql.rewrite.row_pipeline import histogram_rows


@dataclass(frozen=True)
class Candidates:
    """With bounds chosen per query (PrivateQuery.bounds): every candidate bound's true values, from
    which the release chooses k and g privately and keeps one (`ExactGroups.resolve`)."""

    components: list[list[list[int]]]  # [group][component][candidate j of k]
    units: list[list[int]]  # [group][candidate j of g]: units counting the group among their first g
    above: list[int]  # [candidate j of k]: units whose rows in all exceed k (each unit once)
    wider: list[int]  # [candidate j of g]: units with more groups than g (each unit once)
    persons: int  # units with a row in the query, each once
    # With PrivateQuery.estimate_left_out: [candidate j of k] the rows' worth k_j takes from the units
    # above it below the ceiling, and what the ceiling keeps of every unit's rows (rewrite.per_group).
    excess: list[int] = field(default_factory=list)
    reach: int = 0
    # The row pipeline's histogram statements' rows: a count per candidate k of each (group, bin).
    histogram_rows: tuple[Sequence[Sequence[object]], ...] = ()


@dataclass(frozen=True)
class ExactGroups:
    """True per-group values, as the backend computed them, before any noise. Never shown to an analyst."""

    keys: list[tuple[object, ...]]
    components: list[list[int]]  # [group][component]
    units: list[int]  # [group] distinct units present
    histograms: list[list[list[int]]] = field(default_factory=list)  # [group][histogram][candidate]
    # Bounds chosen per query: every candidate's values; `components` and `units` then hold the
    # ceiling's until `resolve` keeps the chosen ones.
    candidates: Candidates | None = None
    # Which count of the histogram statements `histograms` holds: the pair of candidates for k and g
    # (the chosen one once resolved; the ceilings' before), 0 when they have one count
    # (row_pipeline.histogram_rows).
    counted_at: int = 0
    # COUNT(DISTINCT x) per person: M(ℓ) of group g's component i at every candidate ℓ
    # (dpproxy.release.distinct), by (g, i); a group without values has none. `components` holds
    # the ceiling's until `carrying` keeps the chosen ℓ's.
    carried: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    # Once partition selection chose a subset: the groups it chose from that hold a person counted
    # there (units > 0), what the estimate of the groups not shown reads (release.left_out).
    present: int | None = None

    def subset(self, indexes: Sequence[int], count_present: bool = False) -> ExactGroups:
        """The groups at `indexes`, partition selection's choice among these; with `count_present`
        (the query estimates the groups not shown: QueryNoise.hidden), how many of these held a
        person (`present`)."""
        assert self.candidates is None and not self.carried, "groups are chosen once the bounds are"
        return ExactGroups(
            [self.keys[i] for i in indexes],
            [self.components[i] for i in indexes],
            [self.units[i] for i in indexes],
            [self.histograms[i] for i in indexes] if self.histograms else [],
            counted_at=self.counted_at,
            present=holding_persons(self.units) if count_present else None,
        )

    def carrying(self, values: int) -> ExactGroups:
        """The COUNT(DISTINCT x) values at candidate ℓ index `values`, no longer every candidate's."""
        components = [list(row) for row in self.components]
        for (g, i), counts in self.carried.items():
            components[g][i] = counts[values]
        return dataclasses.replace(self, components=components, carried={})

    def units_at(self, groups: int | None) -> list[int]:
        """The units per group partition selection reads, at candidate g index `groups` (None: the
        units the statement counted): what `resolve` gives whatever k."""
        found = self.candidates
        if found is None or groups is None:
            return list(self.units)
        return [row[groups] for row in found.units]

    def resolve(
        self, query: PrivateQuery, rows: int, groups: int | None, means: int | None = None
    ) -> ExactGroups:
        """The values at the chosen candidates (indexes into the query's bounds): each component's at
        k (the averages' at their own k, `means`, when the query has two: sql.bounds.mean_components;
        a COUNT(DISTINCT unit)'s, and the units partition selection reads, at g; the row pipeline's
        as computed), no longer any candidate's."""
        found = self.candidates
        if found is None:
            return self
        counted = [None if c.kind.row_pipeline else (c.kind is ComponentKind.UNITS) for c in query.components]
        averaged = mean_components(query) if means is not None else frozenset()
        at = [means if i in averaged else rows for i in range(len(counted))]
        units = self.units_at(groups)
        components = []
        for g, (row, exact) in enumerate(zip(found.components, self.components, strict=True)):
            components.append(
                [
                    exact[i] if kind is None else (units[g] if kind else row[i][at[i]])
                    for i, kind in enumerate(counted)
                ]
            )
        histograms, counted_at = self.histograms, self.counted_at
        if found.histogram_rows:  # the histograms' counts at the chosen k (and g)
            index = {key: g for g, key in enumerate(self.keys)}
            n_keys = len(query.keys)
            histograms = _empty_histograms(query, len(self.keys))
            ranks = histogram_rows(query)
            assert ranks is not None
            counted_at = ranks.column(rows, groups)  # -1: the ceiling's

            def group(row: Sequence[object]) -> int | None:
                return index.get(canonical_values(row[:n_keys]))

            _count(query, found.histogram_rows, group, histograms, counted_at)
        return ExactGroups(self.keys, components, units, histograms, counted_at=counted_at)


def holding_persons(units: Sequence[int]) -> int:
    """The groups with a person counted in them (`units`: per group, what partition selection
    reads): ExactGroups.present."""
    return sum(1 for count in units if count > 0)


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
    noise never hides. Doubles lose the sign of zero; numerics their trailing fractional zeros, and a
    whole numeric is an int, as the PostgreSQL backend loads one of scale 0 (so 30.00 and 30 are one
    key of one type whichever row came first)."""
    if type(value) in _SPELLED_ONE_WAY:
        return value
    if isinstance(value, float):
        if value != value:  # one NaN object: a dict finds a NaN key only by identity
            return _NAN
        return value + 0.0  # -0.0 + 0.0 is +0.0; other values are unchanged
    if isinstance(value, Decimal) and value.is_nan():
        return _DECIMAL_NAN
    if isinstance(value, Decimal) and value.is_finite():
        if value == value.to_integral_value():
            return int(value)
        # Only the trailing zeros go: normalize() in the default context would also round to 28
        # digits and make two keys that differ past them one.
        return value.normalize(Context(prec=max(28, len(value.as_tuple().digits))))
    return value


_NAN = float("nan")
_DECIMAL_NAN = Decimal("NaN")


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


def exact_groups(
    query: PrivateQuery, *row_sets: Sequence[Sequence[object]], salt: int | None = None
) -> ExactGroups:
    """The true per-group values from the rows of each statement of the plan: the main statement's
    (when the query has one), then the row pipeline's (distinct values first, if the query has any,
    then one statement per histogram). `salt` orders each person's values for COUNT(DISTINCT x)
    (dpproxy.release.distinct; random when None)."""
    n_keys, n_components = len(query.keys), len(query.components)
    statements = list(row_sets)
    rows = statements.pop(0) if query.needs_main_statement else []
    keys: list[tuple[object, ...]] = []
    components: list[list[int]] = []
    units: list[int] = []
    chosen = query.bounds is not None and query.needs_main_statement
    candidates = None
    if chosen and rows:
        keys, components, units, candidates = _candidate_columns(query, rows)
    elif rows:  # a column at a time: a million groups are read as often as that
        columns = list(zip(*rows, strict=True))
        key_columns = [_canonical_column(column) for column in columns[:n_keys]]
        keys = list(zip(*key_columns, strict=True)) if n_keys else [() for _ in rows]
        counts = [_int_column(column) for column in columns[n_keys : n_keys + n_components]]
        components = [list(row) for row in zip(*counts, strict=True)] if n_components else [[] for _ in rows]
        units = list(_int_column(columns[n_keys + n_components]))
    if chosen and candidates is None and query.keys:  # no group at all
        assert query.bounds is not None
        j_rows, j_groups = len(query.bounds.rows), len(query.bounds.groups)
        candidates = Candidates([], [], [0] * j_rows, [0] * j_groups, 0, excess=_none_removed(query))
    if not query.keys and not keys:  # an aggregate without GROUP BY has one row; keep the promise
        keys, components, units = [()], [[0] * n_components], [0]
        if chosen:
            assert query.bounds is not None
            j_rows, j_groups = len(query.bounds.rows), len(query.bounds.groups)
            candidates = Candidates([[[0] * j_rows for _ in range(n_components)]], [[0] * j_groups],
                                    [0] * j_rows, [0] * j_groups, 0, excess=_none_removed(query))  # fmt: skip
    index = {key: i for i, key in enumerate(keys)}
    histograms = _empty_histograms(query, len(keys))

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
            histograms.extend(_empty_histograms(query, 1))
        return index.get(key)

    distinct = [i for i, c in enumerate(query.components) if c.kind.row_pipeline]
    carried: dict[tuple[int, int], list[int]] = {}
    if distinct and query.row_level:  # every row its own person: COUNT(DISTINCT x) per group
        for row in statements.pop(0):
            g = group(row)
            if g is not None:
                for offset, i in enumerate(distinct):
                    components[g][i] = _as_int(row[n_keys + offset])
    elif distinct:  # each person's distinct values per group: M(ℓ) at every candidate ℓ
        caps = distinct_bounds(query)
        for i in distinct:
            # (person, value) pairs by group; values are only compared, never shown: not respelled.
            pairs: dict[tuple[object, ...], list[tuple[object, object]]] = {}
            for row in statements.pop(0):
                key = canonical_values(row[:n_keys]) if n_keys else ()
                held = pairs.get(key)
                if held is None:
                    if group(key) is None:  # a group the main statement did not reach
                        continue
                    held = pairs[key] = []
                # The person is the unit, or with null_units: each_a_person the unit and the digest
                # of a row without one (RewriteContext.persons); the value comes last.
                person = tuple(row[n_keys:-1]) if query.relation.null_unit_columns else row[n_keys]
                held.append((person, row[-1]))
            for key, counts in carried_per_group(pairs, caps, salt).items():
                g = index[key]
                carried[g, i] = counts
                components[g][i] = counts[-1]  # the ceiling's until ℓ is chosen
    # Histograms with a count per candidate k hold the ceiling's until the bounds are chosen.
    ranks = histogram_rows(query)
    counted_at = ranks.column(-1, -1) if ranks is not None else 0
    _count(query, statements, group, histograms, counted_at)
    if candidates is not None and ranks is not None:
        candidates = dataclasses.replace(candidates, histogram_rows=tuple(statements))
    histograms = histograms if query.histograms else []
    return ExactGroups(keys, components, units, histograms, candidates, counted_at, carried)


def _none_removed(query: PrivateQuery) -> list[int]:
    """Candidates.excess of a query without a row: 0 at every candidate k when it is estimated."""
    assert query.bounds is not None
    return [0] * len(query.bounds.rows) if estimates_removed(query) else []


def _empty_histograms(query: PrivateQuery, groups: int) -> list[list[list[int]]]:
    return [[[0] * h.candidates for h in query.histograms] for _ in range(groups)]


def _count(
    query: PrivateQuery,
    statements: Sequence[Sequence[Sequence[object]]],
    group: Callable[[Sequence[object]], int | None],
    histograms: list[list[list[int]]],
    counted_at: int,
) -> None:
    """Add each histogram statement's rows (keys, bin, counts) to `histograms`, reading the count
    `counted_at` of each row (candidate j of k; 0 when there is one)."""
    n_keys = len(query.keys)
    for h, statement in enumerate(statements):
        for row in statement:
            g = group(row)
            if g is not None:
                histograms[g][h][_as_int(row[n_keys])] += _as_int(row[n_keys + 1 + counted_at])


def _candidate_columns(
    query: PrivateQuery, rows: Sequence[Sequence[object]]
) -> tuple[list[tuple[object, ...]], list[list[int]], list[int], Candidates]:
    """The main statement's rows with bounds chosen per query (dpproxy.sql.rewrite.per_group): keys,
    each component at every candidate of k, above per candidate of k, units and wider per candidate
    of g, persons, units. `components` and `units` are the ceiling's until the choice."""
    assert query.bounds is not None
    n_keys, n_components = len(query.keys), len(query.components)
    j_rows, j_groups = len(query.bounds.rows), len(query.bounds.groups)
    columns = list(zip(*rows, strict=True))
    key_columns = [_canonical_column(column) for column in columns[:n_keys]]
    keys = list(zip(*key_columns, strict=True)) if n_keys else [() for _ in rows]
    at = n_keys
    per_component = []
    for _ in range(n_components):
        per_component.append([_int_column(c) for c in columns[at : at + j_rows]])
        at += j_rows
    above = [sum(_int_column(c)) for c in columns[at : at + j_rows]]
    at += j_rows
    units_by_g = [_int_column(c) for c in columns[at : at + j_groups]]
    at += j_groups
    wider = [sum(_int_column(c)) for c in columns[at : at + j_groups]]
    at += j_groups
    excess, reach = [], 0
    if estimates_removed(query):
        excess = [sum(_int_column(c)) for c in columns[at : at + j_rows]]
        reach = sum(_int_column(columns[at + j_rows]))
        at += j_rows + 1
    persons = sum(_int_column(columns[at]))
    units = list(_int_column(columns[at + 1]))
    n = len(keys)
    candidate_components = [
        [[int(per_component[i][j][g]) for j in range(j_rows)] for i in range(n_components)] for g in range(n)
    ]
    candidate_units = [[int(units_by_g[j][g]) for j in range(j_groups)] for g in range(n)]
    # Until the choice: the ceilings' values (a COUNT(DISTINCT unit) is the units counted at the
    # largest g, or all units without a count per candidate).
    ceiling_units = [row[-1] for row in candidate_units] if j_groups else units
    counted = [c.kind is ComponentKind.UNITS for c in query.components]
    components = [
        [ceiling_units[g] if counted[i] else values[-1] for i, values in enumerate(group)]
        for g, group in enumerate(candidate_components)
    ]
    found = Candidates(candidate_components, candidate_units, above, wider, persons, excess, reach)
    return keys, components, units, found
