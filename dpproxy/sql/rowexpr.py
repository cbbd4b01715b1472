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
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from sqlglot import exp

from dpproxy.errors import (
    DatatypeMismatch,
    DPProxyError,
    GroupingError,
    InvalidParameter,
    InvalidText,
    NotSupported,
    PolicyViolation,
    UndefinedFunction,
)
from dpproxy.sql import numbers
from dpproxy.sql.intervals import Interval, hull
from dpproxy.sql.scope import RowScope, Source, SourceColumn
from dpproxy.sql.types import (
    INTEGER_RANGE,
    SQLGLOT_SCHEMA_TYPE,
    PgType,
    arithmetic_result,
    boolean_from_text,
    from_sqlglot,
)

# Fractional arithmetic must stay well inside what every backend's decimal and float types hold.
FRACTIONAL_LIMIT = Decimal("1e27")
# The smallest non-zero magnitude an exact decimal can have (DECIMAL holds at most 38 fractional
# digits), for the underflow analysis of doubles computed from decimals.
SMALLEST_DECIMAL = Decimal("1e-38")

DATE_TRUNC_UNITS = ("year", "quarter", "month", "week", "day", "hour", "minute", "second")
EXTRACT_FIELDS = (
    "year",
    "quarter",
    "month",
    "week",
    "day",
    "dow",
    "isodow",
    "doy",
    "hour",
    "minute",
    "isoyear",
)

ALLOWED_FUNCTIONS = (
    "abs, ceil, coalesce, concat, date_part, date_trunc, extract, floor, greatest, initcap, least, left, "
    "length, lower, ltrim, nullif, replace, right, round, rtrim, sign, strpos, substring, trim, upper"
)


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

    @property
    def exact_integer(self) -> bool:
        return self.type.is_integer and not self.double


def typed_node(node: exp.Expression, pg_type: PgType) -> exp.Expression:
    """Attach the type sqlglot's generators need (e.g. integer division on DuckDB)."""
    if pg_type in SQLGLOT_SCHEMA_TYPE:
        node.type = exp.DataType.build(SQLGLOT_SCHEMA_TYPE[pg_type])
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
    case = (
        exp.Case()
        .when(exp.Is(this=value.copy(), expression=exp.Null()), exp.Null())
        .when(exp.LT(this=value.copy(), expression=lo.copy()), lo)
        .when(exp.GT(this=value.copy(), expression=hi.copy()), hi)
    )
    if double:
        tiny = exp.LT(this=exp.Abs(this=value.copy()), expression=numbers.double_from_text(numbers.SNAP))
        case = case.when(tiny, numbers.double_from_text("0"))
    case = case.else_(value.copy())
    return typed_node(exp.Paren(this=case), pg_type)


def literal_interval(value: Decimal) -> Interval:
    return Interval.point(value)


# Numeric constants: at most this many fractional and integral digits, so that every engine reads
# them as an exact decimal of the same value (DuckDB's DECIMAL holds 38 digits in all).
MAX_CONSTANT_FRACTION_DIGITS = 18
MAX_CONSTANT_INTEGER_DIGITS = 20


def _check_constant_digits(value: Decimal, text: str) -> None:
    """A numeric constant both engines read as the same exact decimal: finite (NaN and Infinity
    would be a double on one engine and an error on the other), at most 20 integral and 18
    fractional digits."""
    if not value.is_finite():
        raise NotSupported(
            f"the constant {text!r} is not a finite number: NaN and infinite constants are not supported",
            hint="compare with a finite number",
        )
    if value != 0:
        fraction = max(0, -value.normalize().as_tuple().exponent)
        integral = value.adjusted() + 1
        if fraction > MAX_CONSTANT_FRACTION_DIGITS or integral > MAX_CONSTANT_INTEGER_DIGITS:
            raise NotSupported(
                f"the numeric constant {text} has more digits than supported (at most "
                f"{MAX_CONSTANT_INTEGER_DIGITS} before and {MAX_CONSTANT_FRACTION_DIGITS} after the point)",
                hint="round the constant",
            )


def _literal_number(node: exp.Literal) -> tuple[Decimal, PgType]:
    text = node.this
    try:
        value = Decimal(text)
    except InvalidOperation as e:  # pragma: no cover - sqlglot only makes numeric literals of numbers
        raise InvalidText(f"invalid number {text!r}") from e
    _check_constant_digits(value, text)
    if value == value.to_integral_value() and "." not in text and "e" not in text.lower():
        if INTEGER_RANGE[PgType.INT4][0] <= value <= INTEGER_RANGE[PgType.INT4][1]:
            return value, PgType.INT4
        if INTEGER_RANGE[PgType.INT8][0] <= value <= INTEGER_RANGE[PgType.INT8][1]:
            return value, PgType.INT8
    return value, PgType.NUMERIC


def constant_value(node: exp.Expression) -> object:
    """The Python value of a constant literal node (numbers, strings, booleans, NULL, negation)."""
    if isinstance(node, exp.Paren):
        return constant_value(node.this)
    if isinstance(node, exp.Literal):
        return node.this if node.is_string else _literal_number(node)[0]
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Neg):
        inner = constant_value(node.this)
        if isinstance(inner, Decimal):
            return -inner
    if isinstance(node, exp.Cast) and from_sqlglot(node.args["to"]).is_number:
        # LIMIT $1::integer, as SQLAlchemy writes it: a number cast to a number is that number.
        inner = constant_value(node.this)
        try:
            number = Decimal(inner.strip()) if isinstance(inner, str) else inner
        except InvalidOperation:
            number = None
        if isinstance(number, Decimal):
            return number
    raise NotSupported(f"expected a constant, found {node.sql('postgres')}")


# Text positions and lengths (substring, left, right): within what both engines take alike.
MAX_TEXT_POSITION = 1_000_000


def _int_argument(node: exp.Expression | None, what: str, limit: int = MAX_TEXT_POSITION) -> int:
    if node is None:
        raise NotSupported(f"{what} is missing")
    value = constant_value(node)
    if not isinstance(value, Decimal) or value != value.to_integral_value():
        raise NotSupported(f"{what} must be an integer constant, found {node.sql('postgres')}")
    if abs(value) > limit:
        raise InvalidParameter(
            f"{what} must be between {-limit} and {limit}, found {node.sql('postgres')}",
            hint="the engines treat larger values differently (or fail on them)",
        )
    return int(value)


def _string_argument(node: exp.Expression | None, what: str) -> str:
    if isinstance(node, exp.Literal) and node.is_string:
        return node.this
    if isinstance(node, exp.Var):
        return node.name
    found = node.sql("postgres") if node is not None else "nothing"
    raise NotSupported(f"{what} must be a string constant, found {found}")


def _check_castable_text(text: str, target: PgType) -> None:
    """A string literal compared or cast to `target` must parse: such an error depends on the query
    text only, but reporting it here names the fault instead of failing in the backend."""
    try:
        if target.is_number:
            _check_constant_digits(Decimal(text.strip()), text)
        elif target is PgType.DATE:
            dt.date.fromisoformat(text.strip())
        elif target in (PgType.TIMESTAMP, PgType.TIMESTAMPTZ):
            dt.datetime.fromisoformat(text.strip())
        elif target is PgType.BOOL and boolean_from_text(text) is None:
            raise ValueError(text)
    except (ValueError, InvalidOperation) as e:
        raise InvalidText(
            f"invalid input syntax for type {target.value}: {text!r}",
            hint="write the constant in the column's type, e.g. 42, 12.50, DATE '2024-01-31'",
        ) from e


def _family(t: PgType) -> str:
    if t.is_number:
        return "number"
    if t.is_text:
        return "text"
    if t.is_temporal:
        return "temporal"
    return t.value


class RowExpressionChecker:
    """Validates and rewrites one row-level expression tree (see module docstring)."""

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

    # -- entry -------------------------------------------------------------------------------------

    def check(self, node: exp.Expression) -> Typed:
        handler = self._handlers.get(type(node))
        if handler is not None:
            return handler(node)
        raise self._unsupported(node)

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
            name = node.sql_name().lower() if not isinstance(node, exp.Anonymous) else node.name.lower()
            return NotSupported(
                f"function {name}() is not supported in private queries ({where})",
                hint=f"allowed functions: {ALLOWED_FUNCTIONS}",
            )
        return NotSupported(f"{node.sql('postgres')!r} is not supported in private queries ({where})")

    # -- leaves ------------------------------------------------------------------------------------

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
            return Typed(_clamp_temporal(ref, column.type), column.type, None, column.is_unit)
        return Typed(ref, column.type, column.interval, column.is_unit)

    def resolve(self, node: exp.Column) -> tuple[Source, SourceColumn]:
        return self.scope.resolve(node)

    def _literal(self, node: exp.Expression) -> Typed:
        assert isinstance(node, exp.Literal)
        if node.is_string:
            return Typed(node.copy(), PgType.UNKNOWN, constant=True)
        value, pg_type = _literal_number(node)
        # Written from the value (never as sent: DuckDB reads 1e3 as a double, PostgreSQL as numeric).
        return Typed(
            typed_node(number_literal(value), pg_type), pg_type, literal_interval(value), constant=True
        )

    def _paren(self, node: exp.Expression) -> Typed:
        inner = self.check(node.this)
        return dataclasses.replace(inner, sql=typed_node(exp.Paren(this=inner.sql), inner.type))

    # -- arithmetic --------------------------------------------------------------------------------

    def _number(self, node: exp.Expression) -> Typed:
        typed = self.check(node)
        if typed.type is PgType.UNKNOWN and isinstance(typed.sql, exp.Literal):
            _check_castable_text(typed.sql.this, PgType.NUMERIC)
            value = Decimal(typed.sql.this.strip())
            return Typed(number_literal(value), PgType.NUMERIC, Interval.point(value), constant=True)
        if typed.type.is_temporal:
            raise NotSupported(
                f"date and interval arithmetic is not supported in private queries ({self.scope.clause})",
                hint="compare dates with constants, or use date_trunc/extract",
            )
        if not typed.type.is_number:
            raise DatatypeMismatch(
                f"{node.sql('postgres')} is {typed.type.value}, not a number ({self.scope.clause})"
            )
        return typed

    def _require_range(self, node: exp.Expression, typed: Typed) -> None:
        """No arithmetic may overflow for any value the policy allows."""
        interval = typed.interval
        if interval is None:
            names = sorted({c.name for c in node.find_all(exp.Column)})
            raise NotSupported(
                f"cannot bound {node.sql('postgres')} ({self.scope.clause}): "
                f"arithmetic on {', '.join(names) or 'this expression'} could overflow or divide by "
                "values near zero",
                hint="declare lower and upper bounds for the column in the policy, or compare it "
                "without arithmetic",
            )
        if typed.type.is_integer:
            lo, hi = INTEGER_RANGE[PgType.INT8]
            if not interval.within(lo, hi):
                raise NotSupported(
                    f"{node.sql('postgres')} could overflow bigint ({self.scope.clause})",
                    hint="use smaller constants, or declare tighter bounds for the columns in the policy",
                )
        elif not interval.within(-FRACTIONAL_LIMIT, FRACTIONAL_LIMIT):
            raise NotSupported(
                f"{node.sql('postgres')} could overflow ({self.scope.clause})",
                hint="use smaller constants, or declare tighter bounds for the columns in the policy",
            )

    @staticmethod
    def _as_bigint(typed: Typed) -> exp.Expression:
        """Integer operands are computed in bigint, whatever their type, constants included: DuckDB
        would otherwise compute CAST(32767 AS smallint) + 1 in smallint and fail only on the rows
        that reach it (a failure that would depend on data)."""
        if typed.type.is_integer and not typed.double and not isinstance(typed.sql, exp.Null):
            return typed_node(exp.Cast(this=typed.sql, to=exp.DataType.build("BIGINT")), PgType.INT8)
        return typed.sql

    # -- representations (dpproxy.sql.numbers) ----------------------------------------------------

    @staticmethod
    def _smallest(typed: Typed) -> Decimal:
        """The smallest non-zero magnitude of a number once it is a double."""
        if typed.double:
            return typed.smallest
        if typed.type.is_integer:
            return Decimal(1)
        if typed.constant and typed.interval is not None and typed.interval.lo == typed.interval.hi:
            return abs(typed.interval.lo) or Decimal(1)
        return SMALLEST_DECIMAL

    @staticmethod
    def _double(typed: Typed) -> exp.Expression:
        """The value as a double, converted alike on every engine."""
        if typed.double:
            return typed.sql
        interval = typed.interval
        if typed.constant and interval is not None and interval.lo == interval.hi:
            return numbers.double_constant(interval.lo)
        return numbers.as_double(typed.sql, exact_integer=typed.type.is_integer)

    def _exact_or_double(self, parts: list[Typed]) -> tuple[list[exp.Expression], bool]:
        """Number operands in one representation both engines compare alike: bigints as they are,
        exact numbers as DECIMAL(38, 10), or doubles when one is a double or an unbounded decimal
        (which DECIMAL(38, 10) might not hold)."""
        numbers_ = [p for p in parts if not isinstance(p.sql, exp.Null)]
        if any(p.double for p in numbers_) or any(
            not p.type.is_integer and p.interval is None and not p.constant for p in numbers_
        ):
            return [p.sql if isinstance(p.sql, exp.Null) else self._double(p) for p in parts], True
        if not any(p.wide for p in numbers_):
            # Bigints, bounded decimal columns and constants: every engine compares them exactly in
            # a type wide enough for all (at most 20 integral and 18 fractional digits).
            return [p.sql for p in parts], False
        return [p.sql if isinstance(p.sql, exp.Null) else numbers.as_decimal(p.sql) for p in parts], False

    def _require_no_underflow(self, node: exp.Expression, smallest: Decimal) -> None:
        if not numbers.safe_from_underflow(smallest):
            raise NotSupported(
                f"{node.sql('postgres')} could underflow in double precision ({self.scope.clause})",
                hint="multiply or divide fewer small values, or round them first",
            )

    def _neg(self, node: exp.Expression) -> Typed:
        inner = self._number(node.this)
        interval = -inner.interval if inner.interval is not None else None
        result = dataclasses.replace(
            inner,
            sql=typed_node(exp.Neg(this=self._as_bigint(inner)), inner.type),
            interval=interval,
        )
        if inner.interval is not None or not inner.constant:
            self._require_range(node, result)
        return result

    def _arithmetic(self, node: exp.Expression) -> Typed:
        left, right = self._number(node.left), self._number(node.right)
        result_type = arithmetic_result(left.type, right.type)
        a, b = left.interval, right.interval
        divides = isinstance(node, (exp.Div, exp.Mod))
        if divides and right.constant and b is not None and b.lo == b.hi == 0:
            raise InvalidParameter(f"division by zero in {node.sql('postgres')} ({self.scope.clause})")
        double = left.double or right.double or (isinstance(node, exp.Div) and not result_type.is_integer)
        interval: Interval | None = None
        if a is not None and b is not None:
            if isinstance(node, exp.Add):
                interval = a + b
            elif isinstance(node, exp.Sub):
                interval = a - b
            elif isinstance(node, exp.Mul):
                interval = a * b
            elif isinstance(node, exp.Div):
                interval = a.divide(b, integer_divisor=right.type.is_integer, truncate=result_type.is_integer)
            else:
                interval = a.modulo(b)
        uses_unit, constant = left.uses_unit or right.uses_unit, left.constant and right.constant
        if double:
            typed = self._double_arithmetic(node, left, right, result_type, interval)
        elif result_type.is_integer:
            typed = self._integer_arithmetic(node, left, right, result_type, interval)
        else:
            typed = self._decimal_arithmetic(node, left, right, interval)
        typed = dataclasses.replace(typed, uses_unit=uses_unit, constant=constant)
        self._require_range(node, typed)
        return typed

    def _integer_arithmetic(
        self, node: exp.Expression, left: Typed, right: Typed, result_type: PgType, interval: Interval | None
    ) -> Typed:
        """Exact, in bigint; a zero divisor gives NULL (NULLIF), as a missing value would."""
        lsql, rsql = self._as_bigint(left), self._as_bigint(right)
        if isinstance(node, (exp.Div, exp.Mod)) and not _nonzero_constant(right):
            rsql = exp.Nullif(this=rsql, expression=exp.Literal.number(0))
            rsql = typed_node(exp.Cast(this=rsql, to=exp.DataType.build("BIGINT")), PgType.INT8)
        if isinstance(node, exp.Div):
            # typed: PostgreSQL's integer division; safe: DuckDB then divides integers exactly (//).
            sql: exp.Expression = exp.Div(this=lsql, expression=rsql, typed=True, safe=True)
        else:
            sql = type(node)(this=lsql, expression=rsql)
        return Typed(typed_node(sql, result_type), result_type, interval)

    def _decimal_arithmetic(
        self, node: exp.Expression, left: Typed, right: Typed, interval: Interval | None
    ) -> Typed:
        """Exact, in DECIMAL(38, 10): +, −, × and % (a product of two decimals is rounded back to
        scale 10, and must stay below 10^17 before that)."""
        if isinstance(node, exp.Mul) and not (left.type.is_integer or right.type.is_integer):
            if interval is not None and not interval.within(
                -numbers.DECIMAL_PRODUCT_LIMIT, numbers.DECIMAL_PRODUCT_LIMIT
            ):
                raise NotSupported(
                    f"{node.sql('postgres')} could overflow ({self.scope.clause})",
                    hint="a product of two decimals must stay below 10^17: declare tighter bounds",
                )
            product = exp.Mul(this=numbers.as_decimal(left.sql), expression=numbers.as_decimal(right.sql))
            return Typed(
                typed_node(numbers.as_decimal(product), PgType.NUMERIC), PgType.NUMERIC, interval, wide=True
            )

        def operand(typed: Typed) -> exp.Expression:
            if isinstance(node, exp.Mod):
                # DuckDB computes % of decimals of different scales in double precision.
                return numbers.as_decimal(typed.sql)
            # An integer operand as DECIMAL(38, 0): a product with it keeps scale 10.
            return (
                numbers.cast(typed.sql, "DECIMAL(38, 0)")
                if typed.type.is_integer
                else numbers.as_decimal(typed.sql)
            )

        lsql, rsql = operand(left), operand(right)
        if isinstance(node, exp.Mod) and not _nonzero_constant(right):
            rsql = exp.Nullif(this=rsql, expression=exp.Literal.number(0))
        sql = type(node)(this=lsql, expression=rsql)
        return Typed(typed_node(sql, PgType.NUMERIC), PgType.NUMERIC, interval, wide=True)

    def _double_arithmetic(
        self, node: exp.Expression, left: Typed, right: Typed, result_type: PgType, interval: Interval | None
    ) -> Typed:
        """In double precision on both engines; a quotient of non-integers is one even when its
        operands are exact (neither engine divides them exactly alike)."""
        if isinstance(node, exp.Mod):
            raise UndefinedFunction(
                f"operator does not exist: double precision % ({node.sql('postgres')}, {self.scope.clause})",
                hint="% works on exact numbers: CAST the operands to integer or numeric",
            )
        lsql, rsql = self._double(left), self._double(right)
        small_left, small_right = self._smallest(left), self._smallest(right)
        if isinstance(node, (exp.Add, exp.Sub)):
            smallest = numbers.smallest_sum(small_left, small_right)
            sql: exp.Expression = type(node)(this=lsql, expression=rsql)
        elif isinstance(node, exp.Mul):
            smallest = small_left * small_right
            self._require_no_underflow(node, smallest)
            sql = exp.Mul(this=lsql, expression=rsql)
        else:
            divisor = right.interval
            if divisor is None or not divisor.finite:
                smallest = Decimal(0)
            else:
                smallest = small_left / max(divisor.magnitude, Decimal(1))
            self._require_no_underflow(node, smallest)
            if not _nonzero_constant(right):
                rsql = exp.Nullif(this=rsql, expression=numbers.double_from_text("0"))
            sql = exp.Div(this=lsql, expression=rsql)
        pg_type = result_type if result_type.is_float or result_type is PgType.NUMERIC else PgType.NUMERIC
        return Typed(typed_node(sql, PgType.FLOAT8), pg_type, interval, double=True, smallest=smallest)

    def _abs(self, node: exp.Expression) -> Typed:
        inner = self._number(node.this)
        interval = inner.interval.abs() if inner.interval is not None else None
        typed = dataclasses.replace(
            inner, sql=typed_node(exp.Abs(this=self._as_bigint(inner)), inner.type), interval=interval
        )
        self._require_range(node, typed)
        return typed

    def _sign(self, node: exp.Expression) -> Typed:
        inner = self._number(node.this)
        pg_type = inner.type if not inner.type.is_integer else PgType.INT4
        return Typed(
            typed_node(exp.Sign(this=inner.sql), pg_type),
            pg_type,
            Interval(Decimal(-1), Decimal(1)),
            inner.uses_unit,
            inner.constant,
            double=inner.double,
        )

    def _round(self, node: exp.Expression) -> Typed:
        inner = self._number(node.this)
        decimals = node.args.get("decimals")
        digits = _int_argument(decimals, "the digits of round()") if decimals is not None else 0
        if not 0 <= digits <= 9:
            raise NotSupported("round() digits must be between 0 and 9")
        interval = inner.interval.widen_to_digits(digits) if inner.interval is not None else None
        if inner.double:
            if decimals is not None:
                raise UndefinedFunction(
                    f"function round(double precision, integer) does not exist ({self.scope.clause})",
                    hint="round(x) rounds a double to an integer; round(x, n) takes an exact number",
                )
            # round(float8) keeps float8 and rounds halves to even, as PostgreSQL's rint().
            return dataclasses.replace(
                inner, sql=numbers.round_half_even(inner.sql), interval=interval, smallest=Decimal(1)
            )
        args: dict[str, exp.Expression] = {"this": inner.sql}
        if decimals is not None:
            args["decimals"] = exp.Literal.number(digits)
        # round(int) and round(numeric) are numeric in PostgreSQL, halves away from zero on both.
        return Typed(
            typed_node(exp.Round(**args), PgType.NUMERIC),
            PgType.NUMERIC,
            interval,
            inner.uses_unit,
            inner.constant,
            wide=inner.wide,
        )

    def _floor_ceil(self, node: exp.Expression) -> Typed:
        inner = self._number(node.this)
        pg_type = inner.type if inner.type.is_float else PgType.NUMERIC
        interval = inner.interval.widen_to_integers() if inner.interval is not None else None
        return Typed(
            typed_node(type(node)(this=inner.sql), pg_type),
            pg_type,
            interval,
            inner.uses_unit,
            inner.constant,
            double=inner.double,
            smallest=Decimal(1),
            wide=inner.wide,
        )

    # -- predicates --------------------------------------------------------------------------------

    def _comparable(self, left: Typed, right: Typed, node: exp.Expression) -> None:
        for one, other in ((left, right), (right, left)):
            if (
                one.type is PgType.UNKNOWN
                and isinstance(one.sql, exp.Literal)
                and other.type is not PgType.UNKNOWN
            ):
                _check_castable_text(one.sql.this, other.type)
                return
        if PgType.UNKNOWN in (left.type, right.type):
            return
        if _family(left.type) != _family(right.type):
            raise UndefinedFunction(
                f"cannot compare {left.type.value} with {right.type.value}: {node.sql('postgres')} "
                f"({self.scope.clause})",
                hint="compare values of the same kind, or CAST one side",
            )

    def _typed_constants(self, parts: list[Typed]) -> list[Typed]:
        """Untyped string constants next to typed values, as constants of that type written from
        their value ('2024-01-31' beside a date becomes DATE '2024-01-31'), so no engine guesses."""
        known = [p.type for p in parts if p.type is not PgType.UNKNOWN and not isinstance(p.sql, exp.Null)]
        if not known:
            return parts
        target = known[0]
        return [_typed_constant(p, target) if p.type is PgType.UNKNOWN else p for p in parts]

    def _operands(self, parts: list[Typed], *, ordered: bool) -> list[exp.Expression]:
        """The SQL of values compared or merged together, in one representation: numbers as
        _exact_or_double makes them, text under the "C" collation when it is ordered (PostgreSQL
        orders text by the database's collation, DuckDB by code point)."""
        if any(p.type.is_number for p in parts):
            sqls, _ = self._exact_or_double(parts)
            return sqls
        values = [p for p in parts if not isinstance(p.sql, exp.Null)]
        if ordered and values and all(p.type.is_text for p in values):
            return [p.sql if isinstance(p.sql, exp.Null) else bytewise_text(p.sql) for p in parts]
        return [p.sql for p in parts]

    def _comparison(self, node: exp.Expression) -> Typed:
        left, right = self.check(node.left), self.check(node.right)
        self._comparable(left, right, node)
        left, right = self._typed_constants([left, right])
        ordered = isinstance(node, (exp.GT, exp.GTE, exp.LT, exp.LTE))
        lsql, rsql = self._operands([left, right], ordered=ordered)
        return Typed(
            type(node)(this=_operand(lsql), expression=_operand(rsql)),
            PgType.BOOL,
            None,
            left.uses_unit or right.uses_unit,
            left.constant and right.constant,
        )

    def _boolean(self, node: exp.Expression) -> Typed:
        typed = self.check(node)
        if typed.type not in (PgType.BOOL, PgType.UNKNOWN):
            raise DatatypeMismatch(
                f"argument of {self.scope.clause} must be boolean, not {typed.type.value}: "
                f"{node.sql('postgres')}"
            )
        return typed

    def _logical(self, node: exp.Expression) -> Typed:
        left, right = self._boolean(node.left), self._boolean(node.right)
        return Typed(
            type(node)(this=left.sql, expression=right.sql),
            PgType.BOOL,
            None,
            left.uses_unit or right.uses_unit,
            left.constant and right.constant,
        )

    def _not(self, node: exp.Expression) -> Typed:
        inner = self._boolean(node.this)
        return Typed(exp.Not(this=inner.sql), PgType.BOOL, None, inner.uses_unit, inner.constant)

    def _is(self, node: exp.Expression) -> Typed:
        inner = self.check(node.this)
        target = node.expression
        if not isinstance(target, (exp.Null, exp.Boolean)):
            raise NotSupported(f"IS {target.sql('postgres')} is not supported; use IS [NOT] NULL/TRUE/FALSE")
        return Typed(
            exp.Is(this=inner.sql, expression=target.copy()),
            PgType.BOOL,
            None,
            inner.uses_unit,
            inner.constant,
        )

    def _in(self, node: exp.Expression) -> Typed:
        if node.args.get("unnest") is not None or node.args.get("query") is not None:
            # IN (SELECT …) over public tables arrives here answered, as a list of constants.
            raise self._unsupported(exp.Subquery())
        inner = self.check(node.this)
        if not node.expressions:
            # An inlined subquery that returned no rows: x IN (empty) is false, even for NULL x.
            return Typed(exp.false(), PgType.BOOL, None, inner.uses_unit, inner.constant)
        items = [self.check(e) for e in node.expressions]
        for item in items:
            self._comparable(inner, item, node)
        parts = self._typed_constants([inner, *items])
        sqls = self._operands(parts, ordered=False)
        return Typed(
            exp.In(this=sqls[0], expressions=sqls[1:]),
            PgType.BOOL,
            None,
            inner.uses_unit or any(i.uses_unit for i in items),
            inner.constant and all(i.constant for i in items),
        )

    def _between(self, node: exp.Expression) -> Typed:
        if node.args.get("symmetric"):
            raise NotSupported(
                f"BETWEEN SYMMETRIC is not supported ({self.scope.clause})", hint="write the bounds in order"
            )
        inner, low, high = self.check(node.this), self.check(node.args["low"]), self.check(node.args["high"])
        self._comparable(inner, low, node)
        self._comparable(inner, high, node)
        parts = self._typed_constants([inner, low, high])
        sqls = self._operands(parts, ordered=True)
        sql = exp.Between(this=sqls[0], low=sqls[1], high=sqls[2])
        return Typed(sql, PgType.BOOL, None, inner.uses_unit or low.uses_unit or high.uses_unit)

    def _like(self, node: exp.Expression, escape: exp.Expression | None = None) -> Typed:
        inner = self.check(node.this)
        if not (inner.type.is_text):
            raise UndefinedFunction(
                f"LIKE needs text, but {node.this.sql('postgres')} is {inner.type.value} "
                f"({self.scope.clause})",
                hint="CAST the value to text first",
            )
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise NotSupported(
                f"the pattern of {type(node).__name__.upper()} must be a string constant "
                f"({self.scope.clause})"
            )
        escape_char = "\\"
        if escape is not None:
            escape_char = _string_argument(escape, "the ESCAPE of LIKE")
            if len(escape_char) != 1:
                raise InvalidText("the ESCAPE of LIKE must be one character")
        text = pattern.this
        trailing = len(text) - len(text.rstrip(escape_char))
        if trailing % 2 == 1:
            raise InvalidText(
                f"LIKE pattern {text!r} must not end with the escape character",
                hint="escape it twice to match it literally",
            )
        value = inner.sql
        if isinstance(node, exp.ILike):
            # Case-insensitive as ASCII letters only, alike on every engine (PostgreSQL folds other
            # letters by its collation's locale, DuckDB by Unicode).
            value, text = _ascii_lower(value), text.translate(_ASCII_LOWER)
        # The escape character is always written: PostgreSQL's default is a backslash, DuckDB has none.
        sql = exp.Escape(
            this=exp.Like(this=value, expression=exp.Literal.string(text)),
            expression=exp.Literal.string(escape_char),
        )
        return Typed(sql, PgType.BOOL, None, inner.uses_unit)

    def _escape(self, node: exp.Expression) -> Typed:
        like = node.this
        if not isinstance(like, (exp.Like, exp.ILike)):
            raise self._unsupported(node)
        return self._like(like, node.expression)

    # -- conditional -------------------------------------------------------------------------------

    def _merge_types(self, parts: list[Typed], node: exp.Expression) -> PgType:
        known = [p.type for p in parts if p.type is not PgType.UNKNOWN]
        if not known:
            return PgType.TEXT
        families = {_family(t) for t in known}
        if len(families) > 1:
            raise DatatypeMismatch(
                f"{node.sql('postgres')} mixes {' and '.join(sorted(families))} values ({self.scope.clause})"
            )
        result = known[0]
        for t in known[1:]:
            if result.is_number:
                result = arithmetic_result(result, t)
            elif result != t:
                result = PgType.TEXT if result.is_text else PgType.TIMESTAMP
        for p in parts:
            if p.type is PgType.UNKNOWN and isinstance(p.sql, exp.Literal):
                _check_castable_text(p.sql.this, result)
        return result

    def _merged(
        self, parts: list[Typed], node: exp.Expression, *, ordered: bool = False
    ) -> tuple[list[exp.Expression], PgType, bool, Decimal, bool]:
        """Values of CASE branches and of COALESCE/GREATEST/LEAST/NULLIF arguments in one
        representation: their SQL, their PostgreSQL type, whether doubles, smallest magnitude, and
        whether DECIMAL(38, 10) (`Typed.wide`)."""
        pg_type = self._merge_types(parts, node)
        parts = self._typed_constants(parts)
        if pg_type.is_number:
            sqls, double = self._exact_or_double(parts)
            smallest = min(self._smallest(p) for p in parts) if double else Decimal(1)
            return sqls, pg_type, double, smallest, not double and any(p.wide for p in parts)
        return self._operands(parts, ordered=ordered), pg_type, False, Decimal(1), False

    def _case(self, node: exp.Expression) -> Typed:
        operand = node.args.get("this")
        operand_typed = self.check(operand) if operand is not None else None
        conditions: list[Typed] = []
        values: list[Typed] = []
        for branch in node.args.get("ifs") or []:
            cond = self.check(branch.this) if operand_typed is not None else self._boolean(branch.this)
            if operand_typed is not None:
                self._comparable(operand_typed, cond, node)
            conditions.append(cond)
            values.append(self.check(branch.args["true"]))
        default = node.args.get("default")
        default_typed = self.check(default) if default is not None else None
        all_values = values + ([default_typed] if default_typed is not None else [])
        sqls, pg_type, double, smallest, wide = self._merged(all_values, node)
        number_values = [v for v in all_values if not isinstance(v.sql, exp.Null)]
        interval = hull([v.interval for v in number_values]) if pg_type.is_number and number_values else None
        condition_sqls = [c.sql for c in conditions]
        operand_sql = None
        if operand_typed is not None:
            # CASE x WHEN a …: the operand is compared with each WHEN value, in one representation.
            compared = self._operands(self._typed_constants([operand_typed, *conditions]), ordered=False)
            operand_sql, condition_sqls = compared[0], compared[1:]
        case = exp.Case(this=operand_sql)
        for condition, value in zip(condition_sqls, sqls[: len(values)], strict=True):
            case = case.when(condition, value)
        if default_typed is not None:
            case = case.else_(sqls[-1])
        parts = [*conditions, *all_values] + ([operand_typed] if operand_typed else [])
        return Typed(
            typed_node(case, pg_type),
            pg_type,
            interval,
            any(p.uses_unit for p in parts),
            double=double,
            smallest=smallest,
            wide=wide,
        )

    def _variadic_same_type(self, node: exp.Expression) -> Typed:
        args = [node.this, *node.expressions]
        parts = [self.check(a) for a in args]
        extreme = isinstance(node, (exp.Greatest, exp.Least))
        sqls, pg_type, double, smallest, wide = self._merged(parts, node, ordered=extreme)
        non_null = [p for p in parts if not isinstance(p.sql, exp.Null)]
        interval = hull([p.interval for p in non_null]) if pg_type.is_number and non_null else None
        if extreme and pg_type.is_number and non_null:
            interval = _extreme_interval([p.interval for p in non_null], least=isinstance(node, exp.Least))
        # ignore_nulls: NULL arguments are skipped, as PostgreSQL and DuckDB both do (sqlglot would
        # otherwise spell a NULL-propagating CASE for DuckDB).
        kwargs = {"ignore_nulls": True} if extreme else {}
        sql = type(node)(this=sqls[0], expressions=sqls[1:], **kwargs)
        return Typed(
            typed_node(sql, pg_type),
            pg_type,
            interval,
            any(p.uses_unit for p in parts),
            all(p.constant for p in parts),
            double=double,
            smallest=smallest,
            wide=wide,
        )

    def _nullif(self, node: exp.Expression) -> Typed:
        first, second = self.check(node.this), self.check(node.expression)
        self._comparable(first, second, node)
        sqls, _, double, smallest, wide = self._merged([first, second], node)
        return Typed(
            typed_node(exp.Nullif(this=sqls[0], expression=sqls[1]), first.type),
            first.type,
            first.interval,
            first.uses_unit or second.uses_unit,
            double=double,
            smallest=smallest,
            wide=wide,
        )

    # -- casts -------------------------------------------------------------------------------------

    def _cast(self, node: exp.Expression) -> Typed:
        inner = self.check(node.this)
        to: exp.DataType = node.args["to"]
        target = from_sqlglot(to)
        if target is PgType.UNKNOWN:
            raise NotSupported(
                f"CAST to {to.sql('postgres')} is not supported ({self.scope.clause})",
                hint="cast to integer, bigint, numeric, double precision, text, boolean, date or timestamp",
            )
        if target.is_text and any(isinstance(p, exp.DataTypeParam) for p in to.expressions):
            # PostgreSQL truncates to varchar(n)/char(n) (and pads char); DuckDB ignores the length.
            raise NotSupported(
                f"CAST to {to.sql('postgres')} is not supported ({self.scope.clause})",
                hint="cast to text, and use left(x, n) to shorten it",
            )
        if target is PgType.FLOAT4:
            raise NotSupported(
                f"CAST to real is not supported ({self.scope.clause}): PostgreSQL fails on values real "
                "cannot hold",
                hint="cast to double precision",
            )
        if inner.type is PgType.UNKNOWN or (inner.type.is_text and inner.constant):
            if isinstance(inner.sql, exp.Literal):
                _check_castable_text(inner.sql.this, target)
                return _typed_constant(inner, target)
            if target.is_text:
                return Typed(exp.Cast(this=inner.sql, to=_canonical_type(to, target)), target, constant=True)
            raise NotSupported(
                f"CAST of the text expression {node.this.sql('postgres')} to {target.value} is not supported "
                f"({self.scope.clause})",
                hint="write the constant in its type directly, e.g. 42 or DATE '2024-01-31'",
            )
        if inner.type.is_text and not target.is_text:
            raise NotSupported(
                f"CAST of text column values to {target.value} is not supported ({self.scope.clause}): "
                "it fails on values that do not parse",
                hint="compare the text directly, or ask the data owner to expose a typed column",
            )
        if target.is_number and inner.type.is_number:
            return self._cast_number(node, inner, to, target)
        if target.is_number and inner.type is PgType.BOOL:
            if target is not PgType.INT4:
                raise NotSupported(
                    f"CAST of boolean to {target.value} is not supported ({self.scope.clause})",
                    hint="cast to integer",
                )
            sql = exp.Cast(this=inner.sql, to=exp.DataType.build("INT"))
            return Typed(typed_node(sql, target), target, Interval(Decimal(0), Decimal(1)), inner.uses_unit)
        if target is PgType.BOOL:
            if inner.type is PgType.BOOL:
                return inner
            if inner.type.is_integer and not inner.double:
                # int → boolean is x <> 0 on both engines (PostgreSQL has no cast from bigint).
                zero = exp.NEQ(this=inner.sql, expression=exp.Literal.number(0))
                return Typed(zero, PgType.BOOL, None, inner.uses_unit, inner.constant)
            raise NotSupported(
                f"CAST of {inner.type.value} to boolean is not supported ({self.scope.clause})"
            )
        if (target.is_temporal and not inner.type.is_temporal) or (
            target.is_number and not inner.type.is_number
        ):
            raise NotSupported(f"CAST of {inner.type.value} to {target.value} is not supported")
        if target.is_text and (inner.type.is_number and not inner.exact_integer):
            raise NotSupported(
                f"CAST of {inner.type.value} to text is not supported ({self.scope.clause}): the "
                "engines write fractional numbers differently",
                hint="round it to an integer first, e.g. CAST(ROUND(x) AS integer), then to text",
            )
        return Typed(
            typed_node(exp.Cast(this=inner.sql, to=_canonical_type(to, target)), target),
            target,
            None,
            inner.uses_unit,
            inner.constant,
        )

    def _cast_number(self, node: exp.Expression, inner: Typed, to: exp.DataType, target: PgType) -> Typed:
        interval = inner.interval
        if target.is_integer:
            interval = interval.widen_to_integers() if interval is not None else None
            lo, hi = INTEGER_RANGE[target]
            if interval is None or not interval.within(lo, hi):
                raise NotSupported(
                    f"CAST({node.this.sql('postgres')} AS {target.value}) could overflow "
                    f"({self.scope.clause})",
                    hint="declare bounds for the column in the policy, or cast to numeric",
                )
            # Doubles round halves to even, exact numbers away from zero: alike on both engines.
            sql = exp.Cast(this=inner.sql, to=_canonical_type(to, target))
            return Typed(typed_node(sql, target), target, interval, inner.uses_unit, inner.constant)
        if target.is_float:
            return dataclasses.replace(
                inner,
                sql=typed_node(self._double(inner), PgType.FLOAT8),
                type=target,
                double=True,
                smallest=self._smallest(inner),
            )
        # numeric
        if inner.double:
            raise NotSupported(
                f"CAST of double precision to numeric is not supported ({self.scope.clause}): the "
                "engines round the conversion differently",
                hint="keep the value a double, or round it to an integer first",
            )
        self._check_numeric_precision(to, interval, node)
        params = [p for p in to.expressions if isinstance(p, exp.DataTypeParam)]
        if params:
            precision = int(params[0].name)
            scale = int(params[1].name) if len(params) > 1 else 0
            sql = numbers.cast(inner.sql, f"DECIMAL({precision}, {scale})")
        else:
            # A bare NUMERIC is three decimals on DuckDB: every exact decimal is DECIMAL(38, 10).
            sql = numbers.as_decimal(inner.sql)
        return Typed(
            typed_node(sql, PgType.NUMERIC),
            PgType.NUMERIC,
            interval,
            inner.uses_unit,
            inner.constant,
            wide=not params,
        )

    @staticmethod
    def _constant_interval(sql: exp.Expression, target: PgType) -> Interval | None:
        if target.is_number and isinstance(sql, exp.Literal):
            return Interval.point(Decimal(sql.this.strip()))
        return None

    def _check_numeric_precision(
        self, to: exp.DataType, interval: Interval | None, node: exp.Expression
    ) -> None:
        params = [p for p in to.expressions if isinstance(p, exp.DataTypeParam)]
        if not params:
            return
        precision = int(params[0].name)
        scale = int(params[1].name) if len(params) > 1 else 0
        limit = Decimal(10) ** (precision - scale)
        if interval is None or not interval.within(-limit + 1, limit - 1):
            raise NotSupported(
                f"CAST({node.this.sql('postgres')} AS {to.sql('postgres')}) could overflow "
                f"({self.scope.clause})",
                hint="use a larger precision, or numeric without precision",
            )

    # -- text --------------------------------------------------------------------------------------

    def _text(self, node: exp.Expression | None, what: str) -> Typed:
        assert node is not None
        typed = self.check(node)
        if not typed.type.is_text:
            raise UndefinedFunction(
                f"{what} needs text, but {node.sql('postgres')} is {typed.type.value} ({self.scope.clause})",
                hint="CAST the value to text first",
            )
        return typed

    def _text_to_text(self, node: exp.Expression) -> Typed:
        name = node.sql_name().lower()
        if isinstance(node, exp.Initcap):
            raise NotSupported(
                f"initcap() is not supported ({self.scope.clause}): the engines split words differently",
                hint="use lower() or upper()",
            )
        if node.args.get("expression") is not None:
            raise NotSupported(f"{name}() takes one argument here")
        inner = self._text(node.this, f"{name}()")
        # ASCII letters only, alike on every engine: PostgreSQL maps other letters by its
        # collation's locale (or not at all under "C"), DuckDB by Unicode.
        sql = _ascii_case(inner.sql, lower=isinstance(node, exp.Lower))
        return Typed(sql, PgType.TEXT, None, inner.uses_unit, inner.constant)

    def _length(self, node: exp.Expression) -> Typed:
        inner = self._text(node.this, "length()")
        return Typed(
            typed_node(exp.Length(this=inner.sql), PgType.INT4),
            PgType.INT4,
            Interval(Decimal(0), Decimal(INTEGER_RANGE[PgType.INT4][1])),
            inner.uses_unit,
            inner.constant,
        )

    def _substring(self, node: exp.Expression) -> Typed:
        inner = self._text(node.this, "substring()")
        start = _int_argument(node.args.get("start"), "the start of substring()")
        length: int | None = None
        if node.args.get("length") is not None:
            length = _int_argument(node.args.get("length"), "the length of substring()")
            if length < 0:
                raise InvalidParameter("the length of substring() must not be negative")
        if start < 1:
            # PostgreSQL counts characters before the first one (substring('abc', 0, 2) is 'a');
            # DuckDB counts a start below 1 from the end. Written from position 1, they agree.
            length = None if length is None else max(0, length + start - 1)
            start = 1
        args: dict[str, exp.Expression] = {"this": inner.sql, "start": exp.Literal.number(start)}
        if length is not None:
            args["length"] = exp.Literal.number(length)
        return Typed(exp.Substring(**args), PgType.TEXT, None, inner.uses_unit, inner.constant)

    def _trim(self, node: exp.Expression) -> Typed:
        inner = self._text(node.this, "trim()")
        args: dict[str, object] = {"this": inner.sql}
        if node.args.get("expression") is not None:
            args["expression"] = exp.Literal.string(
                _string_argument(node.expression, "the characters of trim()")
            )
        if node.args.get("position"):
            args["position"] = node.args["position"]
        return Typed(exp.Trim(**args), PgType.TEXT, None, inner.uses_unit, inner.constant)

    def _left_right(self, node: exp.Expression) -> Typed:
        inner = self._text(node.this, f"{node.sql_name().lower()}()")
        count = _int_argument(node.expression, f"the length of {node.sql_name().lower()}()")
        sql = type(node)(this=inner.sql, expression=number_literal(count))
        return Typed(sql, PgType.TEXT, None, inner.uses_unit, inner.constant)

    def _concat(self, node: exp.Expression) -> Typed:
        args = node.expressions if isinstance(node, exp.Concat) else [node.this, node.expression]
        parts = [self.check(a) for a in args]
        for part, arg in zip(parts, args, strict=True):
            if not (
                part.type.is_text or part.type.is_number or part.type.is_temporal or part.type is PgType.BOOL
            ):
                raise UndefinedFunction(f"cannot concatenate {arg.sql('postgres')}")
            if part.type.is_number and not part.exact_integer:
                raise NotSupported(
                    f"concatenating {part.type.value} values is not supported ({self.scope.clause}): the "
                    "engines write fractional numbers differently",
                    hint="round it to an integer first, e.g. CAST(ROUND(x) AS integer)",
                )
        casted = [
            p.sql if p.type.is_text else exp.Cast(this=p.sql, to=exp.DataType.build("TEXT")) for p in parts
        ]
        if isinstance(node, exp.Concat):
            sql: exp.Expression = exp.Concat(expressions=casted, safe=True, coalesce=True)
        else:
            sql = exp.DPipe(this=casted[0], expression=casted[1], safe=True)
        return Typed(sql, PgType.TEXT, None, any(p.uses_unit for p in parts), all(p.constant for p in parts))

    def _replace(self, node: exp.Expression) -> Typed:
        inner = self._text(node.this, "replace()")
        find = _string_argument(node.expression, "the search text of replace()")
        replacement = _string_argument(node.args.get("replacement"), "the replacement of replace()")
        sql = exp.Replace(
            this=inner.sql, expression=exp.Literal.string(find), replacement=exp.Literal.string(replacement)
        )
        return Typed(sql, PgType.TEXT, None, inner.uses_unit, inner.constant)

    def _strpos(self, node: exp.Expression) -> Typed:
        inner = self._text(node.this, "strpos()")
        needle = _string_argument(node.args.get("substr"), "the search text of strpos()")
        if node.args.get("position") is not None:
            raise NotSupported("strpos() takes two arguments")
        sql = exp.StrPosition(this=inner.sql, substr=exp.Literal.string(needle))
        return Typed(
            typed_node(sql, PgType.INT4),
            PgType.INT4,
            Interval(Decimal(0), Decimal(INTEGER_RANGE[PgType.INT4][1])),
            inner.uses_unit,
            inner.constant,
        )

    # -- dates -------------------------------------------------------------------------------------

    def _temporal(self, node: exp.Expression | None, what: str) -> Typed:
        assert node is not None
        typed = self.check(node)
        if not typed.type.is_temporal:
            raise UndefinedFunction(
                f"{what} needs a date or timestamp, but {node.sql('postgres')} is {typed.type.value}"
            )
        return typed

    def _date_trunc(self, node: exp.Expression) -> Typed:
        unit = _string_argument(node.args.get("unit"), "the unit of date_trunc()").lower()
        if unit not in DATE_TRUNC_UNITS:
            raise InvalidParameter(
                f"date_trunc unit {unit!r} is not recognised",
                hint=f"use one of {', '.join(DATE_TRUNC_UNITS)}",
            )
        inner = self._temporal(node.this, "date_trunc()")
        # PostgreSQL truncates a date as a timestamptz and DuckDB returns a date: truncating an
        # explicit timestamp and naming the result type keeps both engines in agreement.
        source = inner.sql
        result = PgType.TIMESTAMPTZ if inner.type is PgType.TIMESTAMPTZ else PgType.TIMESTAMP
        if inner.type is PgType.DATE:
            source = exp.Cast(this=source, to=exp.DataType.build("TIMESTAMP"))
        trunc = exp.TimestampTrunc(this=source, unit=exp.Var(this=unit.upper()))
        sql = exp.Cast(this=trunc, to=exp.DataType.build(SQLGLOT_SCHEMA_TYPE[result]))
        return Typed(typed_node(sql, result), result, None, inner.uses_unit, inner.constant)

    def _extract(self, node: exp.Expression) -> Typed:
        field = _string_argument(node.this, "the field of extract()").lower()
        if field not in EXTRACT_FIELDS:
            raise InvalidParameter(
                f"extract field {field!r} is not supported", hint=f"use one of {', '.join(EXTRACT_FIELDS)}"
            )
        inner = self._temporal(node.expression, "extract()")
        if inner.type is PgType.DATE and field in ("hour", "minute"):
            raise NotSupported(
                f'unit "{field}" not supported for type date ({self.scope.clause})',
                hint="a date has no time of day; extract it from a timestamp",
            )
        extract = exp.Extract(this=exp.Var(this=field.upper()), expression=inner.sql)
        # PostgreSQL's extract() is numeric; these fields are whole numbers on every engine.
        sql = exp.Cast(this=extract, to=exp.DataType.build("BIGINT"))
        return Typed(
            typed_node(sql, PgType.INT8),
            PgType.NUMERIC,
            Interval(Decimal(-300000), Decimal(300000)),
            inner.uses_unit,
            inner.constant,
        )


_ASCII_UPPER_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_ASCII_LOWER_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_ASCII_LOWER = str.maketrans(_ASCII_UPPER_LETTERS, _ASCII_LOWER_LETTERS)


def _ascii_case(value: exp.Expression, *, lower: bool) -> exp.Expression:
    """lower() or upper() of ASCII letters only, through TRANSLATE, which both engines have."""
    letters = (_ASCII_UPPER_LETTERS, _ASCII_LOWER_LETTERS)
    source, target = letters if lower else letters[::-1]
    return exp.Anonymous(
        this="TRANSLATE", expressions=[value, exp.Literal.string(source), exp.Literal.string(target)]
    )


def _ascii_lower(value: exp.Expression) -> exp.Expression:
    return _ascii_case(value, lower=True)


# Dates and times are read within years 1–9999: what both engines and Python represent. PostgreSQL
# also stores 'infinity', years before 1 and after 9999, on which casts, extract() and reading the
# value back would fail (a failure that would depend on one row), and DuckDB returns them altered.
_TEMPORAL_RANGE = {
    PgType.DATE: ("0001-01-01", "9999-12-31", "DATE"),
    PgType.TIMESTAMP: ("0001-01-01 00:00:00", "9999-12-31 23:59:59.999999", "TIMESTAMP"),
    PgType.TIMESTAMPTZ: ("0001-01-01 00:00:00+00", "9999-12-31 23:59:59.999999+00", "TIMESTAMPTZ"),
}


def _clamp_temporal(value: exp.Expression, pg_type: PgType) -> exp.Expression:
    """A date or time column's value moved into years 1–9999 (±infinity to the ends), NULL kept."""
    lo_text, hi_text, type_name = _TEMPORAL_RANGE[pg_type]
    lo, hi = (
        numbers.cast(exp.Literal.string(lo_text), type_name),
        numbers.cast(exp.Literal.string(hi_text), type_name),
    )
    case = (
        exp.Case()
        .when(exp.Is(this=value.copy(), expression=exp.Null()), exp.Null())
        .when(exp.LT(this=value.copy(), expression=lo.copy()), lo)
        .when(exp.GT(this=value.copy(), expression=hi.copy()), hi)
        .else_(value.copy())
    )
    return typed_node(exp.Paren(this=case), pg_type)


def _nonzero_constant(typed: Typed) -> bool:
    """A divisor known, from the text alone, to be one non-zero value (so it needs no NULLIF)."""
    interval = typed.interval
    return typed.constant and interval is not None and interval.lo == interval.hi != 0


def _operand(sql: exp.Expression) -> exp.Expression:
    """An operand of a comparison, in parentheses when it is an operation itself: a <= b <> c is
    written as (a <= b) <> c, which both engines read (neither chains comparisons)."""
    if isinstance(sql, (exp.Binary, exp.Unary, exp.Predicate)):
        return exp.Paren(this=sql)
    return sql


def bytewise_text(value: exp.Expression) -> exp.Expression:
    """Text compared byte for byte, so ordered by code point, on every engine (COLLATE "C").
    Parenthesised: PostgreSQL's grammar takes no COLLATE in a BETWEEN's lower bound. An expression
    is cast to text first: DuckDB types `'a' || NULL` as NULL, which takes no collation."""
    if not (isinstance(value, exp.Column) or (isinstance(value, exp.Literal) and value.is_string)):
        value = exp.Cast(this=value, to=exp.DataType.build("TEXT"))
    return exp.Paren(this=exp.Collate(this=value, expression=exp.Identifier(this="C", quoted=True)))


def _canonical_type(to: exp.DataType, target: PgType) -> exp.DataType:
    """The cast's target written by dpproxy, never as sent (numeric keeps its precision)."""
    if target is PgType.NUMERIC:
        params = [p for p in to.expressions if isinstance(p, exp.DataTypeParam)]
        if params:
            scale = params[1].name if len(params) > 1 else "0"
            return exp.DataType.build(f"DECIMAL({params[0].name}, {scale})")
        return exp.DataType.build(numbers.DECIMAL_TYPE)
    return exp.DataType.build(SQLGLOT_SCHEMA_TYPE[target])


def _typed_constant(typed: Typed, target: PgType) -> Typed:
    """An untyped string constant as a constant of `target`, written from its parsed value."""
    literal = typed.sql
    if (
        not (isinstance(literal, exp.Literal) and literal.is_string)
        or target.is_text
        or target is PgType.UNKNOWN
    ):
        return typed
    text = literal.this.strip()
    _check_castable_text(text, target)
    if target.is_number:
        value = Decimal(text)
        if (
            target.is_integer
            and value == value.to_integral_value()
            and "." not in text
            and "e" not in text.lower()
        ):
            pg_type = PgType.INT8
        else:
            pg_type = PgType.NUMERIC
        if target.is_float:
            return Typed(
                numbers.double_constant(value),
                target,
                Interval.point(value),
                constant=True,
                double=True,
                smallest=abs(value) or Decimal(1),
            )
        return Typed(
            typed_node(number_literal(value), pg_type), pg_type, Interval.point(value), constant=True
        )
    if target is PgType.BOOL:
        return Typed(exp.Boolean(this=bool(boolean_from_text(text))), PgType.BOOL, constant=True)
    if target is PgType.DATE:
        value_text = dt.date.fromisoformat(text).isoformat()
        return Typed(numbers.cast(exp.Literal.string(value_text), "DATE"), PgType.DATE, constant=True)
    parsed = dt.datetime.fromisoformat(text)
    if target is PgType.TIMESTAMPTZ:
        return Typed(
            numbers.cast(exp.Literal.string(parsed.isoformat(sep=" ")), "TIMESTAMPTZ"), target, constant=True
        )
    return Typed(
        numbers.cast(exp.Literal.string(parsed.replace(tzinfo=None).isoformat(sep=" ")), "TIMESTAMP"),
        target,
        constant=True,
    )


def _extreme_interval(intervals: list[Interval | None], *, least: bool) -> Interval | None:
    """Range of LEAST/GREATEST over arguments with these ranges (None: unbounded both ways).

    LEAST(x, 20) is at most 20 even when x is unbounded above: that is how a derived count gets
    bounds. NULL arguments are skipped (as both engines do), so they do not widen the range.
    """
    inf = Decimal("Infinity")
    los = [i.lo if i is not None else -inf for i in intervals]
    his = [i.hi if i is not None else inf for i in intervals]
    lo, hi = (min(los), min(his)) if least else (max(los), max(his))
    if lo == -inf and hi == inf:
        return None
    return Interval(lo, hi)


def row_expression(node: exp.Expression, scope: RowScope) -> Typed:
    return RowExpressionChecker(scope).check(node)
