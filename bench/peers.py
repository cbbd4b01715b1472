"""Peer benchmark: the same queries through dpproxy, SmartNoise SQL and Tumult Analytics, interleaved.

    python bench/peers.py --setup                 # once: the peers' virtualenvs under bench/.venv-peers/
    python bench/peers.py [--persons 1000000] [--repeat 7] [--epsilon 1.0] [--only TEXT]…
                          [--peer smartnoise|tumult]… [--postgres DSN] [--spark-memory 4g]

Builds (once, cached under bench/.data/) the demo data at the requested scale (1M persons is ~4M
visit rows, 100k ~0.4M), loads it into a throwaway PostgreSQL 15 cluster (tests/pgcluster.py, or
`--postgres DSN`) and into Parquet files for Spark, computes each query's exact answer on DuckDB
(no bounding, no noise), then, for every query and every repetition, runs it once on each engine in
turn (the starting engine rotates), so machine noise hits all of them alike:

  dpproxy duckdb     Engine.execute on the DuckDB file, in this process;
  dpproxy postgres   Engine.execute on the PostgreSQL copy, in this process;
  smartnoise pg      SmartNoise SQL's PrivateReader over a psycopg2 connection to the same PostgreSQL;
  tumult spark       Tumult Analytics' Session over Spark DataFrames (local[2]) read from the Parquet.

Each peer runs in its own virtualenv (bench/.venv-peers/<peer>, made by `--setup`): they pin other
versions of OpenDP (SmartNoise 1.0.10 needs opendp 0.14), pandas and pyspark than dpproxy, and are a
bench extra, never a runtime dependency. Each is a subprocess of this script running
`bench/peers.py --worker <peer>` with that virtualenv's interpreter; they speak one JSON object per
line (stdin: setup, then one query at a time; stdout: the answer's rows and the seconds it took,
measured inside the worker from the call into the library to the rows in Python lists, so the pipe
costs nothing). A peer that is not installed, does not start, or cannot answer a query is reported
as such in the output, and the run goes on.

Reported per query and engine: the median time, that time ÷ dpproxy's on the same backend family
(peers ÷ dpproxy postgres, the backend SmartNoise reads; Tumult ÷ dpproxy duckdb, both in-process
engines), and the median relative error |noisy − exact| / |exact| over every (repetition, group,
aggregate) of the groups named by the policy's public values (NULL keys and exact zeros are left
out). Errors are against the exact, unbounded answer, so they include each engine's bounding bias.

Configuration, chosen to make the engines answer the same question at the same privacy:
- Privacy unit: the person (patient_id) on every engine; add/remove one person's rows.
- ε: the same total per query on every engine (`--epsilon`, default 1), pure DP (δ = 0 spent).
  dpproxy splits a query's ε evenly over its components (docs/privacy.md). SmartNoise charges its
  Privacy.epsilon once per noisy statistic (AVG = SUM and COUNT): per query we read its cost with
  get_privacy_cost at ε = 1 and set ε / that cost, so the query's total is `--epsilon`. Tumult answers
  one aggregate per query: a query with k aggregates is k Tumult queries at ε/k each (its AVG splits
  its share between a sum and a count internally, as dpproxy's does).
- Noise: Laplace on every side. dpproxy: OpenDP's discrete Laplace on integer-scaled values.
  SmartNoise: its default mechanism map (Mechanism.discrete_laplace for counts and integer sums,
  Mechanism.laplace for float sums). Tumult: mechanism="laplace" on counts, sums and averages
  (geometric on integers, Laplace on floats); quantiles use its exponential mechanism over the
  intervals between values (no Laplace there; dpproxy's quantiles are an exponential mechanism too).
- Contribution bounds, from policies/demo.yaml: patients has one row per person (r = g = 1);
  visits allows g = 3 groups per person and r = 5 rows per group. dpproxy enforces them with its
  own rewrite. Tumult: MaxRowsPerID(1) on patients; MaxGroupsPerID(key, 3) and
  MaxRowsPerGroupPerID(key, 5) on visits, the same bound and the same L1 sensitivity (15 rows).
  SmartNoise has one bound, max_ids rows per person over all groups: max_ids = 1 on patients and
  g·r = 15 on visits, the same L1 sensitivity (the kept rows differ: any 15 of a person's rows,
  by its reservoir sample, instead of 5 in each of 3 groups).
- Uniqueness: patients.patient_id is the primary key in PostgreSQL, which dpproxy reads to skip the
  per-person bounding; SmartNoise gets the same knowledge as sample_max_ids: false on patients
  (true on visits); Tumult still truncates: MaxRowsPerID(1) is how a source protected by
  AddRowsWithID says one row per person.
- Column bounds: the policy's lower/upper on every engine (income 0–500,000, cost 0–20,000,
  duration 0–600); SmartNoise clamp_columns: true.
- Groups: all keys are public value sets in the policy. dpproxy releases every public value; Tumult
  gets them as a KeySet; SmartNoise gets censor_dims: false (no thresholding: the keys are public,
  so none is needed, and its thresholding would spend δ). clamp_counts: true on SmartNoise, as
  dpproxy clamps counts at 0.
- Spark: local[2] (the machine's cores), `--spark-memory` driver heap, spark.sql.shuffle.partitions=4
  (Spark's default 200 makes every small aggregation schedule 200 tasks); DataFrames cached before
  the session is built; decimals are doubles in Parquet (Tumult's DECIMAL columns are Spark doubles).
- Queries SmartNoise cannot answer (it has no quantiles) and Tumult queries that fail are printed
  as "cannot answer" with the library's message.
Machines are shared and noisy: read medians and ratios from one run, not single timings.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "bench" / ".data"
PEER_VENVS = REPO / "bench" / ".venv-peers"
# What `--setup` installs into each peer's virtualenv: the versions measured.
PEER_PACKAGES: dict[str, list[str]] = {
    "smartnoise": ["smartnoise-sql==1.0.10", "psycopg2-binary>=2.9,<3"],
    "tumult": ["tmlt.analytics==0.21.0"],
}
PEER_LABELS = {"smartnoise": "smartnoise pg", "tumult": "tumult spark"}


@dataclass(frozen=True)
class Aggregate:
    kind: str  # count, sum, avg, median, quantile
    column: str | None = None
    q: float | None = None

    def sql(self) -> str:
        if self.kind == "count":
            return "COUNT(*)"
        if self.kind == "median":
            return f"MEDIAN({self.column})"
        if self.kind == "quantile":
            return f"percentile_cont({self.q}) WITHIN GROUP (ORDER BY {self.column})"
        return f"{self.kind.upper()}({self.column})"


@dataclass(frozen=True)
class Query:
    """One grouped query, as SQL for dpproxy, SmartNoise and DuckDB and as parts for Tumult."""

    name: str
    table: str
    key: str
    aggregates: tuple[Aggregate, ...]
    where: str | None = None  # the same condition text on every engine (Spark SQL parses it too)
    keys: tuple[str, ...] = field(default=())  # the key's public values, filled from the policy

    def sql(self, schema: str | None = None) -> str:
        table = f"{schema}.{self.table}" if schema else self.table
        where = f" WHERE {self.where}" if self.where else ""
        columns = ", ".join(a.sql() for a in self.aggregates)
        return f"SELECT {self.key}, {columns} FROM {table}{where} GROUP BY {self.key}"


QUERIES: tuple[Query, ...] = (
    Query("count, one row per person", "patients", "diagnosis", (Aggregate("count"),)),
    Query("sum, one row per person", "patients", "diagnosis", (Aggregate("sum", "income"),)),
    Query("avg, one row per person", "patients", "sex", (Aggregate("avg", "income"),)),
    Query("count, many rows per person", "visits", "department", (Aggregate("count"),)),
    Query("sum, many rows per person", "visits", "department", (Aggregate("sum", "cost"),)),
    Query("avg, many rows per person", "visits", "department", (Aggregate("avg", "cost"),)),
    Query(
        "count+sum+avg, many rows",
        "visits",
        "department",
        (Aggregate("count"), Aggregate("sum", "duration_minutes"), Aggregate("avg", "cost")),
        # CAST: SmartNoise's grammar has no DATE '…' literal.
        where="visit_date >= CAST('2022-01-01' AS DATE)",
    ),
    Query("median income per group", "patients", "sex", (Aggregate("median", "income"),)),
    Query("median per group, many rows", "visits", "department", (Aggregate("median", "cost"),)),
    Query(
        "10-quantiles per group",
        "patients",
        "diagnosis",
        tuple(Aggregate("quantile", "income", q / 10) for q in range(1, 10)),
    ),
)
# The columns each peer needs, with their type for Parquet and SmartNoise.
COLUMNS: dict[str, dict[str, str]] = {
    "patients": {"patient_id": "int", "sex": "string", "income": "float", "diagnosis": "string"},
    "visits": {
        "patient_id": "int",
        "visit_date": "date",
        "department": "string",
        "cost": "float",
        "duration_minutes": "int",
    },
}
_PARQUET_TYPES = {"int": "BIGINT", "float": "DOUBLE", "string": "VARCHAR", "date": "DATE"}


# ---------------------------------------------------------------------------------------------
# Workers: run by a peer's own interpreter; they import only the peer's library and the stdlib.


class Worker:
    def setup(self, message: dict[str, Any]) -> str:
        raise NotImplementedError

    def answer(self, query: dict[str, Any], epsilon: float) -> tuple[list[list[Any]], float]:
        raise NotImplementedError


class SmartNoiseWorker(Worker):
    def setup(self, message: dict[str, Any]) -> str:
        import psycopg2
        import snsql

        self.snsql = snsql
        self.connection = psycopg2.connect(message["dsn"])
        tables: dict[str, Any] = {}
        for name, table in message["tables"].items():
            meta: dict[str, Any] = {
                "max_ids": table["max_groups"] * table["max_rows"],  # the same L1 bound as g·r
                "row_privacy": False,
                "sample_max_ids": not table["unique"],
                "censor_dims": False,
                "clamp_counts": True,
                "clamp_columns": True,
            }
            for column, spec in table["columns"].items():
                kind = {"date": "datetime"}.get(spec["type"], spec["type"])
                entry: dict[str, Any] = {"type": kind}
                if column == table["unit"]:
                    entry["private_id"] = True
                if "lower" in spec:
                    entry["lower"] = spec["lower"]
                    entry["upper"] = spec["upper"]
                meta[column] = entry
            tables[name] = meta
        self.metadata = {"bench": {"public": tables}}  # collection, schema, tables
        self.calibrated: dict[tuple[str, float], float] = {}
        from importlib.metadata import version

        return f"smartnoise-sql {version('smartnoise-sql')}, opendp {version('opendp')}"

    def reader(self, epsilon: float) -> Any:
        privacy = self.snsql.Privacy(epsilon=epsilon, delta=0.0)
        return self.snsql.from_connection(
            self.connection, engine="postgres", privacy=privacy, metadata=self.metadata
        )

    def answer(self, query: dict[str, Any], epsilon: float) -> tuple[list[list[Any]], float]:
        sql = query["sql_qualified"]
        key = (sql, epsilon)
        if key not in self.calibrated:  # its cost per unit of Privacy.epsilon, read without running
            cost, _delta = self.reader(1.0).get_privacy_cost(sql)
            self.calibrated[key] = epsilon / cost
        reader = self.reader(self.calibrated[key])
        started = time.perf_counter()
        rows = reader.execute(sql)
        seconds = time.perf_counter() - started
        spent, _ = reader.get_privacy_cost(sql)
        if not math.isclose(spent, epsilon, rel_tol=1e-6):
            raise RuntimeError(f"calibrated ε {spent} ≠ {epsilon}")
        return [list(r) for r in rows[1:]], seconds


class TumultWorker(Worker):
    def setup(self, message: dict[str, Any]) -> str:
        from pyspark.sql import SparkSession
        from tmlt.analytics import AddRowsWithID, PureDPBudget, Session

        os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's Python workers must import tmlt too
        self.spark = (
            SparkSession.builder.master("local[2]")
            .appName("dpproxy-bench-tumult")
            .config("spark.driver.memory", message["spark_memory"])
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.warehouse.dir", message["warehouse"])
            .config("spark.driver.extraJavaOptions", "-Dio.netty.tryReflectionSetAccessible=true")
            .getOrCreate()
        )
        self.spark.sparkContext.setLogLevel("ERROR")
        self.tables = message["tables"]
        builder = Session.Builder().with_privacy_budget(PureDPBudget(float("inf")))
        builder = builder.with_id_space("person")
        for name, table in self.tables.items():
            frame = self.spark.read.parquet(str(Path(message["parquet"]) / f"{name}.parquet")).cache()
            frame.count()
            builder = builder.with_private_dataframe(
                name, frame, protected_change=AddRowsWithID(table["unit"], id_space="person")
            )
        self.session = builder.build()
        from importlib.metadata import version

        names = ("tmlt.analytics", "tmlt.core", "pyspark")
        return ", ".join(f"{name} {version(name)}" for name in names)

    def answer(self, query: dict[str, Any], epsilon: float) -> tuple[list[list[Any]], float]:
        from tmlt.analytics import (
            KeySet,
            MaxGroupsPerID,
            MaxRowsPerGroupPerID,
            MaxRowsPerID,
            PureDPBudget,
            QueryBuilder,
        )

        table = self.tables[query["table"]]
        key = query["key"]
        aggregates = query["aggregates"]
        share = epsilon / len(aggregates)
        started = time.perf_counter()
        keyset = KeySet.from_dict({key: list(query["keys"])})
        values: dict[str, list[Any]] = {k: [None] * len(aggregates) for k in query["keys"]}
        for position, aggregate in enumerate(aggregates):
            builder = QueryBuilder(query["table"])
            if query.get("where"):
                builder = builder.filter(query["where"])
            if table["unique"] or (table["max_groups"] == 1 and table["max_rows"] == 1):
                builder = builder.enforce(MaxRowsPerID(1))
            else:
                builder = builder.enforce(MaxGroupsPerID(key, table["max_groups"]))
                builder = builder.enforce(MaxRowsPerGroupPerID(key, table["max_rows"]))
            grouped = builder.groupby(keyset)
            column = aggregate["column"]
            spec = table["columns"].get(column, {}) if column else {}
            kind = aggregate["kind"]
            if kind == "count":
                built = grouped.count(name="v", mechanism="laplace")
            elif kind == "sum":
                built = grouped.sum(column, spec["lower"], spec["upper"], name="v", mechanism="laplace")
            elif kind == "avg":
                built = grouped.average(column, spec["lower"], spec["upper"], name="v", mechanism="laplace")
            elif kind == "median":
                built = grouped.median(column, spec["lower"], spec["upper"], name="v")
            elif kind == "quantile":
                built = grouped.quantile(column, aggregate["q"], spec["lower"], spec["upper"], name="v")
            else:
                raise ValueError(f"no Tumult query for {kind}")
            for row in self.session.evaluate(built, PureDPBudget(share)).collect():
                values[row[key]][position] = row["v"]
        seconds = time.perf_counter() - started
        return [[k, *v] for k, v in values.items()], seconds


def run_worker(peer: str) -> None:
    """The JSON-lines loop of a peer's subprocess. Its stdout is the protocol only: whatever the
    libraries print goes to stderr."""
    out: TextIO = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    worker: Worker = {"smartnoise": SmartNoiseWorker, "tumult": TumultWorker}[peer]()
    for line in sys.stdin:
        message = json.loads(line)
        try:
            if message["op"] == "setup":
                reply: dict[str, Any] = {"version": worker.setup(message)}
            else:
                rows, seconds = worker.answer(message["query"], message["epsilon"])
                reply = {"rows": rows, "seconds": seconds}
        except Exception as exc:
            traceback.print_exc()
            text = " ".join(f"{type(exc).__name__}: {exc}".split())
            reply = {"error": text[:300]}
        out.write(json.dumps(reply, default=_jsonable) + "\n")


def _jsonable(value: object) -> object:
    if hasattr(value, "isoformat"):
        return value.isoformat()  # type: ignore[attr-defined]
    return float(value)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# The driver: this script under the project's interpreter.


class PeerProcess:
    """A peer's worker subprocess; stderr goes to bench/.data/peers-<peer>.log."""

    def __init__(self, peer: str, python: Path) -> None:
        self.peer = peer
        self.log_path = DATA / f"peers-{peer}.log"
        self.log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [str(python), str(Path(__file__).resolve()), "--worker", peer],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            bufsize=1,
        )

    def call(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            return {"error": f"the worker exited ({self.process.wait()}); see {self.log_path}"}
        return json.loads(line)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(timeout=60)
        if self.process.poll() is None:
            self.process.kill()
        self.log.close()


def setup_peers(peers: list[str]) -> None:
    for peer in peers:
        venv = PEER_VENVS / peer
        print(f"installing {' '.join(PEER_PACKAGES[peer])} into {venv.relative_to(REPO)}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        subprocess.run([*pip, *PEER_PACKAGES[peer]], check=True)


def table_specs(policy: Any) -> dict[str, dict[str, Any]]:
    """What the peers are told about each table: the policy's unit, bounds and column ranges."""
    specs: dict[str, dict[str, Any]] = {}
    for name, kinds in COLUMNS.items():
        table = policy.table(name)
        columns: dict[str, dict[str, Any]] = {}
        for column, kind in kinds.items():
            spec: dict[str, Any] = {"type": kind}
            declared = table.column(column)
            if kind in ("int", "float") and declared.bounded and column != table.privacy_unit:
                spec["lower"] = float(declared.lower) if kind == "float" else int(declared.lower)
                spec["upper"] = float(declared.upper) if kind == "float" else int(declared.upper)
            columns[column] = spec
        specs[name] = {
            "unit": table.privacy_unit,
            "max_groups": table.max_groups_per_unit,
            "max_rows": table.max_rows_per_unit,
            "unique": table.max_rows_per_unit == 1 and table.max_groups_per_unit == 1,
            "columns": columns,
        }
    return specs


def export_parquet(duckdb_path: Path) -> Path:
    import duckdb

    directory = DATA / f"{duckdb_path.stem}-parquet"
    if all((directory / f"{t}.parquet").exists() for t in COLUMNS):
        return directory
    directory.mkdir(exist_ok=True)
    with duckdb.connect(str(duckdb_path), read_only=True) as source:
        for table, columns in COLUMNS.items():
            select = ", ".join(f"CAST({c} AS {_PARQUET_TYPES[k]}) AS {c}" for c, k in columns.items())
            target = directory / f"{table}.parquet"
            source.execute(f"COPY (SELECT {select} FROM {table}) TO '{target}.tmp' (FORMAT parquet)")
            os.replace(f"{target}.tmp", target)
    return directory


def exact_answers(duckdb_path: Path, queries: list[Query]) -> dict[str, dict[str, list[float | None]]]:
    import duckdb

    answers: dict[str, dict[str, list[float | None]]] = {}
    with duckdb.connect(str(duckdb_path), read_only=True) as source:
        for query in queries:
            rows = source.execute(query.sql()).fetchall()
            answers[query.name] = {str(r[0]): [_number(v) for v in r[1:]] for r in rows if r[0] is not None}
    return answers


def _number(value: object) -> float | None:
    if value is None:
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


@dataclass
class Tally:
    seconds: list[float] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)
    missing: int = 0
    failure: str | None = None


def score(tally: Tally, query: Query, exact: dict[str, list[float | None]], rows: list[Any]) -> None:
    """Relative errors of one answer against the exact one, over the policy's public keys."""
    answered = {str(r[0]): list(r[1:]) for r in rows}
    for key in query.keys:
        truth = exact.get(key)
        got = answered.get(key)
        for position in range(len(query.aggregates)):
            true_value = truth[position] if truth else None
            if true_value is None or true_value == 0:
                continue
            value = _number(got[position]) if got and position < len(got) else None
            if value is None or math.isnan(value):
                tally.missing += 1
                continue
            tally.errors.append(abs(value - true_value) / abs(true_value))


@contextlib.contextmanager
def postgres_copy(duckdb_path: Path, dsn: str | None) -> Iterator[str]:
    from dpproxy.demo import load_into_postgres

    if dsn:
        load_into_postgres(duckdb_path, dsn)
        yield dsn
        return
    sys.path.insert(0, str(REPO))
    from tests.pgcluster import create_database, find_pg_bindir, start_cluster

    bindir = find_pg_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL server binaries not found: install postgresql-15 or pass --postgres DSN")
    with start_cluster(bindir) as cluster:
        name = create_database(cluster, prefix="bench")
        started = time.perf_counter()
        load_into_postgres(duckdb_path, cluster.dsn(name))
        print(f"loaded the demo data into PostgreSQL in {time.perf_counter() - started:.1f} s", flush=True)
        yield cluster.dsn(name)


def bench_policy_text() -> str:
    text = (REPO / "policies" / "demo.yaml").read_text()
    # One analyst with a budget no benchmark can exhaust; every repetition really runs (no replay).
    text = text.replace("epsilon: 10.0       # total budget", "epsilon: 1.0e9")
    return text.replace("  mechanism: laplace\n", "  mechanism: laplace\n  replay: false\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", choices=sorted(PEER_PACKAGES), help=argparse.SUPPRESS)
    parser.add_argument("--setup", action="store_true", help="create the peers' virtualenvs and exit")
    parser.add_argument("--persons", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--epsilon", type=float, default=1.0, help="total ε of each query, every engine")
    parser.add_argument(
        "--peer", action="append", choices=sorted(PEER_PACKAGES), help="peers to run (default: all)"
    )
    parser.add_argument("--postgres", help="DSN of a PostgreSQL database to load the data into and use")
    parser.add_argument("--spark-memory", default="4g", help="driver heap of Tumult's local Spark")
    parser.add_argument(
        "--only", action="append", default=[], help="only the queries whose label contains this"
    )
    args = parser.parse_args()
    if args.worker:
        run_worker(args.worker)
        return
    peers = args.peer or sorted(PEER_PACKAGES)
    if args.setup:
        setup_peers(peers)
        return
    drive(args, peers)


def drive(args: argparse.Namespace, peers: list[str]) -> None:
    sys.path.insert(0, str(REPO))
    from dpproxy.backends import open_backend
    from dpproxy.budget.sqlite import SQLiteLedger
    from dpproxy.demo import build_demo
    from dpproxy.engine import Engine
    from dpproxy.policy import parse_policy

    policy = parse_policy(bench_policy_text())
    queries = []
    for query in QUERIES:
        if args.only and not any(text in query.name for text in args.only):
            continue
        public = policy.table(query.table).column(query.key).public_values
        queries.append(dataclasses.replace(query, keys=tuple(str(v) for v in public or ())))

    DATA.mkdir(parents=True, exist_ok=True)
    duckdb_path = DATA / f"demo-{args.persons}.duckdb"
    if not duckdb_path.exists():
        summary = build_demo(duckdb_path, args.persons, seed=0)
        print(f"built {summary.persons:,} patients + {summary.visits:,} visits in {summary.seconds:.1f} s")
    exact = exact_answers(duckdb_path, queries)
    # Before dpproxy's backend opens the file: DuckDB allows one configuration per file per process.
    parquet = export_parquet(duckdb_path) if "tumult" in peers else None
    specs = table_specs(policy)
    run_started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        ledgers = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dpproxy-peers-")))
        dsn = stack.enter_context(postgres_copy(duckdb_path, args.postgres))
        engines: dict[str, Any] = {}
        for label, target in (("dpproxy duckdb", str(duckdb_path)), ("dpproxy postgres", dsn)):
            backend = open_backend(target, statement_timeout_s=0)
            engine = Engine(policy, backend, SQLiteLedger(ledgers / f"{label.split()[1]}.sqlite"))
            stack.callback(engine.close)
            engines[label] = engine
        workers: dict[str, PeerProcess] = {}
        for peer in peers:
            label = PEER_LABELS[peer]
            python = PEER_VENVS / peer / "bin" / "python"
            if not python.exists():
                print(f"{label}: not installed (python bench/peers.py --setup --peer {peer})", flush=True)
                continue
            started = time.perf_counter()
            process = PeerProcess(peer, python)
            stack.callback(process.close)
            setup: dict[str, Any] = {"op": "setup", "dsn": dsn, "tables": specs}
            if peer == "tumult":
                setup["parquet"] = str(parquet)
                setup["warehouse"] = str(ledgers / "spark-warehouse")
                setup["spark_memory"] = args.spark_memory
            reply = process.call(setup)
            if "error" in reply:
                print(f"{label}: did not start: {reply['error']} (log: {process.log_path})", flush=True)
                continue
            print(f"{label}: {reply['version']} (ready in {time.perf_counter() - started:.1f} s)", flush=True)
            workers[label] = process

        def run(label: str, query: Query) -> tuple[list[Any], float] | str:
            if label in engines:
                started = time.perf_counter()
                result = engines[label].execute(query.sql(), analyst="alice", epsilon=args.epsilon)
                return result.rows, time.perf_counter() - started
            message = {
                "op": "query",
                "epsilon": args.epsilon,
                "query": {
                    "name": query.name,
                    "table": query.table,
                    "key": query.key,
                    "keys": list(query.keys),
                    "where": query.where,
                    "aggregates": [asdict(a) for a in query.aggregates],
                    "sql_qualified": query.sql("public"),
                },
            }
            reply = workers[label].call(message)
            if "error" in reply:
                return str(reply["error"])
            return reply["rows"], reply["seconds"]

        labels = [*engines, *workers]
        print(
            f"\n{args.persons:,} persons, ε = {args.epsilon} per query on every engine, "
            f"median of {args.repeat} interleaved repetitions:",
            flush=True,
        )
        for query in queries:
            tallies = {label: Tally() for label in labels}
            for label in labels:  # warm-up, also finds the queries an engine cannot answer
                outcome = run(label, query)
                if isinstance(outcome, str):
                    tallies[label].failure = outcome
            live = [label for label in labels if tallies[label].failure is None]
            for repetition in range(args.repeat):
                shift = repetition % len(live) if live else 0
                for label in live[shift:] + live[:shift]:
                    outcome = run(label, query)
                    if isinstance(outcome, str):
                        tallies[label].failure = outcome
                        continue
                    rows, seconds = outcome
                    tallies[label].seconds.append(seconds)
                    score(tallies[label], query, exact[query.name], rows)
            report(query, tallies)
    print(f"\nwhole run {time.perf_counter() - run_started:.0f} s")


def report(query: Query, tallies: dict[str, Tally]) -> None:
    print(f"{query.name}: {query.sql()}", flush=True)

    def median_time(label: str) -> float | None:
        tally = tallies.get(label)
        return statistics.median(tally.seconds) if tally and tally.seconds and not tally.failure else None

    for label, tally in tallies.items():
        if tally.failure or not tally.seconds:
            print(f"  {label:17} cannot answer: {tally.failure}", flush=True)
            continue
        seconds = statistics.median(tally.seconds)
        reference = "dpproxy duckdb" if label in ("dpproxy duckdb", "tumult spark") else "dpproxy postgres"
        versus = ""
        base = median_time(reference)
        if label.split()[0] != "dpproxy" and base:
            versus = f"  {seconds / base:6.2f}x {reference}"
        error = f"{statistics.median(tally.errors):.2e}" if tally.errors else "n/a"
        missing = f"  ({tally.missing} values missing)" if tally.missing else ""
        print(
            f"  {label:17} {seconds * 1000:10.1f} ms  median rel. error {error}{versus}{missing}",
            flush=True,
        )


if __name__ == "__main__":
    main()
