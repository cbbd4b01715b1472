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
        return exp.Paren(this=literals.constant(value, pg_type))
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
