"""The PostgreSQL types dpproxy sends or receives: OIDs, sizes, array types, the engine's type for
each, RowDescription's column record, and what every encoder and decoder shares (TextFormat).

Names and numbers only: the encoders and decoders are text.py's and binary.py's, the table that
pairs them with a type is table.py's.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

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
VECTORS: dict[int, WireType] = {
    BY_NAME["int2vector"].oid: BY_NAME["int2"],
    BY_NAME["oidvector"].oid: BY_NAME["oid"],
}


# ---------------------------------------------------------------------------------------------
# What the encoders and decoders share: the session settings text output depends on, their types
# ---------------------------------------------------------------------------------------------

UTC = dt.UTC


@dataclass(frozen=True)
class TextFormat:
    """The session settings text output depends on (extra_float_digits, TimeZone)."""

    extra_float_digits: int = 1
    timezone: dt.tzinfo = UTC


Encoder = Callable[[object], bytes]
Decoder = Callable[[bytes], object]

# The integer types' ranges and SQL names, for the text and binary formats' range errors.
INT_RANGES = {"int2": (-(2**15), 2**15 - 1), "int4": (-(2**31), 2**31 - 1), "int8": (-(2**63), 2**63 - 1)}
INT_NAMES = {"int2": "smallint", "int4": "integer", "int8": "bigint"}
