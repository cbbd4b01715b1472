"""`SELECT *` inside a FROM-subquery or a CTE expands to the columns the policy exposes (the SQL Ibis
and dbplyr write for every filter step), while the statement's own `*` over a protected table stays
a request for raw rows."""

from __future__ import annotations

import pytest
from sqlglot import exp

from dpproxy.engine import Engine
from dpproxy.errors import DPProxyError, PolicyViolation
from dpproxy.policy import load_policy
from dpproxy.sql.analyze import parse_statement
from dpproxy.sql.query import PrivateQuery
from dpproxy.sql.stars import expand_subquery_stars
from tests.test_engine import POLICY

ENGINE = Engine(load_policy(POLICY), None)


def expanded(sql: str) -> str:
    return expand_subquery_stars(parse_statement(sql), ENGINE.policy, {}).sql("postgres")


def test_a_subquery_star_lists_the_exposed_columns_in_declared_order() -> None:
    text = expanded("SELECT diagnosis, COUNT(*) FROM (SELECT * FROM patients WHERE age > 40) t1 GROUP BY 1")
    listed = [c.name for c in ENGINE.policy.table("patients").columns]  # type: ignore[union-attr]
    inner = parse_statement(text).find(exp.Subquery).this  # type: ignore[union-attr]
    assert [e.alias for e in inner.expressions] == listed
    assert "*" not in inner.sql("postgres")


@pytest.mark.parametrize(
    "sql",
    [
        # Ibis: a filter, then an aggregate over it.
        "SELECT t1.diagnosis, COUNT(*) AS n FROM (SELECT * FROM patients AS t0 WHERE t0.age > 40) AS t1 GROUP BY 1",
        # dbplyr: mutate() over a subquery, a star of one table of a join.
        "SELECT COUNT(*) FROM (SELECT v.*, p.age FROM visits v JOIN patients p ON v.patient_id = p.patient_id) x WHERE age > 30",
        # A CTE whose body is a star, read by an aggregate; nested subqueries.
        "WITH v AS (SELECT * FROM visits) SELECT department, AVG(cost) FROM v GROUP BY department",
        "SELECT COUNT(*) FROM (SELECT * FROM (SELECT * FROM visits WHERE cost > 10) a) b",
    ],
)
def test_tools_star_subqueries_are_private_queries(sql: str) -> None:
    assert isinstance(ENGINE.analyze(sql), PrivateQuery)


def test_the_star_of_the_statement_itself_still_asks_for_raw_rows() -> None:
    for sql in ("SELECT * FROM patients", "SELECT * FROM (SELECT * FROM patients) t"):
        with pytest.raises(PolicyViolation) as caught:
            ENGINE.analyze(sql)
        assert caught.value.sqlstate == "42501" and "raw rows" in caught.value.message


def test_a_star_never_reveals_an_unexposed_column() -> None:
    """The expansion names only policy columns: reading one that is not exposed is the usual 42703."""
    with pytest.raises(DPProxyError) as caught:
        ENGINE.analyze("SELECT COUNT(secret_column) FROM (SELECT * FROM patients) t")
    assert caught.value.sqlstate == "42703"
    assert caught.value.message == 'subquery t has no column "secret_column"'
    assert (
        caught.value.hint
        == f"its columns: {', '.join(c.name for c in ENGINE.policy.table('patients').columns)}"
    )  # type: ignore[union-attr]
