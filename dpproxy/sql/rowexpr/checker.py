"""The row-expression checker: one handler per allowed sqlglot node, the leaves (columns, constants),
and `row_expression`, the entry point. The rule families live beside it (arithmetic, predicates,
text, dates); each handler returns a `Typed` or raises with a SQLSTATE."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from sqlglot import exp

from dpproxy.errors import DPProxyError, GroupingError, NotSupported, PolicyViolation, UndefinedFunction
from dpproxy.sql import numbers
from dpproxy.sql.names import function_name
from dpproxy.sql.rowexpr.arithmetic import ArithmeticRules
from dpproxy.sql.rowexpr.constants import literal_number
from dpproxy.sql.rowexpr.dates import DateRules, clamp_temporal
from dpproxy.sql.rowexpr.predicates import PredicateRules
from dpproxy.sql.rowexpr.text import TextRules
from dpproxy.sql.rowexpr.typed import (
    Typed,
    clip_sql,
    column_ref,
    literal_interval,
    number_literal,
    typed_node,
)
from dpproxy.sql.scope import RowScope, Source, SourceColumn
from dpproxy.sql.types import PgType

ALLOWED_FUNCTIONS = (
    "abs, ceil, coalesce, concat, date_part, date_trunc, extract, floor, greatest, least, left, length, "
    "lower, ltrim, mod, nullif, replace, right, round, rtrim, sign, strpos, substring, trim, upper"
)


class RowExpressionChecker(ArithmeticRules, PredicateRules, TextRules, DateRules):
    """Validates and rewrites one row-level expression tree (see the package docstring)."""

    def __init__(self, scope: RowScope) -> None:
        self.scope = scope
        self._handlers: dict[type[exp.Expression], Callable[[exp.Expression], Typed]] = {
            exp.Column: self._column,
            exp.Literal: self._literal,
            exp.Boolean: lambda n: Typed(n.copy(), PgType.BOOL, constant=True),
            exp.Null: lambda n: Typed(n.copy(), PgType.UNKNOWN, constant=True),
            exp.Paren: self._paren,
            exp.Neg: self._neg,
            exp.Add: self._arithmetic,
            exp.Sub: self._arithmetic,
            exp.Mul: self._arithmetic,
            exp.Div: self._arithmetic,
            exp.Mod: self._arithmetic,
            exp.EQ: self._comparison,
            exp.NEQ: self._comparison,
            exp.GT: self._comparison,
            exp.GTE: self._comparison,
            exp.LT: self._comparison,
            exp.LTE: self._comparison,
            exp.NullSafeEQ: self._comparison,
            exp.NullSafeNEQ: self._comparison,
            exp.And: self._logical,
            exp.Or: self._logical,
            exp.Not: self._not,
            exp.Is: self._is,
            exp.In: self._in,
            exp.Between: self._between,
            exp.Like: self._like,
            exp.ILike: self._like,
            exp.Escape: self._escape,
            exp.Case: self._case,
            exp.Coalesce: self._variadic_same_type,
            exp.Greatest: self._variadic_same_type,
            exp.Least: self._variadic_same_type,
            exp.Nullif: self._nullif,
            exp.Abs: self._abs,
            exp.Round: self._round,
            exp.Floor: self._floor_ceil,
            exp.Ceil: self._floor_ceil,
            exp.Sign: self._sign,
            exp.Cast: self._cast,
            exp.Lower: self._text_to_text,
            exp.Upper: self._text_to_text,
            exp.Initcap: self._text_to_text,
            exp.Length: self._length,
            exp.Substring: self._substring,
            exp.Trim: self._trim,
            exp.Left: self._left_right,
            exp.Right: self._left_right,
            exp.Concat: self._concat,
            exp.DPipe: self._concat,
            exp.Replace: self._replace,
            exp.StrPosition: self._strpos,
            exp.TimestampTrunc: self._date_trunc,
            exp.DateTrunc: self._date_trunc,
            exp.Extract: self._extract,
        }

    def check(self, node: exp.Expression) -> Typed:
        handler = self._handlers.get(type(node))
        if handler is not None:
            return handler(node)
        raise self._unsupported(node)

    def argument(
        self, node: exp.Expression | None, what: str, needs: str, accepts: Callable[[PgType], bool]
    ) -> Typed:
        """`node` checked as the argument `what` of a function that takes `needs` (text, a date or
        timestamp): 42883 naming the argument, its type and the clause when it is of another type."""
        assert node is not None
        typed = self.check(node)
        if not accepts(typed.type):
            written = node.sql("postgres")
            raise UndefinedFunction(
                f"{what} needs {needs}, but {written} is {typed.type.value} ({self.scope.clause})",
                hint=f"CAST the value to {needs.removeprefix('a ')} first",
            )
        return typed

    def _unsupported(self, node: exp.Expression) -> DPProxyError:
        where = self.scope.clause
        if isinstance(node, exp.AggFunc):
            return GroupingError(
                f"aggregate functions are not allowed in {where}",
                hint="aggregates belong in the SELECT list or HAVING",
            )
        if isinstance(node, exp.Window):
            return NotSupported(f"window functions are not supported ({where})")
        if isinstance(node, (exp.Subquery, exp.Select, exp.Exists)):
            return NotSupported(
                f"subqueries are not supported in private queries ({where})",
                hint="filter with WHERE conditions on the table's own columns",
            )
        if isinstance(node, (exp.RegexpLike, exp.RegexpILike, exp.SimilarTo)):
            return NotSupported(
                f"regular expressions are not supported in private queries ({where})",
                hint="use LIKE or ILIKE with a constant pattern",
            )
        if isinstance(node, exp.Interval):
            return NotSupported(
                f"interval arithmetic is not supported in private queries ({where})",
                hint="compare dates with constants, or use date_trunc/extract",
            )
        if isinstance(node, exp.Star):
            return PolicyViolation(
                "SELECT * would return raw rows of a protected table",
                hint="ask for aggregates, e.g. SELECT COUNT(*) FROM …",
            )
        if isinstance(node, exp.Func):
            name = function_name(node)
            return NotSupported(
                f"function {name}() is not supported in private queries ({where})",
                hint=f"allowed functions: {ALLOWED_FUNCTIONS}",
            )
        return NotSupported(f"{node.sql('postgres')!r} is not supported in private queries ({where})")

    def _column(self, node: exp.Expression) -> Typed:
        assert isinstance(node, exp.Column)
        source, column = self.resolve(node)
        ref = column_ref(source.alias, column.name, column.type)
        if column.type.is_float:
            # real is widened to double (exactly): every float is computed in double precision.
            value = typed_node(numbers.cast(ref, "DOUBLE PRECISION"), PgType.FLOAT8)
            if column.clip and column.interval is not None:
                value = clip_sql(value, column.interval, PgType.FLOAT8, double=True)
            return Typed(
                value,
                column.type,
                column.interval,
                column.is_unit,
                double=True,
                smallest=numbers.SMALLEST_FLOAT,
            )
        if column.clip and column.interval is not None:
            return Typed(
                clip_sql(ref, column.interval, column.type), column.type, column.interval, column.is_unit
            )
        if column.type.is_temporal:
            return Typed(
                clamp_temporal(ref, column.type, column.temporal_range), column.type, None, column.is_unit
            )
        return Typed(ref, column.type, column.interval, column.is_unit)

    def resolve(self, node: exp.Column) -> tuple[Source, SourceColumn]:
        return self.scope.resolve(node)

    def _literal(self, node: exp.Expression) -> Typed:
        assert isinstance(node, exp.Literal)
        if node.is_string:
            return Typed(node.copy(), PgType.UNKNOWN, constant=True)
        value, pg_type = literal_number(node)
        # Written from the value (never as sent: DuckDB reads 1e3 as a double, PostgreSQL as numeric).
        return Typed(
            typed_node(number_literal(value), pg_type), pg_type, literal_interval(value), constant=True
        )

    def _paren(self, node: exp.Expression) -> Typed:
        inner = self.check(node.this)
        if inner.type is PgType.UNKNOWN and isinstance(inner.sql, exp.Literal):
            # ('12') is the untyped constant '12', as in PostgreSQL (and a public scalar subquery's
            # text answer, inlined so): what meets a number or a date is parsed when planned, never
            # sent for the backend to guess (DuckDB's abs('12') was a binder error, charged).
            return inner
        return dataclasses.replace(inner, sql=typed_node(exp.Paren(this=inner.sql), inner.type))


def row_expression(node: exp.Expression, scope: RowScope) -> Typed:
    return RowExpressionChecker(scope).check(node)


def row_condition(node: exp.Expression, scope: RowScope) -> Typed:
    """A WHERE, ON or HAVING condition per row: boolean (42804 otherwise, naming scope.clause), an
    untyped string constant read as a boolean when planned (Predicates._boolean)."""
    return RowExpressionChecker(scope).condition(node)
