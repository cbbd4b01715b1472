"""Pass 5 — keep at most max_groups_per_unit groups per unit.

    SELECT … FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY __unit
                                                ORDER BY hash('<salt>', __unit, __k0), __k0) AS __gn
                   FROM per_unit) WHERE __gn <= 3

As for rows, the choice depends only on the unit's own groups and the plan's salt. Skipped without
GROUP BY (a single group), for `row` tables, and when the keys are public and their values allow
no more than max_groups_per_unit groups in all.

With bounds chosen per query (PrivateQuery.bounds) the ceiling cuts the groups the same way, and
each unit-and-group row also gets what the choice and the scaling read: the group's rank among the
unit's groups (__gn: 1 for its first, so that per-unit figures are counted once, and the first g
groups count the unit for partition selection), the unit's rows in all its kept groups (__total,
each group's capped at the row ceiling) and its number of groups (__groups):

    SELECT *, SUM(__rows) OVER (PARTITION BY __unit) AS __total,
              COUNT(*) OVER (PARTITION BY __unit) AS __groups
    FROM (SELECT * FROM (SELECT *, ROW_NUMBER() OVER (…) AS __gn FROM per_unit) WHERE __gn <= 12)
"""

from __future__ import annotations

from sqlglot import exp

from dpproxy.sql.rewrite.bound_rows import _hash_order, _window, keep_first
from dpproxy.sql.rewrite.state import (
    GROUP_RANK,
    GROUPS,
    ROWS,
    TOTAL,
    UNIT,
    RewriteContext,
    RewriteState,
    col,
    component_column,
)


def bound_groups(state: RewriteState, ctx: RewriteContext) -> RewriteState:
    query = ctx.query
    if ctx.chosen:
        return _ranked_groups(state, ctx)
    if not ctx.per_unit or not query.bounds_groups:
        return state
    values = [component_column(i) for i in ctx.valued_components]
    select = keep_first(
        state,
        ctx,
        [UNIT],
        ctx.keys,
        ctx.salt + ":groups",
        query.max_groups,
        [UNIT, *ctx.keys, ROWS, *values],
        "__gn",
    )
    return state.then(
        "bounded_groups",
        f"at most {query.max_groups} group(s) per unit, chosen by a salted hash of the unit's own keys",
        select,
    )


def _ranked_groups(state: RewriteState, ctx: RewriteContext) -> RewriteState:
    query = ctx.query
    assert query.bounds is not None
    one = exp.Literal.number(1)
    if not ctx.keys:  # one group: the unit's row is its first and only one
        select = exp.select(
            "*",
            exp.alias_(one, GROUP_RANK, quoted=True),
            exp.alias_(col(ROWS), TOTAL, quoted=True),
            exp.alias_(one.copy(), GROUPS, quoted=True),
            copy=False,
        ).from_(state.current, copy=False)
        return state.then("ranked_groups", "one group: each unit's row is its first", select)
    order = _hash_order(ctx, ctx.salt + ":groups", [UNIT, *ctx.keys], ctx.keys)
    ranked = exp.select(
        "*", exp.alias_(_window(exp.RowNumber(), [UNIT], order), GROUP_RANK, quoted=True), copy=False
    ).from_(state.current, copy=False)
    source: exp.Expression = ranked.subquery("ranked", copy=False)
    cap = query.bounds.group_cap
    if query.bounds_groups:
        source = (
            exp.select("*", copy=False)
            .from_(source, copy=False)
            .where(exp.LTE(this=col(GROUP_RANK), expression=exp.Literal.number(cap)), copy=False)
            .subquery("kept", copy=False)
        )
    per_unit = [col(UNIT)]
    total = exp.Window(this=exp.Sum(this=col(ROWS)), partition_by=per_unit)
    groups = exp.Window(this=exp.Count(this=exp.Star()), partition_by=[c.copy() for c in per_unit])
    select = exp.select(
        "*", exp.alias_(total, TOTAL, quoted=True), exp.alias_(groups, GROUPS, quoted=True), copy=False
    ).from_(source, copy=False)
    return state.then(
        "ranked_groups",
        f"each unit's groups ranked by a salted hash of its own keys, at most {cap} kept; "
        "its rows in all of them",
        select,
    )
