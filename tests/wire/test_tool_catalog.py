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
