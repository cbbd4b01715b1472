"""The engine's caches hold only what the cold path answered for the identical input
(dpproxy.engine.caches): whatever was asked before, a statement gets exactly the plan, refusal or
public SQL a fresh engine's cold analysis of its text and parameters gives.

Checked with the language tests' differential (tests/sql/language/caches.py: each statement with its
integer constants replaced by adversarial ones, in the text and as `$n`) over the SQL BI tools send,
generated dashboard statements, and the statement of the shape-cache breach; and through
Engine.execute on real backends (DuckDB and PostgreSQL) for the breach itself and for dashboards
that change their filter's constant.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

import duckdb
import pytest

from dpproxy.engine import Engine, Plan
from dpproxy.engine.caches import PlanCaches, PublicStatement, cache_key
from dpproxy.policy import parse_policy
from dpproxy.sql.clock import CLOCK, Clock
from tests.sql import test_bi_tools
from tests.sql.language import schema
from tests.sql.language.caches import cache_failures, engine

POLICY = parse_policy(schema.policy_text(schema.HIGH_LIMITS))

BI_STYLE = [
    # Metabase's question builder: a filter on a number column, qualified names.
    'SELECT "public"."patients"."diagnosis" AS "diagnosis", count(*) AS "count" FROM "public"."patients" '
    'WHERE "public"."patients"."age" > 30 GROUP BY "public"."patients"."diagnosis" ORDER BY "public"."patients"."diagnosis" ASC',
    # Superset: a range filter on a metric column, AVG and SUM.
    "SELECT department AS department, AVG(cost) AS avg_cost, SUM(duration) AS total FROM visits "
    "WHERE duration BETWEEN 10 AND 120 AND cost < 5000 GROUP BY department LIMIT 100",
    # A filter on a group key keeps its constant in the key (it can restrict the key's candidates).
    "SELECT age, COUNT(*) FROM patients WHERE age = 40 GROUP BY age",
    "SELECT diagnosis, COUNT(*) FROM patients WHERE age >= 18 AND age <= 65 OR income > 100 GROUP BY diagnosis",
    "SELECT p.zip, COUNT(*), AVG(v.cost) FROM patients p JOIN visits v ON p.patient_id = v.patient_id "
    "WHERE NOT (v.cost > 250) AND p.age <> 7 GROUP BY p.zip HAVING COUNT(*) > 5 ORDER BY 2 DESC",
    "SELECT department, MEDIAN(cost), percentile_cont(0.9) WITHIN GROUP (ORDER BY cost) FROM visits "
    "WHERE duration >= 15 GROUP BY department",
    "SELECT COUNT(*), SUM(income) FROM patients WHERE 20 < age",
    "SELECT department, COUNT(*) FROM visits WHERE cost > 100 GROUP BY department ORDER BY 2 DESC LIMIT 3",
    # Window functions over the aggregates (a share of the total, a rank): lifted over the released rows.
    "SELECT department, COUNT(*) * 100.0 / SUM(COUNT(*)) OVER () AS pct FROM visits WHERE cost > 100 "
    "GROUP BY department ORDER BY pct DESC",
    "SELECT diagnosis, AVG(income), RANK() OVER (ORDER BY AVG(income) DESC) FROM patients WHERE age >= 30 "
    "GROUP BY diagnosis LIMIT 2",
]


# Dashboard-style statements: a row filter comparing columns with integers (slots), among
# constants that must stay in the key: IN lists, arithmetic, casts, decimals, text, group keys,
# HAVING, LIMIT, ORDER BY positions.
_TABLES = {
    "patients": (["age", "income", "score", "patient_id"], ["diagnosis", "zip", "smoker", "age"]),
    "visits": (["duration", "cost", "temperature", "visit_id", "patient_id"], ["department", "duration"]),
    "survey": (["rating"], ["answer", "rating"]),
}
_AGGREGATES = ["COUNT(*)", "SUM({n})", "AVG({n})", "COUNT({n})", "MIN({n})", "MAX({n})", "MEDIAN({n})"]


def _predicate(rng: random.Random, numbers: list[str], params: list[object]) -> str:
    column = rng.choice(numbers)
    value = rng.choice([0, 1, 5, 7, 30, 120, 121, 300, 301, 2000, 500000, 2147483647, 999999999])
    n = str(value)
    if rng.random() < 0.25:  # sent as a parameter: an int, or a value of another kind
        params.append(rng.choice([value, value, Decimal(value), float(value), str(value)]))
        n = f"${len(params)}"
    shape = rng.randrange(12)
    if shape == 0:
        return f"{column} BETWEEN {n} AND {rng.randrange(1000)}"
    if shape == 1:
        return f"{n} {rng.choice(['<', '<=', '=', '<>'])} {column}"
    if shape == 2:
        return f"{column} IN ({n}, {rng.randrange(100)})"
    if shape == 3:
        return f"{column} + {rng.randrange(1, 9)} > {n}"
    if shape == 4:
        return f"CAST({column} AS bigint) >= {n}"
    if shape == 5:
        return f"{column} > {value}.5"
    if shape == 6:
        return f"NOT ({column} = {n})"
    if shape == 7:
        return f"{column} >= -{n}"
    if shape == 8:
        return f"({column} < {n} OR {column} IS NULL)"
    return f"{column} {rng.choice(['>', '>=', '<', '<=', '=', '<>', '!='])} {n}"


def _dashboard(rng: random.Random) -> tuple[str, list[object]]:
    table = rng.choice(list(_TABLES))
    numbers, keys = _TABLES[table]
    key = rng.choice([*keys, None])
    aggregates = [rng.choice(_AGGREGATES).format(n=rng.choice(numbers)) for _ in range(rng.randrange(1, 3))]
    connective = rng.choice([" AND ", " OR ", " AND "])
    params: list[object] = []
    where = connective.join(_predicate(rng, numbers, params) for _ in range(rng.randrange(1, 4)))
    select = ", ".join([key] * (key is not None) + aggregates)
    sql = f"SELECT {select} FROM {table} WHERE {where}"
    if key is not None:
        sql += f" GROUP BY {key}"
        if rng.random() < 0.3:
            sql += f" HAVING COUNT(*) > {rng.randrange(50)}"
        if rng.random() < 0.3:
            sql += f" ORDER BY {rng.choice([1, 2])} DESC"
    if rng.random() < 0.3:
        sql += f" LIMIT {rng.choice([0, 1, 10, 1000])}"
    return sql, params


def _statements() -> list[tuple[str, list[object]]]:
    found = [(case[0], []) for case in test_bi_tools.GRAFANA + test_bi_tools.SUPERSET]
    found += [(case[0], []) for case in test_bi_tools.QUALIFIED_AS_UNQUALIFIED]
    found += [(sql, []) for sql in BI_STYLE]
    return found


def test_bi_tools_statements_get_the_cold_answer_whatever_was_asked_before() -> None:
    failures = [f for sql, params in _statements() for f in cache_failures(sql, params, POLICY)]
    assert not failures, "\n".join(failures[:20])


def test_dashboard_statements_get_the_cold_answer_whatever_was_asked_before() -> None:
    rng = random.Random(11)
    failures = []
    for _ in range(60):  # the language tests certify the caches on thousands more
        sql, params = _dashboard(rng)
        failures += cache_failures(sql, params, POLICY)
    assert not failures, "\n".join(failures[:20])


# The breach the shape cache let through (issue 18): a sentinel numeral of the old cache written in
# arithmetic elsewhere in the WHERE and used as the slot's value while the shape was learned; every
# later hit wrote its slot value into the arithmetic too, and the SQL that ran overflowed only when
# the victim's row reached it.
BREACH = (
    "SELECT COUNT(*) FROM patients WHERE age <> {} AND "
    "age < (CASE WHEN zip = '{}' AND age = {} THEN 16 ELSE 0 END) * 738291000 * 738291000 + 1000"
)


def test_the_breach_statements_get_the_cold_answer() -> None:
    texts = [BREACH.format(v, "12345", 37) for v in (1, 738291000, 738291000, 999999999)]
    warm = engine(POLICY)
    for text in texts:
        cached = warm.prepare(text, epsilon=1.0)
        cold = engine(POLICY).prepare(text, epsilon=1.0)
        assert isinstance(cached, Plan) and isinstance(cold, Plan)
        assert cached.statements == cold.statements, text
    # The arithmetic is the analysed one: its constant was never replaced.
    assert all(s.count("738291000") >= 2 for s in cached.statements)
    assert "999999999" in cached.statements[0]
    assert not cache_failures(texts[-1], [], POLICY)
    assert not cache_failures(BREACH.replace("age <> {}", "age <> $1").format("12345", 37), [1], POLICY)


DEMO_POLICY = Path(__file__).parent.parent / "policies" / "demo.yaml"


@pytest.fixture(params=["duckdb", "postgres"])
def demo_backend(request: pytest.FixtureRequest) -> str:
    if request.param == "duckdb":
        return str(request.getfixturevalue("demo_duckdb"))
    return request.getfixturevalue("demo_pg_dsn")


def test_the_breach_has_no_data_dependent_outcome_through_the_engine(
    demo_backend: str, demo_duckdb: Path, tmp_path: Path
) -> None:
    """On a real backend, with a victim whose row reaches the arithmetic: the learning sequence and
    the probe are answered (noisy counts, charged), never a backend failure; with a text
    parameter too."""
    with duckdb.connect(str(demo_duckdb), read_only=True) as conn:
        zip_code, age = conn.execute("SELECT zip, age FROM patients WHERE age IS NOT NULL LIMIT 1").fetchone()
    with Engine.open(DEMO_POLICY, demo_backend, tmp_path / "ledger.sqlite") as made:
        for value in (1, 738291000, 738291000, 999999999, 5):
            made.execute(BREACH.format(value, zip_code, age), analyst="alice", epsilon=0.1)
        parameterised = BREACH.replace("age <> {}", "age <> $1").format(zip_code, age)
        for value in (1, 738291000, 738291000, 999999999):
            made.execute(parameterised, [value], analyst="alice", epsilon=0.1)
        # Seven different statements charged; each repeat is the demo policy's free replay.
        assert made.budget("alice").spent.epsilon == pytest.approx(0.7)


def test_the_cache_key_is_the_exact_input() -> None:
    sql = "SELECT COUNT(*) FROM patients WHERE age > $1"
    keys = {cache_key(sql, [value], 0.5) for value in (1, True, 1.0, Decimal("1"), Decimal("1.0"), "1")}
    assert len(keys) == 6  # equal in Python, different constants in SQL
    assert cache_key(sql, [1], 0.5) == cache_key(sql, [1], 0.5)
    assert cache_key(sql, [1], 0.5) != cache_key(sql, [1], 0.25)
    assert cache_key(sql, [1], 0.5) != cache_key(sql + " ", [1], 0.5)


def test_the_cache_key_holds_the_session_time_zone() -> None:
    """A cast to timestamptz is folded in the session's time zone even where no clock is read: a
    statement analysed for one zone is not the plan of a session in another (an adversarial
    review found a Los Angeles session answered with Tokyo's midnight)."""
    private = (
        "SELECT COUNT(*) FROM visits WHERE checked_in >= CAST(CAST('2024-03-01' AS date) AS timestamptz)"
    )
    public = "SELECT CAST(CAST('2024-03-01' AS date) AS timestamptz) AS t, COUNT(*) FROM zip_info"
    made = engine(POLICY)
    seen: dict[tuple[str, str], tuple[str, ...]] = {}
    for zone in ("Asia/Tokyo", "America/Los_Angeles", "Asia/Tokyo", "UTC"):
        token = CLOCK.set(Clock(datetime(2026, 11, 30, 12, tzinfo=UTC), ZoneInfo(zone)))
        try:
            for sql in (private, public):
                warm, cold = made.prepare(sql, epsilon=1.0), engine(POLICY).prepare(sql, epsilon=1.0)
                texts = (warm.sql,) if isinstance(warm, PublicStatement) else warm.statements
                assert texts == ((cold.sql,) if isinstance(cold, PublicStatement) else cold.statements)
                assert seen.setdefault((zone, sql), texts) == texts
        finally:
            CLOCK.reset(token)
    for sql in (private, public):
        assert seen[("Asia/Tokyo", sql)] != seen[("America/Los_Angeles", sql)]


def test_a_parameter_equal_in_python_but_another_constant_is_analysed_cold() -> None:
    sql = "SELECT COUNT(*) FROM patients WHERE smoker = $1"
    made = engine(POLICY)
    assert isinstance(made.prepare(sql, [True], epsilon=1.0), Plan)
    for value in (1, 1.0):  # not booleans: refused cold, so refused warm
        with pytest.raises(Exception) as warm:
            made.prepare(sql, [value], epsilon=1.0)
        with pytest.raises(Exception) as cold:
            engine(POLICY).prepare(sql, [value], epsilon=1.0)
        assert str(warm.value) == str(cold.value)


def test_statements_whose_subqueries_were_answered_are_never_cached() -> None:
    made = engine(POLICY)
    private = "SELECT COUNT(*) FROM patients WHERE zip IN (SELECT zip FROM zip_info WHERE state = 'MA')"
    public = "SELECT zip FROM zip_info WHERE state IN (SELECT state FROM zip_info WHERE zip = '02139')"
    for sql in (private, public):
        made.prepare(sql, epsilon=1.0)
        assert cache_key(sql, [], 1.0) not in made.caches.private
        assert cache_key(sql, [], 1.0) not in made.caches.public
    plain = "SELECT state FROM zip_info"
    assert isinstance(made.prepare(plain, epsilon=1.0), PublicStatement)
    assert cache_key(plain, [], 1.0) in made.caches.public


def test_the_caches_are_bounded() -> None:
    caches = PlanCaches(size=3)
    made = engine(POLICY)
    made.caches = caches
    for age in range(10):
        made.prepare(f"SELECT COUNT(*) FROM patients WHERE age > {age}", epsilon=1.0)
    assert len(caches.private) == 3
    assert cache_key("SELECT COUNT(*) FROM patients WHERE age > 9", [], 1.0) in caches.private
    assert cache_key("SELECT COUNT(*) FROM patients WHERE age > 0", [], 1.0) not in caches.private


def test_a_repeated_statement_keeps_its_plan_and_salt() -> None:
    made = Engine(POLICY, None)
    sql = "SELECT diagnosis, COUNT(*) FROM patients GROUP BY diagnosis"
    first = made.prepare(sql, epsilon=1.0)
    assert made.prepare(sql, epsilon=1.0) is first


def test_a_dashboard_changing_its_filter_gets_answers_for_its_own_constant(
    demo_backend: str, tmp_path: Path
) -> None:
    template = "SELECT sex, COUNT(*) AS n FROM patients WHERE age >= {} GROUP BY sex ORDER BY sex"
    with Engine.open(DEMO_POLICY, demo_backend, tmp_path / "ledger.sqlite") as made:
        everyone = made.execute(template.format(0), analyst="alice")
        made.execute(template.format(1), analyst="alice")
        nobody = made.execute(template.format(200), analyst="alice")  # above every age
        assert [c.name for c in nobody.columns] == ["sex", "n"]
        assert nobody.cost == everyone.cost
        assert sum(row[1] for row in everyone.rows) > 1000, everyone.rows
        assert all(abs(row[1]) < 100 for row in nobody.rows), nobody.rows


def test_public_statements_with_new_parameters_answer_through_the_engine(
    demo_backend: str, tmp_path: Path
) -> None:
    sql = "SELECT zip, state FROM zip_info WHERE zip = $1"
    with Engine.open(DEMO_POLICY, demo_backend, tmp_path / "ledger.sqlite") as made:
        everything = made.execute("SELECT zip, state FROM zip_info ORDER BY zip", analyst="alice").rows
        zips = [row[0] for row in everything[:3]]
        answers = [made.execute(sql, [z], analyst="alice").rows for z in zips]
        assert answers == [[row] for row in everything[:3]]
        assert made.execute(sql, ["no such zip'"], analyst="alice").rows == []
