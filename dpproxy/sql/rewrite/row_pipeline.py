"""Pass 7 — the row pipeline: aggregates that need a person's rows, not their sums.

COUNT(DISTINCT x) and the histograms of quantiles and MODE cannot be summed per person, so they get
a statement of their own over contribution-bounded *rows*:

    WITH rows_selected AS (SELECT __unit, __k0, x AS __c3, <bin of y> AS __h0 FROM … WHERE …),
         rows_bounded  AS (at most max_rows_per_unit rows per person and group, salted hash of the
                           row, in at most max_groups_per_unit groups per person, the same salted
                           hash of (person, keys) as bounded_groups, so the same groups: one window
                           sort; rows_sampled, rows only, when the groups need no bound)
    SELECT __k0, COUNT(DISTINCT __c3) … GROUP BY __k0            -- one statement for the distincts
    SELECT __k0, __h0, COUNT(*) … GROUP BY __k0, __h0            -- one per histogram

A person then adds at most r rows to a group (so at most r distinct values and r histogram counts)
in at most g groups. When every row is its own person, there is nothing to bound. A histogram bin is
an integer from the argument clipped to its range on its grid: ((v − lo)·(K − 1)) div (hi − lo).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp

from dpproxy.sql.numbers import emit, grid_integer
from dpproxy.sql.query import Histogram, PrivateQuery
from dpproxy.sql.rewrite.bound_rows import keep_first, keep_rows_of_first_groups
from dpproxy.sql.rewrite.select_rows import person_projections, public_value_literal, read_relation
from dpproxy.sql.rewrite.state import (
    RewriteContext,
    RewriteState,
    Step,
    col,
    component_column,
    key_value,
)
from dpproxy.sql.rowexpr import clip_sql, number_literal
from dpproxy.sql.types import PgType


def histogram_column(h: int) -> str:
    return f"__h{h}"


def sub_bin_column(h: int) -> str:
    return f"__s{h}"


def _grid(histogram: Histogram) -> exp.Expression:
    assert histogram.interval is not None
    clipped = clip_sql(histogram.argument.copy(), histogram.interval, PgType.NUMERIC, double=histogram.double)
    return grid_integer(clipped, histogram.scale, double=histogram.double, integer=histogram.exact_integer)


def sub_bin_sql(histogram: Histogram) -> exp.Expression:
    """A refined histogram's sub-bin of a row's value within its coarse bin (NULL when the value is
    NULL): (((v − lo)·(K − 1)) mod (hi − lo))·fine div (hi − lo), exact on non-negative integers."""
    assert histogram.interval is not None and histogram.fine > 0
    lo, hi = histogram.interval.on_grid(histogram.scale)
    offset = exp.Paren(this=exp.Sub(this=_grid(histogram), expression=number_literal(lo)))
    scaled = exp.Cast(
        this=exp.Mul(this=offset, expression=exp.Literal.number(histogram.candidates - 1)),
        to=exp.DataType.build(exp.DataType.Type.BIGINT),
    )
    remainder = exp.Paren(this=exp.Mod(this=scaled, expression=exp.Literal.number(hi - lo)))
    numerator = exp.Cast(
        this=exp.Mul(this=remainder, expression=exp.Literal.number(histogram.fine)),
        to=exp.DataType.build(exp.DataType.Type.BIGINT),
    )
    return exp.IntDiv(this=numerator, expression=exp.Literal.number(hi - lo))


def refinement_select(histogram_step: exp.Select, h: int, bins: list[int] | exp.Expression) -> exp.Select:
    """The second pass of refined histogram h: the same bounded rows as its first pass (the same CTEs,
    salt and order, so the same rows), counted per group, coarse bin and sub-bin, in the coarse bins
    `bins` only (public: the windows of the first, released picks), or at the one node `bins` stands
    for them (`refinement_statement`)."""
    select = histogram_step.copy()
    name, sub = histogram_column(h), sub_bin_column(h)
    projections = select.expressions
    # …, the coarse bin, the sub-bin, the count (one per pair of candidates: histogram_rows).
    at = 1 + next(i for i, p in enumerate(projections) if p.alias_or_name == name)
    select.set("expressions", [*projections[:at], col(sub), *projections[at:]])
    listed = [bins] if isinstance(bins, exp.Expression) else [exp.Literal.number(b) for b in bins]
    inside = exp.In(this=col(name), expressions=listed)
    select = select.where(inside, append=True, copy=False).group_by(col(sub), append=True, copy=False)
    return select


@dataclass(frozen=True)
class RefinementStatement:
    """The second pass of a refined histogram, emitted with the plan: its SQL with one place for the
    coarse bins it counts. The bins are integers the release computes from released picks (never
    analyst text); `sql` writes them as numerals, so the statement that runs is the analysed one with
    that list, and the release step writes no SQL of its own."""

    histogram: int
    before: str
    after: str

    def sql(self, bins: Sequence[int]) -> str:
        if not bins:
            raise ValueError("a refinement counts at least one coarse bin")
        return self.before + ", ".join(str(int(b)) for b in bins) + self.after


def refinement_statement(histogram_step: exp.Select, h: int, dialect: str) -> RefinementStatement:
    """`refinement_select` emitted for `dialect` once, with a node of its own (named by a fresh random
    token, so no text the analyst wrote can hold it) where the bin list goes, and split there."""
    marker = f"__dpproxy_bins_{secrets.token_hex(16)}"
    text = emit(refinement_select(histogram_step, h, exp.Var(this=marker)), dialect, owned=True)
    before, found, after = text.partition(marker)
    if not found or marker in after:
        raise AssertionError("the refinement's bin list was not emitted exactly once")
    return RefinementStatement(h, before, after)


def bin_sql(histogram: Histogram) -> exp.Expression:
    """The candidate bin of a row's value (NULL when the value is NULL or not a candidate)."""
    value = histogram.argument.copy()
    if histogram.values is not None:
        ifs = [
            exp.If(this=public_value_literal(candidate), true=exp.Literal.number(j))
            for j, candidate in enumerate(histogram.values)
        ]
        return exp.Case(this=value, ifs=ifs)
    assert histogram.interval is not None
    lo, hi = histogram.interval.on_grid(histogram.scale)
    grid = _grid(histogram)
    if hi == lo or histogram.candidates == 1:
        return exp.Case(
            ifs=[exp.If(this=exp.Is(this=grid, expression=exp.Null()), true=exp.Null())],
            default=exp.Literal.number(0),
        )
    offset = exp.Paren(this=exp.Sub(this=grid, expression=number_literal(lo)))
    numerator = exp.Cast(
        this=exp.Mul(this=offset, expression=exp.Literal.number(histogram.candidates - 1)),
        to=exp.DataType.build(exp.DataType.Type.BIGINT),
    )
    # Exact integer division of non-negative integers: PostgreSQL's DIV(), DuckDB's //.
    return exp.IntDiv(this=numerator, expression=exp.Literal.number(hi - lo))


@dataclass(frozen=True)
class HistogramBounds:
    """With bounds chosen per query, what a histogram statement counts: for every candidate k the
    rows each person keeps per group (their first k in the group's salted order) and, when the row
    pipeline ranks a person's groups and g is chosen, for every candidate g those in the person's
    first g groups (the same salted order as partition selection's): one count column per pair, k
    major. The release keeps the chosen pair's counts (dpproxy.release.exact) and calibrates each
    pick for k rows in each of g groups (dpproxy.release.requests)."""

    rows: tuple[int, ...]
    groups: tuple[int, ...]  # (): no choice of g here; the pipeline's groups are the ceiling's

    def pairs(self) -> list[tuple[int, int | None]]:
        return [(k, g) for k in self.rows for g in (self.groups or (None,))]

    def column(self, rows: int, groups: int | None) -> int:
        """The count column of candidate `rows` of k and `groups` of g (-1: the ceiling)."""
        j = range(len(self.rows))[rows]
        if not self.groups:
            return j
        return j * len(self.groups) + range(len(self.groups))[-1 if groups is None else groups]

    def at(self, rows: int, groups: int | None) -> tuple[int, int | None]:
        return self.pairs()[self.column(rows, groups)]


def histogram_rows(query: PrivateQuery) -> HistogramBounds | None:
    """The pairs a query's histograms are counted at (HistogramBounds). None: one count, of the rows
    within the policy's limits."""
    bounds = query.bounds
    if bounds is None or not query.histograms:
        return None
    return HistogramBounds(bounds.rows, bounds.groups if query.bounds_groups else ())


def _counts(
    ranks: HistogramBounds | None, within: Callable[[int, int | None], exp.Expression]
) -> list[exp.Expression]:
    """COUNT(*), or one count per pair of candidates of the rows a person keeps at them
    (`within(k, g)`)."""
    if ranks is None:
        return [exp.alias_(exp.Count(this=exp.Star()), "__count", quoted=True, copy=False)]
    return [
        exp.alias_(
            exp.Sum(
                this=exp.Case(
                    ifs=[exp.If(this=within(k, g), true=exp.Literal.number(1))], default=exp.Literal.number(0)
                )
            ),
            f"__count{j}",
            quoted=True,
            copy=False,
        )
        for j, (k, g) in enumerate(ranks.pairs())
    ]


def row_pipeline(state: RewriteState, ctx: RewriteContext) -> RewriteState:
    query = ctx.query
    if not query.needs_row_pipeline:
        return state
    distinct = ctx.row_components
    projections: list[exp.Expression] = []
    if ctx.per_unit:
        projections.extend(person_projections(query.relation))
    for j, key in enumerate(query.keys):
        projections.append(exp.alias_(key_value(key, ctx.dialect), ctx.keys[j], quoted=True, copy=False))
    values = [component_column(i) for i in distinct] + [
        histogram_column(h) for h in range(len(query.histograms))
    ]
    # A refined histogram's sub-bin is part of the value a row is chosen by, so that which rows a
    # person keeps is the same in both passes (it depends on the full value, not on its coarse bin).
    values += [sub_bin_column(h) for h, histogram in enumerate(query.histograms) if histogram.fine]
    for i in distinct:
        argument = query.components[i].argument
        assert argument is not None
        projections.append(exp.alias_(argument.copy(), component_column(i), quoted=True, copy=False))
    for h, histogram in enumerate(query.histograms):
        projections.append(exp.alias_(bin_sql(histogram), histogram_column(h), quoted=True, copy=False))
    for h, histogram in enumerate(query.histograms):
        if histogram.fine:
            projections.append(exp.alias_(sub_bin_sql(histogram), sub_bin_column(h), quoted=True, copy=False))
    chain: list[tuple[str, exp.Select]] = [("rows_selected", read_relation(ctx, projections))]
    current = RewriteState(steps=(Step("rows_selected", "", chain[0][1]),))
    keep = [*ctx.persons, *ctx.keys, *values] if ctx.per_unit else [*ctx.keys, *values]
    ranks = histogram_rows(query) if ctx.per_unit else None
    grouped = ctx.per_unit and query.bounds_groups

    def within(k: int, g: int | None) -> exp.Expression:
        """A row among the first k of its person's in its group (keep_rows_of_first_groups numbers
        a person's rows in all: __rn − __gstart is the row's place in its group, from 0), in one of
        the person's first g groups (__gn, its rank among them)."""
        if not grouped:
            return exp.LTE(this=col("__rn"), expression=exp.Literal.number(k))
        offset = exp.Sub(this=col("__rn"), expression=col("__gstart"))
        row = exp.LT(this=offset, expression=exp.Literal.number(k))
        if g is None:
            return row
        return exp.and_(row, exp.LTE(this=col("__gn"), expression=exp.Literal.number(g)), copy=False)

    if grouped:
        ranked = ["__rn", "__gstart", *(["__gn"] if ranks.groups else [])] if ranks else []
        kept = [*keep, *ranked]
        bounded = keep_rows_of_first_groups(current, ctx, values, query.max_rows, query.max_groups, kept)
        chain.append(("rows_bounded", bounded))
    elif ctx.per_unit:
        kept = [*keep, "__rn"] if ranks else keep
        sampled = keep_first(
            current, ctx, [*ctx.persons, *ctx.keys], values, ctx.salt + ":rows", query.max_rows, kept, "__rn"
        )
        chain.append(("rows_sampled", sampled))
    source = chain[-1][0]
    statements: list[Step] = []

    def keys() -> list[exp.Expression]:
        # New nodes for each statement: a node attached to two trees has one parent only.
        return [col(k) for k in ctx.keys]

    if distinct and ctx.per_unit:
        # Each person's distinct values, per group: the release gives each person at most ℓ of them
        # (dpproxy.release.distinct), so one person moves a group's count by at most ℓ.
        for j, i in enumerate(distinct):
            value = col(component_column(i))
            name = f"distinct_values_{j}" if len(distinct) > 1 else "distinct_values"
            final = (
                exp.select(*keys(), *[col(c) for c in ctx.persons], value, copy=False)
                .distinct()
                .from_(source, copy=False)
                .where(exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())), copy=False)
            )
            statements.append(Step(name, "each person's distinct values among their rows, per group", final))
    elif distinct:
        final = exp.select(
            *keys(),
            *[
                exp.alias_(
                    exp.Count(this=exp.Distinct(expressions=[col(component_column(i))])),
                    component_column(i),
                    quoted=True,
                    copy=False,
                )
                for i in distinct
            ],
            copy=False,
        ).from_(source, copy=False)
        if ctx.keys:
            final = final.group_by(*keys(), copy=False)
        statements.append(Step("distinct_values", "distinct values among the bounded rows, per group", final))
    for h in range(len(query.histograms)):
        name = histogram_column(h)
        final = (
            exp.select(*keys(), col(name), *_counts(ranks, within), copy=False)
            .from_(source, copy=False)
            .where(exp.Not(this=exp.Is(this=col(name), expression=exp.Null())), copy=False)
            .group_by(*keys(), col(name), copy=False)
        )
        statements.append(Step(f"histogram_{h}", f"counts per candidate of histogram {h}, per group", final))
    auxiliary = []
    for step in statements:
        body = step.select
        for name, select in chain:
            body = body.with_(name, as_=select.copy(), copy=False)
        auxiliary.append(Step(step.name, step.summary, body))
    return RewriteState(state.steps, state.final, tuple(auxiliary))
