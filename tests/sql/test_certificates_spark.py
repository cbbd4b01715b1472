"""Sensitivity certificates on Spark (docs/privacy.md §3) for query shapes of test_certificates.py.

One fixed database, built to bound (a person with many rows in several groups, NULLs, values far
outside the bounds, a person alone in a group), is loaded into a Spark table and read through a
temporary view that leaves out the person a session variable names; each plan's pre-noise values
must move by at most its sensitivities on every neighbour, and, with limits that keep every row,
equal DuckDB's for the same statement.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import pytest

from dpproxy.backends.spark import arrow_rows, query_arrow
from dpproxy.engine import Engine
from dpproxy.policy import parse_policy
from tests.certify import by_key, certify
from tests.conftest import SPARK
from tests.sparkserver import SparkServer, small_data_session
from tests.sql.test_certificates import Loader, policy_text

pytestmark = SPARK

# pid, grp, pub, x, y: person 0 has many rows in every group, person 3 is alone in group d.
ROWS = [
    *[(0, g, p, x, y) for g, p, x, y in [
        ("a", "a", 10, Decimal("100.00")), ("a", "b", 1000, Decimal("-5.25")), ("b", "c", -1000, None),
        ("b", "z", None, Decimal("1000000.00")), ("c", "a", 3, Decimal("50.50")), ("a", "a", 7, Decimal("0.01")),
        ("c", "b", -6, Decimal("99.99")), ("b", "a", 11, Decimal("12.34")),
    ]],
    (1, "a", "a", 2, Decimal("1.00")),
    (1, "b", None, -5, Decimal("100.00")),
    (2, None, "c", None, None),
    (2, "c", "c", 9, Decimal("-1.00")),
    (3, "d", "z", 4, Decimal("33.33")),
    (4, "a", "b", 0, Decimal("0.00")),
]  # fmt: skip
PERSONS = 5

QUERIES = [
    "SELECT COUNT(*), SUM(x), AVG(y) FROM t",
    "SELECT grp, COUNT(*), SUM(x) FROM t GROUP BY grp",
    "SELECT pub, COUNT(*), AVG(y) FROM t GROUP BY pub",
    "SELECT grp, AVG(x), COUNT(DISTINCT pid) FROM t WHERE y > 10 OR y IS NULL GROUP BY grp",
    "SELECT x % 3, COUNT(*) FROM t GROUP BY 1",
    "SELECT VAR_POP(x), STDDEV_SAMP(y), AVG(y) FROM t",
    "SELECT grp, MIN(x), MAX(y), MEDIAN(y) FROM t GROUP BY grp",
    "SELECT grp, pub, SUM(y) FROM t GROUP BY grp, pub HAVING COUNT(*) > 1 ORDER BY 3 DESC LIMIT 2",
]


class SparkLoader:
    """Table `t` in Spark database `cert_spark`, read through a temporary view `t` that leaves out
    the rows of the person the session variable `cert_without` names."""

    def __init__(self, url: str) -> None:
        self.session = small_data_session(url)
        self.without: int | None = None

    def load(self, rows: list[tuple]) -> None:
        run = self.sql
        run("CREATE DATABASE IF NOT EXISTS cert_spark")
        run("DROP TABLE IF EXISTS cert_spark.t")
        run(
            "CREATE TABLE cert_spark.t (pid INT, grp STRING, pub STRING, x INT, y DECIMAL(12, 2)) USING parquet"
        )
        values = ", ".join(
            "("
            + ", ".join("NULL" if v is None else f"'{v}'" if isinstance(v, str) else str(v) for v in r)
            + ")"
            for r in rows
        )
        run(f"INSERT INTO cert_spark.t VALUES {values}")
        run("DECLARE OR REPLACE VARIABLE cert_without INT DEFAULT NULL")
        run(
            "CREATE OR REPLACE TEMPORARY VIEW t AS SELECT * FROM cert_spark.t "
            "WHERE cert_without IS NULL OR NOT (pid <=> cert_without)"
        )

    def sql(self, sql: str) -> list[tuple]:
        return arrow_rows(query_arrow(self.session, sql))

    def run(self, sql: str, without: int | None = None) -> list[tuple]:
        if without != self.without:
            self.sql(f"SET VARIABLE cert_without = {'NULL' if without is None else int(without)}")
            self.without = without
        return self.sql(sql)


@pytest.fixture(scope="module")
def spark(spark_server: SparkServer) -> Iterator[SparkLoader]:
    loader = SparkLoader(spark_server.url)
    loader.load(ROWS)
    try:
        yield loader
    finally:
        loader.session.stop()


@pytest.mark.parametrize("sql", QUERIES)
def test_unit_level_sensitivity_on_spark(spark: SparkLoader, sql: str) -> None:
    engine = Engine(parse_policy(policy_text(rows=2, groups=2)), None, dialect="spark")
    plan = engine.plan_private(engine.analyze(sql), 1.0, salt="certificate")
    certify(plan, spark.run, PERSONS)


@pytest.mark.parametrize("sql", QUERIES[:4])
def test_spark_computes_what_duckdb_computes(spark: SparkLoader, sql: str) -> None:
    """With limits that keep every row and group, no per-person choice decides anything: the
    pre-noise values are DuckDB's, exactly."""
    text = policy_text(rows=9, groups=4)
    duck = Loader("duckdb")
    duck.load(ROWS)
    measured = {}
    for dialect, run in (("duckdb", duck.run), ("spark", spark.run)):
        engine = Engine(parse_policy(text), None, dialect=dialect)
        plan = engine.plan_private(engine.analyze(sql), 1.0, salt="certificate")
        measured[dialect] = by_key(plan.measure(*(run(s) for s in plan.statements)))
    assert measured["spark"] == measured["duckdb"]
