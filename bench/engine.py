"""Engine benchmark: DP query time ÷ the same raw aggregate on the same backend, and engine CPU.

    python bench/engine.py [--persons 1000000|5000000|…] [--repeat 7] [--only TEXT]…
                           [--backend postgres|spark]… [--postgres DSN | --no-postgres]
                           [--spark-url sc://… | --spark-memory 6g]

Builds (once, cached under bench/.data/) the demo data at the requested scale — 1M persons is
~5M rows — and measures it on DuckDB (always: it is the reference) and on the other backends asked
for (`--backend`, repeatable; default postgres). PostgreSQL is a throwaway PostgreSQL 15 cluster
started by this script (or `--postgres DSN`); Spark is a local[2] Spark Connect server started by
this script from the test harness's Spark (tests/sparkserver.py, `--spark-memory` of driver heap),
or `--spark-url` for a running one. The same DuckDB file is loaded into each (`dpproxy.demo`; the
Spark tables go to the database `bench`, named in the policy as each table's `schema`, and a running
server that already holds them with the same row counts is not loaded again). For each
query and backend, in one run, interleaving raw, floor and DP so machine noise hits all alike, it
reports medians of:
  raw    the plain aggregate SQL, straight on the backend (through the same Backend object);
  floor  the least any user-level engine must run for it: the raw per-person aggregation
         `GROUP BY unit, key` (each person's count, sums… per group), then `GROUP BY key` over
         those rows — no clipping, no bound on a person's groups, no noise. Joins aggregate the
         joined rows per person; quantiles take each person's median per group, then the
         quantiles of those (the per-person pass a user-level quantile needs at least);
  dp     Engine.execute of the same SQL (plan, rewritten SQL with bounding, noise, post-processing);
  ÷raw, ÷floor  dp / raw and dp / floor;
  cpu    the engine's own time per query, i.e. dp minus the time spent inside Backend.run;
  ÷duckdb  (other backends) this backend's dp ÷ DuckDB's dp for the same query.
Spark keeps no unique keys, so `patients` is measured with the policy vouching for its unique unit
(`unit_unique: true`), as an operator would set it for a table with one row per person.
Machines are shared and noisy: read ratios and medians, not single timings.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import sqlglot
from sqlglot import exp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dpproxy.backends import Backend, Cancellation, LiveColumn, open_backend  # noqa: E402
from dpproxy.budget.sqlite import SQLiteLedger  # noqa: E402
from dpproxy.demo import build_demo, load_into_postgres, load_into_spark  # noqa: E402
from dpproxy.engine import Engine  # noqa: E402
from dpproxy.policy import parse_policy  # noqa: E402

# (label, the analyst's SQL, its floor: see the module docstring)
QUERIES: list[tuple[str, str, str]] = [
    (
        "count, one row per person",
        "SELECT diagnosis, COUNT(*) FROM patients GROUP BY diagnosis",
        "SELECT diagnosis, COUNT(*), SUM(n) FROM (SELECT patient_id, diagnosis, COUNT(*) AS n "
        "FROM patients GROUP BY patient_id, diagnosis) AS t GROUP BY diagnosis",
    ),
    (
        "sum, one row per person",
        "SELECT diagnosis, SUM(income) FROM patients GROUP BY diagnosis",
        "SELECT diagnosis, COUNT(*), SUM(s) FROM (SELECT patient_id, diagnosis, SUM(income) AS s "
        "FROM patients GROUP BY patient_id, diagnosis) AS t GROUP BY diagnosis",
    ),
    (
        "avg, one row per person",
        "SELECT sex, AVG(income) FROM patients GROUP BY sex",
        "SELECT sex, COUNT(*), SUM(c), SUM(s) FROM (SELECT patient_id, sex, COUNT(income) AS c, "
        "SUM(income) AS s FROM patients GROUP BY patient_id, sex) AS t GROUP BY sex",
    ),
    (
        "count, many rows per person",
        "SELECT department, COUNT(*) FROM visits GROUP BY department",
        "SELECT department, COUNT(*), SUM(n) FROM (SELECT patient_id, department, COUNT(*) AS n "
        "FROM visits GROUP BY patient_id, department) AS t GROUP BY department",
    ),
    (
        "sum, many rows per person",
        "SELECT department, SUM(cost) FROM visits GROUP BY department",
        "SELECT department, COUNT(*), SUM(s) FROM (SELECT patient_id, department, SUM(cost) AS s "
        "FROM visits GROUP BY patient_id, department) AS t GROUP BY department",
    ),
    (
        "avg, many rows per person",
        "SELECT department, AVG(cost) FROM visits GROUP BY department",
        "SELECT department, COUNT(*), SUM(c), SUM(s) FROM (SELECT patient_id, department, COUNT(cost) AS c, "
        "SUM(cost) AS s FROM visits GROUP BY patient_id, department) AS t GROUP BY department",
    ),
    (
        "count+sum+avg, many rows",
        "SELECT department, COUNT(*), SUM(duration_minutes), AVG(cost) FROM visits "
        "WHERE visit_date >= DATE '2022-01-01' GROUP BY department",
        "SELECT department, COUNT(*), SUM(n), SUM(d), SUM(c), SUM(s) FROM (SELECT patient_id, department, "
        "COUNT(*) AS n, SUM(duration_minutes) AS d, COUNT(cost) AS c, SUM(cost) AS s FROM visits "
        "WHERE visit_date >= DATE '2022-01-01' GROUP BY patient_id, department) AS t GROUP BY department",
    ),
    (
        "private keys (selection)",
        "SELECT zip, COUNT(*) FROM patients GROUP BY zip",
        "SELECT zip, COUNT(*), SUM(n) FROM (SELECT patient_id, zip, COUNT(*) AS n FROM patients "
        "GROUP BY patient_id, zip) AS t GROUP BY zip",
    ),
    (
        "join on the unit",
        "SELECT p.sex, COUNT(*), AVG(v.cost) FROM patients p JOIN visits v "
        "ON p.patient_id = v.patient_id GROUP BY p.sex",
        "SELECT sex, COUNT(*), SUM(n), SUM(c), SUM(s) FROM (SELECT p.patient_id, p.sex, COUNT(*) AS n, "
        "COUNT(v.cost) AS c, SUM(v.cost) AS s FROM patients p JOIN visits v ON p.patient_id = v.patient_id "
        "GROUP BY p.patient_id, p.sex) AS t GROUP BY sex",
    ),
    (
        "join to a public table",
        "SELECT z.state, COUNT(*), AVG(p.income) FROM patients p JOIN zip_info z "
        "ON p.zip = z.zip GROUP BY z.state",
        "SELECT state, COUNT(*), SUM(n), SUM(c), SUM(s) FROM (SELECT p.patient_id, z.state, COUNT(*) AS n, "
        "COUNT(p.income) AS c, SUM(p.income) AS s FROM patients p JOIN zip_info z ON p.zip = z.zip "
        "GROUP BY p.patient_id, z.state) AS t GROUP BY state",
    ),
    (
        "median per group",
        "SELECT department, MEDIAN(cost) FROM visits GROUP BY department",
        "SELECT department, MEDIAN(m) FROM (SELECT patient_id, department, MEDIAN(cost) AS m FROM visits "
        "GROUP BY patient_id, department) AS t GROUP BY department",
    ),
    (
        "10-quantiles per group",
        "SELECT diagnosis, "
        + ", ".join(f"percentile_cont({q / 10}) WITHIN GROUP (ORDER BY income)" for q in range(1, 10))
        + " FROM patients GROUP BY diagnosis",
        "SELECT diagnosis, "
        + ", ".join(f"percentile_cont({q / 10}) WITHIN GROUP (ORDER BY m)" for q in range(1, 10))
        + " FROM (SELECT patient_id, diagnosis, MEDIAN(income) AS m FROM patients "
        "GROUP BY patient_id, diagnosis) AS t GROUP BY diagnosis",
    ),
    (
        "top-5",
        "SELECT zip, COUNT(*) AS n FROM patients GROUP BY zip ORDER BY n DESC LIMIT 5",
        "SELECT zip, COUNT(*) AS u, SUM(n) AS n FROM (SELECT patient_id, zip, COUNT(*) AS n FROM patients "
        "GROUP BY patient_id, zip) AS t GROUP BY zip ORDER BY n DESC LIMIT 5",
    ),
]


class TimedBackend(Backend):
    """Wraps a backend to measure the time its queries take, so engine time can be separated."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.dialect = inner.dialect
        self.default_schema = inner.default_schema
        self.spent = 0.0

    def run(self, sql: str, *, cancel: Cancellation | None = None) -> list[tuple]:
        started = time.perf_counter()
        try:
            return self.inner.run(sql, cancel=cancel)
        finally:
            self.spent += time.perf_counter() - started

    def tables(self, schema: str | None = None) -> dict[str, list[LiveColumn]]:
        return self.inner.tables(schema)

    def unique_columns(self, schema: str | None = None) -> dict[str, set[str]]:
        return self.inner.unique_columns(schema)

    def close(self) -> None:
        self.inner.close()


@dataclass
class Row:
    backend: str
    name: str
    raw: list[float]
    floor: list[float]
    dp: list[float]
    cpu: list[float]


# The Spark database the benchmark loads the demo tables into.
SPARK_DATABASE = "bench"


def bench_policy(schema: str | None = None) -> str:
    text = (REPO / "policies" / "demo.yaml").read_text()
    # One analyst with a budget no benchmark can exhaust; every repetition really runs (no replay).
    text = text.replace("epsilon: 10.0       # total budget", "epsilon: 1.0e9")
    text = text.replace("  mechanism: laplace\n", "  mechanism: laplace\n  replay: false\n")
    if schema is not None:  # Spark: the tables live in a database, and patients' unit is vouched for
        text = text.replace("  patients:\n", f"  patients:\n    schema: {schema}\n    unit_unique: true\n")
        text = text.replace("  visits:\n", f"  visits:\n    schema: {schema}\n")
        text = text.replace("zip_info: {public: true}", f"zip_info: {{public: true, schema: {schema}}}")
    return text


def raw_sql(sql: str, dialect: str, schema: str | None) -> str:
    """The analyst's SQL in the backend's dialect (PostgreSQL has no MEDIAN), tables in `schema`."""
    tree = sqlglot.parse_one(sql, read="postgres")
    if schema is not None:
        for table in tree.find_all(exp.Table):
            table.set("db", exp.to_identifier(schema))
    return tree.sql(dialect=dialect)


def measure(
    label: str,
    dsn: str,
    repeat: int,
    ledger_dir: Path,
    only: tuple[str, ...] = (),
    schema: str | None = None,
    reference: dict[str, float] | None = None,
) -> list[Row]:
    """Time every query on one backend; `reference`: DuckDB's median DP time per query name, to
    print this backend's DP time against it."""
    # No time limit: a benchmark measures how long queries take, however long.
    backend = TimedBackend(open_backend(dsn, statement_timeout_s=0))
    policy = parse_policy(bench_policy(schema))
    engine = Engine(policy, backend, SQLiteLedger(ledger_dir / f"{label}.sqlite"))
    rows = []
    for name, sql, floor_sql in QUERIES:
        if only and not any(text in name for text in only):
            continue
        raw = raw_sql(sql, backend.dialect, schema)
        floor = raw_sql(floor_sql, backend.dialect, schema)
        row = Row(label, name, [], [], [], [])
        engine.execute(sql, analyst="alice")  # warm caches and plans alike for all three
        backend.run(raw)
        backend.run(floor)
        for _ in range(repeat):
            started = time.perf_counter()
            backend.run(raw)
            row.raw.append(time.perf_counter() - started)
            started = time.perf_counter()
            backend.run(floor)
            row.floor.append(time.perf_counter() - started)
            backend.spent = 0.0
            started = time.perf_counter()
            engine.execute(sql, analyst="alice")
            total = time.perf_counter() - started
            row.dp.append(total)
            row.cpu.append(total - backend.spent)
        rows.append(row)
        versus = ""
        if reference and name in reference:
            versus = f"  ÷duckdb {statistics.median(row.dp) / reference[name]:6.2f}x"
        dp = statistics.median(row.dp)
        print(
            f"  {label:8} {name:30} raw {ms(row.raw):>10}  floor {ms(row.floor):>10}  dp {ms(row.dp):>10}  "
            f"÷raw {dp / statistics.median(row.raw):6.2f}x  "
            f"÷floor {dp / statistics.median(row.floor):5.2f}x  "
            f"engine cpu {ms(row.cpu):>8}{versus}",
            flush=True,
        )
    engine.close()
    return rows


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms"


@contextlib.contextmanager
def throwaway_postgres(duckdb_path: Path) -> Iterator[str]:
    from tests.pgcluster import create_database, find_pg_bindir, start_cluster

    bindir = find_pg_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL server binaries not found: install postgresql-15 or pass --no-postgres")
    with start_cluster(bindir) as cluster:
        name = create_database(cluster, prefix="bench")
        dsn = cluster.dsn(name)
        started = time.perf_counter()
        load_into_postgres(duckdb_path, dsn)
        print(f"loaded the demo data into PostgreSQL in {time.perf_counter() - started:.1f} s", flush=True)
        yield dsn


@contextlib.contextmanager
def spark_server(url: str | None, memory: str) -> Iterator[str]:
    """The URL of a Spark Connect server: `url`, or a local[2] one started for this run."""
    if url:
        yield url
        return
    from tests.sparkserver import start_spark_server

    started = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="dpproxy-bench-spark-") as directory,
        start_spark_server(Path(directory), driver_memory=memory) as server,
    ):
        print(
            f"started a local[2] Spark Connect server ({memory} driver) in "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )
        yield server.url


def spark_holds(url: str, duckdb_path: Path) -> bool:
    """Whether the Spark database SPARK_DATABASE holds the demo tables with the DuckDB file's row
    counts (a running server loaded by an earlier run: loading 10M rows takes minutes)."""
    import duckdb

    from dpproxy.backends.spark import connect_session
    from dpproxy.demo import DEMO_TABLES

    session = connect_session(url)
    try:
        if not session.catalog.databaseExists(SPARK_DATABASE):
            return False
        names = {t.name for t in session.catalog.listTables(SPARK_DATABASE)}
        if any(t.name not in names for t in DEMO_TABLES):
            return False
        with duckdb.connect(str(duckdb_path), read_only=True) as source:
            for table in DEMO_TABLES:
                (expected,) = source.execute(f"SELECT count(*) FROM {table.name}").fetchall()[0]
                found = session.sql(f"SELECT count(*) FROM `{SPARK_DATABASE}`.`{table.name}`").collect()
                if found[0][0] != expected:
                    return False
        return True
    finally:
        session.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--persons", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--backend",
        action="append",
        choices=["postgres", "spark"],
        help="backends measured besides DuckDB (repeatable; default: postgres)",
    )
    parser.add_argument("--postgres", help="DSN of a PostgreSQL database to load the data into and use")
    parser.add_argument("--no-postgres", action="store_true", help="DuckDB only (without --backend)")
    parser.add_argument(
        "--spark-url",
        help=f"sc://… URL of a running Spark Connect server (the data is loaded into `{SPARK_DATABASE}`)",
    )
    parser.add_argument("--spark-memory", default="6g", help="driver heap of the local Spark server")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only the queries whose label contains this (repeatable: any of them)",
    )
    args = parser.parse_args()
    backends = args.backend or ([] if args.no_postgres else ["postgres"])
    only = tuple(args.only)

    data = REPO / "bench" / ".data"
    data.mkdir(parents=True, exist_ok=True)
    duckdb_path = data / f"demo-{args.persons}.duckdb"
    if not duckdb_path.exists():
        summary = build_demo(duckdb_path, args.persons, seed=0)
        print(f"built {summary.persons:,} patients + {summary.visits:,} visits in {summary.seconds:.1f} s")
    rows: list[Row] = []
    run_started = time.perf_counter()
    with tempfile.TemporaryDirectory() as ledgers:
        print(f"DuckDB ({duckdb_path.name}), median of {args.repeat}:", flush=True)
        rows += measure("duckdb", str(duckdb_path), args.repeat, Path(ledgers), only)
        reference = {r.name: statistics.median(r.dp) for r in rows}
        if "postgres" in backends:
            with contextlib.ExitStack() as stack:
                dsn = args.postgres
                if dsn:
                    load_into_postgres(duckdb_path, dsn)
                else:
                    dsn = stack.enter_context(throwaway_postgres(duckdb_path))
                print(f"PostgreSQL, median of {args.repeat}:", flush=True)
                rows += measure("postgres", dsn, args.repeat, Path(ledgers), only, reference=reference)
        if "spark" in backends:
            with spark_server(args.spark_url, args.spark_memory) as url:
                started = time.perf_counter()
                if args.spark_url and spark_holds(url, duckdb_path):
                    print(f"the Spark database `{SPARK_DATABASE}` already holds this data", flush=True)
                else:
                    load_into_spark(duckdb_path, url, database=SPARK_DATABASE)
                    seconds = time.perf_counter() - started
                    print(f"loaded the demo data into Spark in {seconds:.1f} s", flush=True)
                print(f"Spark, median of {args.repeat}:", flush=True)
                rows += measure("spark", url, args.repeat, Path(ledgers), only, SPARK_DATABASE, reference)
    print()
    print(f"summary (medians; whole run {time.perf_counter() - run_started:.0f} s):")
    for backend in sorted({r.backend for r in rows}):
        mine = [r for r in rows if r.backend == backend]
        ratios = [statistics.median(r.dp) / statistics.median(r.raw) for r in mine]
        floors = [statistics.median(r.dp) / statistics.median(r.floor) for r in mine]
        cpu = [c for r in mine for c in r.cpu]
        line = (
            f"  {backend:8}  DP ÷ raw: median {statistics.median(ratios):.2f}x, "
            f"range {min(ratios):.2f}–{max(ratios):.2f}x;  "
            f"DP ÷ floor: median {statistics.median(floors):.2f}x, "
            f"range {min(floors):.2f}–{max(floors):.2f}x;  engine CPU per query: median "
            f"{statistics.median(cpu) * 1000:.2f} ms"
        )
        versus = [statistics.median(r.dp) / reference[r.name] for r in mine if r.name in reference]
        if backend != "duckdb" and versus:
            line += (
                f";  DP ÷ DuckDB DP: median {statistics.median(versus):.2f}x, "
                f"range {min(versus):.2f}–{max(versus):.2f}x"
            )
        print(line)


if __name__ == "__main__":
    main()
