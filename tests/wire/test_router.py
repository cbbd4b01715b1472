"""The router: what a statement is, where it goes, and what is refused (docs/architecture.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpproxy.errors import DPProxyError
from dpproxy.wire.router import (
    CopyOptions,
    Kind,
    SettingCall,
    Statement,
    quote_identifier,
    route,
    split_statements,
)

EXPOSED = ("patients", "visits", "zip_info")
CAPTURED = Path(__file__).parent / "catalog_queries" / "captured.json"


def routed(sql: str) -> Statement:
    return route(sql, EXPOSED)


# --- session, transaction and cursor commands -----------------------------------------------------

# (sql, kind, tag, action, name, value, extra fields)
COMMANDS = [
    ("SET application_name = 'psql'", Kind.SESSION, "SET", "set", "application_name", "psql", {}),
    (
        "SET application_name TO 'PostgreSQL JDBC Driver'",
        Kind.SESSION,
        "SET",
        "set",
        "application_name",
        "PostgreSQL JDBC Driver",
        {},
    ),
    ("set extra_float_digits = 3", Kind.SESSION, "SET", "set", "extra_float_digits", "3", {}),
    ("SET extra_float_digits TO -1", Kind.SESSION, "SET", "set", "extra_float_digits", "-1", {}),
    ("SET dpproxy.epsilon = 0.2", Kind.SESSION, "SET", "set", "dpproxy.epsilon", "0.2", {}),
    ("SET DPProxy.Epsilon TO '0.25'", Kind.SESSION, "SET", "set", "dpproxy.epsilon", "0.25", {}),
    ('SET search_path TO public, "$user"', Kind.SESSION, "SET", "set", "search_path", 'public, "$user"', {}),
    ("SET search_path = '$user', Public", Kind.SESSION, "SET", "set", "search_path", '"$user", public', {}),
    ('SET search_path TO "MySchema"', Kind.SESSION, "SET", "set", "search_path", '"MySchema"', {}),
    ("SET SCHEMA 'public'", Kind.SESSION, "SET", "set", "search_path", "public", {}),
    ("SET TIME ZONE 'UTC'", Kind.SESSION, "SET", "set", "timezone", "UTC", {}),
    ("SET TIME ZONE LOCAL", Kind.SESSION, "SET", "set", "timezone", None, {}),
    ("SET timezone = 'Europe/Paris'", Kind.SESSION, "SET", "set", "timezone", "Europe/Paris", {}),
    ("SET DateStyle TO ISO, MDY", Kind.SESSION, "SET", "set", "datestyle", "iso, mdy", {}),
    ("SET NAMES 'UTF8'", Kind.SESSION, "SET", "set", "client_encoding", "UTF8", {}),
    (
        "SET LOCAL statement_timeout = 1000",
        Kind.SESSION,
        "SET",
        "set",
        "statement_timeout",
        "1000",
        {"local": True},
    ),
    ("SET SESSION statement_timeout TO DEFAULT", Kind.SESSION, "SET", "set", "statement_timeout", None, {}),
    (
        "SET standard_conforming_strings = on",
        Kind.SESSION,
        "SET",
        "set",
        "standard_conforming_strings",
        "on",
        {},
    ),
    ("SET bytea_output = true", Kind.SESSION, "SET", "set", "bytea_output", "true", {}),
    (
        "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        Kind.SESSION,
        "SET",
        "set",
        "transaction_isolation",
        "serializable",
        {"local": True},
    ),
    ("SET TRANSACTION READ ONLY", Kind.SESSION, "SET", "set", "transaction_read_only", "on", {"local": True}),
    (
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED",
        Kind.SESSION,
        "SET",
        "set",
        "default_transaction_isolation",
        "read committed",
        {},
    ),
    ("RESET ALL", Kind.SESSION, "RESET", "reset", "all", None, {}),
    ("RESET application_name", Kind.SESSION, "RESET", "reset", "application_name", None, {}),
    ("RESET TIME ZONE", Kind.SESSION, "RESET", "reset", "timezone", None, {}),
    ("RESET TRANSACTION ISOLATION LEVEL", Kind.SESSION, "RESET", "reset", "transaction_isolation", None, {}),
    ("RESET SESSION AUTHORIZATION", Kind.SESSION, "RESET", "reset", "session_authorization", None, {}),
    ("SHOW dpproxy.budget", Kind.SESSION, "SHOW", "show", "dpproxy.budget", None, {}),
    ("show transaction isolation level", Kind.SESSION, "SHOW", "show", "transaction_isolation", None, {}),
    ("SHOW TIME ZONE", Kind.SESSION, "SHOW", "show", "timezone", None, {}),
    ("SHOW ALL", Kind.SESSION, "SHOW", "show", "all", None, {}),
    (
        "SHOW standard_conforming_strings;",
        Kind.SESSION,
        "SHOW",
        "show",
        "standard_conforming_strings",
        None,
        {},
    ),
    ("DISCARD ALL", Kind.SESSION, "DISCARD ALL", "discard", "all", None, {}),
    ("DISCARD TEMPORARY", Kind.SESSION, "DISCARD TEMP", "discard", "temp", None, {}),
    ("DEALLOCATE s1", Kind.SESSION, "DEALLOCATE", "deallocate", "s1", None, {}),
    ('DEALLOCATE PREPARE "S_1"', Kind.SESSION, "DEALLOCATE", "deallocate", "S_1", None, {}),
    ("DEALLOCATE ALL", Kind.SESSION, "DEALLOCATE ALL", "deallocate", "all", None, {}),
    ("BEGIN", Kind.TRANSACTION, "BEGIN", "begin", None, None, {}),
    ("begin transaction", Kind.TRANSACTION, "BEGIN", "begin", None, None, {}),
    ("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY", Kind.TRANSACTION, "BEGIN", "begin", None, None, {}),
    ("START TRANSACTION READ ONLY", Kind.TRANSACTION, "START TRANSACTION", "begin", None, None, {}),
    ("COMMIT", Kind.TRANSACTION, "COMMIT", "commit", None, None, {}),
    ("END WORK", Kind.TRANSACTION, "COMMIT", "commit", None, None, {}),
    ("COMMIT AND NO CHAIN", Kind.TRANSACTION, "COMMIT", "commit", None, None, {}),
    ("ROLLBACK", Kind.TRANSACTION, "ROLLBACK", "rollback", None, None, {}),
    ("ABORT", Kind.TRANSACTION, "ROLLBACK", "rollback", None, None, {}),
    ('SAVEPOINT "_pg3_1"', Kind.TRANSACTION, "SAVEPOINT", "savepoint", "_pg3_1", None, {}),
    ("savepoint Sp1", Kind.TRANSACTION, "SAVEPOINT", "savepoint", "sp1", None, {}),
    ('RELEASE "_pg3_1"', Kind.TRANSACTION, "RELEASE", "release", "_pg3_1", None, {}),
    ("RELEASE SAVEPOINT sp1", Kind.TRANSACTION, "RELEASE", "release", "sp1", None, {}),
    ("ROLLBACK TO SAVEPOINT sp1", Kind.TRANSACTION, "ROLLBACK", "rollback_to", "sp1", None, {}),
    ("ROLLBACK TRANSACTION TO sp1", Kind.TRANSACTION, "ROLLBACK", "rollback_to", "sp1", None, {}),
    ("FETCH 100 FROM c1", Kind.CURSOR, "FETCH", "fetch", "c1", None, {"count": 100}),
    ('FETCH FORWARD 5 IN "C1"', Kind.CURSOR, "FETCH", "fetch", "C1", None, {"count": 5}),
    ("FETCH ALL c1", Kind.CURSOR, "FETCH", "fetch", "c1", None, {"count": None}),
    ("FETCH FORWARD ALL FROM c1", Kind.CURSOR, "FETCH", "fetch", "c1", None, {"count": None}),
    ("FETCH NEXT FROM c1", Kind.CURSOR, "FETCH", "fetch", "c1", None, {"count": 1}),
    ("FETCH c1", Kind.CURSOR, "FETCH", "fetch", "c1", None, {"count": 1}),
    ("MOVE 10 IN c1", Kind.CURSOR, "MOVE", "move", "c1", None, {"count": 10}),
    ("CLOSE c1", Kind.CURSOR, "CLOSE CURSOR", "close", "c1", None, {}),
    ("CLOSE ALL", Kind.CURSOR, "CLOSE CURSOR ALL", "close", "all", None, {}),
]


@pytest.mark.parametrize(("sql", "kind", "tag", "action", "name", "value", "extra"), COMMANDS)
def test_session_transaction_and_cursor_commands(
    sql: str, kind: Kind, tag: str, action: str, name: str | None, value: str | None, extra: dict
) -> None:
    statement = routed(sql)
    assert (statement.kind, statement.tag, statement.action, statement.name, statement.value) == (
        kind,
        tag,
        action,
        name,
        value,
    )
    for field, expected in extra.items():
        assert getattr(statement, field) == expected
    assert statement.sql == sql.rstrip(";")


def test_declare_cursor_routes_its_query() -> None:
    statement = routed("DECLARE c1 NO SCROLL CURSOR WITH HOLD FOR SELECT COUNT(*) FROM patients")
    assert (statement.kind, statement.tag, statement.action, statement.name, statement.hold) == (
        Kind.CURSOR,
        "DECLARE CURSOR",
        "declare",
        "c1",
        True,
    )
    assert statement.inner is not None
    assert statement.inner.kind is Kind.ENGINE
    assert statement.inner.sql == "SELECT COUNT(*) FROM patients"

    catalog = routed('DECLARE "Meta" CURSOR FOR SELECT relname FROM pg_catalog.pg_class')
    assert (catalog.name, catalog.hold, catalog.inner.kind) == ("Meta", False, Kind.CATALOG)


def test_explain_routes_its_query_to_the_engine() -> None:
    statement = routed("EXPLAIN SELECT AVG(age) FROM patients")
    assert (statement.kind, statement.tag) == (Kind.EXPLAIN, "EXPLAIN")
    assert statement.inner.kind is Kind.ENGINE
    assert statement.inner.sql == "SELECT AVG(age) FROM patients"
    assert routed("EXPLAIN (FORMAT TEXT, ANALYZE false) SELECT 1 FROM visits").inner.kind is Kind.ENGINE


# --- queries ------------------------------------------------------------------------------------

QUERIES = [
    ("SELECT COUNT(*) FROM patients", Kind.ENGINE),
    ("select count(*) from public.patients p join visits v using (patient_id)", Kind.ENGINE),
    ("WITH t AS (SELECT * FROM visits) SELECT COUNT(*) FROM t", Kind.ENGINE),
    ("(SELECT 1 FROM zip_info)", Kind.ENGINE),
    ("TABLE zip_info", Kind.ENGINE),
    ("SELECT * FROM secret_salaries", Kind.ENGINE),  # not exposed: the engine says so (42501)
    ("SELECT * FROM other.patients", Kind.ENGINE),
    ('SELECT * FROM "Patients"', Kind.ENGINE),
    ("SELECT version()", Kind.CATALOG),
    ("SELECT 1", Kind.CATALOG),
    ("VALUES (1, 'a')", Kind.CATALOG),
    ("select current_schema()", Kind.CATALOG),
    ("SELECT to_regtype('integer'), to_regclass('patients')", Kind.CATALOG),
    ("SELECT * FROM pg_catalog.pg_class", Kind.CATALOG),
    ("SELECT * FROM pg_type WHERE oid = $1", Kind.CATALOG),
    ('SELECT * FROM "pg_catalog"."pg_namespace"', Kind.CATALOG),
    ("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'", Kind.CATALOG),
    ("WITH patients AS (SELECT 1 AS x) SELECT x FROM patients", Kind.CATALOG),  # a CTE, not the table
    ("SELECT * FROM generate_series(1, 3) AS s(i)", Kind.CATALOG),
    # sqlglot cannot parse OPERATOR(…): found by the token scan.
    (
        "SELECT c.oid FROM pg_catalog.pg_class c WHERE c.relname OPERATOR(pg_catalog.~) '^(patients)$' "
        "COLLATE pg_catalog.default",
        Kind.CATALOG,
    ),
    ("SELECT 1 FROM patients WHERE zip OPERATOR(pg_catalog.~) '^1'", Kind.ENGINE),
    ("SELECT 'patients' AS name, E'a;b' AS e, $$FROM patients$$ AS d", Kind.CATALOG),
    ("SELECT x FROM pg_class -- FROM patients\n", Kind.CATALOG),
    ("SELECT x /* FROM patients */ FROM pg_class", Kind.CATALOG),
]


@pytest.mark.parametrize(("sql", "kind"), QUERIES)
def test_queries_go_to_the_engine_or_the_catalog(sql: str, kind: Kind) -> None:
    statement = routed(sql)
    assert (statement.kind, statement.tag) == (kind, "SELECT")


def test_empty_statements() -> None:
    for sql in ("", "   ", ";", "-- only a comment", "/* nested /* comment */ */"):
        assert routed(sql).kind is Kind.EMPTY


# --- COPY, PREPARE, EXECUTE ----------------------------------------------------------------------


def test_copy_routes_its_query_with_its_options() -> None:
    statement = routed(
        "COPY (SELECT sex, COUNT(*) FROM patients GROUP BY sex) TO STDOUT WITH (FORMAT csv, HEADER)"
    )
    assert (statement.kind, statement.tag) == (Kind.COPY, "COPY")
    assert statement.inner is not None and statement.inner.kind is Kind.ENGINE
    assert statement.inner.sql == "SELECT sex, COUNT(*) FROM patients GROUP BY sex"
    assert statement.copy == CopyOptions(format="csv", delimiter=",", null="", header=True)
    # psql's \copy passes the old option syntax on as written.
    old = routed("COPY  ( select 1 ) TO STDOUT csv header delimiter as ';' force quote *")
    assert old.copy == CopyOptions(format="csv", delimiter=";", null="", header=True, force_quote_all=True)
    assert old.inner is not None and old.inner.kind is Kind.CATALOG
    # The table form is SELECT of its columns, which the engine judges like any query.
    table = routed('COPY public.patients (age, "sex") TO STDOUT')
    assert table.inner is not None and table.inner.sql == "SELECT age, sex FROM public.patients"
    assert table.copy == CopyOptions()  # text: tab, \N, no header
    # Binary, in the three spellings PostgreSQL accepts; COPY BINARY is the table form's.
    for sql in ("COPY (SELECT 1) TO STDOUT (FORMAT 'binary')", "COPY (SELECT 1) TO STDOUT WITH BINARY"):
        assert routed(sql).copy == CopyOptions(format="binary")
    table = routed("COPY BINARY zip_info (zip) TO STDOUT")
    assert table.copy == CopyOptions(format="binary")
    assert table.inner is not None and table.inner.sql == "SELECT zip FROM zip_info"


def test_prepare_and_execute_route() -> None:
    prepare = routed("PREPARE by_age (integer, character varying(3), timestamp with time zone) AS SELECT 1")
    assert (prepare.kind, prepare.action, prepare.name) == (Kind.PREPARED, "prepare", "by_age")
    assert prepare.type_names == ("int4", "varchar", "timestamptz")
    assert prepare.inner is not None and prepare.inner.sql == "SELECT 1"
    execute = routed("EXECUTE by_age(-4.5, 'F', DATE '2024-01-01', NULL, TRUE, '7'::int, $1)")
    assert (execute.kind, execute.action, execute.name) == (Kind.PREPARED, "execute", "by_age")
    assert execute.arguments == ("-4.5", "F", "2024-01-01", None, "true", "7", 1)
    assert routed("EXECUTE q").arguments == ()


# --- rejections ---------------------------------------------------------------------------------

REJECTED = [
    ("INSERT INTO patients VALUES (1)", "42501", "read-only"),
    ("UPDATE patients SET age = 1", "42501", "read-only"),
    ("DELETE FROM visits", "42501", "read-only"),
    ("MERGE INTO patients p USING visits v ON true WHEN MATCHED THEN DELETE", "42501", "read-only"),
    ("CREATE TABLE t (x int)", "42501", "read-only"),
    ("DROP TABLE patients", "42501", "read-only"),
    ("ALTER TABLE patients ADD COLUMN x int", "42501", "read-only"),
    ("TRUNCATE visits", "42501", "read-only"),
    ("GRANT SELECT ON patients TO bob", "42501", "read-only"),
    ("COMMENT ON TABLE patients IS 'x'", "42501", "read-only"),
    ("WITH d AS (DELETE FROM visits RETURNING *) SELECT COUNT(*) FROM d", "42501", "read-only"),
    ("SELECT * INTO copy_of_patients FROM patients", "42501", "read-only"),
    ("COPY patients FROM STDIN", "42501", "read-only"),
    ("COPY (SELECT 1) TO '/tmp/out.csv'", "42501", "file"),
    ("COPY (SELECT 1) TO PROGRAM 'cat'", "42501", "program"),
    ("COPY (SELECT 1) TO STDOUT (FORMAT binary, HEADER)", "0A000", "HEADER in BINARY mode"),
    ("COPY (SELECT 1) TO STDOUT (FORMAT binary, DELIMITER ',')", "42601", "DELIMITER in BINARY mode"),
    ("COPY BINARY patients TO STDOUT (FORMAT binary)", "42601", "redundant"),
    ("COPY (SELECT 1) TO STDOUT (FORMAT xml)", "42601", "xml"),
    ("COPY (SELECT 1) TO STDOUT (FORCE_NULL (a))", "0A000", "COPY TO"),
    ("COPY (SELECT 1) TO STDOUT (DELIMITER ',,')", "22023", "one-byte"),
    ("COPY (SELECT 1) TO STDOUT (DELIMITER ',', DELIMITER ';')", "42601", "redundant"),
    ("COPY (SELECT 1) TO STDOUT (FORMAT csv, DELIMITER ',', QUOTE ',')", "22023", "different"),
    ("COPY (SHOW ALL) TO STDOUT", "42601", "query"),
    ("LISTEN channel", "0A000", "LISTEN"),
    ("NOTIFY channel", "0A000", "NOTIFY"),
    ("VACUUM patients", "0A000", "VACUUM"),
    ("ANALYZE patients", "0A000", "ANALYZE"),
    ("LOCK TABLE patients", "0A000", "LOCK"),
    ("PREPARE q (money) AS SELECT 1", "42704", "money"),
    ("PREPARE q AS SHOW ALL", "42601", "query"),
    ("PREPARE TRANSACTION 'x'", "0A000", "two-phase"),
    ("EXECUTE q(now())", "0A000", "constants"),
    ("CALL proc()", "0A000", "CALL"),
    ("DO $$ BEGIN END $$", "0A000", "DO"),
    ("SET ROLE admin", "0A000", "SET ROLE"),
    ("SET SESSION AUTHORIZATION admin", "0A000", "SET ROLE"),
    ("SELECT * FROM patients FOR UPDATE", "0A000", "FOR UPDATE"),
    ("SELECT relname, (SELECT COUNT(*) FROM patients) FROM pg_class", "0A000", "both"),
    ("EXPLAIN ANALYZE SELECT COUNT(*) FROM patients", "0A000", "ANALYZE"),
    ("EXPLAIN (ANALYZE) SELECT COUNT(*) FROM patients", "0A000", "ANALYZE"),
    ("EXPLAIN SELECT version()", "0A000", "exposed tables"),
    ("FETCH BACKWARD 1 FROM c1", "0A000", "forward"),
    ("FETCH PRIOR FROM c1", "0A000", "forward"),
    ("DECLARE c BINARY CURSOR FOR SELECT 1", "0A000", "BINARY"),
    ("COMMIT AND CHAIN", "0A000", "CHAIN"),
    ("COMMIT PREPARED 'x'", "0A000", "two-phase"),
    ("DECLARE c CURSOR FOR SHOW ALL", "42601", "query"),
    ("SELECT 'unterminated", "42601", "unterminated"),
    ("SELECT 1; SELECT 2", "42601", "multiple commands"),
    ("FROBNICATE patients", "42601", "FROBNICATE"),
    ("SET application_name", "42601", "syntax error"),
]


@pytest.mark.parametrize(("sql", "sqlstate", "fragment"), REJECTED)
def test_rejections_carry_a_sqlstate_and_say_why(sql: str, sqlstate: str, fragment: str) -> None:
    with pytest.raises(DPProxyError) as caught:
        routed(sql)
    assert caught.value.sqlstate == sqlstate
    assert fragment.lower() in str(caught.value).lower()


def test_write_rejections_say_what_is_allowed() -> None:
    with pytest.raises(DPProxyError) as caught:
        routed("DELETE FROM patients")
    assert caught.value.message == "dpproxy is read-only: DELETE is not allowed"
    assert "SELECT" in (caught.value.hint or "")


# --- splitting a simple query -------------------------------------------------------------------

SPLITS = [
    ("SELECT 1; SELECT 2;", ["SELECT 1", "SELECT 2"]),
    ("  SELECT 1  ;;  ; SELECT 2  ", ["SELECT 1", "SELECT 2"]),
    ("SELECT ';' AS a; SELECT 'it''s;' AS b", ["SELECT ';' AS a", "SELECT 'it''s;' AS b"]),
    ("SELECT E'\\';' AS a; SELECT 2", ["SELECT E'\\';' AS a", "SELECT 2"]),
    ("SELECT 'a\\'; SELECT 2", ["SELECT 'a\\'", "SELECT 2"]),  # standard_conforming_strings: \ is plain
    ('SELECT 1 AS ";"; SELECT 2 AS """;"""', ['SELECT 1 AS ";"', 'SELECT 2 AS """;"""']),
    ("SELECT $$;$$; SELECT $tag$ $$ ; $tag$", ["SELECT $$;$$", "SELECT $tag$ $$ ; $tag$"]),
    ("SELECT $1; SELECT $2", ["SELECT $1", "SELECT $2"]),
    # Comments do not split, and the ones around a statement are not part of it.
    ("SELECT 1 -- a comment; not a split\n; SELECT 2", ["SELECT 1", "SELECT 2"]),
    (
        "SELECT /* a ; /* nested ; */ still ; */ 1; SELECT 2",
        ["SELECT /* a ; /* nested ; */ still ; */ 1", "SELECT 2"],
    ),
    ("-- just a comment\n; /* and another */ ;", []),
    ("SELECT 'unterminated; SELECT 2", ["SELECT 'unterminated; SELECT 2"]),
    ("SELECT U&'\\0041;'; SELECT 2", ["SELECT U&'\\0041;'", "SELECT 2"]),
]


@pytest.mark.parametrize(("sql", "expected"), SPLITS)
def test_split_statements(sql: str, expected: list[str]) -> None:
    assert split_statements(sql) == expected


_PIECES = st.sampled_from(
    [
        "SELECT 1",
        "'a;b'",
        "'it''s'",
        "E'\\';'",
        '"x;y"',
        "$$;$$",
        "$q$ ; $q$",
        "-- c;\n",
        "/* ; */",
        "x",
        "$1",
    ]
)


@given(st.lists(st.lists(_PIECES, min_size=1, max_size=5).map(" ".join), min_size=1, max_size=5))
def test_splitting_joined_statements_gives_them_back(statements: list[str]) -> None:
    # A statement that is only a comment is dropped, as PostgreSQL treats it as empty.
    expected = [split_statements(s)[0] for s in statements if split_statements(s)]
    assert split_statements(";".join(statements)) == expected


@given(st.text(max_size=200))
def test_route_never_fails_with_anything_but_a_dpproxy_error(text: str) -> None:
    try:
        statement = route(text, EXPOSED)
    except DPProxyError as exc:
        assert exc.sqlstate and len(exc.sqlstate) == 5
    else:
        assert isinstance(statement.kind, Kind)


def test_quote_identifier() -> None:
    assert quote_identifier("public") == "public"
    assert quote_identifier("$user") == '"$user"'
    assert quote_identifier("MySchema") == '"MySchema"'
    assert quote_identifier("select") == '"select"'
    assert quote_identifier('a"b') == '"a""b"'


def test_every_captured_client_statement_routes() -> None:
    """What psql, psycopg, asyncpg, pg8000, SQLAlchemy, pgjdbc and node-postgres sent to PostgreSQL."""
    captured = json.loads(CAPTURED.read_text())
    kinds: dict[Kind, int] = {}
    for entry in captured:
        for sql in split_statements(entry["sql"]):
            statement = route(sql, EXPOSED)
            kinds[statement.kind] = kinds.get(statement.kind, 0) + 1
            if "pg_catalog." in sql or "information_schema." in sql:
                assert statement.kind is Kind.CATALOG, sql
    assert kinds[Kind.CATALOG] > 100
    assert {Kind.ENGINE, Kind.SESSION, Kind.TRANSACTION} <= set(kinds)


# --- crashes and silent drops: SELECT set_config(…) is SET as a function ---------------------------

SETTING_CALLS = [
    (
        "SELECT pg_catalog.set_config('search_path', '', false);",  # pg_dump
        [SettingCall("set_config", ("search_path", "", "false"), "set_config")],
    ),
    (
        "SELECT\n current_setting('jit') AS cur,\n set_config('jit', 'off', false) AS new",  # asyncpg
        [
            SettingCall("current_setting", ("jit",), "cur"),
            SettingCall("set_config", ("jit", "off", "false"), "new"),
        ],
    ),
    (
        "select set_config('app.tenant', $1, false)",
        [SettingCall("set_config", ("app.tenant", 1, "false"), "set_config")],
    ),
    (
        "SELECT set_config('dpproxy.epsilon', '0.1'::text, 'true'::bool) eps, set_config($1, $2, $3) \"Both\"",
        [
            SettingCall("set_config", ("dpproxy.epsilon", "0.1", "true"), "eps"),
            SettingCall("set_config", (1, 2, 3), "Both"),
        ],
    ),
    ("SELECT set_config('x', NULL, NULL)", [SettingCall("set_config", ("x", None, None), "set_config")]),
]


@pytest.mark.parametrize(("sql", "calls"), SETTING_CALLS)
def test_crashes_and_silent_drops_set_config_is_run_by_the_session(
    sql: str, calls: list[SettingCall]
) -> None:
    # The shadow catalog cannot change a session: answering set_config there changed nothing.
    statement = routed(sql)
    assert (statement.kind, statement.action, statement.tag) == (Kind.SESSION, "set_config", "SELECT")
    assert list(statement.calls) == calls


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        # Anything but constants and parameters, or anything else in the query: where the query goes,
        # which refuses set_config (the catalog by name, the engine by its allow-list).
        ("SELECT set_config('x', 'y', false) FROM pg_class", Kind.CATALOG),
        ("SELECT set_config('x', upper('y'), false)", Kind.CATALOG),
        ("SELECT set_config('x', 1, false)", Kind.CATALOG),  # no set_config(unknown, integer, …) either
        ("SELECT set_config('x', 'y', false), 1", Kind.CATALOG),
        ("SELECT set_config('x', 'y')", Kind.CATALOG),
        ("SELECT set_config('x', 'y', false) from", Kind.CATALOG),
        ("SELECT set_config('dpproxy.epsilon', '9', false) FROM patients", Kind.ENGINE),
        ("SELECT current_setting('jit')", Kind.CATALOG),  # reading: the catalog knows the settings
    ],
)
def test_crashes_and_silent_drops_other_uses_of_set_config_are_not_session_commands(
    sql: str, kind: Kind
) -> None:
    assert routed(sql).kind is kind


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM patients WHERE age > $100000000",  # the engine would size its types by it
        "SELECT $65536",
        "SELECT set_config('x', $99999999999999, false)",
    ],
)
def test_crashes_and_silent_drops_a_parameter_no_bind_could_give_is_refused(sql: str) -> None:
    # Describe sized parameter lists by the highest $n: one Parse could make the proxy build a list
    # of 10⁸ types. No Bind carries more than 65535 values (a 16-bit count).
    with pytest.raises(DPProxyError) as caught:
        routed(sql)
    assert caught.value.sqlstate == "42P02"
    assert "there is no parameter $" in caught.value.message
    assert routed("SELECT $65535").kind is Kind.CATALOG
    assert routed("SELECT '$100000000' AS price").kind is Kind.CATALOG  # text, not a parameter
