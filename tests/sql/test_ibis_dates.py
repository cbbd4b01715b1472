"""The date constants Ibis writes (ibis/backends/sql/compilers/postgres.py, `visit_DateFromYMD` and
`visit_Date`): `ibis.date("2024-01-01")` is `MAKE_DATE(2024, 1, 1)` and `ibis.now().date()` is
`DATE(CURRENT_TIMESTAMP)`, so `t.filter(t.visit_date >= ibis.date(…))` and "the last 365 days"
reach dpproxy as

    … WHERE "t0"."visit_date" >= MAKE_DATE(2024, 1, 1)
    … WHERE "t0"."visit_date" >= (DATE(CURRENT_TIMESTAMP) - INTERVAL '365 DAY')

Both are constants, folded into typed constants with the clock (dpproxy.sql.clock) before the
analyzer reads them; `date(column)` and `make_date` of columns are left for the analyzer.
"""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest

from dpproxy.errors import DPProxyError
from dpproxy.sql.clock import CLOCK, Clock
from dpproxy.sql.folding import fold_constants
from dpproxy.sql.query import PrivateQuery
from dpproxy.sql.statement import parse_statement
from tests.sql.test_clock_filter_probes import engine

INSTANT = dt.datetime(2024, 3, 31, 23, 30, 15, 123456, tzinfo=dt.UTC)


def folded(expression: str) -> str:
    token = CLOCK.set(Clock(INSTANT))
    try:
        tree = fold_constants(parse_statement(f"SELECT 1 FROM t WHERE x >= {expression}"))
    finally:
        CLOCK.reset(token)
    return tree.args["where"].this.expression.sql("postgres")


@pytest.mark.parametrize(
    ("expression", "constant"),
    [
        ("MAKE_DATE(2024, 1, 1)", "CAST('2024-01-01' AS DATE)"),
        ("make_date(2024, 2, 29)", "CAST('2024-02-29' AS DATE)"),
        ("DATE(CURRENT_TIMESTAMP)", "CAST('2024-03-31' AS DATE)"),
        ("DATE(CURRENT_TIMESTAMP) - INTERVAL '365 DAY'", "CAST('2023-04-01 00:00:00.000000' AS TIMESTAMP)"),
        ("DATE('2024-05-06')", "CAST('2024-05-06' AS DATE)"),
        ("MAKE_DATE(2024, 1, 1) + 30", "CAST('2024-01-31' AS DATE)"),
    ],
)
def test_ibis_date_constants_fold(expression: str, constant: str) -> None:
    assert folded(expression) == constant


def test_date_and_make_date_of_columns_are_left_for_the_analyzer() -> None:
    """DATE(y) of a column is read as the cast it is in PostgreSQL (Ibis's `.date()`), which the
    analyzer checks as any other."""
    assert folded("DATE(y)") == "CAST(y AS DATE)"
    assert folded("MAKE_DATE(y, 1, 1)") == "MAKE_DATE(y, 1, 1)"


def test_a_day_that_does_not_exist_is_postgresqls_error() -> None:
    with pytest.raises(DPProxyError) as caught:
        folded("MAKE_DATE(2023, 2, 29)")
    assert caught.value.sqlstate == "22008"
    assert "date field value out of range: 2023-02-29" in str(caught.value)


@pytest.mark.parametrize(
    "where",
    [
        '"t0"."visit_date" >= MAKE_DATE(2024, 1, 1)',
        '"t0"."visit_date" >= (DATE(CURRENT_TIMESTAMP) - INTERVAL \'365 DAY\')',
    ],
)
def test_ibis_date_filters_are_private_queries(where: str) -> None:
    sql = f'SELECT COUNT(*) AS "CountStar()" FROM (SELECT * FROM "visits" AS "t0" WHERE {where}) AS "t1"'
    assert isinstance(engine().analyze(sql), PrivateQuery)


def test_make_date_read_as_date_from_parts_folds_alike() -> None:
    """Once Ibis is loaded in the same process it teaches sqlglot's PostgreSQL dialect make_date, which
    then parses as DateFromParts (the suite's full run showed it): folded alike."""
    from sqlglot import exp

    tree = parse_statement("SELECT 1 FROM t WHERE x >= MAKE_DATE(2024, 2, 29)")
    comparison = tree.args["where"].this
    numbers = [exp.Literal.number(v) for v in (2024, 2, 29)]
    comparison.set("expression", exp.DateFromParts(year=numbers[0], month=numbers[1], day=numbers[2]))
    token = CLOCK.set(Clock(INSTANT))
    try:
        folded_tree = fold_constants(tree)
    finally:
        CLOCK.reset(token)
    assert folded_tree.args["where"].this.expression.sql("postgres") == folded("MAKE_DATE(2024, 2, 29)")


TO_CHAR_PATTERNS = ("YYYY-MM", "YYYY-MM-DD", "YYYY", "MM/DD/YYYY", "YYYY-MM-DD HH24:MI", "HH24")


def test_to_char_of_date_fields_is_the_text_postgresql_writes(demo_pg_dsn: str) -> None:
    """`to_char(t, 'YYYY-MM')` (Ibis's `.strftime('%Y-%m')`) is read as its fields' extracts,
    zero-padded and joined; on PostgreSQL itself the rewrite equals to_char over timestamps from
    year 1 to 9999 and NULL. Other patterns are left as written (and refused by the analyzer)."""
    moments = [
        "0001-01-01 00:00:00",
        "0999-12-31 23:59:59",
        "2013-01-05 07:04:00",
        "2024-02-29 12:00:59",
        "9999-12-31 23:59:00",
    ]
    values = ", ".join(f"(TIMESTAMP '{m}')" for m in moments) + ", (NULL)"
    with psycopg.connect(demo_pg_dsn) as conn:
        for pattern in TO_CHAR_PATTERNS:
            tree = parse_statement(f"SELECT to_char(t, '{pattern}') FROM v")
            rewritten = tree.expressions[0].this.sql("postgres")
            assert "TO_CHAR" not in rewritten.upper(), pattern
            rows = conn.execute(
                f"SELECT to_char(t, '{pattern}'), {rewritten} FROM (VALUES {values}) AS v(t)"
            ).fetchall()
            assert all(a == b for a, b in rows), (pattern, rows)
    assert tree.expressions[0].alias == "to_char"
    for pattern in ("Mon YYYY", "YY", "HH12", "Q"):
        text = parse_statement(f"SELECT to_char(t, '{pattern}') FROM v").sql("postgres")
        assert "TO_CHAR" in text.upper(), pattern
