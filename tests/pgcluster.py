"""A throwaway PostgreSQL 15 cluster for the tests and the benchmarks.

Started from Debian's server binaries on a free port of 127.0.0.1, in a fresh temporary directory
deleted afterwards; fsync off (the data is disposable). PostgreSQL refuses to run as root, so when
we are root the cluster belongs to the `postgres` OS user and its commands run through runuser.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

PG_SUPERUSER = "postgres"
PG_OS_USER = "postgres"
_PG_PROGRAMS = ("initdb", "pg_ctl", "postgres")


@dataclass(frozen=True)
class PgCluster:
    host: str
    port: int
    superuser: str
    datadir: Path

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.superuser}@{self.host}:{self.port}/{dbname}"


def find_pg_bindir() -> Path | None:
    candidates: list[Path] = []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            candidates.append(Path(out.stdout.strip()))
    candidates.append(Path("/usr/lib/postgresql/15/bin"))
    if found := shutil.which("initdb"):
        candidates.append(Path(found).parent)
    for bindir in candidates:
        if all((bindir / program).is_file() for program in _PG_PROGRAMS):
            return bindir
    return None


class MissingPostgres(RuntimeError):
    """PostgreSQL's server programs cannot be run here."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_pg_owner(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    if shutil.which("runuser"):
        return ["runuser", "-u", PG_OS_USER, "--", *command]
    return ["su", PG_OS_USER, "-s", "/bin/sh", "-c", " ".join(_shell_quote(part) for part in command)]


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def _run_pg(command: list[str], what: str, log: Path | None = None) -> None:
    result = subprocess.run(_as_pg_owner(command), capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        log_text = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
        raise RuntimeError(
            f"{what} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n{log_text}"
        )


@contextlib.contextmanager
def start_cluster(bindir: Path) -> Iterator[PgCluster]:
    """A fresh PostgreSQL cluster on a free port of 127.0.0.1, removed on exit.

    As root, the cluster belongs to the `postgres` OS user (initdb and postgres refuse root)."""
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam(PG_OS_USER)
        except KeyError as exc:
            raise MissingPostgres(
                f"running as root, but there is no `{PG_OS_USER}` OS user to own the cluster"
            ) from exc

    # Not pytest's tmp_path: its parent is private to root, and the postgres user must enter it.
    root = Path(tempfile.mkdtemp(prefix="dpproxy-pg-"))
    datadir = root / "data"
    log = root / "postgres.log"
    if os.geteuid() == 0:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    try:
        _run_pg(
            [
                str(bindir / "initdb"),
                "-D",
                str(datadir),
                "-U",
                PG_SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
            "initdb",
        )
        # The port is free when picked but could be taken before postgres binds it: retry.
        for attempt in range(3):
            port = _free_port()
            options = " ".join(
                [
                    f"-p {port}",
                    "-c listen_addresses=127.0.0.1",
                    f"-c unix_socket_directories={root}",
                    "-c fsync=off",
                    "-c full_page_writes=off",
                    "-c synchronous_commit=off",
                    "-c wal_level=minimal",
                    "-c max_wal_senders=0",
                    "-c max_connections=200",
                    "-c shared_buffers=64MB",
                ]
            )
            try:
                _run_pg(
                    [
                        str(bindir / "pg_ctl"),
                        "-D",
                        str(datadir),
                        "-l",
                        str(log),
                        "-o",
                        options,
                        "-w",
                        "start",
                    ],
                    "pg_ctl start",
                    log,
                )
            except RuntimeError:
                if attempt == 2:
                    raise
                continue
            break
        cluster = PgCluster(host="127.0.0.1", port=port, superuser=PG_SUPERUSER, datadir=datadir)
        _wait_ready(cluster)
        yield cluster
    finally:
        # Also after a failed start: pg_ctl may have given up waiting on a server that did start.
        if (datadir / "postmaster.pid").exists():
            with contextlib.suppress(Exception):
                _run_pg(
                    [str(bindir / "pg_ctl"), "-D", str(datadir), "-m", "immediate", "-w", "stop"],
                    "pg_ctl stop",
                )
        shutil.rmtree(root, ignore_errors=True)


def _wait_ready(cluster: PgCluster, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with psycopg.connect(cluster.dsn(), connect_timeout=2):
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _admin(cluster: PgCluster) -> psycopg.Connection:
    return psycopg.connect(cluster.dsn(), autocommit=True)


def create_database(cluster: PgCluster, prefix: str = "test") -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with _admin(cluster) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


def drop_database(cluster: PgCluster, name: str) -> None:
    with _admin(cluster) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
