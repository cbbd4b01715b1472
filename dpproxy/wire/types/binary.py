"""PostgreSQL's binary formats: result values as its send functions write them, parameters as its
recv functions read them (network byte order, microseconds since 2000-01-01, base-10000 numerics).

Values and bytes only: this module never sees SQL, a session or a socket, and a value's text form
is text.py's.
"""

from __future__ import annotations

import datetime as dt
import struct
import uuid
from collections.abc import Callable
from decimal import Decimal

from dpproxy.errors import InvalidBinary, NoBinaryOutput, NotSupported, ValueOutOfRange
from dpproxy.wire.types.registry import INT_NAMES, INT_RANGES, UTC, Decoder, Encoder, TextFormat
from dpproxy.wire.types.text import as_decimal, aware, str_text

_PG_EPOCH_DATE = dt.date(2000, 1, 1)
_PG_EPOCH = dt.datetime(2000, 1, 1)
_PG_EPOCH_TZ = dt.datetime(2000, 1, 1, tzinfo=UTC)
_PG_EPOCH_ORDINAL = _PG_EPOCH_DATE.toordinal()

_S_BOOL = struct.Struct("!?")
S_INT2 = struct.Struct("!h")
S_INT4 = struct.Struct("!i")
S_INT8 = struct.Struct("!q")
S_UINT4 = struct.Struct("!I")
_S_FLOAT4 = struct.Struct("!f")
S_FLOAT8 = struct.Struct("!d")
_S_NUMERIC_HEAD = struct.Struct("!hhHH")
_S_INTERVAL = struct.Struct("!qii")


# ---------------------------------------------------------------------------------------------
# Binary output
# ---------------------------------------------------------------------------------------------


def bool_binary(value: object) -> bytes:
    return b"\x01" if value else b"\x00"


def int_binary(packer: struct.Struct, type_name: str) -> Encoder:
    low, high = INT_RANGES[type_name]

    def encode(value: object) -> bytes:
        number = int(value)  # type: ignore[call-overload]
        if not low <= number <= high:
            raise ValueOutOfRange(f"{INT_NAMES[type_name]} out of range")
        return packer.pack(number)

    return encode


def uint4_binary(value: object) -> bytes:
    return S_UINT4.pack(int(value) & 0xFFFFFFFF)  # type: ignore[call-overload]


def float8_binary(value: object) -> bytes:
    return S_FLOAT8.pack(float(value))  # type: ignore[arg-type]


def float4_binary(value: object) -> bytes:
    return _S_FLOAT4.pack(float(value))  # type: ignore[arg-type]


# numeric_send's sign word
_NUMERIC_POS, _NUMERIC_NEG, _NUMERIC_NAN = 0x0000, 0x4000, 0xC000
_NUMERIC_PINF, _NUMERIC_NINF = 0xD000, 0xF000


def numeric_binary(value: object) -> bytes:
    """PostgreSQL's numeric_send: base-10000 digits, weight, sign and display scale."""
    number = as_decimal(value)
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


def str_binary(value: object) -> bytes:
    return str_text(value, TextFormat()).encode()


def no_binary_output(type_name: str) -> Encoder:
    def encode(value: object) -> bytes:
        raise NoBinaryOutput(f"no binary output function available for type {type_name}")

    return encode


def date_binary(value: object) -> bytes:
    if isinstance(value, dt.datetime):
        value = value.date()
    assert isinstance(value, dt.date)
    return S_INT4.pack(value.toordinal() - _PG_EPOCH_ORDINAL)


def _micros(delta: dt.timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def timestamp_binary(value: object) -> bytes:
    if not isinstance(value, dt.datetime):
        value = dt.datetime.combine(value, dt.time())  # type: ignore[arg-type]
    return S_INT8.pack(_micros(value.replace(tzinfo=None) - _PG_EPOCH))


def timestamptz_binary(value: object) -> bytes:
    return S_INT8.pack(_micros(aware(value) - _PG_EPOCH_TZ))


def time_binary(value: object) -> bytes:
    assert isinstance(value, (dt.time, dt.datetime))
    return S_INT8.pack(((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond)


def interval_binary(value: object) -> bytes:
    assert isinstance(value, dt.timedelta)
    return _S_INTERVAL.pack(value.seconds * 1_000_000 + value.microseconds, value.days, 0)


def bytea_binary(value: object) -> bytes:
    return bytes(value)  # type: ignore[arg-type]


def char_binary(value: object) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value[:1])
    return str(value).encode("latin-1", errors="replace")[:1]


def uuid_binary(value: object) -> bytes:
    return (value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))).bytes


def jsonb_binary(value: object) -> bytes:
    return b"\x01" + str_binary(value)


def void_binary(value: object) -> bytes:
    return b""


# ---------------------------------------------------------------------------------------------
# Binary input
# ---------------------------------------------------------------------------------------------


def unpacker(packer: struct.Struct, type_name: str) -> Decoder:
    def decode(data: bytes) -> object:
        if len(data) != packer.size:
            raise InvalidBinary(f"incorrect binary data format for type {type_name}")
        return packer.unpack(data)[0]

    return decode


def numeric_from_binary(data: bytes) -> object:
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


def str_from_binary(data: bytes) -> object:
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise InvalidBinary('invalid byte sequence for encoding "UTF8"') from None


def date_from_binary(data: bytes) -> object:
    if len(data) != 4:
        raise InvalidBinary("incorrect binary data format for type date")
    days = S_INT4.unpack(data)[0]
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
            return epoch + dt.timedelta(microseconds=S_INT8.unpack(data)[0])
        except OverflowError:
            raise ValueOutOfRange("timestamp out of range") from None

    return decode


timestamp_from_binary = _micros_since(_PG_EPOCH, "timestamp")
timestamptz_from_binary = _micros_since(_PG_EPOCH_TZ, "timestamptz")


def time_from_binary(data: bytes) -> object:
    if len(data) != 8:
        raise InvalidBinary("incorrect binary data format for type time")
    micros = S_INT8.unpack(data)[0]
    if not 0 <= micros < 86_400_000_000:
        raise ValueOutOfRange("time out of range")
    seconds, us = divmod(micros, 1_000_000)
    return dt.time(seconds // 3600, seconds // 60 % 60, seconds % 60, us)


def interval_from_binary(data: bytes) -> object:
    if len(data) != 16:
        raise InvalidBinary("incorrect binary data format for type interval")
    micros, days, months = _S_INTERVAL.unpack(data)
    if months:
        raise NotSupported("intervals with months are not supported as parameters")
    return dt.timedelta(days=days, microseconds=micros)


def bool_from_binary(data: bytes) -> object:
    if len(data) != 1:
        raise InvalidBinary("incorrect binary data format for type boolean")
    return data != b"\x00"


def uuid_from_binary(data: bytes) -> object:
    if len(data) != 16:
        raise InvalidBinary("incorrect binary data format for type uuid")
    return str(uuid.UUID(bytes=data))


def jsonb_from_binary(data: bytes) -> object:
    if data[:1] != b"\x01":
        raise InvalidBinary("unsupported jsonb version number")
    return str_from_binary(data[1:])


def float4_from_binary(data: bytes) -> object:
    if len(data) != 4:
        raise InvalidBinary("incorrect binary data format for type real")
    return _S_FLOAT4.unpack(data)[0]
