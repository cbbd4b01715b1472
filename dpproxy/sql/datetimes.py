"""Date and time text as PostgreSQL reads it: the input functions of date, timestamp and timestamptz
(for string constants compared with or cast to those types), and the format patterns of to_date and
to_timestamp (whose calls on constants are folded into constants at plan time).

PostgreSQL's input functions accept ISO 8601 in several spellings (`2023-01-01T00:00:00Z`, as
Grafana's `$__timeFilter` writes it; `2023-01-01 00:00:00+05:30`; `20230101`). A date drops the
time of day and the zone; a timestamp ignores the zone; a timestamptz is moved to UTC (the session
time zone of every backend; text without a zone is read in it). Anything else PostgreSQL would read
(month names, 'epoch', 'now', named zones) is refused with 22007 and a hint: only the query text is
read here, never data.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import ROUND_HALF_EVEN, Decimal

from sqlglot import exp

from dpproxy.errors import DatetimeFieldOverflow, InvalidDatetime, NotSupported
from dpproxy.sql.intervals import Interval
from dpproxy.sql.types import PgType

_ISO = re.compile(
    r"""^\s*
    (?:(?P<year>\d{4})-(?P<month>\d{1,2})-(?P<day>\d{1,2}) | (?P<compact>\d{8}))
    (?:(?:[Tt]|\s+)
       (?P<hour>\d{1,2}):(?P<minute>\d{2})(?::(?P<second>\d{2})(?:\.(?P<fraction>\d+))?)?
    )?
    \s*(?P<zone>[Zz]|UTC|utc|GMT|gmt|[+-]\d{1,2}(?::?\d{2}(?::?\d{2})?)?)?
    \s*$""",
    re.VERBOSE,
)

EXAMPLE = "e.g. '2024-01-31', '2024-01-31 12:00:00', '2024-01-31T12:00:00Z'"


def _invalid(text: str, target: PgType) -> InvalidDatetime:
    return InvalidDatetime(
        f"invalid input syntax for type {target.value}: {text!r}",
        hint=f"write dates and times in ISO 8601 ({EXAMPLE})",
    )


def _zone_offset(zone: str) -> dt.timedelta:
    if zone.upper() in ("Z", "UTC", "GMT"):
        return dt.timedelta(0)
    sign = -1 if zone[0] == "-" else 1
    digits = zone[1:].replace(":", "")
    if ":" not in zone[1:] and len(digits) in (1, 2):
        hours, minutes, seconds = int(digits), 0, 0
    else:
        digits = digits.zfill(2 + 2 * ((len(digits) - 1) // 2))
        hours, minutes = int(digits[:2]), int(digits[2:4] or 0)
        seconds = int(digits[4:6] or 0)
    if hours > 15 or minutes > 59 or seconds > 59:
        raise ValueError(zone)
    return sign * dt.timedelta(hours=hours, minutes=minutes, seconds=seconds)


@contextmanager
def field_overflow(
    message: str, hint: str, *, catching: tuple[type[Exception], ...] = (ValueError,)
) -> Iterator[None]:
    """A date or time that Python refuses to build inside the block (a day its month does not have,
    a year outside 1–9999, …: `catching`) refused as PostgreSQL refuses it: 22008 with `message`."""
    try:
        yield
    except catching:
        raise DatetimeFieldOverflow(message, hint=hint) from None


def parse_temporal(text: str, target: PgType) -> dt.date | dt.datetime:
    """The value of `text` read as a date, timestamp or timestamptz, as PostgreSQL's input function
    reads it (see the module docstring); a timestamptz is aware, in UTC. 22007 otherwise."""
    match = _ISO.match(text)
    if match is None:
        raise _invalid(text, target)
    g = match.groupdict()
    message = f"date/time field value out of range: {text!r} (for type {target.value})"
    hint = f"dates and times must lie within years 1–9999 and be valid ({EXAMPLE})"
    with field_overflow(message, hint, catching=(ValueError, OverflowError)):
        if g["compact"]:
            year, month, day = int(g["compact"][:4]), int(g["compact"][4:6]), int(g["compact"][6:])
        else:
            year, month, day = int(g["year"]), int(g["month"]), int(g["day"])
        date = dt.date(year, month, day)
        if target is PgType.DATE:
            if g["zone"] is not None:
                _zone_offset(g["zone"])  # PostgreSQL checks the zone, then drops it
            return date
        hour, minute = int(g["hour"] or 0), int(g["minute"] or 0)
        second = int(g["second"] or 0)
        micros = 0
        if g["fraction"]:
            micros = int((Decimal("0." + g["fraction"]) * 1_000_000).to_integral_value(ROUND_HALF_EVEN))
        extra = dt.timedelta(0)
        if hour == 24 and minute == 0 and second == 0 and micros == 0:
            hour, extra = 0, dt.timedelta(days=1)  # 24:00:00 is the next midnight, as in PostgreSQL
        if micros == 1_000_000:
            micros, extra = 0, extra + dt.timedelta(seconds=1)
        value = dt.datetime(year, month, day, hour, minute, second, micros) + extra
        if target is PgType.TIMESTAMPTZ:
            offset = _zone_offset(g["zone"]) if g["zone"] is not None else dt.timedelta(0)
            value = (value - offset).replace(tzinfo=dt.UTC)
        elif g["zone"] is not None:
            _zone_offset(g["zone"])  # a timestamp ignores a (valid) zone, as PostgreSQL does
        if not 1 <= value.year <= 9999:
            raise ValueError(text)
        return value


def temporal_text(value: dt.date | dt.datetime) -> str:
    """The ISO text both engines read back as the same value."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            return value.astimezone(dt.UTC).replace(tzinfo=None).isoformat(sep=" ") + "+00"
        return value.isoformat(sep=" ")
    return value.isoformat()


# to_date / to_timestamp patterns: (pattern, maximum digits). Longest first, case-insensitive.
_FIELDS = (("YYYY", 4), ("HH24", 2), ("US", 6), ("MS", 3), ("MI", 2), ("MM", 2), ("DD", 2), ("SS", 2))
_UNSUPPORTED_PATTERNS = (
    "FMDD", "FMMM", "FMHH24", "FM", "FX", "TM", "HH12", "HH", "AM", "PM", "A.M.", "P.M.", "MONTH",
    "MON", "DAY", "DY", "DDD", "IDDD", "IYYY", "IYY", "IY", "I", "YYY", "YY", "Y,YYY", "Y", "BC",
    "AD", "B.C.", "A.D.", "WW", "IW", "W", "D", "ID", "J", "Q", "RM", "CC", "TZH", "TZM", "TZ", "OF",
    "SSSSS", "SSSS", "Y",
)  # fmt: skip
_SUPPORTED_TEXT = 'YYYY, MM, DD, HH24, MI, SS, MS, US, separators (- / : . , space) and "quoted text"'


def _tokens(pattern: str, function: str) -> list[tuple[str, str]]:
    """The pattern as (kind, text) tokens: ("field", "YYYY"), ("separator", "-"), ("text", "T")."""
    tokens: list[tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        rest = pattern[i:].upper()
        char = pattern[i]
        if char == '"':
            end = pattern.find('"', i + 1)
            if end < 0:
                raise NotSupported(
                    f'unterminated quoted text in the {function}() pattern "{pattern}"',
                    hint=f"supported in {function}() patterns: {_SUPPORTED_TEXT}",
                )
            tokens.append(("text", pattern[i + 1 : end]))
            i = end + 1
            continue
        field = next((f for f, _ in _FIELDS if rest.startswith(f)), None)
        if field is not None:
            tokens.append(("field", field))
            i += len(field)
            continue
        if not char.isalnum():
            tokens.append(("separator", char))
            i += 1
            continue
        name = next((p for p in _UNSUPPORTED_PATTERNS if rest.startswith(p)), char)
        raise NotSupported(
            f'the pattern "{pattern[i : i + len(name)]}" of {function}() is not supported (in "{pattern}")',
            hint=f"supported in {function}() patterns: {_SUPPORTED_TEXT}",
        )
    return tokens


def _field_width(field: str) -> int:
    return dict(_FIELDS)[field]


def parse_with_pattern(text: str, pattern: str, function: str) -> dt.datetime:
    """`text` read by a to_date/to_timestamp `pattern`, as PostgreSQL reads it: leading spaces
    skipped, a separator of the pattern matching any one separator of the text (or none), a field
    reading up to its width in digits (all the digits before a separator), missing trailing fields
    taken as their first value, text after the pattern ignored."""
    tokens = _tokens(pattern, function)
    values: dict[str, str] = {}
    i = 0
    n = len(text)
    while i < n and text[i] == " ":
        i += 1
    for index, (kind, token) in enumerate(tokens):
        if i >= n:
            break
        if kind == "text":
            i += len(token)
        elif kind == "separator":
            if not text[i].isalnum():
                i += 1
            elif text[i].isalpha():
                raise InvalidDatetime(
                    f'invalid value "{text[i : i + 2]}" in {text!r} for the pattern "{pattern}" '
                    f"of {function}()",
                    hint="the text must match the pattern",
                )
        else:
            while i < n and text[i] == " ":
                i += 1
            width = _field_width(token)
            follows_separator = index + 1 == len(tokens) or tokens[index + 1][0] != "field"
            j = i
            while j < n and text[j].isdigit() and (follows_separator or j - i < width):
                j += 1
            digits = text[i:j]
            if not digits or len(digits) > width:
                raise InvalidDatetime(
                    f'invalid value "{text[i : i + width] or text[i:]}" for "{token}" in {text!r} '
                    f'({function}() with the pattern "{pattern}")',
                    hint="the text must match the pattern",
                )
            if token in values:
                raise InvalidDatetime(
                    f'conflicting values for the field "{token}" in {function}() pattern "{pattern}"'
                )
            values[token] = digits
            i = j
    with field_overflow(
        f'date/time field value out of range: {text!r} ({function}() with the pattern "{pattern}")',
        "dates and times must lie within years 1–9999 and be valid",
    ):
        micros = 0
        if "US" in values:
            micros = int(values["US"].ljust(6, "0"))
        if "MS" in values:
            micros += int(values["MS"].ljust(3, "0")) * 1000
        return dt.datetime(
            int(values.get("YYYY", "1")),
            int(values.get("MM", "1")),
            int(values.get("DD", "1")),
            int(values.get("HH24", "0")),
            int(values.get("MI", "0")),
            int(values.get("SS", "0")),
            micros,
        )


def _pattern_text(node: exp.Expression) -> str:
    """The pattern as the user wrote it: sqlglot turns PostgreSQL's patterns into strftime's, this
    turns them back (patterns sqlglot does not know are kept as written)."""
    from sqlglot.dialects.postgres import Postgres
    from sqlglot.time import format_time

    text = node.name
    return format_time(text, Postgres.INVERSE_TIME_MAPPING, Postgres.INVERSE_TIME_TRIE) or text


def fold_constant_calls(tree: exp.Expression) -> exp.Expression:
    """to_date(text, pattern), to_timestamp(text, pattern) and to_timestamp(seconds) of constants,
    replaced by the typed constant they evaluate to (`CAST('2020-01-01' AS DATE)`): functions of
    constants are constants, fixed at plan time. Calls on anything else are left for the analyzer."""
    calls = [n for n in tree.walk() if isinstance(n, (exp.StrToDate, exp.StrToTime, exp.UnixToTime))]
    calls = [c for c in calls if _constant_arguments(c)]
    if not calls:
        return tree
    tree = tree.copy()
    for node in [n for n in tree.walk() if isinstance(n, (exp.StrToDate, exp.StrToTime, exp.UnixToTime))]:
        if _constant_arguments(node):
            node.replace(_fold(node))
    return tree


def _constant_arguments(node: exp.Expression) -> bool:
    if isinstance(node, exp.UnixToTime):
        value = node.this.unnest() if isinstance(node.this, exp.Paren) else node.this
        plain = len([a for a in node.args.values() if a is not None]) == 1
        return plain and (
            (isinstance(value, exp.Literal) and not value.is_string) or isinstance(value, exp.Neg)
        )
    text, pattern = node.this, node.args.get("format")
    return (
        isinstance(text, exp.Literal)
        and text.is_string
        and isinstance(pattern, exp.Literal)
        and pattern.is_string
    )


def _fold(node: exp.Expression) -> exp.Expression:
    if isinstance(node, exp.UnixToTime):
        written = node.sql("postgres")
        inner = node.this.unnest() if isinstance(node.this, exp.Paren) else node.this
        with field_overflow(
            f"timestamp out of range: {written}",
            "to_timestamp(seconds) must give years 1–9999",
            catching=(ArithmeticError, ValueError, OverflowError),
        ):
            seconds = -Decimal(inner.this.name) if isinstance(inner, exp.Neg) else Decimal(inner.name)
            micros = int((seconds * 1_000_000).to_integral_value(ROUND_HALF_EVEN))
            value = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
        return _cast(temporal_text(value), "TIMESTAMPTZ")
    function = "to_date" if isinstance(node, exp.StrToDate) else "to_timestamp"
    pattern = _pattern_text(node.args["format"])
    value = parse_with_pattern(node.this.name, pattern, function)
    if function == "to_date":
        return _cast(value.date().isoformat(), "DATE")
    return _cast(temporal_text(value.replace(tzinfo=dt.UTC)), "TIMESTAMPTZ")


def _cast(text: str, type_name: str) -> exp.Expression:
    return exp.Cast(this=exp.Literal.string(text), to=exp.DataType.build(type_name))


# -- dates and times on a grid of integers, for MIN, MAX and percentile_disc ------------------------
# A date is released on a grid of whole days since 1970-01-01, a timestamp (or timestamptz, in UTC)
# on one of whole seconds since 1970-01-01 00:00:00: the exponential mechanism of numbers then picks
# a grid point, read back as a value of the column's type.

_EPOCH = dt.datetime(1970, 1, 1)
_MICROS_PER_DAY = 86_400_000_000


def epoch_micros(value: dt.date) -> int:
    """Microseconds since 1970-01-01 00:00:00 (UTC for an aware datetime; a date's midnight)."""
    if isinstance(value, dt.datetime):
        moment = value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo is not None else value
        return (moment - _EPOCH) // dt.timedelta(microseconds=1)
    return (value - _EPOCH.date()).days * _MICROS_PER_DAY


def epoch_grid(declared: tuple[dt.date, dt.date], pg_type: PgType) -> Interval:
    """A declared range on the epoch grid (days for a date, whole seconds within the range for a
    timestamp: values are clipped to it before rounding, so every grid value is in the range)."""
    lo, hi = (epoch_micros(v) for v in declared)
    if pg_type is PgType.DATE:
        return Interval(Decimal(lo // _MICROS_PER_DAY), Decimal(hi // _MICROS_PER_DAY))
    first, last = -(-lo // 1_000_000), hi // 1_000_000
    return Interval(Decimal(min(first, last)), Decimal(last))


def epoch_grid_sql(value: exp.Expression, pg_type: PgType) -> tuple[exp.Expression, bool]:
    """SQL of a date or time on the epoch grid, computed alike on every engine from whole
    microseconds (numbers.epoch_microseconds), and whether it is an exact integer: a date's days (a
    bigint: its microseconds are whole days), a timestamp's seconds as an exact decimal with six
    fractional digits, rounded to the grid as sums' values are."""
    from dpproxy.sql import numbers

    source = (
        exp.Cast(this=value, to=exp.DataType.build(exp.DataType.Type.TIMESTAMP))
        if pg_type is PgType.DATE
        else value
    )
    micros = numbers.cast(numbers.epoch_microseconds(source), "BIGINT")
    if pg_type is PgType.DATE:
        days = exp.Div(this=micros, expression=exp.Literal.number(_MICROS_PER_DAY), typed=True, safe=True)
        return numbers.cast(days, "BIGINT"), True
    seconds = exp.Mul(
        this=numbers.cast(micros, "DECIMAL(38, 0)"),
        expression=numbers.cast(exp.Literal.string("0.000001"), numbers.DECIMAL_TYPE),
    )
    return numbers.as_decimal(seconds), False


def from_epoch_grid(value: Decimal | int, pg_type: PgType) -> dt.date:
    """A grid value read back as a date, a timestamp or a timestamptz (aware, UTC)."""
    whole = int(Decimal(value).to_integral_value(ROUND_HALF_EVEN))
    if pg_type is PgType.DATE:
        return _EPOCH.date() + dt.timedelta(days=whole)
    moment = _EPOCH + dt.timedelta(seconds=whole)
    return moment.replace(tzinfo=dt.UTC) if pg_type is PgType.TIMESTAMPTZ else moment
