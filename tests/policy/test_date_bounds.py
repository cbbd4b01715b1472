"""Declared ranges of date and time columns (`lower`/`upper`): read as values of the column's type
(a date, a timestamp without a zone, a timestamptz in UTC; a date given for a timestamp is that
day, from its start for `lower` to its end for `upper`), validated with file, line, key path and fix.
"""

from __future__ import annotations

import datetime as dt

import pytest

from tests.policy.policy_text import load, only_problem, problems
from tests.policy.test_columns import bounded_column


def bounds(spec: str, column_type: str) -> tuple[object, object]:
    column = load(bounded_column(spec, column_type)).table("t").column("a")
    assert column.bounded
    return column.lower, column.upper


def test_date_bounds_are_dates() -> None:
    assert bounds("lower: 2013-01-01, upper: 2013-12-31", "date") == (
        dt.date(2013, 1, 1),
        dt.date(2013, 12, 31),
    )
    assert bounds('lower: "2013-01-01", upper: "2013-12-31"', "date") == (
        dt.date(2013, 1, 1),
        dt.date(2013, 12, 31),
    )
    assert bounds("lower: 0001-01-01, upper: 9999-12-31", "date") == (dt.date(1, 1, 1), dt.date(9999, 12, 31))


def test_timestamp_bounds_given_as_dates_cover_whole_days() -> None:
    assert bounds("lower: 2013-01-01, upper: 2013-12-31", "timestamp") == (
        dt.datetime(2013, 1, 1),
        dt.datetime(2013, 12, 31, 23, 59, 59, 999999),
    )
    assert bounds("lower: 2013-01-01 08:30:00, upper: 2013-01-02T17:00:00", "timestamp") == (
        dt.datetime(2013, 1, 1, 8, 30),
        dt.datetime(2013, 1, 2, 17),
    )


def test_timestamptz_bounds_are_instants_in_utc() -> None:
    lower, upper = bounds("lower: 2013-01-01 02:00:00+02:00, upper: 2013-12-31", "timestamptz")
    assert lower == dt.datetime(2013, 1, 1, tzinfo=dt.UTC) and lower.utcoffset() == dt.timedelta(0)
    assert upper == dt.datetime(2013, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("spec", "column_type", "path", "fragments"),
    [
        ("lower: 2013-01-01", "date", "lower", ("`upper` is missing", "give both lower and upper")),
        ("lower: 2013-12-31, upper: 2013-01-01", "date", "lower", ("later than upper", "swap them")),
        (
            "lower: 2013-01-01 10:00:00, upper: 2013-12-31",
            "date",
            "lower",
            ("not a date and time", "YYYY-MM-DD"),
        ),
        ("lower: 2013-02-30, upper: 2013-12-31", "date", "lower", ("expected a date bound", "write e.g.")),
        ("lower: 0, upper: 2013-12-31", "date", "lower", ("expected a date bound",)),
        ("lower: soon, upper: 2013-12-31", "timestamp", "lower", ("expected a timestamp bound",)),
        (
            "lower: 2013-01-01 00:00:00+00:00, upper: 2013-12-31",
            "timestamp",
            "lower",
            ("without a time zone", "2013-12-31 23:59:59"),
        ),
        ("lower: 2013-01-01 00:00:00, upper: 2013-12-31", "timestamptz", "lower", ("with a UTC offset",)),
        ("lower: 0", "boolean", "lower", ("only to number columns and to date and time columns",)),
    ],
)
def test_bad_date_bounds_are_rejected(
    spec: str, column_type: str, path: str, fragments: tuple[str, ...]
) -> None:
    only_problem(bounded_column(spec, column_type), 6, f"tables.t.columns.a.{path}", *fragments)


def test_the_unit_takes_no_date_bounds() -> None:
    text = """
        version: 1
        tables:
          t:
            privacy_unit: d
            columns:
              d: {type: date, lower: 2013-01-01, upper: 2013-12-31}
    """
    found = problems(text)
    assert any("not allowed on the privacy unit column" in p for p in found)
