"""Which contribution bounds a private query chooses from (docs/privacy.md §3, "Bounds chosen per
query"): the candidates for k, a person's rows in the whole query, and for g, the groups a person
counts in for partition selection and COUNT(DISTINCT unit), within the ceilings the policy's
max_rows_per_unit (a person's rows in one query) and max_groups_per_unit (their groups) set.

Candidates are the powers of two below a ceiling, then the ceiling itself: a handful of columns per
component in the main statement, and a choice whose error is at most a factor of two in the bound.
Nothing here reads data or chooses: the release does (dpproxy.privacy.bounds).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from decimal import Decimal

from sqlglot import exp

from dpproxy.errors import DPProxyError
from dpproxy.sql.nodes import parse_postgres
from dpproxy.sql.query import FINE, AggregateKind, ComponentKind, ContributionBounds, PrivateQuery
from dpproxy.sql.rowexpr.constants import constant_value


def candidates(ceiling: int) -> tuple[int, ...]:
    """1, 2, 4, … below `ceiling`, then `ceiling`."""
    found = []
    k = 1
    while k < ceiling:
        found.append(k)
        k *= 2
    return (*found, max(1, ceiling))


def contribution_bounds(query: PrivateQuery) -> ContributionBounds | None:
    """The bounds `query` chooses from, or None when its bounds are fixed: a table fixes them
    (`contribution_bounds: fixed`, or `row_bounding: sample`), every row is its own person, or the
    query is answered by randomized response."""
    if query.row_level or query.relation.fixed_bounds or query.sample_rows or query.randomized_response:
        return None
    # max_rows_per_unit is the ceiling of a person's rows in the whole query (and so in one group).
    row_cap = query.relation.max_rows
    group_cap = query.max_groups
    ceiling = row_cap
    counts_units = bool(query.keys) and (
        query.needs_selection or any(c.kind is ComponentKind.UNITS for c in query.components)
    )
    return ContributionBounds(
        rows=candidates(ceiling) if reads_rows(query) else (ceiling,),
        groups=candidates(group_cap) if counts_units else (),
        row_cap=row_cap,
        group_cap=group_cap,
    )


def reads_rows(query: PrivateQuery) -> bool:
    """Whether any value the query releases depends on k, a person's rows: not when it releases
    persons alone (COUNT(DISTINCT unit), the groups partition selection shows). Such a query has one
    candidate for k and spends nothing choosing it (the flights' planes per carrier: the threshold
    of persons a group needs went from 76 to 74 at ε = 0.5), and its notice does not speak of rows."""
    return bool(query.histograms) or any(c.kind is not ComponentKind.UNITS for c in query.components)


def counts_every_row(query: PrivateQuery) -> bool:
    """Whether k counts each of a person's rows (a COUNT(*), a COUNT(DISTINCT x), randomized
    response, or no value read from the rows), or only those whose values are not all NULL or 0,
    which alone add to what it releases (`rewrite/per_unit.counted_rows`): `SUM(CASE WHEN late THEN 1
    ELSE 0 END)` bounds a person's late rows."""
    return (
        bool(query.histograms)
        or not query.valued_components
        or any(
            c.kind in (ComponentKind.ROWS, ComponentKind.DISTINCT_VALUES, ComponentKind.ANY_UNITS)
            for c in query.components
        )
    )


def keeps_rows_by_condition(query: PrivateQuery) -> bool:
    """Whether k counts only some of a person's rows (not counts_every_row) because an aggregate
    keeps rows by a condition of its own: its argument a CASE with a branch that adds nothing — NULL
    (what a FILTER becomes), or 0 in a SUM (`SUM(CASE WHEN late THEN 1 ELSE 0 END)`). The condition
    then acts as a WHERE, and k's floor at a quarter of the ceiling, which speaks of all a person's
    rows, holds no more than under one: the late departures per month were 14% off at the floor's
    k = 512 of 600 (a plane has about 150 of them at most), 7.5% at k = 128. An AVG of a column
    keeps its floor: its rows with a value are nearly all of them, and without the floor MovieLens'
    average rating was covered in 6 runs of 10 instead of 10."""
    if counts_every_row(query):
        return False
    for aggregate in query.aggregates:
        call = parse_postgres(aggregate.text)
        argument = _own_argument(call.this if isinstance(call, exp.Func) else None)
        if not isinstance(argument, exp.Case):
            continue
        branches = [branch.args.get("true") for branch in argument.args.get("ifs") or []]
        branches.append(argument.args.get("default"))
        for branch in branches:
            if branch is None or isinstance(branch, exp.Null):
                return True
            if aggregate.kind is AggregateKind.SUM and _number(branch) == 0:
                return True
    return False


def clipped_argument(
    argument: exp.Expression, lower: exp.Expression | None, upper: exp.Expression | None
) -> exp.Expression:
    """`argument` clipped into [lower, upper] (number constants; None: that side is not clipped) as
    the value ranges write it (dpproxy.engine.clipping) and `_own_argument` reads it back: `CASE WHEN
    x IS NULL THEN NULL ELSE LEAST(GREATEST(x, lo), hi) END`, which passes a NULL through (LEAST and
    GREATEST skip NULL arguments on PostgreSQL) and adds no condition of its own."""
    clipped = argument.copy()
    if lower is not None:
        clipped = exp.Greatest(this=clipped, expressions=[lower])
    if upper is not None:
        clipped = exp.Least(this=clipped, expressions=[upper])
    return exp.Case(
        ifs=[exp.If(this=exp.Is(this=argument.copy(), expression=exp.Null()), true=exp.Null())],
        default=clipped,
    )


def _own_argument(node: exp.Expression | None) -> exp.Expression | None:
    """The aggregate's argument as the analyst wrote it: under casts and parentheses, and under the
    value ranges' clipping (`clipped_argument`), which passes a NULL through and adds no condition
    of its own: an AVG keeps the floor (or not) that its EXPLAIN promised before the clipping."""
    while True:
        if isinstance(node, (exp.Cast, exp.Paren)):
            node = node.this
            continue
        ifs = node.args.get("ifs") if isinstance(node, exp.Case) else None
        if ifs and len(ifs) == 1 and isinstance(ifs[0].args.get("true"), exp.Null):
            test, default = ifs[0].this, node.args.get("default")
            tested = test.this if isinstance(test, exp.Is) and isinstance(test.expression, exp.Null) else None
            if tested is not None and _clipped(default) == tested:
                node = tested
                continue
        return node


def _clipped(node: exp.Expression | None) -> exp.Expression | None:
    """x of LEAST(GREATEST(x, lo), hi), GREATEST(x, lo) or LEAST(x, hi) with number constants, as
    `clipped_argument` writes them; None for anything else (an analyst's own CASE)."""
    while isinstance(node, (exp.Least, exp.Greatest)):
        bounds = node.expressions
        if len(bounds) != 1 or _number(bounds[0]) is None:
            return None
        node = node.this
    return node


def _number(node: exp.Expression) -> Decimal | None:
    """The value of a number constant as the analyser reads one (constant_value), else None."""
    try:
        value = constant_value(node)
    except DPProxyError:
        return None
    return value if isinstance(value, Decimal) else None


@dataclass(frozen=True)
class SessionBounds:
    """Bounds an analyst set for their session (`SET dpproxy.max_rows_per_unit`, `SET
    dpproxy.max_groups_per_unit`): None leaves that one to each query's choice."""

    rows: int | None = None
    groups: int | None = None
    # SET dpproxy.target_error: the largest ± at 95% accepted on each COUNT and SUM; the engine then
    # spends the least ε that meets it (dpproxy.engine.accuracy). None: the session's ε is spent.
    target_error: float | None = None
    # SET dpproxy.estimate_left_out = on: each query also estimates what its bounds and partition
    # selection leave out (PrivateQuery.estimate_left_out), each from a value's share of its ε.
    estimate: bool = False


def with_session_bounds(query: PrivateQuery, bounds: SessionBounds | None) -> PrivateQuery:
    if bounds is None:
        return query
    if bounds.estimate:
        query = dataclasses.replace(query, estimate_left_out=True)
    if bounds.rows is None and bounds.groups is None:
        return query
    return with_fixed_bounds(query, bounds.rows, bounds.groups)


def estimates_removed(query: PrivateQuery) -> bool:
    """Whether the query releases an estimate of what bounding removed (PrivateQuery.estimate_left_out):
    asked for, its bounds chosen per query by the main statement, some value it releases read from
    the rows (a query of persons alone has nothing to remove), and some k below the ceiling."""
    bounds = query.bounds
    if bounds is None or not (query.estimate_left_out and choosing(query) and reads_rows(query)):
        return False
    return bounds.rows[0] < bounds.row_cap  # else k is the ceiling: nothing to estimate


def estimates_hidden(query: PrivateQuery) -> bool:
    """Whether the query releases an estimate of the groups that hold persons, beside those partition
    selection shows (PrivateQuery.estimate_left_out): asked for, and keys that go through selection."""
    return (
        query.estimate_left_out
        and bool(query.keys)
        and query.needs_selection
        and not query.randomized_response
    )


def with_fixed_bounds(query: PrivateQuery, rows: int | None, groups: int | None) -> PrivateQuery:
    """`query` with its bounds set by the analyst for the session (`SET dpproxy.max_rows_per_unit`,
    `SET dpproxy.max_groups_per_unit`): one candidate each, within the ceilings, so nothing is chosen
    and no ε is spent on it. None leaves that bound to be chosen."""
    bounds = query.bounds
    if bounds is None:
        return query
    row_candidates = bounds.rows if rows is None else (max(1, min(rows, bounds.rows[-1])),)
    group_candidates = bounds.groups
    if groups is not None and bounds.groups:
        group_candidates = (max(1, min(groups, bounds.groups[-1])),)
    return dataclasses.replace(
        query, bounds=dataclasses.replace(bounds, rows=row_candidates, groups=group_candidates)
    )


def distinct_bounds(query: PrivateQuery) -> tuple[int, ...]:
    """The candidates for ℓ, the distinct values of x one person is counted for in all groups together
    by COUNT(DISTINCT x) of a column that is not the unit (dpproxy.release.distinct): the powers of two
    below the ceiling of a person's rows in a group, then it, when the bounds are chosen per query;
    else the one bound the rows have (a person's r rows hold at most r values). () when no such
    COUNT(DISTINCT …) is released per person (every row its own person counts its one value)."""
    if query.row_level or not any(c.kind is ComponentKind.DISTINCT_VALUES for c in query.components):
        return ()
    bounds = query.bounds
    if bounds is None:
        return (query.max_rows,)
    return candidates(bounds.row_cap) if bounds.choose_rows else (min(bounds.rows[0], bounds.row_cap),)


# With fixed limits (no bounds chosen), the components a person's rows in a group are scaled down by
# r/n when they have n > r there, rather than clamped: an average's or a spread's sums and its count
# of values shrink together, so a heavy person's contribution stays a mix of their own values. They
# are computed on the fine grid (FINE), as scaled components are with bounds chosen per query, so
# that truncating each person's share does not move a ratio of them. A SUM is clamped: it loses
# nothing of a person whose sum fits in what r rows can add.
SCALED_WITH_FIXED_LIMITS = (ComponentKind.VALUES, ComponentKind.CENTRED_SUM, ComponentKind.CENTRED_SQUARES)


def fixed_limits(query: PrivateQuery) -> bool:
    """Whether persons are bounded by the policy's fixed limits: bounds not chosen per query, and not
    every row its own person (row-level or randomized-response queries)."""
    return query.bounds is None and not query.row_level and not query.randomized_response


def scaled_with_fixed_limits(query: PrivateQuery) -> frozenset[int]:
    """The components scaled per person with fixed limits (SCALED_WITH_FIXED_LIMITS), on the fine
    grid; none when the bounds are chosen per query or every row is its own person."""
    if not fixed_limits(query):
        return frozenset()
    return frozenset(i for i, c in enumerate(query.components) if c.kind in SCALED_WITH_FIXED_LIMITS)


def choosing(query: PrivateQuery) -> bool:
    """Whether the main statement computes every candidate bound's values, to choose from."""
    return query.bounds is not None and query.needs_main_statement


# The aggregates whose values lose what bounding removes; beside them, the means (AggregateKind.is_mean)
# may have a k of their own (`mean_components`).
LOSES_ROWS = (
    AggregateKind.COUNT,
    AggregateKind.COUNT_VALUES,
    AggregateKind.SUM,
    AggregateKind.QUANTILE,
    AggregateKind.MODE,
)


def mean_components(query: PrivateQuery) -> frozenset[int]:
    """The components released at the averages' own k (docs/privacy.md §3, "Two k's"): those of the
    query's AVGs, VARs and STDDEVs when bounds are chosen per query and counts, sums, quantiles or
    modes stand beside them, no component serving both (`COUNT(x)` beside `AVG(x)` shares x's
    count: one k then). Empty otherwise: every value at one k. Each component's noise is calibrated
    for its own k, so two k's change no sensitivity; the means' k aims where averages lose least
    (the rule of a query of averages alone), the others' where counts do. A function of the text."""
    bounds = query.bounds if choosing(query) else None
    if bounds is None or len(bounds.rows) < 2:
        return frozenset()
    means = {i for a in query.aggregates if a.kind.is_mean for i in a.components}
    others = {i for a in query.aggregates if a.kind in LOSES_ROWS for i in a.components}
    if not means or (not others and not query.histograms) or means & others:
        return frozenset()
    return frozenset(means)


def component_bounds(
    query: PrivateQuery, rows: int, groups: int, values: int = -1, means: int | None = None
) -> list[tuple[int, int]]:
    """(per-group sensitivity, groups) of each component's noise: the policy's limits, or with bounds
    chosen per query the candidates at these indexes (`means`: the averages' own k, for
    `mean_components`; None, `rows` for all); a COUNT(DISTINCT x) of a column that is not
    the unit, ℓ at index `values` of distinct_bounds (the ceiling's by default) in all groups
    together (each person's ℓ is shared among their groups)."""
    distinct = distinct_bounds(query)
    bounds = query.bounds if choosing(query) else None
    if bounds is None:
        fine = scaled_with_fixed_limits(query)
        return [
            (distinct[values], 1)  # ℓ over all groups (dpproxy.release.distinct)
            if distinct and c.kind is ComponentKind.DISTINCT_VALUES
            else ((FINE if i in fine else 1) * c.sensitivity(query.max_rows), query.max_groups)
            for i, c in enumerate(query.components)
        ]
    k = bounds.rows[rows]
    mean_k = bounds.rows[rows if means is None else means]
    averaged = mean_components(query)
    g = bounds.groups[groups] if bounds.groups else query.max_groups
    found = []
    for i, component in enumerate(query.components):
        if component.kind.row_pipeline:
            found.append((distinct[values], 1))  # ℓ over all groups (dpproxy.release.distinct)
        elif component.kind is ComponentKind.UNITS:
            found.append((1, g))
        else:  # on the fine grid (dpproxy.sql.query.FINE)
            found.append(bounds.component_bound(component, mean_k if i in averaged else k))
    return found
