"""set_config over the wire: it really sets what SET would (the next private query's ε), checks and
refuses as SET does, as clients send it; functions that would act are refused.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import psycopg
import pytest

from tests.wire.proxy import Proxy, notices_of
from tests.wire.raw import (
    SYNC,
    RawClient,
    bind,
    cstr,
    data_row,
    describe,
    execute,
    kinds,
    msg,
    parse,
    row_names,
)

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
            # Numbers as PostgreSQL spells them: ASCII digits, no underscores (Python's int() takes both).
            ("SELECT set_config('dpproxy.epsilon', '0_5', false)", "22023", 'parameter "dpproxy.epsilon"'),
            (
                "SELECT set_config('dpproxy.max_rows_per_unit', '٣', false)",
                "22023",
                'parameter "dpproxy.max_rows_per_unit"',
            ),
            ("SELECT set_config('dpproxy.target_error', '1_0', false)", "22023", '"dpproxy.target_error"'),
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
