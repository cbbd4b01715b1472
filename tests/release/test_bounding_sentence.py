"""What the notice says bounding does when k sits below the ceiling (dpproxy.release.bounds): the ±
is the noise's alone, so an answer whose k is below the data owner's ceiling says what a heavier
person's rows become — counts and sums miss their rows beyond k, averages and spreads weigh them as k
rows, quantiles and modes read their first k rows. It is said from the query's text and the released
k, never from whether any person has more rows (a fact of the data): two databases that differ only
in one heavy person give the same sentence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from dpproxy.engine import Engine
from dpproxy.release.bounds import ChosenBounds, bounding_effects
from dpproxy.sql.bounds import mean_components

POLICY = """
version: 1
defaults: {epsilon: 1.0, delta: 1.0e-7, max_epsilon: 1.0}
analysts: {alice: {epsilon: 100, delta: 1.0e-3}}
tables:
  visits:
    privacy_unit: pid
    max_rows_per_unit: 1000
    columns:
      pid: {type: integer}
      dept: {type: varchar, public_values: [a, b]}
      cost: {type: integer, lower: 0, upper: 100}
"""

COUNTS = "counts and sums can miss what such persons have beyond that"
AVERAGES = "averages and spreads weigh such persons as {k} rows"
QUANTILES = "quantiles and modes read their first {k} rows only"


def database(path: Path, heavy: bool) -> Path:
    """400 persons with one visit each, and with `heavy` one more person with 900 visits."""
    with duckdb.connect(str(path)) as conn:
        conn.execute("CREATE TABLE visits (pid INTEGER, dept VARCHAR, cost INTEGER)")
        conn.execute(
            "INSERT INTO visits SELECT i, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END, i % 90 FROM range(400) t(i)"
        )
        if heavy:
            conn.execute("INSERT INTO visits SELECT 9999, 'a', 50 FROM range(900)")
    return path


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[tuple[Engine, Engine]]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    light = database(tmp_path / "light.duckdb", heavy=False)
    heavy = database(tmp_path / "heavy.duckdb", heavy=True)
    with (
        Engine.open(policy, str(light), tmp_path / "light.sqlite") as a,
        Engine.open(policy, str(heavy), tmp_path / "heavy.sqlite") as b,
    ):
        yield a, b


def test_a_count_below_the_ceiling_says_the_plus_minus_leaves_out_what_bounding_removed(
    engines: tuple[Engine, Engine],
) -> None:
    """k is drawn: under a WHERE (no floor) 400 persons of one row put it far below the ceiling in
    nearly every draw, and the sentence follows the k each answer released. The count and the
    average have a k each (sql.bounds.mean_components), and a sentence each."""
    below = 0
    for engine in engines:
        for _ in range(4):
            sql = "SELECT dept, COUNT(*), AVG(cost) FROM visits WHERE cost >= 0 GROUP BY dept"
            notice = engine.execute(sql, analyst="alice").notice or ""
            bounds = notice.split("contribution bounds of this query: at most ")[1]
            k = int(bounds.split(" row(s) per person for counts (")[0])
            m = int(bounds.split(", at most ")[1].split(" for averages (")[0])
            said = [(k, COUNTS), (m, AVERAGES.format(k=m))]
            if k == m:  # equal k's: one sentence, each effect once
                said = [(k, f"{COUNTS}, {AVERAGES.format(k=k)}")]
            for bound, effect in said:
                sentence = (
                    f"a person with more than {bound} row(s) counts as {bound}: {effect} "
                    "(not in the ±, which is the noise's)"
                )
                assert (sentence in notice) == (bound < 1000), notice
            below += (k < 1000) + (m < 1000)
    assert below >= 8


def test_the_sentence_names_only_what_the_query_asks(engines: tuple[Engine, Engine]) -> None:
    engine = engines[0]

    def effects(sql: str) -> tuple[str, ...]:
        return bounding_effects(engine.plan(sql).query)

    assert effects("SELECT COUNT(*) FROM visits") == (COUNTS,)
    assert effects("SELECT SUM(cost) FROM visits") == (COUNTS,)
    assert effects("SELECT STDDEV(cost) FROM visits") == (AVERAGES,)
    assert effects("SELECT MEDIAN(cost), AVG(cost) FROM visits") == (AVERAGES, QUANTILES)
    # A person counts once however many rows they have: k does nothing to COUNT(DISTINCT unit).
    assert effects("SELECT COUNT(DISTINCT pid) FROM visits") == ()
    notice = engine.execute("SELECT COUNT(DISTINCT pid) FROM visits", analyst="alice").notice or ""
    assert "counts as" not in notice


def test_at_the_ceiling_nothing_is_said() -> None:
    at_ceiling = ChosenBounds(3, 0, 1000, None, 1000, 1, True, False, effects=(COUNTS,))
    assert (
        at_ceiling.note()
        == "contribution bounds of this query: at most 1000 row(s) per person (chosen: the ceiling)"
    )
    below = ChosenBounds(2, 0, 64, None, 1000, 1, True, False, effects=(COUNTS,))
    assert below.note().endswith(
        f"; a person with more than 64 row(s) counts as 64: {COUNTS} (not in the ±, which is the noise's)"
    )


def test_fixed_limits_say_their_bounds_and_what_they_do(tmp_path: Path) -> None:
    """With `contribution_bounds: fixed` the notice says the limits and what they do to a heavier
    person's rows in a group, from the policy and the query alone: the same sentence over the
    databases with and without the heavy person."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        POLICY.replace(
            "max_rows_per_unit: 1000",
            "max_rows_per_unit: 5\n    max_groups_per_unit: 2\n    contribution_bounds: fixed",
        )
    )
    said = []
    for heavy in (False, True):
        path = database(tmp_path / f"fixed-{heavy}.duckdb", heavy=heavy)
        with Engine.open(policy, str(path), tmp_path / f"fixed-{heavy}.sqlite") as engine:
            result = engine.execute(
                "SELECT dept, COUNT(*), AVG(cost) FROM visits GROUP BY dept", analyst="alice"
            )
            said.append([n for n in result.notes if n.startswith("contribution bounds")])
            whole = engine.execute("SELECT MEDIAN(cost) FROM visits", analyst="alice")
            said.append([n for n in whole.notes if n.startswith("contribution bounds")])
    assert (
        said[0]
        == said[2]
        == [
            "contribution bounds of this query (fixed by the policy): at most 5 row(s) per person in a group, "
            "in at most 2 group(s); a person with more than 5 row(s) in a group counts as 5 there: "
            f"{COUNTS}, {AVERAGES.format(k=5)} (not in the ±, which is the noise's)"
        ]
    )
    assert (
        said[1]
        == said[3]
        == [
            "contribution bounds of this query (fixed by the policy): at most 5 row(s) per person in a group; "
            f"a person with more than 5 row(s) in a group counts as 5 there: {QUANTILES.format(k=5)} "
            "(not in the ±, which is the noise's)"
        ]
    )


def test_an_average_beside_a_count_is_released_at_its_own_k(engines: tuple[Engine, Engine]) -> None:
    """A query with a count and an average has two k's (sql.bounds.mean_components): each component
    is kept at its own family's candidate (ExactGroups.resolve) and noised for that candidate's
    sensitivity (Plan.noise_at), at the cost the plan reserved; sharing a component keeps one k."""
    engine = engines[1]
    plan = engine.plan("SELECT dept, COUNT(*), AVG(cost) FROM visits GROUP BY dept")
    query = plan.query
    averaged = mean_components(query)
    count, average = query.aggregates
    assert averaged == frozenset(average.components) and not averaged & set(count.components)
    measured = plan.measure(*[engine.backend.run(sql) for sql in plan.statements])  # type: ignore[union-attr]
    found = measured.candidates
    assert found is not None
    at_ceiling = plan.noise_at(-1, 0)
    for rows, means in ((2, 7), (7, 2), (5, 5)):
        resolved = measured.resolve(query, rows, None, means)
        noise = plan.noise_at(rows, 0, -1, means)
        assert noise.cost == plan.noise.cost
        for i in range(len(query.components)):
            own = means if i in averaged else rows
            # The heavy person's 901 rows differ at every candidate: a wrong one would show.
            assert [row[i] for row in resolved.components] == [row[i][own] for row in found.components]
            assert noise.columns[i] == plan.noise_at(own, 0).columns[i] != at_ceiling.columns[i]
    # COUNT(cost) beside AVG(cost) share cost's count (no value range chosen when only planned).
    assert mean_components(engine.plan("SELECT COUNT(cost), AVG(cost) FROM visits").query) == frozenset()
    assert [c.kind for c in engine.plan("SELECT COUNT(cost), AVG(cost) FROM visits").noise.choices] == [
        "rows"
    ]


def test_two_ks_say_each_bound_and_its_effects_once() -> None:
    """The notice of a query with two k's names each family's bound and what it does; equal bounds
    say each effect once."""
    two = ChosenBounds(
        8, 0, 256, None, 1000, 1, True, False, effects=(COUNTS,), mean_rows=32,
        mean_effects=(AVERAGES,), families=("counts", "averages"),
    )  # fmt: skip
    assert two.note() == (
        "contribution bounds of this query: at most 256 row(s) per person for counts (chosen; ceiling"
        " 1000), at most 32 for averages (chosen; ceiling 1000); a person with more than 256 row(s)"
        f" counts as 256: {COUNTS} (not in the ±, which is the noise's); a person with more than 32"
        f" row(s) counts as 32: {AVERAGES.format(k=32)} (not in the ±, which is the noise's)"
    )
    same = dataclasses.replace(two, mean_rows=256)
    assert same.note().endswith(
        f"; a person with more than 256 row(s) counts as 256: {COUNTS}, {AVERAGES.format(k=256)}"
        " (not in the ±, which is the noise's)"
    )
    assert same.note().count("counts as") == 1
