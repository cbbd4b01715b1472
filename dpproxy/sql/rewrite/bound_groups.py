"""Pass 5 — keep at most max_groups_per_unit groups per unit.

    SELECT … FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY __unit
                                                ORDER BY hash('<salt>', __unit, __k0), __k0) AS __gn
                   FROM per_unit) WHERE __gn <= 3

As for rows, the choice depends only on the unit's own groups and the plan's salt. Skipped without
GROUP BY (a single group), for `row` tables, and when the keys are public and their values allow
no more than max_groups_per_unit groups in all.

With bounds chosen per query (PrivateQuery.bounds) no group is cut: a unit's rows in all its
groups are scaled to k rows' worth (per_group), which bounds its values whatever their groups, and
the groups it is *counted* in (partition selection, COUNT(DISTINCT unit)) are its first g, ranked by
the same salted hash. Each unit-and-group row gets what the choice and the scaling read: the group's
rank among the unit's groups (__gn: 1 for its first, so that per-unit figures are counted once, and
the first g groups count the unit), the unit's rows in all its groups (__total, each group's capped
at the row ceiling; at least 1 where per_unit counts only some rows) and its number of groups
(__groups):

    SELECT *, __c0 // __total AS __q0, __c0 % __total AS __r0, …
    FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY __unit ORDER BY <hash>) AS __gn,
                    SUM(__rows) OVER (PARTITION BY __unit) AS __total,
                    COUNT(*) OVER (PARTITION BY __unit) AS __groups FROM per_unit)

When every key reads only tables with one row per person (PrivateQuery.one_group_per_unit: a
person's attributes, grouping their events), each unit has one group: __gn and __groups are 1 and
__total is __rows, without windows.

(The quotient and remainder of each value by __total, of its magnitude for values that may be
negative, with its sign, are what every candidate's scaling reads.)
"""

from __future__ import annotations

from sqlglot import exp

from dpproxy.sql.bounds import counts_every_row
from dpproxy.sql.numbers import bigint_quotient
from dpproxy.sql.query import FINE, ComponentKind
from dpproxy.sql.rewrite.bound_rows import _hash_order, _window, keep_first
from dpproxy.sql.rewrite.state import (
    GROUP_RANK,
    GROUPS,
    ROWS,
    TOTAL,
    RewriteContext,
    RewriteState,
    col,
    component_column,
    quotient_column,
    remainder_column,
    sign_column,
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
        ctx.persons,
        ctx.keys,
        ctx.salt + ":groups",
        query.max_groups,
        [*ctx.persons, *ctx.keys, ROWS, *values],
        "__gn",
    )
    return state.then(
        "bounded_groups",
        f"at most {query.max_groups} group(s) per unit, chosen by a salted hash of the unit's own keys",
        select,
    )


def _ranked_groups(state: RewriteState, ctx: RewriteContext) -> RewriteState:
    """One pass of windows over the units' rows: the group's rank (a salted hash of the unit's own
    keys), the unit's rows in all its groups and its number of groups; then each value's quotient
    and remainder by the unit's rows (what every candidate's scaling reads: per_group then
    multiplies, and divides only the remainder). No group is dropped (the module docstring)."""
    query = ctx.query
    assert query.bounds is not None
    one = exp.Literal.number(1)
    # One group per unit (no GROUP BY, or keys read from tables with one row per person): the unit's
    # row is its first and only one, its rows are its total, and no window is needed.
    one_group = not ctx.keys or query.one_group_per_unit
    if one_group:
        ranked: exp.Expression = exp.select(
            "*",
            exp.alias_(one, GROUP_RANK, quoted=True, copy=False),
            exp.alias_(_at_least_one(ctx, col(ROWS)), TOTAL, quoted=True, copy=False),
            exp.alias_(one.copy(), GROUPS, quoted=True, copy=False),
            copy=False,
        ).from_(state.current, copy=False)
    else:
        order = _hash_order(ctx, ctx.salt + ":groups", [*ctx.persons, *ctx.keys], ctx.keys)
        # The unit's rows and groups counted over all its groups; every window is over the same
        # partition, computed together.
        # A bigint, as the engine's SUM of bigints would not be (DuckDB's HUGEINT divides slowly).
        total = _at_least_one(
            ctx,
            exp.Cast(
                this=exp.Window(this=exp.Sum(this=col(ROWS)), partition_by=[col(c) for c in ctx.persons]),
                to=exp.DataType.build(exp.DataType.Type.BIGINT),
            ),
        )
        groups = exp.Window(this=exp.Count(this=exp.Star()), partition_by=[col(c) for c in ctx.persons])
        ranked = exp.select(
            "*",
            exp.alias_(_window(exp.RowNumber(), ctx.persons, order), GROUP_RANK, quoted=True, copy=False),
            exp.alias_(total, TOTAL, quoted=True, copy=False),
            exp.alias_(groups, GROUPS, quoted=True, copy=False),
            copy=False,
        ).from_(state.current, copy=False)
    parts: list[exp.Expression] = ["*"]  # type: ignore[list-item]
    fine = exp.Literal.number(FINE)
    for i, source in scaled_sources(ctx):
        magnitude: exp.Expression = col(source)
        if not _never_negative(ctx, i):
            magnitude = exp.Abs(this=col(source))
            negative = exp.LT(this=col(source), expression=exp.Literal.number(0))
            sign = exp.Case(
                ifs=[exp.If(this=negative, true=exp.Literal.number(-1))], default=exp.Literal.number(1)
            )
            parts.append(exp.alias_(sign, sign_column(i), quoted=True, copy=False))
        if not splits_quotient(ctx, i):  # the candidates divide |value|·FINE·k directly
            continue
        # On the fine grid: |value|·FINE stays below 2^62 (values below 2^52, dpproxy.sql.aggregates).
        fine_magnitude = exp.Mul(this=magnitude, expression=fine.copy())
        quotient = bigint_quotient(fine_magnitude, col(TOTAL))
        parts.append(exp.alias_(quotient, quotient_column(i), quoted=True, copy=False))
        remainder = exp.Mod(this=fine_magnitude.copy(), expression=col(TOTAL))
        parts.append(exp.alias_(remainder, remainder_column(i), quoted=True, copy=False))
    select = exp.select(*parts, copy=False).from_(ranked.subquery("ranked", copy=False), copy=False)
    # No group is cut: a unit's values reach every group it has, as its rows in all are scaled to k
    # whatever their groups (the noise is sized for k rows in all, not for groups); only the units
    # counted per group, for partition selection and COUNT(DISTINCT unit), stop at g (per_group).
    description = (
        "one group per unit (its keys read tables with one row per person): its rows in all"
        if ctx.keys and one_group
        else "each unit's groups ranked by a salted hash of its own keys (the first g count the unit); "
        "its rows and groups in all"
    )
    return state.then("ranked_groups", description, select)


def _at_least_one(ctx: RewriteContext, total: exp.Expression) -> exp.Expression:
    """A unit's rows in all, at least 1 where k counts only some rows (per_unit.counted_rows): a
    unit none of whose rows it counts has only values of 0, and the quotients divide by the total;
    a total of 1 is above no candidate."""
    if counts_every_row(ctx.query):
        return total
    return exp.Greatest(this=total, expressions=[exp.Literal.number(1)], ignore_nulls=True)


def splits_quotient(ctx: RewriteContext, i: int) -> bool:
    """Whether component i's candidates take trunc(|v|·FINE·k / total) as a quotient and remainder
    computed once per row (|v|·FINE·k could pass 2^62), rather than dividing the product directly:
    the same integer either way, but the direct division is one operation per candidate instead of
    four, and the final pass over every person's groups is most of the statement's time."""
    bounds = ctx.query.bounds
    assert bounds is not None
    low, high = ctx.query.components[i].contribution_range(bounds.row_cap)
    return max(-low, high) * FINE * max(bounds.rows) >= 2**62


def scaled_sources(ctx: RewriteContext) -> list[tuple[int, str]]:
    """The components scaled per candidate k, with the per-unit column each is read from."""
    found = []
    for i, component in enumerate(ctx.query.components):
        if component.kind is ComponentKind.ROWS:
            found.append((i, ROWS))
        elif i in ctx.valued_components:
            found.append((i, component_column(i)))
    return found


def _never_negative(ctx: RewriteContext, i: int) -> bool:
    return ctx.query.components[i].contribution_range(1)[0] >= 0
