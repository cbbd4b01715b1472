"""Sensitivity certificates of refined quantiles' second statement (docs/privacy.md, quantiles).

For generated small databases D and a fixed window of coarse bins (public once the first pick is
released), the second statement's sub-bin counts, joined with the first statement's coarse counts
outside the window, form the histogram the second pick scores. On D and on D minus each person:
  - that histogram moves by at most max_rows_per_unit counts (L1) in each group, and no person
    changes more than max_groups_per_unit groups;
  - inside the window the sub-bin counts add up to the first statement's coarse counts (both passes
    count the same bounded rows, so global ranks are exact);
and both backends return the same rows before noise.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpproxy.engine import Engine, Plan
from dpproxy.policy import parse_policy
from dpproxy.sql.numbers import emit
from dpproxy.sql.rewrite.row_pipeline import refinement_select
from tests.sql.test_certificates import CERT_SETTINGS, Loader, database, flatten, loader, policy_text

__all__ = ["loader"]

QUERIES = [
    "SELECT MEDIAN(y) FROM t",
    "SELECT grp, percentile_cont(0.25) WITHIN GROUP (ORDER BY y) FROM t GROUP BY grp",
    "SELECT pub, MEDIAN(y), MIN(y) FROM t GROUP BY pub",
]


def second_pass(plan: Plan, run, without: int | None, window: list[int]) -> dict[tuple, list[int]]:
    """Per group: the partition the second pick scores (coarse bins outside `window`, sub-bins inside)."""
    query = plan.query
    (h, histogram) = next((h, hist) for h, hist in enumerate(query.histograms) if hist.fine)
    n_keys = len(query.keys)
    first = plan.measure(*(run(sql, without) for sql in plan.statements))
    steps = {step.name: step.select for step in plan.rewrite.auxiliary}
    sql = emit(refinement_select(steps[f"histogram_{h}"], h, window), plan.dialect)
    fine: dict[tuple, dict[int, list[int]]] = defaultdict(dict)
    for row in run(sql, without):
        key = tuple(row[:n_keys])
        # …, the coarse bin, the sub-bin, the count at the k the first pass's histograms hold.
        coarse, sub, count = (int(v) for v in (*row[n_keys : n_keys + 2], row[n_keys + 2 + first.counted_at]))
        assert coarse in window, (sql, coarse)
        fine[key].setdefault(coarse, [0] * histogram.fine)[sub] += count
    partitions = {}
    for key, histograms in zip(first.keys, first.histograms, strict=True):
        coarse_counts = histograms[h]
        partition: list[int] = []
        for j, count in enumerate(coarse_counts):
            if j in window:
                subs = fine.get(tuple(key), {}).get(j, [0] * histogram.fine)
                assert sum(subs) == count, (plan.query.text, key, j, subs, count)
                partition.extend(subs)
            else:
                partition.append(count)
        partitions[tuple(key)] = partition
    return partitions


@pytest.mark.parametrize("sql", QUERIES)
@CERT_SETTINGS
@given(
    people=database,
    rows=st.integers(1, 3),
    groups=st.integers(1, 3),
    centre=st.sampled_from([0, 1, 500, 998, 999]),
)
def test_second_statement_sensitivity(
    loader: Loader, sql: str, people: list[list[tuple]], rows: int, groups: int, centre: int
) -> None:
    engine = Engine(parse_policy(policy_text(rows=rows, groups=groups)), None, dialect=loader.kind)
    loader.load(flatten(people))
    plan = engine.plan_private(engine.analyze(sql), 1.0, salt="certificate")
    histogram = next(h for h in plan.query.histograms if h.fine)
    window = list(histogram.window(centre))
    full = second_pass(plan, loader.run, None, window)
    for person in range(len(people)):
        neighbour = second_pass(plan, loader.run, person, window)
        changed = 0
        for key in set(full) | set(neighbour):
            size = len(next(iter(full.values()), None) or next(iter(neighbour.values())))
            a, b = full.get(key, [0] * size), neighbour.get(key, [0] * size)
            moved = sum(abs(x - y) for x, y in zip(a, b, strict=True))
            assert moved <= rows, (sql, key, moved, rows)
            changed += moved > 0
        assert changed <= groups, (sql, changed, groups)


def test_second_statement_same_on_both_backends(pg_conn) -> None:
    # Within the bounds (3 rows, 2 groups per person): the backends' hashes differ, so which rows a
    # person over the bounds keeps may differ; what is counted must not.
    people = [[("a", "a", 1, f"{v}.{v % 100:02d}") for v in range(p, 60, 21)] for p in range(21)]
    people[3].append(("b", "c", 2, "100.00"))
    people[4].append(("b", "z", 2, None))
    results = []
    for kind in ("duckdb", "postgres"):
        loader = Loader(kind, pg_conn if kind == "postgres" else None)
        loader.load(flatten(people))
        engine = Engine(parse_policy(policy_text(rows=3, groups=2)), None, dialect=kind)
        plan = engine.plan_private(engine.analyze(QUERIES[1]), 1.0, salt="certificate")
        histogram = next(h for h in plan.query.histograms if h.fine)
        # y = 30.30 lies in coarse bin ⌊3030·999/10000⌋ = 302: refine around it.
        results.append(second_pass(plan, loader.run, None, list(histogram.window(302))))
    assert results[0] == results[1]
    assert any(sum(p) for p in results[0].values())
