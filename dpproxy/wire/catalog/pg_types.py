"""PostgreSQL types inside the shadow's DuckDB: which DuckDB type keeps each, which PostgreSQL type a
DuckDB result type stands for, type names as PostgreSQL's grammar reads them, array literals.

Type knowledge only: this module never sees a query, a session or the database itself.
"""

from __future__ import annotations

import functools
import re

from dpproxy.errors import InvalidText, NotSupported
from dpproxy.wire.catalog.builtin import PgData, load_pg_data

UNKNOWN = 705  # an untyped literal; text once it reaches the output
RECORD = 2249
# reg* values are OIDs inside the shadow (they compare with oid columns, as in PostgreSQL) and
# names on the way out. __to_<name>(x) and __<name>_out(oid) are the macros that convert them.
REG_TYPES = {
    24: "regproc",
    2202: "regprocedure",
    2205: "regclass",
    2206: "regtype",
    4089: "regnamespace",
    4096: "regrole",
}
OID_LIKE = frozenset({26, 28, 29, 5069, *REG_TYPES, 2203, 2204, 3734, 3769, 4191})
INTEGER_TYPES = frozenset({20, 21, 23})
TEXT_TYPES = frozenset({18, 19, 25, 1042, 1043})

_DUCK_TYPES = {
    16: "BOOLEAN",
    17: "BLOB",
    20: "BIGINT",
    21: "SMALLINT",
    22: "SMALLINT[]",
    23: "INTEGER",
    30: "UINTEGER[]",
    114: "JSON",
    700: "FLOAT",
    701: "DOUBLE",
    1082: "DATE",
    1083: "TIME",
    1114: "TIMESTAMP",
    1184: "TIMESTAMPTZ",
    1186: "INTERVAL",
    1266: "TIMETZ",
    # numeric without a typmod: DuckDB needs a fixed scale; the padding zeros are trimmed on output.
    1700: "DECIMAL(38, 10)",
    2950: "UUID",
    3802: "JSON",
    5069: "UBIGINT",
}


def duck_type(oid: int, data: PgData) -> str:
    """The DuckDB type a value of this PostgreSQL type is kept as in the shadow."""
    if oid in _DUCK_TYPES:
        return _DUCK_TYPES[oid]
    if oid in OID_LIKE:
        return "UINTEGER"
    row = data.types.get(oid)
    if row is None:
        return "VARCHAR"
    if row.typtype == "d":
        return duck_type(row.basetype, data)
    element = data.element(oid)
    if element is not None:
        inner = duck_type(element, data)
        return "VARCHAR[]" if inner.endswith("]") else inner + "[]"
    return "VARCHAR"


# DuckDB result types → PostgreSQL, for columns whose type the query itself did not tell.
_FROM_DUCK = {
    "BOOLEAN": 16,
    "TINYINT": 21,
    "SMALLINT": 21,
    "INTEGER": 23,
    "BIGINT": 20,
    "HUGEINT": 1700,
    "UTINYINT": 21,
    "USMALLINT": 23,
    "UINTEGER": 26,
    "UBIGINT": 1700,
    "UHUGEINT": 1700,
    "FLOAT": 700,
    "DOUBLE": 701,
    "VARCHAR": 25,
    "JSON": 114,
    "BLOB": 17,
    "DATE": 1082,
    "TIME": 1083,
    "TIMESTAMP": 1114,
    "TIMESTAMP_S": 1114,
    "TIMESTAMP_MS": 1114,
    "TIMESTAMP_NS": 1114,
    "TIMESTAMP WITH TIME ZONE": 1184,
    "TIME WITH TIME ZONE": 1266,
    "INTERVAL": 1186,
    "UUID": 2950,
    "NULL": 25,
}
_INTEGER_DUCK = frozenset(
    {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "HUGEINT"}
)


def pg_oid_of_duck(duck: str, data: PgData) -> int:
    text = duck.upper().strip('"')
    if text.endswith("[]"):
        element = pg_oid_of_duck(text[:-2], data)
        return data.array_of(element) or 1009
    if text.startswith("DECIMAL"):
        return 1700
    if text.startswith("STRUCT"):
        return RECORD
    return _FROM_DUCK.get(text, 25)


def compatible(pg_oid: int, duck: str, data: PgData) -> bool:
    """Whether DuckDB values of type `duck` can be sent as PostgreSQL type `pg_oid`."""
    text = duck.upper().strip('"')
    expected = duck_type(pg_oid, data).upper()
    expected = {"TIMESTAMPTZ": "TIMESTAMP WITH TIME ZONE", "TIMETZ": "TIME WITH TIME ZONE"}.get(
        expected, expected
    )
    if text in ("NULL", expected) or (expected.startswith("DECIMAL") and text.startswith("DECIMAL")):
        return True
    if text.endswith("[]"):
        element = data.element(pg_oid)
        return element is not None and compatible(element, text[:-2], data)
    if pg_oid in OID_LIKE or pg_oid in INTEGER_TYPES:
        return text in _INTEGER_DUCK
    if pg_oid == 1700:
        return text in _INTEGER_DUCK
    if pg_oid in (700, 701):
        return text in ("FLOAT", "DOUBLE")
    if pg_oid == 1114:
        return text.startswith("TIMESTAMP") and "ZONE" not in text
    return False


# Type names as PostgreSQL's grammar reads them (aliases included) → OID.
TYPE_NAMES = {
    "int": 23,
    "integer": 23,
    "int4": 23,
    "smallint": 21,
    "int2": 21,
    "bigint": 20,
    "int8": 20,
    "real": 700,
    "float4": 700,
    "float": 701,
    "double precision": 701,
    "double": 701,
    "float8": 701,
    "decimal": 1700,
    "numeric": 1700,
    "text": 25,
    "varchar": 1043,
    "character varying": 1043,
    "char": 1042,
    "character": 1042,
    "bpchar": 1042,
    "boolean": 16,
    "bool": 16,
    "date": 1082,
    "timestamp": 1114,
    "timestamp without time zone": 1114,
    "timestamptz": 1184,
    "timestamp with time zone": 1184,
    "time": 1083,
    "time without time zone": 1083,
    "timetz": 1266,
    "time with time zone": 1266,
    "interval": 1186,
    "json": 114,
    "jsonb": 3802,
    "uuid": 2950,
    "bytea": 17,
    "name": 19,
    '"char"': 18,
    "oid": 26,
    "__pg_oid": 26,  # what the token pass turns `oid[]` into, which sqlglot cannot parse
    # …and `regtype[]` and the other reg* arrays.
    **{f"__pg_{name}": oid for oid, name in REG_TYPES.items()},
}


@functools.cache
def _type_names_by_typname() -> dict[str, int]:
    return {row.name: oid for oid, row in sorted(load_pg_data().types.items(), reverse=True)}


def type_oid_from_name(text: str, data: PgData) -> int | None:
    """OID of a type as sqlglot renders it in PostgreSQL syntax ('DECIMAL(10, 2)', 'INT[]', 'REGCLASS')."""
    name = text.strip().lower()
    if name.endswith("[]"):
        element = type_oid_from_name(name[:-2], data)
        return data.array_of(element) if element is not None else None
    name = re.sub(r"\s*\(.*\)\s*", " ", name).strip().removeprefix("pg_catalog.")
    if name.startswith("information_schema."):
        name = name.split(".", 1)[1]
    if name in TYPE_NAMES:
        return TYPE_NAMES[name]
    return _type_names_by_typname().get(name.strip('"'))


def parse_pg_array(text: str) -> list[str | None]:
    """A one-dimensional PostgreSQL array literal ('{a,"b c",NULL}') as a list of str and None."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise InvalidText(f'malformed array literal: "{text}"', hint="write arrays as {a,b,c}")
    body = body[1:-1]
    items: list[str | None] = []
    i, n = 0, len(body)
    while body.strip() and i <= n:
        while i < n and body[i].isspace():
            i += 1
        if i < n and body[i] == '"':
            i += 1
            value = []
            while i < n and body[i] != '"':
                if body[i] == "\\" and i + 1 < n:
                    i += 1
                value.append(body[i])
                i += 1
            items.append("".join(value))
            i += 1
        else:
            start = i
            while i < n and body[i] != ",":
                i += 1
            raw = body[start:i].strip()
            if raw.startswith("{"):
                raise NotSupported("multidimensional arrays are not supported by the shadow catalog")
            items.append(None if raw.upper() == "NULL" else raw)
        while i < n and body[i] != ",":
            i += 1
        i += 1
    return items


# A declared type's modifier, as the backing database spells it: PostgreSQL's format_type
# ("numeric(12,2)", "character varying(20)", "timestamp(3) with time zone"), DuckDB's and Spark's
# ("DECIMAL(12,2)", "decimal(12,2)").
_MODIFIED_TYPES: tuple[tuple[int, re.Pattern[str]], ...] = (
    (1700, re.compile(r"(?:numeric|decimal)\((\d+)(?:,(\d+))?\)")),
    (1043, re.compile(r"(?:character varying|varchar)\((\d+)\)")),
    (1042, re.compile(r"(?:character|char|bpchar)\((\d+)\)")),
    (1114, re.compile(r"timestamp\((\d)\)(?: without time zone)?")),
    (1184, re.compile(r"(?:timestamp\((\d)\) with time zone|timestamptz\((\d)\))")),
    (1083, re.compile(r"time\((\d)\)(?: without time zone)?")),
)


def type_modifier(declared: str, type_oid: int) -> int:
    """The atttypmod PostgreSQL gives a column of type `type_oid` declared as `declared` in the backing
    database, or -1 when the declaration has none or is of another type (the policy's type decides the
    column's type; only a modifier of that same type is shown).

    >>> type_modifier("DECIMAL(12,2)", 1700), type_modifier("character varying(20)", 1043)
    (786438, 24)
    >>> type_modifier("timestamp(3) with time zone", 1184), type_modifier("VARCHAR", 1043)
    (3, -1)
    """
    text = re.sub(r"\s*([(,])\s*|\s*(\))", r"\1\2", " ".join(declared.lower().split()))
    for oid, pattern in _MODIFIED_TYPES:
        match = pattern.fullmatch(text) if oid == type_oid else None
        if match is None:
            continue
        numbers = [int(g) for g in match.groups() if g is not None]
        if oid == 1700:
            precision, scale = numbers[0], numbers[1] if len(numbers) > 1 else 0
            return ((precision << 16) | scale) + 4 if 1 <= precision <= 1000 and scale <= precision else -1
        if oid in (1043, 1042):
            return numbers[0] + 4 if numbers[0] >= 1 else -1
        return numbers[0] if numbers[0] <= 6 else -1
    return -1
