"""Public GROUP BY keys from a public table joined in (dpproxy.sql.public_keys): a column of the public
table on the non-nullable side, or a protected column an inner join's ON equates with one, takes the
public table's distinct values, read when the query is planned: released zero-filled with no
partition selection, restricted by the WHERE, never cached; a LEFT JOIN's nullable side, more than
10,000 values, no backend: partition selection as before; NULL is never a public key.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from dpproxy.backends import Backend, Cancellation, LiveColumn
from dpproxy.engine import Engine
from dpproxy.errors import DPProxyError
from dpproxy.policy import parse_policy
from dpproxy.sql.public_keys import MAX_KEY_VALUES
from dpproxy.sql.query import PrivateQuery

DEMO_POLICY = Path(__file__).parents[2] / "policies" / "demo.yaml"

BY_STATE = "SELECT z.state, COUNT(*) FROM patients p JOIN zip_info z ON p.zip = z.zip GROUP BY z.state"


@pytest.fixture(scope="module")
def demo(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory):
    ledger = tmp_path_factory.mktemp("ledger") / "ledger.sqlite"
    with Engine.open(DEMO_POLICY, str(demo_duckdb), ledger) as engine:
        yield engine


def distinct(engine: Engine, sql: str) -> list[object]:
    return sorted(row[0] for row in engine.backend_or_fail().run(sql) if row[0] is not None)


def analyzed(engine: Engine, sql: str) -> PrivateQuery:
    query = engine.analyze(sql)
    assert isinstance(query, PrivateQuery)
    return query


def test_a_public_tables_column_is_a_public_key(demo: Engine) -> None:
    states = distinct(demo, "SELECT DISTINCT state FROM zip_info")
    assert len(states) == 50
    query = analyzed(demo, BY_STATE)
    (key,) = query.keys
    assert list(key.public_values or ()) == states and key.fetched
    assert not query.needs_selection
    explained = demo.explain(BY_STATE)
    assert explained.selection is not None
    assert explained.selection.startswith("all keys are public")
    assert 'z.state: the 50 distinct values of public table "zip_info", column "state"' in explained.selection
    assert explained.cost.delta == 0


def test_every_value_is_released_zero_filled(demo: Engine) -> None:
    # No row passes (age is clipped to 0–120): every state is still released, noise around 0.
    result = demo.execute(
        "SELECT z.state, COUNT(*) AS n FROM patients p JOIN zip_info z ON p.zip = z.zip "
        "WHERE p.age > 500 GROUP BY z.state",
        analyst="alice",
    )
    assert [row[0] for row in result.rows] == distinct(demo, "SELECT DISTINCT state FROM zip_info")
    assert all(row[1] >= 0 for row in result.rows)
    assert not any("not shown" in note for note in result.notes)


def test_a_protected_column_equated_with_a_public_one_takes_its_values(demo: Engine) -> None:
    zips = distinct(demo, "SELECT DISTINCT zip FROM zip_info")
    for sql in (
        "SELECT p.zip, COUNT(*) FROM patients p JOIN zip_info z ON p.zip = z.zip GROUP BY p.zip",
        "SELECT p.zip, COUNT(*) FROM zip_info z JOIN patients p ON z.zip = p.zip AND p.age > 3 GROUP BY 1",
    ):
        (key,) = analyzed(demo, sql).keys
        assert list(key.public_values or ()) == zips, sql


def test_where_restricts_the_public_keys(demo: Engine) -> None:
    join = "FROM patients p JOIN zip_info z ON p.zip = z.zip"
    cases = {
        f"SELECT z.state, COUNT(*) {join} WHERE z.state IN ('CA', 'NY', 'XX') GROUP BY 1": ["CA", "NY"],
        f"SELECT z.state, COUNT(*) {join} WHERE z.state >= 'W' AND p.age > 30 GROUP BY 1": [
            "WA",
            "WI",
            "WV",
            "WY",
        ],
        f"SELECT p.zip, COUNT(*) {join} WHERE p.zip = '11234' GROUP BY 1": ["11234"],
        # Not on the key alone: every value stays (conservative).
        f"SELECT z.state, COUNT(*) {join} WHERE z.state = 'CA' OR z.state = 'NY' GROUP BY 1": None,
        f"SELECT z.state, COUNT(*) {join} WHERE z.city = 'Pineford' GROUP BY 1": None,
    }
    states = distinct(demo, "SELECT DISTINCT state FROM zip_info")
    for sql, expected in cases.items():
        (key,) = analyzed(demo, sql).keys
        assert list(key.public_values or ()) == (expected or states), sql
    result = demo.execute(next(iter(cases)), analyst="alice")
    assert [row[0] for row in result.rows] == ["CA", "NY"]


def test_a_left_join_keeps_partition_selection(demo: Engine) -> None:
    query = analyzed(
        demo,
        "SELECT z.state, COUNT(*) FROM patients p LEFT JOIN zip_info z ON p.zip = z.zip GROUP BY z.state",
    )
    assert query.keys[0].public_values is None and query.needs_selection
    # The ON of a LEFT JOIN does not hold on the rows it keeps: p.zip is not restricted by it either.
    query = analyzed(
        demo, "SELECT p.zip, COUNT(*) FROM patients p LEFT JOIN zip_info z ON p.zip = z.zip GROUP BY p.zip"
    )
    assert query.needs_selection
    explained = demo.explain(
        "SELECT z.state, COUNT(*) FROM patients p LEFT JOIN zip_info z ON p.zip = z.zip GROUP BY z.state"
    )
    assert explained.selection is not None and "noisy count of units reaches" in explained.selection


def test_a_plan_with_keys_read_from_a_public_table_is_never_reused(demo: Engine) -> None:
    first = demo.prepare(BY_STATE, epsilon=0.5)
    second = demo.prepare(BY_STATE, epsilon=0.5)
    assert first is not second
    assert first.query.keys[0].public_values == second.query.keys[0].public_values


def test_keys_are_released_in_the_types_of_the_raw_query(demo: Engine) -> None:
    described = demo.describe(BY_STATE)
    result = demo.execute(BY_STATE, analyst="alice")
    assert [c.type for c in result.columns] == [c.type for c in described.columns]


# -- a database of its own: NULLs, many values, no backend, failures ------------------------------

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
      code: {type: integer, summable: false}
  dims:
    public: true
    columns: {grp: {type: text}, region: {type: text}}
  codes:
    public: true
    columns: {code: {type: bigint}}
"""


@pytest.fixture
def own(tmp_path: Path) -> Path:
    path = tmp_path / "own.duckdb"
    with duckdb.connect(str(path)) as conn:
        conn.execute("CREATE TABLE people (pid INTEGER, grp VARCHAR, code INTEGER)")
        conn.execute("CREATE TABLE dims (grp VARCHAR, region VARCHAR)")
        conn.execute("CREATE TABLE codes (code BIGINT)")
        conn.execute(
            "INSERT INTO people VALUES (1, 'g', 1), (1, 'h', 2), (2, 'h', 3), (3, 'k', 4), (4, NULL, 5), (5, 'm', 6)"
        )
        conn.execute(
            "INSERT INTO dims VALUES ('g', 'north'), ('h', 'south'), ('k', NULL), ('z', 'east'), (NULL, 'west')"
        )
        conn.execute(f"INSERT INTO codes SELECT range FROM range({MAX_KEY_VALUES + 1})")
    return path


def test_null_is_never_a_public_key(own: Path) -> None:
    with Engine.open(parse_policy(POLICY), str(own)) as engine:
        sql = "SELECT d.region, COUNT(*) FROM people p JOIN dims d ON p.grp = d.grp GROUP BY d.region"
        (key,) = analyzed(engine, sql).keys
        # 'west' belongs to a NULL grp, which no row can join: still a value of the public column.
        assert key.public_values == ("east", "north", "south", "west")
        plan = engine.plan(sql)
        rows = [engine.backend_or_fail().run(s) for s in plan.statements]
        exact = plan.measure(*rows)
        # The row of grp 'k' (region NULL) is dropped where rows are read; no NULL group exists.
        assert sorted(k[0] for k in exact.keys) == ["north", "south"]
        (key,) = analyzed(
            engine, "SELECT p.grp, COUNT(*) FROM people p JOIN dims d ON p.grp = d.grp GROUP BY p.grp"
        ).keys
        assert key.public_values == ("g", "h", "k", "z")


def test_more_than_ten_thousand_values_keep_partition_selection(own: Path) -> None:
    with Engine.open(parse_policy(POLICY), str(own)) as engine:
        sql = "SELECT c.code, COUNT(*) FROM people p JOIN codes c ON p.code = c.code GROUP BY c.code"
        query = analyzed(engine, sql)
        assert query.needs_selection and query.keys[0].fetched
        assert f"more than {MAX_KEY_VALUES:,} distinct values" in (query.keys[0].origin or "")
        restricted = analyzed(engine, sql.replace("GROUP BY", "WHERE c.code < 10 GROUP BY"))
        assert restricted.needs_selection  # the limit is on the table's values, before the WHERE
        # A protected integer column equated with a public bigint takes its values (same kind).
        small = analyzed(
            engine,
            "SELECT p.code, COUNT(*) FROM people p JOIN codes c ON p.code = c.code "
            "WHERE c.code < 5 GROUP BY p.code",
        )
        assert small.needs_selection  # 10,001 values again; the WHERE names c.code, not the key


def test_without_a_backend_the_key_keeps_partition_selection_and_explain_says_so() -> None:
    engine = Engine(parse_policy(POLICY), None)
    sql = "SELECT d.region, COUNT(*) FROM people p JOIN dims d ON p.grp = d.grp GROUP BY d.region"
    query = analyzed(engine, sql)
    assert query.needs_selection and not query.keys[0].fetched
    explained = engine.explain(sql)
    assert explained.selection is not None
    assert "without a backend it is shown with partition selection" in explained.selection
    assert [c.name for c in engine.describe(sql).columns] == ["region", "count"]


class FailingFetch(Backend):
    """A backend whose public tables fail to be read (a failure of public data only)."""

    dialect = "duckdb"
    default_schema = "main"

    def __init__(self, path: Path) -> None:
        self.conn = duckdb.connect(str(path), read_only=True)
        self.statements: list[str] = []

    def run(self, sql: str, *, cancel: Cancellation | None = None) -> list[tuple]:
        self.statements.append(sql)
        if "DISTINCT" in sql:
            raise RuntimeError("disk on fire: /secret/path")
        return self.conn.execute(sql).fetchall()

    def unique_columns(self, schema: str | None = None) -> dict[str, set[str]]:
        return {}

    def tables(self, schema: str | None = None) -> dict[str, list[LiveColumn]]:
        from dpproxy.policy.types import normalise_type

        rows = self.conn.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
        ).fetchall()
        found: dict[str, list[LiveColumn]] = {}
        for table, column, sql_type in rows:
            found.setdefault(table, []).append(LiveColumn(column, normalise_type(sql_type), sql_type))
        return found

    def close(self) -> None:
        self.conn.close()


def test_a_failing_read_of_the_public_table_is_refused_with_22000(own: Path) -> None:
    backend = FailingFetch(own)
    engine = Engine(parse_policy(POLICY), backend)
    with pytest.raises(DPProxyError) as raised:
        engine.analyze("SELECT d.region, COUNT(*) FROM people p JOIN dims d ON p.grp = d.grp GROUP BY 1")
    assert raised.value.sqlstate == "22000"
    assert "over public tables failed in the backing database; nothing was charged" in str(raised.value)
    assert "secret" not in str(raised.value)
    assert not any("people" in sql for sql in backend.statements)  # no protected table was read
    backend.close()


@pytest.mark.parametrize(
    ("key", "accepted"),
    [
        # A public integer column without a declared range lies within its type's: binning it cannot
        # overflow bigint, whatever the table holds (the realdata benchmark's decade of release).
        ("z.population / 10 * 10", True),
        ("-(z.population / 10) * 10 - 5", True),
        ("abs(z.population - 7) * 1000", True),
        ("z.population * z.population", True),
        # …but what could leave bigint is refused, from the types alone.
        ("z.population * z.population * 3", False),
        ("abs(z.population * 1000000) * 1000000", False),
    ],
)
def test_integer_arithmetic_over_unbounded_columns_is_checked_against_their_types(
    demo: Engine, key: str, accepted: bool
) -> None:
    sql = f"SELECT {key} AS k, COUNT(*) FROM patients p JOIN zip_info z ON p.zip = z.zip GROUP BY 1"
    if accepted:
        query = analyzed(demo, sql)
        assert query.keys[0].public_values is None  # an expression: partition selection
        demo.backend_or_fail().run(demo.plan(sql).statements[0])  # runs, overflowing nothing
    else:
        with pytest.raises(DPProxyError) as caught:
            demo.analyze(sql)
        assert caught.value.sqlstate == "0A000" and "could overflow bigint" in caught.value.message
