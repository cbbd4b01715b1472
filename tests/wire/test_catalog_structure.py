"""Keys, foreign keys and indexes of the exposed tables, through the wire, as real PostgreSQL shows them.

The demo data (tests/conftest.py) declares patients(patient_id) PRIMARY KEY, visits(visit_id) PRIMARY
KEY with visits.patient_id REFERENCES patients, patients.zip REFERENCES zip_info; on PostgreSQL also
the index visits_patient_id. Each client query below is replayed, through the driver the tool uses,
against the proxy (DuckDB and PostgreSQL backends) and against the real PostgreSQL holding the same
tables, and the answers a user sees are compared. Statistics (reltuples, relpages) stay those of
empty tables: what dpproxy shows is structure, never data.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.wire.test_clients import ALICE, ALICE_PASSWORD, Served, duck_served, pg_served, truth  # noqa: F401 (fixtures)

EXPECTED = {
    e["id"]: e for e in json.loads((Path(__file__).parent / "catalog_queries" / "expected.json").read_text())
}
# The DuckDB demo has the keys but not PostgreSQL's extra index on visits(patient_id).
ONLY_ON_POSTGRES = "visits_patient_id"


@pytest.fixture(params=["duckdb", "postgres"])
def served(request: pytest.FixtureRequest) -> Served:
    """The demo served over each backend (test_clients.py's servers)."""
    return request.getfixturevalue("duck_served" if request.param == "duckdb" else "pg_served")


def _rows(dsn: str, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    """The rows of `sql`, whose parameters (if any) are written $1, $2 … as clients capture them."""
    if params:
        sql = re.sub(r"\$(\d+)", lambda m: "%s", sql.replace("%", "%%"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql, params or None).fetchall()


def _proxy(served: Served, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    return _rows(served.dsn(), sql, params)


def _expected(served: Served, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    if served.backend == "duckdb":
        return [r for r in rows if ONLY_ON_POSTGRES not in map(str, r)]
    return rows


def _psql(dsn_args: list[str], password: str | None, command: str) -> str:
    program = shutil.which("psql")
    if program is None:
        pytest.skip("psql was not found")
    assert program is not None
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PGSSLMODE": "disable", "LC_ALL": "C.UTF-8"}
    if password:
        env["PGPASSWORD"] = password
    result = subprocess.run(
        [program, *dsn_args, "-X", "-v", "ON_ERROR_STOP=1", "-c", command],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _footer(text: str) -> list[str]:
    """psql's \\d footer: Indexes, Foreign-key constraints, Referenced by."""
    lines = text.splitlines()
    start = next(
        (i for i, line in enumerate(lines) if line and not line.startswith(" ") and i > 3), len(lines)
    )
    return [line for line in lines[start:] if line.strip()]


@pytest.mark.parametrize("table", ["patients", "visits", "zip_info"])
def test_psql_describe_shows_keys_foreign_keys_and_references(
    served: Served, demo_pg_dsn: str, table: str
) -> None:
    proxy = _psql(
        ["-h", "127.0.0.1", "-p", str(served.port), "-U", ALICE, "-d", "demo"], ALICE_PASSWORD, f"\\d {table}"
    )
    real = _psql([demo_pg_dsn], None, f"\\d {table}")
    want = [
        line for line in _footer(real) if served.backend == "postgres" or f'"{ONLY_ON_POSTGRES}"' not in line
    ]
    assert _footer(proxy) == want
    # NOT NULL as PostgreSQL reports it for the key column.
    assert "| not null |" in proxy.splitlines()[3]


@pytest.mark.parametrize(
    "query",
    ["pgjdbc:pk:1", "pgjdbc:imported:2", "pgjdbc:exported:1", "pgjdbc:index:1"],
)
def test_pgjdbc_metadata_queries_answer_keys_like_postgresql(
    served: Served, demo_pg_dsn: str, query: str
) -> None:
    """The SQL pgjdbc's PgDatabaseMetaData (getPrimaryKeys, getImportedKeys, getExportedKeys,
    getIndexInfo; pgjdbc/src/main/java/org/postgresql/jdbc/PgDatabaseMetaData.java) sent, as captured
    in catalog_queries/captured.json."""
    entry = EXPECTED[query]
    names = [c["name"] if isinstance(c, dict) else c[0] for c in entry["columns"]]
    # Statistics of an index are data: the shadow's are an empty table's.
    keep = [
        i
        for i, n in enumerate(names)
        if n.lower() not in ("cardinality", "pages", "table_cat", "pktable_cat", "fktable_cat")
    ]
    got = sorted(tuple(r[i] for i in keep) for r in _proxy(served, entry["sql"]))
    want = sorted(tuple(r[i] for i in keep) for r in _expected(served, _rows(demo_pg_dsn, entry["sql"])))
    assert got == want
    assert got, "the demo tables have keys"
    if query == "pgjdbc:index:1":
        stats = [
            (r[names.index("cardinality")], r[names.index("pages")]) for r in _proxy(served, entry["sql"])
        ]
        assert all(c == 0 and p == 0 for c, p in stats), stats


def test_sqlalchemy_foreign_key_reflection_matches_postgresql(served: Served, demo_pg_dsn: str) -> None:
    """SQLAlchemy's Inspector.get_foreign_keys query (captured from SQLAlchemy 2's PG dialect)."""
    entry = EXPECTED["sqlalchemy:psycopg:12"]
    got = sorted(_proxy(served, entry["sql"], entry["params"]))
    want = sorted(_rows(demo_pg_dsn, entry["sql"], entry["params"]))
    assert got == want
    assert [r[1] for r in got] == ["visits_patient_id_fkey"]
    assert got[0][2] == "FOREIGN KEY (patient_id) REFERENCES patients(patient_id)"


# information_schema's constraint views: PostgreSQL shows them to the tables' owner (the cluster's
# superuser here); the shadow shows the exposed tables' keys to the analyst.
INFORMATION_SCHEMA = [
    "SELECT constraint_name, table_name, constraint_type, is_deferrable, initially_deferred "
    "FROM information_schema.table_constraints WHERE table_schema = 'public' AND constraint_type <> 'CHECK'",
    "SELECT constraint_name, table_name, column_name, ordinal_position, position_in_unique_constraint "
    "FROM information_schema.key_column_usage WHERE table_schema = 'public'",
    "SELECT constraint_name, unique_constraint_name, match_option, update_rule, delete_rule "
    "FROM information_schema.referential_constraints WHERE constraint_schema = 'public'",
    "SELECT table_name, column_name, constraint_name FROM information_schema.constraint_column_usage "
    "WHERE table_schema = 'public'",
    "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'",
    "SELECT c.relname, i.relname, x.indisunique, x.indisprimary, x.indkey::text, pg_get_indexdef(x.indexrelid, 1, true) "
    "FROM pg_index x JOIN pg_class c ON c.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid "
    "WHERE c.relnamespace = 'public'::regnamespace",
    "SELECT conname, contype, conrelid::regclass::text, confrelid::regclass::text, conkey, confkey, "
    "pg_get_constraintdef(oid, true) FROM pg_constraint WHERE connamespace = 'public'::regnamespace",
    "SELECT c.relname, a.attname, a.attnotnull FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
    "WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' AND a.attnum > 0",
]


@pytest.mark.parametrize("sql", INFORMATION_SCHEMA)
def test_constraint_catalogs_answer_like_postgresql(served: Served, demo_pg_dsn: str, sql: str) -> None:
    got = sorted(map(repr, _proxy(served, sql)))
    want = sorted(map(repr, _expected(served, _rows(demo_pg_dsn, sql))))
    assert got == want


def test_nothing_data_derived_in_index_rows(served: Served) -> None:
    rows = _proxy(
        served,
        "SELECT relname, reltuples, relpages, pg_relation_size(oid) FROM pg_class "
        "WHERE relnamespace = 'public'::regnamespace AND relkind = 'i'",
    )
    assert rows and all(r[1:] == (0.0, 0, 0) for r in rows), rows


def test_du_shows_the_analyst_as_an_ordinary_role(served: Served) -> None:
    rows = _proxy(
        served,
        "SELECT rolname, rolsuper, rolcreaterole, rolcreatedb, rolcanlogin, rolreplication, rolbypassrls "
        "FROM pg_roles WHERE rolname !~ '^pg_' ORDER BY 1",
    )
    assert rows == [
        (ALICE, False, False, False, True, False, False),
        ("dpproxy", False, False, False, False, False, False),
    ]


# --- pgcli and Grafana ------------------------------------------------------------------------------


def test_pgcli_list_commands_and_completion_queries(served: Served) -> None:
    """pgspecial/dbcommands.py (list_objects for \\dt \\dv \\di, list_databases for \\l) and
    pgcli/pgexecute.py (functions(), the completion loader), as pgcli sends them through psycopg."""
    dt = (
        "SELECT n.nspname as schema, c.relname as name, CASE c.relkind WHEN 'r' THEN 'table' WHEN 'v' "
        "THEN 'view' WHEN 'p' THEN 'partitioned table' WHEN 'm' THEN 'materialized view' WHEN 'i' THEN "
        "'index' WHEN 'S' THEN 'sequence' WHEN 's' THEN 'special' WHEN 'f' THEN 'foreign table' END as type, "
        "pg_catalog.pg_get_userbyid(c.relowner) as owner FROM pg_catalog.pg_class c "
        "LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind = ANY({}) AND n.nspname <> 'pg_catalog' AND n.nspname <> 'information_schema' "
        "AND n.nspname !~ '^pg_toast' AND pg_catalog.pg_table_is_visible(c.oid) ORDER BY 1, 2"
    )
    tables = _proxy(served, dt.format("'{r,p,\"\"}'"))
    assert [r[1:3] for r in tables] == [("patients", "table"), ("visits", "table"), ("zip_info", "table")]
    indexes = _proxy(served, dt.format("'{i,\"\"}'"))
    want = {"patients_pkey", "visits_pkey", "zip_info_pkey"} | (
        {ONLY_ON_POSTGRES} if served.backend == "postgres" else set()
    )
    assert {r[1] for r in indexes} == want
    databases = _proxy(
        served,
        "SELECT d.datname as name, pg_catalog.pg_get_userbyid(d.datdba) as owner, "
        "pg_catalog.pg_encoding_to_char(d.encoding) as encoding, d.datcollate as collate, d.datctype as ctype, "
        "pg_catalog.array_to_string(d.datacl, E'\\n') AS access_privileges FROM pg_catalog.pg_database d ORDER BY 1",
    )
    assert [r[:3] for r in databases] == [("demo", "dpproxy", "UTF8")]
    functions = _proxy(
        served,
        "SELECT n.nspname schema_name, p.proname func_name, p.proargnames, "
        "COALESCE(proallargtypes::regtype[], proargtypes::regtype[])::text[], p.proargmodes, "
        "prorettype::regtype::text return_type, p.prokind = 'a' is_aggregate, p.prokind = 'w' is_window, "
        "p.proretset is_set_returning, d.deptype = 'e' is_extension, pg_get_expr(proargdefaults, 0) AS arg_defaults "
        "FROM pg_catalog.pg_proc p INNER JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace "
        "LEFT JOIN pg_depend d ON d.objid = p.oid and d.deptype = 'e' "
        "WHERE p.prorettype::regtype != 'trigger'::regtype ORDER BY 1, 2",
    )
    by_name = {r[1]: r for r in functions}
    assert by_name["aclitemout"][3] == ["aclitem"]  # argument types by name, as PostgreSQL writes them
    assert by_name["aclitemout"][5] == "cstring"
    foreign_keys = _proxy(
        served,
        "SELECT s_p.nspname AS parentschema, t_p.relname AS parenttable, unnest((select array_agg(attname "
        "ORDER BY i) from (select unnest(confkey) as attnum, generate_subscripts(confkey, 1) as i) x "
        "JOIN pg_catalog.pg_attribute c USING(attnum) WHERE c.attrelid = fk.confrelid)) AS parentcolumn, "
        "s_c.nspname AS childschema, t_c.relname AS childtable, unnest((select array_agg(attname ORDER BY i) "
        "from (select unnest(conkey) as attnum, generate_subscripts(conkey, 1) as i) x "
        "JOIN pg_catalog.pg_attribute c USING(attnum) WHERE c.attrelid = fk.conrelid)) AS childcolumn "
        "FROM pg_catalog.pg_constraint fk JOIN pg_catalog.pg_class t_p ON t_p.oid = fk.confrelid "
        "JOIN pg_catalog.pg_namespace s_p ON s_p.oid = t_p.relnamespace "
        "JOIN pg_catalog.pg_class t_c ON t_c.oid = fk.conrelid "
        "JOIN pg_catalog.pg_namespace s_c ON s_c.oid = t_c.relnamespace WHERE fk.contype = 'f'",
    )
    assert sorted(foreign_keys) == [
        ("public", "patients", "patient_id", "public", "visits", "patient_id"),
        ("public", "zip_info", "zip", "public", "patients", "zip"),
    ]


@pytest.mark.parametrize("table", ["patients", "public.patients", '"public"."patients"'])
def test_grafana_query_builder_lists_columns_with_parse_ident(served: Served, table: str) -> None:
    """getSchema() of public/app/plugins/datasource/grafana-postgresql-datasource/postgresMetaQuery.ts."""
    literal = "'" + table.replace("'", "''") + "'"
    schema_constraint = (
        "quote_ident(table_schema) IN (SELECT CASE WHEN trim(s[i]) = '\"$user\"' THEN user ELSE trim(s[i]) END "
        "FROM generate_series(array_lower(string_to_array(current_setting('search_path'),','),1), "
        "array_upper(string_to_array(current_setting('search_path'),','),1)) as i, "
        "string_to_array(current_setting('search_path'),',') s)"
    )
    rows = _proxy(
        served,
        f'SELECT quote_ident(column_name) AS "column", data_type AS "type" FROM information_schema.columns '
        f"WHERE CASE WHEN array_length(parse_ident({literal}),1) = 2 "
        f"THEN quote_ident(table_schema) = (parse_ident({literal}))[1] "
        f"AND quote_ident(table_name) = (parse_ident({literal}))[2] "
        f"ELSE quote_ident(table_name) = {literal} AND {schema_constraint} END",
    )
    assert ("patient_id", "integer") in rows and ("diagnosis", "character varying") in rows
    assert len(rows) == 8


def test_parse_ident_answers_like_postgresql(served: Served, demo_pg_dsn: str) -> None:
    sql = "SELECT parse_ident('public.\"Some Table\"'), parse_ident('A.b'), (parse_ident('x.\"y\"\"z\"'))[2]"
    assert _proxy(served, sql) == _rows(demo_pg_dsn, sql)
