"""Pass 5 — keep at most max_groups_per_unit groups per unit.

    SELECT … FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY __unit
                                                ORDER BY hash('<salt>', __unit, __k0), __k0) AS __gn
                   FROM per_unit) WHERE __gn <= 3

As for rows, the choice depends only on the unit's own groups and the plan's salt. Skipped without
GROUP BY (a single group), for `row` tables, and when the keys are public and their values allow
no more than max_groups_per_unit groups in all.
"""

from __future__ import annotations

from dpproxy.sql.rewrite.bound_rows import keep_first
from dpproxy.sql.rewrite.state import ROWS, UNIT, RewriteContext, RewriteState, component_column


def bound_groups(state: RewriteState, ctx: RewriteContext) -> RewriteState:
    query = ctx.query
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
