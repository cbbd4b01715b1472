"""Pass 4 — pre-aggregate per unit and group.

    SELECT __unit, __k0, COUNT(*) AS __rows, SUM(__c0) AS __c0 FROM bounded_rows GROUP BY __unit, __k0

One row per (unit, group) holds that unit's whole contribution to the group, so the next pass can
bound groups per unit. Skipped for `row` tables.
"""

from __future__ import annotations

from sqlglot import exp

from dpproxy.sql.rewrite.state import ROWS, UNIT, RewriteContext, RewriteState, col, component_column


def per_unit(state: RewriteState, ctx: RewriteContext) -> RewriteState:
    query = ctx.query
    if query.table.unit_is_row:
        return state
    rows: exp.Expression = exp.Count(this=exp.Star())
    if ctx.only_counts_rows:
        rows = exp.Least(this=rows, expressions=[exp.Literal.number(query.max_rows)])
    group = [UNIT, *ctx.keys]
    projections: list[exp.Expression] = [col(c) for c in group]
    projections.append(exp.alias_(rows, ROWS, quoted=True))
    for i in ctx.valued_components:
        name = component_column(i)
        projections.append(exp.alias_(exp.Sum(this=col(name)), name, quoted=True))
    select = exp.select(*projections).from_(state.current).group_by(*[col(c) for c in group])
    summary = (
        "one row per unit and group: its rows"
        + (f" (at most {query.max_rows})" if ctx.only_counts_rows else "")
        + " and its sums"
    )
    return state.then("per_unit", summary, select)
