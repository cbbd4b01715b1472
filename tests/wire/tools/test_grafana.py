"""Grafana's PostgreSQL data source against dpproxy, through psycopg in extended-protocol mode (as
Grafana's Go driver, pgx, sends every query: Parse, Bind, Describe, Execute).

The SQL is Grafana's, from grafana/grafana:
- public/app/plugins/datasource/grafana-postgresql-datasource/postgresMetaQuery.ts: the version
  and TimescaleDB checks, the schema, table and column lists of the query builder (verbatim, for
  schema "public" and table "patients"; the column list calls `parse_ident`);
- pkg/tsdb/grafana-postgresql-datasource/macros.go: the macros expanded as it expands them for a
  dashboard range of 2020-01-01 to 2023-12-31 (`$__timeFilter(c)` → `c BETWEEN '<RFC 3339>' AND
  '<RFC 3339>'`, `$__timeGroupAlias(c, '1d')` → `floor(extract(epoch from c)/86400)*86400 AS
  "time"`, `$__timeFrom()`/`$__timeTo()` → quoted RFC 3339 literals, `$__unixEpochFilter`).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.wire.test_clients import Served

from .replay import Result, assert_close, assert_refused, charged_epsilon, psycopg_connect, run_psycopg

FROM, TO = "2020-01-01T00:00:00Z", "2023-12-31T23:59:59.999Z"
DEPARTMENTS = {
    "cardiology", "dermatology", "emergency", "general", "neurology", "oncology", "orthopedics", "pediatrics",
}  # fmt: skip

SCHEMA_CONSTRAINT = """
          quote_ident(table_schema) IN (
          SELECT
            CASE WHEN trim(s[i]) = '"$user"' THEN user ELSE trim(s[i]) END
          FROM
            generate_series(
              array_lower(string_to_array(current_setting('search_path'),','),1),
              array_upper(string_to_array(current_setting('search_path'),','),1)
            ) as i,
            string_to_array(current_setting('search_path'),',') s
          )"""

SHOW_SCHEMAS = """SELECT schema_name AS "name"
    FROM information_schema.schemata
    WHERE schema_name NOT IN ('information_schema',
                              'pg_catalog',
                              'pg_toast',
                              '_timescaledb_cache',
                              '_timescaledb_catalog',
                              '_timescaledb_internal',
                              '_timescaledb_config',
                              'timescaledb_information',
                              'timescaledb_experimental')
    ORDER BY schema_name"""

SHOW_TABLES_IN_PUBLIC = """SELECT quote_ident(table_name) AS "table"
      FROM information_schema.tables
      WHERE quote_ident(table_schema) = 'public'
      ORDER BY 1"""

SHOW_TABLES = f"""SELECT
    CASE WHEN {SCHEMA_CONSTRAINT}
      THEN quote_ident(table_name)
      ELSE quote_ident(table_schema) || '.' || quote_ident(table_name)
    END AS "table"
    FROM information_schema.tables
    WHERE quote_ident(table_schema) NOT IN ('information_schema',
                             'pg_catalog',
                             '_timescaledb_cache',
                             '_timescaledb_catalog',
                             '_timescaledb_internal',
                             '_timescaledb_config',
                             'timescaledb_information',
                             'timescaledb_experimental')
    ORDER BY CASE WHEN {SCHEMA_CONSTRAINT} THEN 0 ELSE 1 END, 1"""

GET_COLUMNS = f"""SELECT quote_ident(column_name) AS "column", data_type AS "type"
    FROM information_schema.columns
    WHERE
      CASE WHEN array_length(parse_ident('patients'),1) = 2
        THEN quote_ident(table_schema) = (parse_ident('patients'))[1]
          AND quote_ident(table_name) = (parse_ident('patients'))[2]
        ELSE quote_ident(table_name) = 'patients'
          AND {SCHEMA_CONSTRAINT}
      END"""

QUERIES = {
    "version": "SELECT current_setting('server_version_num')::int/100 as version",
    "timescaledb": "SELECT extversion FROM pg_extension WHERE extname = 'timescaledb'",
    "schemas": SHOW_SCHEMAS,
    "tables_in_public": SHOW_TABLES_IN_PUBLIC,
    "tables": SHOW_TABLES,
    "columns": GET_COLUMNS,
    # SELECT $__timeGroupAlias(visit_date, '1d'), count(*) AS "visits" FROM visits
    # WHERE $__timeFilter(visit_date) GROUP BY 1 ORDER BY 1
    "time_group": (
        'SELECT floor(extract(epoch from visit_date)/86400)*86400 AS "time", count(*) AS "visits" FROM visits '
        f"WHERE visit_date BETWEEN '{FROM}' AND '{TO}' GROUP BY 1 ORDER BY 1"
    ),
    # SELECT date_trunc('year', visit_date) AS "time", department AS metric, count(*) AS value
    # FROM visits WHERE $__timeFilter(visit_date) GROUP BY 1, 2 ORDER BY 1
    # (years and a count: the test data's 3000 persons are too few for finer cells, or for the
    # thinner ε share of an average's partition selection, to be released every time; with these,
    # the busiest cells hold 300-400 persons against a threshold of 200 at Laplace scale 12, so
    # releasing none has odds far below 1e-9; 0 empty answers in 300 runs)
    "date_trunc_by_metric": (
        "SELECT date_trunc('year', visit_date) AS \"time\", department AS metric, count(*) AS value "
        f"FROM visits WHERE visit_date BETWEEN '{FROM}' AND '{TO}' GROUP BY 1, 2 ORDER BY 1"
    ),
    # SELECT $__time(enrolled), ... WHERE enrolled >= $__timeFrom() AND enrolled <= $__timeTo()
    "time_from_to": (
        f"SELECT count(*) AS \"patients\" FROM patients WHERE enrolled >= '{FROM}' AND enrolled <= '{TO}'"
    ),
    # A stat panel on a timestamp expression: $__timeFilter over a cast column.
    "timestamp_filter": (
        f"SELECT sum(cost) AS \"cost\" FROM visits WHERE visit_date::timestamp BETWEEN '{FROM}' AND '{TO}'"
    ),
    # A table panel's raw rows (refused): SELECT * FROM visits WHERE $__timeFilter(visit_date) LIMIT 50
    "raw_rows": f"SELECT * FROM visits WHERE visit_date BETWEEN '{FROM}' AND '{TO}' LIMIT 50",
}


@pytest.fixture
def grafana(served: Served) -> Iterator[dict[str, Result]]:
    if "grafana" not in served.cache:
        before = served.spent()
        with psycopg_connect(served, prepare_threshold=0) as conn:  # pgx prepares every statement
            assert isinstance(conn, psycopg.Connection)
            served.cache["grafana"] = {name: run_psycopg(conn, sql) for name, sql in QUERIES.items()}
        served.cache["grafana_spent"] = served.spent() - before
    yield served.cache["grafana"]


def test_grafana_metadata_queries(grafana: dict[str, Result]) -> None:
    assert grafana["version"].ok().rows == [("1500",)]
    assert grafana["timescaledb"].ok().rows == []
    assert grafana["schemas"].ok().column("name") == ["public"]
    assert grafana["tables_in_public"].ok().column("table") == ["patients", "visits", "zip_info"]
    assert grafana["tables"].ok().column("table") == ["patients", "visits", "zip_info"]


def test_grafana_query_builder_column_list_uses_parse_ident(grafana: dict[str, Result]) -> None:
    columns = grafana["columns"].ok()
    # The query has no ORDER BY (Grafana sorts the list itself), so only the set is compared.
    assert dict(zip(columns.column("column"), columns.column("type"), strict=True)) == {
        "patient_id": "integer", "age": "integer", "sex": "character varying", "income": "numeric",
        "zip": "character varying", "diagnosis": "character varying", "smoker": "boolean", "enrolled": "date",
    }  # fmt: skip


def test_grafana_time_filter_and_epoch_time_group(grafana: dict[str, Result]) -> None:
    series = grafana["time_group"].ok()
    assert series.names == ["time", "visits"]
    # Buckets are whole days in epoch seconds, inside the dashboard range.
    for time, visits in series.rows:
        assert float(time or 0) % 86400 == 0 and 1577836800 <= float(time or 0) <= 1704067199
        assert int(visits or 0) >= 0


def test_grafana_date_trunc_series_by_metric(grafana: dict[str, Result]) -> None:
    series = grafana["date_trunc_by_metric"].ok()
    assert series.names == ["time", "metric", "value"]
    assert set(series.column("metric")) <= DEPARTMENTS and series.rowcount > 0


def test_grafana_rfc3339_literals_compare_with_a_date_column(
    served: Served, grafana: dict[str, Result]
) -> None:
    count = grafana["time_from_to"].ok()
    truth = served.truth.count(
        lambda p: p.enrolled is not None and "2020-01-01" <= p.enrolled.isoformat() <= "2023-12-31"
    )
    assert_close(count.rows[0][0], truth, count, "patients")
    assert grafana["timestamp_filter"].ok().names == ["cost"]


def test_grafana_table_panel_raw_rows_are_refused(served: Served, grafana: dict[str, Result]) -> None:
    assert_refused(grafana["raw_rows"], "42501", "raw rows", "visits")
    metadata = ["version", "timescaledb", "schemas", "tables_in_public", "tables", "columns", "raw_rows"]
    assert all(charged_epsilon(grafana[name]) == 0 for name in metadata)
    assert served.cache["grafana_spent"] == pytest.approx(sum(charged_epsilon(r) for r in grafana.values()))
