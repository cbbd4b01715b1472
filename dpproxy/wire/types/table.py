"""The table of types: one row per type, pairing its text and binary encoders and decoders, and the
entry points that pick a value's encoder or a parameter's decoder, arrays included.

One table, one row per type (after psycopg's types/ modules): adding a type is adding a row in
`_TYPE_IO`, with its functions in text.py and binary.py. Values and bytes only: this module never
sees SQL, a session or a socket.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass

from dpproxy.errors import InvalidBinary, InvalidText
from dpproxy.wire.types.binary import (
    S_FLOAT8,
    S_INT2,
    S_INT4,
    S_INT8,
    S_UINT4,
    bool_binary,
    bool_from_binary,
    bytea_binary,
    char_binary,
    date_binary,
    date_from_binary,
    float4_binary,
    float4_from_binary,
    float8_binary,
    int_binary,
    interval_binary,
    interval_from_binary,
    jsonb_binary,
    jsonb_from_binary,
    no_binary_output,
    numeric_binary,
    numeric_from_binary,
    str_binary,
    str_from_binary,
    time_binary,
    time_from_binary,
    timestamp_binary,
    timestamp_from_binary,
    timestamptz_binary,
    timestamptz_from_binary,
    uint4_binary,
    unpacker,
    uuid_binary,
    uuid_from_binary,
    void_binary,
)
from dpproxy.wire.types.registry import (
    BY_NAME,
    BY_OID,
    ELEMENT_OF,
    VECTORS,
    Decoder,
    Encoder,
    TextFormat,
    WireType,
)
from dpproxy.wire.types.text import (
    array_item_text,
    bool_from_text,
    bool_text,
    bytea_from_text,
    bytea_text,
    char_text,
    date_from_text,
    date_text,
    float4_text,
    float8_text,
    float_from_text,
    float_to_text,
    int_from_text,
    int_text,
    interval_text,
    numeric_from_text,
    numeric_text,
    str_from_text,
    str_text,
    time_from_text,
    time_text,
    timestamp_from_text,
    timestamp_text,
    timestamptz_from_text,
    timestamptz_text,
    uint4_from_text,
    void_text,
)

TextOut = Callable[[object, TextFormat], str]
TextIn = Callable[[str], object]


@dataclass(frozen=True)
class TypeIO:
    """How values of one type are written and read, in text and in binary."""

    text_out: TextOut
    binary_out: Encoder
    text_in: TextIn
    binary_in: Decoder


_TEXT_IO = TypeIO(str_text, str_binary, str_from_text, str_from_binary)
_OID_IO = TypeIO(int_text, uint4_binary, uint4_from_text, unpacker(S_UINT4, "oid"))
# reg* types (regclass, regtype, regproc …): an OID whose text form is a name. The catalog gives
# values as RegValue, a str of the name whose int() is the OID: text output sends the name, binary
# the OID, as PostgreSQL's regclassout/regclasssend do. A text parameter stays text: the catalog
# resolves '"public"."patients"' (or '16386') to the OID, as regclassin does; a binary one is the OID.
_REG_IO = TypeIO(str_text, uint4_binary, str_from_text, unpacker(S_UINT4, "oid"))

# typname → its encoders and decoders. Names not listed are sent as text (str(value)).
_TYPE_IO: dict[str, TypeIO] = {
    "bool": TypeIO(bool_text, bool_binary, bool_from_text, bool_from_binary),
    "int2": TypeIO(int_text, int_binary(S_INT2, "int2"), int_from_text("int2"), unpacker(S_INT2, "smallint")),
    "int4": TypeIO(int_text, int_binary(S_INT4, "int4"), int_from_text("int4"), unpacker(S_INT4, "integer")),
    "int8": TypeIO(int_text, int_binary(S_INT8, "int8"), int_from_text("int8"), unpacker(S_INT8, "bigint")),
    "float4": TypeIO(float4_text, float4_binary, float_from_text("real"), float4_from_binary),
    "float8": TypeIO(
        float8_text,
        float8_binary,
        float_from_text("double precision"),
        unpacker(S_FLOAT8, "double precision"),
    ),
    "numeric": TypeIO(numeric_text, numeric_binary, numeric_from_text, numeric_from_binary),
    "text": _TEXT_IO,
    "varchar": _TEXT_IO,
    "bpchar": _TEXT_IO,
    "name": _TEXT_IO,
    "unknown": _TEXT_IO,
    "json": _TEXT_IO,
    "pg_node_tree": _TEXT_IO,
    "jsonb": TypeIO(str_text, jsonb_binary, str_from_text, jsonb_from_binary),
    "char": TypeIO(char_text, char_binary, str_from_text, lambda data: data.decode("latin-1")),
    "bytea": TypeIO(bytea_text, bytea_binary, bytea_from_text, bytes),
    "date": TypeIO(date_text, date_binary, date_from_text, date_from_binary),
    "time": TypeIO(time_text, time_binary, time_from_text, time_from_binary),
    "timestamp": TypeIO(timestamp_text, timestamp_binary, timestamp_from_text, timestamp_from_binary),
    # text_in is replaced per session (it needs the TimeZone), see decoder().
    "timestamptz": TypeIO(timestamptz_text, timestamptz_binary, timestamp_from_text, timestamptz_from_binary),
    "interval": TypeIO(interval_text, interval_binary, str_from_text, interval_from_binary),
    "uuid": TypeIO(str_text, uuid_binary, str_from_text, uuid_from_binary),
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
    "aclitem": TypeIO(str_text, no_binary_output("aclitem"), str_from_text, str_from_binary),
    "void": TypeIO(void_text, void_binary, str_from_text, lambda data: None),
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
        return array_item_text(text_out(value, fmt))

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
            return S_INT4.pack(0) + S_INT4.pack(0) + S_UINT4.pack(element.oid)
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
                    parts.append(S_INT4.pack(-1))
                else:
                    data = binary_out(v)
                    parts.append(S_INT4.pack(len(data)) + data)

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
                (length,) = S_INT4.unpack_from(data, offset)
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
_DEFAULT_FORMAT = TextFormat()  # a fresh session's: extra_float_digits 1, UTC


@functools.lru_cache(maxsize=2048)
def encoder(type_oid: int, format_code: int, fmt: TextFormat = _DEFAULT_FORMAT) -> Encoder:
    """The function that turns a non-NULL result value of `type_oid` into its wire bytes.

    `format_code` 0 is text, 1 binary. Unknown OIDs are sent as text, whichever format was asked.
    """
    vector = type_oid in VECTORS
    element = VECTORS.get(type_oid) or ELEMENT_OF.get(type_oid)
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
        return functools.partial(timestamptz_from_text, fmt=fmt)
    return _io_of(type_oid).text_in


@functools.lru_cache(maxsize=1024)
def decoder(type_oid: int, format_code: int, fmt: TextFormat = _DEFAULT_FORMAT) -> Decoder:
    """The function that turns a non-NULL parameter's wire bytes into a Python value.

    Raises DPProxyError subclasses (22P02, 22P03, 22003, 22007) the session sends as they are.
    """
    vector = type_oid in VECTORS
    element = VECTORS.get(type_oid) or ELEMENT_OF.get(type_oid)
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
    return float_to_text(float(value), TextFormat(), single=False)
