"""Rows whose privacy unit is NULL (README, "Rows without a person"): left out of every private
answer, and the answer says so unless the database keeps the unit column NOT NULL — on DuckDB and
PostgreSQL, read from each one's catalog."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import psycopg
import pytest

from dpproxy.engine import Engine
from dpproxy.errors import PolicyError
from dpproxy.policy import parse_policy
from dpproxy.results import rows_without_person_notes
from tests.certify import certify

POLICY = """
version: 1
defaults: {epsilon: 1000.0, max_epsilon: 1000.0, delta: 1.0e-6}
analysts:
  ann: {epsilon: 100000.0, delta: 1.0e-3, max_epsilon_per_query: 1000.0}
tables:
  flights:
    privacy_unit: plane
    max_rows_per_unit: 10
    contribution_bounds: fixed   # exact answers at this ε: nothing chosen, nothing dropped
    max_groups_per_unit: 3
    columns:
      plane: {type: text}
      hours: {type: integer, lower: 0, upper: 20}
  landings:
    privacy_unit: plane
    max_rows_per_unit: 10
    contribution_bounds: fixed   # exact answers at this ε: nothing chosen, nothing dropped
    max_groups_per_unit: 3
    columns:
      plane: {type: text}
      hours: {type: integer, lower: 0, upper: 20}
"""

# 12 flights of 4 planes, 3 without a plane; landings the same rows with plane NOT NULL.
ROWS = [("a", 1), ("a", 2), ("b", 3), ("b", 4), ("c", 5), ("c", 6), ("d", 7), ("d", 8), ("d", 9)]
NULL_ROWS = [(None, 10), (None, 11), (None, 12)]
DDL = (
    "CREATE TABLE flights (plane TEXT, hours INTEGER)",
    "CREATE TABLE landings (plane TEXT NOT NULL, hours INTEGER)",
)


def _load(execute: Callable[[str], object]) -> None:
    for ddl in DDL:
        execute(ddl)
    for plane, hours in ROWS + NULL_ROWS:
        execute(f"INSERT INTO flights VALUES ({'NULL' if plane is None else repr(plane)}, {hours})")
    for plane, hours in ROWS:
        execute(f"INSERT INTO landings VALUES ('{plane}', {hours})")


@pytest.fixture(params=["duckdb", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "duckdb":
        path = tmp_path / "flights.duckdb"
        with duckdb.connect(str(path)) as conn:
            _load(conn.execute)
        yield str(path)
        return
    dsn = request.getfixturevalue("pg_dsn")
    with psycopg.connect(dsn, autocommit=True) as conn:
        _load(conn.execute)
    yield dsn


def test_rows_without_a_person_are_left_out_and_the_answer_says_so(backend: str, tmp_path: Path) -> None:
    with Engine.open(parse_policy(POLICY), backend, tmp_path / "ledger.sqlite") as engine:
        answer = engine.execute("SELECT COUNT(*), SUM(hours) FROM flights", analyst="ann")
        count, total = answer.rows[0]
        # The 9 rows of a plane, not the 3 without one. At ε = 1000 the count's noise (scale 10/500)
        # exceeds 0.5 with probability below e^-25; the sum's (scale 10·20/500 = 0.4) is not below
        # 0.5, so it is read against half of what the rows without a plane would add (33 hours):
        # beyond that with probability below e^-41.
        assert round(count) == 9
        assert abs(total - sum(h for _, h in ROWS)) < sum(h for _, h in NULL_ROWS) / 2
        said = [n for n in answer.notes if "whose plane is NULL" in n]
        assert said == [
            "rows of flights whose plane is NULL are left out (they belong to no person; to count each "
            "as a person of its own, the data owner writes null_units: each_a_person in the policy)"
        ]
        # The database keeps landings.plane NOT NULL: nothing to say.
        kept = engine.execute("SELECT COUNT(*) FROM landings", analyst="ann")
        assert not [n for n in kept.notes if "is NULL" in n]
        # A join reads the unit of the table it starts from.
        joined = engine.execute(
            "SELECT COUNT(*) FROM landings l JOIN flights f ON f.plane = l.plane", analyst="ann"
        )
        assert not [n for n in joined.notes if "is NULL" in n]
        # A subquery grouped by the plane leaves them out too: they would make one group, as if they
        # were one person (it counted 5 planes before).
        grouped = engine.execute(
            "SELECT COUNT(*) FROM (SELECT plane AS p, COUNT(*) AS n FROM flights GROUP BY plane) AS per",
            analyst="ann",
        )
        assert round(grouped.rows[0][0]) == 4
        assert [n for n in grouped.notes if "is NULL" in n] == [SUBQUERY_LEAVES_THEM_OUT]
        # Over landings, whose plane the database keeps NOT NULL, there is nothing to say.
        landed = engine.execute(
            "SELECT COUNT(*) FROM (SELECT plane, COUNT(*) AS n FROM landings GROUP BY plane) AS per",
            analyst="ann",
        )
        assert not [n for n in landed.notes if "is NULL" in n]


# The notice of a per-person subquery: it names the table and its unit column (not the subquery's
# name for it), under either null_units.
SUBQUERY_LEAVES_THEM_OUT = (
    "rows of flights whose plane is NULL are left out (subquery per, grouped by the privacy unit, "
    "reads only the rows that have one)"
)


def test_with_null_units_each_a_person_each_such_row_counts_as_a_person(backend: str, tmp_path: Path) -> None:
    """`null_units: each_a_person`: every private query counts the rows without a plane, each as a
    person of its own, and says so; COUNT(DISTINCT plane) still counts planes (SQL skips NULL), and a
    subquery grouped by the plane leaves them out (they would be one group)."""
    policy = parse_policy(
        POLICY.replace(
            "  flights:\n    privacy_unit: plane\n",
            "  flights:\n    privacy_unit: plane\n    null_units: each_a_person\n",
        )
    )
    assert policy.table("flights").null_units == "each_a_person"
    assert policy.table("landings").null_units == "left_out"
    with Engine.open(policy, backend, tmp_path / "ledger.sqlite") as engine:
        answer = engine.execute("SELECT COUNT(*), SUM(hours) FROM flights", analyst="ann")
        count, total = answer.rows[0]
        # All 12 rows. The sum's noise (scale 0.4, as above) exceeds 5 with probability below e^-12; the
        # rows without a plane add 33.
        assert round(count) == 12
        assert abs(total - sum(h for _, h in ROWS + NULL_ROWS)) < 5
        said = [n for n in answer.notes if "whose plane is NULL" in n]
        assert said == [
            "rows of flights whose plane is NULL each count as a person of their own (the policy's "
            "null_units: each_a_person; rows alike in every column are one person)"
        ]
        statement = engine.plan_private(
            engine.analyze("SELECT COUNT(*) FROM flights"), 1.0, salt="s"
        ).statements[0]
        assert "NOT t0.plane IS NULL" not in statement and "MD5(" in statement.upper()
        # Each row without a plane counts; COUNT(DISTINCT plane) per group counts planes only.
        per_hours = engine.execute(
            "SELECT hours, COUNT(*), COUNT(DISTINCT plane) FROM flights WHERE hours >= 9 GROUP BY hours",
            analyst="ann",
        )
        counted = {h: (round(n), round(p)) for h, n, p in per_hours.rows if h <= 12}
        assert counted == {9: (1, 1), 10: (1, 0), 11: (1, 0), 12: (1, 0)}
        planes = engine.execute("SELECT COUNT(DISTINCT plane) FROM flights", analyst="ann")
        assert round(planes.rows[0][0]) == 4
        grouped = engine.execute(
            "SELECT COUNT(*) FROM (SELECT plane, COUNT(*) AS n FROM flights GROUP BY plane) AS per",
            analyst="ann",
        )
        assert round(grouped.rows[0][0]) == 4
        assert [n for n in grouped.notes if "is NULL" in n] == [SUBQUERY_LEAVES_THEM_OUT]


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ("    privacy_unit: row\n", "`privacy_unit: row` already takes each row to be a different person"),
        (
            "    privacy_unit: plane\n    unit_unique: true\n",
            "unit_unique vouches that the privacy unit is never NULL",
        ),
        (
            "    privacy_unit: plane\n    randomized_response: true\n    max_rows_per_unit: 2\n",
            "randomized response counts the persons who have a unit",
        ),
    ],
)
def test_null_units_each_a_person_needs_a_unit_column_that_may_be_null(table: str, problem: str) -> None:
    text = f"""
version: 1
tables:
  flights:
{table}    null_units: each_a_person
    columns:
      plane: {{type: text}}
      hours: {{type: integer, lower: 0, upper: 20}}
"""
    with pytest.raises(PolicyError) as raised:
        parse_policy(text)
    assert problem in str(raised.value)
    assert "tables.flights.null_units" in str(raised.value)
    with pytest.raises(PolicyError, match=r"write left_out .* or each_a_person"):
        parse_policy(text.replace("each_a_person", "own"))


UNIT_SPELLINGS = {
    # A unit PostgreSQL holds equal however it is spelled: still one person with each_a_person,
    # whose person is the unit itself (and the digest of a row without one), not its text.
    "citext": ("citext", "text", ["'alice'", "'Alice'", "'ALICE'", "'bob'"], "alice"),
    "numeric": ("numeric", "numeric", ["1", "1.0", "1.00", "2"], 1),
}


@pytest.mark.parametrize("null_units", ["left_out", "each_a_person"])
@pytest.mark.parametrize("case", list(UNIT_SPELLINGS))
def test_a_unit_spelled_several_ways_is_one_person(
    pg_conn: psycopg.Connection, case: str, null_units: str
) -> None:
    """Removing the person whose unit is stored as 'alice', 'Alice' and 'ALICE' (citext), or as 1,
    1.0 and 1.00 (numeric), moves COUNT(*) and SUM by at most one person's bound (certificate, r = g
    = 1). Found by review: a person named by the unit's text was three persons here."""
    sql_type, policy_type, values, person = UNIT_SPELLINGS[case]
    if sql_type == "citext":
        pg_conn.execute("CREATE EXTENSION IF NOT EXISTS citext")
    pg_conn.execute(f"CREATE TABLE t (pid {sql_type}, x integer)")
    for value in [*values, "NULL", "NULL"]:
        pg_conn.execute(f"INSERT INTO t VALUES ({value}, 5)")
    policy = f"""
version: 1
defaults: {{epsilon: 1.0, delta: 1.0e-6}}
tables:
  t:
    privacy_unit: pid
    null_units: {null_units}
    max_rows_per_unit: 1
    max_groups_per_unit: 1
    contribution_bounds: fixed
    columns:
      pid: {{type: {policy_type}}}
      x: {{type: integer, lower: 0, upper: 10}}
"""
    engine = Engine(parse_policy(policy), None, dialect="postgres")
    plan = engine.plan_private(engine.analyze("SELECT COUNT(*), SUM(x) FROM t"), 1.0, salt="s")

    def run(sql: str, without: int | None = None) -> list[tuple]:
        if without is None:
            return pg_conn.execute(sql).fetchall()
        with pg_conn.transaction(force_rollback=True):
            pg_conn.execute("DELETE FROM t WHERE pid = %s", (person,))
            return pg_conn.execute(sql).fetchall()

    [(count, *_)] = run(plan.statements[0])
    assert count == (3 if null_units == "each_a_person" else 2)  # two units, and one person of two alike rows
    certify(plan, run, [0])


def test_a_subquery_over_a_table_whose_unit_is_vouched_unique_says_nothing_of_null_units() -> None:
    """`unit_unique: true` vouches that the unit is never NULL: no sentence, through a subquery
    grouped by it as for the table itself; over flights, the subquery's sentence."""
    policy = parse_policy(
        POLICY
        + """
  planes:
    privacy_unit: plane
    unit_unique: true
    columns:
      plane: {type: text}
      seats: {type: integer, lower: 0, upper: 500}
"""
    )
    engine = Engine(policy, None, dialect="duckdb")
    for sql, said in (
        ("SELECT COUNT(*) FROM (SELECT plane, SUM(seats) AS s FROM planes GROUP BY plane) AS per", []),
        ("SELECT COUNT(*) FROM planes", []),
        (
            "SELECT COUNT(*) FROM (SELECT plane, COUNT(*) AS n FROM flights GROUP BY plane) AS per",
            [SUBQUERY_LEAVES_THEM_OUT],
        ),
    ):
        relation = engine.analyze(sql).relation
        assert list(rows_without_person_notes(relation, frozenset())) == said, sql
