"""PostgreSQL types on the wire: OIDs, sizes, and text/binary encoders (results) and decoders (parameters).

    registry  the types dpproxy sends or receives (OIDs, sizes, array types), WireColumn, TextFormat
    text      PostgreSQL 15's text output and its input functions, type by type
    binary    PostgreSQL's send/recv binary formats, type by type
    table     one row per type pairing them, arrays, and the encoder()/decoder() entry points

Text output follows PostgreSQL 15 exactly for the types dpproxy releases (floats in the shortest
round-trip form of extra_float_digits ≥ 1, booleans t/f, ISO dates and timestamps, timestamptz in
the session's TimeZone); binary formats are PostgreSQL's send/recv formats.

This package knows values and bytes only: it never sees SQL, a session or a socket. Decoding
errors are DPProxyErrors whose messages quote the client's own parameter text, never a result value.
"""

from dpproxy.wire.types.registry import (
    BY_NAME,
    BY_OID,
    ELEMENT_OF,
    TEXT_OID,
    UNKNOWN_OID,
    WIRE_TYPES,
    Decoder,
    Encoder,
    TextFormat,
    WireColumn,
    WireType,
    pg_type_of,
    wire_column,
    wire_type,
)
from dpproxy.wire.types.table import BINARY, TEXT, TypeIO, decoder, encoder, float_text, type_name

__all__ = [
    "BINARY",
    "BY_NAME",
    "BY_OID",
    "ELEMENT_OF",
    "TEXT",
    "TEXT_OID",
    "UNKNOWN_OID",
    "WIRE_TYPES",
    "Decoder",
    "Encoder",
    "TextFormat",
    "TypeIO",
    "WireColumn",
    "WireType",
    "decoder",
    "encoder",
    "float_text",
    "pg_type_of",
    "type_name",
    "wire_column",
    "wire_type",
]
