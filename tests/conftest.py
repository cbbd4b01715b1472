"""Shared test infrastructure: a throwaway PostgreSQL cluster, demo databases, hypothesis profiles.

Each pytest process (each xdist worker) starts its own PostgreSQL cluster the first time a test asks
for one, on a free port of 127.0.0.1, in a fresh temporary directory that is deleted at the end.
One cluster per worker costs about a second and keeps workers from sharing databases, locks or
ports; sharing one through a file lock would save that second but couple the workers' lifetimes.

PostgreSQL refuses to run as root, so when the tests run as root the cluster belongs to the
`postgres` OS user (as on Debian) and its commands run through runuser.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, settings

from dpproxy.demo import build_demo, load_into_postgres, load_into_spark
from tests.pgcluster import (
    MissingPostgres,
    PgCluster,
    create_database,
    drop_database,
    find_pg_bindir,
    start_cluster,
)
from tests.sparkserver import MissingSpark, SparkServer, start_spark_server

__all__ = ["PgCluster", "SparkServer", "create_database", "drop_database"]

# The test processes build millions of short-lived objects (sqlglot trees, rows, plans): the cyclic
# collector's default first threshold (700) ran it so often that a language batch took 8% longer.
gc.set_threshold(50_000, 20, 100)

# --- hypothesis -------------------------------------------------------------------------------

# CI runs on 2 shared cores: no deadlines (timing noise would fail good code) and fewer examples; and
# derandomized, so that a run of a commit's fresh clone is the run CI makes (development runs explore).
settings.register_profile(
    "ci", deadline=None, max_examples=30, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=2000, max_examples=100)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


# --- PostgreSQL cluster -------------------------------------------------------------------------


def _missing_pg(reason: str) -> None:
    message = (
        f"PostgreSQL server binaries are needed for this test: {reason}. "
        "Install them with `apt-get install postgresql-15` (scripts/test.sh does this)."
    )
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    bindir = find_pg_bindir()
    if bindir is None:
        _missing_pg(
            "initdb, pg_ctl and postgres were not found (pg_config, /usr/lib/postgresql/15/bin, PATH)"
        )
    assert bindir is not None
    try:
        with start_cluster(bindir) as cluster:
            yield cluster
    except MissingPostgres as exc:
        _missing_pg(str(exc))


@pytest.fixture
def pg_dsn(pg_cluster: PgCluster) -> Iterator[str]:
    """DSN of a fresh, empty database for this test; dropped afterwards."""
    name = create_database(pg_cluster)
    try:
        yield pg_cluster.dsn(name)
    finally:
        drop_database(pg_cluster, name)


@pytest.fixture
def pg_conn(pg_dsn: str) -> Iterator[psycopg.Connection]:
    """An autocommit superuser connection to `pg_dsn`, for setting up test data."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        yield conn


# --- demo data ----------------------------------------------------------------------------------

DEMO_TEST_PERSONS = 3000


@pytest.fixture(scope="session")
def demo_duckdb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small demo DuckDB file (3000 persons, seed 0), built once per session. Do not modify."""
    path = tmp_path_factory.mktemp("demo") / "demo.duckdb"
    build_demo(path, persons=DEMO_TEST_PERSONS, seed=0)
    return path


@contextlib.contextmanager
def demo_database(pg_cluster: PgCluster, demo_duckdb: Path, prefix: str) -> Iterator[str]:
    """DSN of a new database in the test cluster loaded from `demo_duckdb`, dropped on exit."""
    name = create_database(pg_cluster, prefix=prefix)
    dsn = pg_cluster.dsn(name)
    try:
        load_into_postgres(demo_duckdb, dsn)
        yield dsn
    finally:
        drop_database(pg_cluster, name)


@pytest.fixture(scope="session")
def demo_pg_dsn(pg_cluster: PgCluster, demo_duckdb: Path) -> Iterator[str]:
    """DSN of a database in the test cluster loaded from `demo_duckdb`, built once. Do not modify."""
    with demo_database(pg_cluster, demo_duckdb, "demo") as dsn:
        yield dsn


# --- Spark Connect server -------------------------------------------------------------------------
# One server per pytest process (each xdist worker), started by the first test that asks for it, as
# with the PostgreSQL cluster: workers share no server, data or state. (Grouping every Spark test on
# one worker with xdist_group would start one server only, but pytest-xdist's grouping has no effect
# under pytest 9.2.) Tests using it are marked `spark`: `pytest -m "not spark"` leaves them out.

SPARK = pytest.mark.spark


@pytest.fixture(scope="session")
def spark_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkServer]:
    try:
        with start_spark_server(tmp_path_factory.mktemp("spark")) as server:
            yield server
    except MissingSpark as exc:
        message = f"a Spark Connect server is needed for this test: {exc}"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def spark_demo_url(spark_server: SparkServer, demo_duckdb: Path) -> str:
    """URL of the test Spark server, with `demo_duckdb` loaded into its database `demo`. Do not modify."""
    load_into_spark(demo_duckdb, spark_server.url, database="demo")
    return spark_server.url


# The suite's markers (README, Development: a change's fast run). Applied here from what each test
# needs, so that no file has to remember them: `postgres` for every test that reaches the throwaway
# cluster, `spark` for the Spark Connect server, `wire` for the tests that serve real clients, and
# `slow` for the files that generate, redraw or serve at length (the generated language, the
# certificates, privacy-loss, coverage and noise redraws, worker processes, reloads, browsers, dbt).
_POSTGRES_FIXTURES = frozenset({"pg_cluster", "pg_dsn", "pg_conn", "demo_pg_dsn"})
_SPARK_FIXTURES = frozenset({"spark_server", "spark_demo_url"})
_SLOW_FILES = frozenset(
    {
        "tests/sql/test_language.py",
        "tests/sql/test_language_spark.py",
        "tests/sql/test_certificates.py",
        "tests/sql/test_certificates_dates.py",
        "tests/sql/test_certificates_joins.py",
        "tests/sql/test_certificates_public_keys.py",
        "tests/sql/test_certificates_quantiles.py",
        "tests/sql/test_certificates_spark.py",
        "tests/sql/test_unit_references.py",
        "tests/test_caches.py",
        "tests/release/test_privacy_loss.py",
        "tests/release/test_interval_coverage.py",
        "tests/privacy/test_selection.py",
        "tests/privacy/test_sampling.py",
        "tests/wire/test_workers.py",
        "tests/wire/test_reload.py",
        "tests/wire/test_reload_refusals.py",
        "tests/wire/test_timeouts.py",
        "tests/wire/tools/test_dbt.py",
        "tests/console/test_browser.py",
        # Statistical redraws and timing checks of the noise and selection layers.
        "tests/privacy/test_selectors.py",
        "tests/privacy/test_quantiles.py",
        "tests/privacy/test_draw_time.py",
        "tests/privacy/test_responses.py",
        "tests/privacy/test_error_quantiles.py",
        "tests/sql/test_centred_grid.py",
        "tests/sql/test_limits.py",
    }
)
# Tests that serve the wire protocol or the console to real clients (`wire`).
_WIRE_DIRECTORIES = ("tests/wire/", "tests/console/")


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: a run without it ignores this
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """pytest-xdist's load scheduling, except that the tests whose id names Spark (every test that
    uses its server does) go to one worker together: one Spark server, its JVM started and its
    databases loaded once, instead of one per core competing for both (xdist's own `loadgroup` does
    not group under pytest 9: the group it writes into a test's id is no longer read). Other tests
    go one at a time to whichever worker is free, the Spark group first."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SparkTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "spark" if "spark" in nodeid.lower() else nodeid

    return SparkTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent.parent
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & _POSTGRES_FIXTURES:
            item.add_marker(pytest.mark.postgres)
        if fixtures & _SPARK_FIXTURES:
            item.add_marker(pytest.mark.spark)
            if "spark" not in item.nodeid.lower():
                raise pytest.UsageError(
                    f"{item.nodeid} uses the Spark server: its name must say spark "
                    "(pytest_xdist_make_scheduler runs those on one worker)"
                )
        path = item.path.relative_to(root).as_posix()
        if path in _SLOW_FILES:
            item.add_marker(pytest.mark.slow)
        if path.startswith(_WIRE_DIRECTORIES):
            item.add_marker(pytest.mark.wire)
