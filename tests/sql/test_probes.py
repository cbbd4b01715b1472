"""Zero-row probes and SELECT DISTINCT, as the statement's analysis sees them (dpproxy.sql.probes).

The SQL is what each tool sends, taken from its source:
  - Tableau's PostgreSQL connector opens a table with `SELECT * FROM "public"."t" WHERE (1 = 0)`,
    and jupysql checks that a table exists with `SELECT * FROM t WHERE 1 = 0`;
  - Metabase's sql-jdbc driver checks it may read a table with a probe whose WHERE is `1 <> 1` and
    whose LIMIT is 0 (src/metabase/driver/sql_jdbc/sync/describe_database.clj,
    `simple-select-probe-query`; `SELECT TRUE AS "_"` in recent versions, `SELECT *` in older ones);
  - Superset wraps a virtual dataset's SQL as `(<sql>) AS virtual_table` (superset/models/helpers.py)
    and fills a filter dropdown with `SELECT DISTINCT <col> AS column_values FROM <table> LIMIT 10000`
    (superset/models/helpers.py, `values_for_column`).
Every test runs without a backend: an answer to a probe, and every refusal, comes from the text and
the policy alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlglot import exp

from dpproxy.engine import Engine
from dpproxy.errors import DPProxyError
from dpproxy.policy import load_policy
from dpproxy.sql.probes import EmptyQuery, never_true
from dpproxy.sql.query import PrivateQuery
from dpproxy.sql.statement import parse_statement
from dpproxy.sql.types import PgType

POLICY = Path(__file__).resolve().parents[2] / "policies" / "demo.yaml"

PATIENTS = [
    ("patient_id", PgType.INT4),
    ("age", PgType.INT4),
    ("sex", PgType.VARCHAR),
    ("income", PgType.NUMERIC),
    ("zip", PgType.VARCHAR),
    ("diagnosis", PgType.VARCHAR),
    ("smoker", PgType.BOOL),
    ("enrolled", PgType.DATE),
]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(load_policy(POLICY), None)


def columns(engine: Engine, sql: str) -> list[tuple[str, PgType]]:
    query = engine.analyze(sql)
    assert isinstance(query, EmptyQuery), query
    described = engine.describe(sql)
    assert [(c.name, c.type) for c in described.columns] == [(o.name, o.type) for o in query.outputs]
    assert not described.private
    return [(o.name, o.type) for o in query.outputs]


@pytest.mark.parametrize(
    "sql",
    [
        'SELECT * FROM "public"."patients" WHERE (1 = 0)',  # Tableau
        "SELECT * FROM patients WHERE 1 = 0",  # jupysql
        "SELECT * FROM patients LIMIT 0",
        "SELECT * FROM patients WHERE false",
        "SELECT * FROM patients WHERE NULL",
        "SELECT * FROM patients WHERE age > 30 AND false",
        "SELECT * FROM patients WHERE NOT (1 = 1)",
        "SELECT patients.* FROM patients WHERE 1 <> 1",
        "SELECT * FROM (SELECT * FROM patients) AS virtual_table LIMIT 0",  # a wrapped dataset
    ],
)
def test_a_star_probe_lists_the_exposed_columns_in_policy_order(engine: Engine, sql: str) -> None:
    assert columns(engine, sql) == PATIENTS


def test_metabase_probe_is_one_boolean_column(engine: Engine) -> None:
    sql = 'SELECT TRUE AS "_" FROM "public"."patients" WHERE 1 <> 1 LIMIT 0'
    assert columns(engine, sql) == [("_", PgType.BOOL)]


def test_probes_of_columns_joins_and_aggregates_give_their_types(engine: Engine) -> None:
    assert columns(engine, "SELECT age, sex AS s, income * 2 AS twice FROM patients LIMIT 0") == [
        ("age", PgType.INT4),
        ("s", PgType.VARCHAR),
        ("twice", PgType.NUMERIC),
    ]
    joined = "SELECT p.*, v.cost FROM patients p JOIN visits v ON p.patient_id = v.patient_id WHERE 1 = 0"
    assert columns(engine, joined) == [*PATIENTS, ("cost", PgType.NUMERIC)]
    # A Superset virtual dataset over an aggregate: its outputs, as the query would return them.
    wrapped = (
        "SELECT * FROM (SELECT department, COUNT(*) AS n, AVG(cost) AS mean_cost FROM visits "
        "GROUP BY department) AS virtual_table LIMIT 0"
    )
    assert columns(engine, wrapped) == [
        ("department", PgType.VARCHAR),
        ("n", PgType.INT8),
        ("mean_cost", PgType.NUMERIC),
    ]
    grouped = "SELECT sex, COUNT(*) FROM patients WHERE 1 = 0 GROUP BY sex"
    assert columns(engine, grouped) == [("sex", PgType.VARCHAR), ("count", PgType.INT8)]
    assert columns(engine, "SELECT COUNT(*) AS n FROM patients HAVING false") == [("n", PgType.INT8)]


def test_an_aggregate_without_group_by_has_a_row_even_when_where_is_false(engine: Engine) -> None:
    # PostgreSQL answers one row (count 0): not empty, so answered as the private query it is.
    assert isinstance(engine.analyze("SELECT COUNT(*) FROM patients WHERE 1 = 0"), PrivateQuery)


@pytest.mark.parametrize(
    ("sql", "sqlstate", "fragment"),
    [
        ("SELECT * FROM secrets WHERE 1 = 0", "42501", 'table "secrets" is not exposed'),
        ("SELECT ssn FROM patients LIMIT 0", "42501", 'column "ssn" of table "patients" is not exposed'),
        ("SELECT * FROM (SELECT age FROM patients) AS v WHERE 1 = 0 LIMIT 0", None, None),
        ("SELECT nope FROM (SELECT age FROM patients) AS v LIMIT 0", "42703", 'column "nope" does not exist'),
        # Not constant: `age <> age` is never true in SQL, but only constants are folded.
        ("SELECT * FROM patients WHERE age <> age", "42501", "SELECT * would return raw rows"),
        ("SELECT * FROM patients WHERE 'a' = 'b'", "42501", "SELECT * would return raw rows"),
        ("SELECT * FROM patients WHERE 1 = 1 LIMIT 1", "42501", "SELECT * would return raw rows"),
    ],
)
def test_probes_check_tables_and_columns_and_only_constants_are_folded(
    engine: Engine, sql: str, sqlstate: str | None, fragment: str | None
) -> None:
    if sqlstate is None:
        assert columns(engine, sql) == [("age", PgType.INT4)]
        return
    with pytest.raises(DPProxyError) as caught:
        engine.analyze(sql)
    assert caught.value.sqlstate == sqlstate and fragment in caught.value.message, caught.value


@pytest.mark.parametrize(
    ("condition", "empty"),
    [
        ("1 = 0", True),
        ("1 <> 1", True),
        ("(1 = 0)", True),
        ("false", True),
        ("NULL", True),
        ("NULL = 1", True),
        ("x AND false", True),
        ("NOT true", True),
        ("1 = 0 OR NULL", True),
        ("NULL IS NOT NULL", True),
        ("-1 > 0", True),
        ("1 = 1", False),
        ("x OR true", False),
        ("NOT NULL", True),  # NULL: still no row
        ("x OR false", False),
        ("x <> x", False),  # NULL or false in SQL, but not decided from constants: not folded
        ("'a' = 'b'", False),  # text equality is the collation's: not folded
        ("1 = true", False),  # a type error in PostgreSQL, not an empty result
        ("NOT (x AND false)", False),
    ],
)
def test_never_true_is_decided_from_constants_in_three_valued_logic(condition: str, empty: bool) -> None:
    where = parse_statement(f"SELECT 1 FROM t WHERE {condition}").args["where"]
    assert isinstance(where, exp.Where)
    assert never_true(where.this) is empty


def test_a_raw_rows_refusal_says_how_to_get_an_aggregate_view(engine: Engine) -> None:
    # DBeaver's data tab: `SELECT * FROM t LIMIT 200` (and `SELECT t.* …` of a table).
    with pytest.raises(DPProxyError) as caught:
        engine.analyze("SELECT * FROM public.visits LIMIT 200")
    assert caught.value.sqlstate == "42501"
    assert caught.value.hint == (
        "ask for aggregates, e.g. SELECT COUNT(*) FROM visits, or one row per value of a column: "
        "SELECT department, COUNT(*) FROM visits GROUP BY department"
    )


def test_select_distinct_is_group_by_the_select_list(engine: Engine) -> None:
    superset = "SELECT DISTINCT diagnosis AS column_values FROM public.patients LIMIT 10000"
    grouped = "SELECT diagnosis AS column_values FROM public.patients GROUP BY diagnosis LIMIT 10000"
    distinct, group_by = engine.analyze(superset), engine.analyze(grouped)
    assert isinstance(distinct, PrivateQuery) and isinstance(group_by, PrivateQuery)
    assert distinct.keys == group_by.keys and distinct.components == group_by.components == ()
    assert distinct.post_processing == group_by.post_processing
    assert engine.plan(superset).cost == engine.plan(grouped).cost
    two = engine.analyze("SELECT DISTINCT zip, sex FROM patients ORDER BY sex")
    assert isinstance(two, PrivateQuery) and [k.text for k in two.keys] == ['"t0"."zip"', '"t0"."sex"']
    assert two.needs_selection  # zip has no public values: its groups go through partition selection
    with pytest.raises(DPProxyError) as caught:
        engine.analyze("SELECT DISTINCT * FROM patients")
    assert caught.value.sqlstate == "42501"
