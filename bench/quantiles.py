"""Quantile accuracy benchmark: median relative error of MEDIAN / percentile_cont at ε = 1 on DuckDB.

    python bench/quantiles.py [--persons 100000 --persons 1000000] [--repeat 25] [--epsilon 1] [--coarse]

Builds (once, cached under bench/.data/ like bench/engine.py) the demo data at each scale, then runs
each query R times through Engine.execute on DuckDB (replay off, a budget no run exhausts) and
prints, per query: the median over repetitions (and groups) of |noisy − exact| / |exact|, the exact
value coming from the same DuckDB file, and the median DP time ÷ the raw query's (the plain SQL on
the same backend). Income's policy bounds are 0–500,000 on a grid of cents. `--coarse` turns the
refinement off (one pick over at most 1,000 grid points, as before it existed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dpproxy.backends import open_backend  # noqa: E402
from dpproxy.budget.sqlite import SQLiteLedger  # noqa: E402
from dpproxy.demo import build_demo  # noqa: E402
from dpproxy.engine import Engine  # noqa: E402
from dpproxy.policy import parse_policy  # noqa: E402

# (label, the analyst's SQL, the exact SQL on DuckDB: same columns, keys first)
QUERIES: list[tuple[str, str, str]] = [
    (
        "median, whole table",
        "SELECT MEDIAN(income) FROM patients",
        "SELECT quantile_cont(income, 0.5) FROM patients",
    ),
    (
        "median per diagnosis",
        "SELECT diagnosis, MEDIAN(income) FROM patients GROUP BY diagnosis",
        "SELECT diagnosis, quantile_cont(income, 0.5) FROM patients GROUP BY diagnosis",
    ),
    (
        "percentile_cont(0.9)",
        "SELECT percentile_cont(0.9) WITHIN GROUP (ORDER BY income) FROM patients",
        "SELECT quantile_cont(income, 0.9) FROM patients",
    ),
]


def bench_policy() -> str:
    text = (REPO / "policies" / "demo.yaml").read_text()
    text = text.replace("epsilon: 10.0       # total budget", "epsilon: 1.0e9")
    return text.replace("  mechanism: laplace\n", "  mechanism: laplace\n  replay: false\n")


def dataset(persons: int) -> Path:
    path = REPO / "bench" / ".data" / f"demo-{persons}.duckdb"
    if not path.exists():
        print(f"building the demo data at {persons:,} persons …", flush=True)
        build_demo(path, persons, seed=0)
    return path


def measure(persons: int, repeat: int, epsilon: float, ledger_dir: Path) -> None:
    path = dataset(persons)
    backend = open_backend(f"duckdb:{path}", statement_timeout_s=0)
    engine = Engine(parse_policy(bench_policy()), backend, SQLiteLedger(ledger_dir / f"{persons}.sqlite"))
    print(f"\n{persons:,} persons, ε = {epsilon:g} per query, {repeat} repetitions (DuckDB)")
    for label, sql, exact_sql in QUERIES:
        exact = {tuple(row[:-1]): float(row[-1]) for row in backend.run(exact_sql)}
        engine.execute(sql, analyst="alice", epsilon=epsilon)  # warm plans and caches
        errors: list[float] = []
        dp_times: list[float] = []
        raw_times: list[float] = []
        for _ in range(repeat):
            started = time.perf_counter()
            backend.run(exact_sql)
            raw_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            result = engine.execute(sql, analyst="alice", epsilon=epsilon)
            dp_times.append(time.perf_counter() - started)
            for row in result.rows:  # type: ignore[union-attr]
                truth = exact.get(tuple(row[:-1]))
                if truth:
                    errors.append(abs(float(row[-1]) - truth) / abs(truth))
        ratio = statistics.median(dp_times) / statistics.median(raw_times)
        print(
            f"  {label:24} median rel. error {statistics.median(errors):.2e}   "
            f"dp {statistics.median(dp_times) * 1000:7.1f} ms  ÷raw {ratio:5.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--persons", type=int, action="append", help="scale (repeatable)")
    parser.add_argument("--repeat", type=int, default=25)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument(
        "--coarse", action="store_true", help="no refinement: one pick over the 1,000-point grid (before)"
    )
    args = parser.parse_args()
    if args.coarse:
        from dpproxy.sql.aggregates import AggregateRules

        AggregateRules.FINE_BINS = 0
    with tempfile.TemporaryDirectory() as ledgers:
        for persons in args.persons or [100_000, 1_000_000]:
            measure(persons, args.repeat, args.epsilon, Path(ledgers))


if __name__ == "__main__":
    main()
