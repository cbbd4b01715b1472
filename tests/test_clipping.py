"""Value ranges chosen per query (dpproxy.engine.clipping; docs/privacy.md §3, "Value ranges chosen per
query"): an AVG, VAR or STDDEV of a column with a wide declared range is answered from a private
histogram of the column's values, then the statement with its argument clipped to the range the
histogram shows, under one charge of the statement's ε.

On a table of 2,000 persons, one row each, whose values x lie in 0–100 but for 20 persons at
5,000–10,000 (declared 0 to 10,000), through the real engine on DuckDB (and the demo data on
PostgreSQL): what reaches the backend, the range and the value released, the charge, the interval
columns of a group beyond the range, and which statements keep their declared range.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpproxy.backends import open_backend
from dpproxy.engine import Engine, Plan, clipping
from dpproxy.engine.clipping import (
    BINS,
    EXPRESSION_BINS,
    ONE_ROW,
    Column,
    chosen_range,
    clip_parts,
    clipped_tree,
    histogram_sql,
)
from dpproxy.errors import BudgetExhausted, PolicyError
from dpproxy.policy import ColumnPolicy, TablePolicy, column_type_from_sql, parse_policy
from dpproxy.sql.intervals import Interval
from tests.certify import certify, runner

PERSONS = 2000
OUTLIERS = 20
PER_BIN = "0.0032"  # 32 bins of 0 to 10,000: the histogram's constant


def _policy(
    *, replay: bool = False, budget: float = 100.0, fixed: bool = False, ranges: str = "chosen"
) -> str:
    return f"""
version: 1
defaults: {{epsilon: 0.5, delta: 1.0e-7, max_epsilon: 10000, replay: {str(replay).lower()}}}
analysts:
  alice: {{epsilon: {budget}, delta: 1.0e-3}}
tables:
  t:
    privacy_unit: pid
    max_rows_per_unit: 4
    max_groups_per_unit: 2
    contribution_bounds: {"fixed" if fixed else "chosen"}
    value_ranges: {ranges}
    columns:
      pid: {{type: integer, summable: false}}
      x: {{type: double precision, lower: 0, upper: 10000}}
      rating: {{type: integer, lower: 1, upper: 5}}
      g: {{type: text, public_values: [a, b]}}
      band: {{type: text, public_values: [near, far]}}
"""


def _value(i: int) -> float:
    """x of person i, as the table holds it."""
    return 5000.0 + 250 * i if i < OUTLIERS else float((i * 37) % 101)


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "t.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE t (pid INTEGER, x DOUBLE, rating INTEGER, g TEXT, band TEXT)")
        con.execute(
            f"""INSERT INTO t SELECT i,
                  CASE WHEN i < {OUTLIERS} THEN 5000 + 250 * i ELSE (i * 37) % 101 END,
                  1 + i % 5, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END,
                  CASE WHEN i < {OUTLIERS} THEN 'far' ELSE 'near' END
                FROM range({PERSONS}) r(i)"""
        )
    return path


class Spy:
    """The real DuckDB backend, recording each statement it runs."""

    def __init__(self, backend) -> None:  # type: ignore[no-untyped-def]
        self.backend = backend
        self.sent: list[str] = []

    def run(self, sql: str, **kwargs):  # type: ignore[no-untyped-def]
        self.sent.append(sql)
        return self.backend.run(sql, **kwargs)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.backend, name)


@pytest.fixture
def engine(database: Path, tmp_path: Path) -> Iterator[Engine]:
    with Engine.open(parse_policy(_policy()), str(database), tmp_path / "ledger.sqlite") as e:
        yield e


def _clipped(engine: Engine, sql: str, epsilon: float, column: str = "t.x"):  # type: ignore[no-untyped-def]
    """The answer of `sql` with `column`'s range chosen narrower than declared. Asked up to three
    times: in about 0.2% of histograms a bin of no one's noise reaches 3e and the range spans the
    declared one (docs/privacy.md §3), so one try in 500 would fail; three, one in 10^8."""
    for _ in range(3):
        result = engine.execute(sql, analyst="alice", epsilon=epsilon)
        if any(f"of {column}: values clipped to" in n for n in result.notes):
            return result
    raise AssertionError(f"{column} kept its declared range three times: {result.notes}")


def _range(notes: tuple[str, ...], column: str = "t.x", what: str = "averages") -> tuple[Decimal, Decimal]:
    [note] = [n for n in notes if f"{what} of {column}: values clipped to" in n]
    found = re.search(r"values clipped to (\S+) to (\S+) \(", note)
    assert found is not None
    return Decimal(found.group(1)), Decimal(found.group(2))


def test_an_average_of_a_wide_column_reads_a_histogram_then_the_clipped_statement(engine: Engine) -> None:
    spy = Spy(engine.backend)
    engine.backend = spy  # type: ignore[assignment]
    result = _clipped(engine, "SELECT AVG(x) FROM t", 0.5)
    tries = len(spy.sent) // 2
    assert len(spy.sent) == 2 * tries
    lower, upper = _range(result.notes)
    # The persons' values lie in 0–100 (bins of 312.5): the first bin, widened by three (1,250), and
    # by more when the noise of the 28 bins beyond, less its mean, reads over 3% of the persons.
    assert lower == 0 and Decimal(1250) <= upper <= Decimal(5000) and upper % Decimal("312.5") == 0
    # The bin is floor(x · 32 / 10,000): its constant is in the histogram only, the range's in the
    # clipped statement only.
    bound = format(upper.normalize(), "f")
    assert PER_BIN in spy.sent[-2] and bound not in spy.sent[-2]
    assert PER_BIN not in spy.sent[-1] and bound in spy.sent[-1]
    assert result.cost.epsilon == 0.5
    assert engine.budget("alice").spent.epsilon == 0.5 * tries  # one entry each: both statements
    explained = engine.explain("SELECT AVG(x) FROM t").render()
    assert "value ranges: averages of t.x (0 to 10000)" in explained


def test_the_value_released_is_the_average_of_the_clipped_values(engine: Engine) -> None:
    """At ε = 6 the noise is small: the answer is the clipped values' average (one row per person: no
    reweighting), not the raw one (which the 20 outliers lift from about 50 to 125), however the
    column is spelled. (At a far larger ε the histogram sees the outliers' bins, one or two persons
    each, and the range is kept.)"""
    result = _clipped(engine, "SELECT AVG(x), AVG(t.x) FROM t", 6)
    lower, upper = _range(result.notes)
    values = [_value(i) for i in range(PERSONS)]
    clipped = statistics.fmean(min(max(v, float(lower)), float(upper)) for v in values)
    raw = statistics.fmean(values)
    [(average, spelled)] = result.rows
    assert average == pytest.approx(clipped, abs=2) and spelled == pytest.approx(clipped, abs=2)
    assert abs(average - raw) > 50


def test_an_average_of_an_expression_is_clipped_to_a_range_chosen_for_it(engine: Engine) -> None:
    """AVG(x * 2): the expression's range is what the analyser derives from x's bounds (0 to 20,000);
    its histogram bins that range in EXPRESSION_BINS = 128 bins (a factor of 128 / 20,000: a derived
    range is wider than where the values lie) and the statement clips the expression itself, as a
    column's would be; the value released is the average of the clipped values."""
    spy = Spy(engine.backend)
    engine.backend = spy  # type: ignore[assignment]
    result = _clipped(engine, "SELECT AVG(x * 2) FROM t", 6, column="x * 2")
    lower, upper = _range(result.notes, column="x * 2")
    assert lower == 0 and upper < 10000 and upper % Decimal("156.25") == 0  # bins of 156.25
    assert any("the range its columns' bounds give it 0 to 20000" in n for n in result.notes)
    assert "0.0064" in spy.sent[-2] and "0.0064" not in spy.sent[-1]
    values = [2 * _value(i) for i in range(PERSONS)]
    clipped = statistics.fmean(min(max(v, float(lower)), float(upper)) for v in values)
    [(average,)] = result.rows
    assert average == pytest.approx(clipped, abs=4) and abs(average - statistics.fmean(values)) > 100
    assert (
        "value ranges: averages of x * 2 (0 to 20000)" in engine.explain("SELECT AVG(x * 2) FROM t").render()
    )


def test_one_expression_however_spelled_has_one_histogram_and_its_range_is_on_its_grid(
    engine: Engine,
) -> None:
    """`x*2`, `X*2` and `t.x*2` are one expression (one histogram, one range, one value); a derived
    bound with more digits than a constant may have ((x − 10) / 3 from −3.333…) is rounded outwards
    onto the grid, and the statement is clipped."""
    plan = engine.plan("SELECT AVG(x*2), AVG(X*2), AVG(t.x*2), AVG((x - 10) / 3) FROM t", epsilon=0.5)
    parts = clip_parts(engine, plan, None)
    assert parts is not None
    assert [(c.lower, c.upper) for c in parts.columns] == [(0, 20000), (Decimal("-3.34"), 3330)]
    result = _clipped(engine, "SELECT AVG(x*2), AVG(X*2), AVG(t.x*2) FROM t", 6, column="x * 2")
    [(a, b, c)] = result.rows
    assert a == b == c
    _clipped(engine, "SELECT AVG((x - 10) / 3) FROM t", 6, column="(x - 10) / 3")


def test_a_value_a_hair_below_its_bound_in_double_arithmetic_counts_in_the_first_bin() -> None:
    """(0 + 0.7) · 3 is 2.0999999999999996 in doubles, under the bound 2.1 the analyser derives: its
    bin is −1, which the histogram names and the range reads as the first bin (a person there was
    left out, and a table of such persons was clipped far above them)."""
    column = _column("2.1", "30002.1")
    counts = [(-1, 1200.0), (0, 5.0), (25, 800.0)]
    lower, _ = chosen_range(column, counts, 20.0)
    assert lower == Decimal("2.1")


def test_the_two_statements_cost_the_statements_epsilon_exactly(database: Path, tmp_path: Path) -> None:
    with Engine.open(parse_policy(_policy(budget=1.0)), str(database), tmp_path / "l.sqlite") as engine:
        for epsilon in (0.1, 0.3, 0.6):
            engine.execute("SELECT g, AVG(x) FROM t GROUP BY g", analyst="alice", epsilon=epsilon)
        assert engine.budget("alice").spent.epsilon <= 1.0
        with pytest.raises(BudgetExhausted):
            engine.execute("SELECT AVG(x) FROM t", analyst="alice", epsilon=1e-3)


def test_a_group_beyond_the_range_is_released_at_its_bound_with_an_interval_to_the_declared_one(
    engine: Engine,
) -> None:
    sql = "SELECT band, AVG(x), dp_interval_low(AVG(x)), dp_interval_high(AVG(x)) FROM t GROUP BY band"
    # The 20 far persons' values all lie beyond the range: their clipped average is its upper bound,
    # and their interval reaches it but for the noise's 2.5% below (asked up to three times).
    for _ in range(3):
        result = _clipped(engine, sql, 1.0)
        lower, upper = _range(result.notes)
        rows = {band: (value, low, high) for band, value, low, high in result.rows}
        value, _, high = rows["far"]
        assert value <= float(upper)  # the far persons' clipped values, noised, in the clipped range…
        if high >= float(upper):
            break
    assert high == 10000  # …but the truth (7,375) may lie anywhere out to the declared bound
    near = rows["near"]
    assert near[2] < float(upper) and near[1] >= float(lower)


def test_a_having_that_reads_no_average_keeps_the_range_chosen_and_filters_the_clipped_statement(
    engine: Engine,
) -> None:
    """HAVING COUNT(*) > n reads nothing clipping changes: the histogram reads every group (no
    HAVING there), the clipped statement keeps the HAVING (applied to the released values, as
    without clipping), and the range is chosen as without it."""
    spy = Spy(engine.backend)
    engine.backend = spy  # type: ignore[assignment]
    sql = "SELECT band, AVG(x) FROM t GROUP BY band HAVING COUNT(*) > 5"
    parts = clip_parts(engine, engine.plan(sql, epsilon=0.5), None)
    assert parts is not None and [c.policy.name for c in parts.columns] == ["x"]
    assert "HAVING" not in histogram_sql(parts, parts.columns[0]).upper()
    result = _clipped(engine, sql, 0.5)
    lower, upper = _range(result.notes)
    assert lower == 0 and upper < 10_000
    bound = format(upper.normalize(), "f")
    assert PER_BIN in spy.sent[-2] and bound in spy.sent[-1]
    column = parts.columns[0]
    tree, _ = clipped_tree(parts, {(column.table, column.policy.name): (lower, upper)})
    assert tree.args["having"].sql("postgres") == "HAVING COUNT(*) > 5"
    assert "value ranges: averages of t.x" in engine.explain(sql).render()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT AVG(rating) FROM t",  # 1 to 5: the column's own domain
        "SELECT SUM(x) FROM t",  # sums keep their range: a clipped total would lose what lies beyond
        "WITH s AS (SELECT pid, x FROM t) SELECT AVG(x) FROM s",
        "SELECT AVG(x) FILTER (WHERE g = 'a') FROM t WHERE x IN (SELECT 1)",
        "SELECT AVG(x + pid) FROM t",  # an expression of the privacy unit
        "SELECT STDDEV(x + pid) FROM t",  # a spread of an expression of the privacy unit
        "SELECT band, AVG(x) FROM t GROUP BY band HAVING AVG(x) > 1000",  # rows kept by clipped values
        "SELECT band, COUNT(*) FROM t GROUP BY band HAVING COUNT(*) > 1 AND STDDEV(x) < 50",  # a spread's
        "SELECT band, AVG(x) AS a FROM t GROUP BY band ORDER BY a DESC LIMIT 1",
        "SELECT AVG(x) FROM t WHERE pid < 300",  # 300 persons: too few to see a range (the note says so)
        "SELECT AVG(a.x), AVG(b.x) FROM t a JOIN t b ON a.pid = b.pid",  # one alias's range not the other's
    ],
)
def test_statements_that_keep_the_declared_range(engine: Engine, sql: str) -> None:
    spy = Spy(engine.backend)
    engine.backend = spy  # type: ignore[assignment]
    try:
        result = engine.execute(sql, analyst="alice", epsilon=0.5)
    except Exception:  # some are refused; none is clipped
        result = None
    if result is not None:
        assert not any("clipped to" in n for n in result.notes)
    if "pid < 300" in sql:  # asked, and kept
        assert result is not None and any("declared range 0 to 10000 kept" in n for n in result.notes)
        return
    assert not any(PER_BIN in s for s in spy.sent)  # no histogram
    if result is not None:
        assert "value ranges" not in engine.explain(sql).render()


def test_a_table_with_fixed_bounds_keeps_the_declared_range(database: Path, tmp_path: Path) -> None:
    with Engine.open(parse_policy(_policy(fixed=True)), str(database), None) as engine:
        result = engine.execute("SELECT AVG(x) FROM t", analyst="alice", epsilon=0.5)
        assert not any("clipped to" in n for n in result.notes)


def test_a_table_that_says_value_ranges_declared_keeps_the_declared_range(database: Path) -> None:
    with Engine.open(parse_policy(_policy(ranges="declared")), str(database), None) as engine:
        spy = Spy(engine.backend)
        engine.backend = spy  # type: ignore[assignment]
        result = engine.execute("SELECT AVG(x) FROM t", analyst="alice", epsilon=0.5)
        assert len(spy.sent) == 1 and not any("averages of t.x" in n for n in result.notes)
        assert "value ranges" not in engine.explain("SELECT AVG(x) FROM t").render()


def test_value_ranges_takes_chosen_or_declared() -> None:
    with pytest.raises(PolicyError) as refused:
        parse_policy(_policy(ranges="tight"))
    assert "tables.t.value_ranges" in str(refused.value) and "chosen" in str(refused.value)


def test_a_repeat_is_replayed_free(database: Path, tmp_path: Path) -> None:
    with Engine.open(parse_policy(_policy(replay=True)), str(database), tmp_path / "l.sqlite") as engine:
        first = engine.execute("SELECT AVG(x) FROM t", analyst="alice", epsilon=0.5)
        again = engine.execute("SELECT AVG(x) FROM t", analyst="alice", epsilon=0.5)
        assert again.replayed and again.rows == first.rows
        assert engine.budget("alice").spent.epsilon == 0.5


def _column(lower: str, upper: str, kind: str = "double precision") -> Column:
    policy = ColumnPolicy("x", column_type_from_sql(kind), Decimal(lower), Decimal(upper))
    return Column("t", policy, exp.column("x"))


def test_the_range_holds_the_bins_of_2e_persons_two_more_and_all_but_3_percent() -> None:
    """chosen_range on released counts (e = 10): the bins holding 3e = 30 or more, three more bins each
    side; then more while the bins beyond hold over 3% of the persons (less a sixth of e each, what
    noise clamped at 0 puts in an empty bin); the declared range over fewer than 20e persons, or when
    the range would not halve it."""
    column = _column("0", "3200")  # bins of 100
    bulk = [(0, 900.0), (1, 600.0), (2, 300.0)]
    assert chosen_range(column, bulk, 10.0) == (Decimal(0), Decimal(600))
    # 240 persons (13%) spread thin beyond, 15 a bin (under 2e each): the range reaches over them.
    thin = bulk + [(i, 15.0) for i in range(10, 26)]
    lower, upper = chosen_range(column, thin, 10.0)
    assert lower == 0 and upper >= 2500
    # A bin of noise far from the data that reaches 3e spans the range: declared, not a wrong one.
    assert chosen_range(column, [*bulk, (25, 35.0)], 10.0) == (Decimal(0), Decimal(3200))
    # Too few persons in all (under 200), or no bin of 3e: declared.
    assert chosen_range(column, [(0, 150.0), (1, 30.0)], 10.0) == (Decimal(0), Decimal(3200))
    assert chosen_range(column, [(i, 15.0) for i in range(32)], 10.0) == (Decimal(0), Decimal(3200))
    # Not half the declared width: declared.
    wide = [(i, 100.0) for i in range(15)]
    assert chosen_range(column, wide, 10.0) == (Decimal(0), Decimal(3200))
    # The upper bound itself (bin 32) counts in the last bin; integer columns round outwards.
    integer = _column("-5", "315", "integer")  # bins of 10
    assert chosen_range(integer, [(3, 500.0), (4, 200.0)], 10.0) == (Decimal(-5), Decimal(75))
    assert chosen_range(integer, [(31, 300.0), (32, 400.0)], 10.0) == (Decimal(275), Decimal(315))


def test_a_spreads_range_over_few_persons_is_the_bins_around_its_mode() -> None:
    """mode_range on released counts (e = 10): under 20e persons' worth in all (less e/6 a named bin),
    where chosen_range keeps the declared range, the bins holding 3e and three more on each side,
    when they hold 6e and the bins beyond no more than 3% plus twice their noise; None otherwise,
    with no bin held, or not half as wide."""
    column = _column("0", "3200")  # bins of 100
    few = [(5, 80.0), (6, 40.0), (20, 20.0)]  # 140, less 34 · 10/6: about 83 persons' worth
    assert chosen_range(column, few, 10.0) == (Decimal(0), Decimal(3200))
    assert clipping.mode_range(column, few, 10.0) == (Decimal(200), Decimal(1000))
    assert clipping.mode_range(column, [(5, 50.0), (6, 15.0)], 10.0) is None  # under 6e within
    # A second crowd beyond, no bin of it reaching 3e (e = 20): 200 persons' worth against twice the
    # 24 bins' noise (about 65) and 3%: not the range of these values.
    two = [(5, 160.0), (6, 80.0)]
    assert clipping.mode_range(column, two, 20.0) == (Decimal(200), Decimal(1000))
    assert clipping.mode_range(column, [*two, *[(i, 40.0) for i in range(15, 20)]], 20.0) is None
    assert clipping.mode_range(column, [(5, 900.0), (6, 600.0)], 10.0) is None  # chosen_range's
    assert clipping.mode_range(column, [(i, 25.0) for i in range(5)], 10.0) is None  # no bin of 3e
    assert clipping.mode_range(column, [(3, 50.0), (20, 50.0)], 10.0) is None  # not half as wide
    assert clipping.mode_range(column, few, None) is None


def test_the_noise_of_empty_bins_counts_for_no_one_in_the_total() -> None:
    """Noise clamped at 0 puts about e/6 in a bin that holds no one: over an expression's 130 named
    bins that is about 22e, more than the 20e persons a range needs. A review saw 500 persons'
    expression narrowed in 30 runs of 40, 12% of them cut. It is taken out of the total (e = 10)."""
    expression = Column("t", ColumnPolicy("x * 2", column_type_from_sql("numeric"), Decimal(0), Decimal(12800)),
                        sqlglot.parse_one("x * 2"), expression=True)  # fmt: skip
    assert expression.bins == EXPRESSION_BINS  # bins of 100
    noise = [(i, 1.6) for i in range(-1, EXPRESSION_BINS + 1)]  # 208 in all, of no one
    assert chosen_range(expression, [*noise, (3, 40.0)], 10.0) == (Decimal(0), Decimal(12800))
    # Persons enough beside that noise: the range of their bins, three more on each side.
    assert chosen_range(expression, [*noise, (3, 400.0)], 10.0) == (Decimal(0), Decimal(700))


def test_a_range_too_wide_for_the_bins_factor_keeps_its_declared_range() -> None:
    """BINS / (upper − lower) is written with 12 decimals: a range over 3.2e10 wide would have it
    rounded by more than 0.05% (0 to 2.4e13: 1e-12 for 1.33e-12, every bin a quarter off), so it is
    not narrowed; below, the bins' edges are read from the rounded factor, as the SQL computes them."""
    tables = {
        "t": TablePolicy(
            "t",
            (
                ColumnPolicy("pid", column_type_from_sql("integer")),
                ColumnPolicy("x", column_type_from_sql("bigint"), Decimal(0), Decimal("2.4e13")),
            ),
            privacy_unit="pid",
        )
    }
    assert clipping._column(tables, exp.column("x")) is None
    column = _column("0", "30000000")
    assert column.per_bin == Decimal("0.000001066667")
    assert column.edge(1) == 1 / column.per_bin


def test_a_gaussian_policy_under_pure_accounting_spends_the_statements_delta_once(
    database: Path, tmp_path: Path
) -> None:
    """The histogram is noised with Laplace under pure accounting (public keys, one row per person:
    δ = 0), so the statement's δ is the clipped statement's alone, as EXPLAIN says (a Gaussian
    histogram spent the per-query δ once more)."""
    text = _policy().replace("max_epsilon: 10000,", "max_epsilon: 10000, mechanism: gaussian,")
    with Engine.open(parse_policy(text), str(database), tmp_path / "l.sqlite") as engine:
        planned = engine.plan("SELECT band, AVG(x) FROM t GROUP BY band", epsilon=0.5).cost
        result = _clipped(engine, "SELECT band, AVG(x) FROM t GROUP BY band", 0.5)
        assert result.cost.delta == planned.delta > 0
        assert engine.budget("alice").spent.delta <= 3 * planned.delta


def test_a_range_released_to_an_analyst_is_used_again_over_the_same_rows(
    database: Path, tmp_path: Path
) -> None:
    """With replay on, the range of a column over the same rows (tables, joins, WHERE) released to an
    analyst earlier in the data epoch is used again: one statement, the whole ε for it, the NOTICE
    says so. Another WHERE asks a histogram of its own; another analyst never reads it."""
    text = _policy(replay=True).replace("analysts:\n", "analysts:\n  bob: {epsilon: 100, delta: 1.0e-3}\n")
    with Engine.open(parse_policy(text), str(database), tmp_path / "l.sqlite") as engine:
        spy = Spy(engine.backend)
        engine.backend = spy  # type: ignore[assignment]
        first = engine.execute("SELECT g, AVG(x) FROM t GROUP BY g", analyst="alice", epsilon=0.5)
        assert len(spy.sent) == 2
        [chosen] = [n for n in first.notes if "averages of t.x" in n]
        again = engine.execute("SELECT band, AVG(x) FROM t GROUP BY band", analyst="alice", epsilon=0.5)
        assert len(spy.sent) == 3 and again.cost.epsilon == 0.5
        [reused] = [n for n in again.notes if "averages of t.x" in n]
        assert "released to you earlier over the same rows (no ε spent on it now)" in reused
        if "values clipped to" in chosen:
            assert _range(first.notes) == _range(again.notes)
            assert format(_range(first.notes)[1], "f") in spy.sent[-1]
        assert engine.budget("alice").spent.epsilon == 1.0
        engine.execute("SELECT band, AVG(x) FROM t WHERE g = 'a' GROUP BY band", analyst="alice", epsilon=0.5)
        assert len(spy.sent) == 5  # another WHERE: its own histogram
        engine.execute("SELECT band, AVG(x) FROM t GROUP BY band", analyst="bob", epsilon=0.5)
        assert len(spy.sent) == 7  # another analyst: their own


def test_postgresql_answers_the_same_statements(demo_pg_dsn: str) -> None:
    """The histogram's bin (floor of a numeric, cast to integer) and the clipped statement run on
    PostgreSQL: the demo's visit costs (declared 0 to 20,000) are clipped to a range chosen privately
    that holds their median."""
    policy = Path(__file__).parent.parent / "policies" / "demo.yaml"
    sql = "SELECT department, AVG(cost), STDDEV(cost), AVG(duration_minutes) FROM visits GROUP BY department"
    with Engine.open(policy, demo_pg_dsn, None) as engine:
        result = _clipped(engine, sql, 1.0, "visits.cost")
        lower, upper = _range(result.notes, "visits.cost")
        assert 2 * (upper - lower) <= 20000
        # STDDEV(cost) reads the range widened by its width on each side it narrows
        assert _range(result.notes, "visits.cost", "spreads") == clipping.spread_range(
            clipping.Column(
                "visits", engine.policy.table("visits").column("cost"), sqlglot.exp.column("cost")
            ),
            (lower, upper),
        )
        assert len(result.rows) == 8
        # The answer's columns are those Describe gives (what a driver was told before it ran).
        described = engine.describe(sql).columns
        assert [(c.name, c.type) for c in result.columns] == [(c.name, c.type) for c in described]
    backend = open_backend(demo_pg_dsn)
    try:
        [(median,)] = backend.run("SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY cost) FROM visits")
        assert lower <= median <= upper
    finally:
        backend.close()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 7),
            st.one_of(st.none(), st.floats(-100, 12000, allow_nan=False)),
            st.sampled_from(["near", "far"]),
        ),
        min_size=1,
        max_size=25,
    ),
    lower=st.integers(0, 9000),
    width=st.integers(1, 5000),
    expression=st.booleans(),
)
def test_the_histogram_and_the_clipped_statement_are_certified(
    rows: list[tuple[int, float | None, str]], lower: int, width: int, expression: bool
) -> None:
    """Both statements the clipping sends, for a column or an expression of it, over any data and any
    range the histogram could give: every value each releases moves by at most its sensitivity when
    a person is removed (the certificate of tests/certify.py, on DuckDB)."""
    engine = Engine(parse_policy(_policy()), None, dialect="duckdb")
    con = duckdb.connect()
    con.execute("CREATE TABLE t (pid INTEGER, x DOUBLE, rating INTEGER, g TEXT, band TEXT)")
    con.executemany("INSERT INTO t VALUES (?, ?, 3, 'a', ?)", rows)
    run = runner("duckdb", con)

    argument = "x * 2 - 100" if expression else "x"
    plan = engine.plan(
        f"SELECT band, AVG({argument}), STDDEV_POP(x), VAR_SAMP({argument}) FROM t GROUP BY band", epsilon=0.5
    )
    parts = clip_parts(engine, plan, None)
    assert parts is not None
    assert sorted(c.expression for c in parts.columns) == ([False, True] if expression else [False])
    persons = {pid for pid, _, _ in rows}
    ranges = {}
    for column in parts.columns:
        histogram = engine.prepare(histogram_sql(parts, column), epsilon=0.1, bounds=ONE_ROW)
        assert isinstance(histogram, Plan)
        certify(histogram, run, persons)
        ranges[(column.table, column.policy.name)] = (
            column.lower + lower,
            min(column.lower + lower + width, column.upper),
        )
    tree, _ = clipped_tree(parts, ranges)
    # The spread's argument is clipped too (to the range widened), unless the range is the declared one.
    assert any("stddev" in node.sql("postgres").lower() for node in tree.find_all(*clipping.SPREADS))
    main = engine.plan(tree.sql("postgres"), epsilon=0.4)
    certify(main, run, persons)


def test_an_expressions_derived_range_is_binned_finer_than_a_declared_one(engine: Engine) -> None:
    """An expression's derived range (what its columns' bounds allow) gets EXPRESSION_BINS bins; a
    column's declared range, and a FILTER's (its column's range under a CASE), get BINS."""
    plan = engine.plan("SELECT AVG(x * 2), AVG(x) FILTER (WHERE x > 1), AVG(x) FROM t", epsilon=0.5)
    parts = clip_parts(engine, plan, None)
    assert parts is not None
    assert sorted(c.bins for c in parts.columns) == [BINS, BINS, EXPRESSION_BINS]
    (expression,) = [c for c in parts.columns if c.bins == EXPRESSION_BINS]
    assert expression.label == "x * 2" and expression.per_bin == Decimal("0.0064")
    # Parentheses and casts keep a column's range; a FILTER'd expression has the expression's.
    for sql, bins in [
        ("(x)", BINS),
        ("CAST(x AS DOUBLE PRECISION)", BINS),
        ("CASE WHEN x > 1 THEN x ELSE -1 END", BINS),
        ("CASE WHEN x > 1 THEN x * 2 END", EXPRESSION_BINS),
        ("-x", EXPRESSION_BINS),
    ]:
        assert clipping._bins(sqlglot.parse_one(sql, read="postgres")) == bins, sql


def test_a_spread_reads_the_averages_range_widened_by_its_width(engine: Engine) -> None:
    """VAR and STDDEV of a wide column are clipped too, to the range the histogram shows widened by its
    own width on each side it narrows the declared one (clipping.spread_range): a spread is ruled by
    its tails, which the histogram cannot see at its share of ε."""
    spy = Spy(engine.backend)
    engine.backend = spy  # type: ignore[assignment]
    result = _clipped(engine, "SELECT STDDEV(x), VAR_POP(x) FROM t", 0.5)
    lower, upper = _range(result.notes, what="spreads")
    assert not any(n.startswith("averages of") for n in result.notes)  # no AVG: no averages' note
    # The averages' range is 0 to 1,250–5,000 (the first test): the spread's is twice that.
    assert lower == 0 and Decimal(2500) <= upper <= Decimal(10000) and upper % Decimal("625") == 0
    assert "then widened by its width on each side it narrows" in result.notes[-1]
    assert PER_BIN in spy.sent[-2] and format(upper.normalize(), "f") in spy.sent[-1]
    assert clipping.spread_range(
        Column("t", engine.policy.table("t").column("x"), exp.column("x")), (Decimal(0), upper / 2)
    ) == (lower, upper)
    explained = engine.explain("SELECT STDDEV(x) FROM t").render()
    assert "value ranges: spreads of t.x (0 to 10000)" in explained
    assert (
        "spreads' arguments clipped to that range widened by its width on each side it narrows" in explained
    )
    # Both ends narrowed: widened on both sides, never past the declared range.
    column = Column("t", engine.policy.table("t").column("x"), exp.column("x"))
    assert clipping.spread_range(column, (Decimal(4000), Decimal(5000))) == (Decimal(3000), Decimal(6000))
    assert clipping.spread_range(column, (Decimal(500), Decimal(6000))) == (Decimal(0), Decimal(10000))


def test_a_spread_over_few_persons_reads_the_bins_around_its_mode(database: Path, tmp_path: Path) -> None:
    """400 persons (values 0 to 100; the histogram's e is about 36 at ε = 0.5): too few for a range an
    AVG could read (about 720), enough for a spread's (about 216, clipping.mode_range): the bins
    holding 3e and three more (0 to 1,250), not widened, and the NOTICE says what it cuts. The same
    column averaged in the statement keeps the averages' rule; with replay on, each reads its own
    range again over the same rows. A spreads-only statement's k aims at the persons' median
    rows. Per group the histogram's mode may be another group's: the declared range."""
    few = "FROM t WHERE pid >= 1600"
    with Engine.open(parse_policy(_policy(replay=True)), str(database), tmp_path / "l.sqlite") as engine:
        spy = Spy(engine.backend)
        engine.backend = spy  # type: ignore[assignment]
        result = _clipped(engine, f"SELECT STDDEV(x) {few}", 0.5)
        assert _range(result.notes, what="spreads") == (Decimal(0), Decimal(1250))
        [note] = [n for n in result.notes if n.startswith("spreads of t.x")]
        assert "the bins around the most common values" in note and "which makes a spread smaller" in note
        assert "1250" in spy.sent[-1]
        # Over the same rows an AVG reads the range that histogram gave an AVG (kept: too few
        # persons), and another spread the range around the mode, neither asking a histogram again.
        sent = len(spy.sent)
        mixed = engine.execute(f"SELECT AVG(x) {few}", analyst="alice", epsilon=0.5)
        assert len(spy.sent) == sent + 1
        assert any(n.startswith("averages of t.x: its declared range 0 to 10000 kept") for n in mixed.notes)
        again = engine.execute(f"SELECT VAR_POP(x) {few}", analyst="alice", epsilon=0.5)
        assert len(spy.sent) == sent + 2
        assert _range(again.notes, what="spreads") == (Decimal(0), Decimal(1250))
        explained = engine.explain(f"SELECT STDDEV(x) {few}").render()
        assert (
            "(without a GROUP BY, a column only spreads read over too few persons: the bins around its mode)"
            in (explained)
        )
        plan = engine.plan(f"SELECT STDDEV(x), VAR_POP(x) {few}", epsilon=0.5)
        assert [(c.kind, c.half, c.lower) for c in plan.noise.choices] == [("rows", True, False)]
        plan = engine.plan(f"SELECT AVG(x), STDDEV(x) {few}", epsilon=0.5)
        assert [(c.kind, c.half, c.lower) for c in plan.noise.choices] == [("rows", False, False)]
        grouped = engine.execute(f"SELECT g, STDDEV(x) {few} GROUP BY g", analyst="alice", epsilon=0.5)
        assert not any("the bins around the most common values" in n for n in grouped.notes)


def test_a_clipped_spread_is_released_with_its_declared_range_as_reach(engine: Engine) -> None:
    """The clipped statement's spreads carry the declared range (Aggregate.reach), as its AVGs do: the
    interval columns' high end reaches on to what that range allows (release/intervals.py), and a
    widened range that spans the declared one is said to be kept."""
    plan = engine.plan("SELECT AVG(x), STDDEV(x), VAR_POP(x) FROM t", epsilon=0.5)
    parts = clip_parts(engine, plan, None)
    assert parts is not None
    [column] = parts.columns
    tree, arguments = clipped_tree(parts, {(column.table, column.policy.name): (Decimal(0), Decimal(1000))})
    main = engine.analyze_tree(tree, answer=True)
    reached = clipping.with_reach(main, arguments)
    assert [(a.kind.name, a.reach) for a in reached.aggregates] == [
        (kind, Interval(Decimal(0), Decimal(10000))) for kind in ("AVG", "STDDEV_SAMP", "VAR_POP")
    ]
    # An averages' range of 3,000 to 7,000 widens to 0 to 10,000: the spreads keep the declared range.
    notes = clipping._notes(parts, column, (Decimal(3000), Decimal(7000)), 0.08)
    assert notes[1] == (
        "spreads of t.x: its declared range 0 to 10000 kept (the range a private histogram at ε = 0.08 "
        "found, widened by its width on each side it narrows, spans it)"
    )


def test_a_filtered_spread_and_a_spread_of_an_expression_are_clipped_too(engine: Engine) -> None:
    """A FILTER'd spread (the analyser's CASE of its column, the column's range and bins) and a spread
    of an expression (its derived range) are clipped as an AVG of them is, to their range widened."""
    plan = engine.plan("SELECT STDDEV(x) FILTER (WHERE x > 1), VAR_POP(x * 2) FROM t", epsilon=0.5)
    parts = clip_parts(engine, plan, None)
    assert parts is not None
    assert sorted((c.expression, c.bins) for c in parts.columns) == [(True, BINS), (True, EXPRESSION_BINS)]
    assert set(parts.spread) == {(c.table, c.policy.name) for c in parts.columns} and not parts.averaged
    ranges = {(c.table, c.policy.name): (c.lower, c.lower + (c.upper - c.lower) / 8) for c in parts.columns}
    tree, arguments = clipped_tree(parts, ranges)
    reached = clipping.with_reach(engine.analyze_tree(tree, answer=True), arguments)
    for column, aggregate in zip(
        sorted(parts.columns, key=lambda c: c.bins), reached.aggregates, strict=True
    ):
        low, high = clipping.spread_range(column, ranges[(column.table, column.policy.name)])
        assert low == column.lower and high == column.lower + (column.upper - column.lower) / 4
        assert format(high.normalize(), "f") in tree.sql("postgres")
        assert aggregate.reach == Interval(column.lower, column.upper)
