"""The language generator's checks on Spark: the same statements, the same values as elsewhere.

A subset of tests/sql/test_language.py's fixed batch, and its regressions, run on Spark as well as on
DuckDB and PostgreSQL (tests/sql/language/harness.py): every statement is refused alike, or is
accepted and gives on Spark the pre-noise values and group sets DuckDB and PostgreSQL give, to the
cent; Spark may refuse only a construct it cannot give PostgreSQL's meaning (0A000, "… on the Spark
backend", before it reads data). The sensitivity certificate runs on Spark for a few of them. The databases are the adversarial ones, with the dates Spark cannot hold
(±infinity, years past 9999) moved to the ends of its range, in all three engines.

A Spark query costs a few hundred milliseconds here: the subset is sized so that this file takes
about two minutes on one worker (DPPROXY_FUZZ_SPARK statements, default SPARK_QUERIES).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator

import psycopg
import pytest

from dpproxy.policy import parse_policy
from tests.certify import certification_duckdb
from tests.conftest import SPARK
from tests.pgcluster import PgCluster, create_database, drop_database
from tests.sparkserver import SparkServer, small_data_session
from tests.sql.language import schema
from tests.sql.language.databases import Loaded
from tests.sql.language.grammar import Generated, generate
from tests.sql.language.harness import Backends, check
from tests.sql.test_language import FIXED_SEED, regressions

pytestmark = SPARK

SPARK_QUERIES = int(os.environ.get("DPPROXY_FUZZ_SPARK", "24"))
SPARK_CHUNKS = 2
# Fixed-batch statements certified on Spark too (an accepted one, two group keys): ~30 s each here.
SPARK_CERTIFIED = (23,)

DATABASES = {
    "adversarial": lambda: schema.adversarial(1),
    "empty": schema.empty,
    "single": lambda: schema.one_row_each(2),
}


def build_databases(
    pg_cluster: PgCluster, spark_url: str, names: list[str], sessions: list
) -> list[Backends]:
    """The databases loaded into DuckDB, PostgreSQL (databases appended to `names`) and Spark
    (sessions appended to `sessions`), with their engines."""
    policies = {
        "limits": parse_policy(schema.policy_text(schema.LIMITS)),
        "high": parse_policy(schema.policy_text(schema.HIGH_LIMITS)),
    }
    built = []
    for name, make in DATABASES.items():
        db = schema.representable_in_spark(make())
        duck = Loaded("duckdb", certification_duckdb())
        duck.load(db)
        dbname = create_database(pg_cluster, prefix="langspark")
        names.append(dbname)
        pg = Loaded("postgres", psycopg.connect(pg_cluster.dsn(dbname), autocommit=True))
        pg.load(db)
        session = small_data_session(spark_url)
        sessions.append(session)
        spark = Loaded("spark", session)
        spark.load(db)
        built.append(Backends.build(name, duck, pg, policies, spark=spark))
    return built


@pytest.fixture(scope="module")
def databases(pg_cluster: PgCluster, spark_server: SparkServer) -> Iterator[list[Backends]]:
    names: list[str] = []
    sessions: list = []
    built: list[Backends] = []
    try:
        built = build_databases(pg_cluster, spark_server.url, names, sessions)
        yield built
    finally:
        for backends in built:
            assert backends.postgres is not None
            backends.postgres.conn.close()
        for session in sessions:
            session.stop()
        for dbname in names:
            drop_database(pg_cluster, dbname)


def run_batch(queries: list[Generated], databases: list[Backends], certified: Collection[int] = ()) -> None:
    """The harness's checks on each statement; the sensitivity certificate on Spark too for the
    statements whose index is in `certified`."""
    failures = []
    for query in queries:
        certify_on = ("spark",) if query.index in certified else ()
        found = check(query, databases, certify_on=certify_on)
        if found:
            failures.append(f"{query}\n    " + "\n    ".join(found))
    assert not failures, f"{len(failures)} of {len(queries)} statements failed:\n" + "\n".join(failures)


@pytest.mark.parametrize("chunk", range(SPARK_CHUNKS))
def test_fixed_batch_on_spark(databases: list[Backends], chunk: int) -> None:
    size = -(-SPARK_QUERIES // SPARK_CHUNKS)
    indexes = range(chunk * size, min(SPARK_QUERIES, (chunk + 1) * size))
    run_batch([generate(FIXED_SEED, i) for i in indexes], databases, SPARK_CERTIFIED)


def test_regressions_on_spark(databases: list[Backends]) -> None:
    # On the adversarial database only: tests/sql/test_language.py runs every regression on all three
    # databases in DuckDB and PostgreSQL; what Spark adds is its spelling of the values, and that
    # database holds the values that differ (a Spark query costs ~1 s here, three databases 2.5 min).
    run_batch(regressions(), databases[:1])


# Where Spark SQL, transpiled naively, means something else than PostgreSQL: each statement must give
# the values DuckDB and PostgreSQL give (dpproxy/sql/numbers.py spells them for Spark).
SPARK_TRAPS = [
    # Integer division (Spark's / of integers is a double), nested.
    "SELECT age / 7 AS k, (age / 7) / 2 AS h, COUNT(*) FROM patients GROUP BY 1, 2",
    "SELECT SUM(age / 3), SUM((duration - 100) / 7) FROM patients JOIN visits USING (patient_id)",
    # Casts to integer types round (Spark's casts truncate): doubles to even, exact numbers away from 0.
    "SELECT CAST(score * 10 AS integer) AS k, COUNT(*) FROM patients GROUP BY 1",
    "SELECT CAST(income / 1000 AS bigint) AS k, COUNT(*) FROM patients GROUP BY 1",
    "SELECT CAST(cost / 4 AS integer) AS k, CAST(temperature AS smallint) AS t, COUNT(*) FROM visits GROUP BY 1, 2",
    # Remainders of negatives, GREATEST/LEAST with NULLs.
    "SELECT (age - 60) % 7 AS k, COUNT(*) FROM patients GROUP BY 1",
    "SELECT greatest(age, NULL, 3) AS g, least(NULL, age) AS l, COUNT(*) FROM patients GROUP BY 1, 2",
    # left/right with negative lengths, substring from before the start, strpos, trim.
    "SELECT left(zip, -2) AS a, right(zip, -1) AS b, COUNT(*) FROM patients GROUP BY 1, 2",
    "SELECT substring(diagnosis, -1, 3) AS a, strpos(diagnosis, 'l') AS b, COUNT(*) FROM patients GROUP BY 1, 2",
    "SELECT trim(diagnosis) AS a, trim(both 'f' from diagnosis) AS b, COUNT(*) FROM patients GROUP BY 1, 2",
    # Concatenation with NULLs, text of integers, booleans, dates and times.
    "SELECT concat(zip, '-', age) AS a, zip || '/' || diagnosis AS b, COUNT(*) FROM patients GROUP BY 1, 2",
    "SELECT CAST(smoker AS text) AS a, CAST(birth AS text) AS b, COUNT(*) FROM patients GROUP BY 1, 2",
    "SELECT CAST(seen AS text) AS a, COUNT(*) FROM patients GROUP BY 1",
    "SELECT CAST(checked_in AS text) AS a, COUNT(*) FROM visits GROUP BY 1",
    # LIKE and ILIKE: an escape before an ordinary character, wildcards escaped, non-ASCII letters.
    "SELECT COUNT(*) FROM patients WHERE zip LIKE '\\9%' OR diagnosis LIKE '\\%' OR diagnosis LIKE 'a\\\\b'",
    "SELECT COUNT(*) FROM patients WHERE diagnosis ILIKE '%É%' OR diagnosis ILIKE 'FLU' OR zip NOT LIKE '_0%'",
    "SELECT COUNT(*) FROM patients WHERE diagnosis LIKE '#o''h%' ESCAPE '#' OR diagnosis LIKE '#_x' ESCAPE '#'",
    # Dates and times: date_trunc of a date, every extract field, epochs; a NULL condition.
    "SELECT date_trunc('week', birth) AS w, date_trunc('quarter', visit_date) AS q, COUNT(*) "
    "FROM patients JOIN visits USING (patient_id) GROUP BY 1, 2",
    "SELECT extract(dow FROM birth) AS a, extract(isodow FROM seen) AS b, extract(doy FROM visit_date) AS c, "
    "COUNT(*) FROM patients JOIN visits USING (patient_id) GROUP BY 1, 2, 3",
    "SELECT extract(week FROM birth) AS a, extract(isoyear FROM birth) AS b, extract(quarter FROM seen) AS c, "
    "COUNT(*) FROM patients GROUP BY 1, 2, 3",
    "SELECT extract(year FROM checked_in) AS a, extract(month FROM checked_in) AS b, extract(day FROM seen) AS c, "
    "extract(hour FROM checked_in) AS d, extract(minute FROM seen) AS e, COUNT(*) FROM visits "
    "JOIN patients USING (patient_id) GROUP BY 1, 2, 3, 4, 5",
    "SELECT SUM(extract(epoch FROM seen) / 86400), AVG(extract(epoch FROM birth)), "
    "SUM(extract(epoch FROM checked_in)) FROM patients JOIN visits USING (patient_id)",
    "SELECT COUNT(*) FROM visits WHERE NULL",
    "SELECT COUNT(*), SUM(CASE WHEN NULL THEN 1 ELSE 2 END) FROM visits WHERE (NULL) IS NULL",
    # NaN, infinities, -0.0 and 0.0 of a float column as group keys; sums of decimals.
    "SELECT score AS k, COUNT(*) FROM patients GROUP BY 1",
    "SELECT score * 0 AS k, COUNT(*) FROM patients GROUP BY 1",
    "SELECT SUM(income), AVG(cost), SUM(income * 2), SUM(cost / 3) FROM patients JOIN visits USING (patient_id)",
    # FLOOR and CEIL of doubles (Spark's are BIGINTs: NaN became 0, large values capped), decimal
    # products and sums at their full scale (Spark's default cut them to 6 places: 1e-8 was 0).
    "SELECT floor(score) AS a, ceil(score * 1000) AS b, COUNT(*) FROM patients GROUP BY 1, 2",
    "SELECT COUNT(*) FROM patients WHERE floor(score * 1000000000) > 9300000000000000000 OR floor(score) = 0",
    "SELECT COUNT(*), SUM(income * 0.0001 * 0.0001) FROM patients WHERE income * 0.0001 * 0.0001 > 0",
    # sign(): Spark's is a double, and NaN's NaN where PostgreSQL's is 0.
    "SELECT sign(score) AS a, sign(income - 1000) AS b, sign(age - 40) AS c, COUNT(*) FROM patients GROUP BY 1, 2, 3",
]


def test_constructs_spelled_for_spark_mean_what_postgresql_means(databases: list[Backends]) -> None:
    # The adversarial database holds the values these traps are about (NaN, ±0.0, negatives, NULLs).
    run_batch([Generated(sql, [], -2, i) for i, sql in enumerate(SPARK_TRAPS)], databases[:1])
