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
from dpproxy.policy import parse_policy

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
            "as a person of its own, the data owner gives them identifiers in a view)"
        ]
        # The database keeps landings.plane NOT NULL: nothing to say.
        kept = engine.execute("SELECT COUNT(*) FROM landings", analyst="ann")
        assert not [n for n in kept.notes if "is NULL" in n]
        # A join reads the unit of the table it starts from.
        joined = engine.execute(
            "SELECT COUNT(*) FROM landings l JOIN flights f ON f.plane = l.plane", analyst="ann"
        )
        assert not [n for n in joined.notes if "is NULL" in n]
