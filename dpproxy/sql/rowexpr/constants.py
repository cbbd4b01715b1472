"""Constants in row expressions: numerals within the digits both engines read alike, string constants
typed by their context, integer and string arguments of functions, cast targets written canonically.
Every decision here depends on the query text only."""

from __future__ import annotations

import operator
from decimal import Decimal, InvalidOperation

from sqlglot import exp

from dpproxy.errors import InvalidParameter, InvalidText, NotSupported
from dpproxy.sql import numbers
from dpproxy.sql.datetimes import parse_temporal, temporal_text
from dpproxy.sql.intervals import Interval
from dpproxy.sql.rowexpr.typed import Typed, number_literal, typed_node
from dpproxy.sql.types import INTEGER_RANGE, SQLGLOT_SCHEMA_TYPE, PgType, boolean_from_text, from_sqlglot

# Numeric constants: at most this many fractional and integral digits, so that every engine reads
# them as an exact decimal of the same value (DuckDB's DECIMAL holds 38 digits in all).
MAX_CONSTANT_FRACTION_DIGITS = 18


MAX_CONSTANT_INTEGER_DIGITS = 20


def check_constant_digits(value: Decimal, text: str) -> None:
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


def literal_number(node: exp.Literal) -> tuple[Decimal, PgType]:
    text = node.this
    try:
        value = Decimal(text)
    except InvalidOperation as e:  # pragma: no cover - sqlglot only makes numeric literals of numbers
        raise InvalidText(f"invalid number {text!r}") from e
    check_constant_digits(value, text)
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
        return node.this if node.is_string else literal_number(node)[0]
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


_INTEGER_OPERATORS = {exp.Add: operator.add, exp.Sub: operator.sub, exp.Mul: operator.mul}
_INTEGER_COMPARISONS = {
    exp.EQ: operator.eq,
    exp.NEQ: operator.ne,
    exp.GT: operator.gt,
    exp.GTE: operator.ge,
    exp.LT: operator.lt,
    exp.LTE: operator.le,
}


def _integer_constant(node: exp.Expression) -> Decimal | None:
    """An integer position written as arithmetic of integer constants, or as a CASE whose conditions
    compare such constants (Ibis's substr: `SUBSTRING(s FROM CASE WHEN (0 + 1) >= 1 THEN 0 + 1 ELSE
    0 + 1 + LENGTH(s) END FOR 1)`): its value, as PostgreSQL computes it; None when it is not one."""
    if isinstance(node, exp.Paren):
        return _integer_constant(node.this)
    operation = _INTEGER_OPERATORS.get(type(node))
    if operation is not None:
        left, right = _integer_constant(node.left), _integer_constant(node.right)
        return None if left is None or right is None else Decimal(operation(left, right))
    if isinstance(node, exp.Case) and node.this is None:
        for branch in node.args.get("ifs") or []:
            holds = _integer_condition(branch.this)
            if holds is None:
                return None
            if holds:
                return _integer_constant(branch.args["true"])
        default = node.args.get("default")
        return _integer_constant(default) if default is not None else None
    try:
        value = constant_value(node)
    except NotSupported:
        return None
    return value if isinstance(value, Decimal) and value == value.to_integral_value() else None


def _integer_condition(node: exp.Expression) -> bool | None:
    if isinstance(node, exp.Paren):
        return _integer_condition(node.this)
    compare = _INTEGER_COMPARISONS.get(type(node))
    if compare is None:
        return None
    left, right = _integer_constant(node.left), _integer_constant(node.right)
    return None if left is None or right is None else bool(compare(left, right))


def int_argument(node: exp.Expression | None, what: str, limit: int = MAX_TEXT_POSITION) -> int:
    if node is None:
        raise NotSupported(f"{what} is missing")
    value = _integer_constant(node)
    if value is None:
        value = constant_value(node)
    if not isinstance(value, Decimal) or value != value.to_integral_value():
        raise NotSupported(f"{what} must be an integer constant, found {node.sql('postgres')}")
    if abs(value) > limit:
        raise InvalidParameter(
            f"{what} must be between {-limit} and {limit}, found {node.sql('postgres')}",
            hint="the engines treat larger values differently (or fail on them)",
        )
    return int(value)


def string_argument(node: exp.Expression | None, what: str) -> str:
    if isinstance(node, exp.Literal) and node.is_string:
        return node.this
    if isinstance(node, exp.Var):
        return node.name
    found = node.sql("postgres") if node is not None else "nothing"
    raise NotSupported(f"{what} must be a string constant, found {found}")


def check_castable_text(text: str, target: PgType) -> None:
    """A string literal compared or cast to `target` must parse: such an error depends on the query
    text only, but reporting it here names the fault instead of failing in the backend."""
    try:
        if target.is_number:
            check_constant_digits(Decimal(text.strip()), text)
        elif target.is_temporal:
            parse_temporal(text, target)
        elif target is PgType.BOOL and boolean_from_text(text) is None:
            raise ValueError(text)
    except (ValueError, InvalidOperation) as e:
        raise InvalidText(
            f"invalid input syntax for type {target.value}: {text!r}",
            hint="write the constant in the column's type, e.g. 42, 12.50, DATE '2024-01-31'",
        ) from e


def canonical_type(to: exp.DataType, target: PgType) -> exp.DataType:
    """The cast's target written by dpproxy, never as sent (numeric keeps its precision)."""
    if target is PgType.NUMERIC:
        typmod = numbers.numeric_typmod(to)
        if typmod is not None:
            return numbers.data_type(f"DECIMAL({typmod[0]}, {typmod[1]})")
        return numbers.data_type(numbers.DECIMAL_TYPE)
    return numbers.data_type(SQLGLOT_SCHEMA_TYPE[target])


def typed_constant(typed: Typed, target: PgType) -> Typed:
    """An untyped string constant as a constant of `target`, written from its parsed value."""
    literal = typed.sql
    if (
        not (isinstance(literal, exp.Literal) and literal.is_string)
        or target.is_text
        or target is PgType.UNKNOWN
    ):
        return typed
    text = literal.this.strip()
    check_castable_text(text, target)
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
    value = parse_temporal(text, target)
    return Typed(
        numbers.cast(exp.Literal.string(temporal_text(value)), SQLGLOT_SCHEMA_TYPE[target]),
        target,
        constant=True,
    )
