"""SQL result types as PostgreSQL names them, and conversions from policy and sqlglot types.

The engine promises result types "as PostgreSQL would return them for the raw query"; this module
is where those types are named. It knows nothing of the wire protocol (OIDs live in wire/types).
"""

from __future__ import annotations

from enum import StrEnum

from sqlglot import exp

from dpproxy.errors import UndefinedFunction
from dpproxy.policy import ColumnType


class PgType(StrEnum):
    INT2 = "smallint"
    INT4 = "integer"
    INT8 = "bigint"
    NUMERIC = "numeric"
    FLOAT4 = "real"
    FLOAT8 = "double precision"
    TEXT = "text"
    VARCHAR = "character varying"
    BOOL = "boolean"
    DATE = "date"
    TIMESTAMP = "timestamp without time zone"
    TIMESTAMPTZ = "timestamp with time zone"
    UNKNOWN = "unknown"  # an untyped string literal, resolved to text on output

    @property
    def is_integer(self) -> bool:
        return self in _INTEGER_RANK

    @property
    def is_float(self) -> bool:
        return self in (PgType.FLOAT4, PgType.FLOAT8)

    @property
    def is_number(self) -> bool:
        return self.is_integer or self.is_float or self is PgType.NUMERIC

    @property
    def is_text(self) -> bool:
        return self in (PgType.TEXT, PgType.VARCHAR, PgType.UNKNOWN)

    @property
    def is_temporal(self) -> bool:
        return self in (PgType.DATE, PgType.TIMESTAMP, PgType.TIMESTAMPTZ)


_INTEGER_RANK = {PgType.INT2: 0, PgType.INT4: 1, PgType.INT8: 2}

# Values an integer type can hold: arithmetic whose interval leaves this range could overflow.
INTEGER_RANGE = {
    PgType.INT2: (-(2**15), 2**15 - 1),
    PgType.INT4: (-(2**31), 2**31 - 1),
    PgType.INT8: (-(2**63), 2**63 - 1),
}

_FROM_COLUMN_TYPE = {
    ColumnType.SMALLINT: PgType.INT2,
    ColumnType.INTEGER: PgType.INT4,
    ColumnType.BIGINT: PgType.INT8,
    ColumnType.NUMERIC: PgType.NUMERIC,
    ColumnType.REAL: PgType.FLOAT4,
    ColumnType.DOUBLE: PgType.FLOAT8,
    ColumnType.TEXT: PgType.TEXT,
    ColumnType.VARCHAR: PgType.VARCHAR,
    ColumnType.BOOLEAN: PgType.BOOL,
    ColumnType.DATE: PgType.DATE,
    ColumnType.TIMESTAMP: PgType.TIMESTAMP,
    ColumnType.TIMESTAMPTZ: PgType.TIMESTAMPTZ,
}


def boolean_from_text(text: str) -> bool | None:
    """A boolean as PostgreSQL's input function reads text (trimmed, any case): t/true, y/yes, on, 1
    and f/false, n/no, off, 0, or a prefix of these words that only one of them has; else None."""
    word = text.strip().lower()
    if word in ("1", "0"):
        return word == "1"
    if len(word) >= 2 and word.startswith("o"):  # "o" alone is on or off: ambiguous
        return True if "on".startswith(word) else False if "off".startswith(word) else None
    for whole, value in (("true", True), ("yes", True), ("false", False), ("no", False)):
        if word and whole.startswith(word):
            return value
    return None


def from_column_type(column_type: ColumnType) -> PgType:
    return _FROM_COLUMN_TYPE[column_type]


# sqlglot type names as they appear in a schema mapping; used to annotate trees with policy types.
SQLGLOT_SCHEMA_TYPE = {
    PgType.INT2: "SMALLINT",
    PgType.INT4: "INT",
    PgType.INT8: "BIGINT",
    PgType.NUMERIC: "DECIMAL(38, 9)",
    PgType.FLOAT4: "FLOAT",
    PgType.FLOAT8: "DOUBLE",
    PgType.TEXT: "TEXT",
    PgType.VARCHAR: "VARCHAR",
    PgType.BOOL: "BOOLEAN",
    PgType.DATE: "DATE",
    PgType.TIMESTAMP: "TIMESTAMP",
    PgType.TIMESTAMPTZ: "TIMESTAMPTZ",
}

_FROM_SQLGLOT = {
    exp.DataType.Type.SMALLINT: PgType.INT2,
    exp.DataType.Type.TINYINT: PgType.INT2,
    exp.DataType.Type.INT: PgType.INT4,
    exp.DataType.Type.BIGINT: PgType.INT8,
    exp.DataType.Type.DECIMAL: PgType.NUMERIC,
    exp.DataType.Type.FLOAT: PgType.FLOAT4,
    exp.DataType.Type.DOUBLE: PgType.FLOAT8,
    exp.DataType.Type.TEXT: PgType.TEXT,
    exp.DataType.Type.VARCHAR: PgType.VARCHAR,
    exp.DataType.Type.CHAR: PgType.TEXT,
    exp.DataType.Type.BOOLEAN: PgType.BOOL,
    exp.DataType.Type.DATE: PgType.DATE,
    exp.DataType.Type.TIMESTAMP: PgType.TIMESTAMP,
    exp.DataType.Type.DATETIME: PgType.TIMESTAMP,
    exp.DataType.Type.TIMESTAMPTZ: PgType.TIMESTAMPTZ,
}


def from_sqlglot(data_type: exp.DataType | None) -> PgType:
    """The PostgreSQL type of an annotated sqlglot node (UNKNOWN when sqlglot could not tell)."""
    if data_type is None:
        return PgType.UNKNOWN
    return _FROM_SQLGLOT.get(data_type.this, PgType.UNKNOWN)


def wider_integer(a: PgType, b: PgType) -> PgType:
    return a if _INTEGER_RANK[a] >= _INTEGER_RANK[b] else b


def arithmetic_result(a: PgType, b: PgType) -> PgType:
    """PostgreSQL's result type for +, -, *, / between two numbers."""
    if a.is_float or b.is_float:
        return PgType.FLOAT8
    if a is PgType.NUMERIC or b is PgType.NUMERIC:
        return PgType.NUMERIC
    if a.is_integer and b.is_integer:
        return wider_integer(a, b)
    return PgType.NUMERIC


def sum_result(argument: PgType) -> PgType:
    """PostgreSQL's type for SUM over a column of this type."""
    if argument in (PgType.INT2, PgType.INT4):
        return PgType.INT8
    if argument is PgType.FLOAT4:
        return PgType.FLOAT4
    if argument is PgType.FLOAT8:
        return PgType.FLOAT8
    return PgType.NUMERIC


def avg_result(argument: PgType) -> PgType:
    """PostgreSQL's type for AVG over a column of this type."""
    return PgType.FLOAT8 if argument.is_float else PgType.NUMERIC


def type_family(t: PgType) -> str:
    """The family of types PostgreSQL compares with each other: number, text, temporal, or the type."""
    if t.is_number:
        return "number"
    if t.is_text:
        return "text"
    if t.is_temporal:
        return "temporal"
    return t.value


COMPARISON_OPERATORS: dict[type[exp.Expression], str] = {
    exp.EQ: "=",
    exp.NEQ: "<>",
    exp.GT: ">",
    exp.GTE: ">=",
    exp.LT: "<",
    exp.LTE: "<=",
    exp.NullSafeEQ: "=",
    exp.NullSafeNEQ: "=",
    exp.In: "=",
    exp.Between: ">=",
}


def check_comparable(
    left: PgType, right: PgType, node: exp.Expression, clause: str, written: str | None = None
) -> None:
    """The one comparison rule of row expressions (WHERE, ON, CASE …) and of expressions over released
    values (HAVING, ORDER BY): as in PostgreSQL, values of different kinds (text and a number, a
    boolean and a number, a date and text) have no comparison operator (42883); an untyped string
    constant takes the other side's type."""
    if PgType.UNKNOWN in (left, right) or type_family(left) == type_family(right):
        return
    operator = COMPARISON_OPERATORS.get(type(node), "=")
    written = written or node.sql("postgres")
    raise UndefinedFunction(
        f"operator does not exist: {left.value} {operator} {right.value} ({clause}: {written})",
        hint="compare values of the same kind, or CAST one side (e.g. a quoted constant for a text column)",
    )
