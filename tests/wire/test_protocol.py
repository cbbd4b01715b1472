"""The PostgreSQL wire server, end to end: psycopg 3 and raw protocol messages against a server the
tests start in-process (over the demo data on DuckDB and on PostgreSQL), plus `dpproxy serve` in a
subprocess for SIGTERM. What a client sees is asserted: messages, SQLSTATEs, notices, budgets.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
import scramp
import yaml
from hypothesis import given
from hypothesis import strategies as st

from dpproxy.engine import Engine
from dpproxy.errors import DPProxyError
from dpproxy.wire import codec, types
from dpproxy.wire.auth import md5_password
from dpproxy.wire.server import BackgroundServer, ServerConfig

REPO = Path(__file__).resolve().parents[2]
DEMO_POLICY = REPO / "dpproxy" / "data" / "demo.yaml"
ALICE, ALICE_PASSWORD = "alice", "alice-demo"

# --- policies and servers -------------------------------------------------------------------------


def write_policy(path: Path, *, server: dict | None = None, alice: dict | None = None) -> Path:
    """The demo policy with budgets large enough for a whole module of queries."""
    policy = yaml.safe_load(DEMO_POLICY.read_text())
    policy["analysts"]["alice"].update({"epsilon": 1000.0, "delta": 0.01}, **(alice or {}))
    policy["analysts"]["bob"].update({"epsilon": 1000.0, "delta": 0.01})
    # These tests count what each query is charged; free replay of repeats has tests of its own.
    policy["defaults"]["replay"] = False
    if server is not None:
        policy["server"] = server
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path


@dataclass
class Proxy:
    port: int
    engine: Engine
    backend: str

    def dsn(self, user: str = ALICE, password: str = ALICE_PASSWORD, **extra: str) -> str:
        parts = {"host": "127.0.0.1", "port": str(self.port), "user": user, "password": password}
        parts.update({"dbname": "demo", "connect_timeout": "10", "sslmode": "disable"}, **extra)
        return " ".join(f"{k}={v}" for k, v in parts.items())

    def connect(self, **kwargs: object) -> psycopg.Connection:
        return psycopg.connect(self.dsn(), **kwargs)  # type: ignore[arg-type]

    def spent(self, analyst: str = ALICE) -> float:
        return self.engine.budget(analyst).spent.epsilon


@contextlib.contextmanager
def running_proxy(policy: Path, backend: str, ledger: Path, **config: object) -> Iterator[Proxy]:
    engine = Engine.open(policy, backend, ledger)
    server = BackgroundServer(engine, ServerConfig(port=0, **config))  # type: ignore[arg-type]
    server.start()
    try:
        yield Proxy(server.port, engine, "postgres" if backend.startswith("postgres") else "duckdb")
    finally:
        server.stop()


def private_copy(demo_duckdb: Path, directory: Path) -> str:
    """A copy of the demo database: DuckDB refuses a second connection to a file that this process
    already holds with another configuration (demo_pg_dsn reads the shared file)."""
    target = directory / "demo.duckdb"
    shutil.copyfile(demo_duckdb, target)
    return str(target)


@pytest.fixture(scope="module")
def duck_proxy(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    tmp = tmp_path_factory.mktemp("wire-duck")
    backend = private_copy(demo_duckdb, tmp)
    with running_proxy(write_policy(tmp / "policy.yaml"), backend, tmp / "ledger.sqlite") as proxy:
        yield proxy


@pytest.fixture(scope="module")
def pg_proxy(demo_pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    tmp = tmp_path_factory.mktemp("wire-pg")
    with running_proxy(write_policy(tmp / "policy.yaml"), demo_pg_dsn, tmp / "ledger.sqlite") as proxy:
        yield proxy


@pytest.fixture(params=["duckdb", "postgres"])
def proxy(request: pytest.FixtureRequest) -> Proxy:
    return request.getfixturevalue("duck_proxy" if request.param == "duckdb" else "pg_proxy")


def notices_of(conn: psycopg.Connection) -> list[str]:
    found: list[str] = []
    conn.add_notice_handler(lambda diag: found.append(diag.message_primary or ""))
    return found


# --- psycopg: queries -------------------------------------------------------------------------------


def test_dp_count_answers_with_a_notice_and_charges_the_budget(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        notices = notices_of(conn)
        before = proxy.spent()
        (count,) = conn.execute("SELECT COUNT(*) FROM patients").fetchone()  # type: ignore[misc]
        assert isinstance(count, int) and 2500 < count < 3500  # 3000 patients, noised
        assert proxy.spent() == pytest.approx(before + 0.5)
        assert len(notices) == 1 and "spent ε=0.5" in notices[0] and "count ±" in notices[0]
        assert conn.info.parameter_status("server_version") == "15.0 (dpproxy 0.1)"
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_simple_query_protocol_runs_each_statement(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        notices = notices_of(conn)
        cur = psycopg.ClientCursor(conn)  # the simple query protocol: one Query message
        cur.execute(
            "SET application_name = 'wire tests'; SELECT COUNT(*) AS n FROM visits; "
            "SELECT zip, city FROM zip_info ORDER BY zip LIMIT 2"
        )
        assert cur.statusmessage == "SET" and cur.description is None
        assert cur.nextset()
        assert [d.name for d in cur.description] == ["n"] and cur.fetchone()[0] > 0  # type: ignore[index,union-attr]
        assert cur.nextset()
        assert len(cur.fetchall()) == 2 and cur.statusmessage == "SELECT 2"
        assert not cur.nextset()
        assert len(notices) == 1  # only the private query has a cost
        assert conn.info.parameter_status("application_name") == "wire tests"
        # A failing statement stops the rest of the string.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            cur.execute("SELECT COUNT(*) FROM visits; SELECT patient_id FROM patients; SELECT 1")


def test_prepared_statements_with_parameters(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        sql = "SELECT COUNT(*) FROM patients WHERE age > %s AND sex = %s"
        for age in (20, 40, 60):
            (count,) = conn.execute(sql, [age, "F"], prepare=True).fetchone()  # type: ignore[misc]
            assert isinstance(count, int)
        # A date parameter and a LIMIT parameter, inferred without types.
        rows = conn.execute(
            "SELECT department, COUNT(*) FROM visits WHERE visit_date >= %s GROUP BY department "
            "ORDER BY department LIMIT %s",
            [dt.date(2020, 1, 1), 3],
            prepare=True,
        ).fetchall()
        assert [r[0] for r in rows] == ["cardiology", "dermatology", "emergency"]


def test_pipeline_mode_and_deallocate(duck_proxy: Proxy) -> None:
    with duck_proxy.connect(autocommit=True) as conn:
        with conn.pipeline():
            first = conn.execute("SELECT COUNT(*) FROM patients WHERE sex = %s", ["F"])
            second = conn.execute("SELECT zip FROM zip_info ORDER BY zip LIMIT %s", [3])
            third = conn.execute("SHOW dpproxy.epsilon")
        assert first.fetchone()[0] > 0 and len(second.fetchall()) == 3  # type: ignore[index]
        assert third.fetchone() == ("0.5",)
        conn.execute("SELECT COUNT(*) FROM visits WHERE cost > %s", [100], prepare=True)
        conn.execute("DEALLOCATE ALL")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            conn.execute("DEALLOCATE no_such_statement")


def test_binary_results_match_text_results(proxy: Proxy) -> None:
    sql = "SELECT zip, city, state, population FROM zip_info ORDER BY zip LIMIT 20"
    with proxy.connect(autocommit=True) as conn:
        text_rows = conn.execute(sql).fetchall()
        binary_rows = conn.cursor(binary=True).execute(sql).fetchall()
        assert binary_rows == text_rows and len(text_rows) == 20
        cur = conn.cursor(binary=True)
        cur.execute(
            "SELECT sex, smoker, COUNT(*), AVG(income), SUM(age) FROM patients GROUP BY sex, smoker "
            "ORDER BY sex, smoker"
        )
        rows = cur.fetchall()
        assert [(r[0], r[1]) for r in rows] == [(s, b) for s in "FMX" for b in (False, True)]
        assert all(isinstance(r[2], int) and isinstance(r[3], Decimal) for r in rows)
        assert [d.type_code for d in cur.description] == [1043, 16, 20, 1700, 20]  # type: ignore[union-attr]


def test_server_side_cursor_fetches_in_pages(proxy: Proxy) -> None:
    with proxy.connect() as conn:
        notices = notices_of(conn)
        before = proxy.spent()
        with conn.cursor(name="departments") as cur:
            cur.execute("SELECT department, COUNT(*) FROM visits GROUP BY department ORDER BY department")
            first = cur.fetchmany(3)
            rest = cur.fetchall()
        conn.commit()
        assert [r[0] for r in first + rest] == sorted(
            [
                "cardiology",
                "dermatology",
                "emergency",
                "general",
                "neurology",
                "oncology",
                "orthopedics",
                "pediatrics",
            ]
        )
        assert proxy.spent() == pytest.approx(before + 0.5)  # run once, charged once
        assert len(notices) == 1
    # A holdable cursor outlives its transaction, in autocommit mode too.
    with proxy.connect(autocommit=True) as conn, conn.cursor(name="held", withhold=True) as cur:
        cur.execute("SELECT state, population FROM zip_info ORDER BY zip LIMIT 7")
        assert len(cur.fetchmany(5)) == 5 and len(cur.fetchall()) == 2


def test_declare_and_fetch_in_sql(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute("DECLARE c CURSOR FOR SELECT department, COUNT(*) FROM visits GROUP BY department")
        assert len(conn.execute("FETCH 5 FROM c").fetchall()) == 5
        conn.execute("MOVE 1 IN c")
        assert len(conn.execute("FETCH ALL FROM c").fetchall()) == 2
        assert conn.execute("FETCH NEXT FROM c").fetchall() == []
        conn.execute("CLOSE c")
        with pytest.raises(psycopg.errors.InvalidCursorName):
            conn.execute("FETCH 1 FROM c")
        conn.execute("ROLLBACK")
        # Outside a transaction block, only a holdable cursor may be declared.
        with pytest.raises(psycopg.errors.NoActiveSqlTransaction):
            conn.execute("DECLARE d CURSOR FOR SELECT COUNT(*) FROM patients")


def test_explain_shows_the_plan_and_costs_nothing(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        before = proxy.spent()
        cur = conn.execute("EXPLAIN SELECT AVG(income) FROM patients")
        assert [d.name for d in cur.description] == ["QUERY PLAN"]  # type: ignore[union-attr]
        text = "\n".join(r[0] for r in cur.fetchall())
        assert "cost: ε=0.5" in text
        assert proxy.spent() == before


# --- psycopg: session settings and transactions ------------------------------------------------------


def test_set_and_show_dpproxy_settings(duck_proxy: Proxy) -> None:
    with duck_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.5",)
        conn.execute("SET dpproxy.epsilon = 0.2")
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.2",)
        notices = notices_of(conn)
        before = duck_proxy.spent()
        conn.execute("SELECT COUNT(*) FROM patients")
        assert duck_proxy.spent() == pytest.approx(before + 0.2)
        assert "spent ε=0.2" in notices[0]
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            conn.execute("SET dpproxy.epsilon = 5")
        assert "outside the range the policy allows" in str(caught.value)
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.2",)
        conn.execute("RESET dpproxy.epsilon")
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.5",)
        cur = conn.execute("SHOW dpproxy.budget")
        assert [d.name for d in cur.description] == [  # type: ignore[union-attr]
            "epsilon_spent",
            "epsilon_remaining",
            "delta_spent",
            "delta_remaining",
            "budget",
        ]
        spent, remaining, _, _, which = cur.fetchone()  # type: ignore[misc]
        assert which == "analyst" and cur.fetchone() is None  # no data-set budget in this policy
        assert float(spent) == pytest.approx(duck_proxy.spent())
        assert float(spent) + float(remaining) == pytest.approx(1000.0)
        with pytest.raises(psycopg.errors.CantChangeRuntimeParam):
            conn.execute("SET dpproxy.budget = 100")
        with pytest.raises(psycopg.errors.UndefinedObject):
            conn.execute("SHOW dpproxy.nothing")


def test_a_session_can_fix_the_contribution_bounds(duck_proxy: Proxy) -> None:
    """SET dpproxy.max_rows_per_unit / max_groups_per_unit fix the bounds each query would choose
    (within the policy's ceilings, capped at them), spending nothing on the choice; RESET and
    `chosen` go back to choosing."""
    with duck_proxy.connect(autocommit=True) as conn:
        notices = notices_of(conn)
        assert conn.execute("SHOW dpproxy.max_rows_per_unit").fetchone() == ("chosen",)
        conn.execute("SELECT department, COUNT(*) FROM visits GROUP BY department")
        assert "contribution bounds of this query: at most" in notices[-1] and "(chosen" in notices[-1]
        conn.execute("SET dpproxy.max_rows_per_unit = 2")
        conn.execute("SET dpproxy.max_groups_per_unit = 1000")  # capped at the ceiling when used
        assert conn.execute("SHOW dpproxy.max_rows_per_unit").fetchone() == ("2",)
        conn.execute("SELECT department, COUNT(DISTINCT patient_id) FROM visits GROUP BY department")
        assert (
            "at most 2 row(s) per person (set; ceiling 5), counted in at most 3 group(s) (set: the ceiling)"
            in notices[-1]
        )
        text = "\n".join(r[0] for r in conn.execute("EXPLAIN SELECT COUNT(*) FROM visits").fetchall())
        assert "chosen among" not in text  # nothing to choose: no ε spent on it
        for bad in ("0", "-1", "many", "2.5"):
            with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
                conn.execute(f"SET dpproxy.max_rows_per_unit = '{bad}'")
            assert 'invalid value for parameter "dpproxy.max_rows_per_unit"' in str(caught.value)
        conn.execute("SET dpproxy.max_rows_per_unit = chosen")
        conn.execute("RESET dpproxy.max_groups_per_unit")
        assert conn.execute("SHOW dpproxy.max_groups_per_unit").fetchone() == ("chosen",)


def test_session_settings_are_answered_locally(duck_proxy: Proxy) -> None:
    with duck_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SHOW server_version").fetchone() == ("15.0 (dpproxy 0.1)",)
        assert conn.execute("SHOW DateStyle").fetchone() == ("ISO, MDY",)
        assert conn.execute("SHOW standard_conforming_strings").fetchone() == ("on",)
        conn.execute("SET extra_float_digits = 3")
        conn.execute("SET TIME ZONE 'Europe/Paris'")
        assert conn.info.parameter_status("TimeZone") == "Europe/Paris"
        conn.execute("SET search_path TO public")
        assert conn.execute("SHOW search_path").fetchone() == ("public",)
        conn.execute("SET statement_timeout = 0")
        names = {row[0] for row in conn.execute("SHOW ALL").fetchall()}
        assert {"DateStyle", "TimeZone", "dpproxy.epsilon", "search_path"} <= names
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SET TIME ZONE 'Nowhere/Never'")
        with pytest.raises(psycopg.errors.CantChangeRuntimeParam):
            conn.execute("SET server_version = '9.6'")
        conn.execute("RESET ALL")
        assert conn.execute("SHOW TimeZone").fetchone() == ("UTC",)
        conn.execute("DISCARD ALL")


def test_transactions_and_error_recovery(duck_proxy: Proxy) -> None:
    with duck_proxy.connect() as conn:  # not autocommit: psycopg sends BEGIN
        conn.execute("SET application_name = 'before'")
        conn.commit()
        conn.execute("SET application_name = 'inside'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT age FROM patients")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute("SELECT COUNT(*) FROM patients")
        conn.rollback()
        # ROLLBACK undid the SET made in the failed transaction, as PostgreSQL does.
        assert conn.execute("SHOW application_name").fetchone() == ("before",)
        conn.execute("SAVEPOINT s1")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # not exposed
            conn.execute("SELECT COUNT(*) FROM no_such_table")
        conn.execute("ROLLBACK TO SAVEPOINT s1")
        assert conn.execute("SELECT COUNT(*) FROM visits").fetchone()[0] > 0  # type: ignore[index]
        conn.commit()
    with duck_proxy.connect(autocommit=True) as conn, conn.transaction():
        conn.execute("SET LOCAL application_name = 'local'")
        assert conn.execute("SHOW application_name").fetchone() == ("local",)


def test_raw_rows_of_a_protected_table_are_refused(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        before = proxy.spent()
        for sql in ("SELECT * FROM patients", "SELECT patient_id, income FROM patients WHERE age > 90"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
                conn.execute(sql)
            assert caught.value.sqlstate == "42501"
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM patients")
        assert proxy.spent() == before
        assert conn.execute("SELECT COUNT(*) FROM zip_info").fetchone()[0] == 2000  # type: ignore[index]


def test_catalog_queries_reach_the_catalog(duck_proxy: Proxy) -> None:
    with duck_proxy.connect(autocommit=True) as conn:
        (version,) = conn.execute("SELECT version()").fetchone()  # type: ignore[misc]
        assert version.startswith("PostgreSQL 15.0")
        assert conn.execute("SELECT 1 + 1").fetchone() == (2,)


# --- crashes and silent drops: set_config really sets; what would act is refused ---------------------


def _catalog_fixture(statement_id: str) -> dict:
    entries = json.loads((Path(__file__).parent / "catalog_queries" / "expected.json").read_text())
    return next(e for e in entries if e["id"] == statement_id)


def test_crashes_and_silent_drops_set_config_sets_the_next_private_query_s_epsilon(duck_proxy: Proxy) -> None:
    # The shadow catalog used to answer set_config('dpproxy.epsilon', …) with its argument and
    # change nothing: the analyst believed in an ε the next query did not use.
    with duck_proxy.connect(autocommit=True) as conn:
        notices = notices_of(conn)
        assert conn.execute("SELECT set_config('dpproxy.epsilon', '0.1', false)").fetchone() == ("0.1",)
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.1",)
        assert conn.execute("SELECT current_setting('dpproxy.epsilon')").fetchone() == ("0.1",)
        before = duck_proxy.spent()
        conn.execute("SELECT COUNT(*) FROM patients")
        assert duck_proxy.spent() == pytest.approx(before + 0.1)
        assert "spent ε=0.1" in notices[-1]
        # With a parameter, as applications send it (extended protocol, $1 … $3).
        cur = conn.execute("SELECT set_config(%s, %s, %s)", ("dpproxy.epsilon", "0.2", False))
        assert [d.name for d in cur.description] == ["set_config"]  # type: ignore[union-attr]
        assert cur.fetchone() == ("0.2",)
        before = duck_proxy.spent()
        conn.execute("SELECT COUNT(*) FROM visits")
        assert duck_proxy.spent() == pytest.approx(before + 0.2)
        # A NULL value resets, as in PostgreSQL; the policy's default comes back.
        assert conn.execute("SELECT set_config('dpproxy.epsilon', NULL, false)").fetchone() == ("0.5",)
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.5",)


def test_crashes_and_silent_drops_set_config_checks_and_refuses_as_set_does(duck_proxy: Proxy) -> None:
    with duck_proxy.connect(autocommit=True) as conn:
        refusals = [
            (
                "SELECT set_config('dpproxy.epsilon', '5', false)",
                "22023",
                "outside the range the policy allows",
            ),
            ("SELECT set_config('dpproxy.epsilon', 'lots', false)", "22023", 'parameter "dpproxy.epsilon"'),
            (
                "SELECT set_config('dpproxy.budget', '100', false)",
                "55P02",
                '"dpproxy.budget" cannot be changed',
            ),
            ("SELECT set_config('dpproxy.nothing', '1', false)", "42704", '"dpproxy.nothing"'),
            ("SELECT set_config('role', 'admin', false)", "42501", "cannot change role"),
            ("SELECT set_config('server_version', '9.6', false)", "55P02", "cannot be changed"),
            ("SELECT set_config('TimeZone', 'Nowhere/Never', false)", "22023", '"TimeZone"'),
            ("SELECT set_config(NULL, 'x', false)", "22004", "SET requires parameter name"),
            ("SELECT set_config('not a name', 'x', false)", "42602", "invalid configuration parameter name"),
            ("SELECT set_config('jit', 'off', 'perhaps')", "22P02", "type boolean"),
        ]
        for sql, sqlstate, fragment in refusals:
            with pytest.raises(psycopg.Error) as caught:
                conn.execute(sql)
            assert caught.value.sqlstate == sqlstate, sql
            assert fragment in str(caught.value), sql
            # …word for word what SET says
            if sql.startswith("SELECT set_config('dpproxy.epsilon', '5'"):
                with pytest.raises(psycopg.Error) as by_set:
                    conn.execute("SET dpproxy.epsilon = 5")
                assert by_set.value.diag.message_primary == caught.value.diag.message_primary
                assert by_set.value.diag.message_hint == caught.value.diag.message_hint
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.5",)
        # A statement's calls are all or nothing: the first is undone when the second fails.
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute(
                "SELECT set_config('application_name', 'half', false), set_config('dpproxy.epsilon', '5', false)"
            )
        assert conn.execute("SHOW application_name").fetchone() != ("half",)


def test_crashes_and_silent_drops_set_config_as_clients_send_it(duck_proxy: Proxy) -> None:
    with duck_proxy.connect(autocommit=True) as conn:
        # pg_dump's preamble.
        assert conn.execute("SELECT pg_catalog.set_config('search_path', '', false);").fetchone() == ("",)
        assert conn.execute("SHOW search_path").fetchone() == ("",)
        # A reported setting changed by set_config is reported, as SET's would be.
        assert conn.execute("SELECT set_config('TimeZone', 'Europe/Paris', false)").fetchone() == (
            "Europe/Paris",
        )
        assert conn.info.parameter_status("TimeZone") == "Europe/Paris"
        # is_local: until the end of the transaction, as SET LOCAL.
        with conn.transaction():
            conn.execute("SELECT set_config('application_name', 'inside', true)")
            assert conn.execute("SHOW application_name").fetchone() == ("inside",)
        assert conn.execute("SHOW application_name").fetchone() != ("inside",)
        # …and outside one, for its own statement only (the new value is still what it returns).
        assert conn.execute("SELECT set_config('application_name', 'brief', true)").fetchone() == ("brief",)
        assert conn.execute("SHOW application_name").fetchone() != ("brief",)
        # current_setting in the same row sees the settings as they are when it is reached.
        row = conn.execute(
            "SELECT current_setting('jit') AS before, set_config('jit', 'off', false) AS new, "
            "current_setting('jit') AS after, current_setting('no.such', true) AS missing"
        ).fetchone()
        assert row == ("on", "off", "off", None)


def test_crashes_and_silent_drops_set_config_replays_what_clients_sent_to_postgresql(
    duck_proxy: Proxy,
) -> None:
    """asyncpg's and a probe's set_config statements (tests/wire/catalog_queries), with PostgreSQL 15's
    answers: parameter types, columns and rows, through Parse, Describe, Bind and Execute."""
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        for statement_id in (
            "asyncpg:connect+fetch:4",
            "asyncpg:connect+fetch:6",
            "handwritten:functions:10",
        ):
            entry = _catalog_fixture(statement_id)
            raw.send(msg("Q", cstr("SET jit = on")))
            raw.read_until("Z")
            params = tuple(p.encode() for p in entry["params"])
            raw.send(parse("s", entry["sql"]), describe("S", "s"), bind("", "s", params), execute(""), SYNC)
            messages = raw.read_until("Z")
            reported = "S" if "application_name" in entry["sql"] else ""  # ParameterStatus, as SET's
            assert kinds(messages) == f"1tT2DC{reported}Z", (statement_id, messages)
            (count,) = struct.unpack_from("!h", messages[1][1])
            assert list(struct.unpack_from(f"!{count}I", messages[1][1], 2)) == entry["param_oids"]
            assert row_names(messages[2][1]) == [c["name"] for c in entry["columns"]]
            assert _row_type_oids(messages[2][1]) == [c["type_oid"] for c in entry["columns"]]
            assert [[cell.decode() for cell in data_row(messages[4][1])]] == entry["rows"]  # type: ignore[union-attr]
            assert messages[5][1] == b"SELECT 1\x00"
            raw.send(msg("C", b"S" + cstr("s")), SYNC)
            raw.read_until("Z")


def _row_type_oids(body: bytes) -> list[int]:
    (count,) = struct.unpack_from("!h", body)
    oids, pos = [], 2
    for _ in range(count):
        pos = body.index(b"\x00", pos) + 1
        oids.append(struct.unpack_from("!I", body, pos + 6)[0])
        pos += 18
    return oids


def test_crashes_and_silent_drops_functions_that_would_act_are_refused_over_the_wire(
    duck_proxy: Proxy,
) -> None:
    with duck_proxy.connect(autocommit=True) as conn:
        refusals = [
            ("SELECT pg_sleep(1)", "pg_sleep()", "wait in the client"),
            ("SELECT setseed(0.5)", "setseed()", "noise"),
            ("SELECT random()", "random()", "noise"),
            (
                "SELECT set_config('dpproxy.epsilon', '0.1', false), relname FROM pg_class",
                "set_config()",
                "SET",
            ),
        ]
        for sql, named, hint in refusals:
            started = time.monotonic()
            with pytest.raises(psycopg.errors.FeatureNotSupported) as caught:
                conn.execute(sql)
            assert time.monotonic() - started < 1.0, sql  # nothing slept
            assert named in (caught.value.diag.message_primary or ""), sql
            assert hint in (caught.value.diag.message_hint or ""), sql
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.5",)  # the refused call changed nothing
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT pg_read_file('/etc/passwd')")
        # The engine refuses them in private queries too (its own allow-list).
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            conn.execute("SELECT COUNT(*) FROM patients WHERE random() < 0.5")
        assert conn.execute("SELECT 1 + 1").fetchone() == (2,)


# --- psycopg: authentication and cancel ----------------------------------------------------------------


def _auth_error(dsn: str) -> psycopg.OperationalError:
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(dsn)
    return caught.value


def test_wrong_password_and_unknown_user_fail_identically(duck_proxy: Proxy) -> None:
    wrong = _auth_error(duck_proxy.dsn(password="not-her-password"))
    unknown = _auth_error(duck_proxy.dsn(user="mallory", password="whatever"))
    assert 'password authentication failed for user "alice"' in str(wrong)
    assert str(unknown) == str(wrong).replace('"alice"', '"mallory"')


def test_analyst_without_password_cannot_connect(tmp_path: Path, demo_duckdb: Path) -> None:
    policy = write_policy(tmp_path / "policy.yaml", alice={"password": None})
    with running_proxy(policy, private_copy(demo_duckdb, tmp_path), tmp_path / "ledger.sqlite") as proxy:
        assert 'password authentication failed for user "alice"' in str(_auth_error(proxy.dsn()))
        with psycopg.connect(proxy.dsn(user="bob", password="bob-demo")) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)


def test_cleartext_and_md5_only_when_the_policy_enables_them(tmp_path: Path, demo_duckdb: Path) -> None:
    md5 = md5_password(ALICE_PASSWORD, ALICE)
    assert md5 == "md5" + __import__("hashlib").md5(b"alice-demoalice").hexdigest()
    for methods in (["password"], ["md5", "scram-sha-256"]):
        policy = write_policy(
            tmp_path / "policy.yaml",
            server={"auth_methods": methods},
            alice={"md5_password": md5} if "md5" in methods else None,
        )
        backend = private_copy(demo_duckdb, tmp_path)
        with running_proxy(policy, backend, tmp_path / f"{methods[0]}.sqlite") as proxy:
            with RawClient(proxy.port) as raw:
                raw.startup(ALICE)
                kind, body = raw.read()
                assert kind == "R" and struct.unpack("!i", body[:4])[0] == (
                    3 if methods == ["password"] else 5
                )
            with psycopg.connect(proxy.dsn()) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
            assert "password authentication failed" in str(_auth_error(proxy.dsn(password="wrong")))
            # bob has no md5 hash: he gets the next method listed (SCRAM) and still logs in.
            if methods[0] == "md5":
                with psycopg.connect(proxy.dsn(user="bob", password="bob-demo")) as conn:
                    assert conn.execute("SELECT 1").fetchone() == (1,)


def test_default_policy_offers_only_scram(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.startup(ALICE)
        kind, body = raw.read()
        assert (kind, body) == ("R", struct.pack("!i", 10) + b"SCRAM-SHA-256\x00\x00")
        # A client answering with a cleartext password gets a protocol error, not a session.
        raw.send(msg("p", ALICE_PASSWORD.encode() + b"\x00"))
        kind, body = raw.read()
        assert kind == "E" and error_fields(body)["C"] == "08P01"
        assert raw.closed()


@dataclass
class LockablePeople:
    """A scratch PostgreSQL database with one protected table, `people`, and its policy. Holding
    an ACCESS EXCLUSIVE lock on the table makes a private query wait, deterministically."""

    dsn: str
    policy: Path

    @contextlib.contextmanager
    def locked(self) -> Iterator[psycopg.Connection]:
        with psycopg.connect(self.dsn, autocommit=True) as locker:
            locker.execute("BEGIN")
            locker.execute("LOCK TABLE people IN ACCESS EXCLUSIVE MODE")
            yield locker
            with contextlib.suppress(psycopg.Error):
                locker.execute("ROLLBACK")

    def wait_until_blocked(self) -> None:
        deadline = time.monotonic() + 20
        # Polled from its own session: pg_stat_activity is frozen inside a transaction.
        with psycopg.connect(self.dsn, autocommit=True) as watcher:
            while not watcher.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query ILIKE '%people%'"
            ).fetchall():
                assert time.monotonic() < deadline, "the query never started waiting"
                time.sleep(0.05)


@pytest.fixture
def people(pg_cluster, tmp_path: Path) -> Iterator[LockablePeople]:
    from tests.conftest import create_database, drop_database

    name = create_database(pg_cluster, prefix="people")
    dsn = pg_cluster.dsn(name)
    try:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("CREATE TABLE people (person_id integer, age integer)")
            admin.execute("INSERT INTO people SELECT i, i % 90 FROM generate_series(1, 200) i")
        policy = write_policy(tmp_path / "people.yaml")
        spec = yaml.safe_load(policy.read_text())
        columns = {"person_id": {"type": "integer"}, "age": {"type": "integer", "lower": 0, "upper": 100}}
        spec["tables"] = {"people": {"privacy_unit": "person_id", "columns": columns}}
        policy.write_text(yaml.safe_dump(spec))
        yield LockablePeople(dsn, policy)
    finally:
        drop_database(pg_cluster, name)


def run_in_thread(conn: psycopg.Connection, sql: str) -> tuple[threading.Thread, dict[str, object]]:
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["rows"] = conn.execute(sql).fetchall()
        except BaseException as error:
            outcome["error"] = error

    worker = threading.Thread(target=run)
    worker.start()
    return worker, outcome


def test_cancel_interrupts_a_blocked_private_query(people: LockablePeople, tmp_path: Path) -> None:
    with running_proxy(people.policy, people.dsn, tmp_path / "ledger.sqlite") as proxy:
        with people.locked(), proxy.connect(autocommit=True) as conn:
            worker, outcome = run_in_thread(conn, "SELECT COUNT(*) FROM people")
            people.wait_until_blocked()
            conn.cancel_safe()
            worker.join(20)
            assert isinstance(outcome.get("error"), psycopg.errors.QueryCanceled)
            assert "charged" in str(outcome["error"])
        # The query had reached the data: its cost stays spent. The session goes on.
        assert proxy.spent() == pytest.approx(0.5)
        with proxy.connect(autocommit=True) as conn:
            assert conn.execute("SELECT COUNT(*) FROM people").fetchone()[0] > 0  # type: ignore[index]


# --- raw protocol --------------------------------------------------------------------------------------


def msg(type_code: str, body: bytes = b"") -> bytes:
    return type_code.encode() + struct.pack("!i", len(body) + 4) + body


def cstr(text: str) -> bytes:
    return text.encode() + b"\x00"


def parse(name: str, sql: str, oids: tuple[int, ...] = ()) -> bytes:
    return msg("P", cstr(name) + cstr(sql) + struct.pack(f"!h{len(oids)}I", len(oids), *oids))


def bind(
    portal: str, statement: str, params: tuple[bytes | None, ...] = (), result_formats: tuple[int, ...] = ()
) -> bytes:
    body = cstr(portal) + cstr(statement) + struct.pack("!h", 0) + struct.pack("!h", len(params))
    for p in params:
        body += struct.pack("!i", -1) if p is None else struct.pack("!i", len(p)) + p
    return msg("B", body + struct.pack(f"!h{len(result_formats)}h", len(result_formats), *result_formats))


def describe(kind: str, name: str) -> bytes:
    return msg("D", kind.encode() + cstr(name))


def execute(portal: str, max_rows: int = 0) -> bytes:
    return msg("E", cstr(portal) + struct.pack("!i", max_rows))


SYNC = msg("S")


def error_fields(body: bytes) -> dict[str, str]:
    fields = {}
    for part in body.split(b"\x00"):
        if part:
            fields[chr(part[0])] = part[1:].decode()
    return fields


def row_names(body: bytes) -> list[str]:
    (count,) = struct.unpack_from("!h", body)
    names, pos = [], 2
    for _ in range(count):
        end = body.index(b"\x00", pos)
        names.append(body[pos:end].decode())
        pos = end + 1 + 18
    return names


def data_row(body: bytes) -> list[bytes | None]:
    (count,) = struct.unpack_from("!h", body)
    cells: list[bytes | None] = []
    pos = 2
    for _ in range(count):
        (length,) = struct.unpack_from("!i", body, pos)
        pos += 4
        if length < 0:
            cells.append(None)
        else:
            cells.append(body[pos : pos + length])
            pos += length
    return cells


class RawClient:
    """A protocol-level client: sends bytes, reads (type, body) messages."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.buffer = b""
        self.parameters: dict[str, str] = {}
        self.key: tuple[int, int] | None = None

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, *messages: bytes) -> None:
        self.sock.sendall(b"".join(messages))

    def startup(self, user: str, **parameters: str) -> None:
        params = {"user": user, "database": "demo", **parameters}
        body = (
            struct.pack("!i", codec.PROTOCOL_3_0)
            + b"".join(cstr(k) + cstr(v) for k, v in params.items())
            + b"\x00"
        )
        self.send(struct.pack("!i", len(body) + 4) + body)

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        if not data:
            return False
        self.buffer += data
        return True

    def read(self) -> tuple[str, bytes]:
        while len(self.buffer) < 5 or len(self.buffer) < 1 + struct.unpack_from("!i", self.buffer, 1)[0]:
            if not self._fill():
                raise ConnectionError("closed by the server")
        length = struct.unpack_from("!i", self.buffer, 1)[0]
        kind, body = chr(self.buffer[0]), self.buffer[5 : 1 + length]
        self.buffer = self.buffer[1 + length :]
        return kind, body

    def read_until(self, kind: str = "Z") -> list[tuple[str, bytes]]:
        messages = []
        while True:
            message = self.read()
            messages.append(message)
            if message[0] == kind:
                return messages

    def closed(self) -> bool:
        """True when the server closed the connection (after any messages still buffered)."""
        try:
            while self._fill():
                pass
        except (ConnectionResetError, TimeoutError):
            return not isinstance(sys.exc_info()[1], TimeoutError)
        return True

    def login(self, user: str = ALICE, password: str = ALICE_PASSWORD) -> list[tuple[str, bytes]]:
        self.startup(user)
        kind, body = self.read()
        assert kind == "R" and struct.unpack("!i", body[:4])[0] == 10
        client = scramp.ScramClient(["SCRAM-SHA-256"], user, password)
        first = client.get_client_first().encode()
        self.send(msg("p", cstr("SCRAM-SHA-256") + struct.pack("!i", len(first)) + first))
        kind, body = self.read()
        assert kind == "R" and struct.unpack("!i", body[:4])[0] == 11
        client.set_server_first(body[4:].decode())
        self.send(msg("p", client.get_client_final().encode()))
        kind, body = self.read()
        assert kind == "R" and struct.unpack("!i", body[:4])[0] == 12
        client.set_server_final(body[4:].decode())
        messages = self.read_until("Z")
        for kind, body in messages:
            if kind == "S":
                name, value, _ = body.split(b"\x00")
                self.parameters[name.decode()] = value.decode()
            elif kind == "K":
                self.key = struct.unpack("!ii", body)
        return messages


def kinds(messages: list[tuple[str, bytes]]) -> str:
    return "".join(k for k, _ in messages)


def test_startup_reports_parameters_and_a_cancel_key(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        messages = raw.login()
        assert messages[0] == ("R", struct.pack("!i", 0))  # AuthenticationOk
        assert messages[-1] == ("Z", b"I")
        assert raw.parameters["server_version"] == "15.0 (dpproxy 0.1)"
        assert raw.parameters["server_version"].split()[0] == "15.0"
        expected = {
            "server_encoding": "UTF8",
            "client_encoding": "UTF8",
            "DateStyle": "ISO, MDY",
            "TimeZone": "UTC",
            "integer_datetimes": "on",
            "standard_conforming_strings": "on",
            "IntervalStyle": "postgres",
            "is_superuser": "off",
            "session_authorization": "alice",
            "application_name": "",
        }
        assert expected.items() <= raw.parameters.items()
        assert raw.key is not None and raw.key[0] > 0


def test_describe_before_bind_runs_nothing(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        before = duck_proxy.spent()
        raw.send(
            parse("s1", "SELECT sex, COUNT(*), AVG(income) FROM patients WHERE age > $1 GROUP BY sex"),
            describe("S", "s1"),
            SYNC,
        )
        messages = raw.read_until("Z")
        assert kinds(messages) == "1tTZ"
        assert struct.unpack("!hI", messages[1][1]) == (1, 23)  # $1 inferred as integer (age)
        assert row_names(messages[2][1]) == ["sex", "count", "avg"]
        assert duck_proxy.spent() == before
        # Bind and Execute run it, once.
        raw.send(bind("", "s1", (b"30",)), execute(""), SYNC)
        messages = raw.read_until("Z")
        assert kinds(messages) == "2NDDDCZ"
        assert duck_proxy.spent() == pytest.approx(before + 0.5)


def test_execute_with_a_row_limit_suspends_the_portal(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        raw.send(
            parse("", "SELECT department, COUNT(*) FROM visits GROUP BY department ORDER BY department"),
            bind("p", ""),
            describe("P", "p"),
            execute("p", 3),
            msg("H"),  # Flush: the answers so far arrive without a Sync
        )
        messages = [raw.read() for _ in range(8)]
        assert kinds(messages) == "12TNDDDs"
        raw.send(execute("p", 0), SYNC)
        messages = raw.read_until("Z")
        assert kinds(messages) == "DDDDDCZ"
        assert messages[-2][1] == cstr("SELECT 8")
        # After Sync the portal is gone (the implicit transaction ended).
        raw.send(execute("p", 0), SYNC)
        messages = raw.read_until("Z")
        assert kinds(messages) == "EZ" and error_fields(messages[0][1])["C"] == "34000"


def test_an_error_skips_messages_until_sync(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        raw.send(
            parse("", "SELECT patient_id FROM patients"),
            bind("", ""),
            execute(""),
            parse("", "SELECT 1"),
            SYNC,
        )
        messages = raw.read_until("Z")
        assert kinds(messages) == "EZ" and error_fields(messages[0][1])["C"] == "42501"
        # The connection works again after Sync.
        raw.send(parse("", "SELECT 1 AS one"), bind("", ""), execute(""), SYNC)
        assert kinds(raw.read_until("Z")) == "12DCZ"
        # In a transaction block, an error leaves it failed until ROLLBACK.
        raw.send(msg("Q", cstr("BEGIN")))
        assert raw.read_until("Z")[-1] == ("Z", b"T")
        raw.send(msg("Q", cstr("SELECT no_such_column FROM zip_info")))
        assert raw.read_until("Z")[-1] == ("Z", b"E")
        raw.send(msg("Q", cstr("SELECT 1")))
        messages = raw.read_until("Z")
        assert error_fields(messages[0][1])["C"] == "25P02" and messages[-1] == ("Z", b"E")
        raw.send(msg("Q", cstr("ROLLBACK")))
        assert raw.read_until("Z")[-1] == ("Z", b"I")


def test_binary_parameters_and_results(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        raw.send(
            parse(
                "", "SELECT zip, population FROM zip_info WHERE population > $1 ORDER BY zip LIMIT 2", (20,)
            ),
            msg(
                "B",
                cstr("")
                + cstr("")
                + struct.pack("!hh", 1, 1)
                + struct.pack("!hiq", 1, 8, 0)
                + struct.pack("!hh", 1, 1),
            ),
            execute(""),
            SYNC,
        )
        messages = raw.read_until("Z")
        assert kinds(messages) == "12DDCZ"
        zip_code, population = data_row(messages[2][1])
        assert zip_code is not None and population is not None and len(population) == 4  # int4, binary
        assert struct.unpack("!i", population)[0] > 0


def test_empty_query_and_unsupported_messages(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        raw.send(msg("Q", cstr("")))
        assert kinds(raw.read_until("Z")) == "IZ"
        raw.send(msg("Q", cstr(" ; -- nothing\n")))
        assert kinds(raw.read_until("Z")) == "IZ"
        raw.send(msg("F", struct.pack("!i", 1234) + struct.pack("!hhh", 0, 0, 0)))
        messages = raw.read_until("Z")
        assert error_fields(messages[0][1])["C"] == "0A000"
        raw.send(msg("d", b"stray copy data"), msg("c"), msg("Q", cstr("SELECT 1")))
        assert kinds(raw.read_until("Z")) == "TDCZ"
        raw.send(msg("X"))
        assert raw.closed()


@pytest.mark.parametrize(
    ("name", "payload"),
    [
        ("unknown message type", msg("!", b"xyz")),
        ("negative length", b"Q" + struct.pack("!i", -5)),
        ("length below four", b"Q" + struct.pack("!i", 2)),
        ("oversized message", b"Q" + struct.pack("!i", 2**31 - 1) + b"SELECT"),
        ("bad Bind counts", msg("B", cstr("") + cstr("") + struct.pack("!h", -3))),
        ("unterminated string", msg("Q", b"SELECT 1")),
        (
            "bad format code",
            msg("B", cstr("") + cstr("") + struct.pack("!hh", 1, 7) + struct.pack("!hh", 0, 0)),
        ),
    ],
)
def test_malformed_input_closes_only_that_connection(duck_proxy: Proxy, name: str, payload: bytes) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        raw.send(payload)
        kind, body = raw.read()
        assert kind == "E" and error_fields(body)["S"] == "FATAL" and error_fields(body)["C"] == "08P01", name
        assert raw.closed()
    with duck_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_malformed_startup_and_truncated_messages(duck_proxy: Proxy) -> None:
    for packet in (
        struct.pack("!i", 100_000) + struct.pack("!i", codec.PROTOCOL_3_0),  # startup packet too long
        struct.pack("!ii", 8, 1234),  # unknown protocol 0.1234
        struct.pack("!ii", 12, codec.PROTOCOL_3_0) + b"user",  # no terminator
    ):
        with RawClient(duck_proxy.port) as raw:
            raw.send(packet)
            kind, body = raw.read()
            assert kind == "E" and error_fields(body)["S"] == "FATAL"
            assert raw.closed()
    # A client that hangs up in the middle of a message, before and after authenticating.
    for authenticated in (False, True):
        with RawClient(duck_proxy.port) as raw:
            if authenticated:
                raw.login()
                raw.send(b"Q" + struct.pack("!i", 100) + b"SELECT")
            else:
                raw.send(struct.pack("!i", 60) + b"\x00\x03")
    with duck_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_random_bytes_after_startup_never_kill_the_server(duck_proxy: Proxy) -> None:
    rng = random.Random(20240601)
    for _ in range(40):
        with RawClient(duck_proxy.port) as raw:
            raw.login()
            raw.sock.settimeout(2)
            blob = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
            if rng.random() < 0.5:  # a plausible type byte makes the fuzz reach the decoders
                blob = (
                    rng.choice(b"QPBDECSHXpdcfF").to_bytes(1, "big") + struct.pack("!i", len(blob) + 4) + blob
                )
            with contextlib.suppress(OSError):
                raw.send(blob, SYNC)
                with contextlib.suppress(ConnectionError, OSError):
                    while raw.read()[0] != "Z":
                        pass
    with duck_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SELECT COUNT(*) FROM visits").fetchone()[0] > 0  # type: ignore[index]


def test_unauthenticated_clients_never_reach_the_engine(duck_proxy: Proxy) -> None:
    before = duck_proxy.spent()
    with RawClient(duck_proxy.port) as raw:
        raw.startup(ALICE)
        assert raw.read()[0] == "R"
        raw.send(msg("Q", cstr("SELECT COUNT(*) FROM patients")))
        kind, body = raw.read()
        assert kind == "E" and error_fields(body)["C"] == "08P01"
        assert raw.closed()
    assert duck_proxy.spent() == before


def test_negotiation_packets_and_protocol_versions(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.send(
            struct.pack("!ii", 8, codec.GSSENC_REQUEST_CODE), struct.pack("!ii", 8, codec.SSL_REQUEST_CODE)
        )
        answers = raw.sock.recv(2)
        answers += raw.sock.recv(2 - len(answers))
        assert answers == b"NN"  # no GSSAPI, no TLS configured: the client goes on in clear
        raw.startup(ALICE)
        assert raw.read()[0] == "R"
    # A newer minor version (3.2) and a protocol extension are answered with what the server speaks.
    with RawClient(duck_proxy.port) as raw:
        body = (
            struct.pack("!i", (3 << 16) | 2)
            + cstr("user")
            + cstr(ALICE)
            + cstr("_pq_.fancy")
            + cstr("1")
            + b"\x00"
        )
        raw.send(struct.pack("!i", len(body) + 4) + body)
        kind, body = raw.read()
        assert kind == "v" and body == struct.pack("!ii", 0, 1) + cstr("_pq_.fancy")
        assert raw.read()[0] == "R"
    # Protocol 2 is refused.
    with RawClient(duck_proxy.port) as raw:
        raw.send(struct.pack("!ii", 8, 2 << 16))
        kind, body = raw.read()
        assert kind == "E" and error_fields(body)["C"] == "0A000"
        assert raw.closed()


def test_startup_options_and_client_encoding(duck_proxy: Proxy) -> None:
    options = "-c search_path=public -c dpproxy.epsilon=0.3 --application_name=from\\\\ options"
    with psycopg.connect(duck_proxy.dsn(options=f"'{options}'"), autocommit=True) as conn:
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.3",)
        assert conn.execute("SHOW search_path").fetchone() == ("public",)
        assert conn.info.parameter_status("application_name") == "from options"
    for bad, message in (
        ("client_encoding=LATIN1", 'client_encoding "LATIN1" is not supported'),
        ("options='-c dpproxy.epsilon=50'", "outside the range the policy allows"),
        ("options='-c server_version=9.6'", 'parameter "server_version" cannot be changed'),
    ):
        with pytest.raises(psycopg.OperationalError) as caught:
            psycopg.connect(duck_proxy.dsn() + " " + bad)
        assert message in str(caught.value)
    with psycopg.connect(duck_proxy.dsn(client_encoding="UTF8"), autocommit=True) as conn:
        assert conn.info.encoding == "utf-8"


def test_extended_protocol_corner_cases(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        raw.send(parse("two", "SELECT 1; SELECT 2"), SYNC)
        messages = raw.read_until("Z")
        assert error_fields(messages[0][1])["C"] == "42601"
        # SHOW described before it runs; a named statement cannot be parsed twice; Close is idempotent.
        raw.send(
            parse("show", "SHOW dpproxy.epsilon"), describe("S", "show"), parse("show", "SELECT 1"), SYNC
        )
        messages = raw.read_until("Z")
        assert kinds(messages) == "1tTEZ" and row_names(messages[2][1]) == ["dpproxy.epsilon"]
        assert error_fields(messages[3][1])["C"] == "42P05"
        raw.send(
            msg("C", b"S" + cstr("show")), msg("C", b"S" + cstr("show")), msg("C", b"P" + cstr("nope")), SYNC
        )
        assert kinds(raw.read_until("Z")) == "333Z"
        raw.send(bind("", "show"), SYNC)
        messages = raw.read_until("Z")
        assert error_fields(messages[0][1])["C"] == "26000"
        # Wrong number of parameters.
        raw.send(parse("", "SELECT COUNT(*) FROM patients WHERE age > $1"), bind("", "", ()), SYNC)
        messages = raw.read_until("Z")
        assert kinds(messages) == "1EZ" and error_fields(messages[1][1])["C"] == "08P01"
        # A bad parameter value is an ordinary error.
        raw.send(bind("", "", (b"not a number",)), SYNC)
        messages = raw.read_until("Z")
        assert error_fields(messages[0][1])["C"] == "22P02"
        # An empty statement executes to EmptyQueryResponse.
        raw.send(parse("", ""), bind("", ""), describe("P", ""), execute(""), SYNC)
        assert kinds(raw.read_until("Z")) == "12nIZ"


def test_idle_and_startup_timeouts(demo_duckdb: Path, tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "policy.yaml")
    backend = private_copy(demo_duckdb, tmp_path)
    with running_proxy(
        policy, backend, tmp_path / "l.sqlite", idle_timeout=0.5, startup_timeout=0.5
    ) as proxy:
        with RawClient(proxy.port) as raw:
            raw.login()
            kind, body = raw.read()  # nothing sent: the server gives up on the idle session
            assert kind == "E" and error_fields(body)["C"] == "57P05"
            assert raw.closed()
        with RawClient(proxy.port) as raw:
            raw.startup(ALICE)
            assert raw.read()[0] == "R"  # and then never answers the authentication request
            kind, body = raw.read()
            assert kind == "E" and error_fields(body)["S"] == "FATAL"
            assert raw.closed()


def test_tls_when_a_certificate_is_configured(demo_duckdb: Path, tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    policy = write_policy(tmp_path / "policy.yaml")
    backend = private_copy(demo_duckdb, tmp_path)
    with running_proxy(policy, backend, tmp_path / "l.sqlite", tls_cert=cert, tls_key=key) as proxy:
        with psycopg.connect(proxy.dsn(sslmode="require"), autocommit=True) as conn:
            assert conn.pgconn.ssl_in_use
            assert conn.execute("SELECT COUNT(*) FROM patients").fetchone()[0] > 0  # type: ignore[index]
        with psycopg.connect(proxy.dsn(sslmode="disable"), autocommit=True) as conn:
            assert not conn.pgconn.ssl_in_use
        # Bytes sent after SSLRequest, before the handshake, are refused (CVE-2021-23214).
        with RawClient(proxy.port) as raw:
            raw.send(struct.pack("!ii", 8, codec.SSL_REQUEST_CODE) + msg("Q", cstr("SELECT 1")))
            reply = raw.sock.recv(1)
            assert reply in (b"E", b"")


def test_a_hundred_concurrent_connections(duck_proxy: Proxy) -> None:
    async def one(i: int) -> int:
        async with await psycopg.AsyncConnection.connect(duck_proxy.dsn(), autocommit=True) as conn:
            cur = await conn.execute("SELECT COUNT(*) FROM patients WHERE age > %s", [i % 50])
            (count,) = await cur.fetchone()  # type: ignore[misc]
            return count

    async def main() -> list[int]:
        return await asyncio.gather(*(one(i) for i in range(100)))

    before = duck_proxy.spent()
    counts = asyncio.run(main())
    assert len(counts) == 100 and all(isinstance(c, int) for c in counts)
    assert duck_proxy.spent() == pytest.approx(before + 50)


# --- text and binary encodings against PostgreSQL itself ------------------------------------------------


@pytest.fixture(scope="module")
def pg_raw(pg_cluster) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        yield conn


def _pg_output(conn: psycopg.Connection, sql: str, param: str, fmt: int) -> bytes:
    result = conn.pgconn.exec_params(sql.encode(), [param.encode()], result_format=fmt)
    assert result.status == psycopg.pq.ExecStatus.TUPLES_OK, result.error_message
    value = result.get_value(0, 0)
    assert value is not None
    return bytes(value)


_floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [0.0, -0.0, 1e15, 1e14, 123456789012345.0, 1e-4, 1e-5, 0.1, 1 / 3, 1e300, 5e-324, 2.5e-310, 100.0]
)


@given(value=_floats)
def test_float_output_is_postgresql_s(pg_raw: psycopg.Connection, value: float) -> None:
    text = repr(value)
    assert types.encoder(701, 0)(value) == _pg_output(pg_raw, "SELECT $1::float8", text, 0)
    assert types.encoder(701, 1)(value) == _pg_output(pg_raw, "SELECT $1::float8", text, 1)
    single = struct.unpack("!f", struct.pack("!f", value))[0] if abs(value) < 3.4e38 else 1.5
    if math.isfinite(single):
        assert types.encoder(700, 0)(single) == _pg_output(pg_raw, "SELECT $1::float4", repr(single), 0)


_decimals = st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(
    lambda d: abs(d.adjusted()) < 120
) | st.sampled_from(
    [Decimal("0"), Decimal("-0.00"), Decimal("1E+3"), Decimal("0.0001"), Decimal("12345.6789")]
)


@given(value=_decimals)
def test_numeric_output_is_postgresql_s(pg_raw: psycopg.Connection, value: Decimal) -> None:
    text = format(value, "f")
    assert types.encoder(1700, 0)(value) == _pg_output(pg_raw, "SELECT $1::numeric", text, 0)
    binary = _pg_output(pg_raw, "SELECT $1::numeric", text, 1)
    assert types.encoder(1700, 1)(value) == binary
    assert types.decoder(1700, 1)(binary) == value


def test_special_numerics_and_floats_match_postgresql(pg_raw: psycopg.Connection) -> None:
    for text in ("NaN", "Infinity", "-Infinity"):
        for fmt in (0, 1):
            assert types.encoder(1700, fmt)(Decimal(text)) == _pg_output(
                pg_raw, "SELECT $1::numeric", text, fmt
            )
            assert types.encoder(701, fmt)(float(text)) == _pg_output(pg_raw, "SELECT $1::float8", text, fmt)


_datetimes = st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31))


@given(value=_datetimes)
def test_dates_and_timestamps_match_postgresql(pg_raw: psycopg.Connection, value: dt.datetime) -> None:
    text = value.isoformat(sep=" ")
    for fmt in (0, 1):
        assert types.encoder(1114, fmt)(value) == _pg_output(pg_raw, "SELECT $1::timestamp", text, fmt)
        assert types.encoder(1082, fmt)(value.date()) == _pg_output(pg_raw, "SELECT $1::date", text[:10], fmt)
        aware = value.replace(tzinfo=dt.UTC)
        assert types.encoder(1184, fmt)(aware) == _pg_output(
            pg_raw, "SELECT $1::timestamptz", text + "+00", fmt
        )
    assert types.decoder(1114, 1)(types.encoder(1114, 1)(value)) == value


def test_timestamptz_follows_the_session_time_zone(pg_raw: psycopg.Connection) -> None:
    from dpproxy.wire.settings import zone

    value = dt.datetime(2024, 7, 1, 12, 30, 15, 250000, tzinfo=dt.UTC)
    for name in ("Europe/Paris", "Asia/Kolkata", "America/St_Johns", "UTC"):
        pg_raw.execute(f"SET TimeZone = '{name}'")
        expected = _pg_output(pg_raw, "SELECT $1::timestamptz", "2024-07-01 12:30:15.25+00", 0)
        assert types.encoder(1184, 0, types.TextFormat(1, zone(name)))(value) == expected
    pg_raw.execute("SET TimeZone = 'UTC'")


def test_text_arrays_and_vectors_match_postgresql(pg_raw: psycopg.Connection) -> None:
    value = ["a", "b c", "", None, "NULL", 'x"y', "back\\slash", "{}"]
    result = pg_raw.pgconn.exec_(
        b"SELECT ARRAY['a', 'b c', '', NULL, 'NULL', 'x\"y', 'back\\slash', '{}']::text[]"
    )
    assert types.encoder(1009, 0)(value) == bytes(result.get_value(0, 0))  # type: ignore[arg-type]
    result = pg_raw.pgconn.exec_params(b"SELECT '{1,2,3}'::oid[]", [], result_format=1)
    assert types.encoder(1028, 1)([1, 2, 3]) == bytes(result.get_value(0, 0))  # type: ignore[arg-type]
    assert types.decoder(1028, 1)(bytes(result.get_value(0, 0))) == [1, 2, 3]  # type: ignore[arg-type]
    result = pg_raw.pgconn.exec_params(b"SELECT '1 2'::int2vector", [], result_format=0)
    assert types.encoder(22, 0)([1, 2]) == bytes(result.get_value(0, 0))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("oid", "text", "value"),
    [
        (16, "t", True),
        (16, " yes ", True),
        (16, "of", False),
        (16, "0", False),
        (21, "-32768", -32768),
        (23, " 42 ", 42),
        (20, "9223372036854775807", 2**63 - 1),
        (701, "1e-3", 0.001),
        (701, "-Infinity", -math.inf),
        (1700, "12.50", Decimal("12.50")),
        (1082, "2024-02-29", dt.date(2024, 2, 29)),
        (1114, "2024-02-29 10:11:12.5", dt.datetime(2024, 2, 29, 10, 11, 12, 500000)),
        (1184, "2024-02-29 10:11:12+02", dt.datetime(2024, 2, 29, 8, 11, 12, tzinfo=dt.UTC)),
        (25, "any text", "any text"),
        (1009, '{a,"b,c",NULL}', ["a", "b,c", None]),
    ],
)
def test_text_parameters_decode_as_postgresql_reads_them(oid: int, text: str, value: object) -> None:
    assert types.decoder(oid, 0)(text.encode()) == value


@pytest.mark.parametrize(
    ("oid", "text", "sqlstate"),
    [
        (16, "o", "22P02"),
        (21, "32768", "22003"),
        (23, "4.5", "22P02"),
        (23, "1_000", "22P02"),
        (1700, "12,5", "22P02"),
        (1082, "29/02/2024", "22007"),
    ],
)
def test_bad_text_parameters_are_refused_with_postgresql_s_codes(oid: int, text: str, sqlstate: str) -> None:
    with pytest.raises(DPProxyError) as caught:
        types.decoder(oid, 0)(text.encode())
    assert caught.value.sqlstate == sqlstate and text in caught.value.message


def test_binary_parameters_round_trip_and_reject_bad_lengths() -> None:
    samples = {
        16: True,
        21: -5,
        23: 123456,
        20: -(2**40),
        700: 1.5,
        701: -2.25,
        1700: Decimal("-1234.000500"),
        1082: dt.date(1999, 12, 31),
        1114: dt.datetime(1970, 1, 1, 0, 0, 1),
        1184: dt.datetime(2038, 1, 19, 3, 14, 8, tzinfo=dt.UTC),
        25: "héllo",
        1028: [1, 2, None],
    }
    for oid, value in samples.items():
        assert types.decoder(oid, 1)(types.encoder(oid, 1)(value)) == value, oid
    for oid in (16, 21, 23, 20, 701, 1082, 1114):
        with pytest.raises(DPProxyError) as caught:
            types.decoder(oid, 1)(b"\x00\x01\x02")
        assert caught.value.sqlstate == "22P03"


# --- SIGTERM: a clean shutdown keeps the ledger exact ------------------------------------------------------


def _start_serve(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "dpproxy.cli", "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
    if match is None:
        process.kill()
        raise AssertionError(f"dpproxy serve did not start: {line!r} {process.communicate()[1]}")
    return process, int(match[1])


def test_sigterm_finishes_cleanly_and_the_ledger_matches_answers(tmp_path: Path, demo_duckdb: Path) -> None:
    policy = write_policy(tmp_path / "policy.yaml")
    ledger = tmp_path / "ledger.sqlite"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    process, port = _start_serve(
        [
            "--policy",
            str(policy),
            "--backend",
            str(demo_duckdb),
            "--ledger",
            str(ledger),
            "--shutdown-grace",
            "2",
        ],
        env,
    )
    try:
        reported = 0.0
        proxy = Proxy(port, None, "duckdb")  # type: ignore[arg-type]
        with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
            notices = notices_of(conn)
            for sql in (
                "SELECT COUNT(*) FROM patients",
                "SELECT AVG(age) FROM patients",
                "SELECT COUNT(*) FROM visits",
            ):
                conn.execute(sql)
            reported = sum(float(re.search(r"spent ε=([0-9.e-]+)", n)[1]) for n in notices)  # type: ignore[index]
            assert len(notices) == 3
            idle = psycopg.connect(proxy.dsn(), autocommit=True)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
            # The idle session was told why it is closed.
            with pytest.raises(psycopg.OperationalError):
                idle.execute("SELECT 1")
            idle.close()
    finally:
        if process.poll() is None:
            process.kill()
    with Engine.open(policy, None, ledger) as engine:
        assert engine.budget(ALICE).spent.epsilon == pytest.approx(reported)


def test_sigterm_cancels_a_running_query_after_the_grace_period(
    people: LockablePeople, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.sqlite"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    args = ["--policy", str(people.policy), "--backend", people.dsn, "--ledger", str(ledger)]
    # The clients of these tests connect to "demo"; serve answers to the backing database's name otherwise.
    process, port = _start_serve([*args, "--shutdown-grace", "1", "--database", "demo"], env)
    try:
        proxy = Proxy(port, None, "postgres")  # type: ignore[arg-type]
        with people.locked(), psycopg.connect(proxy.dsn(), autocommit=True) as conn:
            worker, outcome = run_in_thread(conn, "SELECT COUNT(*) FROM people")
            people.wait_until_blocked()
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            worker.join(30)
            # Still blocked when the grace period ended: cancelled, and charged since it had started.
            assert isinstance(outcome.get("error"), psycopg.errors.QueryCanceled)
            assert process.wait(timeout=30) == 0
            assert time.monotonic() - started >= 1.0
    finally:
        if process.poll() is None:
            process.kill()
    with Engine.open(people.policy, None, ledger) as engine:
        assert engine.budget(ALICE).spent.epsilon == pytest.approx(0.5)
