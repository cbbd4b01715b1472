"""Queries BI tools send that are not plain aggregates: zero-row probes, and SELECT DISTINCT keys.

**Zero-row probes.** Tools learn a table's columns by asking for none of its rows:

    SELECT * FROM "public"."patients" WHERE (1 = 0)               -- Tableau, jupysql
    SELECT TRUE AS "_" FROM "public"."patients" WHERE 1 <> 1 LIMIT 0  -- Metabase
    SELECT * FROM (SELECT … FROM patients …) AS virtual_table LIMIT 0 -- a wrapped query

A statement whose result is empty by its text alone — `LIMIT 0`, or a WHERE (or HAVING) that is
never true whatever the rows — reveals nothing about the data: it is answered with its columns
(names and PostgreSQL types) and no rows, without a backend call and without a charge
(`EmptyQuery`). "Never true" is decided soundly from the text (`never_true`): constants folded in
SQL's three-valued logic (`1 = 0`, `1 <> 1`, `false`, `NULL`, `x AND false`, `NOT true`); anything
that names a column, calls a function or compares text is "could be true" (`col <> col` is NULL or
false in SQL, but a rule that looked inside expressions would have to be right about every type's
equality, so it is not attempted). An aggregate without GROUP BY returns one row even over no rows,
so a false WHERE alone does not make it empty (its HAVING or LIMIT 0 can). The tables and columns
are still checked as for any query (42P01 / 42501 / 42703), and `SELECT *` of a protected table
lists the columns the policy exposes, in policy order, as the shadow catalog does.

**Existence probes.** Tools ask whether a table can be read, or has a row, with one row of constants:

    SELECT 1 FROM "public"."patients" LIMIT 1                     -- Great Expectations, connection tests
    SELECT 1 AS "a" FROM "visits" WHERE "visits"."cost" > 10 LIMIT 1  -- Django's .exists()

A SELECT of constants only (numbers, strings, booleans, NULL, their casts and signs), without
aggregates, GROUP BY or DISTINCT, over exposed tables, with `LIMIT 1` (and no OFFSET but 0), that is
not a zero-row probe, is answered with **one row of its constants, always** (`existence_probe`):
the answer a table with a matching row would give, whatever the table holds, so it is a function of
the text alone, like a zero-row probe's, free and without a backend call. It says nothing about the
data: `.exists()` is always true (a WHERE that is never true by its text gives no row, as above), so
a question about whether rows match is asked with COUNT(*). One row rather than none because the
tools that send it treat no row as "empty table" or a failed check, and a table exposed by a policy
is there to be queried. The tables, columns and the WHERE are checked as for any query.

**SELECT DISTINCT keys** (Superset's filter dropdowns: `SELECT DISTINCT diagnosis AS column_values
FROM public.patients LIMIT 10000`) means `GROUP BY` the select list with no aggregate; it is
rewritten to that (`distinct_as_group_by`), so its keys are released like any GROUP BY's: public
values all, others through partition selection, and charged the same.

Text only: nothing here runs SQL or sees data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from sqlglot import exp

from dpproxy.errors import DPProxyError, NotSupported, UndefinedColumn
from dpproxy.policy import Policy
from dpproxy.sql import postprocess
from dpproxy.sql.inline import inline
from dpproxy.sql.query import AnalyzedQuery, ConstantQuery, OutputColumn, PublicQuery
from dpproxy.sql.relation import Relation, SchemaFacts, build_relation
from dpproxy.sql.rowexpr import constant_value, row_expression
from dpproxy.sql.select_list import limit_of, output_name
from dpproxy.sql.types import PgType

__all__ = [
    "EmptyQuery",
    "aggregate_view",
    "distinct_as_group_by",
    "empty_query",
    "existence_probe",
    "never_true",
]


@dataclass(frozen=True)
class EmptyQuery:
    """A statement whose answer is no rows by its text alone: its columns, no data, no cost."""

    outputs: tuple[OutputColumn, ...]
    text: str
    reason: str  # why it is empty, for `explain`


# Analyzes a SELECT as the engine would (dpproxy.sql.analyze.analyze), without running anything and
# without looking for probes again.
Analyzer = Callable[[exp.Select], "AnalyzedQuery | EmptyQuery"]

# SQL truth values: True, False and None (NULL). `never_true` tracks the set a condition can take.
_ANY = frozenset({True, False, None})


def never_true(node: exp.Expression) -> bool:
    """Whether a WHERE / HAVING condition is false or NULL for every row of every database."""
    return True not in _values(node)


def _values(node: exp.Expression) -> frozenset[bool | None]:
    """The truth values a condition can take, over-approximated (`_ANY` when not a constant)."""
    if isinstance(node, exp.Paren):
        return _values(node.this)
    if isinstance(node, exp.Boolean):
        return frozenset({bool(node.this)})
    if isinstance(node, exp.Null):
        return frozenset({None})
    if isinstance(node, exp.Not):
        return frozenset(None if v is None else not v for v in _values(node.this))
    if isinstance(node, (exp.And, exp.Or)):
        combine = _and if isinstance(node, exp.And) else _or
        left, right = _values(node.this), _values(node.expression)
        return frozenset(combine(a, b) for a in left for b in right)
    if isinstance(node, (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE)):
        return _comparison(node)
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        value = _number_or_null(node.this)
        if value is _UNKNOWN:
            return _ANY
        return frozenset({(value is None) != bool(node.args.get("negate"))})  # IS [NOT] NULL
    return _ANY


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


_UNKNOWN = object()


def _number_or_null(node: exp.Expression) -> object:
    """A numeric or boolean constant's value (None for NULL), or _UNKNOWN: text is never compared
    here (its equality depends on the collation)."""
    if isinstance(node, exp.Paren):
        return _number_or_null(node.this)
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, (exp.Literal, exp.Null, exp.Neg)) and not (
        isinstance(node, exp.Literal) and node.is_string
    ):
        try:
            value = constant_value(node)
        except DPProxyError:
            return _UNKNOWN
        return value if value is None or isinstance(value, Decimal) else _UNKNOWN
    return _UNKNOWN


def _comparison(node: exp.Expression) -> frozenset[bool | None]:
    left, right = _number_or_null(node.this), _number_or_null(node.expression)
    if left is _UNKNOWN or right is _UNKNOWN:
        return _ANY
    if left is None or right is None:
        return frozenset({None})
    if type(left) is not type(right):  # 1 = true is a type error in PostgreSQL: no opinion here
        return _ANY
    a, b = left, right
    result = {
        exp.EQ: a == b,
        exp.NEQ: a != b,
        exp.LT: a < b,  # type: ignore[operator]
        exp.LTE: a <= b,  # type: ignore[operator]
        exp.GT: a > b,  # type: ignore[operator]
        exp.GTE: a >= b,  # type: ignore[operator]
    }[type(node)]
    return frozenset({bool(result)})


def _aggregates(select: exp.Select) -> bool:
    """GROUP BY, or an aggregate in the select list or HAVING of this SELECT (not of subqueries)."""
    if select.args.get("group") is not None or select.args.get("having") is not None:
        return True
    for item in select.expressions:
        for node in item.walk():
            if isinstance(node, exp.AggFunc) and not _in_subquery(node, item):
                return True
    return False


def _in_subquery(node: exp.Expression, top: exp.Expression) -> bool:
    if node is top:
        return False
    parent = node.parent
    while parent is not None and parent is not top:
        if isinstance(parent, (exp.Select, exp.Subquery)):
            return True
        parent = parent.parent
    return False


def empty_reason(select: exp.Select) -> str | None:
    """Why this SELECT's answer has no rows whatever the data, or None when it may have some."""
    if select.args.get("limit") is not None and limit_of(select, "limit") == 0:
        return "LIMIT 0"
    having = select.args.get("having")
    if having is not None and never_true(having.this):
        return "its HAVING condition is never true"
    where = select.args.get("where")
    grouped = select.args.get("group") is not None or not _aggregates(select)
    if where is not None and grouped and never_true(where.this):
        return "its WHERE condition is never true"
    return None


def empty_query(
    select: exp.Select, policy: Policy, facts: SchemaFacts, analyze: Analyzer
) -> EmptyQuery | None:
    """The empty answer of a SELECT over exposed tables whose result has no rows by its text alone
    (see the module docstring), or None. Tables and columns are checked as for any query."""
    reason = empty_reason(select)
    if reason is None:
        return None
    return EmptyQuery(_outputs(select, policy, facts, analyze), select.sql("postgres"), reason)


def _constant_item(node: exp.Expression) -> bool:
    """A select-list item whose value is written in the text: a constant, its sign, casts, parentheses."""
    if isinstance(node, exp.Alias):
        return _constant_item(node.this)
    if isinstance(node, (exp.Paren, exp.Neg)):
        return _constant_item(node.this)
    if isinstance(node, exp.Cast):
        return _constant_item(node.this)
    return isinstance(node, (exp.Literal, exp.Boolean, exp.Null))


def existence_probe(
    select: exp.Select, policy: Policy, facts: SchemaFacts, analyze: Analyzer
) -> exp.Select | None:
    """The SELECT without FROM, WHERE and LIMIT that answers an existence probe (the module
    docstring: one row of its constants), after checking its tables, columns and WHERE as for any
    query; None when the statement is not one. Call it after `empty_query`."""
    if select.args.get("limit") is None or limit_of(select, "limit") != 1:
        return None
    if select.args.get("offset") is not None and limit_of(select, "offset") != 0:
        return None
    if select.args.get("distinct") is not None or _aggregates(select) or select.args.get("with_"):
        return None
    if not select.expressions or not all(_constant_item(item) for item in select.expressions):
        return None
    _outputs(select, policy, facts, analyze)  # tables, columns and the WHERE, checked
    return exp.Select(expressions=[item.copy() for item in select.expressions])


def _outputs(
    select: exp.Select, policy: Policy, facts: SchemaFacts, analyze: Analyzer
) -> tuple[OutputColumn, ...]:
    """The result columns of a SELECT, without running it or deciding whether it may run."""
    if _aggregates(select):
        # An aggregate query is checked in full, as if it were to run (its columns are its outputs).
        return _outputs_of(analyze(select))
    from_ = select.args.get("from_") or select.args.get("from")
    assert from_ is not None
    if isinstance(from_.this, exp.Subquery) and not select.args.get("joins"):
        body = from_.this.this
        if not isinstance(body, exp.Select):
            raise NotSupported("set operations are not supported in FROM", hint="select from one query")
        return _project(select, from_.this.alias, _outputs(body, policy, facts, analyze))
    relation = build_relation(inline(select), policy, facts)
    where = select.args.get("where")
    if where is not None:
        row_expression(where.this, relation.scope("WHERE"))
    outputs: list[OutputColumn] = []
    scope = relation.scope("SELECT")
    for item in select.expressions:
        node = item.this if isinstance(item, exp.Alias) else item
        if isinstance(node, exp.Star):
            outputs += [_column(c.name, c.type) for s in relation.sources for c in s.columns]
            continue
        if isinstance(node, exp.Column) and isinstance(node.this, exp.Star):
            qualifier = node.table.lower()
            source = next((s for s in relation.sources if qualifier in s.names), None)
            if source is None:
                raise UndefinedColumn(f'missing FROM-clause entry for table "{node.table}"')
            outputs += [_column(c.name, c.type) for c in source.columns]
            continue
        outputs.append(_column(output_name(item), row_expression(node, scope).type))
    return tuple(outputs)


def _outputs_of(query: AnalyzedQuery | EmptyQuery) -> tuple[OutputColumn, ...]:
    if isinstance(query, (PublicQuery, EmptyQuery)):
        return query.outputs
    if isinstance(query, ConstantQuery):
        return query.post_processing.outputs
    return query.post_processing.outputs


def _column(name: str, pg_type: PgType) -> OutputColumn:
    return OutputColumn(name, exp.Null(), PgType.TEXT if pg_type is PgType.UNKNOWN else pg_type)


def _project(select: exp.Select, alias: str, inner: tuple[OutputColumn, ...]) -> tuple[OutputColumn, ...]:
    """The columns of `SELECT … FROM (<inner>) AS alias`: its stars, columns and constants."""
    names = {o.name: o for o in inner}
    folded = {o.name.lower(): o for o in inner}
    outputs: list[OutputColumn] = []
    for item in select.expressions:
        node = item.this if isinstance(item, exp.Alias) else item
        if isinstance(node, exp.Star) or (isinstance(node, exp.Column) and isinstance(node.this, exp.Star)):
            outputs += inner
            continue
        if isinstance(node, exp.Column):
            if node.table and node.table.lower() != (alias or "").lower():
                raise UndefinedColumn(f'missing FROM-clause entry for table "{node.table}"')
            found = names.get(node.name) if node.this.quoted else folded.get(node.name.lower())
            if found is None:
                raise UndefinedColumn(
                    f'column "{node.name}" does not exist in subquery {alias}',
                    hint="columns: " + ", ".join(o.name for o in inner),
                )
            outputs.append(_column(output_name(item), found.type))
            continue
        if not node.find(exp.Column, exp.Star):
            outputs.append(_column(output_name(item), postprocess.infer_type(node, {})))
            continue
        raise NotSupported(
            f"{node.sql('postgres')}: a query over subquery {alias} may select its columns only",
            hint=f"select the columns of {alias}, or compute inside the subquery",
        )
    return tuple(outputs)


def distinct_as_group_by(select: exp.Select) -> exp.Select:
    """`SELECT DISTINCT a, b … ` as `SELECT a, b … GROUP BY 1, 2` (same rows in PostgreSQL), when it
    has no aggregate and no GROUP BY of its own; otherwise the SELECT unchanged."""
    distinct = select.args.get("distinct")
    if distinct is None or _aggregates(select):
        return select
    if distinct.args.get("on") is not None:
        raise NotSupported("SELECT DISTINCT ON is not supported", hint="use GROUP BY with aggregates instead")
    for item in select.expressions:
        node = item.this if isinstance(item, exp.Alias) else item
        if isinstance(node, exp.Star) or (isinstance(node, exp.Column) and isinstance(node.this, exp.Star)):
            raw = select.copy()  # raw rows, distinct or not: refused as such by the analyzer
            raw.set("distinct", None)
            return raw
    grouped = select.copy()
    grouped.set("distinct", None)
    positions = [exp.Literal.number(i) for i in range(1, len(select.expressions) + 1)]
    grouped.set("group", exp.Group(expressions=positions))
    return grouped


def aggregate_view(relation: Relation) -> str:
    """A hint for a refused raw-rows query (DBeaver's data tab: `SELECT * … LIMIT 200`): the
    aggregate views of the same table that dpproxy answers. From the policy only."""
    source = next((s for s in relation.sources if not s.public), relation.sources[0])
    columns = [c for c in source.columns if not c.is_unit]
    column = next((c for c in columns if c.public_values is not None), columns[0] if columns else None)
    hint = f"ask for aggregates, e.g. SELECT COUNT(*) FROM {source.label}"
    if column is not None:
        hint += (
            f", or one row per value of a column: SELECT {column.name}, COUNT(*) FROM {source.label} "
            f"GROUP BY {column.name}"
        )
    return hint
