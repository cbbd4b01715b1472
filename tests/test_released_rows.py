"""Queries over the answer of one private aggregate (issue 20, B1): answered from the released rows,
charged once for the aggregate, on both backends; what is not post-processing keeps its refusal."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from dpproxy.engine import Engine
from dpproxy.engine.released import run_over_rows
from dpproxy.errors import DPProxyError
from dpproxy.policy import parse_policy
from dpproxy.sql.released import ReleasedQuery
from tests.test_engine import POLICY

AGGREGATE = "SELECT department, COUNT(*) AS n FROM visits GROUP BY department"


@pytest.fixture(params=["duckdb", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Path):
    dsn = (
        str(request.getfixturevalue("demo_duckdb"))
        if request.param == "duckdb"
        else request.getfixturevalue("demo_pg_dsn")
    )
    # Replay on: a repeated question is answered with its stored answer, free (defaults.replay).
    text = POLICY.read_text().replace("defaults:\n", "defaults:\n  replay: true\n", 1)
    with Engine.open(parse_policy(text, source=str(POLICY)), dsn, tmp_path / "ledger.sqlite") as e:
        yield e


def spent(engine: Engine) -> float:
    return engine.budget("alice").spent.epsilon


def test_order_limit_and_reaggregation_read_the_released_rows_and_charge_once(engine: Engine) -> None:
    alone = engine.execute(AGGREGATE, analyst="alice")
    cost = spent(engine)
    assert alone.private and alone.cost.epsilon == pytest.approx(cost)
    released = {row[0]: row[1] for row in alone.rows}

    ordered = engine.execute(
        f"WITH agg AS ({AGGREGATE}) SELECT * FROM agg ORDER BY n DESC, department", analyst="alice"
    )
    # The same question inside: its stored answer, free; the outer query sorts those very rows.
    assert spent(engine) == pytest.approx(cost) and ordered.replayed
    assert [c.name for c in ordered.columns] == ["department", "n"]
    assert ordered.rows == sorted(released.items(), key=lambda kv: (-kv[1], kv[0]))

    total = engine.execute(
        f"SELECT SUM(n) AS total, COUNT(*) AS groups FROM ({AGGREGATE}) t", analyst="alice"
    )
    assert total.rows == [(sum(released.values()), len(released))]
    limited = engine.execute(f"SELECT * FROM ({AGGREGATE}) AS t LIMIT 2", analyst="alice")
    assert len(limited.rows) == min(2, len(released)) and spent(engine) == pytest.approx(cost)
    computed = engine.execute(
        f"SELECT upper(t.department) AS d, n * 2 AS twice FROM ({AGGREGATE}) t WHERE n > 0 ORDER BY 1",
        analyst="alice",
    )
    assert computed.rows == sorted((k.upper(), 2 * v) for k, v in released.items() if v > 0)
    # The ± of a column passed through is the aggregate's; a computed one has none.
    assert (
        computed.columns[1].error95 is None
        and ordered.columns[1].error95 == alone.columns[1].error95 is not None
    )


def test_a_fresh_aggregate_inside_is_charged_once(engine: Engine) -> None:
    sql = "SELECT count(*) FROM (SELECT zip, AVG(income) FROM patients GROUP BY zip) AS CXTMPTAB_COUNT"
    result = engine.execute(sql, analyst="alice")
    assert result.private and not result.replayed and result.cost.epsilon > 0
    assert spent(engine) == pytest.approx(result.cost.epsilon)
    assert [c.name for c in result.columns] == ["count"] and result.rows[0][0] >= 0
    assert "released rows of subquery cxtmptab_count" in result.notice  # type: ignore[operator]


def test_describe_and_explain_name_the_outer_querys_columns(engine: Engine) -> None:
    sql = f"SELECT department AS d, n + 1 AS m FROM ({AGGREGATE}) t"
    described = engine.describe(sql)
    assert [(c.name, c.type.value) for c in described.columns] == [
        ("d", "character varying"),
        ("m", "bigint"),
    ]
    assert described.private
    explained = engine.explain(sql)
    assert "released rows of subquery t" in (explained.subqueries or "") and explained.cost.epsilon > 0


@pytest.mark.parametrize(
    ("sql", "sqlstate", "fragment"),
    [
        # A column the answer does not have.
        (f"SELECT cost FROM ({AGGREGATE}) t", "42703", "its columns: department, n"),
        # The outer query reads a protected table too: not post-processing alone.
        (f"SELECT * FROM ({AGGREGATE}) t JOIN visits v ON v.department = t.department", "0A000", ""),
        # A per-person subquery keeps its own refusal (it is a step of a private query).
        (
            "SELECT AVG(n) FROM (SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id LIMIT 3) t",
            "0A000",
            "LIMIT is not supported in subquery t",
        ),
        # The inner aggregate's own refusal is the one shown.
        ("SELECT * FROM (SELECT zip, SUM(zip) FROM patients GROUP BY zip) t", "42883", "sum"),
        # Two columns of one name cannot be told apart.
        ("SELECT * FROM (SELECT COUNT(*), COUNT(age) FROM patients) t", "0A000", 'two columns named "count"'),
        # A subquery beside window functions is not post-processing either (it failed after the charge).
        (
            "SELECT diagnosis, SUM(COUNT(*)) OVER () + (SELECT count(*) FROM aggregates) FROM patients "
            "GROUP BY diagnosis",
            "42501",
            'table "aggregates" is not exposed',
        ),
    ],
)
def test_what_is_not_post_processing_is_refused_without_charge(
    engine: Engine, sql: str, sqlstate: str, fragment: str
) -> None:
    with pytest.raises(DPProxyError) as caught:
        engine.execute(sql, analyst="alice")
    assert caught.value.sqlstate == sqlstate and fragment in str(caught.value)
    assert "__agg" not in str(caught.value)
    assert spent(engine) == 0


def test_mathematical_functions_of_released_aggregates(engine: Engine) -> None:
    """`POWER(SUM(x), 2)` and friends in one SELECT are functions of the released values (PostgreSQL's
    result types: double precision from integers, numeric from numeric); outside a function's domain,
    NULL, as a division by zero is over released values."""
    result = engine.execute(
        "SELECT COUNT(*) AS n, sqrt(COUNT(*)) AS r, power(COUNT(*), 2) AS p, ln(COUNT(*) - COUNT(*) - 1) AS bad, "
        "log(AVG(age)) AS l, exp(AVG(age) - AVG(age)) AS one FROM patients",
        analyst="alice",
    )
    assert [c.type.value for c in result.columns] == [
        "bigint",
        "double precision",
        "double precision",
        "double precision",
        "numeric",
        "numeric",
    ]
    ((n, r, p, bad, log_age, one),) = result.rows
    assert r == pytest.approx(n**0.5) and p == pytest.approx(float(n) ** 2) and bad is None
    assert 1 < log_age < 2.1 and one == 1
    with pytest.raises(DPProxyError) as caught:
        engine.execute("SELECT repeat(sex, COUNT(*)) FROM patients GROUP BY sex", analyst="alice")
    assert caught.value.sqlstate == "0A000" and "REPEAT(sex, COUNT(*))" in caught.value.message
    assert "__" not in str(caught.value)


def test_an_outer_query_that_cannot_be_computed_is_refused_before_any_charge(engine: Engine) -> None:
    """Found by the random batch: an outer query DuckDB cannot bind ('…' + 1) used to fail after the
    aggregate was released and charged; it is now bound on no rows when the statement is analysed."""
    sql = f"WITH d AS ({AGGREGATE}) SELECT COUNT(*) FROM d WHERE ('2023-01-01T00:00:00Z' + 1) > 0"
    with pytest.raises(DPProxyError) as caught:
        engine.execute(sql, analyst="alice")
    assert caught.value.sqlstate == "22023" and "nothing was read or charged" in str(caught.value)
    assert spent(engine) == 0
    # Constants that fail only when a row is read (DuckDB evaluates them per row, not over none): a
    # long random run's smallint overflow. The analysis runs the outer query over a row of NULLs too.
    overflow = (
        f"WITH d AS ({AGGREGATE}) SELECT COUNT(*) FROM d "
        "WHERE concat('-0', CAST(32767 AS smallint) + CAST(1 AS smallint)) <> 'x'"
    )
    with pytest.raises(DPProxyError) as caught:
        engine.execute(overflow, analyst="alice")
    assert caught.value.sqlstate == "22023" and "nothing was read or charged" in str(caught.value)
    assert "Overflow" in str(caught.value) and spent(engine) == 0


# dbt 1.11's accepted_values test (dbt-core's macros/generic_test_sql/accepted_values.sql inside
# get_test_sql's wrapper), as dbt-postgres 1.11.0 sent it: post-processing of post-processing.
DBT_ACCEPTED_VALUES = """
    select
      count(*) as failures,
      count(*) != 0 as should_warn,
      count(*) != 0 as should_error
    from (
with all_values as (
    select
        department as value_field,
        count(*) as n_records
    from "demo"."public"."visits"
    group by department
)
select *
from all_values
where value_field not in (
    'er','gp'
)
    ) dbt_internal_test
"""


def test_a_query_over_a_query_over_released_rows_reads_them_and_charges_once(engine: Engine) -> None:
    alone = engine.execute(AGGREGATE, analyst="alice")
    cost = spent(engine)
    result = engine.execute(DBT_ACCEPTED_VALUES, analyst="alice")  # its own aggregate: charged once
    assert result.private and spent(engine) == pytest.approx(2 * cost)
    ((failures, warn, error),) = result.rows
    assert warn == error == (failures != 0) and 0 <= failures <= len(alone.rows)
    again = engine.execute(DBT_ACCEPTED_VALUES, analyst="alice")  # the same text: replayed, free
    assert again.rows == result.rows and spent(engine) == pytest.approx(2 * cost)
    # The aggregate asked alone, then two levels of post-processing over it: its stored answer.
    nested = engine.execute(
        f"SELECT COUNT(*) FROM (SELECT * FROM ({AGGREGATE}) a WHERE n > 0) b", analyst="alice"
    )
    assert nested.rows == [(sum(1 for _, n in alone.rows if n > 0),)] and spent(engine) == pytest.approx(
        2 * cost
    )


SHARES = (
    "SELECT department, COUNT(*), COUNT(*) * 100.0 / SUM(COUNT(*)) OVER () AS pct, "
    "RANK() OVER (ORDER BY COUNT(*) DESC) FROM visits GROUP BY department"
)


def test_window_functions_over_the_aggregates_of_one_select_read_its_released_groups(engine: Engine) -> None:
    """A share of the total, a rank: SQL computes window functions after GROUP BY, from the grouped
    rows alone; dpproxy computes them from the released groups, at the aggregate's cost only."""
    result = engine.execute(SHARES, analyst="alice")
    cost = spent(engine)
    assert result.private and cost > 0 and result.cost.epsilon == pytest.approx(cost)
    # (pct is double precision here, numeric in PostgreSQL: outer queries type a literal 100.0 as
    # sqlglot does, as a double.)
    assert [(c.name, c.type.value) for c in result.columns if c.name != "pct"] == [
        ("department", "character varying"),
        ("count", "bigint"),
        ("rank", "bigint"),
    ]
    counts = {row[0]: row[1] for row in result.rows}
    total = sum(counts.values())
    assert len(counts) >= 2 and total > 0
    for _, count, pct, rank in result.rows:
        assert float(pct) == pytest.approx(count * 100.0 / total)
        assert rank == 1 + sum(1 for other in counts.values() if other > count)
    # The count passes through with its ±; what the windows compute has none.
    assert result.columns[1].error95 is not None and result.columns[2].error95 is None
    assert "window functions were computed from the released groups" in result.notice  # type: ignore[operator]

    assert [c.name for c in engine.describe(SHARES).columns] == ["department", "count", "pct", "rank"]
    explained = engine.explain(SHARES)
    assert "released rows of the aggregates of this query" in (explained.subqueries or "")
    assert 'RANK() OVER (ORDER BY "aggregates"."__dp_agg_0" DESC)' in (explained.subqueries or "")

    # ORDER BY and LIMIT come after the windows: the total is still that of every released group.
    # The aggregate is the same question (replayed, free).
    first = engine.execute(f"{SHARES} ORDER BY pct DESC LIMIT 1", analyst="alice")
    assert spent(engine) == pytest.approx(cost) and first.replayed
    assert first.rows == [max(result.rows, key=lambda row: row[1])]

    # Over a CTE of rows (no aggregate of its own), with HAVING: lifted the same way.
    ranked = engine.execute(
        "WITH v AS (SELECT * FROM visits WHERE cost > 10) SELECT department, AVG(cost) AS a, "
        "ROW_NUMBER() OVER (ORDER BY AVG(cost)) AS r FROM v GROUP BY department HAVING COUNT(*) > 10",
        analyst="alice",
    )
    assert sorted(row[2] for row in ranked.rows) == list(range(1, len(ranked.rows) + 1))
    assert [row[2] for row in sorted(ranked.rows, key=lambda row: row[1])] == sorted(
        row[2] for row in ranked.rows
    )


def test_window_functions_partition_order_and_lag_over_grouped_keys(engine: Engine) -> None:
    result = engine.execute(
        "SELECT sex, department AS d, COUNT(*) AS n, "
        "SUM(COUNT(*)) OVER (PARTITION BY sex ORDER BY department) AS running, "
        "LAG(COUNT(*)) OVER (PARTITION BY sex ORDER BY department) AS before "
        "FROM visits v JOIN patients p ON v.patient_id = p.patient_id GROUP BY 1, d ORDER BY 1, 2",
        analyst="alice",
    )
    assert [c.name for c in result.columns] == ["sex", "d", "n", "running", "before"]
    assert result.rows == sorted(result.rows, key=lambda row: (row[0], row[1]))
    previous: dict[str, tuple[int, int]] = {}
    for sex, _, n, running, before in result.rows:
        so_far, last = previous.get(sex, (0, None))
        assert running == so_far + n and before == last
        previous[sex] = (so_far + n, n)


@pytest.mark.parametrize(
    ("sql", "fragment"),
    [
        # A window over rows, not over aggregates: raw values of the protected table.
        (
            "SELECT department, SUM(cost) OVER () FROM visits GROUP BY department",
            "over rows of a protected table",
        ),
        ("SELECT cost, SUM(cost) OVER () FROM visits", "over rows of a protected table"),
        ("SELECT COUNT(*) OVER (PARTITION BY department) FROM visits", "over rows of a protected table"),
    ],
)
def test_window_functions_over_rows_stay_refused(engine: Engine, sql: str, fragment: str) -> None:
    with pytest.raises(DPProxyError) as caught:
        engine.execute(sql, analyst="alice")
    assert caught.value.sqlstate == "0A000" and fragment in str(caught.value)
    assert spent(engine) == 0


def test_a_window_reads_keys_and_aggregates_not_output_aliases(engine: Engine) -> None:
    """In a select list an output alias names no column (PostgreSQL's rule): `SUM(n) OVER ()` with n
    an alias of COUNT(*) is not lifted, and the refusal names what is not supported."""
    with pytest.raises(DPProxyError) as caught:
        engine.execute(
            "SELECT department, COUNT(*) AS n, SUM(n) OVER () FROM visits GROUP BY 1", analyst="alice"
        )
    assert caught.value.sqlstate == "0A000" and spent(engine) == 0


def test_fetch_first_is_limit(engine: Engine) -> None:
    """`FETCH FIRST n ROWS ONLY` (SQL's spelling of LIMIT, what some tools send), `OFFSET m ROWS`,
    `FETCH NEXT ROW ONLY` (one row); WITH TIES is refused before anything is charged."""
    top = engine.execute(f"{AGGREGATE} ORDER BY n DESC FETCH FIRST 3 ROWS ONLY", analyst="alice")
    assert len(top.rows) == 3 and [r[1] for r in top.rows] == sorted((r[1] for r in top.rows), reverse=True)
    second = engine.execute(f"{AGGREGATE} ORDER BY n DESC OFFSET 1 ROWS FETCH NEXT ROW ONLY", analyst="alice")
    assert len(second.rows) == 1
    spent_before = spent(engine)
    with pytest.raises(DPProxyError) as caught:
        engine.execute(f"{AGGREGATE} ORDER BY n DESC FETCH FIRST 3 ROWS WITH TIES", analyst="alice")
    assert caught.value.sqlstate == "0A000" and "WITH TIES" in str(caught.value)
    assert spent(engine) == spent_before


def test_window_functions_beside_and_over_interval_ends(engine: Engine) -> None:
    """dp_interval_low/high in a lifted SELECT are columns of the aggregate like the aggregates
    themselves: beside a window, and read by one."""
    result = engine.execute(
        "SELECT department, COUNT(*) AS n, dp_interval_low(n) AS lo, dp_interval_high(n) AS hi, "
        "SUM(COUNT(*)) OVER () AS total, SUM(dp_interval_high(COUNT(*))) OVER () AS total_hi "
        "FROM visits GROUP BY 1",
        analyst="alice",
    )
    assert [c.name for c in result.columns] == ["department", "n", "lo", "hi", "total", "total_hi"]
    assert all(lo < n < hi for _, n, lo, hi, _, _ in result.rows)
    assert {row[4] for row in result.rows} == {sum(row[1] for row in result.rows)}
    assert {row[5] for row in result.rows} == {sum(row[3] for row in result.rows)}


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT CAST(32767 AS smallint) + CAST(1 AS smallint)", "smallint out of range"),
        ("SELECT -CAST(-32768 AS smallint)", "smallint out of range"),
        ("SELECT 2147483647 + 1", "integer out of range"),
        ("SELECT COUNT(*) FROM visits WHERE CAST(32767 AS smallint) + CAST(1 AS smallint) > 0", "smallint"),
        ("SELECT COUNT(*) FROM visits WHERE 9223372036854775807 + 1 > 0", "bigint out of range"),
        ("SELECT COUNT(*), 2147483647 + 1 FROM visits", "integer out of range"),
        ("SELECT COUNT(*) FROM visits HAVING COUNT(*) > ABS(CAST(-32768 AS smallint))", "smallint"),
        ("SELECT COUNT(*) FROM visits ORDER BY -CAST(-32768 AS smallint)", "smallint out of range"),
    ],
)
def test_integer_constants_that_leave_their_type_fail_before_any_charge(
    engine: Engine, demo_pg_dsn: str, sql: str, message: str
) -> None:
    """A constant's value depends on the text alone, so PostgreSQL's meaning is kept: 22003 when it
    leaves its type (integers are computed in bigint otherwise, so that no failure depends on the
    data), before anything is read or charged. PostgreSQL itself says the same of each statement."""
    with psycopg.connect(demo_pg_dsn) as conn, pytest.raises(psycopg.errors.NumericValueOutOfRange):
        conn.execute(sql)
    with pytest.raises(DPProxyError) as caught:
        engine.execute(sql, analyst="alice")
    assert caught.value.sqlstate == "22003" and message in caught.value.message
    assert spent(engine) == 0


def test_released_values_that_leave_their_type_fail_after_the_charge_as_postgresql_words_it(
    engine: Engine,
) -> None:
    """Over released values the failure depends on them alone (never on a true value): PostgreSQL's
    SQLSTATE and message, with the hint that the answer was charged (it used to be the fixed XX000 of
    a backend failure, or a smallint above 32767)."""
    for sql in (
        "SELECT CAST(COUNT(*) AS smallint) * CAST(100 AS smallint) FROM visits",
        "SELECT CAST(COUNT(*) * 100 AS smallint) FROM visits",
    ):
        before = spent(engine)
        with pytest.raises(DPProxyError) as caught:
            engine.execute(sql, analyst="alice")
        assert caught.value.sqlstate == "22003", sql
        assert caught.value.message == "smallint out of range"
        assert caught.value.hint == "the answer was released and charged; compute the rest in your client"
        assert spent(engine) > before


def test_a_share_of_a_windowed_sum_divides_as_postgresql_does(engine: Engine) -> None:
    """SUM of a bigint is numeric in PostgreSQL, so `COUNT(*) * 100 / SUM(COUNT(*)) OVER ()` is a
    numeric share, not an integer division: sqlglot typed SUM(bigint) bigint, and the shares came
    back truncated (0 for `n / SUM(n) OVER ()`)."""
    for sql in (
        "SELECT department, COUNT(*) * 100 / SUM(COUNT(*)) OVER () AS pct FROM visits GROUP BY 1",
        "SELECT department, 100 * n / SUM(n) OVER () AS pct FROM (SELECT department, COUNT(*) AS n "
        "FROM visits GROUP BY 1) t",
    ):
        result = engine.execute(sql, analyst="alice")
        assert result.columns[1].type.value == "numeric", sql
        shares = [row[1] for row in result.rows]
        assert any(share != int(share) for share in shares), shares
        assert abs(sum(shares) - 100) < Decimal("0.000001"), shares


def test_round_and_numeric_casts_of_any_size_are_postgresqls(engine: Engine, demo_pg_dsn: str) -> None:
    """round(x, d) clamps d as PostgreSQL's numeric_round does (at most 16,383 digits after the point)
    and is exact for values of any size; a cast to numeric(p, s) rounds, then fails with 22003 when
    the value needs more than p − s digits before the point. A long language run found round(100,
    2147483647) failing inside the engine (Python's decimal context holds 28 digits)."""
    constants = (
        "SELECT COUNT(*) AS n, round(100, 2147483647) AS wide, round(100, -2147483648) AS none, "
        "round(123456789012345678901234567890.5, 5) AS long, CAST(999.94 AS numeric(4,1)) AS fits FROM visits"
    )
    with psycopg.connect(demo_pg_dsn) as conn:
        expected = conn.execute(constants).fetchone()
    assert expected is not None
    answer = engine.execute(constants, analyst="alice").rows[0]
    assert answer[1:] == expected[1:] and len(str(answer[1])) == len(str(expected[1])) == 3 + 1 + 16383
    for sql in (
        "SELECT COUNT(*), CAST(999.95 AS numeric(4,1)) FROM visits",
        "SELECT COUNT(*), CAST(123456789012345678901234567890.5 AS bigint) FROM visits",
    ):
        with psycopg.connect(demo_pg_dsn) as conn, pytest.raises(psycopg.errors.NumericValueOutOfRange):
            conn.execute(sql)
        before = spent(engine)
        with pytest.raises(DPProxyError) as caught:
            engine.execute(sql, analyst="alice")
        assert caught.value.sqlstate == "22003", sql
        assert spent(engine) == before  # a constant: refused before anything is read or charged
    before = spent(engine)
    with pytest.raises(DPProxyError) as caught:
        engine.execute("SELECT CAST(COUNT(*) AS numeric(2, 0)) FROM visits", analyst="alice")
    assert caught.value.sqlstate == "22003" and caught.value.message == "numeric field overflow"
    assert (
        caught.value.hint is not None
        and "must round to an absolute value less than 10^2" in caught.value.hint
    )
    assert "the answer was released and charged" in caught.value.hint and spent(engine) > before


def test_a_window_that_reads_no_key_or_aggregate_counts_the_released_groups(engine: Engine) -> None:
    """`SELECT COUNT(*) OVER () … GROUP BY k` reads no key or aggregate of its SELECT: one row per
    group, each the number of groups, as in PostgreSQL. The aggregate answers the groups, their keys
    as hidden columns, and the window counts the released ones (it crashed the analysis: the
    aggregate had no column; found by a long language run). Over public values it is their number,
    free; with HAVING on a count, the count is noised and charged."""
    groups = engine.execute(
        "SELECT COUNT(*) OVER () AS groups FROM visits GROUP BY department", analyst="alice"
    )
    departments = engine.execute("SELECT department FROM visits GROUP BY department", analyst="alice")
    assert [c.name for c in groups.columns] == ["groups"]
    assert groups.rows == [(len(departments.rows),)] * len(departments.rows)
    numbered = engine.execute(
        "SELECT ROW_NUMBER() OVER () AS n FROM visits GROUP BY department ORDER BY 1 DESC", analyst="alice"
    )
    assert numbered.rows == [(n,) for n in range(len(departments.rows), 0, -1)]
    spent_before = spent(engine)
    kept = engine.execute(
        "SELECT COUNT(*) OVER () FROM visits GROUP BY department HAVING COUNT(*) > 0", analyst="alice"
    )
    assert spent(engine) > spent_before and len({row[0] for row in kept.rows}) <= 1


def test_floor_ceil_round_and_sign_of_a_released_integer_are_double_precision(
    engine: Engine, demo_pg_dsn: str
) -> None:
    """PostgreSQL resolves floor, ceil, round and sign of an integer to their double precision forms,
    and has no round(double precision, integer): over released values as over rows, the integer as a
    double, and round(x, n) of a double refused with 42883 before anything is charged (they were
    typed numeric and int4, and round(AVG(double), 1) was answered)."""
    expressions = [
        "floor(COUNT(*) / 1000)",
        "ceil(COUNT(*))",
        "round(COUNT(*))",
        "sign(COUNT(*) - 5)",
        "round(COUNT(*), 1)",
        "floor(AVG(cost))",
        "round(AVG(CAST(duration_minutes AS double precision)))",
    ]
    typed = ", ".join(f"pg_typeof({e})::text" for e in expressions)
    with psycopg.connect(demo_pg_dsn) as conn:
        expected = conn.execute(f"SELECT {typed} FROM visits").fetchone()
    assert expected == (*["double precision"] * 4, "numeric", "numeric", "double precision")
    result = engine.execute(f"SELECT {', '.join(expressions)} FROM visits", analyst="alice")
    assert tuple(c.type.value for c in result.columns) == expected
    assert [type(v) for v in result.rows[0]] == [float] * 4 + [Decimal, Decimal, float]
    assert result.rows[0][1] == float(int(result.rows[0][1])) == result.rows[0][2]  # the count itself
    refused = "SELECT round(AVG(CAST(duration_minutes AS double precision)), 1) FROM visits"
    with psycopg.connect(demo_pg_dsn) as conn, pytest.raises(psycopg.errors.UndefinedFunction):
        conn.execute(refused)
    before = spent(engine)
    with pytest.raises(DPProxyError) as caught:
        engine.execute(refused, analyst="alice")
    assert caught.value.sqlstate == "42883" and spent(engine) == before
    assert caught.value.message == "function round(double precision, integer) does not exist"


def test_a_division_by_a_released_zero_over_released_rows_is_null(engine: Engine) -> None:
    """Over released rows, `/`, `%` and mod() by zero give NULL, as the engine's own post-processing
    does (README): a window's count divided by a noisy COUNT released as 0 failed in DuckDB, which
    divides integers in double precision, to an infinity it could not cast back to bigint (a long
    language run). A quotient of integers is still integer division."""
    plan = engine.prepare(
        "SELECT COUNT(*) OVER () / COUNT(cost) AS q, COUNT(*) OVER () % COUNT(cost) AS r, "
        "mod(COUNT(*) OVER (), COUNT(cost)) AS m FROM visits",
        (),
        epsilon=0.5,
    )
    query = plan.query
    assert isinstance(query, ReleasedQuery)
    assert [c.type.value for c in query.outputs] == ["bigint", "bigint", "bigint"]
    assert run_over_rows(query, [(0,)]) == [(None, None, None)]
    assert run_over_rows(query, [(3,)]) == [(0, 1, 1)]


def test_an_average_whose_bounds_pass_int64_is_released_exactly(engine: Engine) -> None:
    """AVG of the constant −2^63: its bounds, on the grid the release computes in, pass int64, where
    the columnar release clamped with them and failed after the charge (a long language run). Such a
    column is released group by group, exactly: the constant itself, in every group."""
    whole = engine.execute(
        "SELECT AVG((-9223372036854775807 - 1)) AS n, COUNT(*) FROM visits", analyst="alice"
    )
    assert whole.rows[0][0] == Decimal(-(2**63))
    grouped = engine.execute(
        "SELECT department, AVG((-9223372036854775807 - 1)) AS n FROM visits GROUP BY 1", analyst="alice"
    )
    assert grouped.rows and all(row[1] == Decimal(-(2**63)) for row in grouped.rows)
