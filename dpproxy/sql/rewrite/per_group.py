"""Pass 6 — aggregate per group: the exact, bounded components that noise is added to.

    SELECT __k0, COALESCE(SUM(__rows), 0) AS __c0, COALESCE(SUM(__c1), 0) AS __c1, COUNT(*) AS __units
    FROM bounded_groups GROUP BY __k0

An empty input gives 0, never NULL (no GROUP BY: one row of zeros). `__units` counts the units
present in each group; it feeds partition selection and COUNT(DISTINCT unit).
"""

from __future__ import annotations

from sqlglot import exp

from dpproxy.sql.numbers import summable_integer
from dpproxy.sql.query import ComponentKind
from dpproxy.sql.rewrite.state import ROWS, UNITS, RewriteContext, RewriteState, col, component_column


def _zero_if_empty(value: exp.Expression) -> exp.Expression:
    return exp.Coalesce(this=value, expressions=[exp.Literal.number(0)])


def per_group(state: RewriteState, ctx: RewriteContext) -> RewriteState:
    query = ctx.query
    row_table = not ctx.per_unit
    projections: list[exp.Expression] = [col(k) for k in ctx.keys]
    for i, component in enumerate(query.components):
        if component.kind.row_pipeline:
            value: exp.Expression = exp.Literal.number(0)  # filled in from the row pipeline's statement
        elif component.kind is ComponentKind.UNITS or (component.kind is ComponentKind.ROWS and row_table):
            value = exp.Count(this=exp.Star())
        elif component.kind is ComponentKind.ROWS:
            value = _zero_if_empty(exp.Sum(this=summable_integer(col(ROWS))))
        else:
            value = _zero_if_empty(exp.Sum(this=summable_integer(col(component_column(i)))))
        projections.append(exp.alias_(value, component_column(i), quoted=True))
    projections.append(exp.alias_(exp.Count(this=exp.Star()), UNITS, quoted=True))
    final = exp.select(*projections, copy=False).from_(state.current, copy=False)
    if ctx.keys:
        final = final.group_by(*[col(k) for k in ctx.keys], copy=False)
    return RewriteState(state.steps, final)
