"""Released values in PostgreSQL's semantics: casts between the types dpproxy returns, text output,
arithmetic with PostgreSQL's result scales, comparisons across numeric types."""

from __future__ import annotations

import datetime as dt
import math
import operator
from collections.abc import Callable
from decimal import MAX_EMAX, MIN_EMIN, ROUND_HALF_UP, Decimal, InvalidOperation, localcontext
from typing import Any

from sqlglot import exp

from dpproxy.errors import DatatypeMismatch, InvalidText, NotSupported, ValueOutOfRange
from dpproxy.sql import numbers
from dpproxy.sql.datetimes import parse_temporal
from dpproxy.sql.postprocess.inference import literal_type
from dpproxy.sql.types import INTEGER_RANGE, PgType, boolean_from_text, from_sqlglot


def _to_decimal(value: object) -> Decimal:
    if isinstance(value, Decimal):
        return value
    if isinstance(value, bool):
        raise DatatypeMismatch("boolean is not a number")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, str):
        try:
            return Decimal(value.strip())
        except InvalidOperation as e:
            raise InvalidText(f"invalid input syntax for type numeric: {value!r}") from e
    raise DatatypeMismatch(f"{type(value).__name__} is not a number")


def convert(value: object, target: PgType) -> object:
    """CAST semantics of PostgreSQL for the types dpproxy returns."""
    if value is None:
        return None
    if target.is_integer:
        if isinstance(value, bool):
            result = int(value)
        elif isinstance(value, int):
            result = value
        elif isinstance(value, float):
            result = round(value)  # rint: halves to even, as PostgreSQL casts float8
        else:
            exact = _to_decimal(value)
            if not exact.is_finite():  # PostgreSQL: 0A000 "cannot convert infinity to bigint"
                raise NotSupported(
                    f"cannot convert {'NaN' if exact.is_nan() else 'infinity'} to {target.value}"
                )
            result = int(round_numeric(exact, 0))
        return within_type(result, target)
    if target is PgType.NUMERIC:
        return _to_decimal(value)
    if target.is_float:
        if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
            return float(value)
        return float(_to_decimal(value))
    if target.is_text:
        return to_text(value)
    if target is PgType.BOOL:
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            return value != 0
        parsed = boolean_from_text(str(value))
        if parsed is None:
            raise InvalidText(f"invalid input syntax for type boolean: {value!r}")
        return parsed
    if target is PgType.DATE:
        if isinstance(value, dt.datetime):
            return value.date()
        if isinstance(value, dt.date):
            return value
        return parse_temporal(str(value), PgType.DATE)
    if target in (PgType.TIMESTAMP, PgType.TIMESTAMPTZ):
        if isinstance(value, dt.datetime):
            return value
        if isinstance(value, dt.date):
            return dt.datetime(value.year, value.month, value.day)
        return parse_temporal(str(value), target)
    return value


def to_text(value: object) -> str:
    """PostgreSQL's text output of a value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value) if value != int(value) or abs(value) >= 1e16 else str(int(value))
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    return str(value)


# Addition, subtraction and multiplication mean the same on ints, floats and Decimals; division and
# the remainder differ (PostgreSQL's integer division truncates, a numeric quotient keeps its digits).
_RING = {exp.Add: operator.add, exp.Sub: operator.sub, exp.Mul: operator.mul}


# PostgreSQL's numeric_round clamps the digits to what a numeric can hold: at most 16,383 after the
# point (NUMERIC_DSCALE_MAX), and at most (32,767 + 1)·4 + 1 before it (NUMERIC_WEIGHT_MAX).
_ROUND_DIGITS = (-((0x7FFF + 1) * 4) - 1, 0x3FFF)


def round_numeric(value: Decimal, digits: int) -> Decimal:
    """round(numeric, digits) as PostgreSQL computes it: halves away from zero, the digits clamped as
    its numeric_round clamps them, NaN and ±Infinity unchanged; exact whatever the value's size (a
    decimal context of the digits the result needs, not Python's default 28)."""
    if not value.is_finite():
        return value
    digits = max(_ROUND_DIGITS[0], min(digits, _ROUND_DIGITS[1]))
    with localcontext() as ctx:
        ctx.prec = max(ctx.prec, value.adjusted() + digits + 2)
        ctx.Emax, ctx.Emin = MAX_EMAX, MIN_EMIN
        return value.quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)


def within_type(value: int, pg_type: PgType) -> int:
    """An integer result of type `pg_type`, or PostgreSQL's error when it leaves the type (22003,
    'smallint out of range')."""
    lo, hi = INTEGER_RANGE[pg_type]
    if not lo <= value <= hi:
        raise ValueOutOfRange(f"{pg_type.value} out of range")
    return value


def _arith(node: exp.Expression, a: object, b: object, result: PgType) -> object:
    if a is None or b is None:
        return None
    if result.is_integer:
        value = _operate(node, int(a), int(b), _integer_quotient)  # type: ignore[call-overload]
        return value if value is None else within_type(value, result)  # type: ignore[arg-type]
    if result.is_float:
        return _operate(node, float(a), float(b), _float_quotient)  # type: ignore[arg-type]
    with localcontext() as ctx:
        ctx.prec = 60
        return _operate(node, _to_decimal(a), _to_decimal(b), _numeric_quotient)


def _operate(
    node: exp.Expression, x: Any, y: Any, divide: Callable[[exp.Expression, Any, Any], object]
) -> object:
    """x + y, x − y, x · y alike on every kind of number; x / y and x % y by `divide`, of the
    result's kind, and NULL for a zero divisor (over released values, not an error)."""
    ring = _RING.get(type(node))
    if ring is not None:
        return ring(x, y)
    if y == 0:
        return None
    return divide(node, x, y)


def _integer_quotient(node: exp.Expression, x: int, y: int) -> int:
    """Integer division and remainder truncate towards zero, as PostgreSQL's do."""
    quotient = abs(x) // abs(y)
    if isinstance(node, exp.Div):
        return quotient if (x >= 0) == (y > 0) else -quotient
    remainder = abs(x) % abs(y)
    return remainder if x >= 0 else -remainder


def _float_quotient(node: exp.Expression, x: float, y: float) -> float:
    return x / y if isinstance(node, exp.Div) else math.fmod(x, y)


def _numeric_quotient(node: exp.Expression, x: Decimal, y: Decimal) -> Decimal:
    if isinstance(node, exp.Mod):
        return x % y
    quotient = x / y
    # PostgreSQL shows at least 16 significant digits of a numeric quotient.
    digits = max(_scale(x), _scale(y), 16 - max(quotient.adjusted() + 1, 0), 0)
    return quotient.quantize(Decimal(1).scaleb(-min(digits, 40)), rounding=ROUND_HALF_UP)


def _scale(value: Decimal) -> int:
    exponent = value.as_tuple().exponent
    return -exponent if isinstance(exponent, int) and exponent < 0 else 0


def _compare(a: object, b: object) -> tuple[object, object]:
    """Bring two values to comparable Python types, as PostgreSQL's implicit casts do."""
    if isinstance(a, str) and not isinstance(b, str):
        return convert(a, _python_type(b)), b
    if isinstance(b, str) and not isinstance(a, str):
        return a, convert(b, _python_type(a))
    if isinstance(a, float) and isinstance(b, Decimal):
        return Decimal(repr(a)), b
    if isinstance(b, float) and isinstance(a, Decimal):
        return a, Decimal(repr(b))
    return a, b


def _python_type(value: object) -> PgType:
    if isinstance(value, bool):
        return PgType.BOOL
    if isinstance(value, int):
        return PgType.INT8
    if isinstance(value, float):
        return PgType.FLOAT8
    if isinstance(value, Decimal):
        return PgType.NUMERIC
    if isinstance(value, dt.datetime):
        return PgType.TIMESTAMPTZ if value.tzinfo is not None else PgType.TIMESTAMP
    if isinstance(value, dt.date):
        return PgType.DATE
    return PgType.TEXT


def _literal_value(node: exp.Literal) -> object:
    if node.is_string:
        return node.this
    t = literal_type(node)
    return int(node.this) if t.is_integer else Decimal(node.this)


def numeric_field(value: Decimal, precision: int, scale: int) -> Decimal:
    """A numeric in numeric(precision, scale), as PostgreSQL casts it: rounded to the scale (halves
    away from zero), and 22003 "numeric field overflow" when it then has more than precision − scale
    digits before the point. NaN stays NaN; ±Infinity does not fit (PostgreSQL 14+)."""
    if value.is_nan():
        return value
    if value.is_infinite():
        raise ValueOutOfRange(
            "numeric field overflow",
            hint=f"a field with precision {precision}, scale {scale} cannot hold an infinite value",
        )
    rounded = round_numeric(value, scale)
    if rounded and rounded.adjusted() >= precision - scale:
        raise ValueOutOfRange(
            "numeric field overflow",
            hint=f"a field with precision {precision}, scale {scale} must round to an absolute value less "
            f"than 10^{precision - scale}",
        )
    return rounded


def _cast(node: exp.Cast, value: object) -> object:
    to: exp.DataType = node.args["to"]
    target = from_sqlglot(to)
    result = convert(value, target)
    if target is PgType.NUMERIC and isinstance(result, Decimal):
        typmod = numbers.numeric_typmod(to)
        if typmod is not None:
            result = numeric_field(result, *typmod)
    if target is PgType.VARCHAR and isinstance(result, str):
        params = [p for p in to.expressions if isinstance(p, exp.DataTypeParam)]
        if params:
            result = result[: int(params[0].name)]
    return result
