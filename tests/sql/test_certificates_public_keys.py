"""Sensitivity certificates (see test_certificates.py for the method) for plans whose GROUP BY keys
are public knowledge (dpproxy.sql.public_keys): a public table's values read when the plan is made,
buckets and fields of a date column's declared range, restricted by the WHERE. The plan is made on
D with a backend (the public table is read then), and certified on D and on D minus each person:
the public table is the same in every neighbour, so is the released key set, and every value moves
by at most its sensitivity in at most max_groups groups.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpproxy.backends import Backend, Cancellation, LiveColumn
from dpproxy.engine import Engine
from dpproxy.policy import parse_policy
from dpproxy.policy.types import normalise_type
from tests.certify import NeighbourReader, certification_duckdb, certify, insert_rows, rows_without

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
      day: {type: date, lower: 2023-01-01, upper: 2023-03-31}
      x: {type: integer, lower: -5, upper: 10}
  dims:
    public: true
    columns: {grp: {type: text}, region: {type: text}}
"""

QUERIES = [
    "SELECT d.region, COUNT(*), SUM(p.x) FROM people p JOIN dims d ON p.grp = d.grp GROUP BY d.region",
    "SELECT p.grp, COUNT(*), AVG(p.x) FROM people p JOIN dims d ON p.grp = d.grp WHERE p.grp IN ('g', 'h') GROUP BY 1",
    "SELECT date_trunc('month', day), COUNT(*), AVG(x) FROM people GROUP BY 1",
    "SELECT extract(dow FROM day), date_trunc('week', day), COUNT(DISTINCT pid) FROM people "
    "WHERE day >= '2023-02-01' GROUP BY 1, 2",
    "SELECT d.region, date_trunc('month', p.day), COUNT(*), SUM(p.x) FROM people p JOIN dims d ON p.grp = d.grp "
    "GROUP BY 1, 2",
    "SELECT day, COUNT(*) FROM people WHERE day < '2023-01-10' GROUP BY day",
    # Grafana's $__timeGroup(day, '7d') under its $__timeFilter
    "SELECT floor(extract(epoch from day)/604800)*604800 AS time, COUNT(*), AVG(x) FROM people "
    "WHERE day BETWEEN '2023-01-01T00:00:00Z' AND '2023-03-01T00:00:00Z' GROUP BY 1 ORDER BY 1",
]

DAYS = st.one_of(
    st.none(),
    st.dates(min_value=dt.date(2022, 11, 1), max_value=dt.date(2023, 5, 1)),
    st.sampled_from((dt.date(2023, 1, 1), dt.date(2023, 3, 31), dt.date(1, 1, 1), dt.date(9999, 12, 31))),
)
person = st.lists(
    st.tuples(st.sampled_from(("g", "h", "k", None)), DAYS, st.one_of(st.none(), st.integers(-100, 100))),
    max_size=6,
)
database = st.tuples(
    st.lists(person, max_size=5),
    # The public table, keys repeated (a join may repeat a person's rows), NULLs, none at all.
    st.lists(
        st.tuples(st.sampled_from(("g", "h", "k", None)), st.sampled_from(("n", "s", None))), max_size=4
    ),
)


class Tables(Backend):
    """people/dims in a raw connection, as a backend (the engine reads the public table through it)
    and as the certificate's runner (D, or D minus one person)."""

    default_schema = "main"

    def __init__(self, kind: str, conn) -> None:
        self.dialect, self.conn = kind, conn
        self.default_schema = "public" if kind == "postgres" else "main"
        self.neighbours = NeighbourReader(conn) if kind == "duckdb" else None

    def load(self, persons: list, dims: list) -> None:
        if self.neighbours is not None:
            self.neighbours.forget()
        for table in ("people", "dims"):
            self.conn.execute(f"DROP TABLE IF EXISTS {table}")
        self.conn.execute("CREATE TABLE people (pid INTEGER, grp VARCHAR, day DATE, x INTEGER)")
        self.conn.execute("CREATE TABLE dims (grp VARCHAR, region VARCHAR)")
        people = [(pid, g, d, x) for pid, rows in enumerate(persons) for g, d, x in rows]
        for table, rows in (("people", people), ("dims", dims)):
            insert_rows(self.conn, self.dialect, table, rows)

    def run(self, sql: str, *, cancel: Cancellation | None = None) -> list[tuple]:
        return self.conn.execute(sql).fetchall()

    def without(self, sql: str, person: int | None = None) -> list[tuple]:
        if person is None:
            return self.run(sql)
        mark = "%s" if self.dialect == "postgres" else "?"
        return rows_without(
            self.conn, self.neighbours, [(f"DELETE FROM people WHERE pid = {mark}", person)], sql
        )

    def unique_columns(self, schema: str | None = None) -> dict[str, set[str]]:
        return {}

    def tables(self, schema: str | None = None) -> dict[str, list[LiveColumn]]:
        types = {
            "people": [("pid", "integer"), ("grp", "varchar"), ("day", "date"), ("x", "integer")],
            "dims": [("grp", "varchar"), ("region", "varchar")],
        }
        return {t: [LiveColumn(c, normalise_type(s), s) for c, s in cols] for t, cols in types.items()}

    def close(self) -> None:
        pass


@pytest.fixture(params=["duckdb", "postgres"])
def tables(request: pytest.FixtureRequest) -> Iterator[Tables]:
    if request.param == "postgres":
        yield Tables("postgres", request.getfixturevalue("pg_conn"))
    else:
        with certification_duckdb() as conn:
            yield Tables("duckdb", conn)


@pytest.mark.parametrize("sql", QUERIES)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=database)
def test_public_key_sensitivity(tables: Tables, sql: str, data: tuple[list, list]) -> None:
    persons, dims = data
    tables.load(persons, dims)
    engine = Engine(parse_policy(POLICY), tables)
    plan = engine.plan(sql, salt="certificate")
    if "JOIN" in sql:
        assert any(k.fetched for k in plan.query.keys)  # the public table was read for the keys
    else:
        assert not plan.query.needs_selection  # a declared range: public whatever the data
    certify(plan, tables.without, len(persons))
    exact = plan.measure(*(tables.run(s) for s in plan.statements))
    for j, key in enumerate(plan.query.keys):
        if key.public_values is not None:  # no group outside the public values reaches the release
            assert {k[j] for k in exact.keys} <= set(key.public_values), (sql, key.text)
