"""Column alias lists rename a subquery's or a CTE's output columns by position, as in PostgreSQL
(`(SELECT pid, x, k FROM t) AS q(pid, k, x)` makes q.x the inner k); where dpproxy cannot apply one
(on a table, on an aggregating subquery) it refuses, rather than reading the columns by their inner
names: that answered SUM(x) with the sum of the other column (a differential review against
PostgreSQL)."""

from __future__ import annotations

import pytest

from dpproxy.engine import Engine
from dpproxy.errors import DPProxyError
from dpproxy.policy import load_policy
from tests.test_engine import POLICY

ENGINE = Engine(load_policy(POLICY), None)


def statement(sql: str) -> str:
    return ENGINE.plan(sql, salt="s").statements[0]


@pytest.mark.parametrize(
    ("with_list", "spelled_out"),
    [
        (
            "SELECT SUM(a) FROM (SELECT patient_id, age, income FROM patients) AS q(patient_id, income, a)",
            "SELECT SUM(a) FROM (SELECT patient_id, age AS income, income AS a FROM patients) AS q",
        ),
        (
            "WITH c(pid, inc, a) AS (SELECT patient_id, income, age FROM patients) "
            "SELECT p.sex, AVG(c.a) FROM c JOIN patients p ON p.patient_id = c.pid GROUP BY p.sex",
            "WITH c AS (SELECT patient_id AS pid, income AS inc, age AS a FROM patients) "
            "SELECT p.sex, AVG(c.a) FROM c JOIN patients p ON p.patient_id = c.pid GROUP BY p.sex",
        ),
        (  # the reference's own list wins over the CTE's; a shorter list renames the first columns
            "WITH c(pid, a) AS (SELECT patient_id, income, age FROM patients) SELECT SUM(z) FROM c AS d(p, z)",
            "SELECT SUM(z) FROM (SELECT patient_id AS p, income AS z, age FROM patients) AS d",
        ),
    ],
)
def test_a_column_alias_list_renames_by_position(with_list: str, spelled_out: str) -> None:
    assert statement(with_list) == statement(spelled_out)


@pytest.mark.parametrize(
    ("sql", "fragment"),
    [
        (
            "SELECT sex, COUNT(*) FROM patients AS t(sex, pid) GROUP BY sex",
            "column alias lists such as t(sex, pid)",
        ),
        (
            "SELECT AVG(m) FROM (SELECT patient_id, AVG(cost) FROM visits GROUP BY patient_id) AS q(p, m)",
            "column alias lists such as q(p, m)",
        ),
        ("SELECT SUM(a) FROM (SELECT patient_id, age FROM patients) AS q(p, a, b)", "q names 3 columns"),
    ],
)
def test_a_column_alias_list_that_cannot_be_applied_is_refused(sql: str, fragment: str) -> None:
    with pytest.raises(DPProxyError) as caught:
        ENGINE.plan(sql, salt="s")
    assert caught.value.sqlstate == "0A000" and fragment in str(caught.value)
