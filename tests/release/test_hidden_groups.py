"""What an answer says about the groups partition selection did not show (docs/privacy.md §5, "What
an answer says about hidden groups"): the threshold in persons, and from how many persons a group is
shown with probability >= 95% — both of the plan — and, for an answer with no group released, that
this is why it is empty and what would show the keys. Never a count of the groups not shown: two
databases that differ only in their hidden groups give the same notice.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from dpproxy.engine import Engine
from dpproxy.release.groups import selection_threshold
from dpproxy.results import Result, ResultStream

POLICY = """
version: 1
defaults: {epsilon: 1.0, delta: 1.0e-7, max_epsilon: 1.0}
analysts: {alice: {epsilon: 100, delta: 1.0e-3}}
tables:
  people:
    privacy_unit: id
    columns:
      id: {type: integer}
      city: {type: varchar}
      sex: {type: varchar, public_values: [F, M]}
      age: {type: integer, lower: 0, upper: 100}
"""

EMPTY = "no group reached it, so the answer is empty (whether any group exists is not revealed)"


def database(path: Path, small_cities: int) -> Path:
    """One city of 400 persons and `small_cities` cities of one person each."""
    with duckdb.connect(str(path)) as conn:
        conn.execute("CREATE TABLE people (id INTEGER PRIMARY KEY, city VARCHAR, sex VARCHAR, age INTEGER)")
        conn.execute("INSERT INTO people SELECT i, 'big', 'F', i % 90 FROM range(400) t(i)")
        conn.execute(
            f"INSERT INTO people SELECT 1000 + i, 'small' || i, 'M', 30 FROM range({small_cities}) t(i)"
        )
    return path


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[tuple[Engine, Engine]]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    few = database(tmp_path / "few.duckdb", 3)
    many = database(tmp_path / "many.duckdb", 60)
    with (
        Engine.open(policy, str(few), tmp_path / "few.sqlite") as a,
        Engine.open(policy, str(many), tmp_path / "many.sqlite") as b,
    ):
        yield a, b


def answer(engine: Engine, sql: str, *, stream: bool = False) -> tuple[list[tuple], str]:
    result = engine.execute(sql, analyst="alice", stream=stream)
    if isinstance(result, ResultStream):
        rows = [row for batch in result for row in batch]
        assert result.summary is not None
        return rows, result.summary.notice or ""
    assert isinstance(result, Result)
    return result.rows, result.notice or ""


def threshold_sentence(engine: Engine, sql: str) -> str:
    plan = engine.plan(sql, epsilon=1.0)
    figures = selection_threshold(plan.query, plan.noise)
    assert figures is not None
    threshold, shown_from = figures
    return (
        f"groups of fewer than ~{threshold} persons are not shown (a group appears when its noisy count "
        f"of persons reaches {threshold}; from {shown_from} persons, with probability ≥ 95%)"
    )


def test_private_keys_answer_says_the_threshold(engines: tuple[Engine, Engine]) -> None:
    engine, _ = engines
    sql = "SELECT city, COUNT(*) FROM people GROUP BY city"
    rows, notice = answer(engine, sql)
    assert [r[0] for r in rows] == ["big"]
    assert threshold_sentence(engine, sql) in notice
    assert EMPTY not in notice


def test_an_empty_answer_says_why_and_what_would_show_the_keys(engines: tuple[Engine, Engine]) -> None:
    engine, _ = engines
    sql = "SELECT city, COUNT(*) FROM people WHERE age > 95 GROUP BY city"
    rows, notice = answer(engine, sql)
    assert rows == []
    assert threshold_sentence(engine, sql) in notice
    assert EMPTY in notice
    assert "public_values in the policy" in notice and "spend a larger ε" in notice


def test_a_streamed_empty_answer_says_it_too(engines: tuple[Engine, Engine]) -> None:
    engine, _ = engines
    sql = "SELECT city, COUNT(*) FROM people WHERE age > 96 GROUP BY city"
    rows, notice = answer(engine, sql, stream=True)
    assert rows == [] and EMPTY in notice and threshold_sentence(engine, sql) in notice


def test_a_replayed_answer_keeps_the_sentence(engines: tuple[Engine, Engine]) -> None:
    engine, _ = engines
    sql = "SELECT city, COUNT(*) FROM people WHERE age > 97 GROUP BY city"
    first = engine.execute(sql, analyst="alice")
    again = engine.execute(sql, analyst="alice")
    assert isinstance(first, Result) and isinstance(again, Result)
    assert again.replayed and again.rows == first.rows == []
    assert EMPTY in (again.notice or "") and threshold_sentence(engine, sql) in (again.notice or "")


def test_public_keys_need_no_sentence(engines: tuple[Engine, Engine]) -> None:
    engine, _ = engines
    _, notice = answer(engine, "SELECT sex, COUNT(*) FROM people GROUP BY sex")
    _, whole = answer(engine, "SELECT COUNT(*) FROM people WHERE age > 95")
    assert "not shown" not in notice and "not shown" not in whole


def test_the_notice_does_not_count_hidden_groups(engines: tuple[Engine, Engine]) -> None:
    """3 or 60 groups of one person each (none of them reaches the threshold of ~30 but with
    probability ~e^-15 each): the same released rows, the same words."""
    few, many = engines
    for sql in (
        "SELECT city, COUNT(*) FROM people GROUP BY city",
        "SELECT city, COUNT(*) FROM people WHERE sex = 'M' GROUP BY city",
    ):
        rows_few, notice_few = answer(few, sql)
        rows_many, notice_many = answer(many, sql)
        assert [r[0] for r in rows_few] == [r[0] for r in rows_many]
        sentence = threshold_sentence(few, sql)
        assert (
            notice_few[notice_few.index("groups of fewer") :]
            == notice_many[notice_many.index("groups of fewer") :]
        )
        assert sentence in notice_few


def test_shown_from_is_where_release_is_95_percent_likely(engines: tuple[Engine, Engine]) -> None:
    """The discrete Laplace of scale b: P(Z < −w) = q^(w+1)/(1 + q), q = e^(−1/b). A group of
    τ + w persons is released when Z >= −w: at least 95%, and w is the least such."""
    engine, _ = engines
    plan = engine.plan("SELECT city, COUNT(*) FROM people GROUP BY city", epsilon=1.0)
    threshold, shown_from = selection_threshold(plan.query, plan.noise) or (0, 0)
    spec = plan.noise.selection
    assert spec is not None and threshold == spec.threshold
    q = math.exp(-1 / spec.scale)
    w = shown_from - threshold

    def released(margin: int) -> float:  # P(Z >= −margin)
        return 1 - q ** (margin + 1) / (1 + q)

    assert released(w) >= 0.95 and released(w - 1) < 0.95
