"""PostgreSQL's text formats: result values written as PostgreSQL 15 writes them, and parameters read
as its input functions read them.

Floats in the shortest round-trip form of extra_float_digits ≥ 1 (and %g below), booleans t/f,
ISO dates and timestamps, timestamptz in the session's TimeZone, bytea in hex. Values and text
only: this module never sees bytes of the binary formats (binary.py), SQL, a session or a socket.
Errors quote the client's own parameter text, never a result value.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from dpproxy.errors import InvalidDatetime, InvalidText, NotSupported, ValueOutOfRange
from dpproxy.sql.types import boolean_from_text
from dpproxy.wire.types.registry import INT_NAMES, INT_RANGES, UTC, TextFormat

# ---------------------------------------------------------------------------------------------
# Text output
# ---------------------------------------------------------------------------------------------


def bool_text(value: object, _: TextFormat) -> str:
    return "t" if value else "f"


def int_text(value: object, _: TextFormat) -> str:
    return str(int(value))  # type: ignore[call-overload]


def _shortest_digits(value: float, single: bool) -> tuple[str, int]:
    """The digits PostgreSQL's Ryu output gives a positive finite `value` (as float4 when `single`),
    and the decimal exponent of the first digit.

    Python's repr and numpy's unique formatting give the shortest digits that read back as the
    value, nearest to it, as Ryu does; but PostgreSQL builds Ryu without STRICTLY_SHORTEST, so a
    candidate lying exactly on the rounding boundary is refused and more digits are used.
    """
    if single:
        import numpy

        text = numpy.format_float_scientific(numpy.float32(value), unique=True)
    else:
        text = repr(value)
    if _on_rounding_boundary(text, value, single):
        precision = len(Decimal(text).as_tuple().digits) + 1
        while True:
            text = f"{value:.{precision - 1}e}"
            if not _on_rounding_boundary(text, value, single):
                break
            precision += 1
    _, digit_tuple, exponent = Decimal(text).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0") or "0"
    exponent = int(exponent) + len(digit_tuple) - len(digits)
    return digits, len(digits) - 1 + exponent


def _on_rounding_boundary(text: str, value: float, single: bool) -> bool:
    """True when the decimal `text` is not strictly between the midpoints to `value`'s neighbours."""
    if single:
        import numpy

        x32 = numpy.float32(value)
        below = float(numpy.nextafter(x32, numpy.float32(0)))
        above = float(numpy.nextafter(x32, numpy.float32(numpy.inf)))
    else:
        below, above = math.nextafter(value, 0.0), math.nextafter(value, math.inf)
    exact, candidate = Fraction(value), Fraction(Decimal(text))
    low = (exact + Fraction(below)) / 2
    # Above the largest finite value, the next one would be as far as the one below.
    high = (exact + Fraction(above)) / 2 if math.isfinite(above) else exact + (exact - low)
    return not low < candidate < high


def float_to_text(value: float, fmt: TextFormat, single: bool) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if fmt.extra_float_digits <= 0:
        # PostgreSQL's %.*g output with FLT_DIG/DBL_DIG + extra_float_digits significant digits.
        precision = max(1, (6 if single else 15) + fmt.extra_float_digits)
        text = f"{value:.{precision}g}"
        return text
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    digits, exp10 = _shortest_digits(abs(value), single)
    sign = "-" if value < 0 else ""
    # Fixed notation for display exponents in [-4, 15) (float8) or [-4, 6) (float4), as d2s.c/f2s.c.
    if -4 <= exp10 < (6 if single else 15):
        if exp10 < 0:
            return f"{sign}0.{'0' * (-exp10 - 1)}{digits}"
        if len(digits) <= exp10 + 1:
            return sign + digits + "0" * (exp10 + 1 - len(digits))
        return f"{sign}{digits[: exp10 + 1]}.{digits[exp10 + 1 :]}"
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{mantissa}e{'+' if exp10 >= 0 else '-'}{abs(exp10):02d}"


def float8_text(value: object, fmt: TextFormat) -> str:
    return float_to_text(float(value), fmt, single=False)  # type: ignore[arg-type]


def float4_text(value: object, fmt: TextFormat) -> str:
    return float_to_text(float(value), fmt, single=True)  # type: ignore[arg-type]


def as_decimal(value: object) -> Decimal:
    if isinstance(value, Decimal):
        return value
    if isinstance(value, float):
        return Decimal(repr(value)) if math.isfinite(value) else Decimal(str(value))
    return Decimal(value)  # type: ignore[arg-type]


def numeric_text(value: object, _: TextFormat) -> str:
    if isinstance(value, int):
        return str(int(value))
    number = as_decimal(value)
    if number.is_nan():
        return "NaN"
    if number.is_infinite():
        return "Infinity" if number > 0 else "-Infinity"
    if number.is_zero():
        number = abs(number)  # PostgreSQL has no negative zero numeric
    return format(number, "f")


def str_text(value: object, _: TextFormat) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        # An array of a type this table does not know (aclitem[] …): PostgreSQL's array text with
        # each element's own text, never Python's list repr.
        return _untyped_array_text(value)
    return str(value)


def _untyped_array_text(value: list[object] | tuple[object, ...]) -> str:
    items = (
        _untyped_array_text(v)
        if isinstance(v, (list, tuple))
        else "NULL"
        if v is None
        else array_item_text(v if isinstance(v, str) else str(v))
        for v in value
    )
    return "{" + ",".join(items) + "}"


def date_text(value: object, _: TextFormat) -> str:
    if isinstance(value, dt.datetime):
        value = value.date()
    assert isinstance(value, dt.date)
    return value.isoformat()


def _clock(value: dt.datetime | dt.time) -> str:
    text = f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}"
    if value.microsecond:
        text += "." + f"{value.microsecond:06d}".rstrip("0")
    return text


def timestamp_text(value: object, _: TextFormat) -> str:
    if not isinstance(value, dt.datetime):
        value = dt.datetime.combine(value, dt.time())  # type: ignore[arg-type]
    return f"{value.year:04d}-{value.month:02d}-{value.day:02d} {_clock(value)}"


def _utc_offset(offset: dt.timedelta) -> str:
    seconds = int(offset.total_seconds())
    sign = "+" if seconds >= 0 else "-"
    hours, rest = divmod(abs(seconds), 3600)
    minutes, seconds = divmod(rest, 60)
    text = f"{sign}{hours:02d}"
    if minutes or seconds:
        text += f":{minutes:02d}"
    if seconds:
        text += f":{seconds:02d}"
    return text


def aware(value: object) -> dt.datetime:
    if not isinstance(value, dt.datetime):
        value = dt.datetime.combine(value, dt.time())  # type: ignore[arg-type]
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def timestamptz_text(value: object, fmt: TextFormat) -> str:
    local = aware(value).astimezone(fmt.timezone)
    offset = local.utcoffset() or dt.timedelta(0)
    return timestamp_text(local.replace(tzinfo=None), fmt) + _utc_offset(offset)


def time_text(value: object, _: TextFormat) -> str:
    assert isinstance(value, (dt.time, dt.datetime))
    return _clock(value)


def interval_text(value: object, _: TextFormat) -> str:
    assert isinstance(value, dt.timedelta)
    total = value.days * 86_400_000_000 + value.seconds * 1_000_000 + value.microseconds
    sign = "-" if total < 0 else ""
    days, micros = divmod(abs(total), 86_400_000_000)
    parts = []
    if days:
        parts.append(f"{sign}{days} day{'s' if days != 1 or sign else ''}")
    if micros or not days:
        seconds, us = divmod(micros, 1_000_000)
        minutes, seconds = divmod(seconds, 60)
        hours, minutes = divmod(minutes, 60)
        clock = f"{hours:02d}:{minutes:02d}:{seconds:02d}" + ("." + f"{us:06d}".rstrip("0") if us else "")
        parts.append(f"{sign}{clock}" if sign else clock)
    return " ".join(parts)


def bytea_text(value: object, _: TextFormat) -> str:
    return "\\x" + bytes(value).hex()  # type: ignore[arg-type]


def char_text(value: object, _: TextFormat) -> str:
    if isinstance(value, (bytes, bytearray)):
        return value.decode("latin-1")
    return str(value)


def void_text(value: object, _: TextFormat) -> str:
    return ""


_ARRAY_SPECIAL = re.compile(r'[{}",\\\s]')


def array_item_text(text: str) -> str:
    if text == "" or text.upper() == "NULL" or _ARRAY_SPECIAL.search(text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


# ---------------------------------------------------------------------------------------------
# Text input (parameters)
# ---------------------------------------------------------------------------------------------

_INTEGER_TEXT = re.compile(r"\s*[+-]?\d+\s*")
_FLOAT_TEXT = re.compile(
    r"\s*[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|nan|inf|infinity)\s*", re.IGNORECASE
)
_NUMERIC_TEXT = _FLOAT_TEXT


def _syntax(type_name: str, text: str) -> InvalidText:
    return InvalidText(f'invalid input syntax for type {type_name}: "{text}"')


def _integer(text: str, sql_name: str, low: int, high: int) -> int:
    """An integer parameter of the type `sql_name`: 22P02 if it is not an integer, 22003 outside
    [low, high]."""
    if not _INTEGER_TEXT.fullmatch(text):
        raise _syntax(sql_name, text)
    number = int(text)
    if not low <= number <= high:
        raise ValueOutOfRange(f'value "{text.strip()}" is out of range for type {sql_name}')
    return number


def int_from_text(type_name: str) -> Callable[[str], object]:
    low, high = INT_RANGES[type_name]
    return functools.partial(_integer, sql_name=INT_NAMES[type_name], low=low, high=high)


def uint4_from_text(text: str) -> object:
    # As PostgreSQL's oidin: a negative number down to -2**31 stands for its unsigned 32-bit value.
    return _integer(text, "oid", -(2**31), 2**32 - 1) & 0xFFFFFFFF


def float_from_text(type_name: str) -> Callable[[str], object]:
    def decode(text: str) -> object:
        if not _FLOAT_TEXT.fullmatch(text):
            raise _syntax(type_name, text)
        value = float(text)
        if type_name == "real" and math.isfinite(value) and abs(value) > 3.4028234663852886e38:
            raise ValueOutOfRange(f'"{text.strip()}" is out of range for type real')
        return value

    return decode


def numeric_from_text(text: str) -> object:
    if not _NUMERIC_TEXT.fullmatch(text):
        raise _syntax("numeric", text)
    try:
        return Decimal(text.strip())
    except InvalidOperation:
        raise _syntax("numeric", text) from None


def bool_from_text(text: str) -> object:
    # PostgreSQL's parse_bool: any unique prefix of true/false/yes/no, "on"/"off" (at least 2
    # letters, since "o" is ambiguous), 1 and 0.
    value = boolean_from_text(text)
    if value is None:
        raise _syntax("boolean", text)
    return value


def str_from_text(text: str) -> object:
    return text


def date_from_text(text: str) -> object:
    stripped = text.strip()
    if stripped.lower() in ("infinity", "-infinity", "+infinity"):
        raise NotSupported("infinite dates are not supported as parameters")
    try:
        return dt.date.fromisoformat(stripped)
    except ValueError:
        pass
    # As date_in: a time and a time zone may follow, and are ignored (pgjdbc's setDate sends
    # "2015-01-01 +00").
    return _parse_timestamp(text, "date").date()


# ISO dates and times as PostgreSQL reads them but Python's fromisoformat does not: a space before
# the zone, an hour-only or "Z"/"UTC" zone, more than 6 fractional digits (pgjdbc, node-postgres).
_TIMESTAMP_TEXT = re.compile(
    r"\s*(\d{4,})-(\d{1,2})-(\d{1,2})"
    r"(?:(?:T|\s+)(\d{1,2}):(\d{2})(?::(\d{2})(?:\.(\d+))?)?)?"
    r"\s*(?:(Z|UTC|GMT)|([+-])(\d{1,2})(?::?(\d{2}))?(?::?(\d{2}))?)?\s*",
    re.IGNORECASE,
)


def _parse_timestamp(text: str, type_name: str) -> dt.datetime:
    stripped = text.strip()
    if stripped.lower() in ("infinity", "-infinity", "+infinity"):
        raise NotSupported(f"infinite values of type {type_name} are not supported as parameters")
    try:
        return dt.datetime.fromisoformat(stripped)
    except ValueError:
        pass
    match = _TIMESTAMP_TEXT.fullmatch(text)
    try:
        if match is None:
            raise ValueError(text)
        year, month, day, hour, minute, second, fraction, utc, sign, zh, zm, zs = match.groups()
        micros = int((fraction or "0")[:6].ljust(6, "0"))
        tz: dt.tzinfo | None = None
        if utc:
            tz = UTC
        elif sign:
            offset = dt.timedelta(hours=int(zh), minutes=int(zm or 0), seconds=int(zs or 0))
            tz = dt.timezone(-offset if sign == "-" else offset)
        return dt.datetime(
            int(year), int(month), int(day), int(hour or 0), int(minute or 0), int(second or 0), micros, tz
        )
    except ValueError:
        raise InvalidDatetime(f'invalid input syntax for type {type_name}: "{text}"') from None


def timestamp_from_text(text: str) -> object:
    # PostgreSQL ignores a time zone given in a timestamp without time zone.
    return _parse_timestamp(text, "timestamp").replace(tzinfo=None)


def timestamptz_from_text(text: str, fmt: TextFormat) -> object:
    value = _parse_timestamp(text, "timestamp with time zone")
    if value.tzinfo is None:
        value = value.replace(tzinfo=fmt.timezone)
    return value.astimezone(UTC)


def time_from_text(text: str) -> object:
    try:
        return dt.time.fromisoformat(text.strip())
    except ValueError:
        raise InvalidDatetime(f'invalid input syntax for type time: "{text}"') from None


def bytea_from_text(text: str) -> object:
    if text.startswith("\\x"):
        try:
            return bytes.fromhex(text[2:])
        except ValueError:
            raise InvalidText(f'invalid hexadecimal data in bytea input: "{text}"') from None
    out = bytearray()
    i = 0
    raw = text.encode()
    while i < len(raw):
        if raw[i : i + 1] != b"\\":
            out.append(raw[i])
            i += 1
        elif raw[i + 1 : i + 2] == b"\\":
            out.append(0x5C)
            i += 2
        elif re.fullmatch(rb"[0-3][0-7][0-7]", raw[i + 1 : i + 4]):
            out.append(int(raw[i + 1 : i + 4], 8))
            i += 4
        else:
            raise InvalidText("invalid input syntax for type bytea")
    return bytes(out)
