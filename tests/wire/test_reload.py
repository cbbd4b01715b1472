"""Policy reload without restart (SIGHUP, `dpproxy policy reload`) while clients are connected.

What an operator would notice: a good policy serves every new connection (a table taken out of the
policy is gone for them, a budget changed is the new one), sessions already connected finish under the
policy they started with, analysts' spending is kept; a bad policy is refused with its problems (printed
by `dpproxy policy reload`, exit status 1, and logged) and the running policy keeps serving.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import yaml

from dpproxy.budget import open_ledger
from dpproxy.engine import Engine
from dpproxy.errors import PolicyError
from dpproxy.policy import load_policy
from dpproxy.wire.server import BackgroundServer, ServerConfig
from tests.wire.proxy import ALICE, REPO, Proxy, private_copy, start_serve, write_policy

COUNT_VISITS = "SELECT COUNT(*) FROM visits"


def without_visits(source: Path, target: Path, *, bob_epsilon: float = 7.0) -> Path:
    """The policy at `source` with the table visits taken out and bob's ε budget changed."""
    policy = yaml.safe_load(source.read_text())
    del policy["tables"]["visits"]
    policy["analysts"]["bob"]["epsilon"] = bob_epsilon
    target.write_text(yaml.safe_dump(policy, sort_keys=False))
    return target


def with_unknown_table(source: Path, target: Path) -> Path:
    policy = yaml.safe_load(source.read_text())
    policy["tables"]["no_such_table"] = {"public": True}
    target.write_text(yaml.safe_dump(policy, sort_keys=False))
    return target


def sqlstate_of(conn: psycopg.Connection, sql: str) -> str | None:
    try:
        conn.execute(sql).fetchall()
    except psycopg.Error as error:
        return error.sqlstate
    return None


def test_reload_serves_new_connections_and_keeps_sessions_and_spending(
    demo_duckdb: Path, tmp_path: Path
) -> None:
    policy = write_policy(tmp_path / "policy.yaml")
    engine = Engine.open(policy, private_copy(demo_duckdb, tmp_path), tmp_path / "ledger.sqlite")
    with BackgroundServer(engine, ServerConfig(port=0)) as server:
        proxy = Proxy(server.port, engine, "duckdb")
        before = proxy.connect(autocommit=True)
        assert sqlstate_of(before, COUNT_VISITS) is None
        spent = server.server.engine.budget(ALICE).spent.epsilon
        assert spent > 0

        server.reload(load_policy(without_visits(policy, tmp_path / "new.yaml")))
        after = proxy.connect(autocommit=True)
        assert sqlstate_of(after, COUNT_VISITS) == "42501"  # no longer exposed to new connections
        assert sqlstate_of(before, "SELECT COUNT(*) FROM visits WHERE visit_date IS NOT NULL") is None  # kept
        assert server.server.engine.budget("bob").limit.epsilon == 7.0
        assert server.server.engine.budget(ALICE).spent.epsilon >= spent  # the same ledger

        with pytest.raises(PolicyError) as refused:
            server.reload(load_policy(with_unknown_table(policy, tmp_path / "bad.yaml")))
        assert "no_such_table" in str(refused.value)
        latest = proxy.connect(autocommit=True)  # still the last good policy
        assert sqlstate_of(latest, COUNT_VISITS) == "42501"
        assert sqlstate_of(latest, "SELECT COUNT(*) FROM patients") is None
        for conn in (before, after, latest):
            conn.close()


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def policy_reload(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dpproxy.cli", "policy", "reload", *args],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=REPO,
        timeout=120,
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_sighup_reload_while_clients_are_connected(workers: int, demo_pg_dsn: str, tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "policy.yaml")
    original = policy.read_text()
    pid_file = tmp_path / "dpproxy.pid"
    args = ["--policy", str(policy), "--backend", demo_pg_dsn, "--ledger", str(tmp_path / "ledger.sqlite")]
    args += [
        "--database",
        "demo",
        "--workers",
        str(workers),
        "--shutdown-grace",
        "1",
        "--pid-file",
        str(pid_file),
    ]
    process, port = start_serve(args, _env())
    try:
        assert int(pid_file.read_text()) == process.pid
        proxy = Proxy(port, None, "postgres")  # type: ignore[arg-type]
        if workers == 1:
            connected = [proxy.connect(autocommit=True) for _ in range(2)]
        else:
            from tests.wire.test_workers import connections_on_every_worker

            connected = connections_on_every_worker(proxy, 1)
        for conn in connected:
            assert sqlstate_of(conn, COUNT_VISITS) is None

        # A good policy: new connections get it, connected sessions keep theirs.
        without_visits(policy, policy)
        done = policy_reload("--pid-file", str(pid_file))
        assert done.returncode == 0, done.stderr
        assert "reloaded (generation 1)" in done.stdout
        for _ in range(2 * workers):
            with proxy.connect(autocommit=True) as conn:
                assert sqlstate_of(conn, COUNT_VISITS) == "42501"
        for number, conn in enumerate(connected):
            assert sqlstate_of(conn, f"SELECT COUNT(*) FROM visits WHERE visit_id > {number}") is None

        # A bad policy: refused, its problems printed and logged, the last good one keeps serving.
        with_unknown_table(policy, policy)
        refused = policy_reload("--pid-file", str(pid_file))
        assert refused.returncode == 1
        assert "refused" in refused.stderr and "no_such_table" in refused.stderr
        for _ in range(2 * workers):
            with proxy.connect(autocommit=True) as conn:
                assert sqlstate_of(conn, COUNT_VISITS) == "42501"
                assert sqlstate_of(conn, "SELECT COUNT(*) FROM patients") is None

        # The first policy again: visits is back for new connections.
        policy.write_text(original)
        assert policy_reload("--pid-file", str(pid_file)).returncode == 0
        with proxy.connect(autocommit=True) as conn:
            assert sqlstate_of(conn, COUNT_VISITS) is None
        for conn in connected:
            conn.close()
        process.terminate()
        assert process.wait(timeout=60) == 0
        assert process.stderr is not None
        log = process.stderr.read()
        assert "no_such_table" in log and "refused (generation 2)" in log
        assert not pid_file.exists()
        # Each reload is an operator action in the audit log, with its outcome and who served it.
        with open_ledger(tmp_path / "ledger.sqlite") as ledger:
            reloads = [e for e in reversed(ledger.audit_entries()) if e.kind == "operator"]
        assert [e.statement.split(" (")[0] for e in reloads] == [
            "policy reload accepted",
            "policy reload refused",
            "policy reload accepted",
        ]
        assert "no_such_table" in reloads[1].statement and reloads[0].client.endswith("(SIGHUP)")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_policy_reload_without_a_server_fails(tmp_path: Path) -> None:
    pid_file = tmp_path / "none.pid"
    result = policy_reload("--pid-file", str(pid_file))
    assert result.returncode == 2
    assert "holds no process id" in result.stderr
