"""Long queries through the wire server: statement_timeout (startup option or SET) answered with 57014,
the server's own backend time limit (`serve --backend-timeout`) with a message of its own, the charge
rule (a private query that reached the data stays charged), and a client that disconnects
mid-query having its backend query cancelled. On DuckDB (a view too slow to finish) and PostgreSQL (a
table locked by another session, so the query waits deterministically).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import yaml

from dpproxy.backends import Backend
from dpproxy.backends.duckdb import DuckDBBackend
from dpproxy.backends.postgres import PostgresBackend
from dpproxy.engine import Engine
from dpproxy.wire.server import BackgroundServer, ServerConfig
from tests.wire.proxy import LockablePeople, Proxy, write_policy
from tests.wire.raw import RawClient, cstr, error_fields, msg

PEOPLE_COLUMNS = {"person_id": {"type": "integer"}, "age": {"type": "integer", "lower": 0, "upper": 100}}


def people_policy(path: Path, *, public_slow: bool = False) -> Path:
    policy = write_policy(path)
    spec = yaml.safe_load(policy.read_text())
    spec["tables"] = {"people": {"privacy_unit": "person_id", "columns": PEOPLE_COLUMNS}}
    if public_slow:
        spec["tables"]["slow"] = {"privacy_unit": "person_id", "columns": PEOPLE_COLUMNS}
        spec["tables"]["slow_public"] = {"public": True}
    path.write_text(yaml.safe_dump(spec))
    return path


@contextlib.contextmanager
def serving(policy: Path, backend: Backend, ledger: Path, **config: object) -> Iterator[Proxy]:
    engine = Engine.open(policy, backend, ledger)
    server = BackgroundServer(engine, ServerConfig(port=0, **config))  # type: ignore[arg-type]
    server.start()
    try:
        yield Proxy(server.port, engine, "duckdb" if isinstance(backend, DuckDBBackend) else "postgres")
    finally:
        server.stop()


def slow_duckdb(timeout_ms: int | None) -> DuckDBBackend:
    """`people` answers at once; `slow` and `slow_public` (a three-way cross join of 2000 rows) never do."""
    return DuckDBBackend.from_statements(
        [
            "CREATE TABLE people AS SELECT i::INTEGER AS person_id, (i % 90)::INTEGER AS age FROM range(2000) t(i)",
            "CREATE VIEW slow AS SELECT a.person_id, b.age FROM people a, people b, people c",
            "CREATE VIEW slow_public AS SELECT a.age FROM people a, people b, people c",
        ],
        statement_timeout_ms=timeout_ms,
    )


# --- statement_timeout ---------------------------------------------------------------------------------


def test_statement_timeout_cancels_with_57014_and_the_charge_rule_on_duckdb(tmp_path: Path) -> None:
    policy = people_policy(tmp_path / "policy.yaml", public_slow=True)
    with (
        serving(policy, slow_duckdb(120_000), tmp_path / "ledger.sqlite") as proxy,
        psycopg.connect(proxy.dsn(), options="-c statement_timeout=400", autocommit=True) as conn,
    ):
        assert conn.execute("SHOW statement_timeout").fetchone() == ("400ms",)
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled) as raised:
            conn.execute("SELECT COUNT(*) FROM slow")
        assert time.monotonic() - started < 20
        assert raised.value.diag.message_primary == (
            "canceling statement due to statement timeout; its privacy cost has been charged"
        )
        assert proxy.spent() == pytest.approx(0.5)  # it had reached the data
        # A public query is cancelled the same way, with nothing to charge; the session goes on.
        conn.execute("SET statement_timeout = '1s'")
        assert conn.execute("SHOW statement_timeout").fetchone() == ("1s",)
        with pytest.raises(psycopg.errors.QueryCanceled) as raised:
            conn.execute("SELECT COUNT(*) FROM slow_public")
        assert raised.value.diag.message_primary == "canceling statement due to statement timeout"
        assert proxy.spent() == pytest.approx(0.5)
        assert conn.execute("SELECT COUNT(*) FROM people").fetchone()[0] > 0  # type: ignore[index]
        conn.execute("SET statement_timeout = 0")
        with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
            conn.execute("SET statement_timeout = '5 parsecs'")
        assert '"ms", "s", "min"' in (raised.value.diag.message_hint or "")


def test_statement_timeout_on_postgresql(pg_cluster, tmp_path: Path) -> None:
    with locked_people(pg_cluster, tmp_path) as people:
        backend = PostgresBackend(people.dsn)
        with serving(people.policy, backend, tmp_path / "ledger.sqlite") as proxy:
            with people.locked(), proxy.connect(autocommit=True) as conn:
                # The lock holds the backend query forever, so the limit only has to outlast the
                # planning before the charge: 300 ms did not on a loaded CI machine.
                conn.execute("SET statement_timeout = 2000")
                with pytest.raises(psycopg.errors.QueryCanceled) as raised:
                    conn.execute("SELECT COUNT(*) FROM people")
                assert raised.value.diag.message_primary == (
                    "canceling statement due to statement timeout; its privacy cost has been charged"
                )
            assert proxy.spent() == pytest.approx(0.5)


# --- the server's backend time limit --------------------------------------------------------------------


def test_the_backend_time_limit_has_its_own_message_on_duckdb(tmp_path: Path) -> None:
    policy = people_policy(tmp_path / "policy.yaml", public_slow=True)
    with (
        serving(policy, slow_duckdb(700), tmp_path / "ledger.sqlite") as proxy,
        proxy.connect(autocommit=True) as conn,
    ):
        with pytest.raises(psycopg.errors.QueryCanceled) as raised:
            conn.execute("SELECT COUNT(*) FROM slow")
        assert raised.value.diag.message_primary == (
            "canceling statement due to dpproxy's time limit on backend queries (0.7 s); "
            "its privacy cost has been charged"
        )
        assert "dpproxy serve --backend-timeout" in (raised.value.diag.message_hint or "")
        assert proxy.spent() == pytest.approx(0.5)
        with pytest.raises(psycopg.errors.QueryCanceled) as raised:
            conn.execute("SELECT COUNT(*) FROM slow_public")
        assert "time limit on backend queries (0.7 s)" in str(raised.value)
        assert proxy.spent() == pytest.approx(0.5)


def test_the_backend_time_limit_on_postgresql(pg_cluster, tmp_path: Path) -> None:
    with locked_people(pg_cluster, tmp_path) as people:
        backend = PostgresBackend(people.dsn, statement_timeout_ms=500)
        with serving(people.policy, backend, tmp_path / "ledger.sqlite") as proxy:
            with people.locked(), proxy.connect(autocommit=True) as conn:
                with pytest.raises(psycopg.errors.QueryCanceled) as raised:
                    conn.execute("SELECT COUNT(*) FROM people")
                assert raised.value.diag.message_primary == (
                    "canceling statement due to dpproxy's time limit on backend queries (0.5 s); "
                    "its privacy cost has been charged"
                )
                assert "--backend-timeout" in (raised.value.diag.message_hint or "")
            assert proxy.spent() == pytest.approx(0.5)


# --- a client that disconnects --------------------------------------------------------------------------


def test_a_disconnected_client_has_its_postgresql_query_cancelled(pg_cluster, tmp_path: Path) -> None:
    with locked_people(pg_cluster, tmp_path) as people:
        backend = PostgresBackend(people.dsn)  # 30 s: far longer than this test waits
        with serving(people.policy, backend, tmp_path / "ledger.sqlite") as proxy:
            with people.locked():
                raw = RawClient(proxy.port)
                raw.login()
                raw.send(msg("Q", cstr("SELECT COUNT(*) FROM people")))
                people.wait_until_blocked()
                raw.sock.shutdown(socket.SHUT_RDWR)
                raw.sock.close()
                # The backend query goes away while the lock that holds it is still held.
                deadline = time.monotonic() + 10
                with psycopg.connect(people.dsn, autocommit=True) as watcher:
                    while watcher.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE query ILIKE '%people%' AND state = 'active' "
                        "AND pid <> pg_backend_pid()"
                    ).fetchall():
                        assert time.monotonic() < deadline, "the backend query was not cancelled"
                        time.sleep(0.05)
            # It had reached the data: charged, as any cancelled private query.
            deadline = time.monotonic() + 10
            while proxy.spent() < 0.5 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert proxy.spent() == pytest.approx(0.5)


def test_a_disconnected_client_frees_its_duckdb_worker(tmp_path: Path) -> None:
    policy = people_policy(tmp_path / "policy.yaml", public_slow=True)
    # One worker thread: were the abandoned query still running, nothing else could run for 120 s.
    with serving(policy, slow_duckdb(120_000), tmp_path / "ledger.sqlite", workers=1) as proxy:
        raw = RawClient(proxy.port)
        raw.login()
        raw.send(msg("Q", cstr("SELECT COUNT(*) FROM slow")))
        time.sleep(0.5)
        raw.sock.close()
        started = time.monotonic()
        with proxy.connect(autocommit=True) as conn:
            assert conn.execute("SELECT COUNT(*) FROM people").fetchone()[0] > 0  # type: ignore[index]
        assert time.monotonic() - started < 20
        assert proxy.spent() == pytest.approx(1.0)  # the abandoned query (it had started) and this one


def test_pipelined_messages_sent_during_a_query_are_still_answered(tmp_path: Path) -> None:
    policy = people_policy(tmp_path / "policy.yaml")
    with (
        serving(policy, slow_duckdb(None), tmp_path / "ledger.sqlite") as proxy,
        RawClient(proxy.port) as raw,
    ):
        raw.login()
        raw.send(msg("Q", cstr("SELECT COUNT(*) FROM people")), msg("Q", cstr("SELECT 1")))
        first, second = raw.read_until("Z"), raw.read_until("Z")
        assert [k for k, _ in first] == ["N", "T", "D", "C", "Z"]
        assert [k for k, _ in second] == ["T", "D", "C", "Z"]
        raw.send(msg("Q", cstr("SELECT person_id FROM people")))
        kind, body = raw.read_until("Z")[0]
        assert kind == "E" and error_fields(body)["C"] == "42501"


@contextlib.contextmanager
def locked_people(pg_cluster, tmp_path: Path) -> Iterator[LockablePeople]:
    from tests.conftest import create_database, drop_database

    name = create_database(pg_cluster, prefix="people")
    dsn = pg_cluster.dsn(name)
    try:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("CREATE TABLE people (person_id integer, age integer)")
            admin.execute("INSERT INTO people SELECT i, i % 90 FROM generate_series(1, 200) i")
        yield LockablePeople(dsn, people_policy(tmp_path / "people.yaml"))
    finally:
        drop_database(pg_cluster, name)


def test_serve_answers_to_the_backing_database_name_and_takes_a_backend_timeout(
    pg_cluster, tmp_path: Path
) -> None:
    import os
    import signal

    from tests.wire.proxy import REPO, start_serve

    with locked_people(pg_cluster, tmp_path) as people:
        backing = psycopg.conninfo.conninfo_to_dict(people.dsn)["dbname"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        args = [
            "--policy",
            str(people.policy),
            "--backend",
            people.dsn,
            "--ledger",
            str(tmp_path / "l.sqlite"),
        ]
        process, port = start_serve([*args, "--backend-timeout", "0.5"], env)
        try:
            proxy = Proxy(port, None, "postgres")  # type: ignore[arg-type]
            with pytest.raises(psycopg.OperationalError, match='database "demo" does not exist'):
                psycopg.connect(proxy.dsn())
            with people.locked(), psycopg.connect(proxy.dsn(dbname=backing), autocommit=True) as conn:
                assert conn.execute("SELECT current_database()").fetchone() == (backing,)
                with pytest.raises(psycopg.errors.QueryCanceled, match=r"backend queries \(0.5 s\)"):
                    conn.execute("SELECT COUNT(*) FROM people")
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
