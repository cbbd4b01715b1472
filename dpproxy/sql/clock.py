"""now() and its friends, folded into constants once per statement, and constant date and interval
arithmetic folded with them, so that the relative-date filters tools write are plain constants by the
time the analyzer reads them:

    WHERE created >= CAST((NOW() + INTERVAL '-30 day') AS date)        -- Metabase, previous 30 days
    WHERE visit_date > current_date - 30                               -- hand-written
    WHERE seen >= date_trunc('month', now()) - INTERVAL '1 month'      -- last month

`now()`, `current_timestamp`, `transaction_timestamp()` and `statement_timestamp()` are the instant
of the statement's `Clock` (a timestamptz); `localtimestamp` that instant in the session's time zone
(a timestamp) and `current_date` its date there; `current_timestamp(p)` and `localtimestamp(p)` are
rounded to p fractional digits. As in PostgreSQL, the instant is the start of the transaction: the
wire session sets `CLOCK` to the start of the statement, or of its transaction block
(dpproxy.wire.session), with the session's TimeZone; elsewhere (the Python API, the CLI) the engine
takes the time once when a statement's analysis begins (`statement_clock`). The same constant is
sent to every backend, so DuckDB, PostgreSQL and Spark compare with the same instant.

Arithmetic is PostgreSQL's: date ± integer is a date, date − date an integer, date ± interval a
timestamp, timestamp(tz) ± interval a timestamp(tz) (months first, then days, then the time; a
timestamptz's months and days in the session's time zone), an interval is months, days and
microseconds (`'1 year 2 mons'`, `'-30 day'`, `'1 day 02:00:00'`, `'2 weeks ago'`), negated, added
and multiplied by integers; date_trunc of a constant (a date truncated as a timestamp, as dpproxy
truncates date columns); casts between date, timestamp and timestamptz (a timestamptz read or
written in the session's time zone), `date(x)` as `CAST(x AS date)`, and `make_date(y, m, d)` of
integer literals (what Ibis writes for `ibis.date(…)` and `ibis.now().date()`). Only expressions
that name the clock or compute with a date or time are folded; a typed constant alone (`DATE
'2024-01-01'`) is left as written. Nothing here reads data: every value depends on the text and the
clock only.
"""

from __future__ import annotations

import calendar
import datetime as dt
import functools
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TypeVar

from sqlglot import exp

from dpproxy.errors import DatetimeFieldOverflow, DPProxyError, InvalidDatetime
from dpproxy.sql import date_buckets
from dpproxy.sql.datetimes import field_overflow, parse_temporal
from dpproxy.sql.select_list import output_name
from dpproxy.sql.types import PgType, from_sqlglot


@dataclass(frozen=True)
class Clock:
    """The instant now() gives one statement (aware) and the session's time zone."""

    instant: dt.datetime
    zone: dt.tzinfo = dt.UTC


CLOCK: ContextVar[Clock | None] = ContextVar("dpproxy_clock", default=None)


def current_clock() -> Clock:
    """The statement's clock, or the present instant in UTC when no one set one."""
    clock = CLOCK.get()
    return clock if clock is not None else Clock(dt.datetime.now(dt.UTC))


def session_zone() -> str:
    """The name of the time zone the statement is analysed in (the session's; UTC when no one set
    a clock): casts to timestamptz and timestamptz arithmetic are folded in it, so what keys an
    analysis or an answer carries it."""
    return str(current_clock().zone)


@contextmanager
def statement_clock() -> Iterator[Clock]:
    """One instant for the whole analysis of a statement: the clock already set (by the session, or
    an enclosing call), else the present, kept while the block runs."""
    clock = CLOCK.get()
    if clock is not None:
        yield clock
        return
    clock = Clock(dt.datetime.now(dt.UTC))
    token = CLOCK.set(clock)
    try:
        yield clock
    finally:
        CLOCK.reset(token)


def session_clock(previous: Clock | None, started: dt.datetime, status: str, zone: dt.tzinfo) -> Clock:
    """The clock of a statement a wire session starts at `started` with transaction status `status`
    (PostgreSQL's I, T or E): outside a transaction block a new instant, inside one the block's (the
    instant of the statement that began it, BEGIN itself), in the session's time zone `zone`."""
    if previous is None or status == "I":
        return Clock(started.astimezone(dt.UTC), zone)
    return Clock(previous.instant, zone)


F = TypeVar("F", bound=Callable[..., object])


def with_statement_clock(method: F) -> F:
    """A method that analyses one statement, run under `statement_clock`."""

    @functools.wraps(method)
    def wrapper(*args: object, **kwargs: object) -> object:
        with statement_clock():
            return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


_CLOCK_FUNCTIONS = ("transaction_timestamp", "statement_timestamp")


def _is_clock(node: exp.Expression) -> bool:
    if isinstance(node, (exp.CurrentTimestamp, exp.CurrentDate, exp.Localtimestamp)):
        return True
    return isinstance(node, exp.Anonymous) and node.name.lower() in _CLOCK_FUNCTIONS and not node.expressions


def _is_date_call(node: exp.Expression) -> bool:
    """`date(x)`, PostgreSQL's function spelling of `CAST(x AS date)` (Ibis writes `.date()` so)."""
    return isinstance(node, exp.Date) and not node.args.get("zone") and not node.expressions


def _make_date_parts(node: exp.Expression) -> list[exp.Expression] | None:
    """The arguments of `make_date(year, month, day)`: sqlglot reads it as an anonymous function, or
    as DateFromParts once a library (Ibis, loaded in the same process) has taught its PostgreSQL
    dialect the name."""
    if isinstance(node, exp.Anonymous) and node.name.lower() == "make_date":
        return list(node.expressions)
    if isinstance(node, exp.DateFromParts):
        return [node.args.get(k) for k in ("year", "month", "day")]  # type: ignore[misc]
    return None


def _is_make_date(node: exp.Expression) -> bool:
    """`make_date(year, month, day)` of three integer literals (Ibis writes `ibis.date(…)` so)."""
    parts = _make_date_parts(node)
    if parts is None or len(parts) != 3:
        return False
    return all(isinstance(a, exp.Literal) and not a.is_string and a.name.isdigit() for a in parts)


def _made_date(node: exp.Expression) -> dt.date:
    year, month, day = (int(a.name) for a in _make_date_parts(node) or ())
    if not 1 <= year <= 9999:
        raise _NotConstant  # year 0 is an error in PostgreSQL, later years are not dates dpproxy holds
    with field_overflow(
        f"date field value out of range: {year}-{month:02d}-{day:02d}",
        "make_date(year, month, day) takes a day that exists in that month",
    ):
        return dt.date(year, month, day)


def reads_clock(tree: exp.Expression) -> bool:
    """Whether the statement names now() or one of its friends: its plan holds the instant, so it is
    never cached nor replayed as another statement's."""
    return any(_is_clock(node) for node in tree.walk())


# -- intervals ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """An interval as PostgreSQL holds one: months, days and microseconds, each with its own sign."""

    months: int = 0
    days: int = 0
    micros: int = 0

    def __neg__(self) -> Span:
        return Span(-self.months, -self.days, -self.micros)

    def __add__(self, other: Span) -> Span:
        return Span(self.months + other.months, self.days + other.days, self.micros + other.micros)

    def times(self, factor: int) -> Span:
        return Span(self.months * factor, self.days * factor, self.micros * factor)


_MICROS = {"microsecond": 1, "millisecond": 1000, "second": 1_000_000, "minute": 60_000_000}
_MICROS["hour"] = 3_600_000_000
_UNITS = {  # PostgreSQL's spellings of interval units (singular, plural, abbreviations)
    **dict.fromkeys(("us", "usec", "usecs", "microsecond", "microseconds", "useconds"), "microsecond"),
    **dict.fromkeys(("ms", "msec", "msecs", "millisecond", "milliseconds", "mseconds"), "millisecond"),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), "second"),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), "minute"),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), "hour"),
    **dict.fromkeys(("d", "day", "days"), "day"),
    **dict.fromkeys(("w", "week", "weeks"), "week"),
    **dict.fromkeys(("mon", "mons", "month", "months"), "month"),
    **dict.fromkeys(("y", "yr", "yrs", "year", "years"), "year"),
    **dict.fromkeys(("decade", "decades"), "decade"),
    **dict.fromkeys(("century", "centuries"), "century"),
    **dict.fromkeys(("millennium", "millennia", "millenniums"), "millennium"),
}
_MONTHS = {"month": 1, "year": 12, "decade": 120, "century": 1200, "millennium": 12000}
_TOKEN = re.compile(
    r"\s*(?:(?P<clock>[+-]?\d+:\d{1,2}(?::\d{1,2}(?:\.\d+)?)?)"
    r"|(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?P<unit>[a-z]+)?|(?P<ago>ago))",
    re.IGNORECASE,
)


def _interval_error(text: str) -> InvalidDatetime:
    return InvalidDatetime(
        f"invalid input syntax for type interval: {text!r}",
        hint="write an interval as PostgreSQL reads it, e.g. INTERVAL '30 days', INTERVAL '1 month', "
        "INTERVAL '-2 hours', INTERVAL '1 day 02:00:00'",
    )


def _part(number: Decimal, unit: str, text: str) -> Span:
    """`number unit` as months, days and microseconds; fractions spill down as PostgreSQL's do (a
    month is 30 days, a day 24 hours)."""
    if unit in _MONTHS:
        months = number * _MONTHS[unit]
        whole = int(months)
        return Span(whole, 0, 0) + _part(months - whole, "month-fraction", text)
    if unit == "month-fraction":
        days = number * 30
        whole = int(days)
        return Span(0, whole, 0) + _part(days - whole, "day", text) if days != whole else Span(0, whole, 0)
    if unit in ("day", "week"):
        days = number * (7 if unit == "week" else 1)
        whole = int(days)
        return Span(0, whole, int((days - whole) * 86_400_000_000))
    if unit in _MICROS:
        return Span(0, 0, int(number * _MICROS[unit]))
    raise _interval_error(text)


def parse_interval(text: str, unit: str | None = None) -> Span:
    """An interval's text as PostgreSQL's input function reads the usual spellings: numbers with
    units (`'30 days'`, `'-30 day'`, `'1 year 2 mons'`), a time of day (`'02:30:00'`), `ago`; with a
    `unit` (`INTERVAL '30' DAY`), a bare number in that unit."""
    body = text.strip()
    if unit is not None and re.fullmatch(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)", body):
        body = f"{body} {unit}"
    span, position, ago, found = Span(), 0, False, False
    while position < len(body):
        match = _TOKEN.match(body, position)
        if match is None or match.end() == position:
            if body[position:].strip() == "":
                break
            raise _interval_error(text)
        position = match.end()
        if match["ago"]:
            ago = True
            continue
        found = True
        if match["clock"]:
            sign = -1 if match["clock"].startswith("-") else 1
            fields = match["clock"].lstrip("+-").split(":")
            seconds = Decimal(fields[2]) if len(fields) > 2 else Decimal(0)
            total = (int(fields[0]) * 3600 + int(fields[1]) * 60) * 1_000_000 + int(seconds * 1_000_000)
            span += Span(0, 0, sign * total)
            continue
        name = _UNITS.get((match["unit"] or "second").lower())
        if name is None or ago:
            raise _interval_error(text)
        try:
            span += _part(Decimal(match["number"]), name, text)
        except InvalidOperation:
            raise _interval_error(text) from None
    if not found:
        raise _interval_error(text)
    return -span if ago else span


# -- values -------------------------------------------------------------------------------------

# A constant's value: a date, a naive datetime (timestamp), an aware one in UTC (timestamptz), a Span
# (interval) or an int (integer).
Value = tuple[object, object]  # (PgType or INTERVAL, value)

INTERVAL = "interval"

_TEMPORAL = (PgType.DATE, PgType.TIMESTAMP, PgType.TIMESTAMPTZ)


class _NotConstant(Exception):
    """The expression is not a constant this module folds: left for the analyzer."""


def _overflow(what: str) -> DatetimeFieldOverflow:
    return DatetimeFieldOverflow(
        f"{what} out of range: dates and times must lie within years 1–9999",
        hint="use a smaller interval or a nearer date",
    )


def _add_months(value: dt.datetime, months: int) -> dt.datetime:
    total = value.year * 12 + value.month - 1 + months
    year, month = divmod(total, 12)
    if not 1 <= year <= 9999:
        raise _overflow("timestamp")
    day = min(value.day, calendar.monthrange(year, month + 1)[1])
    return value.replace(year=year, month=month + 1, day=day)


def _local(instant: dt.datetime, zone: dt.tzinfo) -> dt.datetime:
    return instant.astimezone(zone).replace(tzinfo=None)


def _instant(local: dt.datetime, zone: dt.tzinfo) -> dt.datetime:
    return local.replace(tzinfo=zone).astimezone(dt.UTC)


def _plus(value: Value, span: Span, zone: dt.tzinfo) -> Value:
    """A date, timestamp or timestamptz plus an interval (PostgreSQL: months, then days, then time)."""
    kind, moment = value
    try:
        if kind is PgType.TIMESTAMPTZ:
            assert isinstance(moment, dt.datetime)
            if span.months:
                moment = _instant(_add_months(_local(moment, zone), span.months), zone)
            if span.days:
                moment = _instant(_local(moment, zone) + dt.timedelta(days=span.days), zone)
            result: dt.datetime = moment + dt.timedelta(microseconds=span.micros)
            if not 1 <= result.year <= 9999:
                raise _overflow("timestamp")
            return kind, result
        if kind is PgType.DATE:
            assert isinstance(moment, dt.date)
            moment, kind = dt.datetime.combine(moment, dt.time()), PgType.TIMESTAMP
        assert isinstance(moment, dt.datetime)
        result = _add_months(moment, span.months) + dt.timedelta(days=span.days, microseconds=span.micros)
        return kind, result
    except OverflowError:
        raise _overflow("timestamp") from None


def _cast(value: Value, target: PgType, zone: dt.tzinfo) -> Value:
    kind, moment = value
    if kind is target:
        return value
    if kind is PgType.DATE and isinstance(moment, dt.date):
        midnight = dt.datetime.combine(moment, dt.time())
        return (target, midnight) if target is PgType.TIMESTAMP else (target, _instant(midnight, zone))
    if kind is PgType.TIMESTAMP and isinstance(moment, dt.datetime):
        return (target, moment.date()) if target is PgType.DATE else (target, _instant(moment, zone))
    if kind is PgType.TIMESTAMPTZ and isinstance(moment, dt.datetime):
        local = _local(moment, zone)
        return (target, local.date()) if target is PgType.DATE else (target, local)
    raise _NotConstant


def _rounded(moment: dt.datetime, precision: exp.Expression | None) -> dt.datetime:
    if not isinstance(precision, exp.Literal) or precision.is_string:
        return moment
    digits = min(6, max(0, int(precision.name)))
    step = 10 ** (6 - digits)
    micros = moment.microsecond
    extra = (micros + step // 2) // step * step - micros  # half up, as PostgreSQL rounds
    return moment + dt.timedelta(microseconds=extra)


class _Evaluator:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def value(self, node: exp.Expression) -> Value:
        zone = self.clock.zone
        if isinstance(node, exp.Paren):
            return self.value(node.this)
        if isinstance(node, exp.CurrentTimestamp) or (
            isinstance(node, exp.Anonymous) and node.name.lower() in _CLOCK_FUNCTIONS and not node.expressions
        ):
            instant = self.clock.instant.astimezone(dt.UTC)
            precision = node.args.get("this") if isinstance(node, exp.CurrentTimestamp) else None
            return PgType.TIMESTAMPTZ, _rounded(instant, precision)
        if isinstance(node, exp.Localtimestamp):
            local = _local(self.clock.instant, zone)
            return PgType.TIMESTAMP, _rounded(local, node.args.get("this"))
        if isinstance(node, exp.CurrentDate):
            return PgType.DATE, _local(self.clock.instant, zone).date()
        if isinstance(node, exp.Literal) and not node.is_string:
            number = Decimal(node.name)
            if number != number.to_integral_value() or "." in node.name:
                raise _NotConstant
            return PgType.INT4, int(number)
        if isinstance(node, exp.Interval):
            if not isinstance(node.this, exp.Literal):
                raise _NotConstant
            unit = node.args.get("unit")
            return INTERVAL, parse_interval(node.this.name, unit.name if unit is not None else None)
        if isinstance(node, exp.Neg):
            kind, inner = self.value(node.this)
            if isinstance(inner, Span):
                return kind, -inner
            if isinstance(inner, int):
                return kind, -inner
            raise _NotConstant
        if isinstance(node, exp.Cast):
            return self._cast(node)
        if _is_date_call(node):
            return self._cast(exp.Cast(this=node.this.copy(), to=exp.DataType.build(exp.DataType.Type.DATE)))
        if _is_make_date(node):
            return PgType.DATE, _made_date(node)
        if isinstance(node, (exp.Add, exp.Sub)):
            return self._arithmetic(node)
        if isinstance(node, exp.Mul):
            left, right = self.value(node.this), self.value(node.expression)
            span, factor = (left[1], right[1]) if isinstance(left[1], Span) else (right[1], left[1])
            if isinstance(span, Span) and isinstance(factor, int) and not isinstance(factor, bool):
                return INTERVAL, span.times(factor)
            raise _NotConstant
        if isinstance(node, exp.TimestampTrunc):
            unit = node.args.get("unit")
            if unit is None:
                raise _NotConstant
            kind, moment = self.value(node.this)
            if kind is PgType.DATE:
                kind, moment = _cast((kind, moment), PgType.TIMESTAMP, zone)
            if kind is PgType.TIMESTAMP and isinstance(moment, dt.datetime):
                return kind, date_buckets.truncate(moment, unit.name.lower())
            if kind is PgType.TIMESTAMPTZ and isinstance(moment, dt.datetime):
                return kind, _instant(date_buckets.truncate(_local(moment, zone), unit.name.lower()), zone)
            raise _NotConstant
        raise _NotConstant

    def _cast(self, node: exp.Cast) -> Value:
        target = from_sqlglot(node.args["to"])
        inner = node.this
        if (
            node.args["to"].this is exp.DataType.Type.INTERVAL
            and isinstance(inner, exp.Literal)
            and inner.is_string
        ):
            return INTERVAL, parse_interval(inner.name)
        if target not in _TEMPORAL:
            raise _NotConstant
        if isinstance(inner, exp.Literal) and inner.is_string:
            parsed = parse_temporal(inner.name, target)
            if target is PgType.DATE and isinstance(parsed, dt.datetime):
                parsed = parsed.date()
            return target, parsed
        kind, moment = self.value(inner)
        if kind not in _TEMPORAL:
            raise _NotConstant
        return _cast((kind, moment), target, self.clock.zone)

    def _arithmetic(self, node: exp.Add | exp.Sub) -> Value:
        left, right = self.value(node.this), self.value(node.expression)
        minus = isinstance(node, exp.Sub)
        if isinstance(node, exp.Add) and left[0] not in _TEMPORAL and right[0] in _TEMPORAL:
            left, right = right, left  # integer + date, interval + timestamp
        (kind, a), (other, b) = left, right
        if kind is INTERVAL and other is INTERVAL:
            assert isinstance(a, Span) and isinstance(b, Span)
            return kind, a + (-b if minus else b)
        if kind not in _TEMPORAL:
            raise _NotConstant
        if other is INTERVAL and isinstance(b, Span):
            return _plus(left, -b if minus else b, self.clock.zone)
        if kind is PgType.DATE and isinstance(a, dt.date):
            if other is PgType.INT4 and isinstance(b, int):
                try:
                    result = a + dt.timedelta(days=-b if minus else b)
                except OverflowError:
                    raise _overflow("date") from None
                return kind, result
            if other is PgType.DATE and minus and isinstance(b, dt.date):
                return PgType.INT4, (a - b).days
        raise _NotConstant


def _constant(value: Value) -> exp.Expression:
    kind, moment = value
    if kind is PgType.INT4:
        assert isinstance(moment, int)
        return exp.Paren(this=exp.Literal.number(moment)) if moment < 0 else exp.Literal.number(moment)
    assert isinstance(moment, dt.date)
    if kind is PgType.DATE:
        text = moment.isoformat()
    else:
        assert isinstance(moment, dt.datetime)
        if not 1 <= moment.year <= 9999:
            raise _overflow("timestamp")
        text = moment.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
        text += "+00" if kind is PgType.TIMESTAMPTZ else ""
    type_name = {PgType.DATE: "DATE", PgType.TIMESTAMP: "TIMESTAMP", PgType.TIMESTAMPTZ: "TIMESTAMPTZ"}[kind]
    return exp.Cast(this=exp.Literal.string(text), to=exp.DataType.build(type_name))


def _candidate(node: exp.Expression) -> bool:
    """Whether a node is worth folding: the clock, or arithmetic, truncation or a cast over a date or
    time (a typed constant alone is left as written)."""
    if _is_clock(node) or _is_date_call(node) or _is_make_date(node):
        return True
    if isinstance(node, (exp.Add, exp.Sub, exp.TimestampTrunc)):
        return True
    if isinstance(node, exp.Cast):
        return not isinstance(node.this, exp.Literal)
    return False


def fold_clock(tree: exp.Expression) -> exp.Expression:
    """The statement with now() and its friends, and constant date and interval arithmetic over them
    and over typed constants, replaced by typed constants (`CAST('2024-05-01' AS DATE)`), evaluated
    at the statement's clock (`current_clock`). Anything not constant is left for the analyzer."""
    if not any(
        _is_clock(n) or _is_date_call(n) or _is_make_date(n) or isinstance(n, (exp.Interval, exp.Cast))
        for n in tree.walk()
    ):
        return tree
    evaluator = _Evaluator(current_clock())

    def fold(node: exp.Expression) -> exp.Expression:
        if not _candidate(node):
            return node
        try:
            kind, value = evaluator.value(node)
        except _NotConstant:
            return node
        except (ArithmeticError, ValueError):
            if any(_is_clock(n) for n in node.walk()):
                raise _overflow("date or time") from None
            return node
        except DPProxyError:
            if any(_is_clock(n) or _is_make_date(n) for n in node.walk()):
                raise
            return node  # a typed constant's own error, reported by the analyzer as before
        if kind is INTERVAL:
            return node
        if kind is PgType.INT4 and not any(_is_clock(n) or isinstance(n, exp.Cast) for n in node.walk()):
            return node  # integer arithmetic is the analyzer's
        constant = _constant((kind, value))
        parent = node.parent
        if isinstance(parent, exp.Select) and any(item is node for item in parent.expressions):
            name = exp.to_identifier(output_name(node), quoted=True)  # the name PostgreSQL gives it
            return exp.Alias(this=constant, alias=name)
        return constant

    return _fold_outermost(tree.copy(), fold)


def _fold_outermost(tree: exp.Expression, fold: Callable[[exp.Expression], exp.Expression]) -> exp.Expression:
    """Replace the outermost foldable subtrees (pre-order: a folded node's children are not visited)."""
    stack = [tree]
    root = tree
    while stack:
        node = stack.pop()
        folded = fold(node)
        if folded is not node:
            if node is root:
                root = folded
            else:
                node.replace(folded)
            continue
        stack.extend(child for child in node.iter_expressions())
    return root
