"""A centred sum is computed on a grid that holds its centre (docs/privacy.md §4): an indicator in
[0, 1] or an integer column in [1, 6], whose midpoint is not on the integer grid, is centred on the
grid of tenths, so a value's largest offset from the centre is exactly half the range — not half a
step more, which doubled the noise of a share and quadrupled that of its variance. The tests: the
components' grid, centre and sensitivities; the certificate on D and each neighbour on both backends
(fixed and chosen bounds); and the values on the finer grid give the exact average and variance.
"""

from __future__ import annotations

import statistics
from fractions import Fraction

import duckdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpproxy.engine import Engine
from dpproxy.policy import parse_policy
from dpproxy.sql.query import ComponentKind
from tests.certify import at_ceilings, certify, insert_rows, measure, runner
from tests.sql.test_certificates import CERT_SETTINGS

POLICY = """
version: 1
defaults: {{epsilon: 1.0, delta: 1.0e-6}}
tables:
  t:
    privacy_unit: pid
    max_rows_per_unit: {rows}
    max_groups_per_unit: 2
    contribution_bounds: {bounds}
    columns:
      pid: {{type: integer}}
      grp: {{type: text}}
      die: {{type: integer, lower: 1, upper: 6}}
      even: {{type: integer, lower: 0, upper: 10}}
"""

SHARE = "AVG(CASE WHEN die >= 5 THEN 1 ELSE 0 END)"
QUERIES = [
    f"SELECT {SHARE}, STDDEV(CASE WHEN die >= 5 THEN 1 ELSE 0 END) FROM t",
    "SELECT grp, AVG(die), VAR_POP(die), AVG(even) FROM t GROUP BY grp",
]


def engine(rows: int = 3, bounds: str = "fixed", dialect: str = "duckdb") -> Engine:
    return Engine(parse_policy(POLICY.format(rows=rows, bounds=bounds)), None, dialect=dialect)


def centred(sql: str, kind: ComponentKind = ComponentKind.CENTRED_SUM) -> list[tuple[int, int, int]]:
    """(scale, centre, sensitivity for one row) of each component of `kind` in the plan of `sql`."""
    plan = engine(bounds="fixed").plan(sql, epsilon=1.0)
    return [(c.scale, c.centre, c.sensitivity(1)) for c in plan.query.components if c.kind is kind]


def test_an_indicator_is_centred_on_tenths() -> None:
    # [0, 1] on the grid of tenths: centre 5, offsets −5 and +5 (0.5 of the range each way); on the
    # integer grid it was centre 0 and offsets up to 1, the whole range.
    assert centred(f"SELECT {SHARE} FROM t") == [(1, 5, 5)]
    # Squares of the offsets: 25 hundredths, a quarter of the range squared (was 1, the range squared).
    sql = "SELECT STDDEV(CASE WHEN die >= 5 THEN 1 ELSE 0 END) FROM t"
    assert centred(sql, ComponentKind.CENTRED_SQUARES) == [(1, 5, 25)]


def test_an_odd_range_moves_to_tenths_and_an_even_one_stays() -> None:
    assert centred("SELECT AVG(die) FROM t") == [(1, 35, 25)]  # 1..6: 10..60, centre 35, ±25
    assert centred("SELECT AVG(even) FROM t") == [(0, 5, 5)]  # 0..10: the centre 5 is on the grid
    # The AVG and the VAR of one argument share their centred sum: one component, charged once.
    plan = engine().plan("SELECT AVG(die), VAR_POP(die) FROM t", epsilon=1.0)
    assert sum(c.kind is ComponentKind.CENTRED_SUM for c in plan.query.components) == 1


def test_the_finer_grid_gives_the_exact_average_and_variance() -> None:
    people = [[(1,), (6,), (5,)], [(2,)], [(5,), (5,)], [(3,), (4,)], [(6,)]]
    con = duckdb.connect()
    con.execute("CREATE TABLE t (pid INTEGER, grp VARCHAR, die INTEGER, even INTEGER)")
    con.executemany(
        "INSERT INTO t VALUES (?, 'a', ?, 0)", [(p, d) for p, rows in enumerate(people) for (d,) in rows]
    )
    plan = engine(rows=3).plan(
        "SELECT AVG(die), VAR_POP(die), AVG(CASE WHEN die >= 5 THEN 1 ELSE 0 END) FROM t"
    )
    exact = measure(plan, lambda sql, _without: con.execute(sql).fetchall())
    (row,) = at_ceilings(plan, exact).components
    dice = [d for rows in people for (d,) in rows]
    for aggregate, expected in zip(
        plan.query.aggregates,
        (
            Fraction(sum(dice), len(dice)),
            Fraction(statistics.pvariance(dice)).limit_denominator(1000),
            Fraction(sum(d >= 5 for d in dice), len(dice)),
        ),
        strict=True,
    ):
        squares, centred_sum, count = (
            (None, *aggregate.components) if len(aggregate.components) == 2 else aggregate.components
        )
        unit = 10**aggregate.scale
        mean = Fraction(row[centred_sum], row[count])  # offset from the centre, in grid units
        if squares is None:
            assert Fraction(aggregate.centre) / unit + mean / unit == expected
        else:
            assert (Fraction(row[squares], row[count]) - mean * mean) / unit**2 == expected


@pytest.fixture(params=["duckdb", "postgres"])
def backend(request: pytest.FixtureRequest):
    if request.param == "postgres":
        conn = request.getfixturevalue("pg_conn")
        return "postgres", conn
    return "duckdb", duckdb.connect()


def load(kind: str, conn, people: list[list[tuple]]) -> None:
    conn.execute("DROP TABLE IF EXISTS t")
    conn.execute("CREATE TABLE t (pid INTEGER, grp VARCHAR, die INTEGER, even INTEGER)")
    insert_rows(conn, kind, "t", [(pid, *r) for pid, rows in enumerate(people) for r in rows])


row = st.tuples(
    st.sampled_from(("a", "b", "c")), st.one_of(st.none(), st.integers(-2, 9)), st.integers(-3, 13)
)
database = st.lists(st.lists(row, min_size=1, max_size=5), min_size=0, max_size=5)


@pytest.mark.parametrize("sql", QUERIES)
@pytest.mark.parametrize("bounds", ["fixed", "chosen"])
@CERT_SETTINGS
@given(people=database, rows=st.integers(1, 4))
def test_centred_sums_on_the_finer_grid_keep_their_sensitivity(
    backend, sql: str, bounds: str, people: list[list[tuple]], rows: int
) -> None:
    kind, conn = backend
    load(kind, conn, people)
    plan = engine(rows=rows, bounds=bounds, dialect=kind).plan(sql, salt="certificate")
    certify(plan, runner(kind, conn), len(people))
