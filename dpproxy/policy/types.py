"""Column types and every type name dpproxy understands, whoever writes it.

This module owns `ColumnType` and the one table from type names to it: the names a data owner may
write in a policy (PostgreSQL's names and their common aliases), and the further names PostgreSQL
and DuckDB report for live columns, and the few Spark names that mean something else.
`read_policy_type` and `column_type_from_sql` read a policy's spelling; `normalise_type` and
`normalise_spark_type` read a database's (the backends use them to type their live columns).

It must never see a policy file, a YAML node or a database connection: it only maps text to types,
so that the policy loader and the backends, which must not know each other, agree on what a name
means.
"""

from __future__ import annotations

import re
from enum import StrEnum


class ColumnType(StrEnum):
    """Column types, named as PostgreSQL names them."""

    SMALLINT = "smallint"
    INTEGER = "integer"
    BIGINT = "bigint"
    NUMERIC = "numeric"
    REAL = "real"
    DOUBLE = "double precision"
    TEXT = "text"
    VARCHAR = "varchar"
    BOOLEAN = "boolean"
    DATE = "date"
    TIMESTAMP = "timestamp"
    TIMESTAMPTZ = "timestamptz"

    @property
    def is_integer(self) -> bool:
        return self in (ColumnType.SMALLINT, ColumnType.INTEGER, ColumnType.BIGINT)

    @property
    def is_fractional(self) -> bool:
        return self in (ColumnType.NUMERIC, ColumnType.REAL, ColumnType.DOUBLE)

    @property
    def is_number(self) -> bool:
        return self.is_integer or self.is_fractional

    @property
    def is_text(self) -> bool:
        return self in (ColumnType.TEXT, ColumnType.VARCHAR)

    @property
    def is_temporal(self) -> bool:
        return self in (ColumnType.DATE, ColumnType.TIMESTAMP, ColumnType.TIMESTAMPTZ)


# The values each integer type can hold.
INTEGER_RANGES: dict[ColumnType, tuple[int, int]] = {
    ColumnType.SMALLINT: (-(2**15), 2**15 - 1),
    ColumnType.INTEGER: (-(2**31), 2**31 - 1),
    ColumnType.BIGINT: (-(2**63), 2**63 - 1),
}

# Every type name dpproxy knows (lower case, spaces single, type modifiers stripped) → ColumnType.
_TYPE_NAMES: dict[str, ColumnType] = {
    # PostgreSQL's own names and their common aliases: the names a policy may write (below).
    "smallint": ColumnType.SMALLINT,
    "int2": ColumnType.SMALLINT,
    "integer": ColumnType.INTEGER,
    "int": ColumnType.INTEGER,
    "int4": ColumnType.INTEGER,
    "bigint": ColumnType.BIGINT,
    "int8": ColumnType.BIGINT,
    "numeric": ColumnType.NUMERIC,
    "decimal": ColumnType.NUMERIC,
    "real": ColumnType.REAL,
    "float4": ColumnType.REAL,
    "double precision": ColumnType.DOUBLE,
    "double": ColumnType.DOUBLE,
    "float8": ColumnType.DOUBLE,
    "text": ColumnType.TEXT,
    "string": ColumnType.TEXT,
    "varchar": ColumnType.VARCHAR,
    "character varying": ColumnType.VARCHAR,
    "boolean": ColumnType.BOOLEAN,
    "bool": ColumnType.BOOLEAN,
    "date": ColumnType.DATE,
    "timestamp": ColumnType.TIMESTAMP,
    "timestamp without time zone": ColumnType.TIMESTAMP,
    "timestamptz": ColumnType.TIMESTAMPTZ,
    "timestamp with time zone": ColumnType.TIMESTAMPTZ,
    # Names only a database reports (DuckDB's own spellings, PostgreSQL's blank-padded char). Unsigned
    # and tiny integers map to the smallest signed type that holds all their values.
    "int16": ColumnType.SMALLINT,
    "short": ColumnType.SMALLINT,
    "tinyint": ColumnType.SMALLINT,
    "int1": ColumnType.SMALLINT,
    "utinyint": ColumnType.SMALLINT,
    "int32": ColumnType.INTEGER,
    "signed": ColumnType.INTEGER,
    "usmallint": ColumnType.INTEGER,
    "int64": ColumnType.BIGINT,
    "long": ColumnType.BIGINT,
    "uinteger": ColumnType.BIGINT,
    # DuckDB's FLOAT is 4 bytes; PostgreSQL always reports its floats as real / double precision.
    "float": ColumnType.REAL,
    "char": ColumnType.VARCHAR,
    "character": ColumnType.VARCHAR,
    "bpchar": ColumnType.VARCHAR,
    "logical": ColumnType.BOOLEAN,
    "datetime": ColumnType.TIMESTAMP,
    "timestamp_us": ColumnType.TIMESTAMP,
    "timestamp_ms": ColumnType.TIMESTAMP,
    "timestamp_s": ColumnType.TIMESTAMP,
    "timestamp_ns": ColumnType.TIMESTAMP,
}

# The names a policy may use, in the order problem messages list them. Plain `float` is left out on
# purpose: it is double precision in PostgreSQL but 4-byte in DuckDB.
ACCEPTED_TYPE_NAMES: tuple[str, ...] = (
    "smallint", "int2", "integer", "int", "int4", "bigint", "int8", "numeric", "decimal", "real",
    "float4", "double precision", "double", "float8", "text", "string", "varchar", "character varying",
    "boolean", "bool", "date", "timestamp", "timestamp without time zone", "timestamptz",
    "timestamp with time zone",
)  # fmt: skip
_POLICY_TYPE_NAMES = frozenset(ACCEPTED_TYPE_NAMES)

# In a policy, type modifiers are accepted so a type can be copied from DDL: numeric(12,2), varchar(40).
_POLICY_TYPE_TEXT = re.compile(
    r"(?P<name>[a-z][a-z0-9 ]*?)\s*(?:\(\s*(?P<p>\d+)\s*(?:,\s*(?P<s>\d+)\s*)?\))?"
)
_TYPES_WITH_MODIFIERS = (ColumnType.NUMERIC, ColumnType.VARCHAR)

# A database's type text may carry parameters anywhere: numeric(12,2), timestamp(3) with time zone.
_DATABASE_TYPE_PARAMETERS = re.compile(r"\s*\([^)]*\)")


# Spark's names (DataType.simpleString) where they differ from what the same name means above: its
# TIMESTAMP is an instant (PostgreSQL's timestamptz), TIMESTAMP_NTZ a wall-clock time; FLOAT is 4
# bytes, as in DuckDB. Arrays, maps, structs, intervals, binary and variant are not supported.
_SPARK_TYPE_NAMES: dict[str, ColumnType] = {
    "timestamp": ColumnType.TIMESTAMPTZ,
    "timestamp_ltz": ColumnType.TIMESTAMPTZ,
    "timestamp_ntz": ColumnType.TIMESTAMP,
    "byte": ColumnType.SMALLINT,
}
_SPARK_UNSUPPORTED = re.compile(r"^(array|map|struct|interval|binary|variant|void|null|calendar)\b|[<>]")


def normalise_spark_type(sql_type: str) -> ColumnType | None:
    """Map a Spark type name (`int`, `decimal(12,2)`, `string`, `timestamp`, `array<int>`, …) to a
    ColumnType; None if unsupported.

    >>> [normalise_spark_type(t) for t in ("timestamp", "string", "map<string,int>")]
    [<ColumnType.TIMESTAMPTZ: 'timestamptz'>, <ColumnType.TEXT: 'text'>, None]
    """
    text = " ".join(sql_type.strip().lower().split())
    if _SPARK_UNSUPPORTED.search(text):
        return None
    bare = _DATABASE_TYPE_PARAMETERS.sub("", text)
    return _SPARK_TYPE_NAMES.get(bare) or normalise_type(text)


def column_type_from_sql(sql_type: str) -> ColumnType | None:
    """The ColumnType a type name written in a policy stands for, or None when a policy may not use it.

    Case and spacing are ignored, and a type modifier is allowed on numeric and varchar:
    ``column_type_from_sql("DECIMAL(12, 2)") is ColumnType.NUMERIC``.
    """
    parsed = read_policy_type(sql_type)
    return parsed[0] if parsed is not None else None


def read_policy_type(text: str) -> tuple[ColumnType, int | None] | None:
    """(type, scale from a numeric(p,s) modifier) for a type written in a policy, or None."""
    folded = " ".join(text.lower().split())
    match = _POLICY_TYPE_TEXT.fullmatch(folded)
    if match is None:
        return None
    name = match["name"].strip()
    if name not in _POLICY_TYPE_NAMES:
        return None
    column_type = _TYPE_NAMES[name]
    if match["p"] is not None:
        if column_type not in _TYPES_WITH_MODIFIERS:
            return None
        if column_type is ColumnType.VARCHAR and match["s"] is not None:
            return None
    scale = int(match["s"]) if column_type is ColumnType.NUMERIC and match["s"] is not None else None
    return column_type, scale


def normalise_type(sql_type: str) -> ColumnType | None:
    """Map a native type name of PostgreSQL or DuckDB to a ColumnType; None if unsupported.

    >>> normalise_type("numeric(12,2)"), normalise_type("DECIMAL(12,2)"), normalise_type("INTEGER[]")
    (<ColumnType.NUMERIC: 'numeric'>, <ColumnType.NUMERIC: 'numeric'>, None)
    """
    text = sql_type.strip().lower()
    if "[" in text:  # arrays: integer[] (PostgreSQL), INTEGER[] or INTEGER[3] (DuckDB)
        return None
    text = _DATABASE_TYPE_PARAMETERS.sub("", text)
    return _TYPE_NAMES.get(" ".join(text.split()))
