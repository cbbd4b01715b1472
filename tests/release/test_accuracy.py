"""Accuracy on the demo data at ε = 1, per query kind, against each mechanism's own 95% bound.

For each kind, the same plan is released many times; the error of a release is measured against
the value the mechanism targets — the plan's true, contribution-bounded value (its `measure`
seam), so bounding bias is not counted as noise. The median error must lie within the stated 95%
bound (a bound that held only half the time would fail), and the median relative error is what an
analyst can expect: `pytest -s tests/release/test_accuracy.py` prints it per kind.
"""

from __future__ import annotations

import shutil
import statistics
from decimal import Decimal
from pathlib import Path

import pytest

from dpproxy.backends import open_backend
from dpproxy.engine import Engine, Plan
from dpproxy.policy import load_policy
from dpproxy.release import choose_groups, release_aggregates
from dpproxy.release.aggregates import fine_components
from dpproxy.sql.query import FINE, AggregateKind

POLICY = Path(__file__).parents[2] / "policies" / "demo.yaml"
# Releases per kind. With a bound that covers 95.6% (measured for COUNT(DISTINCT)), 25 releases
# miss more than 20% of the time with odds of 6e-4 per kind, which failed a CI run; with 200 the
# same assertion fails by chance with odds below 1e-15.
RUNS = 200

# (kind, SQL): one aggregate per query, so its error is unambiguous.
KINDS = [
    ("count", "SELECT COUNT(*) FROM visits"),
    ("count per public group", "SELECT department, COUNT(*) FROM visits GROUP BY department"),
    ("sum", "SELECT SUM(cost) FROM visits"),
    ("avg, one row per person", "SELECT AVG(income) FROM patients"),
    ("avg per group", "SELECT diagnosis, AVG(age) FROM patients GROUP BY diagnosis"),
    ("stddev", "SELECT STDDEV_POP(income) FROM patients"),
    ("count distinct", "SELECT COUNT(DISTINCT visit_date) FROM visits"),
    (
        "join on the unit",
        "SELECT COUNT(*) FROM patients p JOIN visits v ON p.patient_id = v.patient_id WHERE p.age > 40",
    ),
    (
        "join to a public table",
        "SELECT COUNT(*) FROM patients p JOIN zip_info z ON p.zip = z.zip WHERE z.population > 20000",
    ),
    ("median", "SELECT MEDIAN(age) FROM patients"),
    (
        "90th percentile per group",
        "SELECT department, percentile_cont(0.9) WITHIN GROUP (ORDER BY duration_minutes) FROM visits GROUP BY department",
    ),
]


@pytest.fixture(scope="module")
def engine(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    copy = tmp_path_factory.mktemp("accuracy") / "demo.duckdb"
    shutil.copy(demo_duckdb, copy)
    with Engine(load_policy(POLICY), open_backend(str(copy))) as e:
        yield e


def true_values(plan: Plan, groups) -> list[float]:
    """What the released aggregate targets in each group, from the true components (those on the
    fine grid of bounds chosen per query brought back to their own)."""
    aggregate = plan.query.aggregates[0]
    fine = fine_components(plan.query)
    values = []
    for found in groups.components:
        components = [v / FINE if i in fine else v for i, v in enumerate(found)]
        if aggregate.kind in (AggregateKind.COUNT, AggregateKind.COUNT_DISTINCT):
            values.append(float(components[aggregate.components[0]]))
        elif aggregate.kind is AggregateKind.SUM:
            values.append(float(Decimal(components[aggregate.components[0]]).scaleb(-aggregate.scale)))
        elif aggregate.kind is AggregateKind.AVG:
            centred, count = (components[i] for i in aggregate.components)
            values.append(float(Decimal(aggregate.centre + centred / max(count, 1)).scaleb(-aggregate.scale)))
        else:  # STDDEV_POP
            squares, centred, count = (components[i] for i in aggregate.components)
            mean = centred / count
            values.append((squares / count - mean * mean) ** 0.5 / 10**aggregate.scale)
    return values


def rank_distance(histogram: list[int], index: int, alpha: float) -> float:
    """How far (in ranks) the target rank α·n lies from the ranks the chosen candidate covers."""
    n = sum(histogram)
    below = sum(histogram[:index])
    above = below + histogram[index]
    target = alpha * n
    return max(0.0, below - target, target - above)


@pytest.mark.parametrize(("kind", "sql"), KINDS, ids=[k for k, _ in KINDS])
def test_median_error_is_within_the_stated_bound(engine: Engine, kind: str, sql: str) -> None:
    plan = engine.plan(sql, epsilon=1.0)
    rows = [engine.backend.run(statement) for statement in plan.statements]
    measured = plan.measure(*rows)
    if measured.candidates is not None:  # bounds chosen per query: the values at the ceilings
        measured = measured.resolve(plan.query, -1, -1 if plan.query.bounds.groups else None)  # type: ignore[union-attr]
    aggregate = plan.query.aggregates[0]
    errors: list[float] = []
    bounds: list[float] = []
    relative: list[float] = []
    for _ in range(RUNS):
        groups = choose_groups(plan.query, measured, plan.noise)
        released = release_aggregates(plan.query, groups, plan.noise, plan.responses)
        if aggregate.kind is AggregateKind.QUANTILE:
            spec = plan.noise.selectors[0]
            histogram = plan.query.histograms[aggregate.histogram]
            candidates = [histogram.candidate(j) for j in range(histogram.candidates)]
            for g, row in enumerate(released.aggregates):
                index = min(range(len(candidates)), key=lambda j: abs(float(candidates[j]) - float(row[0])))
                distance = rank_distance(
                    groups.histograms[g][aggregate.histogram], index, float(aggregate.alpha)
                )
                errors.append(distance)
                bounds.append(spec.rank_error95())
                relative.append(distance / max(1, sum(groups.histograms[g][aggregate.histogram])))
            continue
        targets = true_values(plan, groups)
        for value, target in zip((row[0] for row in released.aggregates), targets, strict=True):
            error = abs(float(value) - target)
            errors.append(error)
            relative.append(error / max(abs(target), 1.0))
        bounds.append(float(released.errors[0]))
    print(
        f"\n{kind:28} median relative error {statistics.median(relative):8.2%}  "
        f"(median |error| {statistics.median(errors):.4g}, stated 95% bound {statistics.median(bounds):.4g})"
    )
    assert statistics.median(errors) <= statistics.median(bounds), (kind, errors, bounds)
    # A 95% bound: most releases lie within it, not just the median one.
    within = sum(e <= b for e, b in zip(errors, bounds * (len(errors) // len(bounds)), strict=False))
    assert within >= 0.8 * len(errors), (kind, within, len(errors))
