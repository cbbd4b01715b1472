"""Sensitivity certificates of MIN, MAX and percentile_disc of dates and times (docs/privacy.md §4):
their histograms over the declared range's epoch grid (days, whole seconds), with FILTER and
now()-relative filters, on D and on D minus each person (tests/certify.py), on both backends; and
the released values are of the column's type, within its declared range."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpproxy.engine import Engine
from dpproxy.errors import NotSupported
from dpproxy.sql.clock import CLOCK, Clock
from tests.certify import (
    NeighbourReader,
    cached_policy,
    certification_duckdb,
    certify,
    insert_rows,
    rows_without,
)
from tests.sql.test_certificates import CERT_SETTINGS

POLICY = """
version: 1
defaults: {{epsilon: 1.0, delta: 1.0e-6}}
tables:
  t:
    privacy_unit: pid
    max_rows_per_unit: {rows}
    max_groups_per_unit: {groups}
    columns:
      pid: {{type: integer}}
      grp: {{type: text}}
      d:   {{type: date, lower: 2020-01-01, upper: 2020-12-31}}
      ts:  {{type: timestamptz, lower: 2020-01-01 00:00:00+00:00, upper: 2020-01-03}}
"""

QUERIES = [
    "SELECT MIN(d), MAX(ts) FROM t",
    "SELECT grp, MAX(d), percentile_disc(0.5) WITHIN GROUP (ORDER BY ts) FROM t GROUP BY grp",
    "SELECT COUNT(*) FILTER (WHERE d >= current_date - 30), MIN(d) FILTER (WHERE grp = 'a') FROM t",
    "SELECT MAX(ts) FROM t WHERE ts < now() - INTERVAL '1 day'",
    # dbt's source freshness over a date column: max(d::timestamp), a monotone cast.
    "SELECT MAX(CAST(d AS TIMESTAMP)) AS max_loaded_at, now() AS snapshotted_at FROM t",
]
NOW = Clock(dt.datetime(2020, 1, 2, 12, tzinfo=dt.UTC))

dates = st.one_of(st.none(), st.dates(dt.date(2019, 6, 1), dt.date(2021, 6, 1)))
moments = st.one_of(
    st.none(),
    st.datetimes(dt.datetime(2019, 12, 31), dt.datetime(2020, 1, 4), timezones=st.just(dt.UTC)),
)
row = st.tuples(st.sampled_from(("a", "b", "c")), dates, moments)
database = st.lists(st.lists(row, min_size=1, max_size=6), min_size=0, max_size=5)


class Loader:
    def __init__(self, kind: str, pg_conn=None) -> None:
        self.kind = kind
        self.conn = pg_conn if kind == "postgres" else certification_duckdb()
        if kind == "duckdb":
            self.conn.execute("SET TimeZone = 'UTC'")
        self.neighbours = NeighbourReader(self.conn) if kind == "duckdb" else None

    def load(self, rows: list[tuple]) -> None:
        if self.neighbours is not None:
            self.neighbours.forget()
        self.conn.execute("DROP TABLE IF EXISTS t")
        self.conn.execute("CREATE TABLE t (pid INTEGER, grp VARCHAR, d DATE, ts TIMESTAMPTZ)")
        insert_rows(self.conn, self.kind, "t", rows)

    def run(self, sql: str, without: int | None = None) -> list[tuple]:
        if without is None:
            return self.conn.execute(sql).fetchall()
        mark = "%s" if self.kind == "postgres" else "?"
        return rows_without(self.conn, self.neighbours, [(f"DELETE FROM t WHERE pid = {mark}", without)], sql)


@pytest.fixture(params=["duckdb", "postgres"])
def loader(request: pytest.FixtureRequest) -> Loader:
    if request.param == "postgres":
        conn = request.getfixturevalue("pg_conn")
        conn.execute("SET TimeZone = 'UTC'")
        return Loader("postgres", conn)
    return Loader("duckdb")


def flatten(people: list[list[tuple]]) -> list[tuple]:
    return [(pid, *r) for pid, rows in enumerate(people) for r in rows]


@pytest.mark.parametrize("sql", QUERIES)
@CERT_SETTINGS
@given(people=database, rows=st.integers(1, 3), groups=st.integers(1, 2))
def test_date_quantiles_sensitivity(
    loader: Loader, sql: str, people: list[list[tuple]], rows: int, groups: int
) -> None:
    engine = Engine(cached_policy(POLICY.format(rows=rows, groups=groups)), None, dialect=loader.kind)
    loader.load(flatten(people))
    token = CLOCK.set(NOW)
    try:
        plan = engine.plan(sql, salt="certificate")
    finally:
        CLOCK.reset(token)
    certify(plan, loader.run, len(people))


def test_released_dates_are_of_the_column_type_within_its_range(loader: Loader) -> None:
    people = [[("a", dt.date(2020, 3, 1) + dt.timedelta(days=p), None)] for p in range(40)]
    people += [
        [("b", None, dt.datetime(2020, 1, 2, 6, tzinfo=dt.UTC) + dt.timedelta(minutes=p))] for p in range(40)
    ]
    loader.load(flatten(people))
    engine = Engine(cached_policy(POLICY.format(rows=1, groups=1)), None, dialect=loader.kind)
    plan = engine.plan("SELECT MIN(d), MAX(d), MAX(ts) FROM t", salt="s")
    result = engine.release(plan, [loader.run(s) for s in plan.statements], lambda s: loader.run(s))
    ((low, high, latest),) = result.rows
    assert isinstance(low, dt.date) and not isinstance(low, dt.datetime)
    # Two independent noisy picks: each within the range, not necessarily in order.
    assert all(dt.date(2020, 1, 1) <= d <= dt.date(2020, 12, 31) for d in (low, high))
    assert isinstance(latest, dt.datetime) and latest.tzinfo is not None
    assert dt.datetime(2020, 1, 1, tzinfo=dt.UTC) <= latest <= dt.datetime(2020, 1, 4, tzinfo=dt.UTC)


def test_a_cast_between_date_and_timestamp_is_released_as_the_cast_of_the_column(loader: Loader) -> None:
    people = [[("a", dt.date(2020, 3, 1) + dt.timedelta(days=p), None)] for p in range(40)]
    loader.load(flatten(people))
    engine = Engine(cached_policy(POLICY.format(rows=1, groups=1)), None, dialect=loader.kind)
    plan = engine.plan("SELECT MAX(CAST(d AS TIMESTAMP)), MIN(d::timestamp) FROM t", salt="s")
    result = engine.release(plan, [loader.run(s) for s in plan.statements], lambda s: loader.run(s))
    for value in result.rows[0]:
        assert type(value) is dt.datetime and value.tzinfo is None
        assert dt.datetime(2020, 1, 1) <= value <= dt.datetime(2020, 12, 31, 23, 59, 59)
    # To or from timestamptz the session's time zone would decide: refused, naming the expression.
    with pytest.raises(NotSupported) as refused:
        engine.plan("SELECT MAX(CAST(ts AS DATE)) FROM t")
    assert "MAX(CAST(ts AS DATE))" in refused.value.message
