"""Empirical privacy loss through the whole pipeline: a join, a subquery, a LIMIT query.

For neighbouring databases D and D′ (one person removed), the rewritten SQL runs once on each; the
release (group choice, fresh noise, post-processing, ORDER BY / LIMIT) is then repeated many times
from those rows, exactly as a query would be answered each time. For every outcome seen often enough
under both, |ln P[outcome | D] − ln P[outcome | D′]| must stay within the query's ε, up to five
standard errors. The persons removed are the ones that move the answer most (many rows, or alone in
a group), so a rewrite or a noise scale that let them count more than declared would show.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import pytest

from dpproxy.engine import Engine
from dpproxy.policy import parse_policy
from dpproxy.release import ExactGroups
from dpproxy.release.bounds import choose_bounds
from dpproxy.results import Result
from tests.certify import certification_duckdb
from tests.sql.language import schema
from tests.sql.language.databases import Loaded, RawBackend
from tests.tolerance import normal_slack

# Releases per database: outcomes seen at least `minimum` times under both are compared.
TRIALS = 8_000


@pytest.fixture(scope="module")
def loaded() -> Loaded:
    db = Loaded("duckdb", certification_duckdb())
    db.load(schema.adversarial(1))
    return db


def outcomes(
    engine: Engine, sql: str, rows_of: list[list[tuple]], outcome: Callable[[list[tuple]], object]
) -> Counter:
    plan = engine.plan(sql, salt="loss")
    return Counter(outcome(engine.release(plan, rows_of).rows) for _ in range(TRIALS))


def assert_loss_within_epsilon(a: Counter, b: Counter, epsilon: float, *, minimum: int = 200) -> float:
    """The largest |ln(a/b)| over outcomes seen at least `minimum` times in both, checked against ε;
    returns it (so a test can also check the loss is not trivially 0)."""
    largest = 0.0
    compared = 0
    outcomes = [o for o in set(a) & set(b) if min(a[o], b[o]) >= minimum]
    # ln(a/b) has standard error about √(1/a + 1/b); the suite's one tolerance rule over the outcomes.
    sigmas = normal_slack(max(1, len(outcomes)))
    for outcome in outcomes:
        loss = abs(math.log(a[outcome] / b[outcome]))
        slack = sigmas * math.sqrt(1 / a[outcome] + 1 / b[outcome])
        assert loss <= epsilon + slack, f"outcome {outcome!r}: privacy loss {loss:.3f} > ε = {epsilon}"
        largest = max(largest, loss)
        compared += 1
    assert compared >= 2, "too few common outcomes to compare"
    return largest


def neighbour_rows(engine: Engine, loaded: Loaded, sql: str, person: int) -> tuple[list, list]:
    plan = engine.plan(sql, salt="loss")
    return [loaded.run(s) for s in plan.statements], [loaded.run(s, person) for s in plan.statements]


def test_privacy_loss_of_a_join_is_within_epsilon(loaded: Loaded) -> None:
    """COUNT over patients ⋈ visits: person 0 has 12 × 14 joined rows, clamped to r = 3."""
    engine = Engine(parse_policy(schema.policy_text()), RawBackend(loaded))
    sql = "SELECT COUNT(*) FROM patients p JOIN visits v ON p.patient_id = v.patient_id"
    full, without = neighbour_rows(engine, loaded, sql, 0)
    a = outcomes(engine, sql, full, lambda rows: rows[0][0] // 2)
    b = outcomes(engine, sql, without, lambda rows: rows[0][0] // 2)
    largest = assert_loss_within_epsilon(a, b, 1.0)
    assert largest > 0.3  # the person really moves the answer: the check is not vacuous


def test_privacy_loss_of_a_subquery_query_is_within_epsilon(loaded: Loaded) -> None:
    """A filter by a public subquery; person 1 is the only patient in the zip it selects."""
    engine = Engine(parse_policy(schema.policy_text()), RawBackend(loaded))
    sql = (
        "SELECT COUNT(*), SUM(age) FROM patients WHERE zip IN (SELECT zip FROM zip_info WHERE population = 7)"
    )
    full, without = neighbour_rows(engine, loaded, sql, 1)
    # The released count alone (a post-processing of the answer, which cannot lose more than it).
    a = outcomes(engine, sql, full, lambda rows: rows[0][0])
    b = outcomes(engine, sql, without, lambda rows: rows[0][0])
    assert_loss_within_epsilon(a, b, 1.0)


def test_privacy_loss_of_a_limit_query_is_within_epsilon(loaded: Loaded) -> None:
    """Which group a `ORDER BY n DESC LIMIT 1` shows first: a categorical outcome of the release
    (with the fixed limits, under which several groups can come first on these databases)."""
    fixed = schema.policy_text().replace("  visits:\n", "  visits:\n    contribution_bounds: fixed\n")
    engine = Engine(parse_policy(fixed), RawBackend(loaded))
    sql = "SELECT department, COUNT(*) AS n FROM visits GROUP BY department ORDER BY n DESC LIMIT 1"
    full, without = neighbour_rows(engine, loaded, sql, 0)
    a = outcomes(engine, sql, full, lambda rows: rows[0][0] if rows else None)
    b = outcomes(engine, sql, without, lambda rows: rows[0][0] if rows else None)
    assert len(a) >= 2  # several groups can come first: the outcome is random
    assert_loss_within_epsilon(a, b, 1.0)


def test_privacy_loss_of_the_chosen_bounds_is_within_the_choices_epsilon(loaded: Loaded) -> None:
    """The bounds a query chooses are released (the notice says them): over a private key, g by the
    median of the persons' group counts, then k, after partition selection, by the rule for counts
    per released group (its aim reads how many groups selection released), and the average's own k.
    Person 0, with the most rows and zips, moves every count the choices and the
    selection read; what the notice says about the bounds may differ between the neighbours by no
    more than the choices' ε and the selection's allow."""
    policy = schema.policy_text({"patients": (8, 8), "visits": (3, 2), "visit_notes": (4, 2)})
    # A large ε, so that each choice has ε near 1 and its outcomes differ between the neighbours.
    policy = policy.replace("epsilon: 1.0,", "epsilon: 16.0, max_epsilon: 16.0,")
    engine = Engine(parse_policy(policy), RawBackend(loaded))
    sql = "SELECT zip, COUNT(*), AVG(age) FROM patients GROUP BY zip"
    plan = engine.plan(sql, salt="loss")
    assert {choice.kind for choice in plan.noise.choices} == {"rows", "groups"}
    # Two k's (sql.bounds.mean_components): the count's drawn after selection, the average's not.
    assert [(c.after_selection, c.means) for c in plan.noise.choices if c.kind == "rows"] == [
        (True, False),
        (False, True),
    ]
    assert plan.noise.selection is not None
    epsilon = sum(choice.epsilon for choice in plan.noise.choices) + plan.noise.selection.epsilon
    full, without = neighbour_rows(engine, loaded, sql, 0)

    def bounds(exact: ExactGroups) -> str:
        """What the notice says of the bounds: the release's sentence (`choose_bounds` draws the
        choices and partition selection; the values' noise, not drawn here, is the query's own)."""
        return choose_bounds(plan.query, exact, plan.noise, plan.noise_at)[1].note()

    said = engine.release(plan, full).notes
    assert any(n.startswith("contribution bounds") for n in said)  # the sentence the notice says
    measured = plan.measure(*full)
    a = Counter(bounds(measured) for _ in range(TRIALS))
    measured = plan.measure(*without)
    b = Counter(bounds(measured) for _ in range(TRIALS))
    assert len(a) >= 2  # more than one pair of bounds is drawn: the outcome is random
    # The outcomes that carry the loss are drawn ~200 times each under the neighbour: compared from
    # 100 draws, so that the check of a real loss (> 0.5) fails well under once in 10,000 runs.
    assert assert_loss_within_epsilon(a, b, epsilon, minimum=100) > 0.5  # the person moves the choice


def test_privacy_loss_of_a_count_of_distinct_values_is_within_epsilon(loaded: Loaded) -> None:
    """COUNT(DISTINCT cost) of visits: ℓ, the costs one person is counted for, is chosen and said by
    the notice, and the count is the most costs persons can carry at ℓ (dpproxy.release.distinct).
    Person 0 holds 13 of the 25 costs; the notice's ℓ and the released count together may differ
    between the neighbours by no more than the query's ε. (Here ℓ = 1 wins nearly always — the count
    saturates early — so the loss is the count's; the choice's scores are checked for their
    sensitivity in tests/release/test_distinct.py.)"""
    policy = schema.policy_text({"patients": (8, 8), "visits": (16, 2), "visit_notes": (4, 2)})
    engine = Engine(parse_policy(policy), RawBackend(loaded))
    sql = "SELECT COUNT(DISTINCT cost) FROM visits"
    plan = engine.plan(sql, salt="loss")
    assert [choice.kind for choice in plan.noise.choices] == ["distinct"]
    # The choice of ℓ is paid for within the query's charge, which is its whole ε.
    spent = plan.noise.choices[0].epsilon + sum(column.epsilon for column in plan.noise.columns)
    assert plan.noise.choices[0].epsilon > 0 and spent <= plan.cost.epsilon == 1.0
    full, without = neighbour_rows(engine, loaded, sql, 0)

    def outcome(result: Result) -> tuple[str, int]:
        (said,) = [n for n in result.notes if n.startswith("count(distinct")]
        return said, result.rows[0][0]

    # At ε = 1 the count's noise spreads it over several values, each drawn often under both
    # neighbours. Half the trials: each release runs the flows again.
    a = Counter(outcome(engine.release(plan, full)) for _ in range(TRIALS // 2))
    b = Counter(outcome(engine.release(plan, without)) for _ in range(TRIALS // 2))
    assert assert_loss_within_epsilon(a, b, plan.cost.epsilon, minimum=100) > 0.3
