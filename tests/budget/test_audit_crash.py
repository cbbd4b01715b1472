"""kill -9 never separates a charge from its audit record: a real `dpproxy serve` process, on a
SQLite ledger and on a PostgreSQL ledger, is killed while a private query waits in the backend
(after its reservation: the entry is abandoned, still spent, and its record says abandoned), and
while a private query waits before its reservation (in its public subquery: neither exists).

The backend waits on a lock another connection holds on the table (LOCK TABLE … ACCESS EXCLUSIVE in
an open transaction), in a PostgreSQL database of this module's own loaded with the demo data.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from dpproxy.budget import open_ledger
from tests.conftest import PgCluster, create_database, demo_database, drop_database
from tests.wire.proxy import ALICE, REPO, Proxy, start_serve, write_policy

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def lockable_demo(pg_cluster: PgCluster, demo_duckdb: Path) -> Iterator[str]:
    """The demo data in a database of this module's own: its tests lock its tables."""
    with demo_database(pg_cluster, demo_duckdb, "auditcrash") as dsn:
        yield dsn


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_spec(request: pytest.FixtureRequest, tmp_path: Path, pg_cluster: PgCluster) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "ledger.sqlite")
        return
    name = create_database(pg_cluster, prefix="auditledger")
    try:
        yield pg_cluster.dsn(name)
    finally:
        drop_database(pg_cluster, name)


def audit_statuses(spec: str) -> list[tuple[str, str]]:
    """(statement, status) of every stored record, read without opening a ledger (which would
    abandon the orphans itself)."""
    query = "SELECT statement, status FROM dpproxy_ledger_audit ORDER BY id"
    if spec.startswith("postgresql://"):
        with psycopg.connect(spec) as conn:
            exists = conn.execute("SELECT to_regclass('dpproxy_ledger_audit')").fetchone()
            return [] if exists is None or exists[0] is None else conn.execute(query).fetchall()
    if not Path(spec).exists():
        return []
    with sqlite3.connect(spec) as conn:
        return conn.execute(query).fetchall()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def serve(tmp_path: Path, backend: str, ledger: str) -> tuple[object, Proxy]:
    policy = write_policy(tmp_path / "policy.yaml")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    args = ["--policy", str(policy), "--backend", backend, "--ledger", ledger, "--workers", "1"]
    process, port = start_serve(args, env)
    return process, Proxy(port, None, "postgres")  # type: ignore[arg-type]


def kill_while_waiting(
    tmp_path: Path, backend: str, ledger: str, locked: str, sql: str, ready: Callable[[], bool]
) -> None:
    """Send `sql` while `locked` is locked, wait until `ready`, then kill -9 the server."""
    process, proxy = serve(tmp_path, backend, ledger)
    try:
        with psycopg.connect(backend, autocommit=True) as locker:
            locker.execute("BEGIN")
            locker.execute(f"LOCK TABLE {locked} IN ACCESS EXCLUSIVE MODE")
            database = psycopg.conninfo.conninfo_to_dict(backend)["dbname"]
            client = psycopg.connect(proxy.dsn(dbname=str(database)), autocommit=True)
            client.pgconn.send_query(sql.encode())  # not waited for: it blocks on the lock
            # The backend statement is waiting on the lock.
            wait_for(
                lambda: (
                    locker.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    ).fetchone()[0]  # type: ignore[index]
                    > 0
                ),
                "the proxy's statement to wait on the lock",
            )
            wait_for(ready, "the statement's state in the ledger")
            process.send_signal(signal.SIGKILL)  # type: ignore[attr-defined]
            process.wait(timeout=30)  # type: ignore[attr-defined]
            locker.execute("ROLLBACK")
            client.close()
    finally:
        if process.poll() is None:  # type: ignore[attr-defined]
            process.kill()  # type: ignore[attr-defined]


def test_kill_after_the_reservation_leaves_the_charge_and_its_record(
    tmp_path: Path, lockable_demo: str, ledger_spec: str
) -> None:
    sql = "SELECT COUNT(*) FROM visits WHERE cost > 10"
    kill_while_waiting(
        tmp_path,
        lockable_demo,
        ledger_spec,
        "visits",
        sql,
        lambda: audit_statuses(ledger_spec) == [(sql, "running")],
    )
    # Before anyone reopens the ledger, the killed process's reservation and record are both there.
    assert audit_statuses(ledger_spec) == [(sql, "running")]
    with open_ledger(ledger_spec) as ledger:
        (entry,) = ledger.history(ALICE)
        assert entry.status == "abandoned" and entry.statement.startswith("SELECT")
        assert ledger.spent(ALICE).epsilon == pytest.approx(0.5)  # still spent
        (record,) = ledger.audit_entries()
        assert (record.statement, record.status, record.entry_id) == (sql, "abandoned", entry.id)
        assert (
            record.cost.epsilon == 0.5 and record.analyst == ALICE and record.client.startswith("127.0.0.1:")
        )


def test_kill_before_the_reservation_leaves_neither(
    tmp_path: Path, lockable_demo: str, ledger_spec: str
) -> None:
    # The public subquery runs while the statement is analysed, before anything is reserved.
    sql = "SELECT COUNT(*) FROM patients WHERE zip IN (SELECT zip FROM zip_info WHERE population > 10)"
    kill_while_waiting(tmp_path, lockable_demo, ledger_spec, "zip_info", sql, lambda: True)
    assert audit_statuses(ledger_spec) == []
    with open_ledger(ledger_spec) as ledger:
        assert ledger.history(ALICE) == []
        assert ledger.spent(ALICE).epsilon == 0
        assert ledger.audit_entries() == []
