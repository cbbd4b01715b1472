"""pandas against dpproxy: `read_sql` and `read_sql_table` through SQLAlchemy 2 and psycopg 3 —
real library calls, not replayed text. pandas reflects the table with `schema="public"`
(SQLAlchemy Core then qualifies every column: `public.patients.diagnosis`), and `read_sql_table`
asks for the whole table: raw rows of a protected table are refused with 42501 and a hint, a
public table reads as a DataFrame.

pandas is not a dependency of dpproxy: without it these tests skip, with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import psycopg
import pytest
import sqlalchemy
from sqlalchemy import MetaData, Table, func, select

from tests.wire.test_clients import Served

DIAGNOSES = {"healthy", "flu", "cold", "asthma", "diabetes", "hypertension"}


@pytest.fixture
def engine(served: Served) -> Iterator[sqlalchemy.Engine]:
    engine = sqlalchemy.create_engine(served.url("psycopg"))
    try:
        yield engine
    finally:
        engine.dispose()


def test_read_sql_text_query_gives_a_dataframe(served: Served, engine: sqlalchemy.Engine) -> None:
    frame = pd.read_sql("SELECT diagnosis, COUNT(*) AS n FROM patients GROUP BY diagnosis ORDER BY 1", engine)
    assert list(frame.columns) == ["diagnosis", "n"]
    assert set(frame["diagnosis"]) <= DIAGNOSES and len(frame) >= 4
    assert abs(int(frame["n"].sum()) - served.truth.count()) < 0.2 * served.truth.count()


def test_read_sql_with_params_and_a_date_column(engine: sqlalchemy.Engine) -> None:
    frame = pd.read_sql(
        sqlalchemy.text("SELECT sex, AVG(income) AS mean_income FROM patients WHERE age > :age GROUP BY sex"),
        engine,
        params={"age": 40},
    )
    assert sorted(frame["sex"]) == ["F", "M", "X"]


def test_read_sql_of_a_core_select_with_schema_qualified_columns(engine: sqlalchemy.Engine) -> None:
    patients = Table("patients", MetaData(), schema="public", autoload_with=engine)
    query = select(patients.c.diagnosis, func.count().label("n")).group_by(patients.c.diagnosis)
    frame = pd.read_sql(query, engine)
    assert list(frame.columns) == ["diagnosis", "n"] and set(frame["diagnosis"]) <= DIAGNOSES


def test_read_sql_of_date_buckets_with_bound_units(engine: sqlalchemy.Engine) -> None:
    """SQLAlchemy over psycopg 3 sends a string argument as a parameter cast to varchar:
    `date_trunc(%(date_trunc_1)s::VARCHAR, public.visits.visit_date)`. PostgreSQL reads the text it
    casts; the proxy refused it ('must be a string constant'), and when Parse was analysed before
    the value was bound, its placeholder text was no unit at all."""
    visits = Table("visits", MetaData(), schema="public", autoload_with=engine)
    year = func.date_trunc("year", visits.c.visit_date).label("y")
    query = select(year, func.count().label("n")).group_by(year).order_by(year)
    assert "::VARCHAR" in str(query.compile(engine))
    frame = pd.read_sql(query, engine)
    assert list(frame.columns) == ["y", "n"] and len(frame) > 0
    assert all((y.month, y.day, y.hour) == (1, 1, 0) for y in frame["y"])
    quarter = func.date_part("quarter", visits.c.visit_date).label("q")
    frame = pd.read_sql(select(quarter, func.count().label("n")).group_by(quarter), engine)
    assert set(frame["q"]) == {1, 2, 3, 4}


def test_read_sql_table_of_a_public_table(engine: sqlalchemy.Engine) -> None:
    frame = pd.read_sql_table("zip_info", engine, schema="public")
    assert "zip" in frame.columns and len(frame) > 0


def test_read_sql_table_of_a_protected_table_is_refused(served: Served, engine: sqlalchemy.Engine) -> None:
    before = served.spent()
    # pandas wraps the driver's error in its DatabaseError; the psycopg error is its cause.
    with pytest.raises(pd.errors.DatabaseError) as refused:
        pd.read_sql_table("patients", engine, schema="public")
    cause: BaseException | None = refused.value
    while cause is not None and not isinstance(cause, psycopg.Error):
        cause = cause.__cause__
    assert isinstance(cause, psycopg.errors.InsufficientPrivilege)
    assert "raw rows" in str(cause) and cause.diag.message_hint
    assert served.spent() == before
