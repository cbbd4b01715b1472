"""Certify the language, not examples: generated statements against adversarial databases.

Every statement the grammar of tests/sql/language/grammar.py generates must be refused with a documented
SQLSTATE before it reads protected data, or be accepted and then run on both backends, give the same
pre-noise values on both, and pass the sensitivity certificate on every neighbour (see
tests/sql/language/harness.py for the checks); and every cache path must give what the cold path gives
for the same input, with the statement's constants replaced by adversarial ones, in the text and as
parameters (tests/sql/language/caches.py).

Batches:
  - a fixed batch (seed 0, DPPROXY_FUZZ_FIXED queries, default 800) in every run, split in chunks so
    pytest-xdist spreads it over the cores;
  - a random batch (DPPROXY_FUZZ_RANDOM queries, default 100) whose seed is printed, or taken from
    DPPROXY_FUZZ_SEED to reproduce a failure; under CI the seed is a digest of the sources, so a run on
    a fresh clone of a commit is the run CI makes of it, and every change still explores new statements;
  - every statement that ever failed, from tests/sql/language/regressions.sql.
A long run: `DPPROXY_FUZZ_RANDOM=50000 pytest -m fuzz tests/sql/test_language.py -n auto -s` (README):
16 chunks, each a random batch with its own printed seed.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dpproxy.policy import parse_policy
from dpproxy.sql.clock import CLOCK
from tests.certify import certification_duckdb
from tests.pgcluster import PgCluster, create_database, drop_database
from tests.sql.language import schema, temporal
from tests.sql.language.caches import cache_failures
from tests.sql.language.databases import Loaded
from tests.sql.language.grammar import Generated, generate
from tests.sql.language.harness import Backends, check

FIXED_SEED = 0
# Sized for the suite's time on 2 cores (about 0.25 s of checks per statement); long runs go further.
FIXED_QUERIES = int(os.environ.get("DPPROXY_FUZZ_FIXED", "800"))
CHUNKS = 16
RANDOM_QUERIES = int(os.environ.get("DPPROXY_FUZZ_RANDOM", "100"))
REGRESSIONS = Path(__file__).parent / "language" / "regressions.sql"
# The fixed batch certifies the cache paths (tests/sql/language/caches.py) on one statement in this
# many; the random batch, the regressions and the long runs on every statement.
CACHES_EVERY = int(os.environ.get("DPPROXY_FUZZ_CACHES_EVERY", "4"))

DATABASES = {
    "adversarial": lambda: schema.adversarial(1),
    "empty": schema.empty,
    "single": lambda: schema.one_row_each(2),
}


@pytest.fixture(scope="module")
def databases(pg_cluster: PgCluster) -> Iterator[list[Backends]]:
    policies = {
        "limits": parse_policy(schema.policy_text(schema.LIMITS)),
        "high": parse_policy(schema.policy_text(schema.HIGH_LIMITS)),
        "fixed": parse_policy(schema.fixed_policy_text(schema.LIMITS)),
        "each": parse_policy(schema.each_a_person_policy_text(schema.LIMITS)),
    }
    built: list[Backends] = []
    names: list[str] = []
    connections = []
    try:
        for name, make in DATABASES.items():
            db = make()
            duck = Loaded("duckdb", certification_duckdb())
            duck.load(db)
            dbname = create_database(pg_cluster, prefix="lang")
            names.append(dbname)
            conn = psycopg.connect(pg_cluster.dsn(dbname), autocommit=True)
            connections.append(conn)
            pg = Loaded("postgres", conn)
            pg.load(db)
            built.append(Backends.build(name, duck, pg, policies))
        yield built
    finally:
        for conn in connections:
            conn.close()
        for dbname in names:
            drop_database(pg_cluster, dbname)


def _run_batch(queries: list[Generated], databases: list[Backends], *, caches_every: int = 1) -> None:
    """`caches_every`: the cache paths are certified on one statement in that many (by index)."""
    failures = []
    policy = databases[0].engines[("limits", "duckdb")].policy
    # One now() for the batch (tests/sql/language/temporal.py): every dialect and cache path alike.
    token = CLOCK.set(temporal.CLOCK)
    try:
        _check_all(queries, databases, policy, failures, caches_every)
    finally:
        CLOCK.reset(token)
    assert not failures, f"{len(failures)} of {len(queries)} statements failed:\n" + "\n".join(failures)


def _check_all(
    queries: list[Generated], databases: list[Backends], policy, failures: list[str], caches_every: int
) -> None:
    for query in queries:
        # Certificates on PostgreSQL too for one statement in four: both engines' hashes are exercised.
        certify_on = ("duckdb", "postgres") if query.index % 4 == 0 else ("duckdb",)
        found = check(query, databases, certify_on=certify_on)
        if query.index % caches_every == 0:
            found += cache_failures(query.sql, query.params, policy)
        if found:
            failures.append(f"{query}\n    " + "\n    ".join(found))


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_fixed_batch(databases: list[Backends], chunk: int) -> None:
    size = -(-FIXED_QUERIES // CHUNKS)
    indexes = range(chunk * size, min(FIXED_QUERIES, (chunk + 1) * size))
    _run_batch([generate(FIXED_SEED, i) for i in indexes], databases, caches_every=CACHES_EVERY)


def test_each_person_without_a_unit_is_a_neighbour_of_its_own(databases: list[Backends]) -> None:
    """The harness's neighbours under null_units: each_a_person remove one person whose unit is
    NULL — all their rows (alike in every column), no other row — on DuckDB and on PostgreSQL; one
    of the adversarial patients without a unit has three rows."""
    adversarial = databases[0]
    for dialect in ("duckdb", "postgres"):
        loaded = adversarial.loaded(dialect)
        neighbours = loaded.unitless_persons()
        assert {table for table, _ in neighbours} == set(schema.EACH_A_PERSON)
        assert sorted(len(rows) for rows in loaded.unitless["patients"]) == [1, 3], dialect
        for table, index in neighbours:
            sql = f"SELECT COUNT(*), COUNT(patient_id) FROM {table}"
            ((rows, persons),) = loaded.run(sql)
            removed = len(loaded.unitless[table][index])
            assert loaded.run(sql, (table, index)) == [(rows - removed, persons)], (dialect, table)
        for table, persons in loaded.unitless.items():
            ids = [str(i) for rows in persons for i in rows]
            assert len(ids) == len(set(ids)), (dialect, table)


def _sources_seed() -> int:
    """A seed that is a function of the code and tests alone (the .py and .sql files under dpproxy/ and
    tests/), whatever the checkout."""
    root = Path(__file__).parents[2]
    digest = hashlib.sha256()
    for path in sorted(
        p for d in ("dpproxy", "tests") for p in (root / d).rglob("*") if p.suffix in (".py", ".sql")
    ):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return int.from_bytes(digest.digest()[:4], "big") % 2**31


def test_random_batch(databases: list[Backends]) -> None:
    given = os.environ.get("DPPROXY_FUZZ_SEED")
    seed = int(given) if given else _sources_seed() if os.environ.get("CI") else secrets.randbelow(2**31)
    print(f"random batch: DPPROXY_FUZZ_SEED={seed} ({RANDOM_QUERIES} statements)")
    _run_batch([generate(seed, i) for i in range(RANDOM_QUERIES)], databases)


def regressions() -> list[Generated]:
    """Statements the generator once found failing: one per line, `-- comment` lines ignored;
    parameters after ` -- params: ` as a Python list literal."""
    import ast

    found = []
    for number, line in enumerate(REGRESSIONS.read_text().splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("--"):
            continue
        sql, _, params = text.partition(" -- params: ")
        found.append(Generated(sql, list(ast.literal_eval(params)) if params else [], -1, number))
    return found


# The regressions in this many chunks (every REGRESSION_CHUNKS-th line each), so that pytest-xdist
# spreads them too: in one test they were the suite's longest (130 s of 2 cores' time).
REGRESSION_CHUNKS = 2


@pytest.mark.parametrize("chunk", range(REGRESSION_CHUNKS))
def test_regressions(databases: list[Backends], chunk: int) -> None:
    _run_batch(regressions()[chunk::REGRESSION_CHUNKS], databases)


LONG_CHUNKS = 16


@pytest.mark.fuzz
@pytest.mark.parametrize("chunk", range(LONG_CHUNKS))
def test_long_random_batch(databases: list[Backends], chunk: int) -> None:
    """Only with -m fuzz: DPPROXY_FUZZ_RANDOM statements in all, in chunks pytest-xdist spreads over
    the cores, each chunk a batch of its own printed seed (DPPROXY_FUZZ_SEED + chunk when given)."""
    base = os.environ.get("DPPROXY_FUZZ_SEED")
    seed = int(base) + chunk if base else secrets.randbelow(2**31)
    count = -(-RANDOM_QUERIES // LONG_CHUNKS)
    print(f"long batch chunk {chunk}: DPPROXY_FUZZ_SEED={seed} ({count} statements)")
    _run_batch([generate(seed, i) for i in range(count)], databases)
