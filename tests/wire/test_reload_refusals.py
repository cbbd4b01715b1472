"""Policy reloads that must be refused, not crash: a policy file that the YAML reader itself rejects
(a NUL byte, a control character pasted in) or that holds a number too long to read is refused like
any bad policy — its problem recorded for `dpproxy policy reload`, the running policy kept — never an
exception that leaves the reload unanswered or, with workers, ends the supervisor (and so every
worker).

And what connected sessions spend after a reload lowers a budget or removes an analyst."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import psycopg
import pytest
import yaml

from dpproxy.engine import Engine
from dpproxy.policy import load_policy
from dpproxy.wire.reload import Reloads, read_status
from dpproxy.wire.server import BackgroundServer, ServerConfig
from tests.wire.proxy import ALICE, Proxy, private_copy, start_serve, write_policy
from tests.wire.test_reload import _env, policy_reload, sqlstate_of

UNREADABLE = {
    "a NUL byte": lambda text: text + "\x00\n",
    "a number of 5000 digits": lambda text: text.replace("version: 1", "version: " + "9" * 5000, 1),
}


@pytest.mark.parametrize("damage", list(UNREADABLE))
def test_a_policy_the_yaml_reader_rejects_is_refused_and_the_running_one_stays(
    damage: str, demo_duckdb: Path, tmp_path: Path
) -> None:
    policy = write_policy(tmp_path / "policy.yaml")
    engine = Engine.open(policy, private_copy(demo_duckdb, tmp_path), tmp_path / "ledger.sqlite")
    status = tmp_path / "reload.json"
    with BackgroundServer(engine, ServerConfig(port=0)) as server:
        reloads = Reloads(policy, status, engine.policy)
        policy.write_text(UNREADABLE[damage](policy.read_text()))
        accepted = asyncio.run_coroutine_threadsafe(
            server.server.reload_file(policy, reloads), server._loop
        ).result(timeout=60)
        assert accepted is False
        outcome = read_status(status)
        assert outcome is not None and outcome.generation == 1 and not outcome.accepted
        assert outcome.problems  # what was wrong, for `dpproxy policy reload` to print
        assert server.server.engine is engine  # the running policy keeps serving
        with Proxy(server.port, engine, "duckdb").connect(autocommit=True) as conn:
            assert sqlstate_of(conn, "SELECT COUNT(*) FROM patients") is None


def test_workers_refuse_a_policy_the_yaml_reader_rejects_and_keep_serving(
    demo_pg_dsn: str, tmp_path: Path
) -> None:
    policy = write_policy(tmp_path / "policy.yaml")
    pid_file = tmp_path / "dpproxy.pid"
    args = ["--policy", str(policy), "--backend", demo_pg_dsn, "--ledger", str(tmp_path / "ledger.sqlite")]
    args += ["--database", "demo", "--workers", "2", "--shutdown-grace", "1", "--pid-file", str(pid_file)]
    process, port = start_serve(args, _env())
    try:
        policy.write_text(policy.read_text() + "\x00\n")
        refused = policy_reload("--pid-file", str(pid_file), "--timeout", "20")
        time.sleep(0.5)
        assert process.poll() is None, "the supervisor ended"
        assert refused.returncode == 1, refused.stderr
        with psycopg.connect(
            host="127.0.0.1", port=port, user=ALICE, password="alice-demo", dbname="demo", autocommit=True
        ) as conn:
            assert sqlstate_of(conn, "SELECT COUNT(*) FROM patients") is None
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def test_a_reload_that_lowers_a_budget_stops_connected_sessions_at_the_new_limit(
    demo_duckdb: Path, tmp_path: Path
) -> None:
    policy = write_policy(tmp_path / "policy.yaml")
    engine = Engine.open(policy, private_copy(demo_duckdb, tmp_path), tmp_path / "ledger.sqlite")
    with BackgroundServer(engine, ServerConfig(port=0)) as server:
        connected = Proxy(server.port, engine, "duckdb").connect(autocommit=True)
        assert sqlstate_of(connected, "SELECT COUNT(*) FROM patients") is None
        spent = server.server.engine.budget(ALICE).spent.epsilon
        lowered = yaml.safe_load(policy.read_text())
        lowered["analysts"][ALICE]["epsilon"] = spent  # nothing left to spend
        (tmp_path / "lowered.yaml").write_text(yaml.safe_dump(lowered, sort_keys=False))
        server.reload(load_policy(tmp_path / "lowered.yaml"))
        assert sqlstate_of(connected, "SELECT COUNT(*) FROM patients WHERE age > 1") == "53400"
        removed = yaml.safe_load(policy.read_text())
        del removed["analysts"][ALICE]
        (tmp_path / "removed.yaml").write_text(yaml.safe_dump(removed, sort_keys=False))
        server.reload(load_policy(tmp_path / "removed.yaml"))
        assert sqlstate_of(connected, "SELECT COUNT(*) FROM patients WHERE age > 2") == "28000"
        connected.close()
