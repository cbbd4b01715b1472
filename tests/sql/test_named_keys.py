"""GROUP BY keys whose values the WHERE names (dpproxy.sql.public_keys, PublicKeys._named): a key
without public values, filtered by a top-level `key IN (constants)` or `key = constant`, takes the
named values as its public ones — released zero-filled, with no partition selection and no δ — as
Tumult's KeySet, given in SQL. What a BI tool's filter on a dimension sends (`WHERE "zip" IN (…)
GROUP BY "zip"`), which partition selection answered with an empty table for small groups.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from dpproxy.engine import Engine
from dpproxy.sql.query import PrivateQuery
from dpproxy.sql.statement import parse_statement

DEMO_POLICY = Path(__file__).parents[2] / "policies" / "demo.yaml"


@pytest.fixture(scope="module")
def demo(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory):
    ledger = tmp_path_factory.mktemp("ledger") / "ledger.sqlite"
    with Engine.open(DEMO_POLICY, str(demo_duckdb), ledger) as engine:
        yield engine


def named(engine: Engine, sql: str) -> tuple[object, ...] | None:
    query = engine.analyze(sql)
    assert isinstance(query, PrivateQuery)
    (key,) = query.keys
    assert query.needs_selection == (key.public_values is None), sql
    return key.public_values


def test_the_values_a_where_names_are_the_keys_public_values(demo: Engine) -> None:
    zips = "SELECT zip, COUNT(*) FROM patients"
    cases = {
        f"{zips} WHERE zip IN ('10001', '99999') GROUP BY zip": ("10001", "99999"),
        f"{zips} WHERE zip = '10001' AND age > 30 GROUP BY 1": ("10001",),
        f"{zips} WHERE '10001' = zip GROUP BY zip": ("10001",),
        # several lists: the values all name; then the WHERE's other comparisons of the key
        f"{zips} WHERE zip IN ('a', 'b', 'c') AND zip IN ('b', 'c', 'd') GROUP BY zip": ("b", "c"),
        f"{zips} WHERE zip IN ('a', 'b', 'c') AND zip <> 'b' AND zip NOT IN ('c') GROUP BY zip": ("a",),
        # an integer key: a constant no value of it can equal names nothing
        "SELECT visit_id, COUNT(*) FROM visits WHERE visit_id IN (2, 1, 2.5) GROUP BY visit_id": (1, 2),
        "SELECT visit_date, COUNT(*) FROM visits WHERE visit_date IN ('2024-01-02', DATE '2024-01-01') "
        "GROUP BY 1": (dt.date(2024, 1, 1), dt.date(2024, 1, 2)),
        # `= ANY(ARRAY[…])` (psycopg's `= ANY(%s)` with a list, once bound) is that IN list
        f"{zips} WHERE zip = ANY(ARRAY['10001', '99999']) GROUP BY zip": ("10001", "99999"),
        f"{zips} WHERE zip = ANY(CAST(ARRAY['10001'] AS text[])) GROUP BY zip": ("10001",),
        # a number cast to text is the text the backend prints: CAST(007 AS text) is '7'
        f"{zips} WHERE zip IN (CAST(007 AS text), '007') GROUP BY zip": ("007", "7"),
        "SELECT visit_id, COUNT(*) FROM visits WHERE visit_id = ANY(ARRAY['2', '1']::int[]) GROUP BY 1": (
            1,
            2,
        ),
        # not a list of constants of the key alone, at the top of the WHERE: partition selection
        f"{zips} WHERE zip = '10001' OR zip = '10002' GROUP BY zip": None,
        f"{zips} WHERE zip IN ('10001', NULL) GROUP BY zip": None,
        f"{zips} WHERE zip IN ('a') AND zip IN ('b') GROUP BY zip": None,
        f"{zips} WHERE lower(zip) = '10001' GROUP BY zip": None,
    }
    for sql, expected in cases.items():
        assert named(demo, sql) == expected, sql
    # A subquery over public tables is answered first and its values inlined: they are public too.
    in_ca = demo.backend_or_fail().run("SELECT DISTINCT zip FROM zip_info WHERE state = 'CA' ORDER BY 1")
    sql = f"{zips} WHERE zip IN (SELECT zip FROM zip_info WHERE state = 'CA') GROUP BY zip"
    assert named(demo, sql) == tuple(row[0] for row in in_ca) != ()


def test_every_named_value_is_released_zero_filled_without_delta(demo: Engine) -> None:
    sql = "SELECT zip, COUNT(*) AS n FROM patients WHERE zip IN ('99998', '99999') GROUP BY zip"
    explained = demo.explain(sql)
    assert explained.selection is not None
    assert "zip: the 2 values the WHERE names (public: the query names them)" in explained.selection
    assert explained.cost.delta == 0
    # No patient lives there: both are still released, with noise around 0, and nothing is hidden.
    result = demo.execute(sql, analyst="alice")
    assert [row[0] for row in result.rows] == ["99998", "99999"]
    assert not any("not shown" in note for note in result.notes)
    assert result.cost.delta == 0


def test_a_named_key_counts_only_the_rows_the_where_keeps(demo: Engine) -> None:
    busiest = demo.backend_or_fail().run(
        "SELECT zip, COUNT(*) FROM patients WHERE zip IS NOT NULL GROUP BY zip ORDER BY 2 DESC, 1 LIMIT 2"
    )
    assert len(busiest) == 2
    listed = ", ".join(f"'{zip}'" for zip, _ in busiest)
    result = demo.execute(
        f"SELECT zip, COUNT(*) FROM patients WHERE zip IN ({listed}) GROUP BY zip",
        analyst="alice",
        epsilon=1.0,
    )
    truth = dict(busiest)
    assert sorted(row[0] for row in result.rows) == sorted(truth)
    for zip, count in result.rows:
        # One row per patient (k = 1): Laplace noise of scale 1/ε; ±25 is beyond 1e-10.
        assert abs(count - truth[zip]) <= 25, (zip, count, truth[zip])


def test_an_empty_any_admits_no_row(demo: Engine) -> None:
    """`x = ANY('{}')` is false for every row (a NULL x too), as in PostgreSQL."""
    tree = parse_statement("SELECT COUNT(*) FROM patients WHERE zip = ANY(ARRAY[]::text[])")
    assert tree.sql("postgres") == "SELECT COUNT(*) FROM patients WHERE FALSE"
    assert isinstance(
        demo.analyze("SELECT COUNT(*) FROM patients WHERE zip = ANY(ARRAY[]::text[])"), PrivateQuery
    )


def test_a_case_whose_every_result_is_a_constant_takes_those_results(demo: Engine) -> None:
    """`CASE … THEN c … ELSE c END` with constant results: each row's key is one of them whatever the
    conditions read, and the query wrote them (PublicKeys._case)."""
    bands = "CASE WHEN age < 30 THEN 'young' WHEN age < 60 THEN 'middle' ELSE 'old' END"
    cases = {
        f"SELECT {bands} AS band, COUNT(*) FROM patients GROUP BY 1": ("middle", "old", "young"),
        # a simple CASE, integer results, a result named twice
        "SELECT CASE zip WHEN '10001' THEN 1 WHEN '10002' THEN 1 ELSE 0 END, COUNT(*) FROM patients "
        "GROUP BY 1": (0, 1),
        # the WHERE's comparisons of the key itself restrict them
        f"SELECT {bands}, COUNT(*) FROM patients WHERE {bands} <> 'old' GROUP BY 1": ("middle", "young"),
        # no ELSE: a row no condition holds for has a NULL key (never public): partition selection
        "SELECT CASE WHEN age < 30 THEN 'young' END, COUNT(*) FROM patients GROUP BY 1": None,
        "SELECT CASE WHEN age < 30 THEN 'young' ELSE NULL END, COUNT(*) FROM patients GROUP BY 1": None,
        # a result that is not a constant, or a float's: partition selection
        "SELECT CASE WHEN age < 30 THEN 'young' ELSE zip END, COUNT(*) FROM patients GROUP BY 1": None,
        "SELECT CASE WHEN age < 30 THEN 1.5 ELSE 2.5 END, COUNT(*) FROM patients GROUP BY 1": None,
        "SELECT CASE WHEN age < 30 THEN CAST(007 AS text) ELSE 'b' END, COUNT(*) FROM patients GROUP BY 1": (
            "7",
            "b",
        ),
    }
    for sql, expected in cases.items():
        assert named(demo, sql) == expected, sql


def test_a_case_band_no_row_has_is_released_zero_filled_without_delta(demo: Engine) -> None:
    sql = (
        "SELECT CASE WHEN age > 200 THEN 'impossible' WHEN age >= 50 THEN 'over 50' ELSE 'under 50' END "
        "AS band, COUNT(*) FROM patients GROUP BY 1 ORDER BY 1"
    )
    explained = demo.explain(sql)
    assert explained.selection is not None
    assert "the 3 results its THEN and ELSE name (public: the query names them)" in explained.selection
    assert explained.cost.delta == 0
    truth = dict(
        demo.backend_or_fail().run(
            "SELECT CASE WHEN age >= 50 THEN 'over 50' ELSE 'under 50' END, COUNT(*) FROM patients "
            "WHERE patient_id IS NOT NULL GROUP BY 1"
        )
    )
    result = demo.execute(sql, analyst="alice", epsilon=1.0)
    assert [row[0] for row in result.rows] == ["impossible", "over 50", "under 50"]
    assert not any("not shown" in note for note in result.notes)
    assert result.cost.delta == 0
    for band, count in result.rows:
        # One row per patient (k = 1): Laplace noise of scale 1/ε; ±25 is beyond 1e-10.
        assert abs(count - truth.get(band, 0)) <= 25, (band, count, truth.get(band, 0))
