"""Issue 20, B4/B5/B8 without a backend: now() and constant date arithmetic folded once per statement
(dpproxy.sql.clock), FILTER (WHERE …) as the aggregate of a CASE (dpproxy.sql.folding), existence
probes answered with one row of their constants (dpproxy.sql.probes), and MIN/MAX of dates analysed
over their declared range (dpproxy.sql.aggregates). The SQL is the tools':
  - Metabase's relative filter "previous 30 days" on PostgreSQL (metabase:
    src/metabase/driver/postgres.clj, `add-interval-honeysql-form` and `->date`):
    `CAST((NOW() + INTERVAL '-30 day') AS date)`;
  - dbt's source freshness (dbt-postgres: `collect_freshness` selects `max(loaded_at)` and
    `{{ current_timestamp() }}`, which is `now()`);
  - Django's `.exists()` (django/db/models/sql/query.py, `exists`: `SELECT 1 AS "a" … LIMIT 1`) and
    `Max()` (`SELECT MAX("t"."d") AS "d__max" FROM "t"`);
  - Great Expectations' table check and connection tests (`SELECT 1 FROM t LIMIT 1`).
"""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest

from dpproxy.engine import Engine
from dpproxy.errors import DPProxyError
from dpproxy.policy import parse_policy
from dpproxy.sql.clock import CLOCK, Clock, parse_interval, reads_clock, session_clock
from dpproxy.sql.datetimes import epoch_grid, from_epoch_grid
from dpproxy.sql.folding import fold_constants
from dpproxy.sql.query import AggregateKind, ConstantQuery, PrivateQuery
from dpproxy.sql.statement import parse_statement
from dpproxy.sql.types import PgType
from tests.sql.language import schema

INSTANT = dt.datetime(2024, 3, 31, 23, 30, 15, 123456, tzinfo=dt.UTC)
PARIS = zoneinfo.ZoneInfo("Europe/Paris")


@pytest.fixture
def clock() -> object:
    token = CLOCK.set(Clock(INSTANT))
    yield
    CLOCK.reset(token)


def engine() -> Engine:
    return Engine(parse_policy(schema.policy_text(schema.LIMITS)), None)


def folded(expression: str, zone: dt.tzinfo = dt.UTC) -> str:
    token = CLOCK.set(Clock(INSTANT, zone))
    try:
        tree = fold_constants(parse_statement(f"SELECT 1 FROM t WHERE x = {expression}"))
    finally:
        CLOCK.reset(token)
    return tree.args["where"].this.expression.sql("postgres")


@pytest.mark.parametrize(
    ("expression", "constant"),
    [
        ("now()", "CAST('2024-03-31 23:30:15.123456+00' AS TIMESTAMPTZ)"),
        ("current_timestamp", "CAST('2024-03-31 23:30:15.123456+00' AS TIMESTAMPTZ)"),
        ("transaction_timestamp()", "CAST('2024-03-31 23:30:15.123456+00' AS TIMESTAMPTZ)"),
        ("current_timestamp(0)", "CAST('2024-03-31 23:30:15.000000+00' AS TIMESTAMPTZ)"),
        ("localtimestamp(3)", "CAST('2024-03-31 23:30:15.123000' AS TIMESTAMP)"),
        ("current_date", "CAST('2024-03-31' AS DATE)"),
        ("current_date - 30", "CAST('2024-03-01' AS DATE)"),
        ("CURRENT_DATE + 1", "CAST('2024-04-01' AS DATE)"),
        ("CAST((NOW() + INTERVAL '-30 day') AS date)", "CAST('2024-03-01' AS DATE)"),
        ("NOW() + INTERVAL '-30 day'", "CAST('2024-03-01 23:30:15.123456+00' AS TIMESTAMPTZ)"),
        ("current_date - INTERVAL '1 month'", "CAST('2024-02-29 00:00:00.000000' AS TIMESTAMP)"),
        ("date_trunc('month', now())", "CAST('2024-03-01 00:00:00.000000+00' AS TIMESTAMPTZ)"),
        ("date_trunc('week', current_date)", "CAST('2024-03-25 00:00:00.000000' AS TIMESTAMP)"),
        ("now() - '1 day 02:00:00'::interval", "CAST('2024-03-30 21:30:15.123456+00' AS TIMESTAMPTZ)"),
        ("CURRENT_DATE - 7 * INTERVAL '1 day'", "CAST('2024-03-24 00:00:00.000000' AS TIMESTAMP)"),
        ("current_date - DATE '2024-01-01'", "90"),
        ("DATE '2024-01-31' + INTERVAL '1 month'", "CAST('2024-02-29 00:00:00.000000' AS TIMESTAMP)"),
    ],
)
def test_now_and_date_arithmetic_fold_into_constants(expression: str, constant: str) -> None:
    assert folded(expression) == constant


@pytest.mark.parametrize(
    ("expression", "constant"),
    [
        # 23:30 UTC on 31 March is 01:30 on 1 April in Paris (summer time since 01:00 UTC).
        ("current_date", "CAST('2024-04-01' AS DATE)"),
        ("localtimestamp", "CAST('2024-04-01 01:30:15.123456' AS TIMESTAMP)"),
        ("date_trunc('day', now())", "CAST('2024-03-31 22:00:00.000000+00' AS TIMESTAMPTZ)"),
        # A day earlier on the wall clock is before the change of hour: 01:30 CET.
        ("now() - INTERVAL '1 day'", "CAST('2024-03-31 00:30:15.123456+00' AS TIMESTAMPTZ)"),
        ("CAST(now() AS date)", "CAST('2024-04-01' AS DATE)"),
    ],
)
def test_the_session_time_zone_decides_dates_and_wall_clock_arithmetic(
    expression: str, constant: str
) -> None:
    assert folded(expression, PARIS) == constant


def test_anything_else_is_left_for_the_analyzer() -> None:
    assert folded("DATE '2024-01-01'") == "CAST('2024-01-01' AS DATE)"
    assert folded("x + 1") == "x + 1"
    assert "INTERVAL" in folded("visit_date - INTERVAL '1 day'")


@pytest.mark.parametrize(
    ("text", "months", "days", "micros"),
    [
        ("30 days", 0, 30, 0),
        ("-30 day", 0, -30, 0),
        ("1 year 2 mons", 14, 0, 0),
        ("1.5 days", 0, 1, 43_200_000_000),
        ("1 day 02:30:00", 0, 1, 9_000_000_000),
        ("2 weeks ago", 0, -14, 0),
        ("90 minutes", 0, 0, 5_400_000_000),
    ],
)
def test_intervals_read_as_postgresql_reads_them(text: str, months: int, days: int, micros: int) -> None:
    span = parse_interval(text)
    assert (span.months, span.days, span.micros) == (months, days, micros)


def test_one_instant_for_a_statement_and_for_a_transaction_block() -> None:
    started = dt.datetime(2024, 1, 1, 12, tzinfo=dt.UTC)
    later = started + dt.timedelta(seconds=5)
    first = session_clock(None, started, "I", dt.UTC)
    assert first.instant == started
    assert session_clock(first, later, "I", dt.UTC).instant == later  # a new statement, a new now()
    assert session_clock(first, later, "T", PARIS) == Clock(started, PARIS)  # inside BEGIN … COMMIT


def test_a_statement_reading_the_clock_is_never_cached() -> None:
    e = engine()
    sql = "SELECT COUNT(*) FROM visits WHERE visit_date > current_date - 30"
    assert reads_clock(parse_statement(sql))
    texts = []
    for day in (1, 2):
        token = CLOCK.set(Clock(dt.datetime(2023, 6, day, tzinfo=dt.UTC)))
        try:
            texts.append(e.prepare(sql, epsilon=1.0).query.text)  # type: ignore[union-attr]
        finally:
            CLOCK.reset(token)
    assert "2023-05-02" in texts[0] and "2023-05-03" in texts[1]


def test_the_output_keeps_the_name_postgresql_gives(clock: object) -> None:
    query = engine().analyze("SELECT COUNT(*), current_date, now() AS snapshotted_at FROM visits")
    assert isinstance(query, PrivateQuery)
    outputs = [(o.name, o.type) for o in query.post_processing.outputs]
    assert outputs == [
        ("count", PgType.INT8),
        ("current_date", PgType.DATE),
        ("snapshotted_at", PgType.TIMESTAMPTZ),
    ]


# -- FILTER ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filtered", "written"),
    [
        (
            "SELECT COUNT(*) FILTER (WHERE age > 30) FROM patients",
            "SELECT COUNT(CASE WHEN (age > 30) THEN 1 END) FROM patients",
        ),
        (
            "SELECT department, SUM(cost) FILTER (WHERE duration > 10), AVG(cost) FROM visits GROUP BY 1",
            "SELECT department, SUM(CASE WHEN (duration > 10) THEN cost END), AVG(cost) FROM visits GROUP BY 1",
        ),
        (
            "SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY age) FILTER (WHERE smoker) FROM patients",
            "SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY CASE WHEN (smoker) THEN age END) FROM patients",
        ),
        (
            "SELECT COUNT(DISTINCT zip) FILTER (WHERE age < 40) FROM patients",
            "SELECT COUNT(DISTINCT CASE WHEN (age < 40) THEN zip END) FROM patients",
        ),
    ],
)
def test_filter_is_the_aggregate_of_a_case(filtered: str, written: str) -> None:
    e = engine()
    assert e.plan(filtered, salt="s").statements == e.plan(written, salt="s").statements
    names = [o.name for o in e.analyze(filtered).post_processing.outputs]  # type: ignore[union-attr]
    assert names == [o.name for o in e.analyze(written).post_processing.outputs]  # type: ignore[union-attr]


def test_filter_grants_nothing_the_rewritten_aggregate_would_not() -> None:
    with pytest.raises(DPProxyError) as caught:
        engine().analyze("SELECT SUM(visit_id) FILTER (WHERE cost > 1) FROM visits")
    assert caught.value.sqlstate == "42501"


# -- existence probes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "row", "names"),
    [
        ("SELECT 1 FROM patients LIMIT 1", (1,), ["?column?"]),
        ('SELECT 1 AS "a" FROM "visits" WHERE "visits"."cost" > 10 LIMIT 1', (1,), ["a"]),
        (
            "SELECT 1, 'x', NULL, TRUE AS t FROM public.patients p WHERE p.age > 3 LIMIT 1 OFFSET 0",
            None,
            None,
        ),
    ],
)
def test_existence_probes_answer_one_row_of_constants_free(
    sql: str, row: tuple | None, names: list | None
) -> None:
    e = Engine(
        parse_policy(schema.policy_text(schema.LIMITS) + "analysts:\n  a: {epsilon: 1, delta: 0.001}\n"), None
    )
    assert isinstance(e.analyze(sql), ConstantQuery)
    result = e.execute(sql, analyst="a")  # no backend: the answer cannot read data
    assert len(result.rows) == 1 and result.cost.epsilon == 0
    if row is not None:
        assert tuple(result.rows[0]) == row
        assert [c.name for c in result.columns] == names


@pytest.mark.parametrize(
    ("sql", "sqlstate"),
    [
        ("SELECT 1 FROM patients LIMIT 2", "42501"),  # up to two rows: a count
        ("SELECT 1 FROM patients LIMIT 1 OFFSET 1", "42501"),  # whether a second row exists
        ("SELECT age FROM patients LIMIT 1", "42501"),  # a value
        ("SELECT 1 FROM patients WHERE nosuch > 1 LIMIT 1", "42501"),  # the WHERE is checked
        ("SELECT 1 FROM nosuch LIMIT 1", "42501"),
    ],
)
def test_other_one_row_queries_are_still_refused(sql: str, sqlstate: str) -> None:
    with pytest.raises(DPProxyError) as caught:
        engine().analyze(sql)
    assert caught.value.sqlstate == sqlstate


# -- MIN and MAX of dates --------------------------------------------------------------------------


def test_min_max_of_dates_are_quantiles_over_the_declared_range() -> None:
    query = engine().analyze(
        "SELECT MIN(v.visit_date), MAX(v.checked_in), percentile_disc(0.5) WITHIN GROUP (ORDER BY p.seen) "
        "FROM visits v JOIN patients p ON p.patient_id = v.patient_id"
    )
    assert isinstance(query, PrivateQuery)
    assert [(a.kind, a.result_type) for a in query.aggregates] == [
        (AggregateKind.QUANTILE, PgType.DATE),
        (AggregateKind.QUANTILE, PgType.TIMESTAMPTZ),
        (AggregateKind.QUANTILE, PgType.TIMESTAMP),
    ]
    days = query.histograms[query.aggregates[0].histogram].interval
    assert days == epoch_grid((dt.date(2021, 11, 1), dt.date(2025, 3, 31)), PgType.DATE)
    assert from_epoch_grid(days.lo, PgType.DATE) == dt.date(2021, 11, 1)
    assert from_epoch_grid(days.hi, PgType.DATE) == dt.date(2025, 3, 31)


def test_epoch_grid_of_timestamps_is_whole_seconds_within_the_range() -> None:
    lo, hi = dt.datetime(2020, 1, 1, 0, 0, 0, 500000), dt.datetime(2020, 1, 2, 23, 59, 59, 999999)
    grid = epoch_grid((lo, hi), PgType.TIMESTAMP)
    assert from_epoch_grid(grid.lo, PgType.TIMESTAMP) == dt.datetime(2020, 1, 1, 0, 0, 1)
    assert from_epoch_grid(grid.hi, PgType.TIMESTAMP) == dt.datetime(2020, 1, 2, 23, 59, 59)
    aware = from_epoch_grid(grid.hi, PgType.TIMESTAMPTZ)
    assert aware == dt.datetime(2020, 1, 2, 23, 59, 59, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("sql", "sqlstate", "fragments"),
    [
        ("SELECT MAX(birth) FROM patients", "42501", ['"birth"', '"patients"', "lower: 2000-01-01"]),
        (
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY seen) FROM patients",
            "42883",
            ["percentile_disc"],
        ),
        ("SELECT MEDIAN(visit_date) FROM visits", "42883", ["median(date)"]),
        ("SELECT MAX(date_trunc('day', seen)) FROM patients", "0A000", ["declared range"]),
    ],
)
def test_dates_without_a_declared_range_are_refused_naming_the_column(
    sql: str, sqlstate: str, fragments: list[str]
) -> None:
    with pytest.raises(DPProxyError) as caught:
        engine().analyze(sql)
    assert caught.value.sqlstate == sqlstate
    text = str(caught.value)
    assert all(f in text for f in fragments), text
