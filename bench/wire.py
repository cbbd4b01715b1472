"""Wire benchmark: a small DP COUNT through dpproxy vs the same raw query straight on PostgreSQL.

    python bench/wire.py [--persons 10000] [--seconds 5] [--clients 1,16,64]

Starts a throwaway PostgreSQL 15 cluster with the demo data, and `dpproxy serve` over it in a
subprocess (so the proxy does not share this process's interpreter with the clients). Then, for each
number of concurrent clients (one psycopg connection per thread), it runs the same parameterised
query for a fixed time, first straight on PostgreSQL, then through the proxy, and prints queries/s
and p50/p99 latency for both, and the latency the proxy adds at the median. Everything in one run:
read the ratios and the added median, not the absolute numbers (machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dpproxy.demo import build_demo, load_into_postgres  # noqa: E402
from tests.pgcluster import create_database, find_pg_bindir, start_cluster  # noqa: E402

QUERY = "SELECT COUNT(*) FROM patients WHERE age > %s"


def bench_policy() -> str:
    text = (REPO / "policies" / "demo.yaml").read_text()
    return text.replace("epsilon: 10.0       # total budget", "epsilon: 1.0e9")


def run_clients(dsn: str, clients: int, seconds: float) -> list[float]:
    """Latencies (s) of every query run by `clients` threads, each on its own connection."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    connections = [psycopg.connect(dsn, autocommit=True) for _ in range(clients)]
    for conn in connections:  # warm each connection and the proxy's plan cache alike
        for age in range(0, 101, 10):
            conn.execute(QUERY, (age,)).fetchall()
    barrier = threading.Barrier(clients)
    stop_at = [0.0]

    def client(i: int) -> None:
        conn, mine, rng = connections[i], latencies[i], random.Random(i)
        barrier.wait()
        if i == 0:
            stop_at[0] = time.perf_counter() + seconds
        while not stop_at[0]:
            pass
        while time.perf_counter() < stop_at[0]:
            started = time.perf_counter()
            conn.execute(QUERY, (rng.randrange(0, 101, 10),)).fetchall()
            mine.append(time.perf_counter() - started)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for conn in connections:
        conn.close()
    return [x for mine in latencies for x in mine]


def summary(latencies: list[float], seconds: float) -> tuple[float, float, float]:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return len(ordered) / seconds, statistics.median(ordered) * 1000, p99 * 1000


def wait_for(dsn: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=2):
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--persons", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", default="1,16,64")
    parser.add_argument("--port", type=int, default=16432)
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]

    bindir = find_pg_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL server binaries not found: install postgresql-15")
    with tempfile.TemporaryDirectory() as work, start_cluster(bindir) as cluster:
        work_dir = Path(work)
        name = create_database(cluster, prefix="wirebench")
        backend_dsn = cluster.dsn(name)
        build_demo(work_dir / "demo.duckdb", args.persons, seed=0)
        load_into_postgres(work_dir / "demo.duckdb", backend_dsn)
        policy = work_dir / "policy.yaml"
        policy.write_text(bench_policy())
        server = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "dpproxy"),
                "serve",
                "--policy",
                str(policy),
                "--backend",
                backend_dsn,
                "--port",
                str(args.port),
                "--ledger",
                str(work_dir / "ledger.sqlite"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        proxy_dsn = f"postgresql://alice:alice-demo@127.0.0.1:{args.port}/demo"
        try:
            wait_for(proxy_dsn)
            print(f"demo data: {args.persons:,} persons; query: {QUERY}; {args.seconds:g} s per run")
            print(
                f"{'clients':>7}  {'direct q/s':>10} {'p50 ms':>7} {'p99 ms':>7}   "
                f"{'proxy q/s':>10} {'p50 ms':>7} {'p99 ms':>7}   {'added p50 ms':>12}"
            )
            for clients in levels:
                direct = summary(run_clients(backend_dsn, clients, args.seconds), args.seconds)
                proxied = summary(run_clients(proxy_dsn, clients, args.seconds), args.seconds)
                print(
                    f"{clients:>7}  {direct[0]:>10.0f} {direct[1]:>7.2f} {direct[2]:>7.2f}   "
                    f"{proxied[0]:>10.0f} {proxied[1]:>7.2f} {proxied[2]:>7.2f}   "
                    f"{proxied[1] - direct[1]:>12.2f}",
                    flush=True,
                )
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()


if __name__ == "__main__":
    main()
