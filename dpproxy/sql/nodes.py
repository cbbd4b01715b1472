"""Shapes of a sqlglot tree that the analyser's modules all read alike: an expression without the
parentheses around it, and the terms of a chain of AND (a WHERE or an ON condition); and a parsed
tree without the positions sqlglot's parser records."""

from __future__ import annotations

from typing import TypeVar

import sqlglot
from sqlglot import exp

E = TypeVar("E", bound=exp.Expression)


def strip_parens(node: exp.Expression) -> exp.Expression:
    """`node` without the parentheses around it: `((x))` is `x`."""
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def conjuncts(node: exp.Expression) -> list[exp.Expression]:
    """The terms of a chain of AND, through parentheses and nested ANDs: `(a AND (b)) AND c` is
    [a, b, c]; any other condition is its only term."""
    node = strip_parens(node)
    if isinstance(node, exp.And):
        return conjuncts(node.this) + conjuncts(node.expression)
    return [node]


def parse_postgres(sql: str) -> exp.Expression:
    """One statement in PostgreSQL's dialect, parsed by sqlglot alone (no dpproxy normalisation:
    dpproxy.sql.statement.parse_statement is the analyst's entry) and without positions, as every
    tree dpproxy builds by parsing text it wrote itself or read from a plan. Raises sqlglot's
    ParseError."""
    return without_positions(sqlglot.parse_one(sql, read="postgres"))


def without_positions(tree: E) -> E:
    """`tree`, its nodes' source positions (sqlglot's `meta`: line, column, start and end of each
    token-backed node) cleared in place. Nothing in dpproxy reads them once a statement has parsed,
    and every copy of a node copies its positions again: they were a tenth of the engine's planning
    time (bench/cpu.py), as most of the analysis copies parts of trees."""
    for node in tree.walk():
        node._meta = None
    return tree
