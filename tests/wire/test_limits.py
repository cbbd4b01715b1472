"""The statement limits (dpproxy.sql.limits) on the wire's side: the router and the shadow catalog
refuse a statement past them with 54001 before parsing it, the router's lexer reads any text in
linear time, a statement too deep for Python's recursion gets 54001 and never the internal error
(XX000), and over the wire a client gets 54001 in seconds and keeps its connection. Times are the
process's CPU seconds (the server runs in it): the shared test machine's load does not count."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType

import psycopg
import pytest
from sqlglot.dialects.dialect import Dialect

from dpproxy.engine import Engine
from dpproxy.errors import NotSupported, StatementTooComplex
from dpproxy.policy import load_policy
from dpproxy.sql import limits
from dpproxy.sql.statement import parse_statement
from dpproxy.wire.catalog import SessionInfo, open_catalog
from dpproxy.wire.catalog.interface import ShadowCatalog
from dpproxy.wire.router import Kind, route, tokenize
from dpproxy.wire.router.limits import checked_split, checked_tokens
from tests.wire.proxy import Proxy, private_copy, running_proxy, write_policy

POLICY = Path(__file__).resolve().parents[2] / "dpproxy" / "data" / "demo.yaml"
EXPOSED = {"patients", "visits", "zip_info"}
SESSION = SessionInfo(
    user="alice", database="demo", application_name="", backend_pid=1, settings=MappingProxyType({})
)


def in_list(n: int, table: str = "patients", column: str = "age") -> str:
    return (
        f"SELECT COUNT(*) FROM {table} WHERE {column} IN (" + ", ".join(str(i % 120) for i in range(n)) + ")"
    )


def or_chain(n: int, table: str = "patients", column: str = "age") -> str:
    return f"SELECT COUNT(*) FROM {table} WHERE " + " OR ".join(f"{column} = {i % 120}" for i in range(n))


def parens(n: int, table: str = "patients", column: str = "age") -> str:
    return f"SELECT COUNT(*) FROM {table} WHERE " + "(" * n + f"{column} > 1" + ")" * n


def refused(call: object, *args: object) -> StatementTooComplex:
    with pytest.raises(StatementTooComplex) as caught:
        call(*args)  # type: ignore[operator]
    assert caught.value.sqlstate == "54001"
    return caught.value


# -- the router --------------------------------------------------------------------------------------


def test_the_router_refuses_a_100000_item_in_list_within_seconds() -> None:
    started = time.process_time()
    error = refused(route, in_list(100_000), EXPOSED)
    assert time.process_time() - started < 5
    assert "more than 10000 items in one IN list" in error.message
    assert "more than 10000 items in one IN list" in refused(checked_split, in_list(100_000)).message


@pytest.mark.parametrize("sql", [parens(3000), or_chain(20_000)], ids=["3000 parentheses", "20000-term OR"])
def test_the_router_refuses_deep_statements(sql: str) -> None:
    refused(route, sql, EXPOSED)
    refused(route, "EXPLAIN " + sql, EXPOSED)
    refused(route, f"COPY ({sql}) TO STDOUT", EXPOSED)


def test_the_router_routes_what_bi_tools_send() -> None:
    assert route(in_list(1000), EXPOSED).kind is Kind.ENGINE
    assert route(or_chain(100), EXPOSED).kind is Kind.ENGINE
    assert route(or_chain(100, "pg_class", "oid"), EXPOSED).kind is Kind.CATALOG


def test_statements_inside_statements_are_read_once() -> None:
    """EXPLAIN EXPLAIN … (or COPY, DECLARE, PREPARE inside one another) used to be routed once per
    word, each time lexing the rest again: quadratic, and recursive past Python's limit."""
    started = time.process_time()
    with pytest.raises(NotSupported, match="EXPLAIN is supported for queries on exposed tables only"):
        route("EXPLAIN " * 4000 + "SELECT COUNT(*) FROM patients", EXPOSED)
    with pytest.raises(Exception, match="needs a query"):
        route("PREPARE p AS " + "PREPARE p AS " * 1000 + "SELECT 1", EXPOSED)
    assert time.process_time() - started < 5
    explained = route("EXPLAIN SELECT COUNT(*) FROM patients", EXPOSED)
    assert explained.kind is Kind.EXPLAIN and explained.inner is not None
    assert explained.inner.kind is Kind.ENGINE


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1 " + "+" * 900_000 + " 1",  # one operator per dropped sign, no longer a rescan each
        "SELECT E'" + "\\1" * 250_000 + "'",  # escapes matched in place, no longer a slice each
        "SELECT '" + "a''" * 300_000 + "'",
        "SELECT " + "operator(" * 20_000,  # OPERATOR(…)'s ')' looked for nearby, not to the end
    ],
    ids=["sign run", "escapes", "doubled quotes", "operator("],
)
def test_the_lexer_and_router_take_linear_time(sql: str) -> None:
    started = time.process_time()
    with contextlib.suppress(StatementTooComplex):
        route(sql, EXPOSED)
    assert time.process_time() - started < 5


def test_dropped_signs_are_operators_of_their_own() -> None:
    def texts(sql: str) -> list[str]:
        return [t.text for t in tokenize(sql)]

    assert texts("a=-1") == ["a", "=", "-", "1"]
    assert texts("a *+-b") == ["a", "*", "+", "-", "b"]
    assert texts("x +++ y") == ["x", "+", "+", "+", "y"]
    assert texts("a !=-+1") == ["a", "!=-+", "1"]  # with ! the signs stay in the operator
    assert texts("a+/*c*/-b") == ["a", "+", "-", "b"]
    assert [t.value for t in tokenize(r"SELECT E'\101\x42\n', 'it''s'")][1::2] == ["AB\n", "it's"]


def test_the_router_counts_the_limits_as_the_engine_does() -> None:
    """The router counts on its own lexer's tokens, the engine on sqlglot's: the same verdicts."""
    postgres = Dialect.get_or_raise("postgres")
    for sql, needle in [
        (in_list(10_001), "items in one IN list"),
        (parens(101), "levels deep"),
        (or_chain(1700), "words"),
    ]:
        assert needle in refused(parse_statement, sql).message
        assert needle in refused(checked_tokens, sql).message
    for sql in (in_list(10_000), parens(100), or_chain(1200)):
        router = len(checked_tokens(sql))
        engine = limits.check_sqlglot_tokens(postgres.tokenize(sql)).tokens
        assert router == engine


# -- the shadow catalog ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def catalog() -> Iterator[ShadowCatalog]:
    shadow = open_catalog(Engine(load_policy(POLICY), None))
    try:
        yield shadow
    finally:
        shadow.close()


@pytest.mark.parametrize(
    "sql",
    [parens(3000, "pg_class", "oid"), or_chain(20_000, "pg_class", "oid"), or_chain(300, "pg_class", "oid")],
    ids=["3000 parentheses", "20000-term OR", "300-term OR (too deep to type)"],
)
def test_the_catalog_refuses_deep_statements(catalog: ShadowCatalog, sql: str) -> None:
    refused(catalog.execute, sql, [], SESSION)
    refused(catalog.describe, sql, [], SESSION)


def test_the_catalog_answers_what_clients_send(catalog: ShadowCatalog) -> None:
    assert catalog.execute(or_chain(100, "pg_class", "oid"), [], SESSION).rows == [(0,)]
    assert catalog.execute(in_list(1000, "pg_class", "oid"), [], SESSION).rows == [(0,)]


# -- over the wire -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def proxy(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    tmp = tmp_path_factory.mktemp("wire-limits")
    backend = private_copy(demo_duckdb, tmp)
    with running_proxy(write_policy(tmp / "policy.yaml"), backend, tmp / "ledger.sqlite") as running:
        yield running


def sqlstate(conn: psycopg.Connection, sql: str, *, simple: bool) -> str | None:
    cursor = psycopg.ClientCursor(conn) if simple else conn.cursor()
    try:
        cursor.execute(sql)  # the simple query protocol (ClientCursor), or Parse/Bind/Execute
        cursor.fetchall()
    except psycopg.Error as error:
        return error.sqlstate
    return None


@pytest.mark.parametrize("simple", [True, False], ids=["simple", "extended"])
def test_a_client_gets_54001_for_a_100000_item_in_list_within_seconds(proxy: Proxy, simple: bool) -> None:
    with proxy.connect(autocommit=True) as conn:
        started = time.process_time()
        assert sqlstate(conn, in_list(100_000), simple=simple) == "54001"
        assert time.process_time() - started < 5
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the connection goes on


@pytest.mark.parametrize("simple", [True, False], ids=["simple", "extended"])
@pytest.mark.parametrize(
    "sql",
    [
        parens(3000),
        or_chain(20_000),
        or_chain(1000),
        parens(3000, "pg_class", "oid"),
        or_chain(20_000, "pg_class", "oid"),
        or_chain(300, "pg_class", "oid"),
    ],
    ids=[
        "engine 3000 parentheses",
        "engine 20000-term OR",
        "engine 1000-term OR",
        "catalog 3000 parentheses",
        "catalog 20000-term OR",
        "catalog 300-term OR",
    ],
)
def test_a_client_gets_54001_not_xx000_for_deep_statements(proxy: Proxy, sql: str, simple: bool) -> None:
    with proxy.connect(autocommit=True) as conn:
        assert sqlstate(conn, sql, simple=simple) == "54001"
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_what_bi_tools_send_is_answered(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        (count,) = conn.execute(in_list(1000)).fetchone()  # type: ignore[misc]
        assert count > 0
        (count,) = conn.execute(or_chain(100)).fetchone()  # type: ignore[misc]
        assert count > 0
        assert conn.execute(or_chain(100, "pg_class", "oid")).fetchone() == (0,)


def test_a_recursion_error_anywhere_reaches_the_client_as_54001(
    proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backstop: whatever step of the engine would recurse too deep, the client gets 54001."""

    def too_deep(*args: object, **kwargs: object) -> object:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(proxy.engine, "execute", too_deep)
    with proxy.connect(autocommit=True) as conn:
        with pytest.raises(psycopg.errors.StatementTooComplex) as caught:
            conn.execute("SELECT COUNT(*) FROM patients")
        assert "nested too deeply" in str(caught.value)
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_session_keeps_at_most_session_limit_prepared_statements_and_cursors(
    proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each kept statement or portal holds memory of the server every session shares: an analyst's
    session could otherwise grow it without bound (0.86 MB per Parse in an adversarial review)."""
    from dpproxy.wire.session import portals

    monkeypatch.setattr(portals, "SESSION_LIMIT", 3)
    with proxy.connect(autocommit=True) as conn:
        for i in range(3):
            conn.execute(f"PREPARE p{i} AS SELECT {i}")
        with pytest.raises(psycopg.errors.ProgramLimitExceeded) as caught:
            conn.execute("PREPARE p3 AS SELECT 3")
        assert "already keeps 3 prepared statements" in str(caught.value)
        assert caught.value.diag.message_hint == "DEALLOCATE the ones no longer needed"
        conn.execute("DEALLOCATE p0")
        conn.execute("PREPARE p3 AS SELECT 3")
        conn.execute("BEGIN")
        for i in range(3):
            conn.execute(f"DECLARE c{i} CURSOR FOR SELECT zip FROM zip_info")
        with pytest.raises(psycopg.errors.ProgramLimitExceeded):
            conn.execute("DECLARE c3 CURSOR FOR SELECT zip FROM zip_info")
        conn.execute("ROLLBACK")


def test_one_address_cannot_hold_every_connection_slot_before_logging_in(
    demo_duckdb: Path, tmp_path: Path
) -> None:
    """Idle sockets that never log in each wait startup_timeout: without a cap per address, one host
    with no credentials took every slot of max_connections from the analysts."""
    import socket

    backend = private_copy(demo_duckdb, tmp_path)
    policy = write_policy(tmp_path / "policy.yaml")
    with running_proxy(policy, backend, tmp_path / "ledger.sqlite", max_pending_per_address=3) as proxy:
        idle = [socket.create_connection(("127.0.0.1", proxy.port)) for _ in range(3)]
        try:
            time.sleep(0.3)  # accepted
            with pytest.raises(psycopg.OperationalError, match="too many clients"):
                psycopg.connect(proxy.dsn(), connect_timeout=5).close()
        finally:
            for sock in idle:
                sock.close()
        time.sleep(0.3)
        sessions = [psycopg.connect(proxy.dsn()) for _ in range(4)]  # logged-in sessions do not count
        assert sessions[-1].execute("SELECT 1").fetchone() == (1,)
        for session in sessions:
            session.close()
