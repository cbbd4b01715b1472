"""Tableau's PostgreSQL JDBC connector against dpproxy, replayed through pgjdbc.

Tableau builds its SQL from the connector's dialect: tableau/connector-plugin-sdk,
samples/plugins/postgres_jdbc/dialect.tdd (`format-select`: SELECT … FROM … WHERE … GROUP BY …,
`format-date-literal` `(DATE '…')`, `YEAR` as `CAST(EXTRACT(YEAR FROM %1) AS INTEGER)`, `DATETRUNC`
as `DATE_TRUNC( '%1', CAST(%2 AS TIMESTAMP) )`, `COUNTD` as `COUNT(DISTINCT %1)`), with the table
aliased by its name and grouped by position, as in the TDVT expected SQL
(tdvt/tdvt/exprtests/standard/expected.setup.cast.str.12.txt: `SELECT … AS "…" FROM "public"."Calcs"
"Calcs" GROUP BY 1`). Opening a table, Tableau reads the catalog through DatabaseMetaData and the
result columns from a zero-row probe `SELECT * FROM "public"."patients" "patients" WHERE (1 = 0)`;
a filter card lists a dimension's domain with a GROUP BY. One JVM per backend runs the sequence.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.wire.test_clients import Served

from .replay import Result, assert_close, assert_empty_probe, charged_epsilon, meta, query, run_jvm

FROM = 'FROM "public"."patients" "patients"'
DIAGNOSES = {"healthy", "flu", "cold", "asthma", "diabetes", "hypertension"}
PATIENT_FIELDS = ["patient_id", "age", "sex", "income", "zip", "diagnosis", "smoker", "enrolled"]

STEPS = [
    meta("schemas", "getSchemas"),
    meta("tables", "getTables", "-", "public", "%", "TABLE,VIEW"),
    meta("columns", "getColumns", "-", "public", "patients", "%"),
    query("probe", f"SELECT * {FROM} WHERE (1 = 0)"),
    query("probe_public", 'SELECT * FROM "public"."zip_info" "zip_info" WHERE (1 = 0)'),
    query(
        "records_by_sex",
        f'SELECT "patients"."sex" AS "sex",\n  SUM(1) AS "sum:Number of Records:ok"\n{FROM}\nGROUP BY 1',
    ),
    query(
        "count_by_diagnosis_smoker",
        f'SELECT "patients"."diagnosis" AS "diagnosis",\n  "patients"."smoker" AS "smoker",\n'
        f'  COUNT(1) AS "cnt:patients_6A1C2B3D4E5F4A6B8C9D0E1F2A3B4C5D:ok"\n{FROM}\nGROUP BY 1,\n  2',
    ),
    query(
        "avg_income_by_year",
        f'SELECT CAST(EXTRACT(YEAR FROM "patients"."enrolled") AS INTEGER) AS "yr:enrolled:ok",\n'
        f'  AVG("patients"."income") AS "avg:income:ok"\n{FROM}\n'
        'WHERE ("patients"."enrolled" >= (DATE \'2015-01-01\'))\nGROUP BY 1',
    ),
    query(
        "count_by_month",
        f'SELECT DATE_TRUNC( \'MONTH\', CAST("patients"."enrolled" AS TIMESTAMP) ) AS "tmn:enrolled:ok",\n'
        f'  SUM(1) AS "sum:Number of Records:ok"\n{FROM}\nGROUP BY 1',
    ),
    query("countd", f'SELECT COUNT(DISTINCT "patients"."diagnosis") AS "ctd:diagnosis:ok"\n{FROM}'),
    query(
        "filter_domain", f'SELECT "patients"."diagnosis" AS "diagnosis"\n{FROM}\nGROUP BY 1\nORDER BY 1 ASC'
    ),
]


@pytest.fixture
def tableau(served: Served, replay_classes: Path) -> dict[str, Result]:
    if "tableau" not in served.cache:
        before = served.spent()
        served.cache["tableau"] = run_jvm(served, replay_classes, STEPS)
        served.cache["tableau_spent"] = served.spent() - before
    return served.cache["tableau"]


def test_tableau_lists_tables_and_columns(tableau: dict[str, Result]) -> None:
    assert "public" in tableau["schemas"].ok().column("table_schem")
    assert tableau["tables"].ok().column("table_name") == ["patients", "visits", "zip_info"]
    assert tableau["columns"].ok().column("column_name") == PATIENT_FIELDS


def test_tableau_zero_row_probe_describes_the_table(tableau: dict[str, Result]) -> None:
    assert_empty_probe(tableau["probe"], PATIENT_FIELDS)
    assert tableau["probe"].types == [
        "int4",
        "int4",
        "varchar",
        "numeric",
        "varchar",
        "varchar",
        "bool",
        "date",
    ]
    assert_empty_probe(tableau["probe_public"], tableau["probe_public"].names)
    assert "zip" in tableau["probe_public"].names


def test_tableau_group_by_position_answers(served: Served, tableau: dict[str, Result]) -> None:
    records = tableau["records_by_sex"].ok()
    assert records.names == ["sex", "sum:Number of Records:ok"]
    assert records.column("sex") == ["F", "M", "X"] or set(records.column("sex")) == {"F", "M", "X"}
    for sex, n in records.rows:
        truth = served.truth.count(lambda p, sex=sex: p.sex == sex)
        assert_close(n, truth, records, "sum:Number of Records:ok")
    grouped = tableau["count_by_diagnosis_smoker"].ok()
    assert grouped.names[:2] == ["diagnosis", "smoker"] and grouped.types[2] == "int8"
    assert set(grouped.column("diagnosis")) <= DIAGNOSES and set(grouped.column("smoker")) <= {"t", "f", None}


def test_tableau_date_parts_and_date_literals(tableau: dict[str, Result]) -> None:
    years = tableau["avg_income_by_year"].ok()
    assert years.names == ["yr:enrolled:ok", "avg:income:ok"] and years.types == ["int4", "numeric"]
    assert all(2015 <= int(y or 0) <= 2030 for y in years.column("yr:enrolled:ok"))
    months = tableau["count_by_month"].ok()
    assert months.types[0] == "timestamp"


def test_tableau_countd_and_filter_domain(tableau: dict[str, Result]) -> None:
    distinct = tableau["countd"].ok()
    # The demo's 3000 patients have all six diagnoses; the count is noisy: within its stated error.
    assert_close(distinct.rows[0][0], len(DIAGNOSES), distinct, "ctd:diagnosis:ok")
    domain = tableau["filter_domain"].ok()
    assert domain.names == ["diagnosis"] and set(domain.column("diagnosis")) <= DIAGNOSES


def test_tableau_charges_what_its_notices_say(served: Served, tableau: dict[str, Result]) -> None:
    assert charged_epsilon(tableau["probe"]) == 0 and charged_epsilon(tableau["probe_public"]) == 0
    total = sum(charged_epsilon(r) for r in tableau.values())
    assert total > 0 and served.cache["tableau_spent"] == pytest.approx(total)
