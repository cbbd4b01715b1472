"""Real PostgreSQL clients against the wire server, on both backends: psql, psycopg 3, asyncpg, pg8000,
SQLAlchemy 2, pgjdbc (tests/wire/clients/JdbcCheck.java) and node-postgres (tests/wire/clients/pg_check.js).

Each client logs in with SCRAM, reads the server version, runs a DP count, a parameterised DP query
(server-side parameters where the driver has them), lists tables and columns its own way, and has
`SELECT * FROM patients` refused with SQLSTATE 42501, read from wherever the driver exposes it. DP
answers are checked against the true value from the demo data, within ERROR_MULTIPLE times the ±
95% error the NOTICE states (a draw that far out has probability below 1e-6), so a parameter bound
wrongly or a value decoded wrongly shows, while the noise does not make the tests flaky.
Budgets are read from the engine: metadata, Describe and refused queries must cost nothing, a
private query or a cursor over one is charged once.

The server runs in this process (BackgroundServer) rather than as a `dpproxy serve` subprocess: it
starts in a fraction of the time (no second interpreter importing sqlglot, DuckDB and OpenDP), the
tests read the ledger through the engine, and `dpproxy serve` runs the very same Server (its
command line and SIGTERM handling are tested in test_serve_cli.py and test_sigterm.py). psql,
java and node are separate processes talking TCP either way. One server per backend per module.

psql, javac/java and pgjdbc come from Debian (scripts/test.sh installs them): missing, their tests
skip, or fail when CI is set. node-postgres is installed with npm into tests/wire/clients/node_modules
on first use; without node or npm, or when npm cannot install it, those tests skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import duckdb
import pg8000.dbapi
import pg8000.native
import psycopg
import pytest
import sqlalchemy
import yaml
from psycopg.types import TypeInfo
from sqlalchemy import (
    BOOLEAN,
    DATE,
    INTEGER,
    NUMERIC,
    VARCHAR,
    MetaData,
    Table,
    event,
    func,
    inspect,
    select,
    text,
)

from dpproxy.engine import Engine
from dpproxy.wire.server import BackgroundServer, ServerConfig

REPO = Path(__file__).resolve().parents[2]
CLIENTS = Path(__file__).resolve().parent / "clients"
DEMO_POLICY = REPO / "dpproxy" / "data" / "demo.yaml"
PGJDBC_JAR = Path("/usr/share/java/postgresql.jar")
ALICE, ALICE_PASSWORD = "alice", "alice-demo"
SERVER_VERSION = "15.0 (dpproxy 0.1)"
DEFAULT_EPSILON = 0.5  # the demo policy's per-query ε
ERROR_MULTIPLE = 5  # how many stated 95% errors a DP answer may be from the truth
SUBPROCESS_TIMEOUT = 120

PATIENT_COLUMNS = ["patient_id", "age", "sex", "income", "zip", "diagnosis", "smoker", "enrolled"]
# information_schema.columns.data_type of each, as PostgreSQL names the policy's types.
PATIENT_DATA_TYPES = [
    "integer",
    "integer",
    "character varying",
    "numeric",
    "character varying",
    "character varying",
    "boolean",
    "date",
]
EXPOSED_TABLES = ["patients", "visits", "zip_info"]


_APT_HINT = "postgresql-client-15 default-jdk-headless libpostgresql-jdbc-java"


def _missing_tool(reason: str) -> None:
    """Skip, or fail under CI, where scripts/test.sh installs the tool and the test must run."""
    message = f"{reason}; scripts/test.sh installs it (apt-get install {_APT_HINT})"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


# --- the truth, from the demo data ---------------------------------------------------------------


@dataclass(frozen=True)
class Patient:
    age: int
    sex: str
    income: Decimal | None
    smoker: bool | None
    enrolled: dt.date | None


@dataclass(frozen=True)
class Truth:
    """The demo data's patients and a few facts, to hold DP answers against."""

    patients: tuple[Patient, ...]
    departments: tuple[str, ...]
    zip_rows: int

    def count(self, where: Callable[[Patient], bool] = lambda _: True) -> int:
        return sum(1 for p in self.patients if where(p))

    def older(self, age: int, sex: str | None = None) -> int:
        """Patients with age > `age` (of sex `sex`)."""
        return self.count(lambda p: p.age > age and sex in (None, p.sex))

    def mean_income(self, where: Callable[[Patient], bool]) -> float:
        incomes = [p.income for p in self.patients if where(p) and p.income is not None]
        return float(sum(incomes)) / len(incomes)


def compute_truth(demo_duckdb: Path, directory: Path) -> Truth:
    copy = directory / "truth.duckdb"
    shutil.copyfile(demo_duckdb, copy)
    with duckdb.connect(str(copy), read_only=True) as conn:
        patients = tuple(
            Patient(*row)
            for row in conn.execute("SELECT age, sex, income, smoker, enrolled FROM patients").fetchall()
        )
        departments = tuple(
            r[0] for r in conn.execute("SELECT DISTINCT department FROM visits ORDER BY 1").fetchall()
        )
        (zip_rows,) = conn.execute("SELECT COUNT(*) FROM zip_info").fetchone()  # type: ignore[misc]
    return Truth(patients, departments, zip_rows)


# The typed filter JDBC, asyncpg and node-postgres bind (a date, a boolean and a numeric parameter).
# Its incomes are all below the policy's clipping bound (500,000), so the true mean is unclipped.
TYPED_SQL = (
    "SELECT COUNT(*) AS n, AVG(income) AS mean_income FROM patients "
    "WHERE enrolled >= {} AND smoker = {} AND income < {}"
)
TYPED_ENROLLED, TYPED_SMOKER, TYPED_INCOME = dt.date(2015, 1, 1), True, Decimal("80000.50")


def typed_filter(p: Patient) -> bool:
    return (
        p.enrolled is not None
        and p.enrolled >= TYPED_ENROLLED
        and p.smoker is TYPED_SMOKER
        and p.income is not None
        and p.income < TYPED_INCOME
    )


def error95(notice: str, column: str) -> float:
    """The ± 95% error dpproxy's NOTICE states for one released column ("…95% error: n ±6, …")."""
    match = re.search(rf"95% error: (?:.*, )?{re.escape(column)} ±([0-9.,e+-]+)", notice)
    assert match is not None, f"the NOTICE gives no error for {column!r}: {notice!r}"
    return float(match[1].replace(",", ""))


def assert_close(value: object, truth: float, notice: str, column: str) -> None:
    """`value` is a number (an int for a true int) within ERROR_MULTIPLE stated errors of `truth`."""
    assert isinstance(value, (int, Decimal, float)) and not isinstance(value, bool), (
        f"{value!r} is not a number"
    )
    assert isinstance(value, int) or not isinstance(truth, int), f"{value!r} is not an integer"
    bound = ERROR_MULTIPLE * error95(notice, column)
    assert abs(float(value) - truth) <= bound, f"{value} is more than {bound} from the true {truth}"


# --- the servers ----------------------------------------------------------------------------------


@dataclass
class Served:
    """A wire server over the demo data on one backend, with the truth about that data."""

    backend: str
    port: int
    engine: Engine
    truth: Truth
    cache: dict[str, Any] = field(default_factory=dict)  # one run of each external client

    def spent(self, analyst: str = ALICE) -> float:
        return self.engine.budget(analyst).spent.epsilon

    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user={ALICE} password={ALICE_PASSWORD} dbname=demo sslmode=disable"

    def url(self, driver: str) -> str:
        return f"postgresql+{driver}://{ALICE}:{ALICE_PASSWORD}@127.0.0.1:{self.port}/demo"


def write_policy(path: Path, adjust: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """The demo policy, with budgets large enough for every client's queries (and what `adjust`
    changes in its YAML document)."""
    policy = yaml.safe_load(DEMO_POLICY.read_text())
    for analyst in policy["analysts"].values():
        analyst.update({"epsilon": 1000.0, "delta": 0.01})
    # These tests count what each query is charged; free replay of repeats has tests of its own.
    policy["defaults"]["replay"] = False
    if adjust is not None:
        adjust(policy)
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path


@contextlib.contextmanager
def serving(
    backend: str,
    backend_name: str,
    directory: Path,
    truth: Truth,
    adjust: Callable[[dict[str, Any]], None] | None = None,
) -> Iterator[Served]:
    policy = write_policy(directory / "policy.yaml", adjust)
    engine = Engine.open(policy, backend, directory / "ledger.sqlite")
    server = BackgroundServer(engine, ServerConfig(port=0))
    server.start()
    try:
        yield Served(backend_name, server.port, engine, truth)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def truth(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory) -> Truth:
    return compute_truth(demo_duckdb, tmp_path_factory.mktemp("clients-truth"))


@pytest.fixture(scope="module")
def duck_served(
    demo_duckdb: Path, truth: Truth, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("clients-duck")
    # A copy: DuckDB refuses a second connection, with other settings, to a file this process
    # already holds (demo_pg_dsn reads the shared one).
    backend = directory / "demo.duckdb"
    shutil.copyfile(demo_duckdb, backend)
    with serving(str(backend), "duckdb", directory, truth) as served:
        yield served


@pytest.fixture(scope="module")
def pg_served(demo_pg_dsn: str, truth: Truth, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(demo_pg_dsn, "postgres", tmp_path_factory.mktemp("clients-pg"), truth) as served:
        yield served


@pytest.fixture(params=["duckdb", "postgres"])
def served(request: pytest.FixtureRequest) -> Served:
    return request.getfixturevalue("duck_served" if request.param == "duckdb" else "pg_served")


# --- psql ----------------------------------------------------------------------------------------------


def psql_as_alice(served: Served) -> tuple[str, list[str], dict[str, str]]:
    """Debian's psql, the arguments that connect it to `served` as alice, and its environment."""
    program = shutil.which("psql")
    if program is None:
        _missing_tool("psql was not found")
    assert program is not None
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PGPASSWORD": ALICE_PASSWORD,
        "PGSSLMODE": "disable",
        "PGCONNECT_TIMEOUT": "10",
        "LC_ALL": "C.UTF-8",
    }
    return program, ["-h", "127.0.0.1", "-p", str(served.port), "-U", ALICE, "-d", "demo"], env


def psql(
    served: Served, *commands: str, variables: tuple[str, ...] = (), stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Debian's psql running `commands` (each a -c), unaligned and tuples-only, stopping at the
    first error, with verbose errors (SQLSTATE shown). NOTICEs and errors go to stderr."""
    program, target, env = psql_as_alice(served)
    options = ["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose"]
    options += [arg for variable in variables for arg in ("-v", variable)]
    options += [arg for command in commands for arg in ("-c", command)]
    return subprocess.run(
        [program, *target, *options],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=SUBPROCESS_TIMEOUT,
    )


def notices_in(stderr: str) -> list[str]:
    return re.findall(r"^NOTICE:  (?:00000: )?(.*)$", stderr, re.MULTILINE)


def test_psql_reads_the_version_and_gets_a_dp_count(served: Served) -> None:
    before = served.spent()
    result = psql(
        served,
        "SHOW server_version",
        "SELECT version()",
        r"\echo :SERVER_VERSION_NUM",
        "SELECT COUNT(*) AS n FROM patients",
    )
    assert result.returncode == 0, result.stderr
    shown, version, version_num, count = result.stdout.splitlines()
    assert shown == SERVER_VERSION
    assert version.startswith("PostgreSQL 15.0 ")
    assert version_num == "150000"  # libpq reads the numeric prefix of server_version
    [notice] = notices_in(result.stderr)
    assert f"spent ε={DEFAULT_EPSILON}" in notice
    assert_close(int(count), served.truth.count(), notice, "n")
    assert served.spent() == pytest.approx(before + DEFAULT_EPSILON)


def test_psql_variables_parameterise_a_dp_query(served: Served) -> None:
    # psql 15 has no server-side parameters (\bind came in 16): its own are variables it
    # interpolates, quoted as literals with :'name'.
    script = "SELECT COUNT(*) AS n FROM patients WHERE age > :age AND sex = :'sex';\n"
    result = psql(served, variables=("age=45", "sex=M"), stdin=script)
    assert result.returncode == 0, result.stderr
    [notice] = notices_in(result.stderr)
    assert_close(int(result.stdout.strip()), served.truth.older(45, "M"), notice, "n")


def test_psql_lists_tables_and_describes_a_table(served: Served) -> None:
    before = served.spent()
    result = psql(served, r"\dt", r"\d patients")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:3] == [f"public|{t}|table|dpproxy" for t in EXPOSED_TABLES]
    described = [line.split("|") for line in lines[3:]]
    # \d prints format_type: with the backing column's type modifier (the demo's income is numeric(12,2)).
    shown = [
        "numeric(12,2)" if c == "income" else t
        for c, t in zip(PATIENT_COLUMNS, PATIENT_DATA_TYPES, strict=True)
    ]
    assert [(c[0], c[1]) for c in described] == list(zip(PATIENT_COLUMNS, shown, strict=True))
    assert served.spent() == before  # the catalog has no cost


# psql's describe commands beyond \dt and \d: each is a catalog query (or several) the shadow
# catalog must answer as PostgreSQL 15 would, for a database of the exposed tables only.
PSQL_META_COMMANDS = (
    r"\dt+", r"\d+ visits", r"\d zip_info", r"\di", r"\dv", r"\dm", r"\ds", r"\dE", r"\df", r"\dT",
    r"\dD", r"\dx", r"\dn+", r"\l+", r"\du", r"\dp", r"\dd", r"\dL", r"\dc", r"\dC", r"\dF", r"\do",
    r"\db", r"\dy", r"\dO", r"\dconfig", r"\dA", r"\conninfo",
)  # fmt: skip


def test_psql_describe_commands_all_answer(served: Served) -> None:
    before = served.spent()
    result = psql(served, *PSQL_META_COMMANDS)
    assert result.returncode == 0 and "ERROR" not in result.stderr, result.stderr
    lines = result.stdout.splitlines()
    assert "public|patients|table|dpproxy|permanent|heap|0 bytes|" in lines  # \dt+: empty tables
    assert any(line.startswith("plpgsql|dpproxy|t|") for line in lines)  # \dL
    # \dp: the analyst may read the exposed tables (an aclitem[] printed one item a line).
    at = lines.index("public|patients|table|dpproxy=arwdDxt/dpproxy")
    assert lines[at + 1] == f"{ALICE}=r/dpproxy||"
    assert served.spent() == before


def test_psql_raw_rows_are_refused_with_42501(served: Served) -> None:
    before = served.spent()
    result = psql(served, "SELECT * FROM patients")
    assert result.returncode == 1  # ON_ERROR_STOP: an error in -c
    assert result.stdout == ""
    assert re.search(
        r'^ERROR:  42501: SELECT \* would return raw rows of the protected table "patients"$',
        result.stderr,
        re.M,
    )
    assert served.spent() == before


# --- psycopg 3 (what test_psycopg_queries.py does not cover) -----------------------------------------------


def test_psycopg_binary_parameters_and_results_through_a_prepared_statement(served: Served) -> None:
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        assert conn.info.server_version == 150000
        sql = "SELECT COUNT(*) AS n FROM patients WHERE age > %b AND sex = %b"
        for age in (30, 60):  # prepare=True: a named statement, Parsed once, Bound twice
            cur = conn.execute(sql, [age, "F"], prepare=True, binary=True)
            assert cur.pgresult is not None and cur.pgresult.fformat(0) == 1  # binary
            assert [(d.name, d.type_code) for d in cur.description] == [("n", 20)]  # type: ignore[union-attr]
            (count,) = cur.fetchone()  # type: ignore[misc]
            assert_close(count, served.truth.older(age, "F"), notices[-1], "n")
        assert len(notices) == 2
        # Metadata with binary parameters and results: the catalog's side of the same path.
        cur = conn.cursor(binary=True)
        cur.execute(
            "SELECT column_name, data_type, ordinal_position FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
            ["public", "patients"],
            prepare=True,
        )
        assert cur.fetchall() == [
            (name, data_type, i + 1)
            for i, (name, data_type) in enumerate(zip(PATIENT_COLUMNS, PATIENT_DATA_TYPES, strict=True))
        ]
        assert len(notices) == 2


def test_psycopg_reads_reg_types_as_names_and_sends_them_as_text(served: Served) -> None:
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT 'patients'::regclass, 'int4'::regtype, c.oid::regclass, c.relnamespace::regnamespace "
            "FROM pg_class c WHERE c.relname = 'visits'"
        ).fetchone()
        assert row == ("patients", "integer", "visits", "public")
        # In binary a reg* value is its OID.
        oid = conn.execute("SELECT 'patients'::regclass::oid").fetchone()[0]  # type: ignore[index]
        raw = conn.cursor(binary=True).execute("SELECT 'patients'::regclass, 'int4'::regtype").fetchone()
        assert raw == (oid.to_bytes(4, "big"), (23).to_bytes(4, "big"))
        # A parameter PostgreSQL infers as regclass is a name in text: SQLAlchemy's Inspector sends these.
        sql = "SELECT CAST(%s AS REGCLASS)::oid, CAST(%s AS REGCLASS)"
        assert conn.execute(
            sql, ['"public"."patients"', "pg_catalog.pg_constraint"], prepare=True
        ).fetchone() == (
            oid,
            "pg_constraint",
        )
        info = TypeInfo.fetch(conn, "int4")  # psycopg's own catalog lookup: %s::regtype
        assert info is not None and (info.oid, info.array_oid, info.regtype) == (23, 1007, "integer")
        identifier = TypeInfo.fetch(conn, "information_schema.sql_identifier")
        assert identifier is not None and identifier.name == "sql_identifier" and identifier.array_oid > 0


def test_psycopg_reads_array_columns_as_postgresql_writes_them(served: Served) -> None:
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        (acl,) = conn.execute("SELECT relacl::text FROM pg_class WHERE relname = 'patients'").fetchone()  # type: ignore[misc]
        assert acl == f"{{dpproxy=arwdDxt/dpproxy,{ALICE}=r/dpproxy}}"  # aclitem[]: not Python's list repr
        with pytest.raises(psycopg.errors.UndefinedFunction):  # aclitem has no binary form
            conn.cursor(binary=True).execute("SELECT relacl FROM pg_class WHERE relname = 'patients'")


def test_client_encoding_names_postgresql_accepts_for_utf8(duck_served: Served) -> None:
    # As PostgreSQL: case and punctuation do not count, quotes included (asyncpg sends 'utf-8').
    for name in ("'utf-8'", "Unicode", "utf_8"):
        with psycopg.connect(duck_served.dsn(), options=f"-c client_encoding={name}") as conn:
            assert conn.info.parameter_status("client_encoding") == "UTF8"
            conn.execute("SET client_encoding = 'UTF-8'")
            assert conn.execute("SHOW client_encoding").fetchone() == ("UTF8",)
    with pytest.raises(psycopg.OperationalError, match='client_encoding "LATIN1" is not supported'):
        psycopg.connect(duck_served.dsn(), options="-c client_encoding=LATIN1")


# --- asyncpg ---------------------------------------------------------------------------------------------


async def _asyncpg_connect(served: Served) -> asyncpg.Connection:
    return await asyncpg.connect(
        host="127.0.0.1", port=served.port, user=ALICE, password=ALICE_PASSWORD, database="demo", ssl=False
    )


def test_asyncpg_connects_and_answers_in_binary(served: Served) -> None:
    async def session() -> None:
        conn = await _asyncpg_connect(served)  # sends client_encoding 'utf-8', quotes included
        try:
            assert tuple(conn.get_server_version())[:2] == (15, 0)
            assert conn.get_settings().server_version == SERVER_VERSION
            assert (await conn.fetchval("SELECT version()")).startswith("PostgreSQL 15.0 ")
            notices: list[str] = []
            conn.add_log_listener(lambda _conn, message: notices.append(message.message))
            before = served.spent()
            assert_close(
                await conn.fetchval("SELECT COUNT(*) AS n FROM patients"),
                served.truth.count(),
                notices[-1],
                "n",
            )
            # $n parameters, sent in binary with the types asyncpg learnt from Describe.
            rows = await conn.fetch(
                "SELECT sex, COUNT(*) AS n, AVG(income) AS mean_income FROM patients WHERE age > $1 "
                "GROUP BY sex ORDER BY sex",
                50,
            )
            assert [r["sex"] for r in rows] == ["F", "M", "X"]
            for r in rows:
                assert_close(r["n"], served.truth.older(50, r["sex"]), notices[-1], "n")
                # NULL only where the noisy count is below 1: rare for the ~24 patients of sex X over 50.
                assert r["mean_income"] is None or isinstance(r["mean_income"], Decimal)
            assert any(isinstance(r["mean_income"], Decimal) for r in rows)
            statement = await conn.prepare("SELECT COUNT(*) AS n FROM patients WHERE age > $1 AND sex = $2")
            assert [t.name for t in statement.get_parameters()] == ["int4", "varchar"]
            assert [(a.name, a.type.name) for a in statement.get_attributes()] == [("n", "int8")]
            for age in (25, 65):
                assert_close(
                    await statement.fetchval(age, "X"), served.truth.older(age, "X"), notices[-1], "n"
                )
            # A date, a boolean and a numeric parameter, in binary; numeric AVG back in binary.
            typed = await conn.fetchrow(
                TYPED_SQL.format("$1", "$2", "$3"), TYPED_ENROLLED, TYPED_SMOKER, TYPED_INCOME
            )
            assert typed is not None
            assert_close(typed["n"], served.truth.count(typed_filter), notices[-1], "n")
            assert isinstance(typed["mean_income"], Decimal)
            mean_income = served.truth.mean_income(typed_filter)
            assert_close(typed["mean_income"], mean_income, notices[-1], "mean_income")
            assert len(notices) == 5
            assert served.spent() == pytest.approx(before + 5 * DEFAULT_EPSILON)
        finally:
            await conn.close()

    asyncio.run(session())


def test_asyncpg_parameters_typed_by_their_function_and_arrays(served: Served) -> None:
    """asyncpg types each value from the ParameterDescription of a Describe sent before any value:
    PostgreSQL's signatures give substring's positions, round's digits and a percentile's fraction
    (they were described as text, so asyncpg refused the int, or the placeholder text was no
    position), a date_trunc unit is analysed with a unit, and `= ANY($1::text[])` is an array (a
    Python list), answered as an IN list."""

    async def session() -> None:
        conn = await _asyncpg_connect(served)
        try:
            prefixes = await conn.prepare(
                "SELECT substring(zip, $1, $2) AS p, COUNT(*) AS n FROM patients GROUP BY 1"
            )
            assert [t.name for t in prefixes.get_parameters()] == ["int4", "int4"]
            assert all(len(r["p"]) == 1 for r in await prefixes.fetch(1, 1))
            rounded = await conn.fetchval("SELECT round(AVG(income), $1) FROM patients", 1)
            assert isinstance(rounded, Decimal) and rounded == round(rounded, 1)
            median = await conn.prepare(
                "SELECT percentile_cont($1) WITHIN GROUP (ORDER BY age) FROM patients"
            )
            assert [t.name for t in median.get_parameters()] == ["float8"]
            assert 0 <= await median.fetchval(0.5) <= 120
            years = await conn.fetch(
                "SELECT date_trunc($1, visit_date) AS y, COUNT(*) FROM visits GROUP BY 1", "year"
            )
            assert years and all((r["y"].month, r["y"].day) == (1, 1) for r in years)
            chosen = await conn.prepare(
                "SELECT diagnosis, COUNT(*) AS n FROM patients WHERE diagnosis = ANY($1::text[]) GROUP BY 1"
            )
            assert [t.name for t in chosen.get_parameters()] == ["text[]"]
            rows = await chosen.fetch(["flu", "cold"])
            assert sorted(r["diagnosis"] for r in rows) == ["cold", "flu"]  # named keys: both shown
        finally:
            await conn.close()

    asyncio.run(session())


def test_asyncpg_lists_columns_and_gets_42501(served: Served) -> None:
    async def session() -> None:
        conn = await _asyncpg_connect(served)
        try:
            before = served.spent()
            statement = await conn.prepare(
                "SELECT c.relname, a.attname, a.atttypid::regtype AS type FROM pg_catalog.pg_attribute a "
                "JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "
                "WHERE c.relname = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"
            )
            rows = await statement.fetch("patients")
            assert [r["attname"] for r in rows] == PATIENT_COLUMNS
            assert [r["type"] for r in rows] == PATIENT_DATA_TYPES
            tables = await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1",
                "public",
            )
            assert [r["table_name"] for r in tables] == EXPOSED_TABLES
            with pytest.raises(asyncpg.InsufficientPrivilegeError) as caught:
                await conn.fetch("SELECT * FROM patients")
            assert caught.value.sqlstate == "42501"
            with pytest.raises(asyncpg.InsufficientPrivilegeError):  # extended protocol, with a parameter
                await conn.fetch("SELECT patient_id, income FROM patients WHERE age > $1", 90)
            assert served.spent() == before
        finally:
            await conn.close()

    asyncio.run(session())


def test_asyncpg_cursor_reads_a_private_result_in_pages_charged_once(served: Served) -> None:
    async def session() -> None:
        conn = await _asyncpg_connect(served)
        try:
            before = served.spent()
            sql = "SELECT department, COUNT(*) AS n FROM visits WHERE cost >= $1 GROUP BY department ORDER BY department"
            async with conn.transaction():
                # A portal Executed 3 rows at a time (PortalSuspended in between).
                rows = [r async for r in conn.cursor(sql, 0, prefetch=3)]
                cursor = await conn.cursor(sql, 0)
                first, rest = await cursor.fetch(5), await cursor.fetch(10)
            assert [r["department"] for r in rows] == list(served.truth.departments)
            assert [r["department"] for r in first + rest] == list(served.truth.departments)
            assert (len(first), len(rest)) == (5, len(served.truth.departments) - 5)
            assert served.spent() == pytest.approx(before + 2 * DEFAULT_EPSILON)
        finally:
            await conn.close()

    asyncio.run(session())


# --- pg8000 ------------------------------------------------------------------------------------------


def _pg8000_notices(conn: pg8000.native.Connection | pg8000.dbapi.Connection) -> list[str]:
    return [n[b"M"].decode() for n in conn.notices]


def test_pg8000_native(served: Served) -> None:
    conn = pg8000.native.Connection(
        ALICE, host="127.0.0.1", port=served.port, database="demo", password=ALICE_PASSWORD
    )
    try:
        assert conn.parameter_statuses["server_version"] == SERVER_VERSION
        [[version]] = conn.run("SELECT version()")
        assert version.startswith("PostgreSQL 15.0 ")
        before = served.spent()
        [[count]] = conn.run("SELECT COUNT(*) AS n FROM patients")
        assert_close(count, served.truth.count(), _pg8000_notices(conn)[-1], "n")
        # :name parameters, sent as $n with the types pg8000 chose.
        [[count]] = conn.run(
            "SELECT COUNT(*) AS n FROM patients WHERE age > :age AND sex = :sex", age=35, sex="F"
        )
        assert [(c["name"], c["type_oid"]) for c in conn.columns] == [("n", 20)]
        assert_close(count, served.truth.older(35, "F"), _pg8000_notices(conn)[-1], "n")
        statement = conn.prepare("SELECT COUNT(*) AS n FROM patients WHERE age > :age")
        try:
            for age in (10, 70):
                [[count]] = statement.run(age=age)
                assert_close(count, served.truth.older(age), _pg8000_notices(conn)[-1], "n")
        finally:
            statement.close()
        assert served.spent() == pytest.approx(before + 4 * DEFAULT_EPSILON)
        columns = conn.run(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = :t ORDER BY ordinal_position",
            t="patients",
        )
        assert columns == [list(c) for c in zip(PATIENT_COLUMNS, PATIENT_DATA_TYPES, strict=True)]
        with pytest.raises(pg8000.native.DatabaseError) as caught:
            conn.run("SELECT * FROM patients")
        assert caught.value.args[0]["C"] == "42501"
        assert served.spent() == pytest.approx(before + 4 * DEFAULT_EPSILON)
    finally:
        conn.close()


def test_pg8000_dbapi_with_epsilon_and_budget_settings(served: Served) -> None:
    conn = pg8000.dbapi.connect(
        ALICE, host="127.0.0.1", port=served.port, database="demo", password=ALICE_PASSWORD
    )
    try:
        cur = conn.cursor()  # not autocommit: pg8000 opens a transaction
        cur.execute("SELECT COUNT(*) AS n FROM patients WHERE age > %s", (55,))
        assert [d[:2] for d in cur.description] == [("n", 20)]
        assert_close(cur.fetchone()[0], served.truth.older(55), _pg8000_notices(conn)[-1], "n")
        cur.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY 1", ("public",)
        )
        assert [r[0] for r in cur.fetchall()] == EXPOSED_TABLES
        with pytest.raises(pg8000.dbapi.DatabaseError) as caught:
            cur.execute("SELECT * FROM patients")
        assert caught.value.args[0]["C"] == "42501"
        conn.rollback()
        cur.execute("SET dpproxy.epsilon = 0.2")
        before = served.spent()
        cur.execute("SELECT COUNT(*) AS n FROM patients")
        assert "spent ε=0.2" in _pg8000_notices(conn)[-1]
        assert served.spent() == pytest.approx(before + 0.2)
        cur.execute("SHOW dpproxy.budget")
        assert [d[0] for d in cur.description] == [
            "epsilon_spent",
            "epsilon_remaining",
            "delta_spent",
            "delta_remaining",
            "budget",
        ]
        spent, remaining, _, _, _ = cur.fetchone()
        assert float(spent) == pytest.approx(served.spent())
        assert float(spent) + float(remaining) == pytest.approx(1000.0)
        conn.commit()
    finally:
        conn.close()


# --- SQLAlchemy 2 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", ["psycopg", "pg8000"])
def test_sqlalchemy_reflects_tables_and_binds_parameters(served: Served, driver: str) -> None:
    engine = sqlalchemy.create_engine(served.url(driver), poolclass=sqlalchemy.pool.NullPool)
    psycopg_notices: list[str] = []

    @event.listens_for(engine, "connect")
    def collect_notices(dbapi_connection: Any, _record: Any) -> None:
        if driver == "psycopg":
            dbapi_connection.add_notice_handler(
                lambda diag: psycopg_notices.append(diag.message_primary or "")
            )

    def last_notice(conn: sqlalchemy.Connection) -> str:
        if driver == "psycopg":
            return psycopg_notices[-1]
        return _pg8000_notices(conn.connection.driver_connection)[-1]  # type: ignore[arg-type]

    try:
        before = served.spent()
        inspector = inspect(engine)
        assert engine.dialect.server_version_info == (15, 0)
        assert inspector.get_table_names() == EXPOSED_TABLES
        assert inspector.has_table("patients") and not inspector.has_table("no_such_table")
        columns = inspector.get_columns("patients")
        assert [(c["name"], type(c["type"])) for c in columns] == list(
            zip(
                PATIENT_COLUMNS,
                [INTEGER, INTEGER, VARCHAR, NUMERIC, VARCHAR, VARCHAR, BOOLEAN, DATE],
                strict=True,
            )
        )
        # Both send CAST(… AS REGCLASS) parameters; the shadow reflects the backing database's keys.
        assert inspector.get_pk_constraint("patients")["constrained_columns"] == ["patient_id"]
        assert [
            (fk["constrained_columns"], fk["referred_table"], fk["referred_columns"])
            for fk in inspector.get_foreign_keys("visits")
        ] == [(["patient_id"], "patients", ["patient_id"])]
        # Full reflection, as ORMs and pandas do it (table options read default_table_access_method).
        patients = Table("patients", MetaData(), autoload_with=engine)
        assert [c.name for c in patients.columns] == PATIENT_COLUMNS
        assert served.spent() == before
        with engine.connect() as conn:
            query = text("SELECT COUNT(*) AS n FROM patients WHERE age > :age AND sex = :sex")
            count = conn.execute(query, {"age": 40, "sex": "M"}).scalar_one()
            assert_close(count, served.truth.older(40, "M"), last_notice(conn), "n")
            # SQL Core: bound parameters with casts (age > $1::INTEGER), labels, GROUP BY.
            grouped = (
                select(patients.c.sex, func.count().label("n"))
                .where(patients.c.age > 30)
                .group_by(patients.c.sex)
                .order_by(patients.c.sex)
            )
            rows = conn.execute(grouped).all()
            assert [r.sex for r in rows] == ["F", "M", "X"]
            for r in rows:
                assert_close(r.n, served.truth.older(30, r.sex), last_notice(conn), "n")
            with pytest.raises(sqlalchemy.exc.ProgrammingError) as caught:
                conn.execute(text("SELECT * FROM patients"))
            orig = caught.value.orig
            sqlstate = orig.sqlstate if driver == "psycopg" else orig.args[0]["C"]  # type: ignore[union-attr]
            assert sqlstate == "42501"
        assert served.spent() == pytest.approx(before + 2 * DEFAULT_EPSILON)
    finally:
        engine.dispose()


# --- pgjdbc ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientRun:
    """What an external client program printed, and what its run cost the analyst."""

    lines: tuple[tuple[str, ...], ...]  # (key, value, …) per printed line
    charged: float

    def all(self, key: str) -> list[tuple[str, ...]]:
        return [line[1:] for line in self.lines if line[0] == key]

    def one(self, key: str) -> str:
        values = self.all(key)
        assert len(values) == 1, f"{key}: {values}"
        return values[0][0]

    def succeeded(self, *steps: str) -> ClientRun:
        """Assert that these steps of the program raised no SQLException; each step's error line is
        `error<TAB><step>: <SQLSTATE> <message>`."""
        failed = [e[0] for e in self.all("error") if e[0].split(":")[0] in steps]
        assert failed == [], failed
        return self


def compile_with_pgjdbc(source: Path, into: Path) -> Path:
    """Compile one Java client against Debian's pgjdbc into `into` (its classpath entry); a missing
    JDK or pgjdbc skips locally and fails under CI, where scripts/test.sh installs them."""
    javac = shutil.which("javac")
    if shutil.which("java") is None or javac is None:
        _missing_tool(f"java and javac are needed to run {source.name} (a JDK)")
    if not PGJDBC_JAR.is_file():
        _missing_tool(f"pgjdbc is needed to run {source.name} ({PGJDBC_JAR} is missing)")
    assert javac is not None
    compiled = subprocess.run(
        [javac, "-encoding", "UTF-8", "-cp", str(PGJDBC_JAR), "-d", str(into), str(source)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )
    assert compiled.returncode == 0, compiled.stderr
    return into


@pytest.fixture(scope="session")
def jdbc_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """JdbcCheck compiled once per session against Debian's pgjdbc."""
    return compile_with_pgjdbc(CLIENTS / "JdbcCheck.java", tmp_path_factory.mktemp("jdbc-classes"))


@pytest.fixture
def jdbc(served: Served, jdbc_classes: Path) -> ClientRun:
    """One JdbcCheck session per backend, shared by the JDBC tests."""
    if "jdbc" not in served.cache:
        before = served.spent()
        java = shutil.which("java")
        assert java is not None
        url = f"jdbc:postgresql://127.0.0.1:{served.port}/demo?sslmode=disable&prepareThreshold=5"
        result = subprocess.run(
            [
                java,
                "-Dfile.encoding=UTF-8",
                "-cp",
                f"{jdbc_classes}{os.pathsep}{PGJDBC_JAR}",
                "JdbcCheck",
                url,
                ALICE,
                ALICE_PASSWORD,
            ],
            capture_output=True,
            text=True,
            encoding="utf-8",
            timeout=SUBPROCESS_TIMEOUT,
        )
        assert result.returncode == 0, result.stderr
        lines = tuple(tuple(line.split("\t")) for line in result.stdout.splitlines())
        served.cache["jdbc"] = ClientRun(lines, served.spent() - before)
    run: ClientRun = served.cache["jdbc"]
    assert run.one("done") == "true"
    return run


def test_jdbc_reads_the_version_and_gets_a_dp_count(served: Served, jdbc: ClientRun) -> None:
    jdbc.succeeded("version", "count")
    assert jdbc.one("product") == "PostgreSQL"
    assert jdbc.one("product_version") == SERVER_VERSION
    assert (jdbc.one("major"), jdbc.one("minor")) == ("15", "0")
    assert jdbc.one("version").startswith("PostgreSQL 15.0 ")
    assert jdbc.one("count_column") == "n int8"
    assert_close(int(jdbc.one("count")), served.truth.count(), jdbc.one("count_notice"), "n")


def test_jdbc_prepared_statement_runs_as_a_named_server_statement(served: Served, jdbc: ClientRun) -> None:
    jdbc.succeeded("prepared", "typed", "grouped")
    runs = jdbc.all("prepared")
    assert [int(age) for age, *_ in runs] == [20 + 5 * i for i in range(8)]
    server_prepared = [flag == "true" for _, _, flag, _ in runs]
    # pgjdbc switches to a named statement after prepareThreshold executions: both paths ran.
    assert not server_prepared[0] and all(server_prepared[-3:])
    for age, count, _, notice in runs:
        assert_close(int(count), served.truth.older(int(age), "F"), notice, "count")
    typed = jdbc.all("typed")
    assert len(typed) == 6 and typed[-1][2] == "true"
    for count, mean_income, _, notice in typed:
        assert_close(int(count), served.truth.count(typed_filter), notice, "n")
        assert_close(Decimal(mean_income), served.truth.mean_income(typed_filter), notice, "mean_income")
    columns = jdbc.all("grouped_column")
    assert columns == [("sex varchar",), ("n int8",), ("mean_income numeric",)]
    groups = [line[0].split() for line in jdbc.all("grouped")]
    assert [g[0] for g in groups] == ["F", "M", "X"]
    for sex, n, mean_income in groups:
        assert_close(int(n), served.truth.older(17, sex), jdbc.one("grouped_notice"), "n")
        assert Decimal(mean_income) >= 0  # BigDecimal from numeric, binary after the switch


def test_jdbc_database_metadata_lists_tables_and_columns(jdbc: ClientRun) -> None:
    jdbc.succeeded("tables", "columns", "schemas", "primary_keys", "type_info", "isolation")
    assert [t[0] for t in jdbc.all("table")] == [f"public.{t} TABLE" for t in EXPOSED_TABLES]
    # TYPE_NAME is PostgreSQL's internal name; DATA_TYPE the java.sql.Types code pgjdbc maps it to.
    assert [c[0] for c in jdbc.all("column")] == [
        "1 patient_id int4 4",
        "2 age int4 4",
        "3 sex varchar 12",
        "4 income numeric 2",
        "5 zip varchar 12",
        "6 diagnosis varchar 12",
        "7 smoker bool -7",
        "8 enrolled date 91",
    ]
    assert [s[0] for s in jdbc.all("schema")] == ["information_schema", "pg_catalog", "public"]
    assert jdbc.one("primary_keys") == "1"  # patients_pkey (patient_id), reflected from the backend
    count, has_int4 = jdbc.one("type_info").split()
    assert int(count) > 50 and has_int4 == "true"
    assert [i[0] for i in jdbc.all("isolation")] == ["2", "8"]  # READ COMMITTED, then SERIALIZABLE as set


def test_jdbc_raw_rows_are_refused_with_42501(jdbc: ClientRun) -> None:
    jdbc.succeeded("raw_rows")
    assert jdbc.one("raw_rows_sqlstate") == "42501"
    assert 'raw rows of the protected table "patients"' in jdbc.one("raw_rows_message")


def test_jdbc_fetch_size_pages_through_portals(served: Served, jdbc: ClientRun) -> None:
    jdbc.succeeded("cursor")
    # setFetchSize(3) in a transaction: Execute with a row limit, PortalSuspended, Execute again.
    assert [r[0].split()[0] for r in jdbc.all("cursor_row")] == list(served.truth.departments)
    assert jdbc.one("cursor_public_rows") == str(served.truth.zip_rows)


def test_jdbc_sets_epsilon_and_reads_the_budget(served: Served, jdbc: ClientRun) -> None:
    jdbc.succeeded("settings")
    assert jdbc.one("epsilon") == "0.25"
    assert "spent ε=0.25" in jdbc.one("epsilon_notice")
    budget = dict(b[0].split() for b in jdbc.all("budget"))
    assert list(budget) == ["epsilon_spent", "epsilon_remaining", "delta_spent", "delta_remaining", "budget"]
    assert budget["budget"] == "analyst"  # no data-set budget in this policy: one row
    assert float(budget["epsilon_spent"]) + float(budget["epsilon_remaining"]) == pytest.approx(1000.0)
    assert jdbc.one("epsilon_too_large") == "22023"
    # 17 private queries at 0.5 (count, 8 prepared, 6 typed, grouped, the cursor's one run) and
    # one at 0.25; Describe, metadata and the refused query cost nothing.
    assert jdbc.charged == pytest.approx(17 * DEFAULT_EPSILON + 0.25)


# --- node-postgres -----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def node_program() -> list[str]:
    """`node pg_check.js`, with node-postgres installed into tests/wire/clients/node_modules on first use."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for the node-postgres test")
    assert node is not None and npm is not None
    wanted = [CLIENTS / "node_modules" / name / "package.json" for name in ("pg", "pg-cursor")]
    # xdist workers share the directory: one installs while the others wait.
    with open(CLIENTS / ".npm-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all(path.is_file() for path in wanted):
            try:
                installed = subprocess.run(
                    [npm, "install", "--no-audit", "--no-fund", "--no-package-lock", "--loglevel=error"],
                    cwd=CLIENTS,
                    capture_output=True,
                    text=True,
                    timeout=SUBPROCESS_TIMEOUT,
                )
            except subprocess.TimeoutExpired:
                pytest.skip("npm could not install node-postgres in time")
            if installed.returncode != 0 or not all(path.is_file() for path in wanted):
                pytest.skip(f"npm could not install node-postgres: {installed.stderr.strip()[-500:]}")
    return [node, str(CLIENTS / "pg_check.js")]


@pytest.fixture
def node(served: Served, node_program: list[str]) -> dict[str, Any]:
    """One pg_check.js session per backend, shared by the node-postgres tests."""
    if "node" not in served.cache:
        before = served.spent()
        result = subprocess.run(
            [*node_program, str(served.port), ALICE, ALICE_PASSWORD],
            env={**os.environ, "TZ": "UTC"},  # node-postgres writes a Date in local time
            capture_output=True,
            text=True,
            encoding="utf-8",
            timeout=SUBPROCESS_TIMEOUT,
        )
        assert result.returncode == 0, result.stderr
        seen = json.loads(result.stdout)
        seen["charged"] = served.spent() - before
        served.cache["node"] = seen
    return served.cache["node"]  # type: ignore[no-any-return]


def node_steps(seen: dict[str, Any], *steps: str) -> list[Any]:
    """What pg_check.js recorded for these steps, none of which may have failed."""
    failed = {s: seen[s]["error"] for s in steps if isinstance(seen[s], dict) and "error" in seen[s]}
    assert failed == {}, failed
    return [seen[s] for s in steps]


def test_node_postgres_version_count_and_parameters(served: Served, node: dict[str, Any]) -> None:
    node_steps(node, "version", "count", "parameterised", "named")
    assert node["parameters"]["server_version"] == SERVER_VERSION
    assert node["version"].startswith("PostgreSQL 15.0 ")
    count = node["count"]
    assert count["fields"] == [["n", 20]]
    [notice] = count["notices"]
    # node-postgres returns int8 as a string, as it does from PostgreSQL.
    assert_close(int(count["rows"][0]["n"]), served.truth.count(), notice, "n")
    parameterised = node["parameterised"]
    assert parameterised["fields"] == [["n", 20]]
    [notice] = parameterised["notices"]
    assert_close(int(parameterised["rows"][0]["n"]), served.truth.older(40, "F"), notice, "n")
    named = node["named"]
    assert [run["age"] for run in named] == [20, 40, 60, 80]
    for run in named:
        assert [r["sex"] for r in run["rows"]] == ["F", "M", "X"]
        [notice] = run["notices"]
        for r in run["rows"]:
            assert_close(int(r["n"]), served.truth.older(run["age"], r["sex"]), notice, "n")


def test_node_postgres_typed_parameters(served: Served, node: dict[str, Any]) -> None:
    [typed] = node_steps(node, "typed")
    assert typed["fields"] == [["n", 20], ["mean_income", 1700]]
    [notice] = typed["notices"]
    [row] = typed["rows"]
    assert_close(int(row["n"]), served.truth.count(typed_filter), notice, "n")
    assert_close(Decimal(row["mean_income"]), served.truth.mean_income(typed_filter), notice, "mean_income")


def test_node_postgres_metadata_and_refusals(node: dict[str, Any]) -> None:
    node_steps(node, "columns", "tables")
    assert node["columns"] == [
        {"column_name": c, "data_type": t} for c, t in zip(PATIENT_COLUMNS, PATIENT_DATA_TYPES, strict=True)
    ]
    assert node["tables"] == EXPOSED_TABLES
    assert node["raw_rows"]["error"]["sqlstate"] == "42501"
    assert node["raw_rows_extended"]["error"]["sqlstate"] == "42501"


def test_node_postgres_cursor_and_budget(served: Served, node: dict[str, Any]) -> None:
    pages, budget = node_steps(node, "cursor", "budget")
    departments = served.truth.departments
    assert [len(p) for p in pages] == [3, 3, len(departments) - 6]
    assert [r["department"] for page in pages for r in page] == list(departments)
    assert budget["epsilon"] == {"dpproxy.epsilon": "0.3"}
    [notice] = budget["notices"]
    assert "spent ε=0.3" in notice
    spent, remaining = budget["budget"]["epsilon_spent"], budget["budget"]["epsilon_remaining"]
    assert float(spent) + float(remaining) == pytest.approx(1000.0)
    # count, parameterised, 4 named, typed, the cursor's one run at 0.5; one count at 0.3.
    assert node["charged"] == pytest.approx(8 * DEFAULT_EPSILON + 0.3)
