"""Subqueries in expressions — IN (SELECT …), EXISTS (SELECT …), (SELECT …) — answered first, inlined.

A private query may filter or compute with a subquery over public tables:

    SELECT COUNT(*) FROM patients WHERE zip IN (SELECT zip FROM zip_info WHERE state = 'CA')
    becomes, once the subquery has been run on its own,
    SELECT COUNT(*) FROM patients WHERE zip IN ('94103', '94110')

Each subquery is checked as a query of its own: public tables and allowed functions only, and
*uncorrelated* — every column it names belongs to its own tables. SQL would bind any other name to
the row of the enclosing query, protected rows included; run as written inside the private query,
a subquery like `… WHERE 1 / (income - 12345) > 0` would fail or not depending on one person's
income. Run alone, it reads public data only, whatever it computes, and what reaches the private
query is constants: no SQL an analyst wrote is ever evaluated next to a protected row.

An EXISTS correlated by one equality with a column of the enclosing query — what Ibis writes for a
semi-join, `EXISTS (SELECT 1 FROM airlines a WHERE a.carrier = f.carrier AND a.name LIKE 'U%')` — is
first written as the uncorrelated `COALESCE(f.carrier IN (SELECT a.carrier FROM airlines a WHERE
a.name LIKE 'U%'), FALSE)`, which means the same for every row: a NULL carrier matches no row of
either (FALSE), and a NULL among the subquery's values, which makes IN NULL where EXISTS is FALSE,
is read as FALSE by the COALESCE (NOT EXISTS stays its negation). Only a plain SELECT (no GROUP BY,
HAVING, DISTINCT, LIMIT, set operation or aggregate) over the tables and named subqueries of its own FROM is
taken (Ibis filters the public table in a subquery of its own), with one top-level
conjunct `inner = outer.column`, the outer column qualified by a name none of its own tables has (SQL
binds a qualifier to the innermost table of that name). The subquery so written is then checked like
any other: a reference to the outer row left anywhere in it is refused as before.

Results are inlined as typed constants: an IN list of at most MAX_INLINED_VALUES distinct values
(more: SQLSTATE 54000, filter the subquery or join the public table instead), an empty IN list as
FALSE, a scalar subquery's one value (none: NULL; several: 21000, as PostgreSQL), EXISTS as TRUE or
FALSE. `ANY`/`ALL` comparisons with subqueries are refused. Whether such a refusal happens depends on
public data only. Without a backend (Describe, `explain` without --backend), subqueries are checked
the same way and replaced by placeholder constants of their type, which give the types but no answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp

from dpproxy.errors import NotSupported, SubqueryCardinality, SubqueryTooLarge, UnresolvedColumn
from dpproxy.policy import Policy
from dpproxy.sql import literals
from dpproxy.sql.nodes import conjuncts
from dpproxy.sql.query import PublicQuery
from dpproxy.sql.types import PgType

# The most distinct values an IN (SELECT …) over public tables may bring into a private query.
MAX_INLINED_VALUES = 10_000

# Runs a checked public query on the backend and returns its rows.
PublicRunner = Callable[[PublicQuery], Sequence[Sequence[object]]]
# Analyzes a SELECT over public tables only (dpproxy.sql.analyze.analyze_public).
PublicAnalyzer = Callable[[exp.Select], PublicQuery]


@dataclass(frozen=True)
class Inlined:
    """The statement with its expression subqueries replaced, and how many there were."""

    tree: exp.Expression
    subqueries: int
    placeholders: bool  # answered with placeholder constants (no backend): types only


def _kind(node: exp.Expression) -> str | None:
    """'in', 'exists' or 'scalar' for an expression subquery; None for anything else."""
    if isinstance(node, exp.In) and node.args.get("query") is not None:
        return "in"
    if isinstance(node, exp.Exists):
        return "exists"
    if isinstance(node, (exp.Any, exp.All)) and isinstance(node.this, (exp.Subquery, exp.Select)):
        raise NotSupported(
            f"{node.key.upper()} (SELECT …) is not supported",
            hint="write x IN (SELECT …) for = ANY, or compare with MIN/MAX of the subquery",
        )
    if isinstance(node, exp.Subquery) and not isinstance(node.parent, (exp.From, exp.Join, exp.Lateral)):
        return "scalar"
    return None


def expression_subqueries(tree: exp.Expression) -> list[tuple[exp.Expression, str]]:
    """Outermost expression subqueries of a statement, FROM-subqueries' bodies included (a subquery
    nested in another is part of that one's public query)."""
    found: list[tuple[exp.Expression, str]] = []

    def visit(node: exp.Expression) -> None:
        for child in node.iter_expressions():
            kind = _kind(child)
            if kind is not None:
                found.append((child, kind))
            else:
                visit(child)

    visit(tree)
    return found


_PLAIN_SELECT = frozenset({"expressions", "from_", "joins", "where"})


def _decorrelated(node: exp.Exists) -> exp.Expression | None:
    """The uncorrelated form of an EXISTS correlated by one equality (see the module docstring); None
    for any other EXISTS, which is then checked as written."""
    body = node.this
    if not isinstance(body, exp.Select) or {k for k, v in body.args.items() if v} - _PLAIN_SELECT:
        return None
    if any(e.find(exp.AggFunc, exp.Window) for e in body.expressions):
        return None  # an aggregate makes one row whatever matches: EXISTS is then always true
    where, from_ = body.args.get("where"), body.args.get("from_")
    if where is None or from_ is None:
        return None
    sources = [from_.this, *(j.this for j in body.args.get("joins") or [])]
    if not all(
        isinstance(source, exp.Table) or (isinstance(source, exp.Subquery) and source.alias)
        for source in sources
    ):
        return None  # a source without a name of its own (a table function): left as written
    own = {source.alias_or_name.lower() for source in sources}

    def outer(column: exp.Expression) -> bool:
        return isinstance(column, exp.Column) and bool(column.table) and column.table.lower() not in own

    terms = conjuncts(where.this)
    correlated = [
        (term, side, other)
        for term in terms
        if isinstance(term, exp.EQ)
        for side, other in ((term.this, term.expression), (term.expression, term.this))
        if outer(side) and not any(outer(c) for c in other.find_all(exp.Column))
    ]
    if len(correlated) != 1:
        return None
    term, column, inner = correlated[0]
    rest = [t.copy() for t in terms if t is not term]
    if any(outer(c) for t in rest for c in t.find_all(exp.Column)) or any(
        outer(c) for e in body.expressions for c in e.find_all(exp.Column)
    ):
        return None  # correlated elsewhere too: refused as written
    select = body.copy()
    select.set("expressions", [inner.copy()])
    select.set("where", exp.Where(this=exp.and_(*rest, copy=False)) if rest else None)
    found = exp.In(this=column.copy(), query=exp.Subquery(this=select))
    return exp.Coalesce(this=found, expressions=[exp.false()])


def _body(node: exp.Expression, kind: str) -> exp.Expression:
    if kind == "in":
        query = node.args["query"]
        return query.this if isinstance(query, exp.Subquery) else query
    return node.this


def _checked(body: exp.Expression, kind: str, analyze_public: PublicAnalyzer, policy: Policy) -> PublicQuery:
    text = body.sql("postgres")
    if not isinstance(body, exp.Select):
        raise NotSupported(
            f"subquery ({text}) must be a single SELECT",
            hint="set operations are not supported in subqueries",
        )
    try:
        query = analyze_public(body)
    except UnresolvedColumn:
        raise NotSupported(
            f"subquery ({text}) names a column that is not a column of its own tables: correlated "
            "subqueries are not supported",
            hint="a subquery may read public tables and their columns only; join the public table instead",
        ) from None
    if kind in ("in", "scalar") and len(query.outputs) != 1:
        raise NotSupported(f"subquery ({text}) must return exactly one column")
    return query


def _value_order(item: tuple[str, object]) -> tuple[bool, str, object]:
    type_name, value = item
    return (value is None, type_name, value if value is not None else 0)


def _answer(
    node: exp.Expression, kind: str, query: PublicQuery, rows: Sequence[Sequence[object]]
) -> exp.Expression:
    text = _body(node, kind).sql("postgres")
    if kind == "exists":
        return exp.Boolean(this=bool(rows))
    pg_type = query.outputs[0].type
    if kind == "scalar":
        if len(rows) > 1:
            raise SubqueryCardinality(
                f"more than one row returned by a subquery used as an expression: ({text})",
                hint="make it return one row, e.g. with an aggregate or LIMIT 1",
            )
        value = rows[0][0] if rows else None
        if value is None:
            # A NULL of the subquery's type: whether the statement is accepted must not depend on
            # whether the subquery found a row (SUM(NULL) alone would be untyped, 42883).
            if pg_type is PgType.UNKNOWN:
                return exp.Null()
            return exp.Cast(this=exp.Null(), to=exp.DataType.build(pg_type.value, dialect="postgres"))
        answer = exp.Paren(this=literals.constant(value, pg_type))
        # Its value is public data, not the statement's text: no refusal may follow from it (a zero
        # divisor is guarded like any other, sql/rowexpr/arithmetic.py).
        answer.meta[literals.PUBLIC_ANSWER] = True
        return answer
    # Distinct values in a fixed order: the statement's text (which the replay key and the matching
    # of GROUP BY to select-list expressions read) must not depend on the order rows came back in.
    values = sorted({(type(row[0]).__name__, row[0]) for row in rows}, key=_value_order)
    values = [value for _, value in values]
    if len(values) > MAX_INLINED_VALUES:
        raise SubqueryTooLarge(
            f"subquery ({text}) returned more than {MAX_INLINED_VALUES} distinct values to inline",
            hint="filter the subquery further, or join the public table instead of IN (SELECT …)",
        )
    return exp.In(this=node.this, expressions=[literals.constant(v, pg_type) for v in values])


def inline_public_subqueries(
    tree: exp.Expression,
    policy: Policy,
    analyze_public: PublicAnalyzer,
    run: PublicRunner | None,
) -> Inlined:
    """Replace every expression subquery of `tree` by its answer (see the module docstring).

    Every subquery is checked before any runs, so a refusal never follows a backend call that a
    statement's text alone would have refused. `run=None` gives placeholder constants instead.
    """
    tree = tree.copy()
    found = expression_subqueries(tree)
    semi_joins = [(node, _decorrelated(node)) for node, _ in found if isinstance(node, exp.Exists)]
    for node, plain in semi_joins:
        if plain is not None:
            node.replace(plain)  # never the statement itself: a subquery is one of its parts
    if any(plain is not None for _, plain in semi_joins):
        found = expression_subqueries(tree)
    if not found:
        return Inlined(tree, 0, False)
    checked = [
        (node, kind, _checked(_body(node, kind), kind, analyze_public, policy)) for node, kind in found
    ]
    replacements: dict[int, exp.Expression] = {}
    answers: dict[str, Sequence[Sequence[object]]] = {}  # a subquery written twice runs once
    for node, kind, query in checked:
        if run is None:
            rows: Sequence[Sequence[object]] = (
                [(literals.placeholder_value(query.outputs[0].type),)] if query.outputs else [()]
            )
        else:
            text = query.sql.sql("postgres")
            if text not in answers:
                answers[text] = run(query)
            rows = answers[text]
        replacements[id(node)] = _answer(node, kind, query, rows)

    def substitute(node: exp.Expression) -> exp.Expression:
        return replacements.get(id(node), node)

    return Inlined(tree.transform(substitute, copy=False), len(found), run is None)
