"""Shapes of a sqlglot tree that the analyser's modules all read alike: an expression without the
parentheses around it, and the terms of a chain of AND (a WHERE or an ON condition)."""

from __future__ import annotations

from sqlglot import exp


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
