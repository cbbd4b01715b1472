"""Dates and times in row expressions: date_trunc and extract on every engine alike, and the
clamping of stored values into years 1–9999 (what both engines and Python can hold), or into the
range the policy declares for the column."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from sqlglot import exp

from dpproxy.errors import InvalidParameter, NotSupported
from dpproxy.sql import numbers
from dpproxy.sql.intervals import Interval
from dpproxy.sql.rowexpr.constants import string_argument
from dpproxy.sql.rowexpr.typed import Typed, typed_node
from dpproxy.sql.types import SQLGLOT_SCHEMA_TYPE, PgType

DATE_TRUNC_UNITS = ("year", "quarter", "month", "week", "day", "hour", "minute", "second")

# The values each extract() field can take (a calendar's, on every engine); the year's cover every
# year a date is read within (1–9999) with room. Casts and arithmetic of them are checked against
# these (`CAST(extract(dow FROM t) + 6 AS smallint) % 7`, Ibis's day of the week), and a sum of them
# is clipped to them.
_YEARS = (-300000, 300000)
FIELD_RANGES = {
    "year": _YEARS,
    "quarter": (1, 4),
    "month": (1, 12),
    "week": (1, 53),
    "day": (1, 31),
    "dow": (0, 6),
    "isodow": (1, 7),
    "doy": (1, 366),
    "hour": (0, 23),
    "minute": (0, 59),
    "isoyear": _YEARS,
}
EXTRACT_FIELDS = (*FIELD_RANGES, "epoch")

# extract(epoch …) of a value clamped into years 1–9999 lies within these seconds.
EPOCH_RANGE = Interval(Decimal(-62135596800), Decimal(253402300800))


# Dates and times are read within years 1–9999: what both engines and Python represent. PostgreSQL
# also stores 'infinity', years before 1 and after 9999, on which casts, extract() and reading the
# value back would fail (a failure that would depend on one row), and DuckDB returns them altered.
_TEMPORAL_RANGE = {
    PgType.DATE: ("0001-01-01", "9999-12-31", "DATE"),
    PgType.TIMESTAMP: ("0001-01-01 00:00:00", "9999-12-31 23:59:59.999999", "TIMESTAMP"),
    PgType.TIMESTAMPTZ: ("0001-01-01 00:00:00+00", "9999-12-31 23:59:59.999999+00", "TIMESTAMPTZ"),
}


def temporal_text(value: dt.date, pg_type: PgType) -> str:
    """A date, timestamp or timestamptz (aware, in UTC) as a constant's text both engines read alike."""
    if pg_type is PgType.DATE:
        assert not isinstance(value, dt.datetime)
        return value.isoformat()
    assert isinstance(value, dt.datetime)
    text = value.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
    return text + "+00" if pg_type is PgType.TIMESTAMPTZ else text


def clamp_temporal(
    value: exp.Expression, pg_type: PgType, declared: tuple[dt.date, dt.date] | None = None
) -> exp.Expression:
    """A date or time column's value moved into years 1–9999 (±infinity to the ends), or into the
    policy's declared range when it has one, NULL kept."""
    lo_text, hi_text, type_name = _TEMPORAL_RANGE[pg_type]
    if declared is not None:
        lo_text, hi_text = temporal_text(declared[0], pg_type), temporal_text(declared[1], pg_type)
    lo, hi = (
        numbers.cast(exp.Literal.string(lo_text), type_name),
        numbers.cast(exp.Literal.string(hi_text), type_name),
    )
    case = exp.Case(  # new nodes: Case.when would copy the whole CASE at each call
        ifs=[
            exp.If(this=exp.Is(this=value.copy(), expression=exp.Null()), true=exp.Null()),
            exp.If(this=exp.LT(this=value.copy(), expression=lo.copy()), true=lo),
            exp.If(this=exp.GT(this=value.copy(), expression=hi.copy()), true=hi),
        ],
        default=value.copy(),
    )
    return typed_node(exp.Paren(this=case), pg_type)


class DateRules:
    """The date and time rules of RowExpressionChecker (a mixin: `check` and `scope` are the checker's)."""

    def _temporal(self, node: exp.Expression | None, what: str) -> Typed:
        return self.argument(node, what, "a date or timestamp", lambda t: t.is_temporal)

    def _date_trunc(self, node: exp.Expression) -> Typed:
        unit = string_argument(node.args.get("unit"), "the unit of date_trunc()").lower()
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
            source = exp.Cast(this=source, to=exp.DataType.build(exp.DataType.Type.TIMESTAMP))
        trunc = exp.TimestampTrunc(this=source, unit=exp.Var(this=unit.upper()))
        sql = exp.Cast(this=trunc, to=exp.DataType.build(SQLGLOT_SCHEMA_TYPE[result]))
        return Typed(typed_node(sql, result), result, None, inner.uses_unit, inner.constant)

    def _extract(self, node: exp.Expression) -> Typed:
        field = string_argument(node.this, "the field of extract()").lower()
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
        if field == "epoch":
            return self._epoch(inner)
        extract = exp.Extract(this=exp.Var(this=field.upper()), expression=inner.sql)
        # PostgreSQL's extract() is numeric; these fields are whole numbers on every engine.
        sql = exp.Cast(this=extract, to=exp.DataType.build(exp.DataType.Type.BIGINT))
        return Typed(
            typed_node(sql, PgType.INT8),
            PgType.NUMERIC,
            Interval(*(Decimal(end) for end in FIELD_RANGES[field])),
            inner.uses_unit,
            inner.constant,
        )

    def _epoch(self, inner: Typed) -> Typed:
        """extract(epoch FROM x): seconds since 1970-01-01 00:00:00 (UTC for a timestamptz), numeric
        as in PostgreSQL. Both engines compute it from whole microseconds (numbers.epoch_microseconds):
        a date's is a whole number of seconds (a bigint), a timestamp's an exact decimal with six
        fractional digits, computed as DECIMAL(38, 10)."""
        source = inner.sql
        if inner.type is PgType.DATE:
            source = exp.Cast(this=source, to=exp.DataType.build(exp.DataType.Type.TIMESTAMP))
        micros = numbers.cast(numbers.epoch_microseconds(source), "BIGINT")
        if inner.type is PgType.DATE:
            # Whole days: exact integer division on both engines (the typed, safe flags of integer
            # arithmetic, as dpproxy.sql.rowexpr.arithmetic writes it).
            sql = exp.Div(this=micros, expression=exp.Literal.number(1_000_000), typed=True, safe=True)
            return Typed(
                typed_node(numbers.cast(sql, "BIGINT"), PgType.INT8),
                PgType.NUMERIC,
                EPOCH_RANGE,
                inner.uses_unit,
                inner.constant,
            )
        scaled = exp.Mul(
            this=numbers.cast(micros, "DECIMAL(38, 0)"),
            expression=numbers.cast(exp.Literal.string("0.000001"), numbers.DECIMAL_TYPE),
        )
        return Typed(
            typed_node(numbers.as_decimal(scaled), PgType.NUMERIC),
            PgType.NUMERIC,
            EPOCH_RANGE,
            inner.uses_unit,
            inner.constant,
            wide=True,
        )
