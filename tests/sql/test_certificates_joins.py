"""Sensitivity certificates for joins, CTEs and subqueries (see test_certificates.py for the method).

Persons are spread over two protected tables sharing the privacy unit (`people`, `events`), joined
to each other, to themselves, and to a public table whose key may repeat (so a join can duplicate a
person's rows). Removing a person removes their rows from both protected tables; every released
value must move by at most its declared sensitivity, and no person may touch more groups than
allowed — after the joins.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpproxy.engine import Engine
from dpproxy.errors import DPProxyError
from dpproxy.policy import parse_policy
from tests.certify import (
    NeighbourReader,
    _candidates_by_key,
    at_ceilings,
    cached_policy,
    certification_duckdb,
    certify,
    insert_rows,
    measure,
    rows_without,
)

POLICY = """
version: 1
defaults: {epsilon: 1.0, delta: 1.0e-6}
tables:
  people:
    privacy_unit: pid
    max_rows_per_unit: 2
    max_groups_per_unit: 2
    columns:
      pid: {type: integer}
      grp: {type: text}
      x: {type: integer, lower: -5, upper: 10}
  events:
    privacy_unit: pid
    max_rows_per_unit: 3
    max_groups_per_unit: 2
    columns:
      pid: {type: integer}
      kind: {type: text, public_values: [a, b]}
      y: {type: numeric, lower: 0, upper: 100, scale: 2}
  dims:
    public: true
    columns: {grp: {type: text}, region: {type: text}}
"""

QUERIES = [
    "SELECT COUNT(*), SUM(e.y) FROM people p JOIN events e ON p.pid = e.pid",
    "SELECT p.grp, SUM(e.y), COUNT(*), COUNT(DISTINCT p.pid) FROM people p JOIN events e ON p.pid = e.pid GROUP BY p.grp",
    "SELECT e.kind, AVG(p.x) FROM events e JOIN people p USING (pid) GROUP BY e.kind",
    "SELECT d.region, COUNT(*), AVG(p.x) FROM people p JOIN dims d ON p.grp = d.grp GROUP BY d.region",
    "SELECT COUNT(*) FROM people p LEFT JOIN dims d ON p.grp = d.grp WHERE d.region IS NULL OR d.region = 'n'",
    "SELECT COUNT(*), SUM(a.x) FROM people a JOIN people b ON a.pid = b.pid",
    "WITH v AS (SELECT pid, x * 2 AS x2 FROM people WHERE x > 0) SELECT COUNT(*), SUM(a.x2) FROM v a JOIN v b ON a.pid = b.pid",
    "SELECT COUNT(*), AVG(s.y2) FROM (SELECT e.pid, e.y / 2 AS y2 FROM events e JOIN people p ON e.pid = p.pid) s",
    "SELECT AVG(LEAST(n, 4)), SUM(LEAST(n, 4)), COUNT(*) FROM (SELECT pid, COUNT(*) AS n FROM events GROUP BY pid) t",
    # With ceilings a person's COUNT and SUM are clamped at what max_rows_per_unit rows can add.
    "SELECT AVG(n), SUM(total), AVG(total) FROM (SELECT pid, COUNT(*) AS n, SUM(y) AS total FROM events GROUP BY pid) t",
    "SELECT p.grp, AVG(t.m), COUNT(*) FROM (SELECT pid, AVG(y) AS m FROM events GROUP BY pid) t JOIN people p ON p.pid = t.pid GROUP BY p.grp",
    # HAVING keeps a person's row or not by their own aggregates (hidden columns of that row).
    "SELECT COUNT(*), AVG(n) FROM (SELECT pid, COUNT(*) AS n FROM events GROUP BY pid HAVING COUNT(*) > 1 AND MAX(y) >= 50) t",
    "SELECT p.grp, COUNT(*) FROM (SELECT pid FROM events GROUP BY pid HAVING SUM(y) FILTER (WHERE kind = 'a') > 20 OR pid = 3) t "
    "JOIN people p ON p.pid = t.pid GROUP BY p.grp",
    "SELECT COUNT(*) FROM people WHERE grp IN (SELECT grp FROM dims WHERE region = 'n')",
    "SELECT p.grp, MEDIAN(e.y), COUNT(DISTINCT e.kind), mode() WITHIN GROUP (ORDER BY e.kind) FROM people p JOIN events e ON p.pid = e.pid GROUP BY p.grp",
]

people_row = st.tuples(st.sampled_from("ghk"), st.one_of(st.none(), st.integers(-100, 100)))
events_rows = st.lists(
    st.tuples(
        st.sampled_from("ab"),
        st.one_of(st.none(), st.decimals(min_value=-50, max_value=500, places=2, allow_nan=False)),
    ),
    max_size=6,
)
person = st.tuples(st.lists(people_row, max_size=4), events_rows)
database = st.tuples(
    st.lists(person, max_size=5),
    # The public table: region per group, with repeated keys allowed (joins may then duplicate rows).
    st.lists(st.tuples(st.sampled_from("ghk"), st.sampled_from("ns")), max_size=4),
)


class Tables:
    """people/events/dims in a raw connection; runs SQL on D or on D minus one person."""

    def __init__(self, kind: str, conn) -> None:
        self.kind, self.conn = kind, conn
        self.neighbours = NeighbourReader(conn) if kind == "duckdb" else None

    def load(self, persons: list, dims: list) -> None:
        if self.neighbours is not None:
            self.neighbours.forget()
        run = self.conn.execute
        for table in ("people", "events", "dims"):
            run(f"DROP TABLE IF EXISTS {table}")
        run("CREATE TABLE people (pid INTEGER, grp VARCHAR, x INTEGER)")
        run("CREATE TABLE events (pid INTEGER, kind VARCHAR, y NUMERIC(12, 2))")
        run("CREATE TABLE dims (grp VARCHAR, region VARCHAR)")
        people = [(pid, g, x) for pid, (rows, _) in enumerate(persons) for g, x in rows]
        events = [(pid, k, y) for pid, (_, rows) in enumerate(persons) for k, y in rows]
        for table, rows in (("people", people), ("events", events), ("dims", dims)):
            insert_rows(self.conn, self.kind, table, rows)

    def run(self, sql: str, without: int | None = None) -> list[tuple]:
        if without is None:
            return self.conn.execute(sql).fetchall()
        mark = "%s" if self.kind == "postgres" else "?"
        deletes = [(f"DELETE FROM {table} WHERE pid = {mark}", without) for table in ("people", "events")]
        return rows_without(self.conn, self.neighbours, deletes, sql)


@pytest.fixture(params=["duckdb", "postgres"])
def tables(request: pytest.FixtureRequest) -> Iterator[Tables]:
    if request.param == "postgres":
        yield Tables("postgres", request.getfixturevalue("pg_conn"))
    else:
        with certification_duckdb() as conn:
            yield Tables("duckdb", conn)


@pytest.mark.parametrize("sql", QUERIES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=database)
def test_join_sensitivity(tables: Tables, sql: str, data: tuple[list, list]) -> None:
    persons, dims = data
    engine = Engine(cached_policy(POLICY), None, dialect=tables.kind)
    tables.load(persons, dims)
    plan = engine.plan(sql, salt="certificate")
    certify(plan, tables.run, len(persons))


def test_join_limits_are_the_largest_of_the_joined_tables() -> None:
    engine = Engine(cached_policy(POLICY), None)
    plan = engine.plan("SELECT p.grp, COUNT(*) FROM people p JOIN events e ON p.pid = e.pid GROUP BY p.grp")
    assert (plan.query.max_rows, plan.query.max_groups) == (3, 2)
    assert plan.sensitivities == (3,)


def test_unique_keys_keep_a_join_at_one_row_per_person() -> None:
    """people with a unique unit, joined to dims on dims' unique key: no per-person bounding."""
    engine = Engine(
        parse_policy(POLICY),
        None,
        unique_columns={"people": frozenset({"pid"}), "dims": frozenset({"grp"})},
    )
    unique = engine.plan("SELECT d.region, COUNT(*) FROM people p JOIN dims d ON p.grp = d.grp GROUP BY 1")
    assert unique.query.row_level and unique.sensitivities == (1,)
    repeated = Engine(cached_policy(POLICY), None, unique_columns={"people": frozenset({"pid"})}).plan(
        "SELECT d.region, COUNT(*) FROM people p JOIN dims d ON p.grp = d.grp GROUP BY 1"
    )
    assert not repeated.query.row_level and repeated.sensitivities == (2,)


def test_a_per_person_count_or_sum_is_clamped_at_the_ceiling(tables: Tables) -> None:
    """A person's COUNT is at most max_rows_per_unit (3 for events) and their SUM at most what 3 rows
    can add (3 × 100): the measured values are those of the raw SQL with that clamp; with fixed
    limits the same query is refused until the query clamps it."""
    persons = [([], [("a", Decimal(90))] * 5), ([], [("b", Decimal(10))] * 2), ([], [("a", None)])]
    tables.load(persons, [])
    sql = "SELECT SUM(n), SUM(total) FROM (SELECT pid, COUNT(*) AS n, SUM(y) AS total FROM events GROUP BY pid) t"
    plan = Engine(cached_policy(POLICY), None, dialect=tables.kind).plan(sql, salt="certificate")
    measured = at_ceilings(plan, measure(plan, tables.run))
    # 5 rows → 3, 2, 1; sums 450 → 300, 20, NULL (a person with no value sums nothing); the sum
    # on y's grid of 2 decimals.
    assert measured.components[0][:2] == [6, 320 * 100]
    fixed = POLICY.replace("  events:\n", "  events:\n    contribution_bounds: fixed\n", 1)
    with pytest.raises(DPProxyError, match="no upper or lower bound") as caught:
        Engine(cached_policy(fixed), None).plan(sql)
    assert caught.value.sqlstate == "42501"


def test_having_in_a_per_person_subquery_keeps_the_persons_it_admits(tables: Tables) -> None:
    """HAVING over a per-person subquery filters persons by their own aggregates, as PostgreSQL's
    HAVING does (with a COUNT read at most the ceiling, as the subquery's columns are), and the
    aggregates it reads stay out of the subquery's columns."""
    persons = [([], [("a", Decimal(90))] * 5), ([], [("b", Decimal(10))] * 2), ([], [("a", Decimal(60))])]
    tables.load(persons, [])
    sql = (
        "SELECT COUNT(*), SUM(n) FROM (SELECT pid, COUNT(*) AS n FROM events GROUP BY pid "
        "HAVING COUNT(*) >= 2 AND MAX(y) > 50) t"
    )
    plan = Engine(cached_policy(POLICY), None, dialect=tables.kind).plan(sql, salt="certificate")
    measured = at_ceilings(plan, measure(plan, tables.run))
    # Person 0 (5 rows, counted as 3, max 90) passes; person 1 (max 10) and person 2 (1 row) do not.
    assert measured.components[0][:2] == [1, 3]
    # A user's column named like a hidden one, in another case (DuckDB and Spark ignore the case).
    clash = sql.replace("SELECT pid, COUNT(*) AS n", 'SELECT pid, COUNT(*) AS n, MIN(y) AS "__HAVING0"')
    plan = Engine(cached_policy(POLICY), None, dialect=tables.kind).plan(clash, salt="certificate")
    assert at_ceilings(plan, measure(plan, tables.run)).components[0][:2] == [1, 3]
    # COUNT(t.*) counts t's rows, as COUNT(*) does (no LEFT JOIN extends t with NULLs).
    rows = Engine(cached_policy(POLICY), None, dialect=tables.kind).plan(
        sql.replace("COUNT(*), SUM", "COUNT(t.*), SUM")
    )
    assert at_ceilings(rows, measure(rows, tables.run)).components[0][:2] == [1, 3]
    star = "SELECT COUNT(*) FROM (SELECT pid, COUNT(*) AS n FROM events GROUP BY pid HAVING SUM(y) > 0) t"
    statement = Engine(cached_policy(POLICY), None, dialect=tables.kind).plan(star).statements[0]
    assert '"__having0"' in statement and statement.count('"__having0"') == 2  # named, then filtered on


# people's unit enforced unique (a primary key): a person's attributes, grouping their events.
UNIQUE_PEOPLE = {"people": frozenset({"pid"})}
ONE_GROUP_QUERIES = [
    "SELECT p.grp, COUNT(*), AVG(e.y) FROM people p JOIN events e ON p.pid = e.pid GROUP BY p.grp",
    "SELECT p.grp, p.x > 0 AS pos, SUM(e.y), COUNT(DISTINCT e.pid) FROM events e JOIN people p USING (pid) "
    "GROUP BY 1, 2",
    "SELECT p.grp, COUNT(*) FROM people p LEFT JOIN events e ON p.pid = e.pid GROUP BY p.grp",
    "SELECT UPPER(p.grp), STDDEV(e.y), MEDIAN(e.y) FROM people p JOIN events e ON p.pid = e.pid GROUP BY 1",
]
one_row_person = st.tuples(st.lists(people_row, max_size=1), events_rows)  # at most one people row


@pytest.mark.parametrize("sql", ONE_GROUP_QUERIES)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.tuples(st.lists(one_row_person, max_size=5), st.just([])))
def test_keys_read_from_a_table_with_one_row_per_person_put_each_person_in_one_group(
    tables: Tables, sql: str, data: tuple[list, list]
) -> None:
    """Keys read only from `people`, whose unit the database keeps unique: every row of a person
    has the same key, so the rewrite ranks no groups (no window: a join of persons to their events
    ran 2–3 times slower with one). The values of every candidate are those of the plan that ranks
    them, and the certificate holds on every neighbour."""
    persons, dims = data
    tables.load(persons, dims)
    unique = Engine(cached_policy(POLICY), None, dialect=tables.kind, unique_columns=UNIQUE_PEOPLE)
    plan = unique.plan(sql, salt="certificate")
    assert plan.query.one_group_per_unit
    assert " OVER " not in plan.statements[0]
    ranked = Engine(cached_policy(POLICY), None, dialect=tables.kind).plan(sql, salt="certificate")
    assert not ranked.query.one_group_per_unit and " OVER " in ranked.statements[0]
    (one, many) = (measure(p, tables.run) for p in (plan, ranked))
    assert _candidates_by_key(one) == _candidates_by_key(many)  # every group's, whatever their order
    assert one.candidates is not None and many.candidates is not None
    assert (one.candidates.above, one.candidates.wider, one.candidates.persons) == (
        many.candidates.above,
        many.candidates.wider,
        many.candidates.persons,
    )
    certify(plan, tables.run, len(persons))


def test_keys_read_from_a_table_with_many_rows_per_person_are_ranked() -> None:
    """A key of `events` (many rows per person), of a public table, or of `people` on the nullable
    side of a LEFT JOIN may differ between a person's rows: their groups are ranked as before."""
    engine = Engine(cached_policy(POLICY), None, unique_columns=UNIQUE_PEOPLE)
    for sql in (
        "SELECT e.kind, COUNT(*) FROM people p JOIN events e ON p.pid = e.pid GROUP BY e.kind",
        "SELECT p.grp, e.kind, COUNT(*) FROM people p JOIN events e ON p.pid = e.pid GROUP BY 1, 2",
        "SELECT d.region, COUNT(*) FROM people p JOIN events e ON p.pid = e.pid JOIN dims d ON p.grp = d.grp "
        "GROUP BY 1",
        "SELECT p.grp, COUNT(*) FROM events e LEFT JOIN people p ON p.pid = e.pid GROUP BY p.grp",
    ):
        plan = engine.plan(sql)
        assert not plan.query.one_group_per_unit and " OVER " in plan.statements[0], sql
