"""dp_interval_low/high cover the true value at least 95% of the time, for a COUNT and an AVG.

Each plan's statements run once on the demo data (DuckDB); its release is then drawn RUNS times with
fresh noise (Engine.release, which charges nothing), each draw giving per group the released value
and its interval columns, read from the answer's rows as an analyst reads them. Groups' noise is
independent within and across draws, so each (draw, group) is one Bernoulli trial of coverage.

The tolerance is the suite's one rule (tests/tolerance.py): a true coverage of exactly 95% fails a
test, over all its checks, with probability at most one in a million, while an interval of the wrong
level fails it (half the width covers ~80% for counts, checked below so that the test is seen to have
the power to fail).

Two regimes: the whole table by diagnosis (groups of 130–1400 persons), and patients of 85 and over
(groups of a few to ~50 persons, where AVG's ± depends on its noisy count and the bounds clamp).
"""

from __future__ import annotations

import shutil
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest

from dpproxy.engine import Engine
from tests.tolerance import binomial_floor

POLICY = Path(__file__).parent.parent.parent / "policies" / "demo.yaml"
RUNS = 1500
DIAGNOSES = ("healthy", "flu", "cold", "asthma", "diabetes", "hypertension")
QUERY = (
    "SELECT diagnosis, COUNT(*), dp_interval_low(COUNT(*)), dp_interval_high(COUNT(*)), "
    "AVG(income), dp_interval_low(AVG(income)), dp_interval_high(AVG(income)) "
    "FROM patients {where} GROUP BY diagnosis"
)
REGIMES = {"every patient": "", "patients of 85 and over": "WHERE age >= 85"}


def floor(trials: int, checks: int = 1) -> float:
    return binomial_floor(0.95, trials, checks)


def true_values(path: Path, where: str) -> dict[str, tuple[int, Decimal | None]]:
    """Per diagnosis, COUNT(*) and AVG of income clipped to the policy's bounds [0, 500000]."""
    with duckdb.connect(str(path), read_only=True) as conn:
        rows = conn.execute(f"SELECT diagnosis, income FROM patients {where}").fetchall()
    found: dict[str, tuple[int, Decimal | None]] = {}
    for diagnosis in DIAGNOSES:
        incomes = [
            min(max(Decimal(income), Decimal(0)), Decimal(500000))
            for d, income in rows
            if d == diagnosis and income is not None
        ]
        count = sum(1 for d, _ in rows if d == diagnosis)
        found[diagnosis] = (count, sum(incomes) / len(incomes) if incomes else None)
    return found


@pytest.fixture(scope="module")
def truth_copy(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("coverage") / "truth.duckdb"  # the engine holds the original locked down
    shutil.copyfile(demo_duckdb, copy)
    return copy


@pytest.mark.parametrize("regime", list(REGIMES))
def test_interval_columns_cover_the_truth_95_percent_of_the_time(
    demo_duckdb: Path, truth_copy: Path, tmp_path: Path, regime: str
) -> None:
    where = REGIMES[regime]
    truth = true_values(truth_copy, where)
    with Engine.open(POLICY, str(demo_duckdb), tmp_path / "ledger.sqlite") as engine:
        plan = engine.plan(QUERY.format(where=where), epsilon=1.0)
        assert engine.backend is not None
        row_sets = [engine.backend.run(sql) for sql in plan.statements]
        counts_in = counts_half = averages_in = trials = 0
        average_trials = 0
        for _ in range(RUNS):
            result = engine.release(plan, row_sets)
            error = result.columns[1].error95
            assert error is not None
            for diagnosis, count, count_low, count_high, _, mean_low, mean_high in result.rows:
                true_count, true_mean = truth[diagnosis]
                trials += 1
                counts_in += count_low <= true_count <= count_high
                counts_half += abs(count - true_count) <= error / 2
                # A NULL AVG (its noisy count below 1, as AVG over no values) claims no interval.
                if true_mean is not None and mean_low is not None:
                    average_trials += 1
                    averages_in += mean_low <= true_mean <= mean_high
    assert trials == RUNS * len(DIAGNOSES)
    assert counts_in / trials >= floor(trials, 2), f"COUNT covered {counts_in / trials:.4f}"
    assert averages_in / average_trials >= floor(average_trials, 2), (
        f"AVG covered {averages_in / average_trials:.4f}"
    )
    # The test has power: half the ± covers far less than 95% (about 78% for this noise).
    assert counts_half / trials < floor(trials) - 0.05


MEDIAN_RUNS = 100


def true_medians(path: Path) -> dict[str, float]:
    """Per diagnosis, PERCENTILE_CONT(0.5) of income clipped to the policy's bounds [0, 500000]."""
    with duckdb.connect(str(path), read_only=True) as conn:
        rows = conn.execute(
            "SELECT diagnosis, quantile_cont(least(greatest(income, 0), 500000), 0.5) FROM patients "
            "GROUP BY diagnosis"
        ).fetchall()
    return {d: float(m) for d, m in rows}


def test_a_medians_interval_covers_it_95_percent_of_the_time(
    demo_duckdb: Path, truth_copy: Path, tmp_path: Path
) -> None:
    """MEDIAN's ends are picks of their own (dpproxy.privacy.selectors.interval_shift), each on the
    wrong side with probability <= 2.5%: redrawn MEDIAN_RUNS times per group, both ends hold the
    true median in at least 95% of the trials (within the suite's tolerance rule); the released value
    alone, as a zero-width interval, does not (the test's power)."""
    truth = true_medians(truth_copy)
    sql = (
        "SELECT diagnosis, MEDIAN(income) AS m, dp_interval_low(m), dp_interval_high(m) "
        "FROM patients GROUP BY diagnosis"
    )
    with Engine.open(POLICY, str(demo_duckdb), tmp_path / "ledger.sqlite") as engine:
        plan = engine.plan(sql, epsilon=1.0)
        backend = engine.backend
        assert backend is not None
        row_sets = [backend.run(s) for s in plan.statements]
        inside = exact = trials = 0
        for _ in range(MEDIAN_RUNS):
            for diagnosis, median, low, high in engine.release(plan, row_sets, backend.run).rows:
                trials += 1
                inside += low <= truth[diagnosis] <= high
                exact += median == truth[diagnosis]
    assert trials == MEDIAN_RUNS * len(DIAGNOSES)
    assert inside / trials >= floor(trials), f"MEDIAN covered {inside / trials:.4f}"
    assert exact / trials < floor(trials) - 0.05
