"""The shadow catalog answers clients' catalog queries as PostgreSQL 15 would, from structure alone.

The replayed queries are what real clients sent (tests/wire/catalog_queries/captured.json) and what a
real PostgreSQL 15 answered for a database holding the demo policy's tables, empty, owned by
`dpproxy` with SELECT granted to the analyst `alice` (expected.json; build_fixtures.py made it).
"""

from __future__ import annotations

import datetime
import decimal
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpproxy.engine import Engine, ExposedTable
from dpproxy.errors import DPProxyError
from dpproxy.sql.types import PgType
from dpproxy.wire.catalog import (
    DuckDBShadowCatalog,
    RegValue,
    SessionInfo,
    ShadowCatalog,
    open_catalog,
    parse_pg_array,
)
from dpproxy.wire.router import Kind, route

HERE = Path(__file__).parent / "catalog_queries"
EXPECTED = json.loads((HERE / "expected.json").read_text())

# The demo policy's tables as the shadow shows them (policy column types; zip_info's from the data).
DEMO_TABLES = (
    ExposedTable(
        "patients",
        (
            ("patient_id", PgType.INT4),
            ("age", PgType.INT4),
            ("sex", PgType.VARCHAR),
            ("income", PgType.NUMERIC),
            ("zip", PgType.VARCHAR),
            ("diagnosis", PgType.VARCHAR),
            ("smoker", PgType.BOOL),
            ("enrolled", PgType.DATE),
        ),
        False,
        "patient_id",
    ),
    ExposedTable(
        "visits",
        (
            ("visit_id", PgType.INT8),
            ("patient_id", PgType.INT4),
            ("visit_date", PgType.DATE),
            ("department", PgType.VARCHAR),
            ("cost", PgType.NUMERIC),
            ("duration_minutes", PgType.INT4),
        ),
        False,
        "patient_id",
    ),
    ExposedTable(
        "zip_info",
        (
            ("zip", PgType.VARCHAR),
            ("city", PgType.VARCHAR),
            ("state", PgType.VARCHAR),
            ("population", PgType.INT4),
        ),
        True,
        None,
    ),
)
EXPOSED_NAMES = tuple(t.name for t in DEMO_TABLES)
SESSION = SessionInfo(user="alice", database="demo", application_name="tests", backend_pid=4242)


@pytest.fixture(scope="module")
def catalog() -> Iterator[DuckDBShadowCatalog]:
    shadow = DuckDBShadowCatalog(DEMO_TABLES)
    yield shadow
    shadow.close()


def run(catalog: ShadowCatalog, sql: str, params: list[Any] | None = None, session: SessionInfo = SESSION):
    return catalog.execute(sql, params or [], session)


def values(catalog: ShadowCatalog, sql: str, params: list[Any] | None = None, session: SessionInfo = SESSION):
    return run(catalog, sql, params, session).rows


# --- replay of captured client queries ----------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """Where the shadow answers differently from the real server on purpose."""

    reason: str
    ignore_columns: tuple[str, ...] = ()
    rows: str = "compare"  # "compare" | "ignore" | "empty"
    only_rows: tuple[int, str] | None = None  # keep the expected rows whose column i equals this
    refused: str | None = None  # the SQLSTATE of a refusal where PostgreSQL answers


DIFFERENCES = {
    "psql:\\dt+:1": Difference("sizes are 0: a table's size is a statistic of its data", ("Size",)),
    "psql:\\d+:1": Difference("sizes are 0: a table's size is a statistic of its data", ("Size",)),
    "handwritten:functions:13": Difference(
        "sizes are 0: a table's size is a statistic of its data", ("pg_size_pretty", "pg_total_relation_size")
    ),
    "psql:select version():1": Difference("dpproxy's own version string (checked below)", ("version",)),
    "sqlalchemy:psycopg:1": Difference("dpproxy's own version string (checked below)", ("version",)),
    "psycopg:connect+queries:1": Difference("the session's backend pid", ("pg_backend_pid",)),
    "handwritten:functions:9": Difference("server_version_num is 150000 (15.0)", ("current_setting",)),
    "handwritten:pg_catalog:13": Difference("server_version_num is 150000 (15.0)", ("setting",)),
    "psql:\\l:1": Difference("only the session's database exists", only_rows=(0, "demo")),
    "handwritten:pg_catalog:3": Difference("only the session's database exists", only_rows=(0, "demo")),
    "handwritten:functions:8": Difference("template1 does not exist in the shadow", ("shobj_description",)),
    "pgjdbc:functions:1": Difference(
        "pg_proc holds only the functions the type catalog refers to", rows="ignore"
    ),
    "handwritten:pg_catalog:7": Difference("statistics views are empty", rows="empty"),
    "handwritten:pg_catalog:8": Difference("pg_statistic is empty rather than forbidden", rows="empty"),
    "handwritten:dbeaver:2": Difference(
        "no TOAST tables; no transaction ids", ("reltoastrelid", "relfrozenxid", "relminmxid")
    ),
    "handwritten:dbeaver:8": Difference(
        "no TOAST tables; no transaction ids", ("reltoastrelid", "relfrozenxid", "relminmxid")
    ),
    "handwritten:dbeaver:7": Difference("only the session's database exists", only_rows=(2, "demo")),
    "handwritten:dbeaver:9": Difference(
        "sizes are 0: a table's size is a statistic of its data", ("total_rel_size",)
    ),
    "handwritten:dbeaver:17": Difference("server_version_num is 150000 (15.0)", ("setting",)),
    "psql:\\du:1": Difference(
        "the owner of the exposed tables is an ordinary role that cannot log in, not a superuser",
        (
            "Attributes",
            "rolsuper",
            "rolcreaterole",
            "rolcreatedb",
            "rolcanlogin",
            "rolreplication",
            "rolbypassrls",
        ),
    ),
    "handwritten:functions:15": Difference(
        "txid_current() is refused: dpproxy assigns no transaction ids, and a made-up one would lie",
        refused="0A000",
    ),
}


def _symbols(catalog: DuckDBShadowCatalog) -> dict[str, int]:
    symbols = {"role": 16384, "database": 16385}
    for table in catalog.tables:
        symbols[table.name] = table.oid
        symbols[f"{table.name}.rowtype"] = table.rowtype_oid
        symbols[f"{table.name}.arraytype"] = table.arraytype_oid
    return symbols


def _substitute(text: str, symbols: dict[str, int]) -> str:
    return re.sub(r"\{oid:([\w.]+)\}", lambda m: str(symbols[m.group(1)]), text)


def _normalise(value: Any, type_oid: int, reverse: dict[int, str]) -> Any:
    """A value as expected.json writes it (OIDs of exposed objects as {oid:…} symbols)."""
    if value is None or isinstance(value, bool):
        return value
    if type_oid == 28:  # xid: psycopg reads it as text
        return str(value)
    if isinstance(value, int):
        return reverse.get(value, value)
    if isinstance(value, (list, tuple)):
        return [_normalise(v, 0, reverse) for v in value]
    if isinstance(value, decimal.Decimal):
        return {"decimal": str(value)}
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time, datetime.timedelta)):
        return {"time": str(value)}
    if isinstance(value, str) and re.fullmatch(r"\d{5}", value):
        return reverse.get(int(value), value)
    return value


def _catalog_entries() -> list[dict[str, Any]]:
    return [e for e in EXPECTED if route(e["sql"], EXPOSED_NAMES).kind is Kind.CATALOG]


@pytest.mark.parametrize("entry", _catalog_entries(), ids=lambda e: e["id"])
def test_captured_client_query_answers_like_postgresql(
    catalog: DuckDBShadowCatalog, entry: dict[str, Any]
) -> None:
    symbols = _symbols(catalog)
    reverse = {oid: f"{{oid:{name}}}" for name, oid in symbols.items()}
    sql = _substitute(entry["sql"], symbols)
    params = [None if p is None else _substitute(p, symbols) for p in entry["params"]]
    difference = DIFFERENCES.get(entry["id"], Difference(""))

    if difference.refused is not None:
        with pytest.raises(DPProxyError) as refused:
            run(catalog, sql, params)
        assert refused.value.sqlstate == difference.refused
        return
    if "error" in entry and difference.rows != "empty":
        with pytest.raises(DPProxyError) as caught:
            run(catalog, sql, params)
        assert caught.value.sqlstate == entry["error"]["sqlstate"]
        return

    result = run(catalog, sql, params)
    param_oids, described = catalog.describe(sql, [0] * len(params), SESSION)
    assert param_oids == [oid or 25 for oid in entry["param_oids"]], (
        "parameter types as PostgreSQL infers them"
    )

    if "columns" in entry:
        expected_columns = [
            (c["name"], c["type_oid"], c["type_size"], c["type_modifier"], c["table_oid"], c["column_number"])
            for c in entry["columns"]
        ]
        got = [
            (
                c.name,
                c.type_oid,
                c.type_size,
                c.type_modifier,
                reverse.get(c.table_oid, c.table_oid),
                c.column_number,
            )
            for c in result.columns
        ]
        expected_columns = [
            (*c[:4], reverse.get(c[4], c[4]) if isinstance(c[4], int) else c[4], c[5])
            for c in expected_columns
        ]
        assert got == expected_columns
    assert described == list(result.columns), "Describe reports what Execute returns"
    assert result.tag == f"SELECT {len(result.rows)}"

    if difference.rows == "empty":
        assert result.rows == []
        return
    if difference.rows == "ignore":
        return
    assert entry["row_count"] == len(entry["rows"]), "a truncated fixture's rows cannot be compared"
    names = [c.name for c in result.columns]
    keep = [i for i, n in enumerate(names) if n not in difference.ignore_columns]
    got_rows = [
        [_normalise(row[i], result.columns[i].type_oid, reverse) for i in keep] for row in result.rows
    ]
    want_rows = entry["rows"]
    if difference.only_rows is not None:
        column, value = difference.only_rows
        want_rows = [row for row in want_rows if row[column] == value]
    want_rows = [[row[i] for i in keep] for row in want_rows]
    if "order by" not in sql.lower():
        got_rows, want_rows = sorted(map(repr, got_rows)), sorted(map(repr, want_rows))
    assert got_rows == want_rows


def test_version_reports_postgresql_15_and_dpproxy(catalog: DuckDBShadowCatalog) -> None:
    ((version,),) = values(catalog, "SELECT version()")
    assert version.startswith("PostgreSQL 15.0 (dpproxy 0.1)")
    ((num,),) = values(catalog, "SELECT current_setting('server_version_num')")
    assert num == "150000"


# --- table-free functions -----------------------------------------------------------------------


def test_session_functions_answer_for_the_session(catalog: DuckDBShadowCatalog) -> None:
    bob = SessionInfo(
        user="bob",
        database="analytics",
        application_name="app",
        backend_pid=77,
        settings={"DateStyle": "ISO, DMY", "application_name": "app", "dpproxy.epsilon": "0.2"},
    )
    row = values(
        catalog,
        "SELECT current_user, session_user, user, current_database(), current_schema(), pg_backend_pid(), "
        "current_setting('datestyle'), current_setting('application_name'), current_setting('DPPROXY.EPSILON'), "
        "current_catalog, current_schemas(true), current_schemas(false)",
        session=bob,
    )
    assert row == [
        (
            "bob",
            "bob",
            "bob",
            "analytics",
            "public",
            77,
            "ISO, DMY",
            "app",
            "0.2",
            "analytics",
            ["pg_catalog", "public"],
            ["public"],
        )
    ]
    assert values(catalog, "SELECT current_user, current_database()") == [("alice", "demo")]
    # The session may hand over a live view of its settings: a change shows at the next query.
    live = {"application_name": "first"}
    session = SessionInfo(user="alice", database="demo", settings=MappingProxyType(live))
    assert values(catalog, "SELECT current_setting('application_name')", session=session) == [("first",)]
    live["application_name"] = "second"
    assert values(catalog, "SELECT current_setting('application_name')", session=session) == [("second",)]


def test_table_free_functions(catalog: DuckDBShadowCatalog) -> None:
    result = run(
        catalog,
        "SELECT format_type(23, NULL), format_type(1043, 68), format_type(1700, 655366), "
        "to_regtype('int4'), to_regtype('character varying'), to_regtype('nosuch'), to_regclass('patients'), "
        "to_regclass('secret_table'), 'visits'::regclass, pg_encoding_to_char(6), "
        "has_table_privilege('patients', 'SELECT'), has_table_privilege('patients', 'INSERT'), "
        "has_schema_privilege('public', 'USAGE'), has_schema_privilege('public', 'CREATE'), "
        "pg_table_is_visible('zip_info'::regclass), quote_ident('Zip'), 1 + 1, 'x' || 'y'",
    )
    assert result.rows == [
        (
            "integer",
            "character varying(64)",
            "numeric(10,2)",
            "integer",
            "character varying",
            None,
            "patients",
            None,
            "visits",
            "UTF8",
            True,
            False,
            True,
            False,
            True,
            '"Zip"',
            2,
            "xy",
        )
    ]
    assert [c.type_oid for c in result.columns] == [
        25,
        25,
        25,
        2206,
        2206,
        2206,
        2205,
        2205,
        2205,
        19,
        16,
        16,
        16,
        16,
        16,
        25,
        23,
        25,
    ]


def test_postgresql_semantics_duckdb_lacks(catalog: DuckDBShadowCatalog) -> None:
    result = run(
        catalog,
        "SELECT 7 / 2, -7 / 2, format('%I.%I %s %L', 'public', 'Zip Info', NULL, 'it''s'), "
        "ARRAY['a'] || NULL::text[], 'x' = ANY('{x,y}'::text[]), '1 2'::int2vector, "
        "(SELECT s[2] FROM string_to_array('a,b', ',') s), 'pg_catalog.int4in'::regproc, "
        "array_upper(current_schemas(true), 1)",
    )
    assert result.rows == [(3, -3, "public.\"Zip Info\"  'it''s'", ["a"], True, [1, 2], "b", "int4in", 2)]
    assert [c.type_oid for c in result.columns] == [23, 23, 25, 1009, 16, 22, 25, 24, 23]


def test_reg_values_are_names_that_carry_their_oid(catalog: DuckDBShadowCatalog) -> None:
    ((relation, type_, nothing, as_text),) = values(
        catalog, "SELECT 'visits'::regclass, 'int8'::regtype, 0::regclass, 'visits'::regclass::text"
    )
    assert (relation, type_, nothing, as_text) == ("visits", "bigint", "-", "visits")
    assert isinstance(relation, RegValue) and relation.oid == int(relation) == catalog.tables[1].oid
    assert isinstance(type_, RegValue) and type_.oid == 20
    assert not isinstance(as_text, RegValue)
    # They compare as OIDs inside queries, as in PostgreSQL.
    assert values(catalog, "SELECT relname FROM pg_class WHERE oid = 'zip_info'::regclass") == [("zip_info",)]


def test_a_runaway_catalog_query_is_cancelled() -> None:
    shadow = DuckDBShadowCatalog(DEMO_TABLES, statement_timeout_s=0.2)
    try:
        with pytest.raises(DPProxyError) as caught:
            shadow.execute("SELECT count(*) FROM generate_series(1, 10000000000)", [], SESSION)
        assert caught.value.sqlstate == "57014"
        assert shadow.execute("SELECT 1", [], SESSION).rows == [(1,)]  # the cursor is usable again
    finally:
        shadow.close()


def test_parameters_typed_by_context(catalog: DuckDBShadowCatalog) -> None:
    sql = "SELECT typname FROM pg_type WHERE oid = $1 AND typname LIKE $2 AND typnamespace = ANY($3)"
    oids, columns = catalog.describe(sql, [0, 0, 0], SESSION)
    assert oids == [26, 25, 1028]
    assert [(c.name, c.type_oid) for c in columns] == [("typname", 19)]
    # Values come as the client sent them: decoded (int, list) or as text.
    assert values(catalog, sql, [23, "int%", [11]]) == [("int4",)]
    assert values(catalog, sql, ["23", "int%", "{11,2200}"]) == [("int4",)]
    typed = "SELECT $1::int4 + 1, $2::date, $3::bool, $4::numeric, $5::int2vector"
    assert values(catalog, typed, [41, datetime.date(2024, 1, 2), True, decimal.Decimal("2.5"), [1, 2]]) == [
        (42, datetime.date(2024, 1, 2), True, decimal.Decimal("2.5"), [1, 2])
    ]
    assert values(catalog, typed, ["41", "2024-01-02", "t", "2.5", "1 2"]) == [
        (42, datetime.date(2024, 1, 2), True, decimal.Decimal("2.5"), [1, 2])
    ]
    assert catalog.describe("SELECT relname FROM pg_class LIMIT $1 OFFSET $2", [0, 0], SESSION)[0] == [20, 20]
    # A type the client declares wins over the inferred one.
    assert catalog.describe("SELECT $1", [23], SESSION)[0] == [23]
    assert catalog.describe("SELECT $1", [0], SESSION)[0] == [25]


def test_describe_runs_nothing(catalog: DuckDBShadowCatalog) -> None:
    # With NULL parameters this would fail if it ran (a JSON key cannot be NULL).
    oids, columns = catalog.describe(
        "SELECT json_build_object($1::text, 1) AS j, $2::int8 AS n", [0, 0], SESSION
    )
    assert oids == [25, 20]
    assert [(c.name, c.type_oid) for c in columns] == [("j", 114), ("n", 20)]


def test_unsupported_sql_gets_postgresql_errors_without_duckdb_internals(
    catalog: DuckDBShadowCatalog,
) -> None:
    cases = [
        ("SELECT no_such_function(1)", "42883"),
        ("SELECT * FROM pg_no_such_relation", "42P01"),
        ("SELECT * FROM secret_salaries", "42P01"),
        ("SELECT 'secret_salaries'::regclass", "42P01"),
        ("SELECT current_setting('no.such_setting')", "42704"),
        ("SELECT * FROM duckdb_settings()", "42883"),
        ("SELECT * FROM read_text('/etc/passwd')", "42883"),
        ("SELECT * FROM query('SELECT 1')", "42883"),
        ("SELECT nosuchcolumn FROM pg_class", "42703"),
    ]
    for sql, sqlstate in cases:
        with pytest.raises(DPProxyError) as caught:
            run(catalog, sql)
        assert caught.value.sqlstate == sqlstate, sql
        message = str(caught.value)
        assert "duckdb" not in message.lower() or "duckdb" in sql, sql
        assert not re.search(r"(Binder|Catalog|Parser|Conversion) Error|LINE 1", message), sql


@settings(max_examples=25, deadline=None)
@given(text=st.text(max_size=80))
def test_any_text_gives_rows_or_a_dpproxy_error(catalog: DuckDBShadowCatalog, text: str) -> None:
    try:
        result = catalog.execute(text, [], SESSION)
    except DPProxyError as exc:
        assert len(exc.sqlstate) == 5
    else:
        assert result.tag.startswith("SELECT")


# --- nothing outside the policy, no statistics, no rows ------------------------------------------


def test_only_the_exposed_tables_exist_outside_the_catalog_schemas(catalog: DuckDBShadowCatalog) -> None:
    assert values(
        catalog,
        "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1",
    ) == [("patients", "r"), ("visits", "r"), ("zip_info", "r")]
    assert values(
        catalog,
        "SELECT DISTINCT table_schema, table_name FROM information_schema.tables "
        "WHERE table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 2",
    ) == [("public", "patients"), ("public", "visits"), ("public", "zip_info")]
    columns = values(
        catalog,
        "SELECT table_name, column_name, data_type, ordinal_position, is_nullable FROM information_schema.columns "
        "WHERE table_schema = 'public' ORDER BY 1, 4",
    )
    assert columns[:3] == [
        ("patients", "patient_id", "integer", 1, "YES"),
        ("patients", "age", "integer", 2, "YES"),
        ("patients", "sex", "character varying", 3, "YES"),
    ]
    assert {c[0] for c in columns} == set(EXPOSED_NAMES)
    assert values(catalog, "SELECT nspname FROM pg_namespace ORDER BY 1") == [
        ("information_schema",),
        ("pg_catalog",),
        ("pg_toast",),
        ("public",),
    ]
    assert values(catalog, "SELECT datname FROM pg_database") == [("demo",)]
    roles = {r for (r,) in values(catalog, "SELECT rolname FROM pg_roles")}
    assert "alice" in roles and "bob" not in roles  # other analysts are not visible
    assert {r for r in roles if not r.startswith("pg_")} == {"alice", "dpproxy"}


def test_statistics_describe_nothing(catalog: DuckDBShadowCatalog) -> None:
    for view in (
        "pg_stats",
        "pg_statistic",
        "pg_stat_user_tables",
        "pg_stat_all_tables",
        "pg_statio_user_tables",
        "pg_stat_activity",
        "pg_stat_user_indexes",
        "pg_statistic_ext_data",
        "pg_stats_ext",
    ):
        assert values(catalog, f"SELECT * FROM pg_catalog.{view}") == [], view
    assert values(
        catalog,
        "SELECT DISTINCT reltuples, relpages, relallvisible FROM pg_class WHERE relnamespace = 2200",
    ) == [(-1.0, 0, 0)]
    assert values(
        catalog,
        "SELECT pg_table_size('patients'), pg_total_relation_size('visits'), pg_relation_size('zip_info')",
    ) == [(0, 0, 0)]


def test_the_shadow_tables_hold_no_rows(catalog: DuckDBShadowCatalog) -> None:
    cursor, state = catalog._cursors.checkout()  # the shadow database itself, not through the translation
    try:
        for name in EXPOSED_NAMES:
            assert cursor.execute(f'SELECT count(*) FROM public."{name}"').fetchone() == (0,)
        count = cursor.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'public'").fetchone()
        assert count == (len(EXPOSED_NAMES),)
    finally:
        catalog._cursors.checkin(cursor, state)


def test_open_catalog_shows_the_engine_policy(demo_duckdb: Path) -> None:
    engine = Engine.open("policies/demo.yaml", str(demo_duckdb))
    try:
        shadow = open_catalog(engine)
        try:
            rows = values(
                shadow,
                "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                "JOIN pg_class c ON c.oid = a.attrelid WHERE c.relnamespace = 'public'::regnamespace "
                "AND c.relkind = 'r' AND a.attnum > 0 ORDER BY c.relname, a.attnum",
            )
        finally:
            shadow.close()
    finally:
        engine.close()
    # The demo policy's tables and column types; zip_info's columns come from the data, and so do
    # the modifiers: the demo's DECIMAL(12,2) and DECIMAL(10,2) columns show as PostgreSQL's numeric(p,s).
    declared = {("patients", "income"): "numeric(12,2)", ("visits", "cost"): "numeric(10,2)"}
    expected = [
        (t.name, name, declared.get((t.name, name), str(pg_type)))
        for t in sorted(DEMO_TABLES, key=lambda t: t.name)
        for name, pg_type in t.columns
    ]
    assert rows == expected


# --- concurrency --------------------------------------------------------------------------------


def test_twenty_threads_each_see_their_own_session(catalog: DuckDBShadowCatalog) -> None:
    errors: list[BaseException] = []
    queries = [
        "SELECT current_user, current_database()",
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname OPERATOR(pg_catalog.~) '^(patients)$' COLLATE pg_catalog.default",
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1",
        "SELECT typname FROM pg_type WHERE oid = $1",
    ]

    def work(i: int) -> None:
        session = SessionInfo(user=f"analyst{i}", database=f"db{i}", backend_pid=i)
        try:
            for round_ in range(5):
                assert catalog.execute(queries[0], [], session).rows == [(f"analyst{i}", f"db{i}")]
                assert catalog.execute(queries[1], [], session).rows == [("public", "patients")]
                assert len(catalog.execute(queries[2], [], session).rows) == 3
                assert catalog.execute(queries[3], [23 + round_ % 2], session).rows in (
                    [("int4",)],
                    [("regproc",)],
                )
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


# --- helpers ------------------------------------------------------------------------------------


def test_parse_pg_array() -> None:
    assert parse_pg_array("{}") == []
    assert parse_pg_array("{1,2,NULL}") == ["1", "2", None]
    assert parse_pg_array('{"a,b","c\\"d", e }') == ["a,b", 'c"d', "e"]
    with pytest.raises(DPProxyError):
        parse_pg_array("1,2")


# --- the fixtures still describe PostgreSQL 15 ----------------------------------------------------


@pytest.mark.postgres
def test_fixture_columns_match_a_live_postgresql(pg_conn: psycopg.Connection) -> None:
    """Result columns and inferred parameter types of every replayed query, asked of a live server."""
    pg_conn.execute(
        "CREATE TABLE patients (patient_id integer, age integer, sex varchar, income numeric, zip varchar, "
        "diagnosis varchar, smoker boolean, enrolled date); "
        "CREATE TABLE visits (visit_id bigint, patient_id integer, visit_date date, department varchar, "
        "cost numeric, duration_minutes integer); "
        "CREATE TABLE zip_info (zip varchar, city varchar, state varchar, population integer)"
    )
    symbols = {"role": 1, "database": 1}
    for name in EXPOSED_NAMES:
        oid, rowtype = pg_conn.execute(
            "SELECT oid, reltype FROM pg_class WHERE relname = %s", [name]
        ).fetchone()
        symbols |= {name: oid, f"{name}.rowtype": rowtype, f"{name}.arraytype": 0}
    for entry in _catalog_entries():
        if "columns" not in entry:
            continue
        sql = _substitute(entry["sql"], symbols)
        prepared = pg_conn.pgconn.prepare(b"", sql.encode(), None)
        assert prepared.status == psycopg.pq.ExecStatus.COMMAND_OK, (entry["id"], prepared.error_message)
        described = pg_conn.pgconn.describe_prepared(b"")
        assert [described.param_type(i) for i in range(described.nparams)] == entry["param_oids"], entry["id"]
        assert [(described.fname(i).decode(), described.ftype(i)) for i in range(described.nfields)] == [
            (c["name"], c["type_oid"]) for c in entry["columns"]
        ], entry["id"]


# --- crashes and silent drops: functions that would act are refused, never pretended ----------------

REFUSED = [
    # (query, SQLSTATE, function named in the message, words of the hint)
    ("SELECT pg_sleep(1)", "0A000", "pg_sleep()", "client"),
    ("SELECT pg_catalog.pg_sleep_for('1 second')", "0A000", "pg_sleep_for()", "client"),
    ("SELECT random()", "0A000", "random()", "noise"),
    ('SELECT "RANDOM"() > 0.5 AS coin', "0A000", "random()", "noise"),
    ("SELECT setseed(0.5)", "0A000", "setseed()", "noise"),
    ("SELECT gen_random_uuid()", "0A000", "gen_random_uuid()", "client"),
    (
        "SELECT set_config('dpproxy.epsilon', '0.1', false) FROM pg_class LIMIT 1",
        "0A000",
        "set_config()",
        "SET",
    ),
    ("SELECT set_config('x', upper('y'), false)", "0A000", "set_config()", "SET dpproxy.epsilon"),
    ("SELECT pg_cancel_backend(pg_backend_pid())", "0A000", "pg_cancel_backend()", "cancel request"),
    ("SELECT pg_terminate_backend(4242)", "0A000", "pg_terminate_backend()", "close the connection"),
    ("SELECT txid_current()", "0A000", "txid_current()", "BEGIN"),
    ("SELECT pg_current_xact_id()", "0A000", "pg_current_xact_id()", "BEGIN"),
    ("SELECT nextval('patients_patient_id_seq')", "0A000", "nextval()", "SELECT"),
    ("SELECT pg_advisory_lock(1)", "0A000", "pg_advisory_lock()", "SELECT"),
    ("SELECT pg_try_advisory_xact_lock(1, 2)", "0A000", "pg_try_advisory_xact_lock()", "SELECT"),
    ("SELECT pg_notify('channel', 'x')", "0A000", "pg_notify()", "SELECT"),
    ("SELECT lo_import('/etc/passwd')", "0A000", "lo_import()", "SELECT"),
    ("SELECT current_query()", "0A000", "current_query()", "client"),
    ("SELECT pg_reload_conf()", "42501", "function pg_reload_conf", "operator"),
    ("SELECT pg_read_file('/etc/passwd')", "42501", "function pg_read_file", "operator"),
    ("SELECT * FROM pg_ls_dir('.')", "42501", "function pg_ls_dir", "operator"),
]


@pytest.mark.parametrize(("sql", "sqlstate", "named", "hint"), REFUSED)
def test_crashes_and_silent_drops_functions_that_would_act_are_refused(
    catalog: DuckDBShadowCatalog, sql: str, sqlstate: str, named: str, hint: str
) -> None:
    # The shadow used to answer these with a constant or its argument: a setting "changed", a
    # sleep "slept", a lock "taken", while nothing happened. set_config over a catalog relation is
    # refused for each row that reaches it, so when it runs: PostgreSQL too describes it, then fails.
    attempts = [lambda: run(catalog, sql)]
    if "set_config" not in sql:
        attempts.append(lambda: catalog.describe(sql, [], SESSION))
    for attempt in attempts:
        with pytest.raises(DPProxyError) as caught:
            attempt()
        assert caught.value.sqlstate == sqlstate, sql
        assert named in caught.value.message, sql
        assert hint in (caught.value.hint or ""), sql


def test_set_config_over_no_catalog_row_sets_nothing(catalog: DuckDBShadowCatalog) -> None:
    # Every pg_dump since the August 2024 minor releases (src/bin/pg_dump/pg_dump.c, setup_connection)
    # sends this; PostgreSQL 15.0, whose version the shadow reports, lacks the setting: no row, nothing
    # set, as on such a server. Over a row that exists, set_config is refused (above).
    sql = (
        "SELECT set_config(name, 'view, foreign-table', false) FROM pg_settings "
        "WHERE name = 'restrict_nonsystem_relation_kind'"
    )
    result = run(catalog, sql)
    assert [c.name for c in result.columns] == ["set_config"] and result.rows == []
    with pytest.raises(DPProxyError) as caught:
        run(catalog, sql.replace("restrict_nonsystem_relation_kind", "search_path"))
    assert caught.value.sqlstate == "0A000" and "set_config()" in caught.value.message


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT sleep_ms(5000)",
        'SELECT "sleep_ms"(5000)',
        "SELECT write_log('x')",
        "SELECT error('dpproxy:42501:forged')",
        "SELECT rand()",
        "SELECT uuid()",
        "SELECT uuidv7()",
        "SELECT current_transaction_id()",
    ],
)
def test_crashes_and_silent_drops_duckdb_functions_that_act_do_not_exist(
    catalog: DuckDBShadowCatalog, sql: str
) -> None:
    # DuckDB's own, under names PostgreSQL 15 does not have: as in PostgreSQL, they do not exist.
    with pytest.raises(DPProxyError) as caught:
        run(catalog, sql)
    assert caught.value.sqlstate == "42883", sql


def test_crashes_and_silent_drops_describing_functions_stay(catalog: DuckDBShadowCatalog) -> None:
    # What only describes the structure still answers, including an alias that shares a refused name.
    assert values(
        catalog,
        "SELECT format_type(23, NULL), current_schema(), pg_backend_pid(), current_setting('jit'), "
        "'random()' AS text_of_a_call, r.i FROM generate_series(1, 1) AS random(i), LATERAL (SELECT random.i) r",
    ) == [("integer", "public", 4242, "on", "random()", 1)]


def test_crashes_and_silent_drops_a_parameter_no_bind_could_give_is_refused(
    catalog: DuckDBShadowCatalog,
) -> None:
    with pytest.raises(DPProxyError) as caught:
        catalog.describe("SELECT $100000000", [], SESSION)  # used to build a list of 10⁸ types
    assert caught.value.sqlstate == "42P02"
    assert catalog.describe("SELECT '$100000000' AS price", [], SESSION)[0] == []  # text, not a parameter


def test_every_error_a_catalog_macro_raises_is_read_back_with_its_sqlstate() -> None:
    """The macros raise `dpproxy:SQLSTATE:message`; the shadow catalog reads each code back through
    errors.lookup as a class that takes the message (never one that writes its own)."""
    from dpproxy import errors

    data = Path(errors.__file__).parent / "wire" / "catalog" / "data"
    codes = {code for f in data.glob("*.sql") for code in re.findall(r"dpproxy:(\w{5}):", f.read_text())}
    assert codes  # the macros do raise some
    for code in codes:
        error = errors.lookup(code, errors.NotSupported)("the message")
        assert (error.sqlstate, error.message) == (code, "the message")
    # Codes whose classes write their own message are not read back: the default stands in.
    assert errors.lookup(errors.AdminShutdown.sqlstate, errors.NotSupported) is errors.NotSupported
    assert errors.lookup(errors.PolicyError.sqlstate, errors.NotSupported) is errors.NotSupported
