"""Python values as SQL constants: the one place a value becomes text the backend will read.

Used for bound parameters, the public values of keys, and the results of public subqueries inlined
into a private query. Every constant is written from the value itself (never from text a client
sent), in a form both backends read the same way: integers and decimals as numerals, other types as
a cast of their ISO text, so a constant keeps the type its value had.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

from sqlglot import exp

from dpproxy.errors import InvalidParameter
from dpproxy.sql.types import PgType

# Marks, in a node's meta, the inlined answer of a public scalar subquery (dpproxy.sql.subqueries):
# public data, not the statement's text.
PUBLIC_ANSWER = "dpproxy_public_answer"


def number(value: int | Decimal) -> exp.Expression:
    """A numeral; negative values as a parenthesised negation, which every dialect reads alike."""
    text = str(value) if isinstance(value, int) else format(value, "f")
    literal = exp.Literal.number(text.lstrip("-"))
    return exp.Paren(this=exp.Neg(this=literal)) if text.startswith("-") else literal


def cast(text: str, type_name: str) -> exp.Expression:
    return exp.Cast(this=exp.Literal.string(text), to=exp.DataType.build(type_name))


def constant(value: object, pg_type: PgType | None = None) -> exp.Expression:
    """The SQL constant of a Python value; `pg_type` (when known) keeps floats and numerics typed as
    their column was, instead of as a numeral's type."""
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return number(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise InvalidParameter("NaN and infinite numeric values are not supported as constants")
        return cast(format(value, "f"), "NUMERIC") if pg_type is PgType.NUMERIC else number(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidParameter("NaN and infinite values are not supported as constants")
        if pg_type is not None and pg_type.is_float:
            return cast(repr(value), "REAL" if pg_type is PgType.FLOAT4 else "DOUBLE PRECISION")
        return number(Decimal(repr(value)))
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            return cast(value.isoformat(sep=" "), "TIMESTAMPTZ")
        return cast(value.isoformat(sep=" "), "TIMESTAMP")
    if isinstance(value, dt.date):
        return cast(value.isoformat(), "DATE")
    if isinstance(value, list) and not any(isinstance(v, list) for v in value):
        return exp.Array(expressions=[constant(v, pg_type) for v in value])  # `= ANY($1)`: an IN list
    raise InvalidParameter(f"values of type {type(value).__name__} are not supported as constants")


def placeholder_value(pg_type: PgType, context: PgType | None = None) -> object:
    """A harmless value of a type, to analyze a statement before its parameters are known.

    A text parameter used where its context expects a date or a number (a driver's setString on a
    date column) gets text that parses as one, as the actual value must for the query to run.
    """
    if pg_type.is_text and context is not None and not context.is_text:
        value = placeholder_value(context)
        return value.isoformat() if hasattr(value, "isoformat") else str(value)
    if pg_type.is_integer:
        return 1
    if pg_type is PgType.NUMERIC:
        return Decimal(1)
    if pg_type.is_float:
        return 1.0
    if pg_type is PgType.BOOL:
        return True
    if pg_type is PgType.DATE:
        return dt.date(2000, 1, 1)
    if pg_type in (PgType.TIMESTAMP, PgType.TIMESTAMPTZ):
        return dt.datetime(2000, 1, 1)
    return "a"
