"""The demo dataset: its schema, that its data looks real enough to make DP visible, and the copy to
PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import duckdb
import psycopg
import pytest

from dpproxy.backends.duckdb import DuckDBBackend
from dpproxy.backends.postgres import PostgresBackend
from dpproxy.demo import DEPARTMENTS, DIAGNOSES, build_demo, load_into_postgres
from dpproxy.policy import ColumnType

PERSONS = 2000

EXPECTED_SCHEMA = {
    "patients": [
        ("patient_id", ColumnType.INTEGER),
        ("age", ColumnType.INTEGER),
        ("sex", ColumnType.VARCHAR),
        ("income", ColumnType.NUMERIC),
        ("zip", ColumnType.VARCHAR),
        ("diagnosis", ColumnType.VARCHAR),
        ("smoker", ColumnType.BOOLEAN),
        ("enrolled", ColumnType.DATE),
    ],
    "visits": [
        ("visit_id", ColumnType.BIGINT),
        ("patient_id", ColumnType.INTEGER),
        ("visit_date", ColumnType.DATE),
        ("department", ColumnType.VARCHAR),
        ("cost", ColumnType.NUMERIC),
        ("duration_minutes", ColumnType.INTEGER),
    ],
    "zip_info": [
        ("zip", ColumnType.VARCHAR),
        ("city", ColumnType.VARCHAR),
        ("state", ColumnType.VARCHAR),
        ("population", ColumnType.INTEGER),
    ],
}

# One number per table that changes if any row or value changes.
FINGERPRINT_SQL = {
    "patients": "SELECT count(*), count(income), sum(income), sum(age), count(DISTINCT zip), "
    "count(*) FILTER (WHERE smoker), min(enrolled), max(enrolled), "
    "sum(length(diagnosis) * patient_id), sum(ascii(sex) * patient_id) FROM patients",
    "visits": "SELECT count(*), sum(cost), sum(duration_minutes), sum(visit_id * patient_id), "
    "min(visit_date), max(visit_date), sum(length(department) * visit_id) FROM visits",
    "zip_info": "SELECT count(*), sum(population), count(DISTINCT city), count(DISTINCT state), "
    "min(zip), max(zip) FROM zip_info",
}


@pytest.fixture(scope="module")
def small_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("small-demo") / "demo.duckdb"
    build_demo(path, persons=PERSONS, seed=0)
    return path


def query(path: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(path), read_only=True) as conn:
        return conn.execute(sql).fetchall()


def one(path: Path, sql: str) -> tuple:
    (row,) = query(path, sql)
    return row


def fingerprint_duckdb(path: Path) -> dict[str, tuple]:
    return {table: one(path, sql) for table, sql in FINGERPRINT_SQL.items()}


def test_schema_has_the_documented_tables_columns_and_types(small_demo: Path) -> None:
    with DuckDBBackend(small_demo) as backend:
        tables = backend.tables()
    assert {name: [(c.name, c.type) for c in columns] for name, columns in tables.items()} == EXPECTED_SCHEMA
    sql_types = {(t, c.name): c.sql_type for t, columns in tables.items() for c in columns}
    assert sql_types[("patients", "income")] == "DECIMAL(12,2)"
    assert sql_types[("visits", "cost")] == "DECIMAL(10,2)"
    keys = query(
        small_demo,
        "SELECT table_name, constraint_column_names FROM duckdb_constraints() "
        "WHERE constraint_type = 'PRIMARY KEY' ORDER BY table_name",
    )
    assert keys == [("patients", ["patient_id"]), ("visits", ["visit_id"]), ("zip_info", ["zip"])]


def test_summary_counts_what_was_built(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    summary = build_demo(
        tmp_path / "d.duckdb", persons=500, seed=3, progress=lambda d, t: calls.append((d, t))
    )
    assert summary.path == tmp_path / "d.duckdb"
    assert (summary.persons, summary.zips) == (500, 2000)
    assert summary.visits == one(summary.path, "SELECT count(*) FROM visits")[0]
    assert one(summary.path, "SELECT count(*) FROM patients") == (500,)
    assert summary.seconds > 0
    assert calls[0] == (0, 500) and calls[-1] == (500, 500)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    # Written atomically: nothing but the database is left in the directory.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.duckdb"]


def test_patients_look_like_a_population(small_demo: Path) -> None:
    people, min_age, max_age, null_income, rich, median_income, under_40, over_80 = one(
        small_demo,
        "SELECT count(*), min(age), max(age), count(*) FILTER (WHERE income IS NULL), "
        "count(*) FILTER (WHERE income > 500000), median(income), "
        "count(*) FILTER (WHERE age < 40), count(*) FILTER (WHERE age >= 80) FROM patients",
    )
    assert people == PERSONS
    assert min_age >= 0 and max_age <= 100
    assert 0.02 <= null_income / people <= 0.04
    assert rich >= 1  # clipping to policy bounds must matter
    assert 35000 <= median_income <= 55000
    assert under_40 > 3 * over_80  # an age pyramid, not a uniform spread
    sexes = dict(query(small_demo, "SELECT sex, count(*) FROM patients GROUP BY sex"))
    assert set(sexes) == {"F", "M", "X"}
    assert 0.44 <= sexes["F"] / people <= 0.54 and 0.005 <= sexes["X"] / people <= 0.04
    diagnoses = dict(query(small_demo, "SELECT diagnosis, count(*) FROM patients GROUP BY diagnosis"))
    assert set(diagnoses) == set(DIAGNOSES)
    assert max(diagnoses, key=diagnoses.__getitem__) == "healthy"
    enrolled_outside = (
        "SELECT count(*) FROM patients WHERE enrolled NOT BETWEEN '2015-01-01' AND '2025-12-31'"
    )
    assert one(small_demo, enrolled_outside) == (0,)


def test_visits_have_a_heavy_tail_per_patient(small_demo: Path) -> None:
    mean, most, without = one(
        small_demo,
        "SELECT avg(n), max(n), count(*) FILTER (WHERE n = 0) FROM ("
        "  SELECT count(v.visit_id) AS n FROM patients p LEFT JOIN visits v USING (patient_id)"
        "  GROUP BY p.patient_id)",
    )
    assert 3.5 <= mean <= 4.5
    assert most >= 30
    assert without > 0
    orphans, departments, first, last, min_cost, above_cap, short, long = one(
        small_demo,
        "SELECT count(*) FILTER (WHERE p.patient_id IS NULL), count(DISTINCT department), min(visit_date), "
        "max(visit_date), min(cost), count(*) FILTER (WHERE cost > 20000), min(duration_minutes), "
        "max(duration_minutes) FROM visits v LEFT JOIN patients p USING (patient_id)",
    )
    assert orphans == 0
    assert departments == len(DEPARTMENTS)
    assert str(first) >= "2020-01-01" and str(last) <= "2025-12-31"
    assert min_cost >= 0 and above_cap >= 1
    assert short >= 5 and long <= 600
    assert set(dict(query(small_demo, "SELECT department, 1 FROM visits GROUP BY 1"))) == set(DEPARTMENTS)


def test_every_zip_is_in_zip_info(small_demo: Path) -> None:
    assert one(small_demo, "SELECT count(*) FROM patients WHERE zip NOT IN (SELECT zip FROM zip_info)") == (
        0,
    )
    zips, distinct, five_digit, two_letter = one(
        small_demo,
        "SELECT count(*), count(DISTINCT zip), count(*) FILTER (WHERE regexp_full_match(zip, '[0-9]{5}')), "
        "count(*) FILTER (WHERE regexp_full_match(state, '[A-Z]{2}')) FROM zip_info",
    )
    assert zips == distinct == five_digit == two_letter == 2000
    # Popularity is skewed: the busiest zip has several times the patients of a typical one.
    busiest, typical = one(
        small_demo, "SELECT max(n), median(n) FROM (SELECT count(*) AS n FROM patients GROUP BY zip)"
    )
    assert busiest >= 3 * typical


def test_same_seed_same_data_other_seed_other_data(small_demo: Path, tmp_path: Path) -> None:
    again = build_demo(tmp_path / "again.duckdb", persons=PERSONS, seed=0).path
    assert fingerprint_duckdb(again) == fingerprint_duckdb(small_demo)
    patients_sql = "SELECT * FROM patients ORDER BY patient_id"
    assert query(again, patients_sql) == query(small_demo, patients_sql)
    other = build_demo(tmp_path / "other.duckdb", persons=PERSONS, seed=1).path
    assert fingerprint_duckdb(other)["patients"] != fingerprint_duckdb(small_demo)["patients"]
    assert fingerprint_duckdb(other)["zip_info"] == fingerprint_duckdb(small_demo)["zip_info"]  # public


def test_rebuild_replaces_the_file(tmp_path: Path) -> None:
    path = tmp_path / "demo.duckdb"
    build_demo(path, persons=300, seed=0)
    build_demo(path, persons=200, seed=0)
    assert one(path, "SELECT count(*) FROM patients") == (200,)


def test_loaded_postgres_matches_duckdb(demo_duckdb: Path, demo_pg_dsn: str) -> None:
    with psycopg.connect(demo_pg_dsn) as conn:
        in_postgres = {table: conn.execute(sql).fetchone() for table, sql in FINGERPRINT_SQL.items()}
    assert in_postgres == fingerprint_duckdb(demo_duckdb)
    with PostgresBackend(demo_pg_dsn) as backend:
        tables = backend.tables()
    assert {name: [(c.name, c.type) for c in columns] for name, columns in tables.items()} == EXPECTED_SCHEMA
    assert {c.name: c.sql_type for c in tables["patients"]}["income"] == "numeric(12,2)"


def test_load_into_postgres_is_idempotent(small_demo: Path, pg_dsn: str) -> None:
    progress: list[tuple[int, int]] = []
    load_into_postgres(small_demo, pg_dsn)
    load_into_postgres(small_demo, pg_dsn, progress=lambda d, t: progress.append((d, t)))
    with psycopg.connect(pg_dsn) as conn:
        in_postgres = {table: conn.execute(sql).fetchone() for table, sql in FINGERPRINT_SQL.items()}
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute("INSERT INTO visits VALUES (-1, -1, DATE '2021-01-01', 'general', 1, 10)")
    assert in_postgres == fingerprint_duckdb(small_demo)
    total = sum(row[0] for row in in_postgres.values())
    assert progress[-1] == (total, total)
