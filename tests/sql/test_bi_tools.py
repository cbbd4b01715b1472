"""The SQL BI tools send, analyzed as PostgreSQL would read it: qualified names (Metabase, SQLAlchemy
with a schema), Grafana's macro expansions, Superset's time-range constants.

The SQL is the tools' own, from their public source (cited beside each case), over the language
tests' schema; statements run on both backends, whose pre-noise values must agree with each other
and with what PostgreSQL computes from the raw table.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import pytest

from dpproxy.engine import Engine
from dpproxy.errors import DPProxyError
from dpproxy.policy import parse_policy
from dpproxy.sql.analyze import analyze
from dpproxy.sql.statement import parse_statement
from tests.certify import at_ceilings
from tests.pgcluster import PgCluster
from tests.sql.language import schema
from tests.sql.language.databases import Loaded, RawBackend, adversarial_pair

BACKENDS = ["duckdb", "postgres"]


@pytest.fixture(scope="module")
def loaded(pg_cluster: PgCluster) -> Iterator[dict[str, Loaded]]:
    with adversarial_pair(pg_cluster, "bitools") as pair:
        yield pair


def engine(loaded: Loaded | None = None) -> Engine:
    return Engine(
        parse_policy(schema.policy_text(schema.HIGH_LIMITS)),
        RawBackend(loaded) if loaded is not None else None,
    )


def refused(sql: str, database: str | None = None) -> DPProxyError:
    policy = parse_policy(schema.policy_text(schema.LIMITS))
    with pytest.raises(DPProxyError) as caught:
        analyze(parse_statement(sql), policy, database=database)
    return caught.value


def _number(value: object) -> object:
    return Decimal(repr(value)) if isinstance(value, float) else value


def measured(loaded: Loaded, sql: str) -> dict[tuple[object, ...], int]:
    """Pre-noise COUNT(*) per group, as the backend computes it for dpproxy's plan."""
    plan = engine(loaded).plan(sql, salt="s")
    result = at_ceilings(plan, plan.measure(*(loaded.run(s) for s in plan.statements)))
    return {
        tuple(_number(k) for k in key): int(components[0])
        for key, components in zip(result.keys, result.components, strict=True)
    }


# The raw queries leave out the rows whose privacy unit is NULL, as every private query does.
def raw_counts(pg: Loaded, sql: str) -> dict[tuple[object, ...], int]:
    return {tuple(_number(k) for k in row[:-1]): int(row[-1]) for row in pg.run(sql)}


# -- 1. qualified names ----------------------------------------------------------------------------

# Metabase's GUI question "Count of patients by diagnosis", as its SQL query processor writes it
# (metabase: src/metabase/driver/sql/query_processor.clj qualifies every field as schema.table.column).
METABASE_GROUP_BY = (
    'SELECT "public"."patients"."diagnosis" AS "diagnosis", COUNT(*) AS "count" FROM "public"."patients" '
    'GROUP BY "public"."patients"."diagnosis" ORDER BY "public"."patients"."diagnosis" ASC'
)

QUALIFIED_AS_UNQUALIFIED = [
    (
        METABASE_GROUP_BY,
        "SELECT diagnosis AS diagnosis, COUNT(*) AS count FROM patients GROUP BY diagnosis "
        "ORDER BY diagnosis ASC",
    ),
    (
        "SELECT public.patients.zip, SUM(public.patients.age) FROM public.patients "
        "WHERE public.patients.age > 30 GROUP BY public.patients.zip "
        "HAVING COUNT(public.patients.income) > 1 ORDER BY public.patients.zip",
        "SELECT zip, SUM(age) FROM patients WHERE age > 30 GROUP BY zip HAVING COUNT(income) > 1 ORDER BY zip",
    ),
    # SQLAlchemy Core with schema='public' (Table(..., schema="public")): table.column qualification
    # over a schema-qualified FROM, and a database-qualified name (db.schema.table.column).
    (
        'SELECT "public".visits.department, count(*) FROM "public".visits JOIN public.patients '
        "ON public.patients.patient_id = public.visits.patient_id "
        "WHERE lang.public.visits.cost > 10 GROUP BY public.visits.department",
        "SELECT visits.department, count(*) FROM visits JOIN patients ON patients.patient_id = visits.patient_id "
        "WHERE visits.cost > 10 GROUP BY visits.department",
    ),
    (
        "SELECT COUNT(*) FROM lang.public.patients WHERE public.patients.zip IN "
        "(SELECT public.zip_info.zip FROM public.zip_info WHERE public.zip_info.state = 'CA')",
        "SELECT COUNT(*) FROM patients WHERE zip IN (SELECT zip FROM zip_info WHERE state = 'CA')",
    ),
]


@pytest.mark.parametrize(("qualified", "plain"), QUALIFIED_AS_UNQUALIFIED)
def test_qualified_names_give_the_same_rewritten_sql_as_unqualified_ones(qualified: str, plain: str) -> None:
    e = engine()
    assert e.plan(qualified, salt="s").statements == e.plan(plain, salt="s").statements


def test_qualified_columns_of_a_public_table_run_as_the_unqualified_query(loaded: dict[str, Loaded]) -> None:
    """A public query's qualified columns are re-emitted as table.column (they named the schema the
    FROM clause had lost, and failed in the backend with a misleading charged error)."""
    sql = 'SELECT "public"."zip_info"."state", COUNT(*) FROM "public"."zip_info" GROUP BY "public"."zip_info"."state"'
    for backend in BACKENDS:
        query = engine(loaded[backend]).analyze(sql)
        plain = engine(loaded[backend]).analyze("SELECT state, COUNT(*) FROM zip_info GROUP BY state")
        assert query.sql.sql("postgres") == plain.sql.sql("postgres")
        rows = loaded[backend].run(query.sql.sql("duckdb" if backend == "duckdb" else "postgres"))
        assert sorted(rows, key=repr) == sorted(
            loaded[backend].run("SELECT state, COUNT(*) FROM zip_info GROUP BY state"), key=repr
        )


@pytest.mark.parametrize(
    ("sql", "sqlstate", "fragments"),
    [
        (
            "SELECT COUNT(*) FROM other.public.patients",
            "0A000",
            [
                "cross-database references are not implemented: other.public.patients",
                'serves the database "lang"',
            ],
        ),
        (
            "SELECT other.public.patients.sex, COUNT(*) FROM patients GROUP BY 1",
            "0A000",
            ["cross-database references are not implemented: other.public.patients.sex"],
        ),
        ("SELECT COUNT(*) FROM nope.patients", "3F000", ['schema "nope" does not exist', "schema public"]),
        (
            "SELECT public.visits.cost, COUNT(*) FROM patients GROUP BY 1",
            "42P01",
            ['missing FROM-clause entry for table "visits" (public.visits.cost)', 'add "visits" to the FROM'],
        ),
        (
            "SELECT nope.patients.sex, COUNT(*) FROM patients GROUP BY 1",
            "42P01",
            ['missing FROM-clause entry for table "patients"', "in schema public"],
        ),
        (
            "SELECT public.patients.sex, COUNT(*) FROM patients p GROUP BY 1",
            "42P01",
            ['invalid reference to FROM-clause entry for table "patients"', 'the table alias "p"'],
        ),
        (
            'SELECT COUNT(*) FROM "public"."patients" WHERE "public"."patients"."ssn" > 1',
            "42501",
            ['column "ssn" of table "patients" is not exposed'],
        ),
    ],
)
def test_wrong_qualifiers_are_refused_as_postgresql_refuses_them(
    sql: str, sqlstate: str, fragments: list[str]
) -> None:
    error = refused(sql, database="lang")
    assert error.sqlstate == sqlstate, str(error)
    for fragment in fragments:
        assert fragment in str(error)


def test_the_served_database_name_qualifies_tables_and_columns() -> None:
    policy = parse_policy(schema.policy_text(schema.LIMITS))
    sql = 'SELECT "lang"."public"."patients"."zip", COUNT(*) FROM "lang"."public"."patients" GROUP BY 1'
    analyze(parse_statement(sql), policy, database="lang")


# -- 3. Grafana ------------------------------------------------------------------------------------

# Grafana's PostgreSQL macro engine (grafana: pkg/tsdb/grafana-postgresql-datasource/macros.go):
#   $__timeFilter(t)          → t BETWEEN '<from RFC 3339>' AND '<to RFC 3339>'
#   $__timeGroupAlias(t, '1h') → floor(extract(epoch from t)/3600)*3600 AS "time"
#   $__timeEpoch(t)           → extract(epoch from t) as "time"
GRAFANA = [
    # a date column, grouped by day
    (
        'SELECT floor(extract(epoch from visit_date)/86400)*86400 AS "time", count(*) AS "value" '
        "FROM visits WHERE visit_date BETWEEN '2022-06-01T00:00:00Z' AND '2023-06-30T23:59:59.999Z' "
        "GROUP BY 1 ORDER BY 1",
        "SELECT floor(extract(epoch from visit_date)/86400)*86400, count(*) FROM visits "
        "WHERE patient_id IS NOT NULL AND visit_date BETWEEN '2022-06-01T00:00:00Z' AND '2023-06-30T23:59:59.999Z' "
        "GROUP BY 1",
    ),
    # a timestamp column, grouped by hour; fractional seconds in the data
    (
        'SELECT floor(extract(epoch from seen)/3600)*3600 AS "time", count(*) FROM patients '
        "WHERE seen BETWEEN '2020-01-01T00:00:00Z' AND '2021-12-31T00:00:00Z' GROUP BY 1",
        "SELECT floor(extract(epoch from seen)/3600)*3600, count(*) FROM patients "
        "WHERE patient_id IS NOT NULL AND seen BETWEEN '2020-01-01T00:00:00Z' AND '2021-12-31T00:00:00Z' GROUP BY 1",
    ),
    # a timestamptz column: $__timeEpoch, and date_trunc as the key
    (
        'SELECT extract(epoch from checked_in) as "time", count(*) FROM visits '
        "WHERE checked_in BETWEEN '2023-01-01T00:00:00Z' AND '2023-03-01T00:00:00Z' GROUP BY 1",
        "SELECT extract(epoch from checked_in), count(*) FROM visits WHERE "
        "checked_in BETWEEN '2023-01-01T00:00:00Z' AND '2023-03-01T00:00:00Z' GROUP BY 1",
    ),
    (
        "SELECT date_trunc('hour', seen) AS \"time\", count(*) FROM patients "
        "WHERE seen BETWEEN '2020-01-01T00:00:00Z' AND '2021-01-01T00:00:00Z' GROUP BY 1",
        "SELECT date_trunc('hour', seen), count(*) FROM patients WHERE "
        "seen BETWEEN '2020-01-01T00:00:00Z' AND '2021-01-01T00:00:00Z' GROUP BY 1",
    ),
    (
        "SELECT extract(epoch from birth) AS e, count(*) FROM patients "
        "WHERE birth BETWEEN '1950-01-01T00:00:00Z' AND '1960-01-01T00:00:00Z' GROUP BY 1",
        "SELECT extract(epoch from birth), count(*) FROM patients WHERE "
        "birth BETWEEN '1950-01-01T00:00:00Z' AND '1960-01-01T00:00:00Z' GROUP BY 1",
    ),
]


@pytest.mark.parametrize(("sql", "raw"), GRAFANA)
def test_grafana_time_series_mean_what_postgresql_means_on_both_backends(
    loaded: dict[str, Loaded], sql: str, raw: str
) -> None:
    expected = raw_counts(loaded["postgres"], raw)
    assert expected, "the case must select rows"
    for backend in BACKENDS:
        assert measured(loaded[backend], sql) == expected, backend


def test_extract_epoch_agrees_on_both_backends_at_the_ends_of_the_range(loaded: dict[str, Loaded]) -> None:
    """Stored values out of years 1–9999 (infinity, year 12000) are read as the ends of that range,
    on both backends alike; the epoch of those ends is exact on both."""
    sql = "SELECT extract(epoch from birth) AS e, floor(extract(epoch from seen)/60)*60 AS m, count(*) FROM patients GROUP BY 1, 2"
    answers = [measured(loaded[b], sql) for b in BACKENDS]
    assert answers[0] == answers[1]
    epochs = {key[0] for key in answers[0]}
    assert Decimal(-62135596800) in epochs or Decimal(253402214400) in epochs


# -- 7. Superset -----------------------------------------------------------------------------------

# Superset's PostgreSQL engine spec writes a time range's ends with convert_dttm
# (superset: superset/db_engine_specs/postgres.py): TO_DATE('…', 'YYYY-MM-DD') for a date column and
# TO_TIMESTAMP('…', 'YYYY-MM-DD HH24:MI:SS.US') for a timestamp.
SUPERSET = [
    (
        "SELECT DATE_TRUNC('month', birth) AS birth, COUNT(*) AS count FROM public.patients "
        "WHERE birth >= TO_DATE('1950-01-01', 'YYYY-MM-DD') AND birth < TO_DATE('1980-01-01', 'YYYY-MM-DD') "
        "GROUP BY DATE_TRUNC('month', birth) LIMIT 10000",
        "SELECT DATE_TRUNC('month', CAST(birth AS timestamp)), COUNT(*) FROM patients WHERE patient_id IS NOT NULL AND "
        "birth >= DATE '1950-01-01' AND birth < DATE '1980-01-01' GROUP BY 1",
    ),
    (
        "SELECT DATE_TRUNC('day', seen) AS seen, COUNT(*) AS count FROM public.patients "
        "WHERE seen >= TO_TIMESTAMP('2020-06-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US') "
        "AND seen < TO_TIMESTAMP('2021-06-01 12:30:00.500000', 'YYYY-MM-DD HH24:MI:SS.US') "
        "GROUP BY DATE_TRUNC('day', seen) LIMIT 10000",
        "SELECT DATE_TRUNC('day', seen), COUNT(*) FROM patients WHERE patient_id IS NOT NULL AND "
        "seen >= TIMESTAMPTZ '2020-06-01 00:00:00+00' AND seen < TIMESTAMPTZ '2021-06-01 12:30:00.5+00' GROUP BY 1",
    ),
]


@pytest.mark.parametrize(("sql", "raw"), SUPERSET)
def test_superset_time_ranges_are_folded_into_constants(
    loaded: dict[str, Loaded], sql: str, raw: str
) -> None:
    expected = raw_counts(loaded["postgres"], raw)
    assert expected
    for backend in BACKENDS:
        assert measured(loaded[backend], sql) == expected, backend


@pytest.mark.parametrize(
    ("sql", "sqlstate", "fragments"),
    [
        (
            "SELECT COUNT(*) FROM patients WHERE birth > TO_DATE('Jan 05 2020', 'Mon DD YYYY')",
            "0A000",
            ['the pattern "Mon" of to_date() is not supported (in "Mon DD YYYY")', "YYYY, MM, DD"],
        ),
        (
            "SELECT COUNT(*) FROM patients WHERE seen > TO_TIMESTAMP('05 PM', 'HH12 AM')",
            "0A000",
            ['the pattern "HH12" of to_timestamp()'],
        ),
        (
            "SELECT COUNT(*) FROM patients WHERE birth > TO_DATE('2020-13-01', 'YYYY-MM-DD')",
            "22008",
            ["out of range"],
        ),
        (
            "SELECT COUNT(*) FROM patients WHERE birth > TO_DATE('2020x01', 'YYYY-MM')",
            "22007",
            ["invalid value"],
        ),
        ("SELECT COUNT(*) FROM patients WHERE birth > '2020-02-30'", "22008", ["out of range", "type date"]),
        (
            "SELECT COUNT(*) FROM patients WHERE birth > 'yesterday'",
            "22007",
            ["invalid input syntax for type date"],
        ),
        ("SELECT COUNT(*) FROM patients WHERE birth > to_date(zip, 'YYYY')", "0A000", ["function to_date()"]),
    ],
)
def test_date_constants_postgresql_refuses_or_dpproxy_cannot_fold(
    sql: str, sqlstate: str, fragments: list[str]
) -> None:
    error = refused(sql)
    assert error.sqlstate == sqlstate, str(error)
    for fragment in fragments:
        assert fragment in str(error)
