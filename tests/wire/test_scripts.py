"""psql scripts and exports through the wire server: COPY … TO STDOUT (psycopg's copy, psql's \\copy),
SQL-level PREPARE/EXECUTE/DEALLOCATE shared with the extended protocol, the per-query NOTICE under
client_min_messages (psql -At with PGOPTIONS), budgets shown to meaningful digits, the served
database name (3D000), and COUNT(*)::int4 keeping its ± in the notice. On DuckDB and PostgreSQL.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

from tests.wire.proxy import ALICE, Proxy, notices_of, private_copy, running_proxy, write_policy
from tests.wire.raw import RawClient, bind, cstr, error_fields, msg, parse
from tests.wire.test_clients import PGJDBC_JAR, compile_with_pgjdbc

PSQL = shutil.which("psql")


@pytest.fixture(scope="module")
def duck_proxy(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("scripts-duck")
    backend = private_copy(demo_duckdb, tmp)
    with running_proxy(
        write_policy(tmp / "policy.yaml"), backend, tmp / "ledger.sqlite", database="demo"
    ) as p:
        yield p


@pytest.fixture(scope="module")
def pg_proxy(demo_pg_dsn: str, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("scripts-pg")
    policy = write_policy(tmp / "policy.yaml")
    with running_proxy(policy, demo_pg_dsn, tmp / "ledger.sqlite", database="demo") as p:
        yield p


@pytest.fixture(params=["duckdb", "postgres"])
def proxy(request: pytest.FixtureRequest) -> Proxy:
    return request.getfixturevalue("duck_proxy" if request.param == "duckdb" else "pg_proxy")


def psql(proxy: Proxy, *args: str, options: str | None = None) -> subprocess.CompletedProcess[str]:
    if PSQL is None:
        pytest.skip("psql is not installed")
    env = {**os.environ, "PGPASSWORD": "alice-demo", "PGSSLMODE": "disable", "PGCONNECT_TIMEOUT": "10"}
    env.pop("PGOPTIONS", None)
    if options is not None:
        env["PGOPTIONS"] = options
    dsn = f"host=127.0.0.1 port={proxy.port} user={ALICE} dbname=demo"
    return subprocess.run(
        [PSQL, "-X", "-v", "ON_ERROR_STOP=1", dsn, *args], capture_output=True, text=True, env=env, timeout=60
    )


# --- COPY … TO STDOUT ------------------------------------------------------------------------------


def test_copy_of_a_private_query_is_its_noisy_charged_answer_in_csv(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        notices = notices_of(conn)
        before = proxy.spent()
        cur = conn.cursor()
        sql = (
            "COPY (SELECT diagnosis, COUNT(*) AS n FROM patients GROUP BY diagnosis ORDER BY diagnosis) "
            "TO STDOUT WITH (FORMAT csv, HEADER)"
        )
        with cur.copy(sql) as copy:
            text = b"".join(bytes(block) for block in copy).decode()
        rows = list(csv.reader(io.StringIO(text)))
        assert rows[0] == ["diagnosis", "n"]
        assert [r[0] for r in rows[1:]] == ["asthma", "cold", "diabetes", "flu", "healthy", "hypertension"]
        assert sum(int(r[1]) for r in rows[1:]) == pytest.approx(3000, abs=200)
        assert cur.rowcount == 6  # from CommandComplete "COPY 6"
        # Charged once, as the SELECT would be, with the same notice.
        assert proxy.spent() == pytest.approx(before + 0.5)
        assert len(notices) == 1 and "spent ε=0.5" in notices[0] and "n ±" in notices[0]


def test_copy_text_format_escapes_as_postgresql_does(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        cur = conn.cursor()
        with cur.copy("COPY (SELECT zip, city FROM zip_info ORDER BY zip LIMIT 3) TO STDOUT") as copy:
            lines = b"".join(bytes(b) for b in copy).decode().splitlines()
        assert len(lines) == 3 and all(re.fullmatch(r"\d{5}\t\w+", line) for line in lines)
        # Tabs, newlines and backslashes escaped; NULL as \N; a custom delimiter and NULL string.
        with cur.copy(r"COPY (SELECT E'a\tb\nc\\d' AS t, NULL::text AS n, 2 AS i) TO STDOUT") as copy:
            assert b"".join(bytes(b) for b in copy) == b"a\\tb\\nc\\\\d\t\\N\t2\n"
        sql = "COPY (SELECT 'x|y' AS t, NULL::text AS n) TO STDOUT (DELIMITER '|', NULL 'none', HEADER)"
        with cur.copy(sql) as copy:
            assert b"".join(bytes(b) for b in copy) == b"t|n\nx\\|y|none\n"
        # CSV quotes what needs it, and FORCE_QUOTE quotes the columns named.
        sql = "COPY (SELECT 'a,b' AS t, 'say \"hi\"' AS q, '' AS e, NULL::text AS n, 1 AS i) TO STDOUT CSV"
        with cur.copy(sql) as copy:
            assert b"".join(bytes(b) for b in copy) == b'"a,b","say ""hi""","",,1\n'
        sql = "COPY (SELECT 'a' AS t, 1 AS i) TO STDOUT (FORMAT csv, FORCE_QUOTE *)"
        with cur.copy(sql) as copy:
            assert b"".join(bytes(b) for b in copy) == b'"a","1"\n'


def test_copy_in_the_extended_protocol(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        raw.send(
            parse("", "COPY (SELECT COUNT(*) AS n FROM visits) TO STDOUT (FORMAT csv, HEADER true)"),
            bind("", ""),
            msg("D", b"P" + cstr("")),
            msg("E", cstr("") + b"\x00\x00\x00\x00"),
            msg("S"),
        )
        messages = raw.read_until("Z")
        assert [kind for kind, _ in messages] == ["1", "2", "n", "N", "H", "d", "d", "c", "C", "Z"]
        header = messages[4][1]
        assert header == b"\x00\x00\x01\x00\x00"  # text, one column in text
        assert messages[5][1] == b"n\n" and re.fullmatch(rb"\d+\n", messages[6][1])
        assert messages[8][1] == b"COPY 1\x00"


@pytest.mark.parametrize(
    ("sql", "sqlstate", "hint"),
    [
        ("COPY patients TO STDOUT", "42501", "SELECT COUNT(*) FROM patients"),
        ("COPY patients (age) TO STDOUT WITH CSV", "42501", "aggregate"),
        ("COPY patients FROM STDIN", "42501", "COPY (SELECT …) TO STDOUT"),
        ("COPY (SELECT COUNT(*) FROM patients) TO '/tmp/out.csv'", "42501", "\\copy"),
        ("COPY (SELECT COUNT(*) FROM patients) TO PROGRAM 'cat'", "42501", "\\copy"),
        ("COPY (SELECT 1) TO STDOUT (FORMAT xml)", "42601", "FORMAT binary"),
        ("COPY (SELECT 1) TO STDOUT (FORMAT text, QUOTE '\"')", "0A000", "FORMAT csv"),
        ("COPY (SELECT 1) TO STDOUT (FREEZE)", "0A000", "FORMAT"),
        ("COPY (SELECT 1) TO STDOUT (COLOUR red)", "42601", "DELIMITER"),
    ],
)
def test_copy_refusals(duck_proxy: Proxy, sql: str, sqlstate: str, hint: str) -> None:
    with duck_proxy.connect(autocommit=True) as conn:
        before = duck_proxy.spent()
        with pytest.raises(psycopg.Error) as raised, conn.cursor().copy(sql) as copy:
            for _ in copy:
                pass
        assert raised.value.sqlstate == sqlstate
        assert hint in (raised.value.diag.message_hint or ""), raised.value.diag.message_hint
        assert duck_proxy.spent() == before


def test_psql_copy_to_a_file_and_to_stdout(proxy: Proxy, tmp_path: Path) -> None:
    target = tmp_path / "by_sex.csv"
    done = psql(
        proxy,
        "-c",
        f"\\copy (SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex ORDER BY sex) TO '{target}' CSV HEADER",
        "-c",
        "\\copy (SELECT zip, city FROM zip_info ORDER BY zip LIMIT 2) TO STDOUT WITH (FORMAT csv)",
    )
    assert done.returncode == 0, done.stderr
    rows = list(csv.reader(target.open()))
    assert rows[0] == ["sex", "n"] and [r[0] for r in rows[1:]] == ["F", "M", "X"]
    assert re.fullmatch(r"COPY 3\n\d{5},\w+\n\d{5},\w+\n", done.stdout), done.stdout
    assert "NOTICE:  dpproxy: this query spent ε=0.5" in done.stderr


# --- client_min_messages ------------------------------------------------------------------------------


def test_psql_scripts_silence_the_notice_with_client_min_messages(proxy: Proxy) -> None:
    query = "SELECT COUNT(*) FROM patients"
    loud = psql(proxy, "-At", "-c", query)
    assert loud.returncode == 0 and "NOTICE:  dpproxy: this query spent" in loud.stderr
    quiet = psql(proxy, "-At", "-c", query, options="-c client_min_messages=warning")
    assert quiet.returncode == 0 and quiet.stderr == "" and re.fullmatch(r"\d+\n", quiet.stdout)
    # SET works too, and errors still come through at the error level.
    mixed = psql(
        proxy,
        "-At",
        "-c",
        "SET client_min_messages = error",
        "-c",
        query,
        "-c",
        "SHOW client_min_messages",
        "-c",
        "SELECT patient_id FROM patients",
    )
    assert mixed.returncode != 0
    assert "NOTICE" not in mixed.stderr and "ERROR:" in mixed.stderr
    assert mixed.stdout.splitlines()[-1] == "error"


def test_client_min_messages_is_checked_and_applies_to_every_notice(duck_proxy: Proxy) -> None:
    with duck_proxy.connect(autocommit=True) as conn:
        notices = notices_of(conn)
        with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
            conn.execute("SET client_min_messages = loud")
        assert "warning" in (raised.value.diag.message_hint or "")
        conn.execute("SET client_min_messages = WARNING")
        assert conn.execute("SHOW client_min_messages").fetchone() == ("warning",)
        conn.execute("SELECT COUNT(*) FROM visits")
        assert notices == []
        conn.execute("COMMIT")  # WARNING 25P01 "there is no transaction in progress" still comes
        assert notices == ["there is no transaction in progress"]
        conn.execute("RESET client_min_messages")
        conn.execute("SELECT COUNT(*) FROM visits")
        assert len(notices) == 2 and "spent ε" in notices[1]


# --- PREPARE / EXECUTE / DEALLOCATE -------------------------------------------------------------------


def test_sql_prepare_execute_deallocate(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        cur = psycopg.ClientCursor(conn)
        notices = notices_of(conn)
        cur.execute(
            "PREPARE by_age (int, text) AS SELECT COUNT(*) AS n FROM patients WHERE age > $1 AND sex = $2"
        )
        assert cur.statusmessage == "PREPARE" and notices == []  # preparing runs and charges nothing
        before = proxy.spent()
        cur.execute("EXECUTE by_age(40, 'F')")
        assert [d.name for d in cur.description] == ["n"] and isinstance(cur.fetchone()[0], int)  # type: ignore[index,union-attr]
        assert cur.statusmessage == "SELECT 1" and proxy.spent() == pytest.approx(before + 0.5)
        assert len(notices) == 1 and "n ±" in notices[0]
        # Types come from the statement when PREPARE names none; public queries too.
        cur.execute("PREPARE zips AS SELECT zip FROM zip_info WHERE state = $1 ORDER BY zip LIMIT $2")
        cur.execute("EXECUTE zips('CA', 2)")
        assert len(cur.fetchall()) == 2
        with pytest.raises(psycopg.errors.DuplicatePreparedStatement):
            cur.execute("PREPARE zips AS SELECT 1")
        with pytest.raises(psycopg.errors.SyntaxError) as raised:
            cur.execute("EXECUTE zips('CA')")
        assert "wrong number of parameters" in str(raised.value)
        with pytest.raises(psycopg.errors.InvalidTextRepresentation):
            cur.execute("EXECUTE by_age('forty', 'F')")
        cur.execute("DEALLOCATE PREPARE zips")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            cur.execute("EXECUTE zips('CA', 2)")
        cur.execute("DEALLOCATE ALL")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            cur.execute("EXECUTE by_age(40, 'F')")
        with pytest.raises(psycopg.errors.UndefinedObject):
            cur.execute("PREPARE q (money) AS SELECT 1")


def test_sql_and_protocol_prepared_statements_are_one_namespace(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        # Parse'd by the protocol, EXECUTEd by SQL.
        raw.send(parse("by_sex", "SELECT COUNT(*) FROM patients WHERE sex = $1"), msg("S"))
        raw.read_until("Z")
        raw.send(msg("Q", cstr("EXECUTE by_sex('M')")))
        kinds = [kind for kind, _ in raw.read_until("Z")]
        assert kinds == ["N", "T", "D", "C", "Z"]
        # PREPAREd by SQL, bound and executed by the protocol.
        raw.send(msg("Q", cstr("PREPARE zips (text) AS SELECT zip FROM zip_info WHERE state = $1 LIMIT 2")))
        assert [kind for kind, _ in raw.read_until("Z")] == ["C", "Z"]
        raw.send(
            bind("", "zips", (b"CA",)),
            msg("D", b"P" + cstr("")),
            msg("E", cstr("") + b"\x00\x00\x00\x00"),
            msg("S"),
        )
        messages = raw.read_until("Z")
        assert [kind for kind, _ in messages] == ["2", "T", "D", "D", "C", "Z"]
        raw.send(parse("zips", "SELECT 1"), msg("S"))
        kind, body = raw.read_until("Z")[0]
        assert kind == "E" and error_fields(body)["C"] == "42P05"


# --- COUNT(*)::int4 and budgets -----------------------------------------------------------------------


def test_a_cast_aggregate_keeps_its_error_in_the_notice(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        notices = notices_of(conn)
        conn.execute("SELECT COUNT(*)::int4 AS n, CAST(AVG(age) AS integer) AS a FROM patients")
        assert re.search(r"95% error: n ±\d+, a ±\d", notices[0]), notices[0]


def test_budgets_show_meaningful_digits(duck_proxy: Proxy) -> None:
    with duck_proxy.connect(autocommit=True) as conn:
        notices = notices_of(conn)
        conn.execute("SET dpproxy.epsilon = 0.1")
        spent_before = duck_proxy.spent()
        for _ in range(3):  # 0.1 + 0.1 + 0.1 is 0.30000000000000004 in floats
            conn.execute("SELECT COUNT(*) FROM visits")
        spent, remaining, delta_spent, delta_remaining, _ = conn.execute("SHOW dpproxy.budget").fetchone()  # type: ignore[misc]
        for figure in (spent, remaining, delta_spent, delta_remaining):
            digits = re.sub(r"[^0-9]", "", figure.split("e")[0]).strip("0")
            assert len(digits) <= 6, figure
        assert float(spent) == pytest.approx(spent_before + 0.3) and float(spent) >= spent_before + 0.3 - 1e-9
        assert float(remaining) <= 1000 - float(spent) + 1e-9
        assert "spent ε=0.1;" in notices[-1]
        left = re.search(r"ε remaining ([0-9.]+) of", notices[-1])
        assert left and len(left[1].replace(".", "").strip("0")) <= 6


# --- the served database ------------------------------------------------------------------------------


def test_a_wrong_database_name_is_refused_like_postgresql(duck_proxy: Proxy) -> None:
    with pytest.raises(psycopg.OperationalError) as raised:
        psycopg.connect(duck_proxy.dsn(dbname="other"))
    assert 'database "other" does not exist' in str(raised.value)
    assert 'this server serves the database "demo"' in str(raised.value)
    with duck_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("demo",)
        assert conn.info.dbname == "demo"


# --- pgjdbc's CopyManager -----------------------------------------------------------------------------


def test_pgjdbc_copy_manager_exports_a_query(proxy: Proxy, tmp_path: Path) -> None:
    compile_with_pgjdbc(Path(__file__).parent / "clients" / "JdbcCopy.java", tmp_path)
    java = shutil.which("java")
    url = f"jdbc:postgresql://127.0.0.1:{proxy.port}/demo?sslmode=disable"

    def copy_out(sql: str) -> list[str]:
        done = subprocess.run(
            [java, "-cp", f"{tmp_path}{os.pathsep}{PGJDBC_JAR}", "JdbcCopy", url, ALICE, "alice-demo", sql],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    before = proxy.spent()
    lines = copy_out(
        "COPY (SELECT smoker, COUNT(*) AS n FROM patients GROUP BY smoker) TO STDOUT WITH CSV HEADER"
    )
    assert lines[0] == "smoker,n" and sorted(line.split(",")[0] for line in lines[1:3]) == ["f", "t"]
    assert lines[3] == "rows\t2" and proxy.spent() == pytest.approx(before + 0.5)
    (refused,) = copy_out("COPY patients TO STDOUT")
    assert refused.startswith(
        'error\t42501 ERROR: SELECT * would return raw rows of the protected table "patients"'
    )
    assert "Hint: ask for aggregates" in refused
