"""What the bounds and partition selection leave out, estimated privately (dpproxy.release.left_out;
SET dpproxy.estimate_left_out).

The main statement counts, at every candidate k, the rows' worth k takes from the persons above it
below the ceiling, and what the ceiling keeps of everyone; the release noises the pair at the
chosen k, at one released value's share of the query's ε. Over keys that go through partition
selection, the groups holding a person counted there are counted with noise too. Checked here: the
exact counts against the persons' rows and groups, the noise the plan reserves (sensitivity the
ceiling, or g; the query's cost unchanged), the sentences, and where they are not planned.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import duckdb
import pytest

from dpproxy.engine import Engine
from dpproxy.sql.bounds import SessionBounds, estimates_removed
from dpproxy.sql.query import PrivateQuery

POLICY = """
version: 1
defaults: {epsilon: 1.0, delta: 1.0e-7, max_epsilon: 1.0}
analysts: {alice: {epsilon: 100, delta: 1.0e-3}}
tables:
  visits:
    privacy_unit: pid
    max_rows_per_unit: 100
    columns:
      pid: {type: integer}
      dept: {type: varchar, public_values: [a, b]}
      ward: {type: varchar}
      cost: {type: integer, lower: 0, upper: 100}
  fixed_visits:
    privacy_unit: pid
    max_rows_per_unit: 3
    max_groups_per_unit: 2
    contribution_bounds: fixed
    columns:
      pid: {type: integer}
      ward: {type: varchar}
      cost: {type: integer, lower: 0, upper: 100}
"""

# Persons and their visits: 300 with 1 visit, 100 with 10, 20 with 60 (half in each department), 5
# with 250 (beyond the ceiling of 100).
VISITS = {**dict.fromkeys(range(300), 1), **dict.fromkeys(range(300, 400), 10)}
VISITS |= {**dict.fromkeys(range(400, 420), 60), **dict.fromkeys(range(420, 425), 250)}
ON = SessionBounds(estimate=True)


def _ward(pid: int) -> str:
    """Each person's one ward: 30 wards, w0 with 200 persons, the others with 7 or 8 each."""
    return "w0" if pid < 200 else f"w{1 + pid % 29}"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    tmp = tmp_path_factory.mktemp("removed")
    path = tmp / "visits.duckdb"
    with duckdb.connect(str(path)) as conn:
        conn.execute("CREATE TABLE visits (pid INTEGER, dept VARCHAR, ward VARCHAR, cost INTEGER)")
        conn.execute("CREATE TABLE fixed_visits (pid INTEGER, ward VARCHAR, cost INTEGER)")
        rows = [(pid, "ab"[i % 2], _ward(pid), 1 + i % 99) for pid, n in VISITS.items() for i in range(n)]
        conn.executemany("INSERT INTO visits VALUES (?, ?, ?, ?)", rows)
        conn.execute("INSERT INTO fixed_visits SELECT pid, ward, cost FROM visits")
    (tmp / "policy.yaml").write_text(POLICY)
    with Engine.open(tmp / "policy.yaml", str(path), tmp / "ledger.sqlite") as opened:
        yield opened


def _query(engine: Engine, sql: str) -> PrivateQuery:
    query = engine.analyze(sql)
    assert isinstance(query, PrivateQuery)
    return query


def test_the_statement_counts_what_each_candidate_k_removes_below_the_ceiling(engine: Engine) -> None:
    """Per candidate k: Σ over persons of min(rows, 100) − k where rows > k, and Σ min(rows, 100)
    (rows beyond the ceiling are not counted); grouped or not, each person once."""
    for sql in ("SELECT COUNT(*) FROM visits", "SELECT dept, SUM(cost) FROM visits GROUP BY dept"):
        plan = engine.plan_private(_query(engine, sql), 1.0, salt="s", bounds=ON)
        exact = plan.measure(*(engine.backend.run(s) for s in plan.statements))
        found = exact.candidates
        assert found is not None and plan.query.bounds is not None
        assert plan.query.bounds.rows == (1, 2, 4, 8, 16, 32, 64, 100)
        for j, k in enumerate(plan.query.bounds.rows):
            assert found.excess[j] == sum(min(n, 100) - k for n in VISITS.values() if n > k), (sql, k)
        assert found.reach == sum(min(n, 100) for n in VISITS.values())


def test_the_estimate_is_one_more_value_of_sensitivity_the_ceiling_within_the_same_cost(
    engine: Engine,
) -> None:
    """The pair is noised as one value of sensitivity 100 (its L1 is at most the ceiling), planned
    with the query's values: the query costs its ε either way, and EXPLAIN lists it."""
    query = _query(engine, "SELECT COUNT(*) FROM visits WHERE cost >= 0")
    plain = engine.plan_private(query, 1.0, salt="s")
    asked = engine.plan_private(query, 1.0, salt="s", bounds=ON)
    assert plain.noise.estimate is None and not estimates_removed(plain.query)
    estimate = asked.noise.estimate
    assert estimate is not None and (estimate.sensitivity, estimate.max_groups) == (100, 1)
    assert asked.cost == plain.cost
    # The count now shares the ε with the estimate: its noise is wider.
    assert asked.noise.columns[0].scale > plain.noise.columns[0].scale
    text = engine.explain("SELECT COUNT(*) FROM visits WHERE cost >= 0", bounds=ON).render()
    assert "what bounding removed: the rows' worth k takes below the ceiling" in text
    assert "sensitivity 100 per group, ≤ 1 group(s) per unit" in text
    assert "__excess" not in engine.explain("SELECT COUNT(*) FROM visits WHERE cost >= 0").render()


SENTENCE = re.compile(
    r"what bounding removed \(estimated\): at most (\d+) row\(s\) per person took about ([\d,]+) "
    r"\(±([\d,]+) at 95%\) of about ([\d,]+) rows' worth(?: \((\S+)%\))?; rows beyond the ceiling of "
    r"100 per person are not counted"
)


def test_the_notice_says_about_how_many_rows_k_took_and_the_plus_minus(engine: Engine) -> None:
    """Under a WHERE (no floor) the counts' k falls well below the ceiling; the sentence says the
    noisy rows' worth taken at the k the answer released, its ±, and the total it is a share of.
    The truth sits within the ± in nearly every draw (95% each; 20 draws)."""
    covered = 0
    draws = 20
    for _ in range(draws):
        result = engine.execute("SELECT COUNT(*) FROM visits WHERE cost >= 0", analyst="alice", bounds=ON)
        said = [n for n in result.notes if n.startswith("what bounding removed")]
        assert len(said) == 1, result.notes
        match = SENTENCE.fullmatch(said[0])
        if match is None:  # k drawn at the ceiling: nothing below it, said without noise
            assert said[0].startswith("what bounding removed: nothing below the ceiling of 100"), said
            covered += 1
            continue
        k, removed, error = (int(match[i].replace(",", "")) for i in (1, 2, 3))
        truth = sum(min(n, 100) - k for n in VISITS.values() if n > k)
        covered += abs(removed - truth) <= error or (removed == 0 and truth <= error)
        assert f"at most {k} row(s) per person (chosen" in result.notes[0]
    assert covered >= draws - 3, covered


def test_the_estimate_is_not_planned_where_nothing_is_chosen_from_rows(engine: Engine) -> None:
    """Persons alone (COUNT(DISTINCT unit): k bounds nothing released), or the policy's fixed
    limits (no candidates to count at): no estimate, no cost, no sentence."""
    for sql in ("SELECT COUNT(DISTINCT pid) FROM visits", "SELECT COUNT(*) FROM fixed_visits"):
        query = _query(engine, sql)
        plan = engine.plan_private(query, 1.0, salt="s", bounds=ON)
        assert plan.noise.estimate is None and not estimates_removed(plan.query), sql
        assert plan.cost == engine.plan_private(query, 1.0, salt="s").cost
        notes = engine.execute(sql, analyst="alice", bounds=ON).notes
        assert not any(n.startswith("what bounding removed") for n in notes), notes


def test_the_groups_holding_persons_are_counted_with_noise_for_g(engine: Engine) -> None:
    """Over a key that goes through selection, the groups holding a person counted there (every
    ward here: 30) are counted with noise for g, chosen (ceiling 1: the policy's
    max_groups_per_unit) or fixed (2); the notice says about how many were not shown beside the
    groups selection released; over public keys nothing is planned."""
    for sql, g in (
        ("SELECT ward, COUNT(*) FROM visits GROUP BY ward", 1),
        ("SELECT ward, COUNT(*) FROM fixed_visits GROUP BY ward", 2),
    ):
        query = _query(engine, sql)
        plan = engine.plan_private(query, 1.0, salt="s", bounds=ON)
        hidden = plan.noise.hidden
        assert hidden is not None and (hidden.sensitivity, hidden.max_groups) == (g, 1), sql
        plain = engine.plan_private(query, 1.0, salt="s").cost
        if plan.chooses_bounds:  # the allocation, the same whatever is released
            assert plan.cost == plain
        else:  # what each part's map spends, within the request
            assert plan.cost.epsilon <= 1.0 and plan.cost.delta <= 1.0e-7
        result = engine.execute(sql, analyst="alice", bounds=ON)
        said = [n for n in result.notes if "groups not shown (estimated)" in n]
        assert len(said) == 1, result.notes
        match = re.search(
            r"groups not shown \(estimated\): partition selection released ([\d,]+) of about ([\d,]+) "
            r"groups that hold persons \(±([\d,]+) at 95%\), before HAVING and LIMIT$",
            said[0],
        )
        assert match is not None, said
        shown, total, error = (int(match[i].replace(",", "")) for i in (1, 2, 3))
        assert shown == len(result.rows) and total >= shown
        assert abs(total - 30) <= error or total == len(result.rows), (total, error)
    public = engine.plan_private(
        _query(engine, "SELECT dept, COUNT(*) FROM visits GROUP BY dept"), 1.0, bounds=ON
    )
    assert public.noise.hidden is None


def test_the_groups_selection_chose_from_are_those_holding_a_person(engine: Engine) -> None:
    """ExactGroups.present: the groups partition selection read with a person counted in them (counted
    only when the query estimates the groups not shown)."""
    plan = engine.plan_private(
        _query(engine, "SELECT ward, COUNT(*) FROM visits GROUP BY ward"), 1.0, bounds=ON
    )
    exact = plan.measure(*(engine.backend.run(s) for s in plan.statements))
    resolved = exact.resolve(plan.query, len(plan.query.bounds.rows) - 1, 0)  # type: ignore[union-attr]
    assert resolved.subset([0], count_present=True).present == 30
    assert resolved.subset([0]).present is None


def test_a_repeat_is_replayed_only_with_the_same_setting(engine: Engine) -> None:
    """Free replay keys the answer by whether the session asked what is left out: the same statement
    asked with the setting on after an answer without it is answered afresh (and charged), with its
    estimate; asked again with it on, the stored answer with its estimate is replayed."""
    sql = "SELECT COUNT(*) FROM visits WHERE cost >= 2"
    first = engine.execute(sql, analyst="alice")
    assert not first.replayed and not any(n.startswith("what bounding removed") for n in first.notes)
    asked = engine.execute(sql, analyst="alice", bounds=ON)
    assert not asked.replayed and any(n.startswith("what bounding removed") for n in asked.notes)
    again = engine.execute(sql, analyst="alice", bounds=ON)
    assert again.replayed and again.notes == asked.notes
    assert engine.execute(sql, analyst="alice").replayed
