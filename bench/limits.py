"""Planning time at the statement limits (dpproxy/sql/limits.py): the slowest statements found within
every limit, and the statements of issue 18 that the limits refuse, routed (dpproxy.wire.router) and
planned (Engine.plan) without a backend over the demo policy. Prints CPU seconds of this process, so
that other load on a shared machine counts less than in wall time.

    python bench/limits.py [--only TEXT]…
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from dpproxy.engine import Engine
from dpproxy.errors import DPProxyError
from dpproxy.policy import load_policy
from dpproxy.wire.router import route

POLICY = Path(__file__).resolve().parents[1] / "dpproxy" / "data" / "demo.yaml"


def zips(n: int) -> str:
    return "zip IN (" + ", ".join(f"'{i:05d}'" for i in range(n)) + ")"


def chain(n: int, select: str, where: str = "TRUE") -> str:
    """`select` over a chain of n CTEs, each reading the one before (n = 0: the table itself)."""
    if n == 0:
        return f"SELECT {select} FROM patients WHERE {where} GROUP BY sex"
    ctes = ", ".join(
        f"c{i} AS (SELECT patient_id, income, age, sex, zip FROM {'patients' if i == 0 else f'c{i - 1}'} "
        f"WHERE income > {i})"
        for i in range(n)
    )
    return f"WITH {ctes} SELECT {select} FROM c{n - 1} WHERE {where} GROUP BY sex"


def medians(k: int) -> str:
    return ", ".join(f"MEDIAN(income + age * {i} + 1)" for i in range(k))


def stddevs(k: int) -> str:
    return ", ".join(f"STDDEV(income * {i} + age)" for i in range(k))


def comparisons(groups: int) -> str:
    group = " AND ".join(f"(age + {i}) * 2 > income / {{j}}" for i in range(15))
    return " OR ".join("(" + group.format(j=j + 1) + ")" for j in range(groups))


STATEMENTS: dict[str, str] = {
    # Refused (issue 18).
    "IN list of 100,000 values": "SELECT COUNT(*) FROM patients WHERE age IN ("
    + ", ".join(str(i % 120) for i in range(100_000))
    + ")",
    "3,000 nested parentheses": "SELECT COUNT(*) FROM patients WHERE " + "(" * 3000 + "age > 1" + ")" * 3000,
    "OR of 20,000 terms": "SELECT COUNT(*) FROM patients WHERE "
    + " OR ".join(f"age = {i % 120}" for i in range(20_000)),
    # Accepted: the slowest found.
    "2 IN lists of 10,000 values": chain(0, "COUNT(*)", zips(10_000) + " AND " + zips(10_000)),
    "WHERE of 5,000 words (40 x 15 comparisons)": chain(0, "COUNT(*)", comparisons(40)),
    "flat CASE of 800 branches in WHERE": chain(
        0, "COUNT(*)", "CASE " + " ".join(f"WHEN age = {i} THEN {i}" for i in range(800)) + " ELSE 0 END > 3"
    ),
    "CASE nested 99 deep": chain(
        0, "COUNT(*)", "CASE WHEN age > 1 THEN " * 99 + "1" + " ELSE 0 END" * 99 + " = 1"
    ),
    "GROUP BY 1,000 expressions": "SELECT COUNT(*) FROM patients GROUP BY "
    + ", ".join(f"age + {i}" for i in range(1000)),
    "10 MEDIAN + 90 STDDEV": chain(0, medians(10) + ", " + stddevs(90)),
    "10 MEDIAN + 90 STDDEV + IN list of 2,000": chain(0, medians(10) + ", " + stddevs(90), zips(2000)),
    "chain of 7 CTEs + WHERE of 36 x 15 comparisons": chain(7, "COUNT(*)", comparisons(36)),
    "chain of 7 CTEs + 10 MEDIAN + 90 STDDEV + IN list of 2,000": chain(
        7, medians(10) + ", " + stddevs(90), zips(2000)
    ),
    "chain of 7 CTEs + 1 MEDIAN + 99 STDDEV + 2 IN lists of 10,000": chain(
        7, medians(1) + ", " + stddevs(99), zips(10_000) + " AND " + zips(10_000)
    ),
}


def cpu(call: Callable[[], object]) -> tuple[float, str]:
    started = time.process_time()
    try:
        call()
        outcome = "ok"
    except DPProxyError as error:
        outcome = f"{error.sqlstate} {error.message.removeprefix('statement too complex: ')[:70]}"
    return time.process_time() - started, outcome


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", action="append", default=[], help="only statements whose label holds TEXT")
    args = parser.parse_args()
    engine = Engine(load_policy(POLICY), None)
    exposed = {t.name for t in engine.exposed_tables()}
    print(f"{'statement':62s} {'chars':>8s} {'route':>7s} {'plan':>7s}  outcome")
    for label, sql in STATEMENTS.items():
        if args.only and not any(text in label for text in args.only):
            continue
        routed, outcome = cpu(lambda sql=sql: route(sql, exposed))
        planned, outcome = (0.0, outcome) if outcome != "ok" else cpu(lambda sql=sql: engine.plan(sql))
        print(f"{label:62s} {len(sql):8d} {routed:6.2f}s {planned:6.2f}s  {outcome}", flush=True)


if __name__ == "__main__":
    main()
