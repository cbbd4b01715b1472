"""Queries over the released rows of one private aggregate: post-processing, answered for free.

    WITH agg AS (SELECT department, COUNT(*) AS n FROM visits GROUP BY 1) SELECT * FROM agg ORDER BY n
    SELECT * FROM (SELECT department, AVG(cost) FROM visits GROUP BY 1) t LIMIT 500
    SELECT count(*) FROM (SELECT zip, SUM(income) FROM patients GROUP BY zip) AS CXTMPTAB_COUNT
    SELECT SUM(n) FROM (SELECT department, COUNT(*) AS n FROM visits GROUP BY 1) t   -- re-aggregation

Tools write these all the time: Ibis orders after aggregating, SQL editors wrap a query in a LIMIT,
connectorx counts its rows first, DuckDB's postgres_query selects from it, dbt tests and BI
"virtual datasets" aggregate again. The outer query reads nothing but the inner one's answer, so it
is computed from the released (noisy) rows alone: by the post-processing property of differential
privacy it costs nothing beyond the inner aggregate's ε, which is charged once (docs/privacy.md §6).

`split_released` recognises the shape from the text: one FROM item, a subquery (a CTE reference is
its body) whose SELECT aggregates, and nothing else read anywhere in the outer query; the engine tries
it only when the statement is refused as one private query (a subquery grouped by the privacy unit
is a per-person step of a private query, not this). `released_query` types the outer query against
the inner one's output columns and checks that it calls only functions public queries may call. The
engine (dpproxy.engine.released) runs it on an in-memory DuckDB holding the released rows and nothing
else, without access to files or the network.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sqlglot import exp

from dpproxy.errors import NotSupported, PolicyViolation, UndefinedColumn
from dpproxy.sql.analyze import typed_select
from dpproxy.sql.inline import expand_ctes
from dpproxy.sql.names import function_name
from dpproxy.sql.public import PUBLIC_FUNCTIONS
from dpproxy.sql.query import OutputColumn, PrivateQuery
from dpproxy.sql.types import SQLGLOT_SCHEMA_TYPE

# Window functions over released rows are post-processing too (a rank of released counts).
_OUTER_FUNCTIONS = (*PUBLIC_FUNCTIONS, exp.Connector, exp.Window, exp.Rank, exp.DenseRank, exp.Ntile)


@dataclass(frozen=True)
class ReleasedSplit:
    """A statement taken apart: the inner aggregate, and the outer query reading it as a table."""

    inner: exp.Select
    outer: exp.Select  # FROM the table `name` (the subquery's alias), nothing else read
    name: str


@dataclass(frozen=True)
class ReleasedQuery:
    """An outer query over the released rows of `inner` (a private aggregate, or itself such a query)."""

    inner: PrivateQuery | ReleasedQuery
    outer: exp.Select  # qualified and typed; reads the table `name`
    name: str
    columns: tuple[OutputColumn, ...]  # the inner answer's columns: the released table's
    outputs: tuple[OutputColumn, ...]
    passed: tuple[int | None, ...]  # per output, the inner column it repeats unchanged (its ±)
    text: str

    @property
    def private(self) -> PrivateQuery:
        """The private aggregate at the bottom, whose plan is charged."""
        inner = self.layers()[0].inner
        assert isinstance(inner, PrivateQuery)
        return inner

    def layers(self) -> list[ReleasedQuery]:
        """This query and the outer queries it reads through, from the innermost (run first, over
        the private aggregate's answer) to this one."""
        layers = [self]
        while isinstance(layers[-1].inner, ReleasedQuery):
            layers.append(layers[-1].inner)
        return layers[::-1]


def split_released(tree: exp.Expression, units: Collection[str] = ()) -> ReleasedSplit | None:
    """The inner aggregate and the outer query of `SELECT … FROM (<aggregate>) t …` (or of a CTE
    whose body aggregates, read by name), or None when the statement is not that shape. A subquery
    grouped by a privacy unit (`units`: their column names) is a per-person step of a private query,
    whose own refusal stands."""
    if not isinstance(tree, exp.Select) or tree.args.get("joins"):
        return None
    with_ = tree.args.get("with_") or tree.args.get("with")
    if with_ is not None and with_.args.get("recursive"):
        return None
    tree = expand_ctes(tree)  # a CTE read by name becomes its body as an aliased subquery
    from_ = tree.args.get("from_") or tree.args.get("from")
    if from_ is None or not isinstance(from_.this, exp.Subquery):
        return None
    subquery = from_.this
    inner = subquery.this
    if not isinstance(inner, exp.Select):
        return None
    if not _aggregates(inner) and split_released(inner, units) is None:
        # Post-processing of post-processing (dbt's tests: COUNT(*) over a CTE's released rows,
        # filtered) is answered the same way, level by level; anything else is not this shape.
        return None
    group = inner.args.get("group")
    if group is not None and any(
        isinstance(node, exp.Column) and node.name.lower() in units
        for e in group.expressions
        for node in e.walk()
    ):
        return None
    written = subquery.args["alias"].this if subquery.args.get("alias") is not None else None
    # The name as PostgreSQL reads it: folded to lower case unless quoted.
    name = "subquery" if written is None else written.name if written.quoted else written.name.lower()
    table = exp.Table(this=exp.to_identifier(name, quoted=True))
    outer = tree.copy()
    outer_from = outer.args.get("from_") or outer.args.get("from")
    alias = subquery.args.get("alias")
    if alias is not None and alias.columns:
        return None  # t(a, b): renamed columns; left to the refusal
    outer_from.set("this", table)
    for node in outer.walk():
        if node is table:
            continue
        if isinstance(node, (exp.Table, exp.Subquery, exp.Exists, exp.Values, exp.Lateral)):
            return None  # the outer query reads something else too: not post-processing alone
        if isinstance(node, (exp.Into, exp.Lock)):
            raise PolicyViolation("SELECT INTO and row locks are not allowed")
    return ReleasedSplit(inner, outer, name)


def _aggregates(select: exp.Select) -> bool:
    if select.args.get("group") is not None or select.args.get("distinct") is not None:
        return True
    return any(
        isinstance(node, exp.AggFunc) and node.find_ancestor(exp.Window) is None
        for item in select.expressions
        for node in item.walk()
    )


def released_query(split: ReleasedSplit, inner: PrivateQuery | ReleasedQuery, text: str) -> ReleasedQuery:
    """The outer query typed against the inner answer's columns, its functions checked."""
    columns = inner.outputs if isinstance(inner, ReleasedQuery) else inner.post_processing.outputs
    seen: set[str] = set()
    for column in columns:
        if column.name in seen:
            raise NotSupported(
                f'subquery {split.name} has two columns named "{column.name}"',
                hint="name each column of the subquery with AS",
            )
        seen.add(column.name)
    for node in split.outer.walk():
        if isinstance(node, exp.Func) and not isinstance(node, _OUTER_FUNCTIONS):
            raise NotSupported(
                f"function {function_name(node)}() is not supported over the answer of subquery {split.name}",
                hint="compute it from the answer in your client",
            )
    schema = {split.name: {c.name: SQLGLOT_SCHEMA_TYPE.get(c.type, "TEXT") for c in columns}}
    try:
        annotated, outputs = typed_select(split.outer.copy(), schema)
    except UndefinedColumn as error:
        raise UndefinedColumn(
            f"{error.message} (subquery {split.name} has the columns of its answer only)",
            hint=f"its columns: {', '.join(c.name for c in columns)}",
        ) from None
    names = [c.name for c in columns]
    passed = tuple(_passed(o.expression, names) for o in outputs)
    return ReleasedQuery(inner, annotated, split.name, columns, outputs, passed, text)


def _passed(expression: exp.Expression, names: list[str]) -> int | None:
    node = expression.this if isinstance(expression, exp.Alias) else expression
    return names.index(node.name) if isinstance(node, exp.Column) and node.name in names else None
