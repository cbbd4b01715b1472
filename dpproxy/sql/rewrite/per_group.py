"""Pass 6 — aggregate per group: the exact, bounded components that noise is added to.

    SELECT __k0, COALESCE(SUM(__rows), 0) AS __c0, COALESCE(SUM(__c1), 0) AS __c1, COUNT(*) AS __units
    FROM bounded_groups GROUP BY __k0

An empty input gives 0, never NULL (no GROUP BY: one row of zeros). `__units` counts the units
present in each group; it feeds partition selection and COUNT(DISTINCT unit).

With bounds chosen per query (PrivateQuery.bounds) every candidate's values come from this one pass:
per component and candidate k_j, the sum of each unit's value scaled by k_j/TOTAL when the unit's
rows in all its groups exceed k_j (`per_unit.scaled`: its contributions to all groups then add up to
at most k_j rows' worth); per candidate, the units (counted in their first group only) whose TOTAL
exceeds k_j; per candidate g_j, the units that count this group among their first g_j and the units
(in their first group) with more than g_j groups; with PrivateQuery.estimate_left_out, per candidate
k_j the rows' worth it takes below the ceiling C, and what C keeps (`_removed`); and the units
counted once each:

    SELECT __k0, SUM(CASE WHEN __total > 4 THEN <__c0·4/__total> ELSE __c0 END) AS __c0_2, …,
           SUM(CASE WHEN __gn = 1 AND __total > 4 THEN 1 ELSE 0 END) AS __above2, …,
           SUM(CASE WHEN __gn <= 2 THEN 1 ELSE 0 END) AS __units1, …,
           SUM(CASE WHEN __gn = 1 AND __groups > 2 THEN 1 ELSE 0 END) AS __wider1, …,
          [SUM(CASE WHEN __gn = 1 AND __total > 4 THEN min(__total, C) - 4 ELSE 0 END) AS __excess2, …,
           SUM(CASE WHEN __gn = 1 THEN min(__total, C) ELSE 0 END) AS __reach,]
           SUM(CASE WHEN __gn = 1 THEN 1 ELSE 0 END) AS __persons, COUNT(*) AS __units
    FROM ranked_groups GROUP BY __k0
"""

from __future__ import annotations

from sqlglot import exp

from dpproxy.sql.bounds import estimates_removed
from dpproxy.sql.numbers import bigint_quotient, summable_integer
from dpproxy.sql.query import FINE, ComponentKind, ContributionBounds
from dpproxy.sql.rewrite.bound_groups import scaled_sources, splits_quotient
from dpproxy.sql.rewrite.state import (
    GROUP_RANK,
    GROUPS,
    PERSONS,
    REACH,
    ROWS,
    TOTAL,
    UNIT,
    UNITS,
    RewriteContext,
    RewriteState,
    above_column,
    candidate_column,
    col,
    component_column,
    excess_column,
    quotient_column,
    remainder_column,
    sign_column,
    units_column,
    wider_column,
)


def _zero_if_empty(value: exp.Expression) -> exp.Expression:
    return exp.Coalesce(this=value, expressions=[exp.Literal.number(0)])


def per_group(state: RewriteState, ctx: RewriteContext) -> RewriteState:
    query = ctx.query
    if ctx.chosen:
        return _candidates_per_group(state, ctx)
    row_table = not ctx.per_unit
    projections: list[exp.Expression] = [col(k) for k in ctx.keys]
    for i, component in enumerate(query.components):
        if component.kind.row_pipeline:
            value: exp.Expression = exp.Literal.number(0)  # filled in from the row pipeline's statement
        elif component.kind is ComponentKind.UNITS:
            value = _units(ctx)
        elif component.kind is ComponentKind.ROWS and row_table:
            value = exp.Count(this=exp.Star())
        elif component.kind is ComponentKind.ROWS:
            value = _zero_if_empty(exp.Sum(this=summable_integer(col(ROWS))))
        else:
            value = _zero_if_empty(exp.Sum(this=summable_integer(col(component_column(i)))))
        projections.append(exp.alias_(value, component_column(i), quoted=True, copy=False))
    projections.append(exp.alias_(_units(ctx), UNITS, quoted=True, copy=False))
    final = exp.select(*projections, copy=False).from_(state.current, copy=False)
    if ctx.keys:
        final = final.group_by(*[col(k) for k in ctx.keys], copy=False)
    return RewriteState(state.steps, final)


def _units(ctx: RewriteContext) -> exp.Expression:
    """The persons of a group who have a unit (one row each here): what COUNT(DISTINCT unit) counts
    and partition selection reads. With `null_units: each_a_person` a row without a unit is a person
    too, but SQL's COUNT(DISTINCT unit) skips it, and selection need not count it (counting fewer
    persons only shows fewer groups); each person still moves the count by at most 1."""
    if ctx.per_unit and ctx.query.relation.null_unit_columns:
        return exp.Count(this=col(UNIT))
    return exp.Count(this=exp.Star())


def _count_where(condition: exp.Expression) -> exp.Expression:
    return _sum_where(condition, exp.Literal.number(1))


def _sum_where(condition: exp.Expression, value: exp.Expression) -> exp.Expression:
    return _zero_if_empty(
        exp.Sum(this=exp.Case(ifs=[exp.If(this=condition, true=value)], default=exp.Literal.number(0)))
    )


def _candidates_per_group(state: RewriteState, ctx: RewriteContext) -> RewriteState:
    query = ctx.query
    bounds = query.bounds
    assert bounds is not None
    first = exp.EQ(this=col(GROUP_RANK), expression=exp.Literal.number(1))
    projections: list[exp.Expression] = [col(k) for k in ctx.keys]
    scaled_from = dict(scaled_sources(ctx))
    for i, component in enumerate(query.components):
        for j, k in enumerate(bounds.rows):
            value: exp.Expression
            if i not in scaled_from:
                # The row pipeline's components are filled in from its statement; a COUNT(DISTINCT
                # unit)'s from the units counted in g groups.
                value = exp.Literal.number(0)
            else:
                limit = exp.Literal.number(k)
                negative = component.contribution_range(1)[0] < 0
                magnitude: exp.Expression
                if splits_quotient(ctx, i):
                    # On the fine grid: trunc(value·FINE·k/total) = (|v|·FINE div total)·k +
                    # ((|v|·FINE mod total)·k) div total, signed; value·FINE below k of it.
                    magnitude = exp.Add(
                        this=exp.Mul(this=col(quotient_column(i)), expression=limit),
                        expression=bigint_quotient(
                            exp.Mul(this=col(remainder_column(i)), expression=limit.copy()), col(TOTAL)
                        ),
                    )
                else:  # the same integer: |v|·FINE·k stays below 2^62
                    source = col(scaled_from[i])
                    absolute = exp.Abs(this=source) if negative else source
                    magnitude = bigint_quotient(
                        exp.Mul(this=absolute, expression=exp.Literal.number(FINE * k)), col(TOTAL)
                    )
                scaled_value: exp.Expression = exp.Paren(this=magnitude)
                if negative:
                    scaled_value = exp.Mul(this=col(sign_column(i)), expression=scaled_value)
                over = exp.GT(this=col(TOTAL), expression=limit.copy())
                unscaled = exp.Mul(this=col(scaled_from[i]), expression=exp.Literal.number(FINE))
                weighted = exp.Case(ifs=[exp.If(this=over, true=scaled_value)], default=unscaled)
                value = _zero_if_empty(exp.Sum(this=summable_integer(weighted)))
            projections.append(exp.alias_(value, candidate_column(i, j), quoted=True, copy=False))
    for j, k in enumerate(bounds.rows):
        above = exp.and_(first.copy(), exp.GT(this=col(TOTAL), expression=exp.Literal.number(k)))
        projections.append(exp.alias_(_count_where(above), above_column(j), quoted=True, copy=False))
    for j, g in enumerate(bounds.groups):
        within = exp.LTE(this=col(GROUP_RANK), expression=exp.Literal.number(g))
        if query.relation.null_unit_columns:  # persons with a unit only (_units)
            within = exp.and_(within, exp.Not(this=exp.Is(this=col(UNIT), expression=exp.Null())))
        projections.append(exp.alias_(_count_where(within), units_column(j), quoted=True, copy=False))
    for j, g in enumerate(bounds.groups):
        wider = exp.and_(first.copy(), exp.GT(this=col(GROUPS), expression=exp.Literal.number(g)))
        projections.append(exp.alias_(_count_where(wider), wider_column(j), quoted=True, copy=False))
    if estimates_removed(query):
        projections.extend(_removed(bounds))
    projections.append(exp.alias_(_count_where(first.copy()), PERSONS, quoted=True, copy=False))
    projections.append(exp.alias_(_units(ctx), UNITS, quoted=True, copy=False))
    final = exp.select(*projections, copy=False).from_(state.current, copy=False)
    if ctx.keys:
        final = final.group_by(*[col(k) for k in ctx.keys], copy=False)
    return RewriteState(state.steps, final)


def _removed(bounds: ContributionBounds) -> list[exp.Expression]:
    """What bounding removes, per candidate k_j, in rows' worth below the ceiling C (each unit in
    its first group only): SUM(CASE WHEN __gn = 1 AND __total > k_j THEN min(__total, C) − k_j ELSE
    0 END); and SUM(CASE WHEN __gn = 1 THEN min(__total, C) ELSE 0 END), of which the rest is what
    k_j keeps. One person moves the pair (removed, kept) at k_j by at most C in all
    (dpproxy.release.left_out)."""
    ceiling = exp.Literal.number(bounds.row_cap)
    first = exp.EQ(this=col(GROUP_RANK), expression=exp.Literal.number(1))
    # min(TOTAL, C), spelled as a CASE: LEAST's NULL handling differs among the backends' dialects
    # (TOTAL is never NULL, but sqlglot guards it when it transpiles).
    over_ceiling = exp.GT(this=col(TOTAL), expression=ceiling)
    reached = exp.Case(ifs=[exp.If(this=over_ceiling, true=ceiling.copy())], default=col(TOTAL))
    found = []
    for j, k in enumerate(bounds.rows):
        over = exp.and_(first.copy(), exp.GT(this=col(TOTAL), expression=exp.Literal.number(k)))
        taken = exp.Sub(this=reached.copy(), expression=exp.Literal.number(k))
        found.append(exp.alias_(_sum_where(over, taken), excess_column(j), quoted=True, copy=False))
    found.append(exp.alias_(_sum_where(first, reached), REACH, quoted=True, copy=False))
    return found
