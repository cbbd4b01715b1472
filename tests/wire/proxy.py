"""Servers and policies for the wire tests: the demo policy with large budgets, a proxy served
in-process over a private copy of the demo data, `dpproxy serve` in a subprocess, and a PostgreSQL
table a test can lock to hold a private query waiting."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import yaml

from dpproxy.engine import Engine
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


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate and its key for localhost, valid one day (openssl is installed
    with the system's packages)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def private_copy(demo_duckdb: Path, directory: Path) -> str:
    """A copy of the demo database: DuckDB refuses a second connection to a file that this process
    already holds with another configuration (demo_pg_dsn reads the shared file)."""
    target = directory / "demo.duckdb"
    shutil.copyfile(demo_duckdb, target)
    return str(target)


def notices_of(conn: psycopg.Connection) -> list[str]:
    found: list[str] = []
    conn.add_notice_handler(lambda diag: found.append(diag.message_primary or ""))
    return found


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


def start_serve(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
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
