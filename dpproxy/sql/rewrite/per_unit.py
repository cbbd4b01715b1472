"""Pass 4 — pre-aggregate per unit and group, clamping each unit's contribution.

    SELECT __unit, __k0, LEAST(COUNT(*), 5) AS __rows,
           LEAST(GREATEST(COALESCE(SUM(__c0), 0), 0), 10000000) AS __c0
    FROM grid_values GROUP BY __unit, __k0

One row per (unit, group) holds that unit's contribution to the group, clamped to what
max_rows_per_unit rows can add (Component.contribution_range): the bound the sensitivity is computed
from holds whatever the data, and a unit below it keeps its whole contribution. The clamp depends
only on the unit's own rows. Skipped when every row is its own unit.
"""

from __future__ import annotations

from sqlglot import exp

from dpproxy.sql.numbers import summable_integer
from dpproxy.sql.query import ComponentKind
from dpproxy.sql.rewrite.state import ROWS, UNIT, RewriteContext, RewriteState, col, component_column
from dpproxy.sql.rowexpr import number_literal


def clamp(value: exp.Expression, lo: int, hi: int) -> exp.Expression:
    """LEAST(GREATEST(value, lo), hi) — only for non-NULL values (GREATEST skips NULLs)."""
    if lo == 0 and hi >= 0:
        lower: exp.Expression = exp.Greatest(
            this=value, expressions=[exp.Literal.number(0)], ignore_nulls=True
        )
    else:
        lower = exp.Greatest(this=value, expressions=[number_literal(lo)], ignore_nulls=True)
    return exp.Least(this=lower, expressions=[number_literal(hi)], ignore_nulls=True)


def per_unit(state: RewriteState, ctx: RewriteContext) -> RewriteState:
    query = ctx.query
    if not ctx.per_unit:
        return state
    r = query.max_rows
    group = [UNIT, *ctx.keys]
    projections: list[exp.Expression] = [col(c) for c in group]
    rows = exp.Least(this=exp.Count(this=exp.Star()), expressions=[exp.Literal.number(r)], ignore_nulls=True)
    projections.append(exp.alias_(rows, ROWS, quoted=True))
    for i in ctx.valued_components:
        component = query.components[i]
        name = component_column(i)
        total: exp.Expression = exp.Sum(this=summable_integer(col(name)))
        lo, hi = component.contribution_range(r)
        if component.kind is ComponentKind.VALUES:
            value: exp.Expression = exp.Least(
                this=total, expressions=[exp.Literal.number(hi)], ignore_nulls=True
            )
        else:
            # A unit whose values are all NULL adds nothing (0 lies in every contribution range).
            value = clamp(exp.Coalesce(this=total, expressions=[exp.Literal.number(0)]), lo, hi)
        projections.append(exp.alias_(value, name, quoted=True))
    select = (
        exp.select(*projections, copy=False)
        .from_(state.current, copy=False)
        .group_by(*[col(c) for c in group], copy=False)
    )
    return state.then(
        "per_unit",
        f"one row per unit and group, its contribution clamped to what {r} row(s) can add",
        select,
    )
