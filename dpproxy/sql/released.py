"""Queries over the released rows of one private aggregate: post-processing, answered for free.

    WITH agg AS (SELECT department, COUNT(*) AS n FROM visits GROUP BY 1) SELECT * FROM agg ORDER BY n
    SELECT * FROM (SELECT department, AVG(cost) FROM visits GROUP BY 1) t LIMIT 500
    SELECT count(*) FROM (SELECT zip, SUM(income) FROM patients GROUP BY zip) AS CXTMPTAB_COUNT
    SELECT SUM(n) FROM (SELECT department, COUNT(*) AS n FROM visits GROUP BY 1) t   -- re-aggregation
    SELECT department, COUNT(*) * 100.0 / SUM(COUNT(*)) OVER () FROM visits GROUP BY 1  -- windows

Tools write these all the time: Ibis orders after aggregating, SQL editors wrap a query in a LIMIT,
connectorx counts its rows first, DuckDB's postgres_query selects from it, dbt tests and BI
"virtual datasets" aggregate again. The outer query reads nothing but the inner one's answer, so it
is computed from the released (noisy) rows alone: by the post-processing property of differential
privacy it costs nothing beyond the inner aggregate's ε, which is charged once (docs/privacy.md §6).

Window functions over the aggregates of the same SELECT (a share of the total, a rank, a running
sum) are that shape written in one SELECT: SQL computes them after GROUP BY and HAVING, from the
grouped rows alone. `split_released` lifts them out (`_lift_windows`): the aggregate keeps its FROM,
WHERE, GROUP BY and HAVING and returns its keys and aggregates; the select list, ORDER BY and LIMIT
read them as the outer query. They read the released groups only, so a share is a share of what was
released (groups hidden by partition selection are not in its total).

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
from dpproxy.sql.postprocess.intervals import interval_end
from dpproxy.sql.public import PUBLIC_FUNCTIONS
from dpproxy.sql.query import OutputColumn, PrivateQuery
from dpproxy.sql.select_list import output_name, repeated_name
from dpproxy.sql.types import SQLGLOT_SCHEMA_TYPE

# Window functions over released rows are post-processing too (a rank of released counts).
_OUTER_FUNCTIONS = (
    *PUBLIC_FUNCTIONS,
    exp.Connector,
    exp.Window,
    exp.Rank,
    exp.DenseRank,
    exp.Ntile,
    exp.PercentRank,
    exp.CumeDist,
    exp.FirstValue,
    exp.LastValue,
    exp.NthValue,
)
# What the outer query of a lifted SELECT reads as an inner column: an aggregate (or, with
# dp_interval_low/high, an end of its interval).
_RELEASED = (exp.AggFunc, exp.Filter, exp.WithinGroup)
# The released table window functions of an aggregating SELECT read (`_lift_windows`).
LIFTED = "aggregates"


def _source(name: str, lifted: bool) -> str:
    """What an outer query reads, as messages name it."""
    return "the aggregates of this query" if lifted else f"subquery {name}"


@dataclass(frozen=True)
class ReleasedSplit:
    """A statement taken apart: the inner aggregate, and the outer query reading it as a table."""

    inner: exp.Select
    outer: exp.Select  # FROM the table `name` (the subquery's alias), nothing else read
    name: str
    lifted: bool = False  # window functions of one SELECT lifted over its aggregates (`_lift_windows`)

    @property
    def source(self) -> str:
        return _source(self.name, self.lifted)


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
    lifted: bool = False  # ReleasedSplit.lifted

    @property
    def source(self) -> str:
        return _source(self.name, self.lifted)

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


# What an outer query over released rows may not hold: it would read something else too.
_ELSEWHERE = (exp.Table, exp.Subquery, exp.Exists, exp.Values, exp.Lateral)


def split_released(tree: exp.Expression, units: Collection[str] = ()) -> ReleasedSplit | None:
    """The inner aggregate and the outer query of `SELECT … FROM (<aggregate>) t …` (or of a CTE
    whose body aggregates, read by name), or None when the statement is not that shape. A subquery
    grouped by a privacy unit (`units`: their column names) is a per-person step of a private query,
    whose own refusal stands."""
    if not isinstance(tree, exp.Select):
        return None
    with_ = tree.args.get("with_") or tree.args.get("with")
    if with_ is not None and with_.args.get("recursive"):
        return None
    tree = expand_ctes(tree)  # a CTE read by name becomes its body as an aliased subquery
    lifted = _lift_windows(tree)
    if lifted is not None:
        return lifted
    if tree.args.get("joins"):
        return None
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
        if isinstance(node, _ELSEWHERE):
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
    twice = repeated_name(c.name for c in columns)
    if twice is not None:
        raise NotSupported(
            f'{split.source} has two columns named "{twice}"', hint="name each column of the subquery with AS"
        )
    for node in split.outer.walk():
        if isinstance(node, exp.Func) and not isinstance(node, _OUTER_FUNCTIONS):
            raise NotSupported(
                f"function {function_name(node)}() is not supported over the answer of {split.source}",
                hint="compute it from the answer in your client",
            )
    schema = {split.name: {c.name: SQLGLOT_SCHEMA_TYPE.get(c.type, "TEXT") for c in columns}}
    try:
        annotated, outputs = typed_select(split.outer.copy(), schema)
    except UndefinedColumn as error:
        raise UndefinedColumn(
            f"{error.message} ({split.source} has the columns of its answer only)",
            hint=f"its columns: {', '.join(c.name for c in columns)}",
        ) from None
    names = [c.name for c in columns]
    passed = tuple(_passed(o.expression, names) for o in outputs)
    return ReleasedQuery(inner, annotated, split.name, columns, outputs, passed, text, split.lifted)


def _passed(expression: exp.Expression, names: list[str]) -> int | None:
    node = expression.this if isinstance(expression, exp.Alias) else expression
    return names.index(node.name) if isinstance(node, exp.Column) and node.name in names else None


def _lift_windows(tree: exp.Select) -> ReleasedSplit | None:
    """An aggregating SELECT with window functions in its select list or ORDER BY, taken apart into
    the aggregate (its FROM, WHERE, GROUP BY and HAVING; returning its keys and aggregates) and the
    outer query computing the select list, ORDER BY and LIMIT from those, with the windows; None
    when `tree` is not that shape (its own refusal then stands).

    Each select item without a window is an inner column the outer passes through (its ± kept);
    an aggregate inside a window item (`SUM(COUNT(*)) OVER ()`: the COUNT(*)) and each GROUP BY key
    such an item reads become inner columns of their own. What is left in the outer query must be
    those columns: a raw column there (`SUM(x) OVER ()` of a column not grouped) is not lifted."""
    order = tree.args.get("order")
    ordered = list(order.expressions) if order is not None else []
    if not any(e.find(exp.Window) for e in [*tree.expressions, *ordered]):
        return None
    from_ = tree.args.get("from_") or tree.args.get("from")
    if from_ is None:
        return None
    body = from_.this.this if isinstance(from_.this, exp.Subquery) else None
    if isinstance(body, exp.Select) and _aggregates(body):
        return None  # over an aggregating subquery: the outer query over its answer (split_released)
    if any(tree.args.get(clause) for clause in ("distinct", "windows", "qualify", "into", "locks")):
        return None
    group = tree.args.get("group")
    if not _aggregates(tree) or (group is not None and set(group.args) - {"expressions"}):
        return None  # ROLLUP, CUBE and GROUPING SETS keep their own refusal
    items = tree.expressions
    plain = [i for i, item in enumerate(items) if not item.find(exp.Window)]
    aliases = {item.alias: i for i, item in enumerate(items) if isinstance(item, exp.Alias) and i in plain}
    inner_items: list[exp.Expression] = []
    names: dict[int, str] = {}  # select position → its inner column
    for i in plain:
        item = items[i]
        names[i] = item.alias if isinstance(item, exp.Alias) else f"__dp_{i}"
        inner_items.append(item.copy() if isinstance(item, exp.Alias) else exp.alias_(item.copy(), names[i]))
    # Each GROUP BY key, positions resolved, and the inner column holding its value (by its text).
    keys: list[exp.Expression] = []
    columns: dict[str, str] = {}
    for key in group.expressions if group is not None else []:
        if isinstance(key, exp.Literal) and key.is_int:
            position = int(key.name) - 1
            if position not in plain:
                return None  # out of range, or a window: PostgreSQL's own error
            item = items[position]
            keys.append((item.this if isinstance(item, exp.Alias) else item).copy())
            columns[keys[-1].sql()] = names[position]
            continue
        keys.append(key.copy())
        if isinstance(key, exp.Column) and not key.table and key.name in aliases:  # GROUP BY alias
            columns[key.sql()] = names[aliases[key.name]]
            columns[items[aliases[key.name]].this.sql()] = names[aliases[key.name]]
        else:
            columns.setdefault(key.sql(), "")  # an inner column of its own, if read
    aggregates: dict[str, exp.Expression] = {}

    def lift(node: exp.Expression) -> exp.Expression:
        text = node.sql()
        if text in columns:
            if not columns[text]:
                columns[text] = f"__dp_key_{len([c for c in columns.values() if c.startswith('__dp_key_')])}"
                inner_items.append(exp.alias_(node.copy(), columns[text], quoted=True))
            return exp.column(columns[text], quoted=True)
        window_function = isinstance(node.parent, exp.Window) and node.arg_key == "this"
        released = isinstance(node, _RELEASED) or interval_end(node) is not None
        if released and not window_function:  # an aggregate, or an end of its interval: an inner column
            if text not in aggregates:
                aggregates[text] = exp.alias_(node.copy(), f"__dp_agg_{len(aggregates)}", quoted=True)
            return exp.column(aggregates[text].alias, quoted=True)
        for child in list(node.iter_expressions()):
            replacement = lift(child)
            if replacement is not child:
                child.replace(replacement)
        return node

    outer_items = []
    lifted: list[exp.Expression] = []  # what the outer query computes: it may read lifted columns only
    for i, item in enumerate(items):
        if i in plain:
            outer_items.append(exp.alias_(exp.column(names[i], quoted=True), output_name(item), quoted=True))
        else:
            lifted.append(lift((item.this if isinstance(item, exp.Alias) else item).copy()))
            outer_items.append(exp.alias_(lifted[-1], output_name(item), quoted=True))
    outputs = {output_name(item) for item in items}
    outer_order = []
    for o in ordered:
        node = o.this
        by_name = isinstance(node, exp.Column) and not node.table and node.name in outputs
        by_position = isinstance(node, exp.Literal) and node.is_int
        copied = o.copy()
        if not (by_name or by_position):  # an output's name or position reads the outer query's own
            lifted.append(lift(node.copy()))
            copied.set("this", lifted[-1])
        outer_order.append(copied)
    inner_items += aggregates.values()
    if not inner_items:
        # Only windows that read no key or aggregate (`SELECT COUNT(*) OVER () … GROUP BY k`, the
        # number of groups): the aggregate still answers one row per group, its keys as columns.
        for key in keys:
            lift(key.copy())
    # A name left is no key or aggregate (an output alias is none, as in PostgreSQL's select list).
    readable = {*columns.values(), *(a.alias for a in aggregates.values())}
    if any(c.table or c.name not in readable for e in lifted for c in e.find_all(exp.Column)):
        return None  # a raw column outside an aggregate: PostgreSQL's grouping error stands
    inner = tree.copy()
    inner.set("expressions", inner_items)
    for clause in ("order", "limit", "offset"):
        inner.set(clause, None)
    if group is not None:
        inner.set("group", exp.Group(expressions=keys))
    lifted = exp.Table(this=exp.to_identifier(LIFTED, quoted=True))
    outer = exp.select(*outer_items).from_(lifted)
    if outer_order:
        outer.set("order", exp.Order(expressions=outer_order))
    if any(isinstance(node, _ELSEWHERE) and node is not lifted for node in outer.walk()):
        return None  # a subquery beside the windows reads something else: not post-processing alone
    for clause in ("limit", "offset"):
        if tree.args.get(clause) is not None:
            outer.set(clause, tree.args[clause].copy())
    return ReleasedSplit(inner, outer, LIFTED, lifted=True)
