"""The catalog SQL that tools generating SQL send, through the wire, on both backends (issue 20, B6–B8).

- pg_dump --schema-only, the real one (PostgreSQL 15's client), runs to the end and prints the
  exposed tables' DDL: only exposed columns, their declared modifiers (numeric(12,2)), keys and
  indexes, no data. Since the August 2024 minor releases it first sends `SELECT set_config(name,
  'view, foreign-table', false) FROM pg_settings WHERE name = 'restrict_nonsystem_relation_kind'`
  (src/bin/pg_dump/pg_dump.c, setup_connection), then LOCK TABLE … IN ACCESS SHARE MODE per table
  and a prepared catalog query (getColumnACLs(pg_catalog.oid)).
- Django's and TypeORM's introspection queries, replayed as their sources write them.
- Type modifiers in the catalog and in RowDescription; syntax errors with their position.

The servers are test_clients.py's (the demo policy over the demo data on DuckDB and PostgreSQL).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.wire.test_clients import (  # noqa: F401 (fixtures)
    ALICE,
    ALICE_PASSWORD,
    SUBPROCESS_TIMEOUT,
    Served,
    _missing_tool,
    duck_served,
    pg_served,
    truth,
)

# What pg_dump prints for the demo's tables through dpproxy: the exposed columns with the types
# the backing database declares, NOT NULL, the keys. The owner is dpproxy's (the shadow's owner
# role), and the analyst is shown the SELECT the policy grants.
DEMO_DDL = [
    """CREATE TABLE public.patients (
    patient_id integer NOT NULL,
    age integer,
    sex character varying,
    income numeric(12,2),
    zip character varying,
    diagnosis character varying,
    smoker boolean,
    enrolled date
);""",
    "ALTER TABLE public.patients OWNER TO dpproxy;",
    """CREATE TABLE public.visits (
    visit_id bigint NOT NULL,
    patient_id integer,
    visit_date date,
    department character varying,
    cost numeric(10,2),
    duration_minutes integer
);""",
    "ALTER TABLE public.visits OWNER TO dpproxy;",
    """CREATE TABLE public.zip_info (
    zip character varying NOT NULL,
    city character varying,
    state character varying,
    population integer
);""",
    "ALTER TABLE public.zip_info OWNER TO dpproxy;",
    "ALTER TABLE ONLY public.patients\n    ADD CONSTRAINT patients_pkey PRIMARY KEY (patient_id);",
    "ALTER TABLE ONLY public.visits\n    ADD CONSTRAINT visits_pkey PRIMARY KEY (visit_id);",
    "ALTER TABLE ONLY public.zip_info\n    ADD CONSTRAINT zip_info_pkey PRIMARY KEY (zip);",
    "ALTER TABLE ONLY public.patients\n    ADD CONSTRAINT patients_zip_fkey FOREIGN KEY (zip) "
    "REFERENCES public.zip_info(zip);",
    "ALTER TABLE ONLY public.visits\n    ADD CONSTRAINT visits_patient_id_fkey FOREIGN KEY (patient_id) "
    "REFERENCES public.patients(patient_id);",
    "GRANT SELECT ON TABLE public.patients TO alice;",
    "GRANT SELECT ON TABLE public.visits TO alice;",
    "GRANT SELECT ON TABLE public.zip_info TO alice;",
]
# The PostgreSQL demo has one more index (tests/conftest.py), which pg_dump prints after the keys.
PG_ONLY_DDL = "CREATE INDEX visits_patient_id ON public.visits USING btree (patient_id);"


@pytest.fixture(params=["duckdb", "postgres"])
def served(request: pytest.FixtureRequest) -> Served:
    """The demo served over each backend (test_clients.py's servers)."""
    return request.getfixturevalue("duck_served" if request.param == "duckdb" else "pg_served")


def _client_env() -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PGPASSWORD": ALICE_PASSWORD,
        "PGSSLMODE": "disable",
        "PGCONNECT_TIMEOUT": "10",
        "LC_ALL": "C.UTF-8",
    }


def _statements(dump: str) -> list[str]:
    """pg_dump's script without comments, blank lines, SETs and its \\restrict guard: the DDL."""
    kept = [
        line
        for line in dump.splitlines()
        if line.strip() and not line.startswith(("--", "\\restrict", "\\unrestrict"))
    ]
    statements, current = [], []
    for line in kept:
        current.append(line)
        if line.endswith(";"):
            statements.append("\n".join(current))
            current = []
    return [s for s in statements if not s.startswith(("SET ", "SELECT pg_catalog.set_config"))]


def test_pg_dump_schema_only_prints_the_exposed_tables_ddl(served: Served) -> None:
    program = shutil.which("pg_dump")
    if program is None:
        _missing_tool("pg_dump was not found")
    assert program is not None
    command = [program, "--schema-only", "-h", "127.0.0.1", "-p", str(served.port), "-U", ALICE, "demo"]
    spent = served.spent()
    result = subprocess.run(
        command, capture_output=True, text=True, env=_client_env(), timeout=SUBPROCESS_TIMEOUT
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    statements = _statements(result.stdout)
    expected = list(DEMO_DDL)
    if served.backend == "postgres":
        expected.insert(expected.index(DEMO_DDL[9]), PG_ONLY_DDL)
    assert statements == expected
    # The header pg_dump writes from what it read: search_path as it set it, the server's encoding.
    assert "SELECT pg_catalog.set_config('search_path', '', false);" in result.stdout
    assert "SET client_encoding = 'UTF8';" in result.stdout
    assert served.spent() == spent  # the catalog is free


def test_pg_dump_statements_outside_a_dump(served: Served) -> None:
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        # LOCK TABLE: only in a transaction block, as in PostgreSQL; only ACCESS SHARE (it holds nothing).
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("LOCK TABLE public.patients IN ACCESS SHARE MODE")
        assert caught.value.sqlstate == "25P01"
        with conn.transaction():
            conn.execute("LOCK TABLE public.patients, ONLY visits IN ACCESS SHARE MODE")
        with pytest.raises(psycopg.Error) as caught, conn.transaction():
            conn.execute("LOCK patients")  # ACCESS EXCLUSIVE, PostgreSQL's default
        assert caught.value.sqlstate == "0A000" and "ACCESS EXCLUSIVE" in str(caught.value)
        # PREPARE with catalog parameter types, then EXECUTE (pg_dump's getColumnACLs).
        conn.execute(
            "PREPARE acls(pg_catalog.oid) AS SELECT at.attname FROM pg_catalog.pg_attribute at "
            "WHERE at.attrelid = $1 AND at.attnum > 0 ORDER BY at.attnum"
        )
        oid = conn.execute("SELECT 'patients'::regclass::oid").fetchone()[0]  # type: ignore[index]
        rows = conn.execute(f"EXECUTE acls('{oid}')").fetchall()
        assert [r[0] for r in rows][:3] == ["patient_id", "age", "sex"]


# --- Django and TypeORM introspection ---------------------------------------------------------------

# Django 5.2, django/db/backends/postgresql/introspection.py, DatabaseIntrospection.get_constraints:
# the indexes of a table, reading pg_index through unnest(indkey, indoption) WITH ORDINALITY.
DJANGO_INDEXES = """
            SELECT
                indexname,
                array_agg(attname ORDER BY arridx),
                indisunique,
                indisprimary,
                array_agg(ordering ORDER BY arridx),
                amname,
                exprdef,
                s2.attoptions
            FROM (
                SELECT
                    c2.relname as indexname, idx.*, attr.attname, am.amname,
                    CASE
                        WHEN idx.indexprs IS NOT NULL THEN
                            pg_get_indexdef(idx.indexrelid)
                    END AS exprdef,
                    CASE am.amname
                        WHEN %s THEN
                            CASE (option & 1)
                                WHEN 1 THEN 'DESC' ELSE 'ASC'
                            END
                    END as ordering,
                    c2.reloptions as attoptions
                FROM (
                    SELECT *
                    FROM
                        pg_index i,
                        unnest(i.indkey, i.indoption)
                            WITH ORDINALITY koi(key, option, arridx)
                ) idx
                LEFT JOIN pg_class c ON idx.indrelid = c.oid
                LEFT JOIN pg_class c2 ON idx.indexrelid = c2.oid
                LEFT JOIN pg_am am ON c2.relam = am.oid
                LEFT JOIN
                    pg_attribute attr ON attr.attrelid = c.oid AND attr.attnum = idx.key
                WHERE c.relname = %s AND pg_catalog.pg_table_is_visible(c.oid)
            ) s2
            GROUP BY indexname, indisunique, indisprimary, amname, exprdef, attoptions;
        """

# TypeORM 0.3, src/driver/postgres/PostgresQueryRunner.ts, loadTables: the columns of a table, each
# with its type as ('"' || udt_schema || '"."' || udt_name || '"')::regtype and format_type.
TYPEORM_COLUMNS = (
    "SELECT columns.*, pg_catalog.col_description(('\"' || table_catalog || '\".\"' || table_schema || "
    "'\".\"' || table_name || '\"')::regclass::oid, ordinal_position) AS description, "
    '(\'"\' || "udt_schema" || \'"."\' || "udt_name" || \'"\')::"regtype" AS "regtype", '
    'pg_catalog.format_type("col_attr"."atttypid", "col_attr"."atttypmod") AS "format_type" '
    'FROM "information_schema"."columns" LEFT JOIN "pg_catalog"."pg_attribute" AS "col_attr" '
    'ON "col_attr"."attname" = "columns"."column_name" AND "col_attr"."attrelid" = ( '
    'SELECT "cls"."oid" FROM "pg_catalog"."pg_class" AS "cls" LEFT JOIN "pg_catalog"."pg_namespace" AS "ns" '
    'ON "ns"."oid" = "cls"."relnamespace" WHERE "cls"."relname" = "columns"."table_name" '
    'AND "ns"."nspname" = "columns"."table_schema" ) '
    "WHERE (\"table_schema\" = 'public' AND \"table_name\" = 'patients') "
    "OR (\"table_schema\" = 'public' AND \"table_name\" = 'visits')"
)
# TypeORM 0.2's shorter form of the same query.
TYPEORM_02_COLUMNS = (
    'SELECT *, (\'"\' || "udt_schema" || \'"."\' || "udt_name" || \'"\')::"regtype" AS "regtype" '
    'FROM "information_schema"."columns" WHERE ("table_schema" = \'public\' AND "table_name" = \'visits\')'
)
ONLY_ON_POSTGRES = "visits_patient_id"


def _rows(dsn: str, sql: str, params: list[object] | None = None) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


@pytest.mark.parametrize("table", ["patients", "visits", "zip_info"])
def test_django_reads_indexes_through_unnest_with_ordinality(
    served: Served, demo_pg_dsn: str, table: str
) -> None:
    params: list[object] = ["btree", table]
    proxied = sorted(_rows(served.dsn(), DJANGO_INDEXES, params), key=str)
    expected = sorted(_rows(demo_pg_dsn, DJANGO_INDEXES, params), key=str)
    if served.backend == "duckdb":
        expected = [r for r in expected if r[0] != ONLY_ON_POSTGRES]
    assert proxied == expected
    assert proxied  # every demo table has its primary key


@pytest.mark.parametrize("sql", [TYPEORM_COLUMNS, TYPEORM_02_COLUMNS], ids=["typeorm-0.3", "typeorm-0.2"])
def test_typeorm_reads_column_types_as_regtype(served: Served, demo_pg_dsn: str, sql: str) -> None:
    def described(dsn: str) -> list[tuple[object, ...]]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            cursor = conn.execute(sql)
            names = [c.name for c in cursor.description or []]
            wanted = [
                "table_name",
                "column_name",
                "data_type",
                "udt_name",
                "character_maximum_length",
                "numeric_precision",
                "numeric_scale",
                "regtype",
                "format_type",
            ]
            at = [names.index(n) for n in wanted if n in names]
            return sorted(tuple(row[i] for i in at) for row in cursor.fetchall())

    proxied, expected = described(served.dsn()), described(demo_pg_dsn)
    assert proxied == expected
    # numeric(10,2) in the backing database: its precision and scale, as PostgreSQL reports them.
    assert any(r[:8] == ("visits", "cost", "numeric", "numeric", None, 10, 2, "numeric") for r in proxied)


def test_django_inspectdb_generates_the_public_tables_model(served: Served, tmp_path: Path) -> None:
    """The real `django-admin inspectdb`. Its catalog queries all work; for each table it also runs
    `SELECT * FROM "t" LIMIT 1` to read cursor.description, which for a protected table asks for a
    raw row and is refused (42501): those tables are reported, not generated (README, known limits)."""
    pytest.importorskip("django")
    (tmp_path / "dpsettings.py").write_text(
        "DATABASES = {'default': {'ENGINE': 'django.db.backends.postgresql', 'NAME': 'demo', "
        f"'USER': '{ALICE}', 'PASSWORD': '{ALICE_PASSWORD}', 'HOST': '127.0.0.1', 'PORT': {served.port}, "
        "'OPTIONS': {'sslmode': 'disable'}}}\nINSTALLED_APPS = []\nUSE_TZ = True\nSECRET_KEY = 'test'\n"
    )
    env = {**_client_env(), "PYTHONPATH": str(tmp_path)}
    command = [sys.executable, "-m", "django", "inspectdb", "--settings=dpsettings"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert "class ZipInfo(models.Model):\n    zip = models.CharField(primary_key=True)\n" in result.stdout
    assert "db_table = 'zip_info'" in result.stdout
    for table in ("patients", "visits"):
        assert f"# Unable to inspect table '{table}'" in result.stdout
        assert f'raw rows of the protected table "{table}"' in result.stdout


# --- syntax errors with their position ---------------------------------------------------------------

SYNTAX_ERRORS = [
    # (statement, position PostgreSQL's P field carries, the text psql underlines); the router reads the
    # first, the engine's parser the second, the shadow catalog's the third.
    ("selec 1", 1, "selec"),
    ("SELECT sex, COUNT(* FROM patients GROUP BY sex", 21, "FROM"),
    ("SELECT relname FROM pg_class WHERE relname = = 'x'", 46, "="),
]


@pytest.mark.parametrize(("sql", "position", "token"), SYNTAX_ERRORS)
def test_syntax_errors_carry_their_position(served: Served, sql: str, position: int, token: str) -> None:
    assert sql[position - 1 :].startswith(token)
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        for prepare in (False, True):  # simple query; Parse (extended protocol)
            with pytest.raises(psycopg.errors.SyntaxError) as caught:
                conn.execute(sql, prepare=prepare)
            assert caught.value.diag.statement_position == str(position)
            assert f'syntax error at or near "{token}"' in str(caught.value)
        # In a query string of several statements, counted from the string's start, as PostgreSQL does.
        with pytest.raises(psycopg.errors.SyntaxError) as caught:
            conn.execute(f"SELECT 1;\n  {sql}")
        assert caught.value.diag.statement_position == str(position + 12)


def test_psql_shows_the_line_and_a_caret(served: Served) -> None:
    program = shutil.which("psql")
    if program is None:
        _missing_tool("psql was not found")
    assert program is not None
    target = ["-h", "127.0.0.1", "-p", str(served.port), "-U", ALICE, "-d", "demo", "-X"]
    sql = "SELECT sex, COUNT(*\nFROM patients\nGROUP BY sex"
    result = subprocess.run(
        [program, *target, "-c", sql],
        capture_output=True,
        text=True,
        env=_client_env(),
        timeout=SUBPROCESS_TIMEOUT,
    )
    assert result.returncode == 1
    expected = 'ERROR:  syntax error at or near "FROM", expecting )\nLINE 2: FROM patients\n        ^'
    assert expected in result.stderr
