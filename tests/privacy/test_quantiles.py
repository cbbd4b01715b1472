"""Refined quantiles (docs/privacy.md, quantiles): the two picks' cost is charged once and never
exceeds the request, MIN/MAX are not refined, the rank bound shown to analysts covers the released
value at least 95% of the time, and the answer is finer than the coarse grid.

Statistical checks use 5 or more standard errors (a false alarm is rarer than one in a million).
"""

from __future__ import annotations

import math
import re
import statistics
from decimal import Decimal

import duckdb
import pytest

from dpproxy.engine import Engine
from dpproxy.policy import parse_policy
from dpproxy.privacy import quantile_mechanism
from dpproxy.privacy.selectors import COARSE_SHARE
from tests.sql.test_certificates import policy_text


@pytest.mark.parametrize("groups", [1, 3])
def test_refined_cost_is_both_picks_and_within_the_request(groups: int) -> None:
    spec = quantile_mechanism(0.5, 1000, 2, groups, epsilon=1.0, fine_candidates=1999)
    assert spec.refined is not None
    first = quantile_mechanism(0.5, 1000, 2, groups, epsilon=COARSE_SHARE)
    assert math.isclose(spec.epsilon, first.epsilon + spec.refined.epsilon, rel_tol=1e-12)
    assert spec.epsilon <= 1.0 and spec.refined.epsilon > 0.7
    assert spec.rank_error95() == spec.refined.rank_error95()
    zcdp = quantile_mechanism(0.5, 1000, 2, groups, rho=0.5, fine_candidates=1999)
    assert zcdp.refined is not None and zcdp.epsilon == 0 and zcdp.rho <= 0.5
    for extreme in (0, 1):
        assert quantile_mechanism(extreme, 1000, 2, groups, epsilon=1.0, fine_candidates=1999).refined is None


N = 2001


@pytest.fixture(scope="module")
def table() -> tuple[duckdb.DuckDBPyConnection, list[Decimal]]:
    conn = duckdb.connect()
    conn.execute("CREATE TABLE t (pid INTEGER, grp VARCHAR, pub VARCHAR, x INTEGER, y NUMERIC(12, 2))")
    # Distinct values 0.04 apart around the middle: every sub-bin holds at most one of them.
    values = [Decimal(20) + Decimal(i) * Decimal("0.04") for i in range(N)]
    conn.executemany("INSERT INTO t VALUES (?, 'a', 'a', 0, ?)", [(i, v) for i, v in enumerate(values)])
    return conn, values


def test_rank_bound_covers_and_the_answer_is_finer_than_the_grid(table) -> None:
    conn, values = table
    engine = Engine(parse_policy(policy_text(rows=1, groups=1)), None, dialect="duckdb")
    plan = engine.plan_private(engine.analyze("SELECT MEDIAN(y) FROM t"), 1.0)
    assert len(plan.statements) == 1  # the second statement is built from the first pick
    assert plan.cost.epsilon <= 1.0
    row_sets = [conn.execute(sql).fetchall() for sql in plan.statements]
    ran: list[str] = []

    def run(sql: str) -> list[tuple]:
        ran.append(sql)
        return conn.execute(sql).fetchall()

    draws = 300
    covered, errors = 0, []
    target = Decimal(N) / 2
    for _ in range(draws):
        result = engine.release(plan, row_sets, run)
        note = result.columns[0].error_note
        assert note is not None and note.startswith("rank ±")
        bound = int(re.fullmatch(r"rank ±(\d+)", note).group(1))  # type: ignore[union-attr]
        released = Decimal(str(result.rows[0][0]))
        below = sum(1 for v in values if v < released)
        covered += abs(below - target) <= bound + 1
        errors.append(abs(released - values[N // 2]))
    assert len(ran) == draws and all("IN (" in sql for sql in ran)
    assert covered / draws >= 0.95 - 5 * math.sqrt(0.05 * 0.95 / draws)
    # The coarse grid is 0.10 wide here (100 / 999): refined answers are within a few values.
    assert statistics.median(errors) <= Decimal("0.1")


def test_min_and_max_keep_one_pick(table) -> None:
    conn, _ = table
    engine = Engine(parse_policy(policy_text(rows=1, groups=1)), None, dialect="duckdb")
    plan = engine.plan_private(engine.analyze("SELECT MIN(y), MAX(y) FROM t"), 1.0)
    row_sets = [conn.execute(sql).fetchall() for sql in plan.statements]

    def run(sql: str) -> list[tuple]:
        raise AssertionError("MIN and MAX run no second statement")

    low, high = engine.release(plan, row_sets, run).rows[0]
    assert 0 <= low <= high <= 100
