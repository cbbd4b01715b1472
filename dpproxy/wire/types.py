"""PostgreSQL types on the wire: OIDs, sizes, and text/binary encoders (results) and decoders (parameters).

One table, one row per type (after psycopg's types/ modules): adding a type is adding a row in
`_TYPE_IO`. Text output follows PostgreSQL 15 exactly for the types dpproxy releases (floats in
the shortest round-trip form of extra_float_digits ≥ 1, booleans t/f, ISO dates and timestamps,
timestamptz in the session's TimeZone); binary formats are PostgreSQL's send/recv formats.

This module knows values and bytes only: it never sees SQL, a session or a socket. Decoding errors
are DPProxyErrors whose messages quote the client's own parameter text, never a result value.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from dpproxy.errors import (
    InvalidBinary,
    InvalidDatetime,
    InvalidText,
    NoBinaryOutput,
    NotSupported,
    ValueOutOfRange,
)
from dpproxy.sql.types import PgType


@dataclass(frozen=True)
class WireType:
    name: str  # pg_type.typname
    oid: int
    size: int  # pg_type.typlen (-1: variable length)
    array_oid: int = 0


# The types dpproxy sends or receives; OIDs are PostgreSQL's fixed built-in ones (pg_type.dat).
WIRE_TYPES: tuple[WireType, ...] = (
    WireType("bool", 16, 1, 1000),
    WireType("bytea", 17, -1, 1001),
    WireType("char", 18, 1, 1002),
    WireType("name", 19, 64, 1003),
    WireType("int8", 20, 8, 1016),
    WireType("int2", 21, 2, 1005),
    WireType("int2vector", 22, -1, 1006),
    WireType("int4", 23, 4, 1007),
    WireType("regproc", 24, 4, 1008),
    WireType("text", 25, -1, 1009),
    WireType("oid", 26, 4, 1028),
    WireType("xid", 28, 4, 1011),
    WireType("oidvector", 30, -1, 1013),
    WireType("aclitem", 1033, 12, 1034),
    WireType("pg_node_tree", 194, -1, 0),
    WireType("float4", 700, 4, 1021),
    WireType("float8", 701, 8, 1022),
    WireType("unknown", 705, -2, 0),
    WireType("bpchar", 1042, -1, 1014),
    WireType("varchar", 1043, -1, 1015),
    WireType("date", 1082, 4, 1182),
    WireType("time", 1083, 8, 1183),
    WireType("timestamp", 1114, 8, 1115),
    WireType("timestamptz", 1184, 8, 1185),
    WireType("interval", 1186, 16, 1187),
    WireType("numeric", 1700, -1, 1231),
    WireType("regprocedure", 2202, 4, 2207),
    WireType("regoper", 2203, 4, 2208),
    WireType("regoperator", 2204, 4, 2209),
    WireType("regclass", 2205, 4, 2210),
    WireType("regtype", 2206, 4, 2211),
    WireType("regconfig", 3734, 4, 3735),
    WireType("regdictionary", 3769, 4, 3770),
    WireType("regnamespace", 4089, 4, 4090),
    WireType("regrole", 4096, 4, 4097),
    WireType("regcollation", 4191, 4, 4192),
    WireType("void", 2278, 4, 0),
    WireType("uuid", 2950, 16, 2951),
    WireType("jsonb", 3802, -1, 3807),
    WireType("json", 114, -1, 199),
)

BY_OID: dict[int, WireType] = {t.oid: t for t in WIRE_TYPES}
BY_NAME: dict[str, WireType] = {t.name: t for t in WIRE_TYPES}

_FROM_PGTYPE = {
    PgType.INT2: "int2",
    PgType.INT4: "int4",
    PgType.INT8: "int8",
    PgType.NUMERIC: "numeric",
    PgType.FLOAT4: "float4",
    PgType.FLOAT8: "float8",
    PgType.TEXT: "text",
    PgType.VARCHAR: "varchar",
    PgType.BOOL: "bool",
    PgType.DATE: "date",
    PgType.TIMESTAMP: "timestamp",
    PgType.TIMESTAMPTZ: "timestamptz",
    PgType.UNKNOWN: "text",
}


def wire_type(pg_type: PgType) -> WireType:
    return BY_NAME[_FROM_PGTYPE[pg_type]]


@dataclass(frozen=True)
class WireColumn:
    """A result column as RowDescription describes it."""

    name: str
    type_oid: int
    type_size: int = -1
    type_modifier: int = -1
    table_oid: int = 0
    column_number: int = 0


# Types a client may give a parameter (Parse) that the engine understands; others are inferred.
_TO_PGTYPE: dict[int, PgType] = {
    BY_NAME["int2"].oid: PgType.INT2,
    BY_NAME["int4"].oid: PgType.INT4,
    BY_NAME["int8"].oid: PgType.INT8,
    BY_NAME["numeric"].oid: PgType.NUMERIC,
    BY_NAME["float4"].oid: PgType.FLOAT4,
    BY_NAME["float8"].oid: PgType.FLOAT8,
    BY_NAME["text"].oid: PgType.TEXT,
    BY_NAME["varchar"].oid: PgType.VARCHAR,
    BY_NAME["bpchar"].oid: PgType.TEXT,
    BY_NAME["name"].oid: PgType.TEXT,
    BY_NAME["bool"].oid: PgType.BOOL,
    BY_NAME["date"].oid: PgType.DATE,
    BY_NAME["timestamp"].oid: PgType.TIMESTAMP,
    BY_NAME["timestamptz"].oid: PgType.TIMESTAMPTZ,
}


def pg_type_of(type_oid: int) -> PgType | None:
    """The engine's type for a parameter OID a client declared; None: let the engine infer it."""
    return _TO_PGTYPE.get(type_oid)


def wire_column(name: str, pg_type: PgType) -> WireColumn:
    """A RowDescription column for an engine result column."""
    wt = wire_type(pg_type)
    return WireColumn(name, wt.oid, wt.size)


TEXT_OID = BY_NAME["text"].oid
UNKNOWN_OID = BY_NAME["unknown"].oid

# Arrays: the element type of each array OID; int2vector and oidvector are arrays indexed from 0.
ELEMENT_OF: dict[int, WireType] = {t.array_oid: t for t in WIRE_TYPES if t.array_oid}
_VECTORS: dict[int, WireType] = {
    BY_NAME["int2vector"].oid: BY_NAME["int2"],
    BY_NAME["oidvector"].oid: BY_NAME["oid"],
}


# ---------------------------------------------------------------------------------------------
# Session settings that change text output
# ---------------------------------------------------------------------------------------------

UTC = dt.UTC


@dataclass(frozen=True)
class TextFormat:
    """The session settings text output depends on (extra_float_digits, TimeZone)."""

    extra_float_digits: int = 1
    timezone: dt.tzinfo = UTC


Encoder = Callable[[object], bytes]
Decoder = Callable[[bytes], object]

_PG_EPOCH_DATE = dt.date(2000, 1, 1)
_PG_EPOCH = dt.datetime(2000, 1, 1)
_PG_EPOCH_TZ = dt.datetime(2000, 1, 1, tzinfo=UTC)
_PG_EPOCH_ORDINAL = _PG_EPOCH_DATE.toordinal()

_S_BOOL = struct.Struct("!?")
_S_INT2 = struct.Struct("!h")
_S_INT4 = struct.Struct("!i")
_S_INT8 = struct.Struct("!q")
_S_UINT4 = struct.Struct("!I")
_S_FLOAT4 = struct.Struct("!f")
_S_FLOAT8 = struct.Struct("!d")
_S_NUMERIC_HEAD = struct.Struct("!hhHH")
_S_INTERVAL = struct.Struct("!qii")

_INT_RANGES = {"int2": (-(2**15), 2**15 - 1), "int4": (-(2**31), 2**31 - 1), "int8": (-(2**63), 2**63 - 1)}
_INT_NAMES = {"int2": "smallint", "int4": "integer", "int8": "bigint"}


# ---------------------------------------------------------------------------------------------
# Text output
# ---------------------------------------------------------------------------------------------


def _bool_text(value: object, _: TextFormat) -> str:
    return "t" if value else "f"


def _int_text(value: object, _: TextFormat) -> str:
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


def _float_text(value: float, fmt: TextFormat, single: bool) -> str:
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


def _float8_text(value: object, fmt: TextFormat) -> str:
    return _float_text(float(value), fmt, single=False)  # type: ignore[arg-type]


def _float4_text(value: object, fmt: TextFormat) -> str:
    return _float_text(float(value), fmt, single=True)  # type: ignore[arg-type]


def _as_decimal(value: object) -> Decimal:
    if isinstance(value, Decimal):
        return value
    if isinstance(value, float):
        return Decimal(repr(value)) if math.isfinite(value) else Decimal(str(value))
    return Decimal(value)  # type: ignore[arg-type]


def _numeric_text(value: object, _: TextFormat) -> str:
    if isinstance(value, int):
        return str(int(value))
    number = _as_decimal(value)
    if number.is_nan():
        return "NaN"
    if number.is_infinite():
        return "Infinity" if number > 0 else "-Infinity"
    if number.is_zero():
        number = abs(number)  # PostgreSQL has no negative zero numeric
    return format(number, "f")


def _str_text(value: object, _: TextFormat) -> str:
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
        else _array_item_text(v if isinstance(v, str) else str(v))
        for v in value
    )
    return "{" + ",".join(items) + "}"


def _date_text(value: object, _: TextFormat) -> str:
    if isinstance(value, dt.datetime):
        value = value.date()
    assert isinstance(value, dt.date)
    return value.isoformat()


def _clock(value: dt.datetime | dt.time) -> str:
    text = f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}"
    if value.microsecond:
        text += "." + f"{value.microsecond:06d}".rstrip("0")
    return text


def _timestamp_text(value: object, _: TextFormat) -> str:
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


def _aware(value: object) -> dt.datetime:
    if not isinstance(value, dt.datetime):
        value = dt.datetime.combine(value, dt.time())  # type: ignore[arg-type]
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _timestamptz_text(value: object, fmt: TextFormat) -> str:
    local = _aware(value).astimezone(fmt.timezone)
    offset = local.utcoffset() or dt.timedelta(0)
    return _timestamp_text(local.replace(tzinfo=None), fmt) + _utc_offset(offset)


def _time_text(value: object, _: TextFormat) -> str:
    assert isinstance(value, (dt.time, dt.datetime))
    return _clock(value)


def _interval_text(value: object, _: TextFormat) -> str:
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


def _bytea_text(value: object, _: TextFormat) -> str:
    return "\\x" + bytes(value).hex()  # type: ignore[arg-type]


def _char_text(value: object, _: TextFormat) -> str:
    if isinstance(value, (bytes, bytearray)):
        return value.decode("latin-1")
    return str(value)


def _void_text(value: object, _: TextFormat) -> str:
    return ""


_ARRAY_SPECIAL = re.compile(r'[{}",\\\s]')


def _array_item_text(text: str) -> str:
    if text == "" or text.upper() == "NULL" or _ARRAY_SPECIAL.search(text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


# ---------------------------------------------------------------------------------------------
# Binary output
# ---------------------------------------------------------------------------------------------


def _bool_binary(value: object) -> bytes:
    return b"\x01" if value else b"\x00"


def _int_binary(packer: struct.Struct, type_name: str) -> Encoder:
    low, high = _INT_RANGES[type_name]

    def encode(value: object) -> bytes:
        number = int(value)  # type: ignore[call-overload]
        if not low <= number <= high:
            raise ValueOutOfRange(f"{_INT_NAMES[type_name]} out of range")
        return packer.pack(number)

    return encode


def _uint4_binary(value: object) -> bytes:
    return _S_UINT4.pack(int(value) & 0xFFFFFFFF)  # type: ignore[call-overload]


def _float8_binary(value: object) -> bytes:
    return _S_FLOAT8.pack(float(value))  # type: ignore[arg-type]


def _float4_binary(value: object) -> bytes:
    return _S_FLOAT4.pack(float(value))  # type: ignore[arg-type]


# numeric_send's sign word
_NUMERIC_POS, _NUMERIC_NEG, _NUMERIC_NAN = 0x0000, 0x4000, 0xC000
_NUMERIC_PINF, _NUMERIC_NINF = 0xD000, 0xF000


def _numeric_binary(value: object) -> bytes:
    """PostgreSQL's numeric_send: base-10000 digits, weight, sign and display scale."""
    number = _as_decimal(value)
    if number.is_nan():
        return _S_NUMERIC_HEAD.pack(0, 0, _NUMERIC_NAN, 0)
    if number.is_infinite():
        # PostgreSQL sends the display scale its short header holds for infinities: 32.
        return _S_NUMERIC_HEAD.pack(0, 0, _NUMERIC_PINF if number > 0 else _NUMERIC_NINF, 32)
    sign, digit_tuple, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    dscale = max(0, -exponent)
    digits = "".join(map(str, digit_tuple))
    if exponent >= 0:
        integer, fraction = digits + "0" * exponent, ""
    else:
        point = len(digits) + exponent
        integer, fraction = (digits[:point], digits[point:]) if point > 0 else ("", "0" * -point + digits)
    integer = integer.lstrip("0")
    integer = "0" * (-len(integer) % 4) + integer
    fraction = fraction + "0" * (-len(fraction) % 4)
    whole = integer + fraction
    groups = [int(whole[i : i + 4]) for i in range(0, len(whole), 4)]
    weight = len(integer) // 4 - 1
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    return _S_NUMERIC_HEAD.pack(
        len(groups), weight, _NUMERIC_NEG if sign and groups else _NUMERIC_POS, dscale
    ) + struct.pack(f"!{len(groups)}H", *groups)


def _str_binary(value: object) -> bytes:
    return _str_text(value, TextFormat()).encode()


def _no_binary_output(type_name: str) -> Encoder:
    def encode(value: object) -> bytes:
        raise NoBinaryOutput(f"no binary output function available for type {type_name}")

    return encode


def _date_binary(value: object) -> bytes:
    if isinstance(value, dt.datetime):
        value = value.date()
    assert isinstance(value, dt.date)
    return _S_INT4.pack(value.toordinal() - _PG_EPOCH_ORDINAL)


def _micros(delta: dt.timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _timestamp_binary(value: object) -> bytes:
    if not isinstance(value, dt.datetime):
        value = dt.datetime.combine(value, dt.time())  # type: ignore[arg-type]
    return _S_INT8.pack(_micros(value.replace(tzinfo=None) - _PG_EPOCH))


def _timestamptz_binary(value: object) -> bytes:
    return _S_INT8.pack(_micros(_aware(value) - _PG_EPOCH_TZ))


def _time_binary(value: object) -> bytes:
    assert isinstance(value, (dt.time, dt.datetime))
    return _S_INT8.pack(
        ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    )


def _interval_binary(value: object) -> bytes:
    assert isinstance(value, dt.timedelta)
    return _S_INTERVAL.pack(value.seconds * 1_000_000 + value.microseconds, value.days, 0)


def _bytea_binary(value: object) -> bytes:
    return bytes(value)  # type: ignore[arg-type]


def _char_binary(value: object) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value[:1])
    return str(value).encode("latin-1", errors="replace")[:1]


def _uuid_binary(value: object) -> bytes:
    return (value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))).bytes


def _jsonb_binary(value: object) -> bytes:
    return b"\x01" + _str_binary(value)


def _void_binary(value: object) -> bytes:
    return b""


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


def _int_from_text(type_name: str) -> Callable[[str], object]:
    low, high = _INT_RANGES[type_name]
    sql_name = _INT_NAMES[type_name]

    def decode(text: str) -> object:
        if not _INTEGER_TEXT.fullmatch(text):
            raise _syntax(sql_name, text)
        number = int(text)
        if not low <= number <= high:
            raise ValueOutOfRange(f'value "{text.strip()}" is out of range for type {sql_name}')
        return number

    return decode


def _uint4_from_text(text: str) -> object:
    if not _INTEGER_TEXT.fullmatch(text):
        raise _syntax("oid", text)
    number = int(text)
    if not -(2**31) <= number <= 2**32 - 1:
        raise ValueOutOfRange(f'value "{text.strip()}" is out of range for type oid')
    return number & 0xFFFFFFFF


def _float_from_text(type_name: str) -> Callable[[str], object]:
    def decode(text: str) -> object:
        if not _FLOAT_TEXT.fullmatch(text):
            raise _syntax(type_name, text)
        value = float(text)
        if type_name == "real" and math.isfinite(value) and abs(value) > 3.4028234663852886e38:
            raise ValueOutOfRange(f'"{text.strip()}" is out of range for type real')
        return value

    return decode


def _numeric_from_text(text: str) -> object:
    if not _NUMERIC_TEXT.fullmatch(text):
        raise _syntax("numeric", text)
    try:
        return Decimal(text.strip())
    except InvalidOperation:
        raise _syntax("numeric", text) from None


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def _bool_from_text(text: str) -> object:
    # PostgreSQL's parse_bool: any unique prefix of true/false/yes/no, "on"/"off" (at least 2
    # letters, since "o" is ambiguous), 1 and 0.
    word = text.strip().lower()
    if word:
        if word in ("1", "0"):
            return word == "1"
        if word[0] in "ty" and (("true".startswith(word)) or "yes".startswith(word)):
            return True
        if word[0] in "fn" and (("false".startswith(word)) or "no".startswith(word)):
            return False
        if len(word) >= 2 and "on".startswith(word):
            return True
        if len(word) >= 2 and "off".startswith(word):
            return False
    raise _syntax("boolean", text)


def _str_from_text(text: str) -> object:
    return text


def _date_from_text(text: str) -> object:
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


def _timestamp_from_text(text: str) -> object:
    # PostgreSQL ignores a time zone given in a timestamp without time zone.
    return _parse_timestamp(text, "timestamp").replace(tzinfo=None)


def _timestamptz_from_text(text: str, fmt: TextFormat) -> object:
    value = _parse_timestamp(text, "timestamp with time zone")
    if value.tzinfo is None:
        value = value.replace(tzinfo=fmt.timezone)
    return value.astimezone(UTC)


def _time_from_text(text: str) -> object:
    try:
        return dt.time.fromisoformat(text.strip())
    except ValueError:
        raise InvalidDatetime(f'invalid input syntax for type time: "{text}"') from None


def _bytea_from_text(text: str) -> object:
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


# ---------------------------------------------------------------------------------------------
# Binary input
# ---------------------------------------------------------------------------------------------


def _unpacker(packer: struct.Struct, type_name: str) -> Decoder:
    def decode(data: bytes) -> object:
        if len(data) != packer.size:
            raise InvalidBinary(f"incorrect binary data format for type {type_name}")
        return packer.unpack(data)[0]

    return decode


def _numeric_from_binary(data: bytes) -> object:
    if len(data) < 8:
        raise InvalidBinary("incorrect binary data format for type numeric")
    count, weight, sign, dscale = _S_NUMERIC_HEAD.unpack_from(data)
    if count < 0 or len(data) != 8 + 2 * count or dscale > 0x3FFF:
        raise InvalidBinary("incorrect binary data format for type numeric")
    if sign == _NUMERIC_NAN:
        return Decimal("NaN")
    if sign == _NUMERIC_PINF:
        return Decimal("Infinity")
    if sign == _NUMERIC_NINF:
        return Decimal("-Infinity")
    if sign not in (_NUMERIC_POS, _NUMERIC_NEG):
        raise InvalidBinary("invalid sign in external numeric value")
    groups = struct.unpack_from(f"!{count}H", data, 8)
    if any(g > 9999 for g in groups):
        raise InvalidBinary("invalid digit in external numeric value")
    digits = [int(c) for c in "".join(f"{g:04d}" for g in groups)] or [0]
    exponent = 4 * (weight - count + 1)
    # Bring the exponent to -dscale without a Decimal context (whose precision would round).
    if exponent > -dscale:
        digits += [0] * (exponent + dscale)
    elif exponent < -dscale:
        cut = -dscale - exponent
        digits = digits[: len(digits) - cut] if cut < len(digits) else [0]
    return Decimal((1 if sign == _NUMERIC_NEG else 0, tuple(digits), -dscale))


def _str_from_binary(data: bytes) -> object:
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise InvalidBinary('invalid byte sequence for encoding "UTF8"') from None


def _date_from_binary(data: bytes) -> object:
    if len(data) != 4:
        raise InvalidBinary("incorrect binary data format for type date")
    days = _S_INT4.unpack(data)[0]
    try:
        return dt.date.fromordinal(_PG_EPOCH_ORDINAL + days)
    except (ValueError, OverflowError):
        raise ValueOutOfRange("date out of range") from None


def _micros_since(epoch: dt.datetime, type_name: str) -> Callable[[bytes], object]:
    """Decoder of timestamp[tz]: microseconds since 2000-01-01 (naive or UTC)."""

    def decode(data: bytes) -> object:
        if len(data) != 8:
            raise InvalidBinary(f"incorrect binary data format for type {type_name}")
        try:
            return epoch + dt.timedelta(microseconds=_S_INT8.unpack(data)[0])
        except OverflowError:
            raise ValueOutOfRange("timestamp out of range") from None

    return decode


_timestamp_from_binary = _micros_since(_PG_EPOCH, "timestamp")
_timestamptz_from_binary = _micros_since(_PG_EPOCH_TZ, "timestamptz")


def _time_from_binary(data: bytes) -> object:
    if len(data) != 8:
        raise InvalidBinary("incorrect binary data format for type time")
    micros = _S_INT8.unpack(data)[0]
    if not 0 <= micros < 86_400_000_000:
        raise ValueOutOfRange("time out of range")
    seconds, us = divmod(micros, 1_000_000)
    return dt.time(seconds // 3600, seconds // 60 % 60, seconds % 60, us)


def _interval_from_binary(data: bytes) -> object:
    if len(data) != 16:
        raise InvalidBinary("incorrect binary data format for type interval")
    micros, days, months = _S_INTERVAL.unpack(data)
    if months:
        raise NotSupported("intervals with months are not supported as parameters")
    return dt.timedelta(days=days, microseconds=micros)


def _bool_from_binary(data: bytes) -> object:
    if len(data) != 1:
        raise InvalidBinary("incorrect binary data format for type boolean")
    return data != b"\x00"


def _uuid_from_binary(data: bytes) -> object:
    if len(data) != 16:
        raise InvalidBinary("incorrect binary data format for type uuid")
    return str(uuid.UUID(bytes=data))


def _jsonb_from_binary(data: bytes) -> object:
    if data[:1] != b"\x01":
        raise InvalidBinary("unsupported jsonb version number")
    return _str_from_binary(data[1:])


def _float4_from_binary(data: bytes) -> object:
    if len(data) != 4:
        raise InvalidBinary("incorrect binary data format for type real")
    return _S_FLOAT4.unpack(data)[0]


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------

TextOut = Callable[[object, TextFormat], str]
TextIn = Callable[[str], object]


@dataclass(frozen=True)
class TypeIO:
    """How values of one type are written and read, in text and in binary."""

    text_out: TextOut
    binary_out: Encoder
    text_in: TextIn
    binary_in: Decoder


_TEXT_IO = TypeIO(_str_text, _str_binary, _str_from_text, _str_from_binary)
_OID_IO = TypeIO(_int_text, _uint4_binary, _uint4_from_text, _unpacker(_S_UINT4, "oid"))
# reg* types (regclass, regtype, regproc …): an OID whose text form is a name. The catalog gives
# values as RegValue, a str of the name whose int() is the OID: text output sends the name, binary
# the OID, as PostgreSQL's regclassout/regclasssend do. A text parameter stays text: the catalog
# resolves '"public"."patients"' (or '16386') to the OID, as regclassin does; a binary one is the OID.
_REG_IO = TypeIO(_str_text, _uint4_binary, _str_from_text, _unpacker(_S_UINT4, "oid"))

# typname → its encoders and decoders. Names not listed are sent as text (str(value)).
_TYPE_IO: dict[str, TypeIO] = {
    "bool": TypeIO(_bool_text, _bool_binary, _bool_from_text, _bool_from_binary),
    "int2": TypeIO(
        _int_text, _int_binary(_S_INT2, "int2"), _int_from_text("int2"), _unpacker(_S_INT2, "smallint")
    ),
    "int4": TypeIO(
        _int_text, _int_binary(_S_INT4, "int4"), _int_from_text("int4"), _unpacker(_S_INT4, "integer")
    ),
    "int8": TypeIO(
        _int_text, _int_binary(_S_INT8, "int8"), _int_from_text("int8"), _unpacker(_S_INT8, "bigint")
    ),
    "float4": TypeIO(_float4_text, _float4_binary, _float_from_text("real"), _float4_from_binary),
    "float8": TypeIO(
        _float8_text,
        _float8_binary,
        _float_from_text("double precision"),
        _unpacker(_S_FLOAT8, "double precision"),
    ),
    "numeric": TypeIO(_numeric_text, _numeric_binary, _numeric_from_text, _numeric_from_binary),
    "text": _TEXT_IO,
    "varchar": _TEXT_IO,
    "bpchar": _TEXT_IO,
    "name": _TEXT_IO,
    "unknown": _TEXT_IO,
    "json": _TEXT_IO,
    "pg_node_tree": _TEXT_IO,
    "jsonb": TypeIO(_str_text, _jsonb_binary, _str_from_text, _jsonb_from_binary),
    "char": TypeIO(_char_text, _char_binary, _str_from_text, lambda data: data.decode("latin-1")),
    "bytea": TypeIO(_bytea_text, _bytea_binary, _bytea_from_text, bytes),
    "date": TypeIO(_date_text, _date_binary, _date_from_text, _date_from_binary),
    "time": TypeIO(_time_text, _time_binary, _time_from_text, _time_from_binary),
    "timestamp": TypeIO(_timestamp_text, _timestamp_binary, _timestamp_from_text, _timestamp_from_binary),
    # text_in is replaced per session (it needs the TimeZone), see decoder().
    "timestamptz": TypeIO(
        _timestamptz_text, _timestamptz_binary, _timestamp_from_text, _timestamptz_from_binary
    ),
    "interval": TypeIO(_interval_text, _interval_binary, _str_from_text, _interval_from_binary),
    "uuid": TypeIO(_str_text, _uuid_binary, _str_from_text, _uuid_from_binary),
    "oid": _OID_IO,
    "xid": _OID_IO,
    "regproc": _REG_IO,
    "regprocedure": _REG_IO,
    "regoper": _REG_IO,
    "regoperator": _REG_IO,
    "regclass": _REG_IO,
    "regtype": _REG_IO,
    "regconfig": _REG_IO,
    "regdictionary": _REG_IO,
    "regnamespace": _REG_IO,
    "regrole": _REG_IO,
    "regcollation": _REG_IO,
    # PostgreSQL's aclitem has no send/recv functions: text only.
    "aclitem": TypeIO(_str_text, _no_binary_output("aclitem"), _str_from_text, _str_from_binary),
    "void": TypeIO(_void_text, _void_binary, _str_from_text, lambda data: None),
}


def _io_of(type_oid: int) -> TypeIO:
    wire = BY_OID.get(type_oid)
    return _TYPE_IO.get(wire.name, _TEXT_IO) if wire is not None else _TEXT_IO


# ---------------------------------------------------------------------------------------------
# Arrays (catalog results: text[], name[], oid[], int2vector, oidvector; oid[] parameters)
# ---------------------------------------------------------------------------------------------


def _array_text_encoder(element: WireType, fmt: TextFormat, vector: bool) -> Encoder:
    io = _io_of(element.oid)
    text_out = io.text_out

    def item(value: object) -> str:
        if isinstance(value, (list, tuple)):
            return "{" + ",".join(item(v) for v in value) + "}"
        if value is None:
            return "NULL"
        return _array_item_text(text_out(value, fmt))

    def encode(value: object) -> bytes:
        assert isinstance(value, (list, tuple))
        if vector:
            return " ".join(text_out(v, fmt) for v in value).encode()
        return item(value).encode()

    return encode


def _array_binary_encoder(element: WireType, vector: bool) -> Encoder:
    binary_out = _io_of(element.oid).binary_out
    lower_bound = 0 if vector else 1

    def encode(value: object) -> bytes:
        assert isinstance(value, (list, tuple))
        dims: list[int] = []
        level: object = value
        while isinstance(level, (list, tuple)):
            dims.append(len(level))
            level = level[0] if level else None
        if not dims or dims[0] == 0:
            return _S_INT4.pack(0) + _S_INT4.pack(0) + _S_UINT4.pack(element.oid)
        parts: list[bytes] = []
        has_null = False

        def walk(items: object, depth: int) -> None:
            nonlocal has_null
            assert isinstance(items, (list, tuple))
            if len(items) != dims[depth]:
                raise ValueError("multidimensional arrays must have sub-arrays of the same size")
            for v in items:
                if depth + 1 < len(dims):
                    walk(v, depth + 1)
                elif v is None:
                    has_null = True
                    parts.append(_S_INT4.pack(-1))
                else:
                    data = binary_out(v)
                    parts.append(_S_INT4.pack(len(data)) + data)

        walk(value, 0)
        head = struct.pack("!iiI", len(dims), int(has_null), element.oid)
        head += b"".join(struct.pack("!ii", d, lower_bound) for d in dims)
        return head + b"".join(parts)

    return encode


def _array_text_decoder(element: WireType, fmt: TextFormat, vector: bool) -> Decoder:
    item_in = _text_in(element.oid, fmt)

    def decode(data: bytes) -> object:
        text = data.decode()
        if vector:
            return [item_in(part) for part in text.split()]
        items, end = _parse_array(text.strip(), 0, item_in)
        if end != len(text.strip()):
            raise InvalidText(f'malformed array literal: "{text}"')
        return items

    return decode


def _parse_array(text: str, i: int, item_in: TextIn) -> tuple[list[object], int]:
    malformed = InvalidText(f'malformed array literal: "{text}"')
    if text[i : i + 1] != "{":
        raise malformed
    i += 1
    items: list[object] = []
    if text[i : i + 1] == "}":
        return items, i + 1
    while True:
        while text[i : i + 1].isspace():
            i += 1
        if text[i : i + 1] == "{":
            sub, i = _parse_array(text, i, item_in)
            items.append(sub)
        elif text[i : i + 1] == '"':
            i += 1
            chars = []
            while i < len(text) and text[i] != '"':
                if text[i] == "\\":
                    i += 1
                chars.append(text[i : i + 1])
                i += 1
            if i >= len(text):
                raise malformed
            i += 1
            items.append(item_in("".join(chars)))
        else:
            start = i
            while i < len(text) and text[i] not in ",}":
                i += 1
            raw = text[start:i].strip()
            if not raw:
                raise malformed
            items.append(None if raw.upper() == "NULL" else item_in(raw))
        while text[i : i + 1].isspace():
            i += 1
        if text[i : i + 1] == ",":
            i += 1
            continue
        if text[i : i + 1] == "}":
            return items, i + 1
        raise malformed


def _array_binary_decoder(element: WireType) -> Decoder:
    item_in = _io_of(element.oid).binary_in

    def decode(data: bytes) -> object:
        try:
            ndim, _flags, _elem = struct.unpack_from("!iiI", data)
            if ndim == 0:
                return []
            if not 0 < ndim <= 6:
                raise InvalidBinary("invalid number of dimensions in a binary array")
            dims = [struct.unpack_from("!ii", data, 12 + 8 * d)[0] for d in range(ndim)]
            offset = 12 + 8 * ndim
            flat: list[object] = []
            for _ in range(math.prod(dims)):
                (length,) = _S_INT4.unpack_from(data, offset)
                offset += 4
                if length == -1:
                    flat.append(None)
                    continue
                if length < 0 or offset + length > len(data):
                    raise InvalidBinary("insufficient data left in a binary array")
                flat.append(item_in(data[offset : offset + length]))
                offset += length
        except struct.error:
            raise InvalidBinary("insufficient data left in a binary array") from None
        if offset != len(data):
            raise InvalidBinary("incorrect binary data format in an array")
        for size in reversed(dims[1:]):
            flat = [flat[i : i + size] for i in range(0, len(flat), size)]
        return flat

    return decode


# ---------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------

TEXT, BINARY = 0, 1


@functools.lru_cache(maxsize=2048)
def encoder(type_oid: int, format_code: int, fmt: TextFormat = TextFormat()) -> Encoder:
    """The function that turns a non-NULL result value of `type_oid` into its wire bytes.

    `format_code` 0 is text, 1 binary. Unknown OIDs are sent as text, whichever format was asked.
    """
    vector = type_oid in _VECTORS
    element = _VECTORS.get(type_oid) or ELEMENT_OF.get(type_oid)
    if element is not None:
        if format_code == BINARY:
            return _array_binary_encoder(element, vector)
        return _array_text_encoder(element, fmt, vector)
    io = _io_of(type_oid)
    if format_code == BINARY:
        return io.binary_out
    text_out = io.text_out
    return lambda value: text_out(value, fmt).encode()


def _text_in(type_oid: int, fmt: TextFormat) -> TextIn:
    if type_oid == BY_NAME["timestamptz"].oid:
        return functools.partial(_timestamptz_from_text, fmt=fmt)
    return _io_of(type_oid).text_in


@functools.lru_cache(maxsize=1024)
def decoder(type_oid: int, format_code: int, fmt: TextFormat = TextFormat()) -> Decoder:
    """The function that turns a non-NULL parameter's wire bytes into a Python value.

    Raises DPProxyError subclasses (22P02, 22P03, 22003, 22007) the session sends as they are.
    """
    vector = type_oid in _VECTORS
    element = _VECTORS.get(type_oid) or ELEMENT_OF.get(type_oid)
    if element is not None:
        if format_code == BINARY:
            return _array_binary_decoder(element)
        return _array_text_decoder(element, fmt, vector)
    if format_code == BINARY:
        return _io_of(type_oid).binary_in
    text_in = _text_in(type_oid, fmt)

    def decode(data: bytes) -> object:
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise InvalidText('invalid byte sequence for encoding "UTF8"') from None
        return text_in(text)

    return decode


def type_name(type_oid: int) -> str:
    wire = BY_OID.get(type_oid)
    return wire.name if wire is not None else str(type_oid)


def float_text(value: float) -> str:
    """A float8 as PostgreSQL writes it by default (shortest round-trip form)."""
    return _float_text(float(value), TextFormat(), single=False)
