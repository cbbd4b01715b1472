"""Pass 2 — clip each aggregated value to its range and put it on the integer grid.

    SUM(income)  (bounds 0..500000, scale 2)   → CAST(ROUND(clip(__c0) * 100) AS BIGINT)
    AVG(age)     (bounds 0..120, centre 60)    → CAST(clip(__c1) AS BIGINT) - 60
    COUNT(x)                                   → CASE WHEN __c2 IS NULL THEN 0 ELSE 1 END

Sums are then exact integer sums on every engine (never float accumulation), and each row's value
lies in the integer range the sensitivity is computed from. NULL stays NULL (SUM and AVG skip it).
"""

from __future__ import annotations

from sqlglot import exp

from dpproxy.sql.numbers import grid_integer
from dpproxy.sql.query import Component, ComponentKind
from dpproxy.sql.rewrite.state import RewriteContext, RewriteState, col, component_column
from dpproxy.sql.rowexpr import clip_sql, number_literal
from dpproxy.sql.types import PgType


def grid_value(value: exp.Expression, component: Component) -> exp.Expression:
    """The component's per-row integer: round(clip(value) · 10^scale) [− centre], computed alike on
    every engine (dpproxy.sql.numbers.grid_integer)."""
    assert component.interval is not None
    scale, centre = component.scale, component.centre
    clipped = (
        value
        if component.within_interval
        else clip_sql(value, component.interval, PgType.NUMERIC, double=component.double)
    )
    on_grid = grid_integer(clipped, scale, double=component.double, integer=component.exact_integer)
    if component.kind in (ComponentKind.CENTRED_SUM, ComponentKind.CENTRED_SQUARES) and centre:
        on_grid = exp.Paren(this=exp.Sub(this=on_grid, expression=number_literal(centre)))
    if component.kind is ComponentKind.CENTRED_SQUARES:
        # Exact in bigint: the analyzer keeps r·(half-width on the grid)² below 2^52.
        on_grid = exp.Mul(this=on_grid, expression=on_grid.copy())
    return on_grid


def to_grid(state: RewriteState, ctx: RewriteContext) -> RewriteState:
    query = ctx.query
    projections: list[exp.Expression] = []
    if ctx.per_unit:
        projections.extend(col(c) for c in ctx.persons)
    projections.extend(col(k) for k in ctx.keys)
    for i in ctx.valued_components:
        component = query.components[i]
        name = component_column(i)
        if component.kind is ComponentKind.VALUES:
            value: exp.Expression = exp.Case(
                ifs=[exp.If(this=exp.Is(this=col(name), expression=exp.Null()), true=exp.Literal.number(0))],
                default=exp.Literal.number(1),
            )
        else:
            value = grid_value(col(name), component)
        projections.append(exp.alias_(value, name, quoted=True, copy=False))
    if not projections:
        projections.append(col("__row"))
    select = exp.select(*projections, copy=False).from_(state.current, copy=False)
    return state.then(
        "grid_values", "each aggregated value clipped to its range, as an integer on the grid", select
    )
