"""Pass 3 — keep at most max_rows_per_unit rows per unit and group.

    SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY __unit, __k0
                                                ORDER BY md5(concat_ws('|', '<salt>', __c0)), __c0) AS __rn
                   FROM grid_values) WHERE __rn <= 5

Which rows a unit keeps depends only on that unit's own rows (the window is partitioned by unit) and
a per-plan salt, so one unit's presence never changes another unit's rows. The order is total (a
hash, then every selected column): engines keep the same values. Skipped for `row` tables (each
person has one row) and when the query only counts rows: then per_unit takes LEAST(COUNT(*), r),
which is exactly the count of the rows this pass would keep.
"""

from __future__ import annotations

from sqlglot import exp

from dpproxy.sql.rewrite.state import UNIT, RewriteContext, RewriteState, col, component_column


def salted_hash(salt: str, columns: list[str]) -> exp.Expression:
    """md5(salt || '|' || coalesce(c1::text, '') || '|' || …): the same text, so the same order, on
    PostgreSQL and DuckDB for the integer and text values it sees."""
    text: exp.Expression = exp.Literal.string(salt)
    for c in columns:
        value = exp.Coalesce(
            this=exp.Cast(this=col(c), to=exp.DataType.build("VARCHAR")), expressions=[exp.Literal.string("")]
        )
        text = exp.DPipe(
            this=exp.DPipe(this=text, expression=exp.Literal.string("|"), safe=True),
            expression=value,
            safe=True,
        )
    return exp.MD5(this=text)


def keep_first(
    state: RewriteState,
    partition: list[str],
    order: list[str],
    salt: str,
    limit: int,
    keep: list[str],
    rank: str,
) -> exp.Select:
    """SELECT keep FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY … ORDER BY hash, …) AS rank)
    WHERE rank <= limit."""
    # The hash covers the partition (the unit) too: otherwise every unit would rank its groups
    # the same way and all would keep the same ones.
    ordering = [exp.Ordered(this=salted_hash(salt, [*partition, *order]), nulls_first=False)]
    ordering.extend(exp.Ordered(this=col(c), nulls_first=False) for c in order)
    window = exp.Window(
        this=exp.RowNumber(),
        partition_by=[col(c) for c in partition],
        order=exp.Order(expressions=ordering),
    )
    ranked = exp.select("*", exp.alias_(window, rank, quoted=True)).from_(state.current)
    return (
        exp.select(*[col(c) for c in keep])
        .from_(ranked.subquery("ranked"))
        .where(exp.LTE(this=col(rank), expression=exp.Literal.number(limit)))
    )


def bound_rows(state: RewriteState, ctx: RewriteContext) -> RewriteState:
    query = ctx.query
    if query.table.unit_is_row or ctx.only_counts_rows:
        return state
    values = [component_column(i) for i in ctx.valued_components]
    select = keep_first(
        state,
        [UNIT, *ctx.keys],
        values,
        ctx.salt + ":rows",
        query.max_rows,
        [UNIT, *ctx.keys, *values],
        "__rn",
    )
    return state.then(
        "bounded_rows",
        f"at most {query.max_rows} row(s) per unit and group, chosen by a salted hash of the unit's own rows",
        select,
    )
