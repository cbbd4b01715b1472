"""Engine benchmark: DP query time ÷ the same raw aggregate on the same backend, and engine CPU.

    python bench/engine.py [--persons 1000000] [--repeat 7] [--postgres DSN | --no-postgres] [--only TEXT]

Builds (once, cached under bench/.data/) the demo data at the requested scale — 1M persons is
~5M rows — and, unless told otherwise, loads it into a throwaway PostgreSQL 15 cluster started by
this script. For each query and backend, in one run, interleaving the two so machine noise hits
both alike, it reports medians of:
  raw    the plain aggregate SQL, straight on the backend (through the same Backend object);
  dp     Engine.execute of the same SQL (plan, rewritten SQL with bounding, noise, post-processing);
  ratio  dp / raw;
  cpu    the engine's own time per query, i.e. dp minus the time spent inside Backend.run.
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dpproxy.backends import Backend, Cancellation, LiveColumn, open_backend  # noqa: E402
from dpproxy.budget.sqlite import SQLiteLedger  # noqa: E402
from dpproxy.demo import build_demo, load_into_postgres  # noqa: E402
from dpproxy.engine import Engine  # noqa: E402
from dpproxy.policy import parse_policy  # noqa: E402

QUERIES: list[tuple[str, str]] = [
    ("count, one row per person", "SELECT diagnosis, COUNT(*) FROM patients GROUP BY diagnosis"),
    ("sum, one row per person", "SELECT diagnosis, SUM(income) FROM patients GROUP BY diagnosis"),
    ("avg, one row per person", "SELECT sex, AVG(income) FROM patients GROUP BY sex"),
    ("count, many rows per person", "SELECT department, COUNT(*) FROM visits GROUP BY department"),
    ("sum, many rows per person", "SELECT department, SUM(cost) FROM visits GROUP BY department"),
    ("avg, many rows per person", "SELECT department, AVG(cost) FROM visits GROUP BY department"),
    (
        "count+sum+avg, many rows",
        "SELECT department, COUNT(*), SUM(duration_minutes), AVG(cost) FROM visits "
        "WHERE visit_date >= DATE '2022-01-01' GROUP BY department",
    ),
    ("private keys (selection)", "SELECT zip, COUNT(*) FROM patients GROUP BY zip"),
    (
        "join on the unit",
        "SELECT p.sex, COUNT(*), AVG(v.cost) FROM patients p JOIN visits v "
        "ON p.patient_id = v.patient_id GROUP BY p.sex",
    ),
    (
        "join to a public table",
        "SELECT z.state, COUNT(*), AVG(p.income) FROM patients p JOIN zip_info z "
        "ON p.zip = z.zip GROUP BY z.state",
    ),
    ("median per group", "SELECT department, MEDIAN(cost) FROM visits GROUP BY department"),
    (
        "10-quantiles per group",
        "SELECT diagnosis, "
        + ", ".join(f"percentile_cont({q / 10}) WITHIN GROUP (ORDER BY income)" for q in range(1, 10))
        + " FROM patients GROUP BY diagnosis",
    ),
    ("top-5", "SELECT zip, COUNT(*) AS n FROM patients GROUP BY zip ORDER BY n DESC LIMIT 5"),
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
    dp: list[float]
    cpu: list[float]


def bench_policy() -> str:
    text = (REPO / "policies" / "demo.yaml").read_text()
    # One analyst with a budget no benchmark can exhaust; every repetition really runs (no replay).
    text = text.replace("epsilon: 10.0       # total budget", "epsilon: 1.0e9")
    return text.replace("  mechanism: laplace\n", "  mechanism: laplace\n  replay: false\n")


def measure(label: str, dsn: str, repeat: int, ledger_dir: Path, only: str = "") -> list[Row]:
    backend = TimedBackend(open_backend(dsn))
    engine = Engine(parse_policy(bench_policy()), backend, SQLiteLedger(ledger_dir / f"{label}.sqlite"))
    rows = []
    for name, sql in QUERIES:
        if only not in name:
            continue
        # The raw query is the analyst's SQL in the backend's dialect (PostgreSQL has no MEDIAN).
        raw = sqlglot.transpile(sql, read="postgres", write=backend.dialect)[0]
        row = Row(label, name, [], [], [])
        engine.execute(sql, analyst="alice")  # warm caches and plans alike for both
        backend.run(raw)
        for _ in range(repeat):
            started = time.perf_counter()
            backend.run(raw)
            row.raw.append(time.perf_counter() - started)
            backend.spent = 0.0
            started = time.perf_counter()
            engine.execute(sql, analyst="alice")
            total = time.perf_counter() - started
            row.dp.append(total)
            row.cpu.append(total - backend.spent)
        rows.append(row)
        print(
            f"  {label:8} {name:30} raw {ms(row.raw):>9}  dp {ms(row.dp):>9}  "
            f"ratio {statistics.median(row.dp) / statistics.median(row.raw):6.2f}x  "
            f"engine cpu {ms(row.cpu):>8}",
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--persons", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--postgres", help="DSN of a PostgreSQL database to load the data into and use")
    parser.add_argument("--no-postgres", action="store_true", help="DuckDB only")
    parser.add_argument("--only", default="", help="run only the queries whose label contains this")
    args = parser.parse_args()

    data = REPO / "bench" / ".data"
    data.mkdir(parents=True, exist_ok=True)
    duckdb_path = data / f"demo-{args.persons}.duckdb"
    if not duckdb_path.exists():
        summary = build_demo(duckdb_path, args.persons, seed=0)
        print(f"built {summary.persons:,} patients + {summary.visits:,} visits in {summary.seconds:.1f} s")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as ledgers:
        print(f"DuckDB ({duckdb_path.name}), median of {args.repeat}:", flush=True)
        rows += measure("duckdb", str(duckdb_path), args.repeat, Path(ledgers), args.only)
        if not args.no_postgres:
            with contextlib.ExitStack() as stack:
                dsn = args.postgres
                if dsn:
                    load_into_postgres(duckdb_path, dsn)
                else:
                    dsn = stack.enter_context(throwaway_postgres(duckdb_path))
                print(f"PostgreSQL, median of {args.repeat}:", flush=True)
                rows += measure("postgres", dsn, args.repeat, Path(ledgers), args.only)
    print()
    print("summary (medians):")
    for backend in sorted({r.backend for r in rows}):
        mine = [r for r in rows if r.backend == backend]
        ratios = [statistics.median(r.dp) / statistics.median(r.raw) for r in mine]
        cpu = [c for r in mine for c in r.cpu]
        print(
            f"  {backend:8}  DP/raw ratio: median {statistics.median(ratios):.2f}x, "
            f"range {min(ratios):.2f}–{max(ratios):.2f}x;  engine CPU per query: median "
            f"{statistics.median(cpu) * 1000:.2f} ms"
        )


if __name__ == "__main__":
    main()
