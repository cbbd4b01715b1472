"""dp_interval_low(x) / dp_interval_high(x): each released aggregate's 95% interval as columns of the
answer, through Engine on the demo data (DuckDB), as an analyst (or a BI tool that never shows a
NOTICE) sees them.

Pinned: each end is the released value minus or plus its ± (the column's for counts and sums, the
group's own for AVG), clamped as the value is and rounded outwards, in the aggregate's result type; a
CAST or ROUND of the aggregate, or its output alias, keeps its interval; HAVING and ORDER BY read the
ends like any released value; Describe gives their types; what is refused, with which SQLSTATE and
message, before any data is read or budget spent.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from decimal import ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from dpproxy.engine import Engine
from dpproxy.errors import DPProxyError
from dpproxy.release.intervals import interval_column
from dpproxy.sql.intervals import Interval
from dpproxy.sql.query import Aggregate, AggregateKind
from dpproxy.sql.types import PgType

POLICY = Path(__file__).parent.parent.parent / "policies" / "demo.yaml"
MICRO = Decimal("0.000001")  # AVG is released with the column's scale + 4 decimals (income: 6)


@pytest.fixture
def engine(demo_duckdb: Path, tmp_path: Path) -> Iterator[Engine]:
    with Engine.open(POLICY, str(demo_duckdb), tmp_path / "ledger.sqlite") as e:
        yield e


def ask(engine: Engine, sql: str):
    return engine.execute(sql, analyst="alice", epsilon=1.0)


def test_count_per_group_is_its_value_plus_minus_the_columns_error(engine: Engine) -> None:
    result = ask(
        engine,
        "SELECT diagnosis, COUNT(*), dp_interval_low(COUNT(*)), dp_interval_high(COUNT(*)) "
        "FROM patients GROUP BY diagnosis",
    )
    assert [(c.name, c.type) for c in result.columns] == [
        ("diagnosis", PgType.VARCHAR),
        ("count", PgType.INT8),
        ("dp_interval_low", PgType.INT8),
        ("dp_interval_high", PgType.INT8),
    ]
    error = result.columns[1].error95
    assert error is not None and error == int(error)
    # The interval columns carry no ± of their own in the notice.
    assert result.columns[2].error95 is None and result.columns[3].error95 is None
    assert len(result.rows) == 6
    for _, count, low, high in result.rows:
        assert all(type(v) is int for v in (count, low, high))
        assert low == max(0, count - int(error)) and high == count + int(error)


def test_whole_table_count_sum_and_avg(engine: Engine) -> None:
    result = ask(
        engine,
        "SELECT COUNT(*), dp_interval_low(COUNT(*)), dp_interval_high(COUNT(*)), "
        "SUM(age), dp_interval_low(SUM(age)), dp_interval_high(SUM(age)), "
        "AVG(income), dp_interval_low(AVG(income)), dp_interval_high(AVG(income)) FROM patients",
    )
    types = [c.type for c in result.columns]
    assert types == [PgType.INT8] * 6 + [PgType.NUMERIC] * 3
    [(count, c_low, c_high, total, s_low, s_high, mean, a_low, a_high)] = result.rows
    e_count, e_sum, e_avg = (result.columns[i].error95 for i in (0, 3, 6))
    assert (c_low, c_high) == (max(0, count - int(e_count)), count + int(e_count))
    assert (s_low, s_high) == (max(0, total - int(e_sum)), total + int(e_sum))
    # One group: its own ± is the column's. Rounded outwards at the value's decimals, in the bounds.
    assert all(isinstance(v, Decimal) for v in (mean, a_low, a_high))
    exact = Decimal(e_avg)
    assert a_low == max(Decimal(0), (mean - exact).quantize(MICRO, rounding=ROUND_FLOOR))
    assert a_high == min(Decimal(500000), (mean + exact).quantize(MICRO, rounding=ROUND_CEILING))
    assert a_low <= mean <= a_high


def test_grouped_avg_uses_each_groups_own_error(engine: Engine) -> None:
    result = ask(
        engine,
        "SELECT sex, AVG(income), dp_interval_low(AVG(income)), dp_interval_high(AVG(income)) "
        "FROM patients GROUP BY sex",
    )
    column_error = Decimal(result.columns[1].error95)
    widths = []
    for _, mean, low, high in result.rows:
        assert Decimal(0) <= low <= mean <= high <= Decimal(500000)
        if low > 0 and high < 500000:  # not clamped: symmetric, up to the outward rounding
            assert abs((mean - low) - (high - mean)) <= MICRO
        widths.append(max(mean - low, high - mean))
        assert max(mean - low, high - mean) <= column_error + MICRO
    # The notice's figure is the largest group's (X has few persons): the others are narrower.
    assert max(widths) >= column_error - MICRO and min(widths) < column_error / 2


def test_casts_round_and_aliases_keep_the_interval(engine: Engine) -> None:
    result = ask(
        engine,
        "SELECT COUNT(*) AS n, dp_interval_low(n), dp_interval_high(COUNT(*)::int), "
        "AVG(income) AS mean, dp_interval_low(AVG(income)), dp_interval_low(ROUND(AVG(income), 1)), "
        "dp_interval_high(ROUND(mean, -3)), dp_interval_high(mean), "
        "dp_interval_low(CAST(AVG(age) AS double precision)), dp_interval_low(AVG(age)) FROM patients",
    )
    types = [c.type for c in result.columns]
    assert types == [
        PgType.INT8,
        PgType.INT8,
        PgType.INT4,
        PgType.NUMERIC,
        PgType.NUMERIC,
        PgType.NUMERIC,
        PgType.NUMERIC,
        PgType.NUMERIC,
        PgType.FLOAT8,
        PgType.NUMERIC,
    ]
    [(n, n_low, n_high_int, mean, low, low_rounded, high_rounded, high, age_low_float, age_low)] = result.rows
    error = int(result.columns[0].error95)
    assert n_low == max(0, n - error) and n_high_int == n + error
    # The same monotone transformation of the inner aggregate's interval, in the same release.
    assert low_rounded == low.quantize(Decimal("0.1"), rounding=ROUND_HALF_UP)
    assert high_rounded == high.quantize(Decimal("1E+3"), rounding=ROUND_HALF_UP)
    assert isinstance(age_low_float, float) and age_low_float == float(age_low)
    assert low <= mean <= high


def test_a_rounded_or_cast_aggregate_keeps_its_plus_minus_widened_by_the_unit_it_rounds_to(
    engine: Engine,
) -> None:
    """The NOTICE's ± of ROUND(AVG(x)::numeric, 1) is AVG's plus 0.1 (rounding the released and the
    true value moves each by at most half of it); of a double cast to an integer, plus 1; of a count
    cast to int4, the count's own (an accuracy audit found ROUND(AVG(…)::numeric, 1) with no ± at all)."""
    sql = (
        "SELECT diagnosis, AVG(income) AS a, ROUND(AVG(income)::numeric, 1) AS r, "
        "ROUND(AVG(income)::numeric, -3) AS k, CAST(AVG(age) AS int) AS i, AVG(age) AS f, "
        "COUNT(*)::int4 AS n, COUNT(*) AS c FROM patients GROUP BY diagnosis"
    )
    # One plan, one release: the plain and the wrapped columns share their aggregates.
    errors = {c.name: c.error95 for c in ask(engine, sql).columns}
    assert errors["a"] is not None and errors["f"] is not None and errors["c"] is not None
    assert errors["r"] == pytest.approx(errors["a"] + 0.1)
    assert errors["k"] == pytest.approx(errors["a"] + 1000)
    assert errors["i"] == pytest.approx(errors["f"] + 1)
    assert errors["n"] == errors["c"]


def test_having_and_order_by_read_the_interval(engine: Engine) -> None:
    result = ask(
        engine,
        "SELECT diagnosis, COUNT(*) AS n, dp_interval_low(n) AS low FROM patients GROUP BY diagnosis "
        "HAVING dp_interval_low(COUNT(*)) > 150 ORDER BY dp_interval_high(COUNT(*)) DESC, 1",
    )
    assert result.rows and all(low > 150 for _, _, low in result.rows)
    counts = [n for _, n, _ in result.rows]
    assert counts == sorted(counts, reverse=True)  # high = n + the same ±: sorted by n


def test_describe_gives_the_interval_columns_types(engine: Engine) -> None:
    description = engine.describe(
        "SELECT diagnosis, dp_interval_low(COUNT(*)), dp_interval_high(SUM(income)), "
        "dp_interval_low(AVG(age)::float8), dp_interval_high(ROUND(AVG(age))), dp_interval_low(COUNT(*)::int) "
        "FROM patients WHERE age > $1 GROUP BY diagnosis"
    )
    assert [(c.name, c.type) for c in description.columns] == [
        ("diagnosis", PgType.VARCHAR),
        ("dp_interval_low", PgType.INT8),
        ("dp_interval_high", PgType.NUMERIC),
        ("dp_interval_low", PgType.FLOAT8),
        ("dp_interval_high", PgType.NUMERIC),
        ("dp_interval_low", PgType.INT4),
    ]
    assert description.parameter_types == (PgType.INT4,)


REFUSED = [
    (
        "SELECT sex, MIN(age), dp_interval_low(MIN(age)) FROM patients GROUP BY sex",
        "0A000",
        "dp_interval_low(MIN(age)): MIN(age) is released by the exponential mechanism",
    ),
    (
        "SELECT sex, MAX(age), dp_interval_high(MAX(age)) FROM patients GROUP BY sex",
        "0A000",
        "dp_interval_high(MAX(age)): MAX(age) is released by the exponential mechanism",
    ),
    (
        "SELECT dp_interval_low(COUNT(*) + 1) FROM patients",
        "0A000",
        "dp_interval_low(COUNT(*) + 1): the argument is not a released aggregate",
    ),
    (
        "SELECT sex, dp_interval_low(sex), COUNT(*) FROM patients GROUP BY sex",
        "0A000",
        "dp_interval_low(sex): the argument is not a released aggregate",
    ),
    (
        "SELECT COUNT(*), dp_interval_low(CAST(COUNT(*) AS TEXT)) FROM patients",
        "0A000",
        "the argument is not a released aggregate",
    ),
    ("SELECT dp_interval_low(COUNT(*), 2) FROM patients", "42883", "function dp_interval_low(COUNT(*), 2)"),
    ("SELECT COUNT(*) FROM patients WHERE dp_interval_low(age) > 3", "42803", "not allowed in WHERE"),
    ("SELECT SUM(dp_interval_high(age)) FROM patients", "42803", "not allowed inside an aggregate"),
    (
        "SELECT COUNT(*) AS n, COUNT(*) AS n, dp_interval_low(n) FROM patients",
        "42702",
        'alias "n" is ambiguous',
    ),
    ("SELECT dp_interval_low(1)", "0A000", "dp_interval_low(1): dp_interval_low/high take an aggregate"),
]


@pytest.mark.parametrize(("sql", "sqlstate", "message"), REFUSED)
def test_refusals_name_what_was_written(engine: Engine, sql: str, sqlstate: str, message: str) -> None:
    with pytest.raises(DPProxyError) as caught:
        ask(engine, sql)
    assert caught.value.sqlstate == sqlstate
    assert message in caught.value.message
    assert engine.budget("alice").spent.epsilon == 0  # refused before anything was charged


def test_a_median_and_a_percentile_have_intervals_of_values(engine: Engine) -> None:
    """Two more picks per quantile (dpproxy.privacy.selectors.interval_shift): the ends are values of
    the column's range, in the result type, around the released value; the query costs what it was
    asked to (one more share inside the same ε)."""
    sql = (
        "SELECT diagnosis, MEDIAN(income) AS m, dp_interval_low(m), dp_interval_high(m), "
        "percentile_disc(0.9) WITHIN GROUP (ORDER BY age) AS p, dp_interval_low(p), dp_interval_high(p) "
        "FROM patients GROUP BY diagnosis"
    )
    plan = engine.plan(sql, epsilon=1.0)
    assert len(plan.noise.selectors) == 6  # each quantile's pick, then each one's two ends
    result = ask(engine, sql)
    assert result.cost.epsilon == pytest.approx(1.0)
    assert [c.type for c in result.columns[1:]] == [PgType.FLOAT8] * 3 + [PgType.INT4] * 3
    assert len(result.rows) == 6
    for _, m, m_low, m_high, p, p_low, p_high in result.rows:
        assert 0 <= m_low <= m <= m_high <= 500000
        assert 0 <= p_low <= p <= p_high <= 120 and all(type(v) is int for v in (p, p_low, p_high))


def _aggregate(kind: AggregateKind, result_type: PgType, lo: int = 0, hi: int = 100) -> Aggregate:
    interval = Interval(Decimal(lo), Decimal(hi))
    return Aggregate(kind, (0, 1), result_type, "x", interval, 2, (lo + hi) * 50)


def test_ends_are_clamped_as_the_value_is_and_rounded_outwards() -> None:
    count = _aggregate(AggregateKind.COUNT, PgType.INT8)
    assert interval_column(count, "low", [2, 40], [None, None], 9.0) == [0, 31]
    assert interval_column(count, "high", [2, 40], [None, None], 9.0) == [11, 49]
    average = _aggregate(AggregateKind.AVG, PgType.NUMERIC)
    values = [Decimal("95.500000"), Decimal("3.250000")]
    assert interval_column(average, "high", values, [10.0, 0.1], None) == [Decimal(100), Decimal("3.350001")]
    assert interval_column(average, "low", values, [10.0, 0.1], None) == [
        Decimal("85.500000"),
        Decimal("3.149999"),
    ]
    total = _aggregate(AggregateKind.SUM, PgType.NUMERIC, 0, 100)
    assert interval_column(total, "low", [Decimal("1.00")], [None], 5.5) == [Decimal(0)]
    negative = _aggregate(AggregateKind.SUM, PgType.INT8, -100, -1)
    assert interval_column(negative, "high", [-3], [None], 5.0) == [0]
    spread = _aggregate(AggregateKind.VAR_SAMP, PgType.NUMERIC)
    assert interval_column(spread, "low", [Decimal("1.5"), None], [4.0, None], None) == [Decimal(0), None]
    # Floats: the nearest float below / above the exact end, never across it.
    floats = _aggregate(AggregateKind.AVG, PgType.FLOAT8)
    value, error = 50.1, 0.2  # floats, read exactly below
    [low] = interval_column(floats, "low", [value], [error], None)
    [high] = interval_column(floats, "high", [value], [error], None)
    assert Decimal(low) <= Decimal(value) - Decimal(error) and Decimal(high) >= Decimal(value) + Decimal(
        error
    )
    assert high - low < 0.4 + 1e-12


def test_a_clipped_spreads_high_end_reaches_on_to_what_the_declared_range_allows() -> None:
    """A VAR or STDDEV whose argument was clipped to a range chosen per query (Aggregate.reach, the
    declared range): clipping only lowers a spread, so an end that reaches the most the clipped
    values' spread can be reaches on to the most the declared range's can be, and the population
    versions are clamped into the declared range's ceiling, not the clipped one's."""
    clipped = _aggregate(AggregateKind.STDDEV_POP, PgType.FLOAT8, 0, 100)  # at most 50 once clipped
    assert interval_column(clipped, "high", [49.0, 20.0], [2.0, 2.0], None) == [50.0, 22.0]
    reaching = replace(clipped, reach=Interval(Decimal(0), Decimal(1000)))  # declared: at most 500
    assert interval_column(reaching, "high", [49.0, 20.0], [2.0, 2.0], None) == [500.0, 22.0]
    assert interval_column(reaching, "low", [49.0, 1.0], [2.0, 2.0], None) == [47.0, 0.0]
    variance = replace(
        _aggregate(AggregateKind.VAR_POP, PgType.FLOAT8, 0, 100), reach=Interval(Decimal(0), Decimal(1000))
    )
    assert interval_column(variance, "high", [2490.0, 100.0], [20.0, 20.0], None) == [250000.0, 120.0]
    sample = replace(
        _aggregate(AggregateKind.STDDEV_SAMP, PgType.FLOAT8, 0, 100),
        reach=Interval(Decimal(0), Decimal(1000)),
    )
    assert interval_column(sample, "high", [49.0, 30.0], [2.0, 2.0], None) == [500.0, 32.0]
