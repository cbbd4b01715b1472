"""Large answers: a 1,000,000-group GROUP BY through the proxy over the wire, streamed to the client.

    python bench/large.py [--groups 1000000] [--persons-per-group 6] [--epsilon 20] [--repeat 3]
                          [--backend duckdb|postgres]… [--postgres DSN] [--count-only]

The data: a synthetic population of groups × persons-per-group persons (one row each, `person_id`
the primary key), each living in a zip-like code `zip` shared by persons-per-group persons, so the
query `SELECT zip, COUNT(*), AVG(amount) FROM people GROUP BY zip` has `--groups` groups. Zip codes
are not public values (a policy cannot list a million of them, and a key that is not public must be
released through partition selection, which is what makes a huge answer private): each group is
released when its noisy count of persons reaches the threshold τ. This query's ε is split over
its three noisy components and partition selection; at ε = 1 τ is 64 (Laplace, δ = 1e-7), so a
million released groups would need some 80 persons each, 80M rows; the default ε = 20 brings τ to
5, and 6 persons per group release nearly all of them from 6M rows. What a streamed answer costs
does not depend on ε, only on how many rows the backend returns and the proxy releases.

For each backend, interleaved in each repetition (medians printed):
  raw      the analyst's GROUP BY run straight on the database, every row fetched by the driver
           (DuckDB: fetchmany; PostgreSQL: a server-side cursor, fetchmany);
  backend  the statement the proxy sends for it (the rewritten GROUP BY, sorted by the key's
           canonical order: what streaming in order costs the backend), fetched the same way;
  proxy    the query through `dpproxy serve` (a subprocess) over the wire with psycopg, rows read
           with fetchmany as they arrive (the proxy streams an Execute for all rows; psycopg holds
           them in libpq, on the client's side);
  ÷raw, ÷backend  proxy / raw and proxy / backend;
  rss      the serve process's peak resident set (VmHWM of /proc/<pid>/status) after the runs,
           and at start (after it answered one trivial query).
Data is cached under bench/.data/. The machine is shared and noisy: read ratios and medians.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import psycopg
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dpproxy.engine import Engine  # noqa: E402
from dpproxy.policy import parse_policy  # noqa: E402

QUERY = "SELECT zip, COUNT(*) AS n, AVG(amount) AS mean FROM people GROUP BY zip"
COUNT_ONLY = "SELECT zip, COUNT(*) AS n FROM people GROUP BY zip"
BATCH = 10_000


def setup_sql(groups: int, per_group: int) -> list[str]:
    return [
        "CREATE TABLE people (person_id INTEGER PRIMARY KEY, zip VARCHAR NOT NULL, amount INTEGER NOT NULL)",
        f"INSERT INTO people SELECT i, 'z' || lpad(CAST(i % {groups} AS VARCHAR), 7, '0'), i % 101 "
        f"FROM generate_series(0, {groups * per_group - 1}) AS t(i)",
    ]


def policy_text(epsilon: float) -> str:
    demo = yaml.safe_load((REPO / "dpproxy" / "data" / "demo.yaml").read_text())
    demo["defaults"].update({"epsilon": epsilon, "max_epsilon": max(epsilon, 1.0), "replay": False})
    demo["analysts"]["alice"].update({"epsilon": 1.0e9, "delta": 0.5})
    demo["tables"] = {
        "people": {
            "privacy_unit": "person_id",
            "max_groups_per_unit": 1,
            "max_rows_per_unit": 1,
            "columns": {
                "person_id": {"type": "integer"},
                "zip": {"type": "varchar"},
                "amount": {"type": "integer", "lower": 0, "upper": 100},
            },
        }
    }
    return yaml.safe_dump(demo, sort_keys=False)


def duckdb_file(groups: int, per_group: int) -> Path:
    path = REPO / "bench" / ".data" / f"large-{groups}x{per_group}.duckdb"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        started = time.perf_counter()
        with duckdb.connect(str(partial)) as conn:
            for statement in setup_sql(groups, per_group):
                conn.execute(statement)
        partial.rename(path)
        print(f"built {path.name} in {time.perf_counter() - started:.1f} s", flush=True)
    return path


@contextlib.contextmanager
def postgres(dsn: str | None, groups: int, per_group: int) -> Iterator[str]:
    if dsn is not None:
        yield dsn
        return
    from tests.pgcluster import create_database, find_pg_bindir, start_cluster

    bindir = find_pg_bindir()
    if bindir is None:
        raise SystemExit(
            "PostgreSQL server binaries not found: install postgresql-15 or pass --backend duckdb"
        )
    with start_cluster(bindir) as cluster:
        made = cluster.dsn(create_database(cluster, prefix="large"))
        started = time.perf_counter()
        with psycopg.connect(made, autocommit=True) as conn:
            for statement in setup_sql(groups, per_group):
                conn.execute(statement)
            conn.execute("VACUUM ANALYZE people")
        print(f"loaded PostgreSQL in {time.perf_counter() - started:.1f} s", flush=True)
        yield made


def fetch_duckdb(path: Path, sql: str) -> int:
    with duckdb.connect(str(path), read_only=True) as conn:
        result = conn.execute(sql)
        count = 0
        while rows := result.fetchmany(BATCH):
            count += len(rows)
        return count


def fetch_postgres(dsn: str, sql: str) -> int:
    with psycopg.connect(dsn) as conn, conn.cursor(name="raw") as cur:
        cur.execute(sql)
        count = 0
        while rows := cur.fetchmany(BATCH):
            count += len(rows)
        return count


def fetch_proxy(port: int, query: str) -> int:
    dsn = f"host=127.0.0.1 port={port} user=alice password=alice-demo dbname=demo sslmode=disable"
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query)
        count = 0
        while rows := cur.fetchmany(BATCH):
            count += len(rows)
        return count


def peak_rss_mb(pid: int) -> float:
    """The largest VmHWM of the serve process and its worker processes (the one that served the
    query holds the answer's memory)."""
    peaks, pending = [], [pid]
    while pending:
        current = pending.pop()
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peaks.append(int(line.split()[1]) / 1024)
            for task in Path(f"/proc/{current}/task").iterdir():
                pending.extend(int(c) for c in (task / "children").read_text().split())
    return max(peaks, default=float("nan"))


@contextlib.contextmanager
def serving(policy: Path, backend: str, work: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dpproxy.cli",
            "serve",
            "--policy",
            str(policy),
            "--backend",
            backend,
            "--port",
            str(port),
            "--ledger",
            str(work / f"ledger-{port}.sqlite"),
            "--database",
            "demo",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        dsn = f"host=127.0.0.1 port={port} user=alice password=alice-demo dbname=demo sslmode=disable"
        deadline = time.monotonic() + 120
        while True:
            try:
                with psycopg.connect(dsn, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("dpproxy serve did not start") from None
                time.sleep(0.3)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def timed(run: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    rows = run()
    return time.perf_counter() - started, rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--groups", type=int, default=1_000_000)
    parser.add_argument("--persons-per-group", type=int, default=6)
    parser.add_argument("--epsilon", type=float, default=20.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backend", action="append", choices=["duckdb", "postgres"])
    parser.add_argument("--postgres", help="DSN of a PostgreSQL database already holding the table")
    parser.add_argument("--port", type=int, default=16532)
    parser.add_argument("--count-only", action="store_true", help=f"ask {COUNT_ONLY!r} instead")
    args = parser.parse_args()
    query = COUNT_ONLY if args.count_only else QUERY
    backends = args.backend or ["duckdb", "postgres"]
    path = duckdb_file(args.groups, args.persons_per_group)
    print(
        f"{args.groups:,} groups × {args.persons_per_group} persons; ε={args.epsilon:g}; {query}; "
        f"{args.repeat} repetitions",
        flush=True,
    )
    print(
        f"{'backend':<9} {'rows':>9} {'raw s':>7} {'backend s':>9} {'proxy s':>8} {'÷raw':>6} "
        f"{'÷backend':>8} {'rss start MB':>12} {'rss peak MB':>11}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        policy = work / "policy.yaml"
        policy.write_text(policy_text(args.epsilon))
        # person_id is the primary key on both backends, as the served engine reads it at start.
        planner = Engine(
            parse_policy(policy.read_text()),
            None,
            dialect="duckdb",
            unique_columns={"people": frozenset({"person_id"})},
        )
        for offset, name in enumerate(backends):
            with contextlib.ExitStack() as stack:
                if name == "duckdb":
                    dsn = str(path)
                    planner.dialect = "duckdb"
                else:
                    dsn = stack.enter_context(postgres(args.postgres, args.groups, args.persons_per_group))
                    planner.dialect = "postgres"
                plan = planner.plan(query)
                sent = Engine._ordered_sql(plan, planner.dialect)
                fetch = fetch_duckdb if name == "duckdb" else fetch_postgres
                target: Path | str = path if name == "duckdb" else dsn
                raw_run = functools.partial(fetch, target, query)  # type: ignore[arg-type]
                backend_run = functools.partial(fetch, target, sent)  # type: ignore[arg-type]
                proxy_run = functools.partial(fetch_proxy, args.port + offset, query)
                server = stack.enter_context(serving(policy, dsn, work, args.port + offset))
                start_rss = peak_rss_mb(server.pid)
                raws, sents, proxies, rows = [], [], [], 0
                for _ in range(args.repeat):
                    raws.append(timed(raw_run)[0])
                    sents.append(timed(backend_run)[0])
                    elapsed, rows = timed(proxy_run)
                    proxies.append(elapsed)
                peak = peak_rss_mb(server.pid)
                raw, backend, proxy = (statistics.median(v) for v in (raws, sents, proxies))
                print(
                    f"{name:<9} {rows:>9,} {raw:>7.2f} {backend:>9.2f} {proxy:>8.2f} {proxy / raw:>6.2f} "
                    f"{proxy / backend:>8.2f} {start_rss:>12.0f} {peak:>11.0f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
