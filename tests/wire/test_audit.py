"""The audit log over the wire: every statement a real client sends (psycopg, simple and extended
protocol) leaves one record in the ledger's audit table, with its kind, status, SQLSTATE, the cost
the NOTICE announced, the rows released, its parameters apart from its text; on DuckDB and on
PostgreSQL backends, read back through `Ledger.audit_entries`.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dpproxy.audit import AuditEntry
from tests.wire.proxy import Proxy, notices_of, private_copy, running_proxy, write_policy


@pytest.fixture(params=["duckdb", "postgres"])
def proxy(request: pytest.FixtureRequest, demo_duckdb: Path, tmp_path: Path) -> Iterator[Proxy]:
    if request.param == "duckdb":
        backend = private_copy(demo_duckdb, tmp_path)
    else:
        backend = request.getfixturevalue("demo_pg_dsn")
    with running_proxy(write_policy(tmp_path / "policy.yaml"), backend, tmp_path / "ledger.sqlite") as proxy:
        yield proxy


def records(proxy: Proxy, session_id: str | None = None) -> list[AuditEntry]:
    """The records written so far (oldest first), of one session if given."""
    proxy.engine.flush_audit()
    assert proxy.engine.ledger is not None
    entries = list(reversed(proxy.engine.ledger.audit_entries(limit=10_000)))
    if session_id is not None:
        entries = [e for e in entries if e.session_id == session_id]
    return entries


def _peer(conn: psycopg.Connection) -> int:
    """The client side's port of a connection: the port its records' client address ends with."""
    fd = conn.pgconn.socket
    s = socket.socket(fileno=fd)
    try:
        return int(s.getsockname()[1])
    finally:
        s.detach()


def charged(notice: str) -> float:
    match = re.search(r"spent ε=([0-9.e-]+)", notice)
    assert match is not None, notice
    return float(match.group(1))


def test_simple_protocol_statements_of_every_kind_are_recorded(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        notices = notices_of(conn)
        port = _peer(conn)
        cur = psycopg.ClientCursor(conn)
        cur.execute("SELECT COUNT(*) FROM patients")  # private
        cur.execute("SELECT zip, city FROM zip_info ORDER BY zip LIMIT 3")  # public
        cur.execute("SELECT 1 + 1")  # no table: the shadow catalog answers
        cur.execute("SET application_name = 'audit'")  # session
        cur.execute("SHOW dpproxy.epsilon")
        cur.execute("SELECT relname FROM pg_class LIMIT 1")  # catalog
        cur.execute("EXPLAIN SELECT COUNT(*) FROM visits")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            cur.execute("SELECT patient_id FROM patients")  # policy refusal
        with pytest.raises(psycopg.errors.SyntaxError):
            cur.execute("SELEC 1")  # parse error
        cur.execute("BEGIN")
        cur.execute("DECLARE c CURSOR FOR SELECT sex, COUNT(*) FROM patients GROUP BY sex")
        cur.execute("FETCH 1 FROM c")
        cur.execute("CLOSE c")
        cur.execute("COMMIT")
    mine = [e for e in records(proxy) if e.client == f"127.0.0.1:{port}"]
    shown = [(e.statement, e.kind, e.status, e.sqlstate) for e in mine]
    assert shown == [
        ("SELECT COUNT(*) FROM patients", "private", "ok", None),
        ("SELECT zip, city FROM zip_info ORDER BY zip LIMIT 3", "public", "ok", None),
        ("SELECT 1 + 1", "catalog", "ok", None),
        ("SET application_name = 'audit'", "session", "ok", None),
        ("SHOW dpproxy.epsilon", "session", "ok", None),
        ("SELECT relname FROM pg_class LIMIT 1", "catalog", "ok", None),
        ("EXPLAIN SELECT COUNT(*) FROM visits", "explain", "ok", None),
        ("SELECT patient_id FROM patients", "query", "refused", "42501"),
        ("SELEC 1", "query", "refused", "42601"),
        ("BEGIN", "transaction", "ok", None),
        ("DECLARE c CURSOR FOR SELECT sex, COUNT(*) FROM patients GROUP BY sex", "cursor", "ok", None),
        ("FETCH 1 FROM c", "cursor", "ok", None),
        ("CLOSE c", "cursor", "ok", None),
        ("COMMIT", "transaction", "ok", None),
    ]
    assert [e.statement_id for e in mine] == list(range(1, len(mine) + 1))
    assert len({e.session_id for e in mine}) == 1 and re.fullmatch(r"[0-9a-f]{16}", mine[0].session_id)
    assert {e.analyst for e in mine} == {"alice"}
    # The costs are those the notices announced; free statements cost nothing.
    costs = [charged(n) for n in notices if "spent ε=" in n]
    private, public, declared = mine[0], mine[1], mine[10]
    assert [private.cost.epsilon, declared.cost.epsilon] == costs == [0.5, 0.5]
    assert private.entry_id is not None and declared.entry_id is not None
    assert all(e.cost.epsilon == 0 and e.entry_id is None for e in mine if e not in (private, declared))
    # Rows released: counted, never kept.
    assert (private.rows, public.rows, mine[11].rows) == (1, 3, 1)
    assert set(private.stages) >= {"plan", "backend", "noise", "wire"}
    assert set(public.stages) >= {"plan", "backend", "wire"}
    assert all(e.duration is not None and e.duration > 0 for e in mine)
    assert private.duration >= private.stages["backend"]


def test_extended_protocol_keeps_parameters_apart(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        port = _peer(conn)
        sql = "SELECT COUNT(*) FROM patients WHERE age > %s AND sex = %s"
        conn.execute(sql, [40, "F"], prepare=True)
        conn.execute("SELECT zip FROM zip_info WHERE zip > %s ORDER BY zip LIMIT %s", ["0", 2])
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT income FROM patients WHERE age = %s", [30])  # refused at Parse
        with pytest.raises(psycopg.errors.SyntaxError):
            conn.execute("SELECT COUNT(*) FROM patients WHERE age > %s AND", [1])
        conn.execute("PREPARE q(int) AS SELECT COUNT(*) FROM visits WHERE cost > $1")
        conn.execute("EXECUTE q(100)")
        with conn.cursor().copy("COPY (SELECT sex, COUNT(*) FROM patients GROUP BY sex) TO STDOUT") as copy:
            copied = len(list(copy.rows()))
    mine = [e for e in records(proxy) if e.client == f"127.0.0.1:{port}"]
    shown = [(e.statement, e.parameters, e.kind, e.status, e.sqlstate) for e in mine]
    assert shown == [
        ("SELECT COUNT(*) FROM patients WHERE age > $1 AND sex = $2", (40, "F"), "private", "ok", None),
        ("SELECT zip FROM zip_info WHERE zip > $1 ORDER BY zip LIMIT $2", ("0", 2), "public", "ok", None),
        ("SELECT income FROM patients WHERE age = $1", (), "query", "refused", "42501"),
        ("SELECT COUNT(*) FROM patients WHERE age > $1 AND", (), "query", "refused", "42601"),
        ("PREPARE q(int) AS SELECT COUNT(*) FROM visits WHERE cost > $1", (), "prepared", "ok", None),
        ("EXECUTE q(100)", (), "prepared", "ok", None),
        ("COPY (SELECT sex, COUNT(*) FROM patients GROUP BY sex) TO STDOUT", (), "copy", "ok", None),
    ]
    assert [e.cost.epsilon > 0 for e in mine] == [True, False, False, False, False, True, True]
    assert [e.rows for e in mine] == [1, 2, 0, 0, 0, 1, copied]


def test_budget_refusal_and_replay_are_recorded(demo_duckdb: Path, tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "policy.yaml", alice={"epsilon": 1.2})
    text = policy.read_text().replace("replay: false", "replay: true")
    policy.write_text(text)
    backend = private_copy(demo_duckdb, tmp_path)
    with (
        running_proxy(policy, backend, tmp_path / "ledger.sqlite") as proxy,
        proxy.connect(autocommit=True) as conn,
    ):
        notices = notices_of(conn)
        conn.execute("SELECT COUNT(*) FROM patients WHERE age > 30")
        conn.execute("SELECT COUNT(*) FROM patients WHERE age > 30")  # replayed: free
        conn.execute("SELECT COUNT(*) FROM visits")
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded):  # 53400: budget exhausted
            conn.execute("SELECT COUNT(*) FROM patients WHERE age > 60")
        mine = records(proxy)[-4:]
    assert [(e.status, e.sqlstate, e.replayed) for e in mine] == [
        ("ok", None, False),
        ("ok", None, True),
        ("ok", None, False),
        ("refused", "53400", False),
    ]
    assert [e.cost.epsilon for e in mine] == [0.5, 0.0, 0.5, 0.0]
    assert [e.entry_id is not None for e in mine] == [True, False, True, False]
    assert mine[1].rows == 1
    assert len([n for n in notices if "spent ε=" in n]) >= 2
