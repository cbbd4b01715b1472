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

from dpproxy.sql.rewrite.state import RewriteContext, RewriteState, col, component_column


def salted_hash(salt: str, columns: list[str], dialect: str) -> exp.Expression:
    """A per-row pseudo-random order key from the salt and some columns.

    DuckDB: its native hash() of all arguments; Spark: xxhash64 of all arguments. PostgreSQL:
    hashtextextended (≥ 11; a 64-bit hash, five times cheaper than md5, which doubled the row
    pipeline's time) of salt || '|' || coalesce(c::text, '') || …. None needs to be cryptographic:
    the choice is a function of one unit's own rows and the plan's salt, which is all the bound
    relies on.
    """
    if dialect in ("duckdb", "spark"):
        name = "hash" if dialect == "duckdb" else "xxhash64"
        return exp.Anonymous(this=name, expressions=[exp.Literal.string(salt), *[col(c) for c in columns]])
    text: exp.Expression = exp.Literal.string(salt)
    for c in columns:
        value = exp.Coalesce(
            this=exp.Cast(this=col(c), to=exp.DataType.build(exp.DataType.Type.VARCHAR)),
            expressions=[exp.Literal.string("")],
        )
        text = exp.DPipe(
            this=exp.DPipe(this=text, expression=exp.Literal.string("|"), safe=True),
            expression=value,
            safe=True,
        )
    return exp.Anonymous(this="hashtextextended", expressions=[text, exp.Literal.number(0)])


def _hash_order(ctx: RewriteContext, salt: str, hashed: list[str], then: list[str]) -> list[exp.Ordered]:
    """ORDER BY hash(salt, hashed…), then… (NULLs last): a total, salted pseudo-random order."""
    ordering = [exp.Ordered(this=salted_hash(salt, hashed, ctx.dialect), nulls_first=False)]
    ordering.extend(exp.Ordered(this=col(c), nulls_first=False) for c in then)
    return ordering


def _window(function: exp.Expression, partition: list[str], ordering: list[exp.Ordered]) -> exp.Window:
    return exp.Window(
        this=function,
        partition_by=[col(c) for c in partition],
        order=exp.Order(expressions=[o.copy() for o in ordering]),
    )


def _keep_where(
    state: RewriteState, ranks: list[tuple[exp.Window, str]], keep: list[str], condition: exp.Expression
) -> exp.Select:
    ranked = exp.select(
        "*", *[exp.alias_(window, name, quoted=True) for window, name in ranks], copy=False
    ).from_(state.current, copy=False)
    return (
        exp.select(*[col(c) for c in keep], copy=False)
        .from_(ranked.subquery("ranked", copy=False), copy=False)
        .where(condition, copy=False)
    )


def keep_first(
    state: RewriteState,
    ctx: RewriteContext,
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
    window = _window(exp.RowNumber(), partition, _hash_order(ctx, salt, [*partition, *order], order))
    within = exp.LTE(this=col(rank), expression=exp.Literal.number(limit))
    return _keep_where(state, [(window, rank)], keep, within)


def keep_rows_of_first_groups(
    state: RewriteState,
    ctx: RewriteContext,
    values: list[str],
    max_rows: int,
    max_groups: int,
    keep: list[str],
) -> exp.Select:
    """At most max_rows rows per unit and group, in at most max_groups groups per unit, over rows
    (not one row per unit and group), with one sort of each unit's rows:

        ROW_NUMBER() OVER (PARTITION BY __unit ORDER BY <groups hash>, keys, <rows hash>, values) AS __rn
        RANK()       OVER (PARTITION BY __unit ORDER BY <groups hash>, keys) AS __gstart
        DENSE_RANK() OVER (PARTITION BY __unit ORDER BY <groups hash>, keys) AS __gn
        … WHERE __gn <= g AND __rn - __gstart < r

    __gstart is the __rn of the group's first row, __gn the group's rank. The same groups as
    bounded_groups (same salted hash of unit and keys) and the same rows as keep_first over
    (unit, keys) (same salted hash of the row): only the windows are merged, since two sorts of
    every row cost twice one.
    """
    keys = list(ctx.keys)
    persons = ctx.persons
    groups = _hash_order(ctx, ctx.salt + ":groups", [*persons, *keys], keys)
    rows = groups + _hash_order(ctx, ctx.salt + ":rows", [*persons, *keys, *values], values)
    ranks = [
        (_window(exp.RowNumber(), persons, rows), "__rn"),
        (_window(exp.Rank(), persons, groups), "__gstart"),
        (_window(exp.DenseRank(), persons, groups), "__gn"),
    ]
    within_rows = exp.LT(
        this=exp.Sub(this=col("__rn"), expression=col("__gstart")), expression=exp.Literal.number(max_rows)
    )
    within_groups = exp.LTE(this=col("__gn"), expression=exp.Literal.number(max_groups))
    return _keep_where(state, ranks, keep, exp.and_(within_groups, within_rows, copy=False))


def bound_rows(state: RewriteState, ctx: RewriteContext) -> RewriteState:
    query = ctx.query
    if not ctx.per_unit or not query.sample_rows or ctx.only_counts_rows:
        return state
    values = [component_column(i) for i in ctx.valued_components]
    select = keep_first(
        state,
        ctx,
        [*ctx.persons, *ctx.keys],
        values,
        ctx.salt + ":rows",
        query.max_rows,
        [*ctx.persons, *ctx.keys, *values],
        "__rn",
    )
    return state.then(
        "bounded_rows",
        f"at most {query.max_rows} row(s) per unit and group, chosen by a salted hash of the unit's own rows",
        select,
    )
