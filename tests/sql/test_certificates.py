"""Sensitivity certificates (docs/privacy.md §3): the test that proves the rewriter.

For generated small databases D, run a plan's rewritten SQL with no noise (the plan's `measure`
seam: the true per-group components) on D and on D minus each unit u, and check that
  - every released component of every group changes by at most its declared sensitivity;
  - over all groups it changes by at most max_groups · sensitivity (L1), and no unit changes more
    than max_groups groups;
  - with bounds loose enough to keep every row, the components equal a direct computation (the
    rewrite computes what the SQL asks, clipped).
Databases include persons with many rows, NULLs, empty tables and values far outside the bounds.
Both backends run the same plans.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections import defaultdict
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpproxy.engine import Engine
from dpproxy.release.aggregates import fine_components
from dpproxy.sql.query import FINE, ComponentKind
from tests.certify import (
    NeighbourReader,
    at_ceilings,
    by_key,
    cached_policy,
    certification_duckdb,
    insert_rows,
    rows_without,
)
from tests.certify import certify as check

X_BOUNDS = (-5, 10)
Y_BOUNDS = (Decimal("0"), Decimal("100"))
GROUPS = ("a", "b", "c", "d")


def policy_text(*, unit: str = "pid", rows: int = 2, groups: int = 2, bounds: str | None = None) -> str:
    """The test table's policy; `bounds`: its contribution_bounds (default: chosen per query)."""
    limits = "" if unit == "row" else f"\n    max_rows_per_unit: {rows}\n    max_groups_per_unit: {groups}"
    if bounds is not None:
        limits += f"\n    contribution_bounds: {bounds}"
    return f"""
version: 1
defaults: {{epsilon: 1.0, delta: 1.0e-6}}
tables:
  t:
    privacy_unit: {unit}{limits}
    columns:
      pid: {{type: integer, summable: false}}
      grp: {{type: text}}
      pub: {{type: text, public_values: [a, b, c]}}
      x: {{type: integer, lower: {X_BOUNDS[0]}, upper: {X_BOUNDS[1]}}}
      y: {{type: numeric, lower: {Y_BOUNDS[0]}, upper: {Y_BOUNDS[1]}, scale: 2}}
"""


QUERIES = [
    "SELECT COUNT(*) FROM t",
    "SELECT COUNT(x) FROM t",
    "SELECT COUNT(DISTINCT pid) FROM t",
    "SELECT SUM(x) FROM t",
    "SELECT SUM(y) FROM t WHERE x > 0",
    "SELECT AVG(y) FROM t",
    "SELECT AVG(y / 12), SUM(x * 2) FROM t",
    "SELECT SUM(CASE WHEN x > 2 THEN 1 ELSE 0 END) FROM t WHERE grp IN ('a', 'b')",
    "SELECT grp, COUNT(*), SUM(x) FROM t GROUP BY grp",
    # No COUNT(*): k counts only the rows some value is neither NULL nor 0 on.
    "SELECT grp, COUNT(*) FILTER (WHERE x > 0), SUM(y) FILTER (WHERE x < 3), AVG(x) FROM t GROUP BY grp",
    "SELECT grp, AVG(x), COUNT(DISTINCT pid) FROM t WHERE y > 10 OR y IS NULL GROUP BY grp",
    "SELECT pub, COUNT(*), AVG(y) FROM t GROUP BY pub",
    "SELECT x % 3, COUNT(*) FROM t GROUP BY 1",
    # x is an integer declared −5 … 10: its 16 integers are public keys, values outside read at a bound.
    "SELECT x, COUNT(*), SUM(y) FROM t GROUP BY x",
    "SELECT VAR_POP(x), STDDEV_SAMP(y), AVG(y) FROM t",
    "SELECT grp, VARIANCE(y), STDDEV(x) FROM t WHERE x IS NOT NULL GROUP BY grp",
    "SELECT grp, MIN(x), MAX(y), MEDIAN(y), COUNT(DISTINCT pub) FROM t GROUP BY grp",
    "SELECT percentile_disc(0.25) WITHIN GROUP (ORDER BY x DESC), mode() WITHIN GROUP (ORDER BY pub) FROM t",
    "SELECT grp, COUNT(*) AS n FROM t GROUP BY grp ORDER BY n DESC LIMIT 2",
    "SELECT grp, pub, SUM(y) FROM t GROUP BY grp, pub HAVING COUNT(*) > 1 ORDER BY 3 DESC LIMIT 2",
]
ROW_QUERIES = [q for q in QUERIES if "DISTINCT" not in q]

values_x = st.one_of(st.none(), st.integers(-1000, 1000), st.integers(-6, 11))
values_y = st.one_of(
    st.none(),
    st.decimals(min_value=-(10**6), max_value=10**6, places=2, allow_nan=False, allow_infinity=False),
    st.decimals(min_value=-1, max_value=101, places=2, allow_nan=False, allow_infinity=False),
)
row = st.tuples(st.sampled_from(GROUPS), st.sampled_from(("a", "b", "c", "z")), values_x, values_y)
# Up to 6 persons, some with many rows (far more than max_rows_per_unit), possibly none at all.
database = st.lists(st.lists(row, min_size=1, max_size=9), min_size=0, max_size=6)


def flatten(people: list[list[tuple]]) -> list[tuple]:
    return [(pid, *r) for pid, rows in enumerate(people) for r in rows]


class Loader:
    """Loads a generated table into a raw (test-only, unlocked) connection and runs SQL on it."""

    def __init__(self, kind: str, pg_conn=None) -> None:
        self.kind = kind
        self.conn = pg_conn if kind == "postgres" else certification_duckdb()
        self.neighbours = NeighbourReader(self.conn) if kind == "duckdb" else None

    def load(self, rows: list[tuple]) -> None:
        if self.neighbours is not None:
            self.neighbours.forget()
        execute = self.conn.execute
        execute("DROP TABLE IF EXISTS t")
        execute("CREATE TABLE t (pid INTEGER, grp VARCHAR, pub VARCHAR, x INTEGER, y NUMERIC(12, 2))")
        insert_rows(self.conn, self.kind, "t", rows)

    def deleted(self, without: object) -> tuple[str, object]:
        """Which rows `run` deletes for neighbour `without`: the column and its value (a person)."""
        return "pid", without

    def run(self, sql: str, without: object | None = None) -> list[tuple]:
        """Rows of `sql` on D, or on D minus neighbour `without` (`deleted`, inside a rolled-back
        transaction)."""
        if without is None:
            return self.conn.execute(sql).fetchall()
        column, value = self.deleted(without)
        placeholder = "%s" if self.kind == "postgres" else "?"
        return rows_without(
            self.conn, self.neighbours, [(f"DELETE FROM t WHERE {column} = {placeholder}", value)], sql
        )


@pytest.fixture(params=["duckdb", "postgres"])
def loader(request: pytest.FixtureRequest) -> Loader:
    if request.param == "postgres":
        return Loader("postgres", request.getfixturevalue("pg_conn"))
    return Loader("duckdb")


def certify(
    engine: Engine, sql: str, loader: Loader, people: list[list[tuple]], *, sample_rows: bool = False
) -> None:
    query = engine.analyze(sql)
    if sample_rows:
        query = dataclasses.replace(query, sample_rows=True, bounds=None)
    plan = engine.plan_private(query, 1.0, salt="certificate")
    check(plan, loader.run, len(people))


CERT_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.parametrize("sql", QUERIES)
@CERT_SETTINGS
@given(people=database, rows=st.integers(1, 3), groups=st.integers(1, 3), fixed=st.booleans())
def test_unit_level_sensitivity(
    loader: Loader, sql: str, people: list[list[tuple]], rows: int, groups: int, fixed: bool
) -> None:
    """Fixed limits, and bounds chosen per query (every candidate's values certified)."""
    # groups = 3 lets `pub` (3 public values) skip group bounding: no more groups can be released.
    text = policy_text(rows=rows, groups=groups, bounds="fixed" if fixed else None)
    engine = Engine(cached_policy(text), None, dialect=loader.kind)
    loader.load(flatten(people))
    certify(engine, sql, loader, people)


@pytest.mark.parametrize(
    ("groups", "sql", "max_groups", "bounded", "shown"),
    [
        (4, "SELECT pub, COUNT(*) FROM t GROUP BY pub", 3, False, "≤ 3 group(s) per unit"),
        (3, "SELECT pub, COUNT(*) FROM t GROUP BY pub", 3, False, "≤ 3 group(s) per unit"),
        (2, "SELECT pub, COUNT(*) FROM t GROUP BY pub", 2, True, "≤ 2 group(s) per unit"),
        (4, "SELECT grp, COUNT(*) FROM t GROUP BY grp", 4, True, "≤ 4 group(s) per unit"),
        # Score sensitivity 2 (r = 2) over 3 groups at ε = 1: scale 2·2·3/1.
        (4, "SELECT pub, MEDIAN(x) FROM t GROUP BY pub", 3, False, "score sensitivity 2, noise scale 12"),
        (2, "SELECT pub, MEDIAN(x) FROM t GROUP BY pub", 2, True, "score sensitivity 2, noise scale 8"),
    ],
)
def test_public_keys_with_few_values_need_no_group_bound(
    groups: int, sql: str, max_groups: int, bounded: bool, shown: str
) -> None:
    """Rows outside the public values are never released: a unit reaches at most as many released
    groups as there are values, so the noise is calibrated to that and no ranking is emitted (fixed
    limits; chosen bounds rank each person's groups to count them once)."""
    engine = Engine(cached_policy(policy_text(rows=2, groups=groups, bounds="fixed")), None)
    plan = engine.plan(sql, salt="s")
    assert plan.query.max_groups == max_groups
    text = engine.explain(sql).render()
    assert shown in text
    assert ("bounded_groups" in text or '"__gn"' in text) == bounded


@pytest.mark.parametrize("sql", QUERIES)
@CERT_SETTINGS
@given(people=database, rows=st.integers(1, 3), groups=st.integers(1, 2))
def test_unit_level_sensitivity_with_row_sampling(
    loader: Loader, sql: str, people: list[list[tuple]], rows: int, groups: int
) -> None:
    """The literal bounding: at most max_rows_per_unit of a unit's rows are kept per group."""
    engine = Engine(cached_policy(policy_text(rows=rows, groups=groups)), None, dialect=loader.kind)
    loader.load(flatten(people))
    certify(engine, sql, loader, people, sample_rows=True)


@pytest.mark.parametrize("sql", QUERIES)
@CERT_SETTINGS
@given(people=st.lists(st.lists(row, min_size=1, max_size=1), max_size=8), rows=st.integers(1, 3))
def test_enforced_unique_unit_sensitivity(
    loader: Loader, sql: str, people: list[list[tuple]], rows: int
) -> None:
    """A unit the database keeps unique has one row: no per-unit bounding, sensitivities of one row."""
    engine = Engine(
        cached_policy(policy_text(rows=rows, groups=2)),
        None,
        dialect=loader.kind,
        unique_columns={"t": frozenset({"pid"})},
    )
    loader.load(flatten(people))
    plan = engine.plan("SELECT COUNT(*) FROM t", salt="s")
    assert plan.query.row_level and plan.query.max_rows == 1 and plan.query.max_groups == 1
    certify(engine, sql, loader, people)


@pytest.mark.parametrize("sql", ROW_QUERIES)
@CERT_SETTINGS
@given(people=st.lists(st.lists(row, min_size=1, max_size=1), max_size=8))
def test_row_level_sensitivity(loader: Loader, sql: str, people: list[list[tuple]]) -> None:
    """`privacy_unit: row`: each row is a person, removing one row is the neighbour relation."""
    engine = Engine(cached_policy(policy_text(unit="row")), None, dialect=loader.kind)
    loader.load(flatten(people))
    certify(engine, sql, loader, people)


def clip(value, bounds):
    return None if value is None else min(max(value, bounds[0]), bounds[1])


@CERT_SETTINGS
@given(people=database)
def test_components_are_the_clipped_aggregates_when_nothing_is_dropped(
    loader: Loader, people: list[list[tuple]]
) -> None:
    """With limits that keep every row and group, the rewrite computes exactly COUNT/SUM of clipped
    values (with bounds chosen per query, at the ceilings, on the fine grid)."""
    for bounds in ("fixed", None):
        _clipped_aggregates(loader, people, bounds)


def _clipped_aggregates(loader: Loader, people: list[list[tuple]], bounds: str | None) -> None:
    engine = Engine(cached_policy(policy_text(rows=9, groups=4, bounds=bounds)), None, dialect=loader.kind)
    loader.load(flatten(people))
    plan = engine.plan(
        "SELECT grp, COUNT(*), COUNT(x), SUM(x), SUM(y), COUNT(DISTINCT pid) FROM t GROUP BY grp", salt="s"
    )
    got = {k: v[:2] for k, v in by_key(plan.measure(loader.run(plan.statements[0]))).items()}
    expected: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    units: dict[tuple, set[int]] = defaultdict(set)
    for pid, grp, _pub, x, y in flatten(people):
        e = expected[(grp,)]
        e[0] += 1
        e[1] += x is not None
        e[2] += clip(x, X_BOUNDS) or 0
        e[3] += int((clip(y, Y_BOUNDS) or 0) * 100)
        units[(grp,)].add(pid)
    kinds = [c.kind for c in plan.query.components]
    assert kinds == [
        ComponentKind.ROWS,
        ComponentKind.VALUES,
        ComponentKind.SUM,
        ComponentKind.SUM,
        ComponentKind.UNITS,
    ]
    assert set(got) == set(expected)
    fine = fine_components(plan.query)  # on the fine grid: with fixed limits, the count of values
    assert fine == ({1} if bounds == "fixed" else {0, 1, 2, 3})
    for key, values in expected.items():
        components, unit_count = got[key]
        assert components == [*(FINE * v if i in fine else v for i, v in enumerate(values)), len(units[key])]
        assert unit_count == len(units[key])


def test_empty_table_gives_zeros_not_nulls(loader: Loader) -> None:
    engine = Engine(cached_policy(policy_text()), None, dialect=loader.kind)
    loader.load([])
    plan = engine.plan("SELECT COUNT(*), SUM(x), AVG(y) FROM t", salt="s")
    measured = plan.measure(loader.run(plan.statements[0]))
    assert measured.keys == [()]
    assert measured.components == [[0, 0, 0, 0]]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(DISTINCT pid) FROM t WHERE x > 2",
        "SELECT pub, COUNT(DISTINCT pid) FROM t WHERE y > 10 OR x IS NULL GROUP BY pub",
    ],
)
@CERT_SETTINGS
@given(people=database, rows=st.integers(1, 3), groups=st.integers(1, 2))
def test_randomized_response_sensitivity(
    loader: Loader, sql: str, people: list[list[tuple]], rows: int, groups: int
) -> None:
    """The tallies randomized response reports: each person adds 1 to the persons of at most g groups,
    and at most 1 to those for whom the condition holds."""
    text = policy_text(rows=rows, groups=groups).replace(
        "    privacy_unit: pid", "    privacy_unit: pid\n    randomized_response: true"
    )
    engine = Engine(cached_policy(text), None, dialect=loader.kind)
    loader.load(flatten(people))
    plan = engine.plan(sql, salt="certificate")
    assert plan.query.randomized_response and plan.sensitivities == (1, 1)
    check(plan, loader.run, len(people))


@pytest.mark.parametrize("fixed", [False, True])
def test_rows_without_a_person_are_left_out(loader: Loader, fixed: bool) -> None:
    """A row whose privacy unit is NULL belongs to no person: it counts in no released value,
    whichever bounds apply (README, "Rows without a person")."""
    engine = Engine(
        cached_policy(policy_text(rows=3, groups=2, bounds="fixed" if fixed else None)),
        None,
        dialect=loader.kind,
    )
    loader.load([(1, "a", "a", 1, 1), (None, "a", "a", 2, 2), (None, "b", "b", 3, 3), (2, "b", "b", 4, 4)])
    plan = engine.plan_private(
        engine.analyze("SELECT grp, COUNT(*), SUM(x) FROM t GROUP BY grp"), 1.0, salt="s"
    )
    measured = plan.measure(*(loader.run(sql) for sql in plan.statements))
    groups = measured.resolve(plan.query, -1, None) if measured.candidates is not None else measured
    fine = FINE if measured.candidates is not None else 1  # chosen bounds: the fine grid
    assert {key: values[:2] for key, values in zip(groups.keys, groups.components, strict=True)} == {
        ("a",): [fine, fine],
        ("b",): [fine, 4 * fine],
    }
    assert "IS NULL" in plan.statements[0]


class NullUnitLoader(Loader):
    """The test table with rows whose pid is NULL, each told apart for deletion by `rid`, a column
    the policy does not list (so not one a person is told apart by): a neighbour is D minus person
    ("pid", p) or minus one row without a person ("rid", i)."""

    def load(self, rows: list[tuple]) -> None:
        if self.neighbours is not None:
            self.neighbours.forget()
        self.conn.execute("DROP TABLE IF EXISTS t")
        self.conn.execute(
            "CREATE TABLE t (pid INTEGER, grp VARCHAR, pub VARCHAR, x INTEGER, y NUMERIC(12, 2), rid INTEGER)"
        )
        insert_rows(self.conn, self.kind, "t", [(*r, i) for i, r in enumerate(rows)])

    def deleted(self, without: object) -> tuple[str, object]:
        column, value = without  # type: ignore[misc]
        return column, value


@pytest.fixture(params=["duckdb", "postgres"])
def null_unit_loader(request: pytest.FixtureRequest) -> NullUnitLoader:
    if request.param == "postgres":
        return NullUnitLoader("postgres", request.getfixturevalue("pg_conn"))
    return NullUnitLoader("duckdb")


NULL_UNIT_QUERIES = [
    "SELECT COUNT(*), SUM(x) FROM t",
    "SELECT COUNT(DISTINCT pid) FROM t",
    "SELECT grp, COUNT(*), AVG(y), COUNT(DISTINCT pid) FROM t GROUP BY grp",
    "SELECT pub, SUM(y), STDDEV(x) FROM t GROUP BY pub",
    "SELECT grp, MEDIAN(x), COUNT(DISTINCT pub) FROM t GROUP BY grp",
    "SELECT grp, COUNT(*) AS n FROM t GROUP BY grp ORDER BY n DESC LIMIT 2",
]


@pytest.mark.parametrize("sql", NULL_UNIT_QUERIES)
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    people=database,
    # Rows without a person, drawn from few values so that some are alike in every listed column
    # (one person of several rows: Relation.unit_row).
    unitless=st.lists(
        st.sampled_from([("a", "a", 1, Decimal(1)), ("b", "z", None, Decimal(50)), ("a", "b", 11, None)]),
        max_size=5,
    ),
    fixed=st.booleans(),
)
def test_with_null_units_each_a_person_each_such_row_is_a_neighbour_too(
    null_unit_loader: NullUnitLoader, sql: str, people: list[list[tuple]], unitless: list[tuple], fixed: bool
) -> None:
    """`null_units: each_a_person`: removing one person, or one row without a person, moves every
    released value by at most its sensitivity (rows alike in every listed column are one person, whom
    removing one of them changes as removing one of their rows does)."""
    text = policy_text(rows=2, groups=2, bounds="fixed" if fixed else None).replace(
        "    columns:", "    null_units: each_a_person\n    columns:"
    )
    engine = Engine(cached_policy(text), None, dialect=null_unit_loader.kind)
    rows = flatten(people) + [(None, *r) for r in unitless]
    null_unit_loader.load(rows)
    plan = engine.plan_private(engine.analyze(sql), 1.0, salt="certificate")
    assert "NOT t0.pid IS NULL" not in " ".join(plan.statements)
    neighbours = [("pid", p) for p in range(len(people))] + [
        ("rid", i) for i in range(len(rows)) if rows[i][0] is None
    ]
    check(plan, null_unit_loader.run, neighbours)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("sql", "group_a"),
    [
        # No COUNT(*): k counts person 1's 2 rows whose x is not NULL (or not 0 on the grid), which are
        # within k = 2, so nothing of theirs is scaled.
        ("SELECT grp, COUNT(x), SUM(x) FROM t GROUP BY grp", [3, 15]),
        ("SELECT grp, SUM(CASE WHEN x > 0 THEN 1 ELSE 0 END) FROM t GROUP BY grp", [3]),
        ("SELECT grp, COUNT(*) FILTER (WHERE x > 0) FROM t GROUP BY grp", [3]),
        # A COUNT(*) counts every row: person 1's 10 rows are scaled by 2/10 (their count of values,
        # 2·2/10, truncated on the grid to 0).
        ("SELECT grp, COUNT(*), COUNT(x), SUM(x) FROM t GROUP BY grp", [3, 1, 7]),
    ],
)
def test_k_counts_the_rows_that_add_to_a_released_value(loader: Loader, sql: str, group_a: list) -> None:
    """With bounds chosen per query, a person's rows whose values are all NULL or 0 add nothing to
    what the query releases, and k does not count them (docs/privacy.md §3, "Bounds chosen per
    query"): a FILTER or a CASE bounds the rows it keeps, not all of the person's."""
    engine = Engine(cached_policy(policy_text(rows=2, groups=2)), None, dialect=loader.kind)
    person_1 = [(1, "a", "a", 5, 1)] * 2 + [(1, "a", "a", None if "x >" not in sql else -1, 1)] * 8
    loader.load([*person_1, (2, "a", "a", 5, 1)])
    plan = engine.plan_private(engine.analyze(sql), 1.0, salt="s")
    assert plan.chooses_bounds
    measured = at_ceilings(plan, plan.measure(*(loader.run(sql) for sql in plan.statements)))
    assert by_key(measured)[("a",)][0][: len(group_a)] == group_a


@pytest.mark.parametrize("fixed", [True, False])
def test_with_bounds_chosen_a_persons_values_reach_all_their_groups(loader: Loader, fixed: bool) -> None:
    """With bounds chosen per query no group of a person is cut at the group ceiling: their rows in
    all are scaled to k, which bounds them whatever their groups (docs/privacy.md §3). With fixed
    limits the ceiling is the bound, and a salted hash keeps 2 of the person's 4 groups."""
    text = policy_text(rows=9, groups=2, bounds="fixed" if fixed else None)
    engine = Engine(cached_policy(text), None, dialect=loader.kind)
    loader.load([(0, "a", "a", x, 1) for x in (1, 2, 3, 4)] + [(1, "a", "a", 1, 1)])
    plan = engine.plan_private(engine.analyze("SELECT x, COUNT(*) FROM t GROUP BY x"), 1.0, salt="s")
    measured = at_ceilings(plan, plan.measure(*(loader.run(sql) for sql in plan.statements)))
    counts = {key[0]: values[0] for key, (values, _, _) in by_key(measured).items() if values[0]}
    if fixed:
        assert sum(counts.values()) == 3 and counts.get(1) in (1, 2)
    else:
        assert counts == {1: 2, 2: 1, 3: 1, 4: 1}


# -- the candidates' division ------------------------------------------------------------------


@CERT_SETTINGS
@given(people=database, rows=st.integers(1, 4))
def test_candidates_divide_directly_or_by_quotient_and_remainder_alike(
    loader: Loader, people: list[list[tuple]], rows: int
) -> None:
    """trunc(|v|·FINE·k / total) is divided directly when the product stays below 2^62, and split
    into a quotient and remainder per row otherwise: both spellings give the same statement rows."""
    from unittest import mock

    bound_groups = importlib.import_module("dpproxy.sql.rewrite.bound_groups")
    per_group = importlib.import_module("dpproxy.sql.rewrite.per_group")
    sql = "SELECT grp, COUNT(*), SUM(x), AVG(y), SUM(y) FROM t WHERE x IS NOT NULL OR y > 1 GROUP BY grp"
    loader.load(flatten(people))
    answers = []
    for split in (False, True):
        engine = Engine(cached_policy(policy_text(rows=rows, groups=2)), None, dialect=loader.kind)
        with (
            mock.patch.object(bound_groups, "splits_quotient", lambda ctx, i, split=split: split),
            mock.patch.object(per_group, "splits_quotient", lambda ctx, i, split=split: split),
        ):
            plan = engine.plan_private(engine.analyze(sql), 1.0, salt="split")
        assert ('"__q' in plan.statements[0]) == split
        answers.append(sorted(loader.run(plan.statements[0]), key=repr))
    assert answers[0] == answers[1]


def test_values_whose_candidates_could_pass_2_to_the_62_are_split() -> None:
    wide = policy_text(rows=8).replace("upper: 100,", "upper: 100000000000000,")
    for text, split in ((policy_text(rows=8), False), (wide, True)):
        engine = Engine(cached_policy(text), None, dialect="duckdb")
        plan = engine.plan("SELECT grp, SUM(y), COUNT(*) FROM t GROUP BY grp", salt="s")
        assert ('"__q0"' in plan.statements[0], '"__q1"' in plan.statements[0]) == (
            split,
            False,
        )  # SUM(y), COUNT(*)


# -- histograms at every candidate k -------------------------------------------------------------

MANY_ROWS = [[("a", "a", v, None) for v in range(6)] + [("b", "b", 3, None)], [("a", "c", 1, None)] * 3]


def test_a_histogram_counts_the_first_k_rows_of_each_person_at_every_candidate() -> None:
    """Exact semantics: at candidate k a person adds min(k, their non-null rows) to a group's
    histogram (row_pipeline.histogram_rows), and the release calibrates its pick for that k."""
    loader = Loader("duckdb")
    loader.load(flatten(MANY_ROWS))
    engine = Engine(cached_policy(policy_text(rows=8, groups=2)), None, dialect="duckdb")
    plan = engine.plan_private(engine.analyze("SELECT grp, MEDIAN(x) FROM t GROUP BY grp"), 1.0, salt="k")
    measured = plan.measure(*(loader.run(sql) for sql in plan.statements))
    query = plan.query
    assert query.bounds is not None and query.bounds.rows == (1, 2, 4, 8)
    totals = {
        k: {key: sum(h[0]) for key, (_, _, h) in by_key(measured.resolve(query, j, -1)).items()}
        for j, k in enumerate(query.bounds.rows)
    }
    # Person 0: 6 rows in a, 1 in b; person 1: 3 rows in a.
    assert totals == {
        1: {("a",): 2, ("b",): 1},
        2: {("a",): 4, ("b",): 1},
        4: {("a",): 7, ("b",): 1},
        8: {("a",): 9, ("b",): 1},
    }
    assert query.bounds.groups == (1, 2) and measured.resolve(query, 1, -1).counted_at == 3  # (k, g) = (2, 2)
    # At g = 1 each person keeps their first group by the salted hash: person 0's a or b, person 1's a.
    first_groups = sum(sum(h[0]) for _, _, h in by_key(measured.resolve(query, 3, 0)).values())
    assert first_groups in (3 + 6, 3 + 1)
    picks = [plan.noise_at(j, i).selectors[0] for j in range(4) for i in range(2)]
    # A median's rank moves by the rows a person keeps, in as many groups as they keep.
    assert [(p.sensitivity, p.max_groups) for p in picks] == [(k, g) for k in (1, 2, 4, 8) for g in (1, 2)]


@pytest.mark.parametrize(
    ("wider", "caught"),
    [((1, 0), "'at k'"), ((0, 1), "'histogram groups at k, g'")],
    ids=["a row more than k", "a group more than g"],
)
def test_the_certificate_catches_a_histogram_that_keeps_more_than_its_bounds(
    monkeypatch: pytest.MonkeyPatch, wider: tuple[int, int], caught: str
) -> None:
    row_pipeline = importlib.import_module("dpproxy.sql.rewrite.row_pipeline")
    counts = row_pipeline._counts
    more_rows, more_groups = wider

    def wrong(ranks, within):  # counts at (k + 1, g) or (k, g + 1), claims (k, g)
        return counts(ranks, lambda k, g: within(k + more_rows, g + more_groups if g is not None else g))

    monkeypatch.setattr(row_pipeline, "_counts", wrong)
    loader = Loader("duckdb")
    loader.load(flatten(MANY_ROWS))
    engine = Engine(cached_policy(policy_text(rows=8, groups=2)), None, dialect="duckdb")
    with pytest.raises(AssertionError, match=caught):
        certify(engine, "SELECT grp, MEDIAN(x) FROM t GROUP BY grp", loader, MANY_ROWS)
