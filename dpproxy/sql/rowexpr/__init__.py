"""Row-level expressions: the allow-list, PostgreSQL typing, value ranges, clipping and totality.

Everything a private query computes per row (WHERE, GROUP BY keys, aggregate arguments) passes
through `row_expression`, which either rejects it or returns a rewritten copy that:
  - references only columns the policy exposes, through the table's alias;
  - clips every bounded number column to its policy bounds before using it;
  - cannot raise for any stored value: divisors are guarded with NULLIF, integer arithmetic runs in
    bigint and is rejected when its range could leave bigint, casts that parse text are refused,
    LIKE patterns are literal;
  - carries its PostgreSQL result type and, for numbers, the interval of values it can take.
It never sees data: every decision depends on the query text and the policy only.

The checker is split by kind of rule: `typed` (the result of a check), `constants`, `arithmetic`,
`predicates`, `text`, `dates`, and `checker` (the handler table and the leaves).
"""

from dpproxy.sql.rowexpr.checker import ALLOWED_FUNCTIONS, RowExpressionChecker, row_condition, row_expression
from dpproxy.sql.rowexpr.constants import constant_value
from dpproxy.sql.rowexpr.predicates import bytewise_text
from dpproxy.sql.rowexpr.typed import (
    FRACTIONAL_LIMIT,
    Typed,
    clip_sql,
    column_ref,
    number_literal,
    typed_node,
)

__all__ = [
    "ALLOWED_FUNCTIONS",
    "FRACTIONAL_LIMIT",
    "RowExpressionChecker",
    "Typed",
    "bytewise_text",
    "clip_sql",
    "column_ref",
    "constant_value",
    "number_literal",
    "row_condition",
    "row_expression",
    "typed_node",
]
