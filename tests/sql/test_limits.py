"""The statement limits (dpproxy.sql.limits) on the engine's path: a statement past any of them is
refused with 54001 (statement_too_complex) naming the limit and its value, before it is parsed or
analysed and in bounded time (CPU seconds: the shared test machine's load does not count);
statements deep enough to exhaust Python's recursion get 54001, never an internal error; and what BI
tools send stays well inside every limit."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import sqlglot
from sqlglot.dialects.dialect import Dialect

from dpproxy.engine import Engine
from dpproxy.errors import DPProxyError, StatementTooComplex
from dpproxy.policy import load_policy
from dpproxy.sql import limits
from dpproxy.sql.statement import parse_statement

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "dpproxy" / "data" / "demo.yaml"
CAPTURED = REPO / "tests" / "wire" / "catalog_queries" / "captured.json"


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(load_policy(POLICY), None)


def in_list(n: int) -> str:
    return "SELECT COUNT(*) FROM patients WHERE age IN (" + ", ".join(str(i % 120) for i in range(n)) + ")"


def or_chain(n: int) -> str:
    return "SELECT COUNT(*) FROM patients WHERE " + " OR ".join(f"age = {i % 120}" for i in range(n))


def parens(n: int) -> str:
    return "SELECT COUNT(*) FROM patients WHERE " + "(" * n + "age > 1" + ")" * n


def refusal(call: object, *args: object) -> StatementTooComplex:
    with pytest.raises(StatementTooComplex) as caught:
        call(*args)  # type: ignore[operator]
    error = caught.value
    assert error.sqlstate == "54001" and error.message.startswith("statement too complex: ")
    assert error.hint
    return error


# -- the statements of issue 18 ----------------------------------------------------------------------


def test_a_100000_item_in_list_is_refused_within_seconds(engine: Engine) -> None:
    sql = in_list(100_000)
    for call in (parse_statement, engine.plan, engine.explain, engine.describe):
        started = time.process_time()
        error = refusal(call, sql)
        assert time.process_time() - started < 5
        assert error.message == (
            "statement too complex: the statement has more than 10000 items in one IN list; dpproxy accepts "
            "at most 10000"
        )


@pytest.mark.parametrize(
    ("sql", "limit"),
    [(parens(3000), "nests more than 100 levels deep"), (or_chain(20_000), "more than 5000 words")],
    ids=["3000 parentheses", "20000-term OR"],
)
def test_deep_statements_get_54001_not_an_internal_error(engine: Engine, sql: str, limit: str) -> None:
    for call in (parse_statement, engine.plan, engine.explain, engine.describe):
        assert limit in refusal(call, sql).message


def test_a_chain_deeper_than_the_engine_can_recurse_is_refused_by_depth(engine: Engine) -> None:
    # 1,000 OR terms are few tokens, but a tree 1,004 levels deep: analysing it would recurse past
    # Python's limit (the engine fails from ~330 levels).
    error = refusal(engine.plan, or_chain(1000))
    assert "nested 1004 levels deep" in error.message and "at most 256" in error.message
    assert "IN (…)" in (error.hint or "")


def test_what_bi_tools_send_still_plans(engine: Engine) -> None:
    assert engine.plan(in_list(1000)).query.text
    assert engine.plan(or_chain(100)).query.text
    assert engine.plan(or_chain(250)).query.text  # the deepest chain accepted
    assert engine.plan(parens(99)).query.text
    # 10,000 values, the most in one IN list, as constants of several kinds.
    values = ", ".join(f"'{i:05d}'" for i in range(10_000))
    assert engine.plan(f"SELECT COUNT(*) FROM patients WHERE zip IN ({values})").query.text


# -- each limit names itself and its value -----------------------------------------------------------


def select_list(n: int, item: str, source: str = "patients") -> str:
    return "SELECT " + ", ".join(item.format(i=i) for i in range(n)) + f" FROM {source} GROUP BY sex"


def cte_chain(n: int) -> str:
    ctes = ", ".join(
        f"c{i} AS (SELECT patient_id, age FROM {'patients' if i == 0 else f'c{i - 1}'} WHERE age > {i})"
        for i in range(n)
    )
    return f"WITH {ctes} SELECT COUNT(*) FROM c{n - 1}"


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        (
            "SELECT '" + "a" * 1_000_001 + "'",
            "the statement is 1000010 characters long; dpproxy accepts at most 1000000",
        ),
        (
            "SELECT COUNT(*) FROM patients WHERE " + " AND ".join(in_list(9000)[36:] for _ in range(3)),
            "more than 50000 tokens; dpproxy accepts at most 50000",
        ),
        ("SELECT COUNT(*) FROM patients WHERE " + " AND ".join(["age > 1"] * 2000), "more than 5000 words"),
        (
            "SELECT coalesce(" + ", ".join(["1"] * 10_001) + ") FROM patients",
            "more than 10000 items in one list",
        ),
        (
            "SELECT * FROM (VALUES " + ", ".join(f"({i})" for i in range(10_001)) + ") v",
            "more than 10000 rows in one VALUES list",
        ),
        ("SELECT x" + "[1]" * 101 + " FROM patients", "nests more than 100 levels deep"),
        (
            "SELECT COUNT(*) FROM patients WHERE " + "NOT " * 101 + "age > 1",
            "nests more than 100 levels deep",
        ),
        (
            "SELECT COUNT(*) FROM patients WHERE "
            + "CASE WHEN age > 1 THEN " * 101
            + "1"
            + " END" * 101
            + " = 1",
            "nests more than 100 levels deep",
        ),
        (cte_chain(8), "has 9 SELECTs (the query, its subqueries and CTEs); dpproxy plans at most 8"),
        (select_list(101, "COUNT(*)"), "calls aggregates 101 times; dpproxy plans at most 100"),
        (
            select_list(10, "SUM(" + " + ".join(["age * 2"] * 30) + " + {i})"),
            "aggregate calls have 1220 nodes (operators, functions, columns and constants); dpproxy plans at "
            "most 1000",
        ),
        (select_list(11, "MEDIAN(income + {i})"), "has 11 MIN, MAX, MEDIAN, percentile and MODE aggregates"),
        (select_list(4, "MAX(" + " + ".join(["income * age"] * 6) + " + {i})"), "have 104 nodes"),
        (
            "SELECT MEDIAN(income), MIN(age), MAX(age), MIN(income), MAX(income), MEDIAN(age) FROM patients "
            "WHERE " + in_list(9000)[36:],
            "has 6 MIN, MAX, MEDIAN, percentile and MODE aggregates and 9018 nodes",
        ),
    ],
    ids=[
        "length",
        "tokens",
        "words",
        "list items",
        "VALUES rows",
        "subscripts",
        "NOT",
        "CASE",
        "SELECTs",
        "aggregates",
        "aggregate nodes",
        "selectors",
        "selector nodes",
        "selector work",
    ],
)
def test_each_limit_names_itself_and_its_value(sql: str, message: str) -> None:
    assert message in refusal(parse_statement, sql).message


def test_at_each_limit_a_statement_is_still_accepted() -> None:
    parse_statement("SELECT coalesce(" + ", ".join(["1"] * 10_000) + ") FROM patients")
    parse_statement("SELECT x" + "[1]" * 100 + " FROM patients")
    parse_statement(cte_chain(7))
    parse_statement(select_list(100, "COUNT(*)"))
    parse_statement(select_list(10, "MEDIAN(income + age * {i})"))


def test_lists_of_constants_cost_no_words() -> None:
    # Signs and casts of constants are part of them: 9,000 negative numbers or dates cost no words.
    lists = [
        ", ".join(f"-{i}" for i in range(9000)),
        ", ".join(f"'2024-01-{i % 28 + 1:02d}'::date" for i in range(9000)),
        ", ".join(["$1"] * 9000),
        ", ".join(["NULL"] * 9000),
    ]
    for values in lists:
        parse_statement(f"SELECT COUNT(*) FROM patients WHERE age IN ({values})")


def test_real_clients_stay_far_inside_the_limits() -> None:
    """The catalog queries captured from psql, JDBC, SQLAlchemy, DBeaver and BI tools (the largest
    SQL clients send): at most a fifth of any token limit, and shallow."""
    queries: list[str] = []

    def collect(value: object) -> None:
        if isinstance(value, str) and re.match(r"\s*(select|with|\()", value, re.IGNORECASE):
            queries.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, list):
            for item in value:
                collect(item)

    collect(json.loads(CAPTURED.read_text()))
    assert len(queries) > 100
    for sql in queries:
        meter = limits.check_sqlglot_tokens(Dialect.get_or_raise("postgres").tokenize(sql))
        assert meter.words <= limits.MAX_WORDS / 5 and meter.tokens <= limits.MAX_TOKENS / 50
        try:
            tree = sqlglot.parse_one(sql, read="postgres")
        except sqlglot.errors.ParseError:
            continue
        limits.check_tree(tree)


# -- the backstop ------------------------------------------------------------------------------------


def test_a_recursion_error_becomes_54001() -> None:
    def deep(n: int) -> int:
        return deep(n + 1)

    with pytest.raises(StatementTooComplex) as caught, limits.refuse_deep_recursion():
        deep(0)
    assert caught.value.sqlstate == "54001" and "at most 256 levels deep" in caught.value.message

    @limits.refuse_deep_recursion()
    def decorated() -> int:
        return deep(0)

    with pytest.raises(StatementTooComplex):
        decorated()


def test_other_errors_pass_the_backstop_unchanged() -> None:
    with pytest.raises(DPProxyError) as caught, limits.refuse_deep_recursion():
        parse_statement("SELEC 1")
    assert caught.value.sqlstate == "42601"
