"""Numbers in row expressions: arithmetic, abs/sign/round/floor/ceil and casts, each written in the
representation both engines compute alike (dpproxy.sql.numbers), with ranges checked so nothing
overflows or underflows for any value the policy allows."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

from sqlglot import exp

from dpproxy.errors import (
    DatatypeMismatch,
    InvalidParameter,
    NotSupported,
    UndefinedFunction,
    ValueOutOfRange,
)
from dpproxy.sql import numbers
from dpproxy.sql.intervals import Interval
from dpproxy.sql.literals import PUBLIC_ANSWER
from dpproxy.sql.rowexpr.constants import (
    canonical_type,
    check_castable_text,
    int_argument,
    typed_constant,
)
from dpproxy.sql.rowexpr.typed import FRACTIONAL_LIMIT, SMALLEST_DECIMAL, Typed, number_literal, typed_node
from dpproxy.sql.types import INTEGER_RANGE, PgType, arithmetic_result, from_sqlglot


class ArithmeticRules:
    """The number rules of RowExpressionChecker (a mixin: `check` and `scope` are the checker's)."""

    def _number(self, node: exp.Expression) -> Typed:
        typed = self.check(node)
        if typed.type is PgType.UNKNOWN and isinstance(typed.sql, exp.Literal):
            check_castable_text(typed.sql.this, PgType.NUMERIC)
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
        """No arithmetic may overflow for any value the policy allows (or its columns' types hold).
        Integers are computed in bigint (_as_bigint), so that no failure depends on data; a constant,
        which depends on the text alone, keeps PostgreSQL's meaning: 22003 when its value leaves its
        type (CAST(32767 AS smallint) + CAST(1 AS smallint), 2147483647 + 1)."""
        interval = typed.interval if typed.interval is not None else typed.reach
        if typed.constant and typed.exact_integer and interval is not None and typed.type in INTEGER_RANGE:
            lo, hi = INTEGER_RANGE[typed.type]
            if not interval.within(lo, hi):
                raise ValueOutOfRange(
                    f"{typed.type.value} out of range: {node.sql('postgres')} ({self.scope.clause})"
                )
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
            return typed_node(
                exp.Cast(this=typed.sql, to=exp.DataType.build(exp.DataType.Type.BIGINT)), PgType.INT8
            )
        return typed.sql

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
        within = interval is not None and interval.within(-numbers.WITHIN_DOUBLES, numbers.WITHIN_DOUBLES)
        return numbers.as_double(typed.sql, exact_integer=typed.type.is_integer, within=within)

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
            reach=-inner.reach if inner.reach is not None else None,
        )
        if inner.interval is not None or not inner.constant:
            self._require_range(node, result)
        return result

    def _arithmetic(self, node: exp.Expression) -> Typed:
        left, right = self._number(node.left), self._number(node.right)
        result_type = arithmetic_result(left.type, right.type)
        a, b = left.interval, right.interval
        divides = isinstance(node, (exp.Div, exp.Mod))
        # A zero written in the statement is refused; a public subquery's answer of zero is data, and
        # the divisor is guarded (NULL) as a column's would be: acceptance depends on the text alone.
        written = not node.right.meta.get(PUBLIC_ANSWER)
        if divides and written and right.constant and b is not None and b.lo == b.hi == 0:
            raise InvalidParameter(f"division by zero in {node.sql('postgres')} ({self.scope.clause})")
        double = left.double or right.double or (isinstance(node, exp.Div) and not result_type.is_integer)
        interval: Interval | None = None
        if a is not None and b is not None:
            interval = _combine(node, a, b, right.type.is_integer, result_type.is_integer)
        # An integer operand without a declared range still lies within its type's: enough to show
        # that integer arithmetic cannot overflow bigint (year / 10, a public column's value × 12).
        # The result's range stays unknown, so nothing takes it for a bound to clip or noise by.
        checked = interval
        if checked is None and result_type.is_integer and not double:
            ca, cb = _type_range(left, a), _type_range(right, b)
            if ca is not None and cb is not None:
                checked = _combine(node, ca, cb, True, True)
        uses_unit, constant = left.uses_unit or right.uses_unit, left.constant and right.constant
        if double:
            typed = self._double_arithmetic(node, left, right, result_type, interval)
        elif result_type.is_integer:
            typed = self._integer_arithmetic(node, left, right, result_type, interval)
        else:
            typed = self._decimal_arithmetic(node, left, right, interval)
        reach = checked if interval is None and checked is not None else None
        typed = dataclasses.replace(typed, uses_unit=uses_unit, constant=constant, reach=reach)
        self._require_range(
            node, typed if checked is interval else dataclasses.replace(typed, interval=checked)
        )
        return typed

    def _integer_arithmetic(
        self, node: exp.Expression, left: Typed, right: Typed, result_type: PgType, interval: Interval | None
    ) -> Typed:
        """Exact, in bigint; a zero divisor gives NULL (NULLIF), as a missing value would."""
        lsql, rsql = self._as_bigint(left), self._as_bigint(right)
        if isinstance(node, (exp.Div, exp.Mod)) and not _nonzero_constant(right):
            rsql = exp.Nullif(this=rsql, expression=exp.Literal.number(0))
            rsql = typed_node(
                exp.Cast(this=rsql, to=exp.DataType.build(exp.DataType.Type.BIGINT)), PgType.INT8
            )
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
            inner,
            sql=typed_node(exp.Abs(this=self._as_bigint(inner)), inner.type),
            interval=interval,
            reach=inner.reach.abs() if inner.reach is not None else None,
        )
        self._require_range(node, typed)
        return typed

    def _sign(self, node: exp.Expression) -> Typed:
        inner = self._number(node.this)
        if inner.type.is_integer:  # sign(integer) is sign(double precision) in PostgreSQL, as floor
            inner = self._integer_as_double(inner)
        pg_type = inner.type
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
        digits = int_argument(decimals, "the digits of round()") if decimals is not None else 0
        if not 0 <= digits <= 9:
            raise NotSupported("round() digits must be between 0 and 9")
        interval = inner.interval.widen_to_digits(digits) if inner.interval is not None else None
        if inner.type.is_integer and decimals is None:
            # PostgreSQL resolves round(integer) to round(double precision), its numbers' preferred
            # type (round(integer, n) has only the numeric candidate): an integer, as a double.
            return self._integer_as_double(inner)
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
        # round(int, n) and round(numeric[, n]) are numeric in PostgreSQL, halves away from zero on both.
        return Typed(
            typed_node(exp.Round(**args), PgType.NUMERIC),
            PgType.NUMERIC,
            interval,
            inner.uses_unit,
            inner.constant,
            wide=inner.wide,
        )

    def _integer_as_double(self, inner: Typed) -> Typed:
        """An integer argument of a function PostgreSQL resolves to its double precision form
        (round, floor, ceil, sign of an integer): the same value, as a double."""
        return dataclasses.replace(
            inner,
            sql=typed_node(self._double(inner), PgType.FLOAT8),
            type=PgType.FLOAT8,
            double=True,
            smallest=Decimal(1),
        )

    def _floor_ceil(self, node: exp.Expression) -> Typed:
        inner = self._number(node.this)
        if inner.type.is_integer:
            # PostgreSQL resolves floor(integer) and ceil(integer) to their double precision forms
            # (its numbers' preferred type), as round(integer): the integer itself, as a double. Typed
            # numeric, round(floor(age), 1) was accepted and failed on PostgreSQL (no round(double
            # precision, integer)).
            return self._integer_as_double(inner)
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

    def _cast(self, node: exp.Expression) -> Typed:
        inner = self.check(node.this)
        to: exp.DataType = node.args["to"]
        target = from_sqlglot(to)
        if target is PgType.UNKNOWN:
            time_of_day = to.this in (exp.DataType.Type.TIME, exp.DataType.Type.TIMETZ)
            raise NotSupported(
                f"CAST to {to.sql('postgres')} is not supported ({self.scope.clause})",
                hint="for a time of day, compare extract(hour FROM x) and extract(minute FROM x)"
                if time_of_day
                else "cast to integer, bigint, numeric, double precision, text, boolean, date or timestamp",
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
        if isinstance(inner.sql, exp.Null):
            # CAST(NULL AS t): a NULL of type t (a public scalar subquery that found no row is
            # inlined so, with its type: whether a statement is accepted must not depend on it).
            interval = Interval.point(0) if target.is_number else None
            return Typed(
                exp.Cast(this=exp.Null(), to=canonical_type(to, target)),
                target,
                interval,
                constant=True,
                double=target.is_float,
            )
        if inner.type is PgType.UNKNOWN or (inner.type.is_text and inner.constant):
            if isinstance(inner.sql, exp.Literal):
                check_castable_text(inner.sql.this, target)
                return typed_constant(inner, target)
            if target.is_text:
                sql = exp.Cast(this=inner.sql, to=canonical_type(to, target))
                return Typed(sql, target, constant=True, growth=inner.growth)
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
            sql = exp.Cast(this=inner.sql, to=exp.DataType.build(exp.DataType.Type.INT))
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
            typed_node(exp.Cast(this=inner.sql, to=canonical_type(to, target)), target),
            target,
            None,
            inner.uses_unit,
            inner.constant,
            growth=inner.growth,
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
            # Doubles round halves to even, exact numbers away from zero: alike on every engine.
            sql = exp.Cast(this=inner.sql, to=canonical_type(to, target))
            if inner.double or not inner.type.is_integer:
                sql = numbers.integer_cast(
                    inner.sql, canonical_type(to, target), double=inner.double or inner.type.is_float
                )
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
        typmod = numbers.numeric_typmod(to)
        if typmod is None and inner.type is PgType.NUMERIC:
            return inner  # numeric to numeric: nothing to convert, nothing that could overflow
        # A bare NUMERIC is written DECIMAL(38, 10): what it holds is checked as for that type.
        self._check_numeric_precision(to, typmod or (38, 10), interval, node)
        # DECIMAL(p, s) as written; a bare NUMERIC (three decimals on DuckDB) as DECIMAL(38, 10).
        sql = exp.Cast(this=inner.sql, to=canonical_type(to, PgType.NUMERIC))
        return Typed(
            typed_node(sql, PgType.NUMERIC),
            PgType.NUMERIC,
            interval,
            inner.uses_unit,
            inner.constant,
            wide=typmod is None,
        )

    @staticmethod
    def _constant_interval(sql: exp.Expression, target: PgType) -> Interval | None:
        if target.is_number and isinstance(sql, exp.Literal):
            return Interval.point(Decimal(sql.this.strip()))
        return None

    def _check_numeric_precision(
        self, to: exp.DataType, typmod: tuple[int, int], interval: Interval | None, node: exp.Expression
    ) -> None:
        precision, scale = typmod
        limit = Decimal(10) ** (precision - scale)
        if interval is None or not interval.within(-limit + 1, limit - 1):
            raise NotSupported(
                f"CAST({node.this.sql('postgres')} AS {to.sql('postgres')}) could overflow "
                f"({self.scope.clause})",
                hint="use a larger precision, or numeric without precision",
            )


def _nonzero_constant(typed: Typed) -> bool:
    """A divisor known, from the text alone, to be one non-zero value (so it needs no NULLIF)."""
    interval = typed.interval
    return typed.constant and interval is not None and interval.lo == interval.hi != 0


def extreme_interval(intervals: list[Interval | None], *, least: bool) -> Interval | None:
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


def _type_range(typed: Typed, interval: Interval | None) -> Interval | None:
    """The operand's range: its own; or what integer arithmetic over columns without a declared range
    is known to reach (`Typed.reach`); or, for a column read as it is stored, its integer type's
    (smallint, integer: never bigint, whose range leaves no room for arithmetic). Never a computed
    value's nominal type: computed in bigint, it may have left that type's range."""
    if interval is not None:
        return interval
    if typed.reach is not None and not typed.double:
        return typed.reach
    node = typed.sql
    while isinstance(node, exp.Cast):
        node = node.this
    if typed.type in (PgType.INT2, PgType.INT4) and not typed.double and isinstance(node, exp.Column):
        lo, hi = INTEGER_RANGE[typed.type]
        return Interval(Decimal(lo), Decimal(hi))
    return None


def _combine(
    node: exp.Expression, a: Interval, b: Interval, integer_divisor: bool, truncate: bool
) -> Interval:
    """The range of `a op b`, op the arithmetic node (+, −, ×, / or %)."""
    if isinstance(node, exp.Add):
        return a + b
    if isinstance(node, exp.Sub):
        return a - b
    if isinstance(node, exp.Mul):
        return a * b
    if isinstance(node, exp.Div):
        return a.divide(b, integer_divisor=integer_divisor, truncate=truncate)
    return a.modulo(b)
