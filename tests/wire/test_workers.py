"""`dpproxy serve --workers N`: several processes on one port, sharing the ledger and the cancel keys.

What a user would notice: connections land on different workers (their backend pids name the
worker), the workers together never spend more of a budget than it holds (on a SQLite file and a
PostgreSQL ledger), a cancel request reaches the query wherever it lands (psycopg's cancel, libpq's
old PQcancel as psql uses it, and a raw CancelRequest), and SIGTERM stops every worker cleanly.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import yaml

from dpproxy.engine import Engine
from dpproxy.wire import codec
from dpproxy.wire.server import BackgroundServer, ServerConfig
from tests.wire.proxy import ALICE, REPO, LockablePeople, Proxy, start_serve, write_policy
from tests.wire.raw import RawClient, cstr, msg

BOB, BOB_PASSWORD = "bob", "bob-demo"  # the demo policy's second analyst


WORKERS = 2


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


@contextlib.contextmanager
def serving_workers(
    policy: Path, backend: str, ledger: str, *extra: str, supervisor: list[int] | None = None
) -> Iterator[Proxy]:
    """`dpproxy serve --workers 2` in a subprocess (its pid appended to `supervisor`); on leaving,
    SIGTERM must stop it with status 0."""
    args = ["--policy", str(policy), "--backend", backend, "--ledger", ledger, "--database", "demo"]
    process, port = start_serve([*args, "--workers", str(WORKERS), "--shutdown-grace", "1", *extra], _env())
    if supervisor is not None:
        supervisor.append(process.pid)
    try:
        yield Proxy(port, None, "postgres")  # type: ignore[arg-type]
        process.terminate()
        assert process.wait(timeout=60) == 0
        assert process.stderr is not None
        assert "dpproxy: stopped" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def connections_on_every_worker(proxy: Proxy, per_worker: int) -> list[psycopg.Connection]:
    """Connect until each worker holds `per_worker` of the connections (backend pid ≡ worker mod N)."""
    kept: dict[int, list[psycopg.Connection]] = {i: [] for i in range(WORKERS)}
    spare: list[psycopg.Connection] = []
    for _ in range(50 * WORKERS * per_worker):
        if all(len(held) >= per_worker for held in kept.values()):
            break
        conn = proxy.connect(autocommit=True)
        held = kept[conn.info.backend_pid % WORKERS]
        (held if len(held) < per_worker else spare).append(conn)
    for conn in spare:
        conn.close()
    assert all(len(held) == per_worker for held in kept.values()), "the kernel never used some worker"
    return [conn for held in kept.values() for conn in held]


# --- the budget: shared by every worker ------------------------------------------------------------------


def _race(connections: list[psycopg.Connection], each: int) -> list[str]:
    """Every connection sends `each` distinct private queries at once (nothing is replayed); the
    outcomes: "answered", or the SQLSTATE and message of the refusal. The connections are closed."""
    outcomes: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(len(connections))

    def client(number: int, conn: psycopg.Connection) -> None:
        start.wait()
        for query in range(each):
            age = number * each + query
            try:
                conn.execute("SELECT COUNT(*) FROM patients WHERE age > %s", (age,)).fetchall()
                result = "answered"
            except psycopg.Error as error:
                result = f"{error.sqlstate} {error.diag.message_primary or ''}"
            with lock:
                outcomes.append(result)

    threads = [threading.Thread(target=client, args=(i, c)) for i, c in enumerate(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for conn in connections:
        conn.close()
    return outcomes


@pytest.mark.parametrize("ledger_kind", ["sqlite", "postgres"])
def test_workers_together_cannot_overspend_one_budget(
    ledger_kind: str, demo_pg_dsn: str, pg_dsn: str, tmp_path: Path
) -> None:
    # 3.0 of budget at 0.5 a query: exactly 6 of the 24 distinct queries fit, whichever worker runs them.
    policy = write_policy(tmp_path / "policy.yaml", alice={"epsilon": 3.0})
    ledger = str(tmp_path / "ledger.sqlite") if ledger_kind == "sqlite" else pg_dsn
    with serving_workers(policy, demo_pg_dsn, ledger) as proxy:
        outcomes = _race(connections_on_every_worker(proxy, 4), 3)
    assert sorted(o.split()[0] for o in outcomes) == ["53400"] * 18 + ["answered"] * 6
    with Engine.open(policy, None, ledger) as engine:
        assert engine.budget(ALICE).spent.epsilon == pytest.approx(3.0)


@pytest.mark.parametrize("ledger_kind", ["sqlite", "postgres"])
def test_analysts_together_cannot_overspend_the_data_sets_budget(
    ledger_kind: str, demo_pg_dsn: str, pg_dsn: str, tmp_path: Path
) -> None:
    """100 distinct queries at ε = 0.5 by alice and bob at once, on every worker: each analyst's own
    budget could pay for all of theirs, the data set's (3.0) for exactly 6, whoever sends them."""
    policy = write_policy(tmp_path / "policy.yaml")
    text = yaml.safe_load(policy.read_text())
    text["budget"] = {"epsilon": 3.0, "delta": 1.0e-5}
    policy.write_text(yaml.safe_dump(text, sort_keys=False))
    ledger = str(tmp_path / "ledger.sqlite") if ledger_kind == "sqlite" else pg_dsn
    with serving_workers(policy, demo_pg_dsn, ledger) as proxy:
        # Ten clients (six of alice's, three per worker; four of bob's), ten queries each.
        connections = connections_on_every_worker(proxy, 3)
        connections += [psycopg.connect(proxy.dsn(BOB, BOB_PASSWORD), autocommit=True) for _ in range(4)]
        outcomes = _race(connections, 10)
    assert len(outcomes) == 100 and outcomes.count("answered") == 6
    refusals = [o for o in outcomes if o != "answered"]
    assert all(
        o.startswith("53400 privacy budget exhausted for the data set's budget (all analysts together)")
        for o in refusals
    ), refusals[:3]
    with Engine.open(policy, None, ledger) as engine:
        shared = engine.data_set_budget()
        assert shared is not None and shared.spent.epsilon == pytest.approx(3.0)
        mine = engine.budget(ALICE).spent.epsilon + engine.budget(BOB).spent.epsilon
        assert mine >= 3.0  # what each analyst spent, of which the data set saw exactly 3.0


# --- cancel requests: forwarded to the worker that owns the session -----------------------------------------


def _raw_cancel(port: int, process_id: int, secret_key: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(struct.pack("!iiii", 16, codec.CANCEL_REQUEST_CODE, process_id, secret_key))
        sock.recv(1)  # the server closes the connection without an answer, as PostgreSQL does


def _blocked_query(raw: RawClient, people: LockablePeople) -> None:
    raw.send(msg("Q", cstr("SELECT COUNT(*) FROM people")))
    people.wait_until_blocked()


def _cancelled(raw: RawClient) -> str:
    """The SQLSTATE the blocked query ended with."""
    messages = raw.read_until("Z")
    errors = [body for kind, body in messages if kind == "E"]
    assert errors, messages
    fields = {part[:1]: part[1:].decode() for part in errors[0].split(b"\x00") if part}
    return fields[b"C"]


def test_a_cancel_request_reaches_its_query_on_whichever_worker_it_lands(
    people: LockablePeople, tmp_path: Path
) -> None:
    with serving_workers(people.policy, people.dsn, str(tmp_path / "ledger.sqlite")) as proxy:
        # psycopg's cancel (libpq's PQcancelConn) and the older PQcancel psql uses, alternately: each
        # cancel connection lands on either worker, so over 8 rounds both paths are all but certain.
        for round_ in range(8):
            with people.locked(), proxy.connect(autocommit=True) as conn:
                outcome: dict[str, object] = {}

                def run(conn: psycopg.Connection = conn, outcome: dict[str, object] = outcome) -> None:
                    try:
                        conn.execute("SELECT COUNT(*) FROM people").fetchall()
                    except psycopg.Error as error:
                        outcome["error"] = error

                worker = threading.Thread(target=run)
                worker.start()
                people.wait_until_blocked()
                started = time.monotonic()
                conn.cancel_safe() if round_ % 2 == 0 else conn.cancel()
                worker.join(20)
                assert isinstance(outcome.get("error"), psycopg.errors.QueryCanceled), outcome
                assert time.monotonic() - started < 10
        # A raw CancelRequest with a wrong secret key cancels nothing, wherever it lands; the right one does.
        with people.locked(), RawClient(proxy.port) as raw:
            raw.login()
            assert raw.key is not None
            process_id, secret_key = raw.key
            _blocked_query(raw, people)
            for _ in range(4):
                _raw_cancel(proxy.port, process_id, secret_key ^ 1)
            time.sleep(0.5)
            raw.sock.settimeout(0.5)
            with pytest.raises(TimeoutError):
                raw.read()
            raw.sock.settimeout(20)
            _raw_cancel(proxy.port, process_id, secret_key)
            assert _cancelled(raw) == "57014"


def test_forwarding_between_two_servers_is_checked_by_the_owner(
    people: LockablePeople, tmp_path: Path
) -> None:
    """Deterministically what the kernel does at random: a cancel that lands on worker 1 for a session
    of worker 0 (two servers on their own ports, slots (0, 2) and (1, 2), forwarding to each other)."""
    servers: list[BackgroundServer] = []

    def forward(owner: int, request: codec.CancelRequest) -> None:
        servers[owner].cancel_request(request)

    ledger = tmp_path / "ledger.sqlite"
    for index in range(2):
        engine = Engine.open(people.policy, people.dsn, ledger)
        server = BackgroundServer(engine, ServerConfig(port=0), slot=(index, 2), forward_cancel=forward)
        servers.append(server.start())
    try:
        with people.locked(), RawClient(servers[0].port) as raw:
            raw.login()
            assert raw.key is not None
            process_id, secret_key = raw.key
            assert process_id % 2 == 0  # the key names worker 0
            _blocked_query(raw, people)
            _raw_cancel(servers[1].port, process_id, secret_key ^ 1)  # wrong key: nothing
            raw.sock.settimeout(0.5)
            with pytest.raises(TimeoutError):
                raw.read()
            raw.sock.settimeout(20)
            _raw_cancel(servers[1].port, process_id, secret_key)
            assert _cancelled(raw) == "57014"
        with RawClient(servers[1].port) as raw:
            raw.login()
            assert raw.key is not None and raw.key[0] % 2 == 1  # and worker 1's keys name worker 1
    finally:
        for server in servers:
            server.stop()


# --- the supervisor ---------------------------------------------------------------------------------------


def test_serve_refuses_an_in_memory_ledger_with_several_workers(demo_pg_dsn: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    policy = write_policy(tmp_path / "policy.yaml")
    done = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "dpproxy.cli",
                "serve",
                "--policy",
                str(policy),
                "--backend",
                demo_pg_dsn,
            ),
            *("--ledger", ":memory:", "--workers", "2", "--port", "0"),
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )
    assert done.returncode == 2
    assert "--ledger :memory: keeps budgets in one process: use --workers 1 or a file" in done.stderr


def _worker_pids(supervisor: int) -> list[int]:
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    return [int(pid) for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def test_a_worker_that_dies_is_replaced(demo_pg_dsn: str, tmp_path: Path) -> None:
    import os
    import signal

    policy = write_policy(tmp_path / "policy.yaml")
    supervisor: list[int] = []
    with serving_workers(
        policy, demo_pg_dsn, str(tmp_path / "ledger.sqlite"), supervisor=supervisor
    ) as proxy:
        before = _worker_pids(supervisor[0])
        assert len(before) == WORKERS
        os.kill(before[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            after = _worker_pids(supervisor[0])
            if len(after) == WORKERS and before[0] not in after:
                break
            assert time.monotonic() < deadline, f"no new worker: {after}"
            time.sleep(0.2)
        # The new worker serves once it has opened its engine (both workers get connections again);
        # the other worker never stopped.
        assert before[1] in after
        while True:
            try:
                connections = connections_on_every_worker(proxy, 1)
                break
            except AssertionError:
                assert time.monotonic() < deadline, "the new worker never served"
                time.sleep(0.5)
        for conn in connections:
            assert conn.execute("SELECT COUNT(*) FROM zip_info").fetchone() == (2000,)
            conn.close()


def test_the_demo_serves_one_duckdb_file_from_every_worker(tmp_path: Path) -> None:
    """DuckDB lets several processes open a file read-only: every worker answers from the demo file,
    and budgets spent on either worker add up in the one ledger beside it."""
    import re
    import signal
    import subprocess
    import sys

    directory = tmp_path / "demo"
    command = [sys.executable, "-m", "dpproxy.cli", "demo", "--dir", str(directory), "--persons", "300"]
    process = subprocess.Popen(
        [*command, "--port", "0", "--console-port", "0", "--workers", str(WORKERS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**_env(), "XDG_DATA_HOME": str(tmp_path / "xdg")},
    )
    try:
        assert process.stdout is not None
        lines: list[str] = []
        while not any(line.startswith("Ctrl-C") for line in lines):
            line = process.stdout.readline()
            assert line, f"dpproxy demo exited early: {''.join(lines)}"
            lines.append(line)
        output = "".join(lines)
        assert f"({WORKERS} worker processes)" in output
        port = int(re.search(r"alice@127\.0\.0\.1:(\d+)/demo", output)[1])  # type: ignore[index]
        proxy = Proxy(port, None, "duckdb")  # type: ignore[arg-type]
        spent = []
        for age, conn in enumerate(connections_on_every_worker(proxy, 1)):
            (count,) = conn.execute("SELECT COUNT(*) FROM patients WHERE age >= %s", (age,)).fetchone()  # type: ignore[misc]
            assert 150 < count < 450
            spent.append(conn.execute("SHOW dpproxy.budget").fetchone()[0])  # type: ignore[index]
            conn.close()
        # The second worker's total includes the first worker's charge: the ledger is one.
        assert spent == ["0.5", "1"]  # the spent ε each saw
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_help_documents_workers(command: str) -> None:
    from click.testing import CliRunner

    from dpproxy.cli import main

    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "--workers INTEGER RANGE" in text and "[default: the number of cores]" in text


def test_workers_stop_when_their_supervisor_is_killed(demo_pg_dsn: str, tmp_path: Path) -> None:
    """SIGKILL leaves the supervisor no chance to stop its workers: they notice and stop themselves,
    so no orphan keeps serving the port."""
    import os
    import signal

    policy = write_policy(tmp_path / "policy.yaml")
    args = ["--policy", str(policy), "--backend", demo_pg_dsn, "--ledger", str(tmp_path / "ledger.sqlite")]
    process, port = start_serve([*args, "--database", "demo", "--workers", str(WORKERS)], _env())
    workers: list[int] = []
    try:
        workers = _worker_pids(process.pid)
        assert len(workers) == WORKERS
        process.kill()
        process.wait()
        deadline = time.monotonic() + 30
        while any(b"spawn_main" in _cmdline(pid) for pid in workers):
            assert time.monotonic() < deadline, "a worker outlived its supervisor"
            time.sleep(0.2)
        with pytest.raises(psycopg.OperationalError):
            Proxy(port, None, "postgres").connect()  # type: ignore[arg-type]
    finally:
        for pid in workers:
            if b"spawn_main" in _cmdline(pid):
                os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
