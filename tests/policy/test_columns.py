"""Columns of a protected table: exact bounds on the column's grid, summable, scale, public values."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.policy.policy_text import TABLE, assert_problem, load, only_problem, problems


def test_numeric_type_modifier_sets_the_grid_scale_unless_scale_is_given():
    text = """
        version: 1
        tables:
          t:
            privacy_unit: row
            columns:
              a: {type: "numeric(12,4)", lower: 0, upper: 1}
              b: {type: "numeric(12,4)", lower: 0, upper: 1, scale: 1}
    """
    table = load(text).table("t")
    assert table.column("a").grid_scale == 4
    assert table.column("b").grid_scale == 1


def bounded_column(spec: str, column_type: str = "numeric") -> str:
    # The column `a` is on line 6.
    head = "version: 1\ntables:\n  t:\n    privacy_unit: row\n    columns:\n"
    return head + f"      a: {{type: {column_type}, {spec}}}\n"


def test_bounds_are_exact_decimals_from_the_text():
    column = load(bounded_column("lower: -0.1, upper: 0.3")).table("t").column("a")
    assert column.lower == Decimal("-0.1") and column.upper == Decimal("0.3")
    assert isinstance(column.lower, Decimal)


@settings(max_examples=50)
@given(
    st.decimals(min_value=-(10**9), max_value=10**9, places=2, allow_nan=False, allow_infinity=False),
    st.decimals(min_value=0, max_value=10**9, places=2, allow_nan=False, allow_infinity=False),
)
def test_any_decimal_bound_is_kept_exactly(lower, width):
    upper = lower + width
    column = load(bounded_column(f"lower: {lower}, upper: {upper}")).table("t").column("a")
    assert (column.lower, column.upper) == (lower, upper)


@pytest.mark.parametrize(
    ("spec", "column_type", "path", "fragments"),
    [
        ("lower: 1", "numeric", "lower", ("`upper` is missing", "give both lower and upper")),
        ("upper: 1", "numeric", "upper", ("`lower` is missing", "give both lower and upper")),
        ("lower: 5, upper: 1", "numeric", "lower", ("greater than upper", "swap them")),
        ("lower: 0.5, upper: 10", "integer", "lower", ("whole number",)),
        ("lower: 0, upper: 40000", "smallint", "upper", ("outside the range of smallint",)),
        ("lower: '0', upper: 1", "numeric", "lower", ("expected a number", "without quotes")),
        ("lower: 0, upper: .inf", "numeric", "upper", ("finite",)),
        (
            "lower: 0, upper: 0.001",
            "numeric",
            "upper",
            ("more decimal places than the column's grid", "scale"),
        ),
        ("lower: 0, upper: 1e17", "numeric", "upper", ("too large", "fit in a bigint")),
        ("lower: 0", "text", "lower", ("only to number columns", "remove `lower`")),
        ("upper: 2024-01-01", "date", "upper", ("`lower` is missing",)),
        ("scale: 2, summable: false", "integer", "scale", ("only to numeric, real and double precision",)),
        ("lower: 0, upper: 1, scale: 10", "numeric", "scale", ("between 0 and 9",)),
        ("lower: 0, upper: 1, scale: 1.5", "numeric", "scale", ("whole number",)),
        ("summable: true", "text", "summable", ("only to number columns",)),
    ],
)
def test_bad_bounds_and_scales_are_rejected(spec, column_type, path, fragments):
    only_problem(bounded_column(spec, column_type), 6, f"tables.t.columns.a.{path}", *fragments)


def test_bounds_on_the_grid_of_an_explicit_scale_are_accepted():
    column = load(bounded_column("lower: 0, upper: 0.001, scale: 3")).table("t").column("a")
    assert column.upper == Decimal("0.001") and column.grid_scale == 3


def test_number_columns_need_bounds_or_summable_false():
    found = only_problem(
        bounded_column("scale: 2"), 6, "tables.t.columns.a", "needs bounds to be summed", "`summable: false`"
    )
    assert "add `lower:` and `upper:`" in found
    column = load(bounded_column("summable: false")).table("t").column("a")
    assert not column.summable and not column.bounded
    assert load(bounded_column("lower: 0, upper: 1")).table("t").column("a").summable


def test_summable_is_false_only_where_the_policy_says_so():
    # Columns that are not summed themselves may still appear inside a SUM: SUM(CASE WHEN x ...).
    table = load(TABLE.replace("x: {type: integer, lower: 0, upper: 10}", "x: {type: text}")).table("t")
    assert table.column("x").summable
    text = TABLE.replace("pid: {type: integer}", "pid: {type: integer, summable: false}")
    assert not load(text).table("t").column("pid").summable


def test_public_values_take_the_column_type():
    text = """
        version: 1
        tables:
          t:
            privacy_unit: row
            columns:
              s: {type: text, public_values: [flu, "cold", 42]}
              n: {type: smallint, public_values: [1, -2, 3], summable: false}
              b: {type: boolean, public_values: [true, false]}
              d: {type: date, public_values: [2024-01-31, "2024-02-01"]}
              ts: {type: timestamp, public_values: [2024-01-31 08:00:00]}
              tz: {type: timestamptz, public_values: [2024-01-31 08:00:00+00:00]}
              m: {type: numeric, lower: 0, upper: 1, public_values: [0.5, 0.25]}
    """
    table = load(text).table("t")
    assert table.column("s").public_values == ("flu", "cold", "42")
    assert table.column("n").public_values == (1, -2, 3)
    assert table.column("b").public_values == (True, False)
    assert table.column("d").public_values == (datetime.date(2024, 1, 31), datetime.date(2024, 2, 1))
    assert table.column("ts").public_values == (datetime.datetime(2024, 1, 31, 8),)
    assert table.column("tz").public_values == (datetime.datetime(2024, 1, 31, 8, tzinfo=datetime.UTC),)
    assert table.column("m").public_values == (Decimal("0.5"), Decimal("0.25"))
    assert all(isinstance(v, bool) for v in table.column("b").public_values)


@pytest.mark.parametrize(
    ("spec", "column_type", "path", "fragments"),
    [
        ("public_values: []", "text", "public_values", ("non-empty list",)),
        ("public_values: flu", "text", "public_values", ("non-empty list",)),
        ("public_values: [a, b, a]", "text", "public_values[2]", ("repeats item 0", "list each value once")),
        ("public_values: [a, null]", "text", "public_values[1]", ("NULL is never a public value",)),
        (
            "public_values: [1, two], summable: false",
            "integer",
            "public_values[1]",
            ("expected a whole number",),
        ),
        ("public_values: [1, 1.0], summable: false", "integer", "public_values[1]", ("whole number",)),
        ("public_values: [true, 'no']", "boolean", "public_values[1]", ("expected true or false",)),
        ("public_values: [2024-02-30]", "date", "public_values[0]", ("expected a date", "YYYY-MM-DD")),
        ("public_values: [2024-01-01 10:00:00]", "timestamptz", "public_values[0]", ("UTC offset",)),
    ],
)
def test_bad_public_values_are_rejected(spec, column_type, path, fragments):
    only_problem(bounded_column(spec, column_type), 6, f"tables.t.columns.a.{path}", *fragments)


def test_public_values_are_not_allowed_on_the_privacy_unit():
    text = TABLE.replace("pid: {type: integer}", "pid: {type: integer, public_values: [1, 2]}")
    only_problem(text, 6, "tables.t.columns.pid.public_values", "privacy unit", "remove `public_values`")


def test_the_unit_column_takes_no_bounds_or_summable_true():
    text = TABLE.replace("pid: {type: integer}", "pid: {type: integer, lower: 0, upper: 9, summable: true}")
    found = problems(text)
    assert_problem(found, 6, "tables.t.columns.pid.lower", "privacy unit column", "remove `lower`")
    assert_problem(found, 6, "tables.t.columns.pid.upper", "privacy unit column")
    assert_problem(found, 6, "tables.t.columns.pid.summable", "cannot be summed")
    assert len(found) == 3
