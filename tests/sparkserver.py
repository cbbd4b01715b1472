"""A throwaway Spark Connect server on 127.0.0.1 for the tests that run on Spark.

The server comes from the full `pyspark` package (its jars and bin/spark-submit), which the test
command installs beside the virtualenv (`.spark/`, scripts/test.sh): the virtualenv itself holds
only `pyspark-client`, the client dpproxy uses in production. The server is started as
`spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer` (what the
distribution's sbin/start-connect-server.sh runs), with token authentication on, local[2], ANSI
mode and the UTC time zone; a fresh warehouse directory holds the tables the tests load.

Clients reach it as `sc://localhost:PORT/;token=…`: with a token and no TLS, the Spark Connect
client only talks to `localhost` (gRPC local credentials).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Where scripts/test.sh installs the full pyspark package (the server); DPPROXY_SPARK_HOME overrides.
SPARK_DIR = ROOT / ".spark"
STARTUP_TIMEOUT_S = 180.0


class MissingSpark(Exception):
    """No Spark distribution (or no Java) to start a Connect server with."""


@dataclass(frozen=True)
class SparkServer:
    port: int
    token: str
    warehouse: Path
    log: Path

    @property
    def url(self) -> str:
        return f"sc://localhost:{self.port}/;token={self.token}"

    def url_with(self, **params: str) -> str:
        extra = "".join(f";{k}={v}" for k, v in params.items())
        return f"sc://localhost:{self.port}/{extra}"


def find_spark_home() -> Path | None:
    """The `pyspark` directory of a full pyspark install (it holds bin/spark-submit and jars/)."""
    explicit = os.environ.get("DPPROXY_SPARK_HOME")
    candidates = [Path(explicit)] if explicit else sorted(SPARK_DIR.glob("*/pyspark"), reverse=True)
    for home in candidates:
        if (home / "bin" / "spark-submit").is_file() and (home / "jars").is_dir():
            return home
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The settings of the sessions that certify (tests/sql/test_language_spark.py,
# tests/sql/test_certificates_spark.py): thousands of statements of a few thousand characters over
# tables of a few dozen rows, where Spark spent most of a query generating and compiling Java for its
# expressions and stages, and scheduling a task per shuffle partition. Measured on the certificates'
# statements (median per query, each setting on top of the previous): 677 ms; one shuffle partition
# 574; whole-stage code generation off 476; expressions interpreted (Spark's own tests' setting,
# never a user's) 279. Interpreted and generated code compute the same values (Spark tests one
# against the other); those tests are about dpproxy's SQL on Spark. Every other session on the
# server — the backend, wire and CLI tests, bench/engine.py — keeps Spark's defaults, as users' do.
SMALL_DATA_CONF = {
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}


def small_data_session(url: str) -> Any:
    """A new Spark Connect session at `url` (dpproxy's connect_session) with SMALL_DATA_CONF set."""
    from dpproxy.backends.spark import connect_session

    session = connect_session(url)
    for key, value in SMALL_DATA_CONF.items():
        session.conf.set(key, value)
    return session


@contextlib.contextmanager
def start_spark_server(directory: Path, *, driver_memory: str = "1g") -> Iterator[SparkServer]:
    """Start a Spark Connect server with its warehouse under `directory`; stop it on exit.

    `driver_memory` is the JVM heap of the local[2] driver (which also runs the executors): 1g holds
    the tests' data; bench/engine.py asks for more."""
    home = find_spark_home()
    if home is None:
        raise MissingSpark(
            "no Spark distribution: run bash scripts/test.sh (it installs pyspark into .spark/), "
            "or set DPPROXY_SPARK_HOME to a pyspark directory with bin/spark-submit"
        )
    if shutil.which("java") is None:
        raise MissingSpark("java was not found: Spark needs a JDK (Debian's default-jdk-headless)")
    directory.mkdir(parents=True, exist_ok=True)
    port, token = _free_port(), secrets.token_hex(16)
    warehouse, log = directory / "warehouse", directory / "spark-connect.log"
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(directory),
        "SPARK_CONF_DIR": str(directory),  # no stray spark-defaults.conf
    }
    command = [
        str(home / "bin" / "spark-submit"),
        "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--name", "dpproxy tests",
        "--master", "local[2]",
        "--driver-memory", driver_memory,
        "--conf", f"spark.connect.grpc.binding.port={port}",
        "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf", f"spark.connect.authenticate.token={token}",
        "--conf", "spark.sql.ansi.enabled=true",
        "--conf", "spark.sql.session.timeZone=UTC",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.sql.shuffle.partitions=2",
        "--conf", f"spark.sql.warehouse.dir={warehouse}",
        # The serial collector: G1's concurrent threads took CPU from the other test worker, for a heap
        # of 1g (a Spark language batch: 202 → 189 s of CPU, 114 → 105 s).
        "--driver-java-options", f"-Dderby.system.home={directory} -XX:+UseSerialGC",
        "spark-internal",
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=directory, start_new_session=True
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while b"Spark Connect server started" not in log.read_bytes():
            if process.poll() is not None:
                raise MissingSpark(f"the Spark Connect server exited ({process.returncode}); see {log}")
            if time.monotonic() > deadline:
                raise MissingSpark(
                    f"the Spark Connect server did not start in {STARTUP_TIMEOUT_S:g} s; see {log}"
                )
            time.sleep(0.2)
        yield SparkServer(port, token, warehouse, log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
