"""Type names: the aliases a policy may write, the ones it may not, and the names databases report."""

from __future__ import annotations

import pytest

from dpproxy.policy import ColumnType, column_type_from_sql
from dpproxy.policy.types import normalise_type
from tests.policy.policy_text import load, only_problem


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("int", ColumnType.INTEGER),
        ("int4", ColumnType.INTEGER),
        ("INTEGER", ColumnType.INTEGER),
        ("int8", ColumnType.BIGINT),
        ("int2", ColumnType.SMALLINT),
        ("decimal", ColumnType.NUMERIC),
        ("numeric(12, 2)", ColumnType.NUMERIC),
        ("float8", ColumnType.DOUBLE),
        ("double", ColumnType.DOUBLE),
        ("double  precision", ColumnType.DOUBLE),
        ("float4", ColumnType.REAL),
        ("string", ColumnType.TEXT),
        ("character varying", ColumnType.VARCHAR),
        ("varchar(40)", ColumnType.VARCHAR),
        ("bool", ColumnType.BOOLEAN),
        ("timestamp with time zone", ColumnType.TIMESTAMPTZ),
        ("timestamp without time zone", ColumnType.TIMESTAMP),
    ],
)
def test_type_aliases_map_to_postgresql_types(written, expected):
    policy = load(f"version: 1\ntables:\n  t: {{public: true, columns: {{a: {{type: '{written}'}}}}}}\n")
    assert policy.table("t").column("a").type is expected
    assert column_type_from_sql(written) is expected


@pytest.mark.parametrize("written", ["json", "float", "integer[]", "int(4)", "money"])
def test_unsupported_types_are_rejected_listing_the_accepted_ones(written):
    text = f'version: 1\ntables:\n  t: {{public: true, columns: {{a: {{type: "{written}"}}}}}}\n'
    only_problem(
        text, 3, "tables.t.columns.a.type", f"unsupported type `{written}`", "accepted types: smallint"
    )
    assert column_type_from_sql(written) is None


@pytest.mark.parametrize(
    ("sql_type", "expected"),
    [
        ("int2", ColumnType.SMALLINT),
        ("SMALLINT", ColumnType.SMALLINT),
        ("int4", ColumnType.INTEGER),
        ("INTEGER", ColumnType.INTEGER),
        ("int8", ColumnType.BIGINT),
        ("BIGINT", ColumnType.BIGINT),
        ("HUGEINT", None),
        ("UBIGINT", None),
        ("numeric", ColumnType.NUMERIC),
        ("numeric(12,2)", ColumnType.NUMERIC),
        ("DECIMAL(18,3)", ColumnType.NUMERIC),
        ("real", ColumnType.REAL),
        ("FLOAT", ColumnType.REAL),
        ("double precision", ColumnType.DOUBLE),
        ("DOUBLE", ColumnType.DOUBLE),
        ("text", ColumnType.TEXT),
        ("VARCHAR", ColumnType.VARCHAR),
        ("character varying(20)", ColumnType.VARCHAR),
        ("character(1)", ColumnType.VARCHAR),
        ("boolean", ColumnType.BOOLEAN),
        ("BOOLEAN", ColumnType.BOOLEAN),
        ("date", ColumnType.DATE),
        ("timestamp without time zone", ColumnType.TIMESTAMP),
        ("timestamp(3) without time zone", ColumnType.TIMESTAMP),
        ("TIMESTAMP", ColumnType.TIMESTAMP),
        ("timestamp with time zone", ColumnType.TIMESTAMPTZ),
        ("TIMESTAMP WITH TIME ZONE", ColumnType.TIMESTAMPTZ),
        ("jsonb", None),
        ("JSON", None),
        ("integer[]", None),
        ("INTEGER[3]", None),
        ("STRUCT(x INTEGER)", None),
        ("uuid", None),
        ("interval", None),
    ],
)
def test_normalise_type(sql_type: str, expected: ColumnType | None) -> None:
    assert normalise_type(sql_type) == expected
