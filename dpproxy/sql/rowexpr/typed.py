"""A checked row-level expression (`Typed`): its emitted SQL, PostgreSQL type, range and representation,
and the small builders every rule family uses (typed nodes, column references, numerals, clipping).
Nothing here reads data or knows the policy."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from decimal import Decimal

from sqlglot import exp

from dpproxy.sql import numbers
from dpproxy.sql.intervals import Interval
from dpproxy.sql.nodes import without_positions
from dpproxy.sql.types import SQLGLOT_SCHEMA_TYPE, PgType

# Fractional arithmetic must stay well inside what every backend's decimal and float types hold.
FRACTIONAL_LIMIT = Decimal("1e27")


# The smallest non-zero magnitude an exact decimal can have (DECIMAL holds at most 38 fractional
# digits), for the underflow analysis of doubles computed from decimals.
SMALLEST_DECIMAL = Decimal("1e-38")


@dataclass(frozen=True)
class Typed:
    """A validated row-level expression.

    Numbers are computed in one of three representations (dpproxy.sql.numbers): integers (bigint),
    exact decimals, or doubles (`double`: float columns and quotients). For doubles, `smallest` is
    the smallest non-zero magnitude the value can have, which keeps products from underflowing.
    """

    sql: exp.Expression
    type: PgType
    interval: Interval | None = None  # numbers only; None when unbounded
    uses_unit: bool = False
    constant: bool = False  # no column reference: its value depends on the query text only
    double: bool = False  # the backend computes it in double precision
    smallest: Decimal = Decimal(1)  # doubles: no non-zero value is smaller in magnitude
    # An exact decimal computed as DECIMAL(38, 10) (arithmetic, a bare NUMERIC cast): compared or
    # merged with other numbers in that type. Columns and constants keep their own, narrower type.
    wide: bool = False
    # An integer value without a declared range: the range it is known to lie in (its columns'
    # types' ranges through the arithmetic), for overflow checks only, never a bound to clip by.
    reach: Interval | None = None
    # Text: its length is at most `growth` times the longest text one column value or one constant
    # of the statement holds (concat adds, replace by a longer text multiplies). Bounded so that no
    # row's text outgrows what the backend can hold (dpproxy.sql.rowexpr.text, docs/privacy.md §7).
    growth: int = 1

    @property
    def exact_integer(self) -> bool:
        return self.type.is_integer and not self.double


@functools.cache
def _data_type(pg_type: PgType) -> exp.DataType:
    """sqlglot's type for a PostgreSQL type, parsed once (callers attach copies)."""
    return without_positions(exp.DataType.build(SQLGLOT_SCHEMA_TYPE[pg_type]))


def typed_node(node: exp.Expression, pg_type: PgType) -> exp.Expression:
    """Attach the type sqlglot's generators need (e.g. integer division on DuckDB)."""
    if pg_type in SQLGLOT_SCHEMA_TYPE:
        node.type = _data_type(pg_type).copy()
    return node


def column_ref(alias: str, name: str, pg_type: PgType) -> exp.Column:
    return typed_node(exp.column(name, table=alias, quoted=True), pg_type)  # type: ignore[return-value]


def number_literal(value: Decimal | int) -> exp.Expression:
    text = str(value) if isinstance(value, int) else format(value, "f")
    if text.startswith("-"):
        return exp.Neg(this=exp.Literal.number(text[1:]))
    return exp.Literal.number(text)


def clip_sql(
    value: exp.Expression, interval: Interval, pg_type: PgType, *, double: bool = False
) -> exp.Expression:
    """CASE WHEN v IS NULL THEN NULL WHEN v < lo THEN lo WHEN v > hi THEN hi ELSE v END.

    Spelled out because GREATEST/LEAST skip NULLs on both PostgreSQL and DuckDB, which would turn a
    missing value into a bound. NaN compares greater than every number on both, so it clips to hi.
    A double is compared with double bounds (a decimal bound would be compared in float4 by DuckDB
    and in double by PostgreSQL), and read as 0 below 1e-100 in magnitude (dpproxy.sql.numbers).
    """
    if double:
        lo, hi = numbers.double_constant(interval.lo), numbers.double_constant(interval.hi)
    else:
        lo, hi = number_literal(interval.lo), number_literal(interval.hi)
    # Built from new nodes (sqlglot's Case.when would copy the whole CASE at each call); `value` is
    # only copied, never placed in the tree.
    ifs = [
        exp.If(this=exp.Is(this=value.copy(), expression=exp.Null()), true=exp.Null()),
        exp.If(this=exp.LT(this=value.copy(), expression=lo.copy()), true=lo),
        exp.If(this=exp.GT(this=value.copy(), expression=hi.copy()), true=hi),
    ]
    if double:
        tiny = exp.LT(this=exp.Abs(this=value.copy()), expression=numbers.double_from_text(numbers.SNAP))
        ifs.append(exp.If(this=tiny, true=numbers.double_from_text("0")))
    case = exp.Case(ifs=ifs, default=value.copy())
    return typed_node(exp.Paren(this=case), pg_type)


def literal_interval(value: Decimal) -> Interval:
    return Interval.point(value)
