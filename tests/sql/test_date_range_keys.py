"""Public GROUP BY keys from a date or time column's declared range (dpproxy.sql.public_keys):
date_trunc buckets, extract/date_part values and the days of a date column, enumerated from the
policy's `lower`/`upper` exactly as PostgreSQL and DuckDB compute them over the values the range
holds; released zero-filled with no partition selection; restricted by the WHERE; more than 10,000
values, partition selection as before; values clamped into the declared range where they are read.
"""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpproxy.engine import Engine
from dpproxy.errors import DPProxyError
from dpproxy.policy import parse_policy
from dpproxy.sql import date_buckets
from dpproxy.sql.public_keys import MAX_KEY_VALUES
from dpproxy.sql.query import PrivateQuery
from dpproxy.sql.types import PgType

DEMO_POLICY = Path(__file__).parents[2] / "policies" / "demo.yaml"


def policy_text(
    d: str = "2023-01-01, 2023-12-31", ts: str = "2023-01-01, 2023-12-31", tz: str | None = None
) -> str:
    d_lo, d_hi = d.split(", ")
    ts_lo, ts_hi = ts.split(", ")
    tz_lo, tz_hi = (tz or "2023-01-01 00:00:00+00:00, 2023-12-31").split(", ")
    return f"""
version: 1
defaults: {{epsilon: 1.0, delta: 1.0e-6}}
tables:
  t:
    privacy_unit: pid
    max_groups_per_unit: 3
    max_rows_per_unit: 2
    columns:
      pid: {{type: integer}}
      d:   {{type: date, lower: {d_lo}, upper: {d_hi}}}
      ts:  {{type: timestamp, lower: {ts_lo}, upper: {ts_hi}}}
      tz:  {{type: timestamptz, lower: {tz_lo}, upper: {tz_hi}}}
      free: {{type: date}}
      x:   {{type: integer, lower: 0, upper: 10}}
      m:   {{type: integer, public_values: [1, 2, 3], summable: false}}
"""


def keys_of(sql: str, text: str | None = None) -> PrivateQuery:
    query = Engine(parse_policy(text or policy_text()), None).analyze(sql)
    assert isinstance(query, PrivateQuery)
    return query


def values(sql: str, text: str | None = None) -> list[object]:
    (key,) = keys_of(sql, text).keys
    assert key.public_values is not None, key.origin
    return list(key.public_values)


# -- the enumeration is PostgreSQL's (checked on DuckDB over every day of the range) -------------

UNITS = ("day", "week", "month", "quarter", "year")
FIELDS = ("year", "isoyear", "quarter", "month", "week", "day", "doy", "dow", "isodow")


def engine_values(expression: str, lo: dt.date, hi: dt.date) -> list[object]:
    """What DuckDB computes for `expression` (over column `d`) on every day of [lo, hi]."""
    with duckdb.connect() as conn:
        rows = conn.execute(
            f"SELECT DISTINCT {expression} FROM (SELECT CAST(range AS DATE) AS d FROM "
            f"range(DATE '{lo}', DATE '{hi}' + INTERVAL 1 DAY, INTERVAL 1 DAY)) ORDER BY 1"
        ).fetchall()
    return [row[0] for row in rows]


@pytest.mark.parametrize("seed", range(6))
def test_buckets_and_fields_are_those_the_engine_computes_over_the_range(seed: int) -> None:
    rng = random.Random(seed)
    lo = dt.date(1999, 1, 1) + dt.timedelta(days=rng.randrange(0, 9000))
    hi = lo + dt.timedelta(days=rng.choice((0, 3, 40, 400, 1500, rng.randrange(0, 3000))))
    text = policy_text(d=f"{lo}, {hi}")
    for unit in UNITS:
        expected = engine_values(f"CAST(date_trunc('{unit}', CAST(d AS TIMESTAMP)) AS TIMESTAMP)", lo, hi)
        assert values(f"SELECT date_trunc('{unit}', d), COUNT(*) FROM t GROUP BY 1", text) == expected, unit
    for field in FIELDS:
        expected = engine_values(f"CAST(extract({field} FROM d) AS BIGINT)", lo, hi)
        assert values(f"SELECT extract({field} FROM d), COUNT(*) FROM t GROUP BY 1", text) == expected, field
    assert values("SELECT d, COUNT(*) FROM t GROUP BY d", text) == engine_values("d", lo, hi)


def test_long_ranges_hold_every_value_of_the_cyclic_fields() -> None:
    """Past 20,000 days every week number (53 included), day of the year (366 included) and so on
    occurs; checked against the engine over the whole range."""
    lo, hi = dt.date(1903, 3, 1), dt.date(1903, 3, 1) + dt.timedelta(days=20_001)
    text = policy_text(d=f"{lo}, {hi}")
    for field in ("week", "doy", "day", "dow", "quarter", "isoyear", "year"):
        expected = engine_values(f"CAST(extract({field} FROM d) AS BIGINT)", lo, hi)
        assert values(f"SELECT extract({field} FROM d), COUNT(*) FROM t GROUP BY 1", text) == expected


def test_weeks_start_on_monday_and_date_trunc_of_a_date_is_a_timestamp() -> None:
    query = keys_of("SELECT date_trunc('week', d) AS w, COUNT(*) FROM t GROUP BY w")
    (key,) = query.keys
    assert key.type is PgType.TIMESTAMP
    assert key.public_values[0] == dt.datetime(2022, 12, 26)  # the Monday of 2023-01-01's week
    assert all(v.weekday() == 0 for v in key.public_values)
    assert len(key.public_values) == 53
    assert not query.needs_selection and query.key_domain_size == 53
    assert [o.type for o in query.post_processing.outputs] == [PgType.TIMESTAMP, PgType.INT8]


def test_extract_and_date_part_stay_numeric() -> None:
    for sql in (
        "SELECT extract(month FROM d), COUNT(*) FROM t GROUP BY 1",
        "SELECT date_part('month', d), COUNT(*) FROM t GROUP BY 1",
    ):
        query = keys_of(sql)
        assert query.keys[0].type is PgType.NUMERIC
        assert list(query.keys[0].public_values) == list(range(1, 13))
        assert query.post_processing.outputs[0].type is PgType.NUMERIC


def test_timestamp_ranges_give_hours_and_utc_buckets() -> None:
    text = policy_text(
        ts="2023-03-01 22:30:00, 2023-03-02 01:10:00",
        tz="2023-03-01 22:30:00+02:00, 2023-03-02 01:10:00+00:00",
    )
    assert values("SELECT extract(hour FROM ts), COUNT(*) FROM t GROUP BY 1", text) == [0, 1, 22, 23]
    assert values("SELECT date_trunc('hour', ts), COUNT(*) FROM t GROUP BY 1", text) == [
        dt.datetime(2023, 3, 1, 22),
        dt.datetime(2023, 3, 1, 23),
        dt.datetime(2023, 3, 2, 0),
        dt.datetime(2023, 3, 2, 1),
    ]
    # A timestamptz's range is read in UTC (+02:00 is 20:30 UTC), as both backends compute in UTC.
    assert values("SELECT extract(hour FROM tz), COUNT(*) FROM t GROUP BY 1", text) == [0, 1, 20, 21, 22, 23]
    buckets = values("SELECT date_trunc('day', tz), COUNT(*) FROM t GROUP BY 1", text)
    assert buckets == [dt.datetime(2023, 3, 1, tzinfo=dt.UTC), dt.datetime(2023, 3, 2, tzinfo=dt.UTC)]
    # A timestamp's upper bound written as a date is the end of that day.
    assert values("SELECT date_trunc('month', ts), COUNT(*) FROM t GROUP BY 1")[-1] == dt.datetime(
        2023, 12, 1
    )


def test_grafana_time_groups_are_the_multiples_of_their_width_over_the_range() -> None:
    """Grafana's `$__timeGroup(col, '1h')` is `floor(extract(epoch from col)/3600)*3600`: seconds
    since 1970 (UTC), rounded down to the width; over a declared range, every multiple, as DuckDB
    computes them for each minute of the range (and through a WHERE's range, as `$__timeFilter`)."""
    text = policy_text(
        ts="2023-03-01 22:30:00, 2023-03-02 01:10:00",
        tz="2023-03-01 22:30:00+02:00, 2023-03-02 01:10:00+00:00",
    )
    hours = values("SELECT floor(extract(epoch FROM ts)/3600)*3600 AS time, COUNT(*) FROM t GROUP BY 1", text)
    with duckdb.connect() as conn:
        computed = conn.execute(
            "SELECT DISTINCT CAST(floor(epoch(m) / 3600) * 3600 AS BIGINT) FROM (SELECT range AS m FROM "
            "range(TIMESTAMP '2023-03-01 22:30:00', TIMESTAMP '2023-03-02 01:10:01', INTERVAL 1 MINUTE)) "
            "ORDER BY 1"
        ).fetchall()
    assert hours == [row[0] for row in computed] == [1677708000 + 3600 * i for i in range(4)]
    # A timestamptz in UTC (+02:00 is 20:30 UTC); a date's midnight.
    tz = values("SELECT floor(extract(epoch FROM tz)/3600)*3600, COUNT(*) FROM t GROUP BY 1", text)
    assert tz[0] == 1677702600 // 3600 * 3600 and len(tz) == 6
    days = values("SELECT floor(extract(epoch FROM d) / 86400) * 86400, COUNT(*) FROM t GROUP BY 1")
    assert len(days) == 365 and days[0] == 1672531200
    timed = values(
        'SELECT floor(extract(epoch from ts)/300)*300 AS "time", COUNT(*) FROM t '
        "WHERE ts BETWEEN '2023-03-01T23:00:00Z' AND '2023-03-01T23:30:00Z' GROUP BY 1 ORDER BY 1",
        text,
    )
    assert timed == [1677711600 + 300 * i for i in range(7)]
    # Other widths or shapes stay private keys.
    for key in (
        "floor(extract(epoch FROM ts)/3600)*60",
        "floor(extract(epoch FROM ts)/0.5)*0.5",
        "floor(extract(epoch FROM free)/60)*60",
    ):
        query = keys_of(f"SELECT {key}, COUNT(*) FROM t GROUP BY 1", text)
        assert query.needs_selection, key


def test_more_than_ten_thousand_values_go_through_partition_selection() -> None:
    text = policy_text(ts="2000-01-01, 2030-12-31")
    query = keys_of("SELECT date_trunc('day', ts), COUNT(*) FROM t GROUP BY 1", text)
    assert query.keys[0].public_values is None and query.needs_selection
    assert f"more than {MAX_KEY_VALUES:,}" in (query.keys[0].origin or "")
    assert len(values("SELECT date_trunc('month', ts), COUNT(*) FROM t GROUP BY 1", text)) == 372


@settings(max_examples=200, deadline=None)
@given(
    st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31)),
    st.sampled_from(("year", "quarter", "month", "week", "day", "hour", "minute", "second")),
    st.integers(min_value=-100_000, max_value=400_000_000),
)
def test_the_bucket_count_is_the_number_of_buckets_enumerated(
    lo: dt.datetime, unit: str, seconds: int
) -> None:
    """The 10,000-value cap is checked on a count, not on a walk of up to 10,000 buckets: the count
    is what walking from the first bucket to the one holding the range's end yields (up to 12,000)."""
    try:
        hi = lo + dt.timedelta(seconds=seconds)
    except OverflowError:
        return
    start = date_buckets.truncate(lo, unit)
    walked, current = 0, start
    while current is not None and current <= hi and walked < 12_000:
        walked += 1
        current = date_buckets.following(current, unit)
    counted = date_buckets.bucket_count(start, hi, unit)
    assert counted == walked or (walked == 12_000 and counted >= walked)


def test_a_column_without_a_range_and_other_expressions_keep_partition_selection() -> None:
    for sql in (
        "SELECT date_trunc('month', free), COUNT(*) FROM t GROUP BY 1",
        "SELECT extract(epoch FROM d), COUNT(*) FROM t GROUP BY 1",
        "SELECT date_trunc('month', d) + NULL, COUNT(*) FROM t GROUP BY 1",
        "SELECT ts, COUNT(*) FROM t GROUP BY 1",
        "SELECT x + 1, COUNT(*) FROM t GROUP BY 1",  # the column itself only
        "SELECT pid, COUNT(*) FROM t GROUP BY 1",  # an integer without a declared range
    ):
        try:
            query = keys_of(sql)
        except DPProxyError:
            continue
        assert query.needs_selection, sql


# -- a declared integer range ------------------------------------------------------------------


def test_an_integer_column_with_a_short_declared_range_is_a_public_key() -> None:
    query = keys_of("SELECT x, COUNT(*) FROM t GROUP BY 1")
    (key,) = query.keys
    assert key.public_values == tuple(range(0, 11)) and not query.needs_selection
    assert "the 11 integers of x's declared range 0 … 10" in (key.origin or "")
    assert values("SELECT x, COUNT(*) FROM t WHERE x BETWEEN 3 AND 5 GROUP BY 1") == [3, 4, 5]
    assert values("SELECT x, COUNT(*) FROM t WHERE x IN (2, 7, 99) GROUP BY 1") == [2, 7]


def test_an_integer_range_of_more_than_a_thousand_values_goes_through_partition_selection() -> None:
    assert (
        len(values("SELECT x, COUNT(*) FROM t GROUP BY 1", policy_text().replace("upper: 10", "upper: 999")))
        == 1000
    )
    wide = keys_of("SELECT x, COUNT(*) FROM t GROUP BY 1", policy_text().replace("upper: 10", "upper: 1000"))
    assert wide.keys[0].public_values is None and wide.needs_selection


# -- WHERE restricts the zero-filled keys ------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("d >= '2023-03-01' AND d < '2023-06-01'", [3, 4, 5]),
        ("d BETWEEN DATE '2023-11-15' AND '2024-03-01'", [11, 12]),
        ("d > TIMESTAMP '2023-02-28 12:00:00'", list(range(3, 13))),
        ("d = '2023-07-04'", [7]),
        ("d IN ('2023-02-01', '2023-04-30')", [2, 3, 4]),  # within the least and greatest
        ("extract(month FROM d) IN (1, 2)", [1, 2]),
        ("extract(month FROM d) <> 1 AND extract(month FROM d) <= 3", [2, 3]),
        ("NOT extract(month FROM d) IN (1, 2, 3, 4, 5, 6)", list(range(7, 13))),
        ("2 >= extract(month FROM d)", [1, 2]),
        ("d < '2023-03-01' OR d > '2023-10-01'", list(range(1, 13))),  # OR: no restriction
        ("x > 3", list(range(1, 13))),  # another column: no restriction
        ("d >= '2030-01-01'", list(range(1, 13))),  # admits no value of the range: none dropped
    ],
)
def test_a_where_on_the_key_or_its_column_restricts_the_keys(where: str, expected: list[int]) -> None:
    assert values(f"SELECT extract(month FROM d), COUNT(*) FROM t WHERE {where} GROUP BY 1") == expected


def test_a_where_on_the_buckets_and_on_declared_public_values() -> None:
    sql = "SELECT date_trunc('month', d), COUNT(*) FROM t WHERE date_trunc('month', d) >= '2023-11-01' GROUP BY 1"
    assert values(sql) == [dt.datetime(2023, 11, 1), dt.datetime(2023, 12, 1)]
    assert values("SELECT m, COUNT(*) FROM t WHERE m = 3 GROUP BY m") == [3]
    assert values("SELECT m, COUNT(*) FROM t WHERE m IN (2, 3, 7) AND x < 5 GROUP BY m") == [2, 3]
    query = keys_of(
        "SELECT m, extract(quarter FROM d), COUNT(*) FROM t WHERE m <> 2 AND d < '2023-04-01' GROUP BY 1, 2"
    )
    assert [list(k.public_values or ()) for k in query.keys] == [[1, 3], [1]]
    assert query.key_domain_size == 2


@pytest.mark.parametrize("key", ["CAST(ts AS date)", "ts::date", "CAST(tz AS date)", "CAST(d AS date)"])
def test_a_date_or_time_cast_to_date_is_a_public_key_of_the_days_of_its_range(key: str) -> None:
    """The flights per day written as a cast (time_hour::date) are the days of the range, as
    date_trunc('day', …) are (a timestamptz's in UTC); a WHERE on the column narrows them."""
    days = [dt.date(2023, 1, 1) + dt.timedelta(days=i) for i in range(365)]
    assert values(f"SELECT {key}, COUNT(*) FROM t GROUP BY 1") == days
    column = key.removeprefix("CAST(").split(" ")[0].split(":")[0]
    narrowed = values(f"SELECT {key}, COUNT(*) FROM t WHERE {column} >= '2023-12-30' GROUP BY 1")
    assert narrowed == days[-2:]
    assert values(f"SELECT {key}, COUNT(*) FROM t WHERE {key} = '2023-07-04' GROUP BY 1") == [
        dt.date(2023, 7, 4)
    ]


@pytest.mark.parametrize(
    ("sql", "contiguous"),
    [
        ("SELECT d, COUNT(*) FROM t GROUP BY 1", True),  # every day of the range
        ("SELECT date_trunc('week', ts), COUNT(*) FROM t GROUP BY 1", True),  # Mondays only
        ("SELECT x, COUNT(*) FROM t GROUP BY 1", True),  # the integers 0 … 10
        ("SELECT x, COUNT(*) FROM t WHERE x BETWEEN 2 AND 5 GROUP BY 1", True),  # a run of them
        ("SELECT x, COUNT(*) FROM t WHERE x IN (1, 3) GROUP BY 1", False),  # a gap: listed
        ("SELECT d, COUNT(*) FROM t WHERE d <> '2023-06-01' GROUP BY 1", False),
        ("SELECT extract(month FROM d), COUNT(*) FROM t GROUP BY 1", False),  # extract: listed
        ("SELECT m, COUNT(*) FROM t GROUP BY 1", False),  # declared public values: listed
    ],
)
def test_a_span_of_every_value_is_sent_as_its_ends_and_gaps_as_a_list(sql: str, contiguous: bool) -> None:
    """The rows read keep a key's public values: a span (every value the key can take between the
    first and the last) is tested as BETWEEN its ends, not a list of thousands of days; values with
    gaps, and the declared ones, are listed (tests/sql/language checks on adversarial data that no
    released key is outside its public values either way)."""
    engine = Engine(parse_policy(policy_text()), None)
    query = keys_of(sql)
    (key,) = query.keys
    assert key.contiguous is contiguous
    statement = engine.plan_private(query, 1.0, salt="s").statements[0]
    if contiguous:
        assert " BETWEEN " in statement and " IN (" not in statement
        assert len(statement) < 3000
    else:
        assert " IN (" in statement


# -- through the engine, on the demo data -------------------------------------------------------


@pytest.fixture(scope="module")
def demo_engine(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory):
    text = DEMO_POLICY.read_text()
    text = text.replace(
        "visit_date:       {type: date}",
        "visit_date:       {type: date, lower: 2023-01-01, upper: 2023-12-31}",
    ).replace("enrolled:   {type: date}", "enrolled:   {type: date, lower: 2018-01-01, upper: 2022-12-31}")
    with Engine.open(
        parse_policy(text), str(demo_duckdb), tmp_path_factory.mktemp("ledger") / "l.sqlite"
    ) as e:
        yield e


def test_buckets_are_released_zero_filled_without_partition_selection(demo_engine: Engine) -> None:
    sql = (
        "SELECT date_trunc('month', visit_date) AS month, COUNT(*) FROM visits "
        "WHERE cost > 1000000 GROUP BY month"  # cost is clipped to 20000: no row passes
    )
    explained = demo_engine.explain(sql)
    assert explained.selection is not None and explained.selection.startswith("all keys are public")
    assert "the 12 date_trunc('month') buckets of visit_date's declared range 2023-01-01 … 2023-12-31" in (
        explained.selection
    )
    assert explained.cost.delta == 0
    result = demo_engine.execute(sql, analyst="alice")
    assert [row[0] for row in result.rows] == [dt.datetime(2023, month, 1) for month in range(1, 13)]
    assert [c.type for c in result.columns] == [PgType.TIMESTAMP, PgType.INT8]
    assert not any("not shown" in note for note in result.notes)


def test_where_narrows_the_released_buckets(demo_engine: Engine) -> None:
    result = demo_engine.execute(
        "SELECT extract(quarter FROM visit_date), COUNT(*) FROM visits "
        "WHERE visit_date >= '2023-04-01' AND visit_date <= '2023-09-30' GROUP BY 1",
        analyst="alice",
    )
    assert [row[0] for row in result.rows] == [2, 3]


def test_values_are_clamped_into_the_declared_range_where_they_are_read(demo_engine: Engine) -> None:
    """Patients enrolled before 2018 count in the 2018 bucket, after 2022 in the 2022 one (one row and
    one group per patient: the exact per-group persons are the raw counts of the clamped years)."""
    plan = demo_engine.plan("SELECT date_trunc('year', enrolled), COUNT(*) FROM patients GROUP BY 1")
    assert not plan.query.needs_selection
    backend = demo_engine.backend_or_fail()
    exact = plan.measure(*(backend.run(sql) for sql in plan.statements))
    measured = dict(zip((k[0].year for k in exact.keys), exact.units, strict=True))
    raw = dict(
        backend.run(
            "SELECT LEAST(GREATEST(year(enrolled), 2018), 2022), COUNT(*) FROM patients "
            "WHERE enrolled IS NOT NULL GROUP BY 1"
        )
    )
    assert measured == raw
    assert "2018-01-01" in plan.statements[0] and "2022-12-31" in plan.statements[0]


def persons_per_key(engine: Engine, sql: str, raw_sql: str) -> tuple[dict, dict]:
    """The exact persons of each group of `sql`'s plan that has any, and `raw_sql`'s (key, persons)."""
    plan = engine.plan(sql)
    backend = engine.backend_or_fail()
    exact = plan.measure(*(backend.run(statement) for statement in plan.statements))
    measured = {k[0]: units for k, units in zip(exact.keys, exact.units, strict=True) if units}
    return measured, dict(backend.run(raw_sql))


def test_grafana_time_groups_count_the_rows_of_their_buckets(demo_engine: Engine) -> None:
    """A `$__timeGroup` key is public over visit_date's declared range (2023): 365 day buckets, no
    partition selection, and the buckets that hold rows are those of the raw dates (read at the
    range's ends when outside it)."""
    sql = "SELECT floor(extract(epoch from visit_date)/86400)*86400 AS time, COUNT(*) FROM visits GROUP BY 1"
    plan = demo_engine.plan(sql)
    assert not plan.query.needs_selection and len(plan.query.keys[0].public_values or ()) == 365
    measured, raw = persons_per_key(
        demo_engine,
        sql,
        "SELECT CAST(epoch(LEAST(GREATEST(visit_date, DATE '2023-01-01'), DATE '2023-12-31')) AS BIGINT), "
        "COUNT(DISTINCT patient_id) FROM visits WHERE visit_date IS NOT NULL GROUP BY 1",
    )
    # (a patient's days past the groups ceiling are not counted: at most the raw persons)
    assert set(measured) <= set(raw) and len(measured) > 0.9 * len(raw) > 270
    assert all(0 < measured[day] <= raw[day] for day in measured)


def test_integer_range_keys_are_released_zero_filled_and_clamped_where_read(demo_engine: Engine) -> None:
    """GROUP BY age (integer, declared 0–120): all 121 ages, no partition selection, and the exact
    per-group persons are the raw counts of the clamped ages."""
    sql = "SELECT age, COUNT(*) FROM patients GROUP BY 1"
    explained = demo_engine.explain(sql)
    assert explained.selection is not None and "the 121 integers of age's declared range 0 … 120" in (
        explained.selection
    )
    result = demo_engine.execute(sql, analyst="alice")
    assert [row[0] for row in result.rows] == list(range(121))
    measured, raw = persons_per_key(
        demo_engine,
        sql,
        "SELECT LEAST(GREATEST(age, 0), 120), COUNT(DISTINCT patient_id) FROM patients "
        "WHERE age IS NOT NULL GROUP BY 1",
    )
    assert measured == raw


def test_refusals_keep_their_sqlstates(demo_engine: Engine) -> None:
    cases = [
        (
            "SELECT date_trunc('fortnight', visit_date), COUNT(*) FROM visits GROUP BY 1",
            "22023",
            "not recognised",
        ),
        ("SELECT extract(hour FROM visit_date), COUNT(*) FROM visits GROUP BY 1", "0A000", 'unit "hour"'),
        ("SELECT visit_date, COUNT(*) FROM visits WHERE visit_date > '2023-02-30' GROUP BY 1", "22008", ""),
    ]
    for sql, sqlstate, fragment in cases:
        with pytest.raises(DPProxyError) as raised:
            demo_engine.execute(sql, analyst="alice")
        assert raised.value.sqlstate == sqlstate, (sql, raised.value)
        assert fragment in str(raised.value)


def test_plans_of_date_range_keys_are_cached(demo_engine: Engine) -> None:
    sql = "SELECT extract(dow FROM visit_date), COUNT(*) FROM visits GROUP BY 1"
    first = demo_engine.prepare(sql, epsilon=0.5)
    assert demo_engine.prepare(sql, epsilon=0.5) is first


def test_more_than_a_hundred_thousand_combinations_go_through_partition_selection() -> None:
    query = keys_of(
        "SELECT m, date_trunc('day', d), date_trunc('hour', ts), COUNT(*) FROM t GROUP BY 1, 2, 3"
    )
    m, day, hour = query.keys
    assert m.public_values == (1, 2, 3)  # declared: kept
    assert day.public_values is None and hour.public_values is None and query.needs_selection
    assert "more than 100,000 combinations" in (day.origin or "")
    small = keys_of("SELECT m, date_trunc('day', d), extract(hour FROM ts), COUNT(*) FROM t GROUP BY 1, 2, 3")
    assert small.key_domain_size == 3 * 365 * 24 and not small.needs_selection
