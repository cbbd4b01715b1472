"""Engine CPU per query, without backend time: cold, repeated text, the same statement with new constants, and
a trivial public query.

    python bench/cpu.py [--repeat 15] [--persons 2000]

Runs on a small demo DuckDB (built in a temporary directory): every figure is the time of
Engine.execute minus the time spent inside Backend.run (as bench/engine.py measures engine CPU), so
it is parse, analysis, rewriting, noise planning, noise and post-processing. Columns (medians, ms):
  cold    plan caches cleared before each execution;
  text    the same text again (the plan cache: dpproxy.engine.caches, exact inputs only);
  new     the same statement with a new constant in its row filter each time, as a dashboard sends
          it ("-" when the statement has no such constant): analysed cold, since no cache re-binds
          constants (docs/privacy.md §7);
and, on their own lines, a trivial public query and a public query with a new parameter each time.
Machines are noisy: compare columns of one run.
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
sys.path.insert(0, str(REPO / "bench"))

from engine import QUERIES, TimedBackend, bench_policy  # noqa: E402

from dpproxy.backends import open_backend  # noqa: E402
from dpproxy.demo import build_demo  # noqa: E402
from dpproxy.engine import Engine  # noqa: E402
from dpproxy.policy import parse_policy  # noqa: E402

# Metabase / Superset-style statements with a row filter whose constant a dashboard changes ({}).
BI: list[tuple[str, str]] = [
    (
        "metabase: filter + group",
        'SELECT "public"."visits"."department" AS "department", count(*) AS "count" FROM "public"."visits" '
        'WHERE "public"."visits"."duration_minutes" > {} GROUP BY "public"."visits"."department" '
        'ORDER BY "public"."visits"."department" ASC',
    ),
    (
        "superset: range + avg",
        "SELECT department AS department, AVG(cost) AS avg_cost, COUNT(*) AS count FROM visits "
        "WHERE duration_minutes BETWEEN {} AND 600 GROUP BY department LIMIT 10000",
    ),
    ("count with a filter", "SELECT diagnosis, COUNT(*) FROM patients WHERE age >= {} GROUP BY diagnosis"),
]
PUBLIC = "SELECT state FROM zip_info LIMIT 1"
PUBLIC_PARAM = "SELECT city FROM zip_info WHERE zip = $1"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--persons", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "demo.duckdb"
        build_demo(path, args.persons)
        backend = TimedBackend(open_backend(str(path)))
        engine = Engine(parse_policy(bench_policy()), backend, None)

        def cpu(sql: str, params: tuple[object, ...] = (), *, clear: bool = False) -> float:
            if clear:
                engine.caches.private.clear()
                engine.caches.public.clear()
            backend.spent = 0.0
            started = time.perf_counter()
            engine.execute(sql, params, analyst="alice")
            return time.perf_counter() - started - backend.spent

        def ms(values: list[float]) -> str:
            return f"{statistics.median(values) * 1e3:7.3f}"

        print(f"{'statement':34} {'cold':>7} {'text':>7} {'new':>7}   (median engine CPU, ms)")
        counter = iter(range(20, 10**6))
        statements = [(name, sql, None) for name, sql, _ in QUERIES] + [
            (name, template.format(10), template) for name, template in BI
        ]
        for name, sql, template in statements:
            cold = [cpu(sql, clear=True) for _ in range(args.repeat)]
            cpu(sql)
            text = [cpu(sql) for _ in range(args.repeat)]
            new = "      -"
            if template is not None:
                new = ms([cpu(template.format(next(counter))) for _ in range(args.repeat)])
            print(f"{name:34} {ms(cold)} {ms(text)} {new}", flush=True)
        cold = [cpu(PUBLIC, clear=True) for _ in range(args.repeat)]
        text = [cpu(PUBLIC) for _ in range(args.repeat)]
        print(f"{'public: ' + PUBLIC:34} {ms(cold)} {ms(text)}")
        # A new parameter each time: analysed cold, like a new constant.
        zips = iter(f"{z:05d}" for z in range(10**5))
        cold = [cpu(PUBLIC_PARAM, (next(zips),), clear=True) for _ in range(args.repeat)]
        cpu(PUBLIC_PARAM, (next(zips),))
        new = [cpu(PUBLIC_PARAM, (next(zips),)) for _ in range(args.repeat)]
        print(f"{'public, new $1: ' + PUBLIC_PARAM:34} {ms(cold)} {'':>7} {ms(new)}")
        engine.close()


if __name__ == "__main__":
    main()
