"""Pass 3 (only with row sampling) — keep at most max_rows_per_unit rows per unit and group.

    SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY __unit, __k0
                                                ORDER BY hash('<salt>', __unit, __k0, __c0), __c0) AS __rn
                   FROM grid_values) WHERE __rn <= 5

By default the next pass clamps each unit's per-group contribution to what max_rows_per_unit rows
can add, which bounds it just as well, keeps more of the data and needs no window over rows; a
table can ask for this literal sample instead (PrivateQuery.sample_rows). Which rows a unit keeps
depends only on that unit's own rows (the window is partitioned by unit) and the plan's salt. The
order is total: a hash, then every selected column.
"""

from __future__ import annotations

from sqlglot import exp

from dpproxy.sql.rewrite.state import UNIT, RewriteContext, RewriteState, col, component_column


def salted_hash(salt: str, columns: list[str], dialect: str) -> exp.Expression:
    """A per-row pseudo-random order key from the salt and some columns.

    DuckDB: its native hash() of all arguments (fast). Elsewhere: md5 of
    salt || '|' || coalesce(c::text, '') || …, which PostgreSQL computes in C.
    """
    if dialect == "duckdb":
        return exp.Anonymous(this="hash", expressions=[exp.Literal.string(salt), *[col(c) for c in columns]])
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
    ctx: RewriteContext,
    partition: list[str],
    order: list[str],
    salt: str,
    limit: int,
    keep: list[str],
    rank: str,
    *,
    dense: bool = False,
) -> exp.Select:
    """SELECT keep FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY … ORDER BY hash, …) AS rank)
    WHERE rank <= limit."""
    # The hash covers the partition (the unit) too: otherwise every unit would rank its groups
    # the same way and all would keep the same ones.
    ordering = [exp.Ordered(this=salted_hash(salt, [*partition, *order], ctx.dialect), nulls_first=False)]
    ordering.extend(exp.Ordered(this=col(c), nulls_first=False) for c in order)
    window = exp.Window(
        # DENSE_RANK ranks equal (hash, keys) alike: rows of one group share a rank, which keeps
        # whole groups when the relation holds rows rather than one row per person and group.
        this=exp.DenseRank() if dense else exp.RowNumber(),
        partition_by=[col(c) for c in partition],
        order=exp.Order(expressions=ordering),
    )
    ranked = exp.select("*", exp.alias_(window, rank, quoted=True), copy=False).from_(
        state.current, copy=False
    )
    return (
        exp.select(*[col(c) for c in keep], copy=False)
        .from_(ranked.subquery("ranked", copy=False), copy=False)
        .where(exp.LTE(this=col(rank), expression=exp.Literal.number(limit)), copy=False)
    )


def bound_rows(state: RewriteState, ctx: RewriteContext) -> RewriteState:
    query = ctx.query
    if not ctx.per_unit or not query.sample_rows or ctx.only_counts_rows:
        return state
    values = [component_column(i) for i in ctx.valued_components]
    select = keep_first(
        state,
        ctx,
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
