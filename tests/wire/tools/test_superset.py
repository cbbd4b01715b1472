"""Apache Superset (6.x) against dpproxy: the SQL its PostgreSQL engine spec and query builder emit,
run as Superset runs it (SQLAlchemy's inspector for datasets; queries as text through the simple
query protocol, as psycopg2 sends a statement without parameters).

From apache/superset:
- superset/db_engine_specs/postgres.py: `_time_grain_expressions` (`DATE_TRUNC('year', {col})`, …)
  and `convert_dttm` (`TO_DATE('…', 'YYYY-MM-DD')` for a date column, `TO_TIMESTAMP('…',
  'YYYY-MM-DD HH24:MI:SS.US')` for a timestamp);
- superset/models/helpers.py: `values_for_column` (`SELECT DISTINCT col AS column_values … LIMIT
  10000`, the filter dropdown), the virtual dataset wrapper `FROM (<sql>) AS virtual_table`, and the
  series limit subquery (`… AS mme_inner__ … LIMIT 5) AS series_limit ON department =
  department__`), with an ad-hoc metric label quoted as SQLAlchemy quotes it (`"AVG(income)"`);
- superset/connectors/sqla/utils.py: a virtual dataset's columns read from its SQL with a row limit.
scripts/bi_tools/run.sh drives a real Superset through its REST API; this replays its SQL in CI.
"""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy
from sqlalchemy import inspect

from tests.wire.test_clients import Served

from .replay import Result, assert_refused, charged_epsilon, psycopg_connect, run_psycopg

DIAGNOSES = {"healthy", "flu", "cold", "asthma", "diabetes", "hypertension"}
DEPARTMENTS = {
    "cardiology", "dermatology", "emergency", "general", "neurology", "oncology", "orthopedics", "pediatrics",
}  # fmt: skip
SQLLAB = "SELECT diagnosis, COUNT(*) AS count FROM patients GROUP BY diagnosis"
VIRTUAL = "SELECT diagnosis, sex, income FROM patients WHERE age >= 18"  # a virtual dataset's SQL
DATE_RANGE = (
    "enrolled >= TO_DATE('2015-01-01', 'YYYY-MM-DD') AND enrolled < TO_DATE('2025-01-01', 'YYYY-MM-DD')"
)
VISIT_DATE_RANGE = (
    "visit_date >= TO_DATE('2015-01-01', 'YYYY-MM-DD') AND visit_date < TO_DATE('2025-01-01', 'YYYY-MM-DD')"
)
# convert_dttm's form for a timestamp column (the demo has none: visit_date stands in for one).
VISIT_RANGE = (
    "visit_date >= TO_TIMESTAMP('2020-01-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US') "
    "AND visit_date < TO_TIMESTAMP('2024-01-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US')"
)

QUERIES = {
    "ping": "SELECT 1",
    "sqllab": f"{SQLLAB}\nLIMIT 1001",
    "virtual_columns": f"{VIRTUAL}\nLIMIT 1",
    "virtual_chart": (
        'SELECT diagnosis AS diagnosis, AVG(income) AS "AVG(income)" \n'
        f'FROM ({VIRTUAL}\n) AS virtual_table GROUP BY diagnosis ORDER BY "AVG(income)" DESC \n LIMIT 10000'
    ),
    # As Superset 6.1 generated it for a bar chart of the patients dataset (metric "count", time
    # grain P1Y, time range 2015-01-01 : 2025-01-01), printed by scripts/bi_tools/run.sh.
    "time_range_year": (
        "SELECT DATE_TRUNC('year', enrolled) AS enrolled, COUNT(*) AS count \nFROM public.patients \n"
        f"WHERE {DATE_RANGE} GROUP BY DATE_TRUNC('year', enrolled) ORDER BY count DESC \n LIMIT 10000"
    ),
    "time_range_timestamp": (
        "SELECT DATE_TRUNC('year', visit_date) AS visit_date, AVG(cost) AS \"AVG(cost)\" \nFROM public.visits \n"
        f"WHERE {VISIT_RANGE} GROUP BY DATE_TRUNC('year', visit_date) "
        'ORDER BY "AVG(cost)" DESC \n LIMIT 10000'
    ),
    "filter_values_public": "SELECT DISTINCT diagnosis AS column_values \nFROM public.patients \n LIMIT 10000",
    "filter_values_private": "SELECT DISTINCT zip AS column_values \nFROM public.patients \n LIMIT 10000",
    # As Superset 6.1 generated it for visits by department with series limit 5 (run.sh).
    "series_limit": (
        "SELECT DATE_TRUNC('year', visit_date) AS visit_date, department AS department, COUNT(*) AS count \n"
        "FROM public.visits JOIN (SELECT department AS department__, COUNT(*) AS mme_inner__ \n"
        f"FROM public.visits \nWHERE {VISIT_DATE_RANGE} GROUP BY department ORDER BY COUNT(*) DESC \n"
        f" LIMIT 5) AS series_limit ON department = department__ \nWHERE {VISIT_DATE_RANGE} "
        "GROUP BY DATE_TRUNC('year', visit_date), department ORDER BY count DESC \n LIMIT 10000"
    ),
}


@pytest.fixture
def superset(served: Served) -> dict[str, Result]:
    if "superset" not in served.cache:
        before = served.spent()
        with psycopg_connect(served) as conn:
            served.cache["superset"] = {
                name: run_psycopg(conn, sql, simple=True) for name, sql in QUERIES.items()
            }
        served.cache["superset_spent"] = served.spent() - before
    return served.cache["superset"]


def test_superset_dataset_creation_reads_the_table_through_sqlalchemy(served: Served) -> None:
    engine = sqlalchemy.create_engine(served.url("psycopg"))
    try:
        inspector = inspect(engine)
        assert "public" in inspector.get_schema_names()
        assert inspector.get_table_names(schema="public") == ["patients", "visits", "zip_info"]
        columns = inspector.get_columns("patients", schema="public")
        assert [c["name"] for c in columns][:3] == ["patient_id", "age", "sex"]
        assert inspector.get_pk_constraint("patients", schema="public")["constrained_columns"] == [
            "patient_id"
        ]
        fks = inspector.get_foreign_keys("visits", schema="public")
        assert [(fk["constrained_columns"], fk["referred_table"]) for fk in fks] == [
            (["patient_id"], "patients")
        ]
        inspector.get_indexes("patients", schema="public")  # answers, whatever the indexes
    finally:
        engine.dispose()


def test_superset_sql_lab_and_virtual_dataset(served: Served, superset: dict[str, Result]) -> None:
    assert superset["ping"].ok().rows == [("1",)]
    sqllab = superset["sqllab"].ok()
    assert sqllab.names == ["diagnosis", "count"] and set(sqllab.column("diagnosis")) <= DIAGNOSES
    # Saving a virtual dataset reads its columns from one row of its SQL: raw rows, refused with
    # a hint (the dataset's columns can be typed in by hand, or the dataset made from the table).
    assert_refused(superset["virtual_columns"], "42501", "raw rows", "patients")
    chart = superset["virtual_chart"].ok()
    assert chart.names == ["diagnosis", "AVG(income)"] and set(chart.column("diagnosis")) <= DIAGNOSES
    assert chart.rowcount >= 4


def test_superset_time_range_filters_fold_to_date_and_to_timestamp(
    served: Served, superset: dict[str, Result]
) -> None:
    years = superset["time_range_year"].ok()
    assert years.names == ["enrolled", "count"]
    for year, _count in years.rows:
        assert 2015 <= dt.datetime.fromisoformat(year or "").year < 2025
    total = sum(int(c or 0) for c in years.column("count"))
    truth = served.truth.count(lambda p: p.enrolled is not None and p.enrolled < dt.date(2025, 1, 1))
    assert abs(total - truth) < 0.2 * truth
    # Years (grain P1Y): each holds 600+ persons, far above partition selection's threshold (~300
    # for an average's share of ε); quarters of 3000 test persons are released only most times.
    years = superset["time_range_timestamp"].ok()
    assert years.names == ["visit_date", "AVG(cost)"] and years.rowcount > 0
    released = {dt.datetime.fromisoformat(y or "").year for y in years.column("visit_date")}
    assert released <= {2020, 2021, 2022, 2023}


def test_superset_filter_dropdown_values(superset: dict[str, Result]) -> None:
    public = superset["filter_values_public"].ok()
    assert public.names == ["column_values"] and set(public.column("column_values")) <= DIAGNOSES
    assert public.rowcount >= 4
    private = superset["filter_values_private"].ok()
    assert private.names == ["column_values"]
    # zip has no public values: released keys come from private partition selection, charged.
    assert charged_epsilon(private) > 0


def test_superset_series_limit_joins_a_noisy_top_k(superset: dict[str, Result]) -> None:
    series = superset["series_limit"].ok()
    assert series.names == ["visit_date", "department", "count"]
    departments = set(series.column("department"))
    # (year, department) groups go through partition selection (visit_date has no declared range in
    # the demo): of the demo's 3,000 persons, one or two such groups usually pass, none about one
    # time in a hundred (a CI run failed so), so the test asks only what the join guarantees.
    assert departments <= DEPARTMENTS and len(departments) <= 5
    assert charged_epsilon(series) > 0


def test_superset_charges_what_its_notices_say(served: Served, superset: dict[str, Result]) -> None:
    assert charged_epsilon(superset["ping"]) == 0
    spent = sum(charged_epsilon(r) for r in superset.values())
    assert served.cache["superset_spent"] == pytest.approx(spent)
    sqllab = superset["sqllab"]
    for diagnosis, count in sqllab.rows:
        truth = served.truth.count()
        assert 0 <= int(count or 0) <= truth, (diagnosis, count)  # a group is never above the total
