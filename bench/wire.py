"""Wire benchmark: what psycopg clients see through dpproxy, against the same SQL straight on PostgreSQL.

    python bench/wire.py [--persons 10000] [--seconds 3] [--clients 1,16,64] [--workers N[,M…]]
                         [--client-processes 2] [--only public|fresh|replay]…

Starts a throwaway PostgreSQL 15 cluster with the demo data and, for each `--workers` count (passed
to `dpproxy serve --workers`; dpproxy's default when not given), two `dpproxy serve` subprocesses
over it: one whose policy turns free replay off, one with replay on; both give alice a huge budget.
Then, for each number of concurrent clients (one psycopg connection each, spread over
`--client-processes` processes so the clients' own Python does not cap the rate), it runs each
workload for a fixed time, straight on PostgreSQL and through each proxy, and prints queries/s,
p50/p99 latency, the throughput ratio and the latency added at the median against the same SQL
straight on PostgreSQL, and the proxy's CPU per query (all its processes: user + system time), which
a busy machine disturbs much less than the times:

- public:  `SELECT city FROM zip_info WHERE zip = $1` (a public table: the proxy adds no noise), a
           random zip each time; direct: the same statement.
- fresh:   `SELECT COUNT(*) FROM patients WHERE age > $1` with replay off: every query is planned,
           run, noised and charged (a ledger write); direct: the same raw COUNT.
- replay:  the same statement with replay on, drawing only 11 ages warmed beforehand: every query is
           a free replay hit (stored answer, nothing run, nothing charged).

Everything in one run: read the ratios and the added median, not the absolute numbers (machines are
shared and noisy).
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.pool
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

PUBLIC = "SELECT city FROM zip_info WHERE zip = %s"
PRIVATE = "SELECT COUNT(*) FROM patients WHERE age > %s"
ZIPS = [str(10000 + i * 43 + 1234) for i in range(2000)]  # the demo's zip codes (dpproxy/demo.py)
WARM_AGES = list(range(0, 101, 10))


def bench_policy(*, replay: bool) -> str:
    text = (REPO / "policies" / "demo.yaml").read_text()
    text = text.replace("epsilon: 10.0       # total budget", "epsilon: 1.0e9")
    return text.replace("  data_epoch: 0\n", f"  data_epoch: 0\n  replay: {'true' if replay else 'false'}\n")


def draw(workload: str, rng: random.Random) -> tuple[str, tuple[object, ...]]:
    if workload == "public":
        return PUBLIC, (rng.choice(ZIPS),)
    if workload == "replay":
        return PRIVATE, (rng.choice(WARM_AGES),)
    return PRIVATE, (rng.randrange(0, 121),)


def client_process(dsn: str, workload: str, threads: int, start_at: float, seconds: float) -> list[float]:
    """Latencies (s) of every query `threads` connections ran from `start_at` (wall clock) on."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    connections = [psycopg.connect(dsn, autocommit=True) for _ in range(threads)]
    for conn in connections:  # warm each connection (and, for replay, the stored answers)
        for age in WARM_AGES:
            sql, params = draw(workload, random.Random(age))
            if workload == "replay":
                params = (age,)
            conn.execute(sql, params).fetchall()

    def client(i: int) -> None:
        conn, mine, rng = connections[i], latencies[i], random.Random(os.getpid() * 1000 + i)
        time.sleep(max(0.0, start_at - time.time()))
        stop_at = time.perf_counter() + seconds
        while time.perf_counter() < stop_at:
            sql, params = draw(workload, rng)
            started = time.perf_counter()
            conn.execute(sql, params).fetchall()
            mine.append(time.perf_counter() - started)

    workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    for conn in connections:
        conn.close()
    return [x for mine in latencies for x in mine]


def run_clients(
    pool: multiprocessing.pool.Pool, processes: int, dsn: str, workload: str, clients: int, seconds: float
) -> list[float]:
    """`clients` connections over at most `processes` processes, all starting together."""
    shares = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    start_at = time.time() + 1.0 + 0.05 * clients  # time to connect and warm
    jobs = [
        pool.apply_async(client_process, (dsn, workload, share, start_at, seconds))
        for share in shares
        if share
    ]
    return [x for job in jobs for x in job.get()]


def summary(latencies: list[float], seconds: float) -> tuple[float, float, float]:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return len(ordered) / seconds, statistics.median(ordered) * 1000, p99 * 1000


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by a process and its live descendants (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0.0
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(tree_cpu(int(child)) for child in children)


def wait_for(dsn: str, process: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=2):
                return
        except psycopg.OperationalError:
            if process.poll() is not None:
                raise SystemExit(f"dpproxy serve exited: {process.stderr.read().decode()}") from None  # type: ignore[union-attr]
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def start_proxy(
    work_dir: Path, name: str, backend_dsn: str, port: int, replay: bool, workers: int | None
) -> subprocess.Popen[bytes]:
    policy = work_dir / f"{name}.yaml"
    policy.write_text(bench_policy(replay=replay))
    command = [str(Path(sys.executable).parent / "dpproxy"), "serve", "--policy", str(policy)]
    command += ["--backend", backend_dsn, "--port", str(port), "--database", "demo"]
    command += ["--ledger", str(work_dir / f"{name}-ledger.sqlite")]
    if workers is not None:
        command += ["--workers", str(workers)]
    return subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--persons", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clients", default="1,16,64")
    parser.add_argument("--port", type=int, default=16432, help="the proxies listen on PORT and PORT+1")
    parser.add_argument(
        "--workers", default=None, help="dpproxy serve --workers, or several counts: 1,2 [its default]"
    )
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument(
        "--only", action="append", default=[], help="run only these workloads (public, fresh, replay)"
    )
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    counts: list[int | None] = [int(w) for w in args.workers.split(",")] if args.workers else [None]
    workloads = [w for w in ("public", "fresh", "replay") if not args.only or w in args.only]

    bindir = find_pg_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL server binaries not found: install postgresql-15")
    context = multiprocessing.get_context("fork")  # before any thread or connection of this process
    with (
        tempfile.TemporaryDirectory() as work,
        start_cluster(bindir) as cluster,
        context.Pool(args.client_processes) as pool,
    ):
        work_dir = Path(work)
        name = create_database(cluster, prefix="wirebench")
        backend_dsn = cluster.dsn(name)
        build_demo(work_dir / "demo.duckdb", args.persons, seed=0)
        load_into_postgres(work_dir / "demo.duckdb", backend_dsn)
        servers: dict[tuple[int | None, str], subprocess.Popen[bytes]] = {}
        proxy_dsn: dict[tuple[int | None, str], str] = {}
        for j, count in enumerate(counts):
            for i, kind in enumerate(("fresh", "replay")):
                port = args.port + 2 * j + i
                servers[count, kind] = start_proxy(
                    work_dir, f"{kind}-{j}", backend_dsn, port, kind == "replay", count
                )
                proxy_dsn[count, kind] = f"postgresql://alice:alice-demo@127.0.0.1:{port}/demo"
            proxy_dsn[count, "public"] = proxy_dsn[count, "fresh"]
            servers[count, "public"] = servers[count, "fresh"]
        try:
            for key, server in servers.items():
                wait_for(proxy_dsn[key], server)
            workers = args.workers if args.workers is not None else "default"
            print(
                f"demo data: {args.persons:,} persons; {args.seconds:g} s per run; "
                f"dpproxy --workers {workers}; "
                f"{args.client_processes} client processes; {os.cpu_count()} cores"
            )
            print(f"public: {PUBLIC}\nfresh, replay: {PRIVATE} (fresh: replay off; replay: 11 warmed ages)")
            print(
                f"{'clients':>7} {'workload':>8}  {'direct q/s':>10} {'p50 ms':>7} {'p99 ms':>7}  "
                f"{'workers':>7} {'proxy q/s':>9} {'p50 ms':>7} {'p99 ms':>7}   {'proxy/direct':>12} "
                f"{'added p50 ms':>12} {'CPU ms/q':>8}"
            )
            for clients in levels:
                direct_runs: dict[str, tuple[float, float, float]] = {}
                for workload in workloads:
                    direct_kind = "public" if workload == "public" else "private"
                    if direct_kind not in direct_runs:
                        raw = "public" if workload == "public" else "fresh"
                        latencies = run_clients(
                            pool, args.client_processes, backend_dsn, raw, clients, args.seconds
                        )
                        direct_runs[direct_kind] = summary(latencies, args.seconds)
                    direct = direct_runs[direct_kind]
                    for count in counts:
                        pid = servers[count, workload].pid
                        cpu_before = tree_cpu(pid)
                        latencies = run_clients(
                            pool,
                            args.client_processes,
                            proxy_dsn[count, workload],
                            workload,
                            clients,
                            args.seconds,
                        )
                        # Connecting and warming are in it too: a little above the steady state.
                        cpu = (tree_cpu(pid) - cpu_before) / len(latencies) * 1000
                        proxied = summary(latencies, args.seconds)
                        print(
                            f"{clients:>7} {workload:>8}  "
                            f"{direct[0]:>10.0f} {direct[1]:>7.2f} {direct[2]:>7.2f}  "
                            f"{count or 'default':>7} "
                            f"{proxied[0]:>9.0f} {proxied[1]:>7.2f} {proxied[2]:>7.2f}   "
                            f"{proxied[0] / direct[0]:>11.1%} {proxied[1] - direct[1]:>12.2f} {cpu:>8.2f}",
                            flush=True,
                        )
        finally:
            for server in set(servers.values()):
                server.terminate()
            for server in set(servers.values()):
                try:
                    server.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    server.kill()


if __name__ == "__main__":
    main()
