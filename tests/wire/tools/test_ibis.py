"""Ibis against dpproxy: the real `ibis-framework[postgres]` (12.x, over psycopg 3) on both
backends — not replayed text. Ibis compiles every expression to one SQL statement; what reaches
the proxy (recorded with ibis 12.0.0):

  - `ibis.postgres.connect(…)`: `SELECT CURRENT_DATABASE()`, `SELECT CURRENT_SCHEMA`;
    `list_tables()` reads `information_schema.tables` (a UNION ALL over two catalog SELECTs);
    `con.table(name)` / `.schema()`: `SELECT nspname FROM pg_namespace WHERE oid =
    pg_my_temp_schema()`, then `pg_attribute ⋈ pg_class ⋈ pg_namespace` with `format_type(atttypid,
    atttypmod)` and an EXISTS over `pg_enum`, bound `%(dbs)s`/`%(name)s` — all shadow catalog;
  - `.filter(…)`: `FROM (SELECT * FROM "visits" AS "t0" WHERE …) AS "t1"` (SELECT * in a subquery);
  - `.aggregate(…).order_by(…)` / `.limit(n)` / `.topk(k)`: `SELECT * FROM (<aggregate>) AS "t2"
    ORDER BY … [LIMIT n]`, answered from the released rows;
  - a join: `SELECT "t4"."state", COUNT(*) … FROM (SELECT <every column> FROM "patients" AS "t2"
    INNER JOIN "zip_info" AS "t3" ON …) AS "t4" GROUP BY 1`;
  - `ibis.date("2024-01-01")`: `MAKE_DATE(2024, 1, 1)`; `ibis.now().date()`: `DATE(CURRENT_TIMESTAMP)`
    (both folded into constants: tests/sql/test_ibis_dates.py).

  - `semi_join`/`anti_join` with a public table: `[NOT] EXISTS (SELECT 1 FROM … WHERE "t2"."zip" =
    "t3"."zip")`, answered as a semi-join (dpproxy/sql/subqueries.py).

Refused by design, nothing charged: `t.head()` / `t.select(…)` of a protected table (raw rows,
42501 with a hint); `con.sql(…)`, `.cache()` and `create_table` (Ibis describes `con.sql`'s query
by `CREATE TEMPORARY VIEW`: read-only, 42501, README Known limits). Ibis is not a dependency of
dpproxy: without it these tests skip.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.wire.test_clients import ALICE, ALICE_PASSWORD, Served

ibis = pytest.importorskip("ibis", reason="ibis-framework[postgres] is not installed")
pytest.importorskip("ibis.backends.postgres", reason="ibis-framework[postgres] is not installed")
_ = ibis._
# ibis 12 reads pandas' deprecated future.infer_string option on every string column.
pytestmark = pytest.mark.filterwarnings("ignore:The 'future.infer_string' option is deprecated")

EPSILON = 0.5  # the demo policy's per-query default

VISITS = {
    "visit_id": "!int64",
    "patient_id": "int32",
    "visit_date": "date",
    "department": "string",
    "cost": "decimal(10, 2)",
    "duration_minutes": "int32",
}
PATIENTS = {
    "patient_id": "!int32",
    "age": "int32",
    "sex": "string",
    "income": "decimal(12, 2)",
    "zip": "string",
    "diagnosis": "string",
    "smoker": "boolean",
    "enrolled": "date",
}
ZIP_INFO = {"zip": "!string", "city": "string", "state": "string", "population": "int32"}


@pytest.fixture
def con(served: Served) -> Any:
    if "ibis" not in served.cache:
        served.cache["ibis"] = ibis.postgres.connect(
            host="127.0.0.1", port=served.port, user=ALICE, password=ALICE_PASSWORD, database="demo"
        )
    return served.cache["ibis"]


def schema_of(table: Any) -> dict[str, str]:
    return {name: str(dtype) for name, dtype in table.schema().items()}


def charged(served: Served, run: Any) -> tuple[Any, float]:
    before = served.spent()
    result = run()
    return result, served.spent() - before


def test_tables_and_schemas_come_from_the_shadow_catalog(served: Served, con: Any) -> None:
    before = served.spent()
    assert con.list_tables() == ["patients", "visits", "zip_info"]
    assert schema_of(con.table("visits")) == VISITS
    assert schema_of(con.table("patients")) == PATIENTS
    assert schema_of(con.table("zip_info")) == ZIP_INFO
    assert con.list_catalogs() == ["demo"] and "public" in con.list_databases()
    assert served.spent() == before


def test_a_public_table_reads_as_is(served: Served, con: Any) -> None:
    zip_info = con.table("zip_info")
    before = served.spent()
    head = zip_info.head().execute()
    assert list(head.columns) == list(ZIP_INFO) and len(head) == 5
    assert zip_info.count().execute() == served.truth.zip_rows
    assert len(zip_info.to_pandas()) == served.truth.zip_rows
    states = zip_info.group_by("state").aggregate(p=_.population.sum()).to_pandas()
    assert states["p"].sum() == zip_info.population.sum().execute()
    assert served.spent() == before


def test_filter_group_by_aggregate_order_by_is_one_release(served: Served, con: Any) -> None:
    t = con.table("visits")
    by_department = (
        t.filter(t.cost > 10)
        .group_by("department")
        .aggregate(n=_.count(), avg=_.cost.mean())
        .order_by(ibis.desc("n"))
    )
    frame, spent = charged(served, by_department.to_pandas)
    assert spent == pytest.approx(EPSILON)
    assert list(frame.columns) == ["department", "n", "avg"]
    assert sorted(frame["department"]) == list(served.truth.departments)  # public keys, all of them
    assert list(frame["n"]) == sorted(frame["n"], reverse=True)
    assert ((frame["avg"] >= 0) & (frame["avg"] <= 20000)).all()  # within the policy's range

    top, spent = charged(served, by_department.limit(5).to_pandas)
    assert spent == pytest.approx(EPSILON) and len(top) == 5
    assert list(top["n"]) == sorted(top["n"], reverse=True)

    counts, spent = charged(served, t.department.topk(3).to_pandas)
    assert spent == pytest.approx(EPSILON) and len(counts) == 3


def test_scalar_aggregates_execute(served: Served, con: Any) -> None:
    patients = con.table("patients")
    truth = served.truth
    n, spent = charged(served, patients.count().execute)
    assert spent == pytest.approx(EPSILON)
    assert abs(n - truth.count()) < 0.2 * truth.count()
    mean, spent = charged(served, patients.income.mean().execute)
    assert spent == pytest.approx(EPSILON)
    exact = truth.mean_income(lambda _p: True)
    assert abs(float(mean) - exact) < 0.3 * exact
    visits = con.table("visits")
    (_n, spent) = charged(served, visits.count().execute)
    assert spent == pytest.approx(EPSILON)
    (_mean, spent) = charged(served, visits.cost.mean().execute)
    assert spent == pytest.approx(EPSILON)


def test_a_join_to_a_public_table(served: Served, con: Any) -> None:
    patients, zip_info = con.table("patients"), con.table("zip_info")
    states = set(zip_info.select("state").distinct().to_pandas()["state"])
    by_state = (
        patients.join(zip_info, "zip")
        .filter(_.population > 20000)
        .group_by(["state", "sex"])
        .aggregate(n=_.count())
    )
    frame, spent = charged(served, by_state.to_pandas)
    assert spent == pytest.approx(EPSILON)
    assert set(frame["state"]) <= states and set(frame["sex"]) <= {"F", "M", "X"}


def test_semi_and_anti_joins_with_a_public_table(served: Served, con: Any) -> None:
    """Ibis writes `[NOT] EXISTS (SELECT 1 FROM <zip_info, filtered in a subquery of its own> WHERE
    "t2"."zip" = "t3"."zip")`: a semi-join, answered as zip IN (the public table's zips). Every
    patient's zip is in zip_info, so the semi-join counts them all and the anti-join about none."""
    patients, zip_info = con.table("patients"), con.table("zip_info")
    semi, spent = charged(served, patients.semi_join(zip_info, "zip").count().execute)
    assert spent == pytest.approx(EPSILON)
    anti, spent = charged(served, patients.anti_join(zip_info, "zip").count().execute)
    assert spent == pytest.approx(EPSILON)
    total = served.truth.count()
    assert abs(semi - total) < 0.2 * total and abs(anti) < 0.2 * total
    big = zip_info.filter(zip_info.population > 20000)
    some, spent = charged(served, patients.semi_join(big, "zip").count().execute)
    assert spent == pytest.approx(EPSILON) and some < semi


def test_date_filters_ibis_writes(served: Served, con: Any) -> None:
    visits = con.table("visits")
    since = visits.filter(visits.visit_date >= ibis.date("2024-01-01")).count()
    n, spent = charged(served, since.execute)
    assert spent == pytest.approx(EPSILON) and n > 0
    last_year = visits.filter(visits.visit_date >= ibis.now().date() - ibis.interval(days=365))
    frame, spent = charged(served, last_year.group_by("department").aggregate(n=_.count()).to_pandas)
    assert spent == pytest.approx(EPSILON)
    assert sorted(frame["department"]) == list(served.truth.departments)


def test_weekdays_prefixes_and_days_as_ibis_writes_them(served: Served, con: Any) -> None:
    """Shapes Ibis writes for ordinary questions, each one release: `.day_of_week.index()` is
    `CAST(EXTRACT('dow' FROM d) + 6 AS SMALLINT) % 7` (refused as 'could overflow' while extract's
    range was taken for ±300,000), `.substr(0, 2)` is `SUBSTRING(s FROM CASE WHEN (0 + 1) >= 1 THEN
    0 + 1 ELSE 0 + 1 + LENGTH(s) END FOR 2)` (refused: 'expected a constant'), and `.date()` is
    `DATE(x)`, PostgreSQL's function for the cast (refused: 'date() is not supported'), and
    `.startswith` is PostgreSQL's starts_with() and `.strftime` its to_char() (both refused: 'not
    supported')."""
    visits, patients = con.table("visits"), con.table("patients")
    weekdays = visits.group_by(d=visits.visit_date.day_of_week.index()).aggregate(n=_.count())
    frame, spent = charged(served, weekdays.to_pandas)
    assert spent == pytest.approx(EPSILON)
    assert len(frame) > 0 and set(frame["d"]) <= set(range(7))
    prefixes = patients.group_by(p=patients.zip.substr(0, 1)).aggregate(n=_.count())
    frame, spent = charged(served, prefixes.to_pandas)
    assert spent == pytest.approx(EPSILON)
    assert len(frame) > 0 and all(len(p) == 1 for p in frame["p"])
    # `.startswith` is STARTS_WITH(zip, '1'), read as left(zip, 1) = '1'.
    first = frame.sort_values("n")["p"].iloc[-1]
    n, spent = charged(served, patients.filter(patients.zip.startswith(first)).count().execute)
    assert spent == pytest.approx(EPSILON) and n > 0
    # Days of a timestamp: a key of its own (partition selection hides the demo's small days).
    days = visits.group_by(d=visits.visit_date.cast("timestamp").date()).aggregate(n=_.count())
    frame, spent = charged(served, days.to_pandas)
    assert spent == pytest.approx(EPSILON) and list(frame.columns) == ["d", "n"]
    # `.strftime('%Y')` is TO_CHAR(visit_date, 'YYYY'): the year as PostgreSQL writes it (a text
    # key: partition selection shows the years with many patients).
    years = visits.group_by(y=visits.visit_date.strftime("%Y")).aggregate(n=_.count())
    frame, spent = charged(served, years.to_pandas)
    assert spent == pytest.approx(EPSILON) and len(frame) > 0
    assert all(len(y) == 4 and 2000 <= int(y) <= 2100 for y in frame["y"])
    recent = visits.filter(visits.visit_date.cast("timestamp").date() >= ibis.date("2020-01-01")).count()
    n, spent = charged(served, recent.execute)
    assert spent == pytest.approx(EPSILON) and n > 0


def test_raw_rows_and_writes_are_refused_free(served: Served, con: Any) -> None:
    visits = con.table("visits")
    before = served.spent()
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
        visits.head().execute()
    assert "raw rows" in str(refused.value) and refused.value.diag.message_hint
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
        visits.select("department", "cost").execute()
    assert "raw rows" in str(refused.value)
    # con.sql describes its query through CREATE TEMPORARY VIEW: a write (README, Known limits).
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
        con.sql("SELECT department, COUNT(*) AS n FROM visits GROUP BY department")
    assert "read-only" in str(refused.value)
    assert served.spent() == before
