"""The engine end to end, on the demo data, on embedded DuckDB and on a real PostgreSQL.

What an analyst would notice: result types as PostgreSQL gives them for the raw query, noisy values
close to the truth within the stated error, public keys always all present, private keys only
through partition selection, post-processing on released values, budget arithmetic, refusals,
persistence, concurrency, and backend failures that never leak the database's text.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from decimal import Decimal
from pathlib import Path

import duckdb
import psycopg
import pytest

from dpproxy.backends import (
    Backend,
    BackendUnreachable,
    Cancellation,
    LiveColumn,
    QueryCancelled,
    open_backend,
)
from dpproxy.budget.sqlite import SQLiteLedger
from dpproxy.engine import Engine
from dpproxy.errors import (
    BudgetExhausted,
    DPProxyError,
    InvalidParameter,
    PrivateQueryFailed,
    QueryCanceled,
    UnknownAnalyst,
)
from dpproxy.policy import load_policy, parse_policy
from dpproxy.sql.bounds import SessionBounds
from dpproxy.sql.types import PgType

POLICY = Path(__file__).parent.parent / "policies" / "demo.yaml"


@pytest.fixture(params=["duckdb", "postgres"])
def backend_dsn(request: pytest.FixtureRequest) -> str:
    if request.param == "duckdb":
        return str(request.getfixturevalue("demo_duckdb"))
    return request.getfixturevalue("demo_pg_dsn")


@pytest.fixture
def engine(backend_dsn: str, tmp_path: Path):
    with Engine.open(POLICY, backend_dsn, tmp_path / "ledger.sqlite") as e:
        yield e


@pytest.fixture(scope="session")
def truth_db(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the demo file for computing true answers (DuckDB will not open one file twice
    with different settings in one process, and the engine holds the original locked down)."""
    copy = tmp_path_factory.mktemp("truth") / "truth.duckdb"
    shutil.copy(demo_duckdb, copy)
    return copy


def truth(path: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(path), read_only=True) as conn:
        return conn.execute(sql).fetchall()


MINIMAL_POLICY = """
version: 1
analysts: {alice: {epsilon: 10, delta: 1.0e-5}}
tables:
  people:
    privacy_unit: id
    columns: {id: {type: integer}, age: {type: integer, lower: 0, upper: 120}}
"""


@pytest.fixture
def scratch_pg(pg_cluster):
    """A database of our own with a `people` table, that a test may break."""
    from tests.pgcluster import create_database, drop_database

    name = create_database(pg_cluster, prefix="scratch")
    dsn = pg_cluster.dsn(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE people (id integer, age integer)")
        conn.execute("INSERT INTO people SELECT i, i % 90 FROM generate_series(1, 500) i")
    yield dsn
    drop_database(pg_cluster, name)


def test_count_is_close_to_the_truth_and_reports_its_cost(engine: Engine, truth_db: Path) -> None:
    result = engine.execute("SELECT COUNT(*) FROM patients", analyst="alice", epsilon=1.0)
    [(true_count,)] = truth(truth_db, "SELECT COUNT(*) FROM patients")
    [(noisy,)] = result.rows
    column = result.columns[0]
    assert (column.name, column.type) == ("count", PgType.INT8)
    assert isinstance(noisy, int)
    assert abs(noisy - true_count) <= 5 * column.error95
    assert result.cost.epsilon == pytest.approx(1.0, rel=1e-6) and result.cost.epsilon <= 1.0
    assert result.budget is not None
    assert result.budget.spent.epsilon == pytest.approx(1.0, rel=1e-6)
    notice = result.notice or ""
    assert "spent ε=1" in notice and "ε remaining 9 of 10" in notice and "count ±" in notice


def test_result_types_are_postgresql_types_of_the_raw_query(engine: Engine) -> None:
    result = engine.execute(
        "SELECT sex, COUNT(*), COUNT(income), SUM(age), AVG(age), SUM(income), AVG(income), "
        "COUNT(DISTINCT patient_id) FROM patients GROUP BY sex",
        analyst="alice",
    )
    assert [(c.name, c.type) for c in result.columns] == [
        ("sex", PgType.VARCHAR),
        ("count", PgType.INT8),
        ("count", PgType.INT8),
        ("sum", PgType.INT8),
        ("avg", PgType.NUMERIC),
        ("sum", PgType.NUMERIC),
        ("avg", PgType.NUMERIC),
        ("count", PgType.INT8),
    ]
    for row in result.rows:
        assert isinstance(row[0], str)
        assert all(isinstance(v, int) for v in (row[1], row[2], row[3], row[7]))
        assert isinstance(row[5], Decimal)
        # An AVG whose noisy count is below 1 is NULL, as PostgreSQL's over no values: only the
        # few patients of sex X can get there; any other AVG is clamped into the column's bounds.
        averages = [(row[4], 120), (row[6], 500000)]
        assert all(v is None or (isinstance(v, Decimal) and 0 <= v <= upper) for v, upper in averages)
        assert row[0] == "X" or None not in (row[4], row[6])
        assert row[1] >= 0 and row[5] >= 0  # counts and sums of non-negative values never negative


def test_public_keys_are_all_released_even_when_no_row_matches(engine: Engine) -> None:
    result = engine.execute(
        "SELECT diagnosis, COUNT(*) FROM patients WHERE age > 500 GROUP BY diagnosis", analyst="alice"
    )
    assert sorted(r[0] for r in result.rows) == sorted(
        ["healthy", "flu", "cold", "asthma", "diabetes", "hypertension"]
    )
    assert result.cost.delta == 0  # no partition selection needed


def test_private_keys_only_through_partition_selection(engine: Engine, truth_db: Path) -> None:
    result = engine.execute("SELECT zip, COUNT(*) FROM patients GROUP BY zip", analyst="alice", epsilon=1.0)
    true_counts = dict(truth(truth_db, "SELECT zip, COUNT(*) FROM patients GROUP BY zip"))
    released = [r[0] for r in result.rows]
    assert set(released) <= set(true_counts)  # never a key that is not in the data
    assert len(released) < len(true_counts)  # rare zips are withheld
    assert result.cost.delta > 0  # selection spends delta


def test_the_k_largest_groups_are_the_first_k_by_their_released_values(engine: Engine) -> None:
    # `ORDER BY n DESC LIMIT k` is post-processing of the released groups: it spends nothing on
    # choosing them (the same noise as the whole answer: every share goes to the values and to
    # partition selection), and its rows are the largest noisy counts, each with the whole answer's ±.
    whole = "SELECT substr(zip, 1, 1) AS area, COUNT(*) AS n FROM patients GROUP BY 1"  # 9 areas
    top = whole + " ORDER BY n DESC LIMIT 3"
    assert engine.plan(top, epsilon=1.0).noise == engine.plan(whole, epsilon=1.0).noise
    result = engine.execute(top, analyst="alice", epsilon=1.0)
    counts = [n for _zip, n in result.rows]
    assert len(counts) == 3 and counts == sorted(counts, reverse=True)
    assert result.columns[1].error95 == engine.execute(whole, analyst="alice", epsilon=1.0).columns[1].error95


def test_post_processing_runs_on_released_values(engine: Engine) -> None:
    result = engine.execute(
        "SELECT department AS d, COUNT(*) AS n, COUNT(*) * 2 AS twice, ROUND(AVG(cost), 1) AS avg_cost "
        "FROM visits GROUP BY department HAVING COUNT(*) > 100 ORDER BY n DESC, d LIMIT 3 OFFSET 1",
        analyst="alice",
    )
    assert [c.name for c in result.columns] == ["d", "n", "twice", "avg_cost"]
    assert len(result.rows) <= 3
    counts = [r[1] for r in result.rows]
    assert counts == sorted(counts, reverse=True)
    for _, n, twice, avg_cost in result.rows:
        assert n > 100 and twice == 2 * n
        assert avg_cost == avg_cost.quantize(Decimal("0.1"))


def test_constant_and_public_queries_cost_nothing(engine: Engine) -> None:
    assert engine.execute("SELECT 1 + 1 AS two", analyst="alice").rows == [(2,)]
    result = engine.execute("SELECT zip, state FROM zip_info ORDER BY zip LIMIT 3", analyst="alice")
    assert len(result.rows) == 3 and result.cost.epsilon == 0 and not result.private
    assert engine.budget("alice").spent.epsilon == 0


def test_a_failing_public_query_says_nothing_was_charged(engine: Engine) -> None:
    """Not the private query's fixed text, which says its cost was charged: a query over public
    tables only spends no budget."""
    from dpproxy.errors import PublicQueryFailed

    with pytest.raises(PublicQueryFailed) as caught:
        engine.execute("SELECT CAST(city AS integer) FROM zip_info", analyst="alice")
    assert caught.value.sqlstate == "XX000" and "nothing was charged" in str(caught.value)
    assert engine.budget("alice").spent.epsilon == 0


def test_public_aggregates_are_named_as_postgresql_names_them(engine: Engine) -> None:
    sql = "SELECT state, COUNT(*), AVG(population), max(city), population / 2, 1 + 1 FROM zip_info GROUP BY 1, 5"
    result = engine.execute(sql, analyst="alice")
    assert [c.name for c in result.columns] == ["state", "count", "avg", "max", "?column?", "?column?"]
    assert [c.name for c in engine.execute("SELECT * FROM zip_info LIMIT 1", analyst="alice").columns] == [
        "zip", "city", "state", "population",
    ]  # fmt: skip


def test_per_query_epsilon_within_the_policy_limits(engine: Engine) -> None:
    assert engine.execute("SELECT COUNT(*) FROM patients", analyst="alice", epsilon=0.2).cost.epsilon <= 0.2
    with pytest.raises(InvalidParameter) as caught:
        engine.execute("SELECT COUNT(*) FROM patients", analyst="alice", epsilon=5)
    assert caught.value.sqlstate == "22023" and "0.001 to 1" in caught.value.message
    assert engine.budget("alice").spent.epsilon == pytest.approx(0.2, rel=1e-6)


def test_unknown_analyst(engine: Engine) -> None:
    with pytest.raises(UnknownAnalyst) as caught:
        engine.execute("SELECT COUNT(*) FROM patients", analyst="mallory")
    assert caught.value.sqlstate == "28000"


def test_budget_refusal_persists_across_restarts(backend_dsn: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    with Engine.open(POLICY, backend_dsn, ledger) as engine:
        for minutes in range(4):  # bob has ε = 2: four different queries at 0.5
            engine.execute(f"SELECT COUNT(*) FROM visits WHERE duration_minutes > {minutes}", analyst="bob")
        with pytest.raises(BudgetExhausted) as caught:
            engine.execute("SELECT COUNT(*) FROM visits WHERE duration_minutes > 10", analyst="bob")
        assert caught.value.sqlstate == "53400" and '"bob"' in caught.value.message
    with Engine.open(POLICY, backend_dsn, ledger) as engine:
        assert engine.budget("bob").spent.epsilon == pytest.approx(2.0, rel=1e-9)
        with pytest.raises(BudgetExhausted):
            engine.execute("SELECT COUNT(*) FROM visits", analyst="bob", epsilon=0.01)
        # Other analysts are unaffected.
        engine.execute("SELECT COUNT(*) FROM visits", analyst="alice")


def test_concurrent_queries_never_overspend(backend_dsn: str, tmp_path: Path) -> None:
    """24 threads, a budget for exactly 7 queries: exactly 7 answer, 17 are refused."""
    text = POLICY.read_text().replace("epsilon: 2.0", "epsilon: 3.5")
    policy = parse_policy(text, source=str(POLICY))
    assert policy.analyst("bob").epsilon == 3.5
    engine = Engine(policy, open_backend(backend_dsn), SQLiteLedger(tmp_path / "ledger.sqlite"))
    outcomes: list[str] = []
    barrier = threading.Barrier(24)

    def ask(i: int) -> None:
        barrier.wait()
        try:
            engine.execute(
                f"SELECT department, COUNT(*) FROM visits WHERE duration_minutes > {i} GROUP BY department",
                analyst="bob",
            )
            outcomes.append("ok")
        except BudgetExhausted:
            outcomes.append("refused")

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.close()
    assert outcomes.count("ok") == 7 and outcomes.count("refused") == 17


def test_backend_failure_gives_one_fixed_message_and_stays_charged(scratch_pg: str, tmp_path: Path) -> None:
    """A real failure (the table is dropped under the engine) never shows the database's own text."""
    backend = open_backend(scratch_pg)
    with Engine(parse_policy(MINIMAL_POLICY), backend, SQLiteLedger(tmp_path / "ledger.sqlite")) as engine:
        with psycopg.connect(scratch_pg, autocommit=True) as conn:
            conn.execute("DROP TABLE people")
        with pytest.raises(PrivateQueryFailed) as caught:
            engine.execute("SELECT AVG(age) FROM people", analyst="alice")
        assert caught.value.sqlstate == "XX000"
        assert str(caught.value) == PrivateQueryFailed.FIXED_MESSAGE
        assert "people" not in str(caught.value) and "exist" not in str(caught.value)
        # Whether a query fails may depend on data: its cost stays spent.
        assert engine.budget("alice").spent.epsilon == pytest.approx(0.5, rel=1e-6)


def test_unreachable_backend_charges_nothing(scratch_pg: str, pg_cluster, tmp_path: Path) -> None:
    # A short wait for a pooled connection: the pool's production default is 30 s.
    backend = open_backend(scratch_pg, acquire_timeout_s=1)
    with Engine(parse_policy(MINIMAL_POLICY), backend, SQLiteLedger(tmp_path / "ledger.sqlite")) as engine:
        with psycopg.connect(pg_cluster.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{scratch_pg.rsplit("/", 1)[1]}" WITH (FORCE)')
        with pytest.raises(DPProxyError) as caught:
            engine.execute("SELECT COUNT(*) FROM people", analyst="alice")
        assert caught.value.sqlstate == "08006"
        assert engine.budget("alice").spent.epsilon == 0


def test_same_released_structure_on_both_backends(
    demo_duckdb: Path, demo_pg_dsn: str, tmp_path: Path
) -> None:
    sql = "SELECT department, COUNT(*) n, SUM(duration_minutes), AVG(cost) FROM visits GROUP BY 1 ORDER BY 1"
    answers = []
    for i, dsn in enumerate((str(demo_duckdb), demo_pg_dsn)):
        with Engine.open(POLICY, dsn, tmp_path / f"ledger{i}.sqlite") as engine:
            answers.append(engine.execute(sql, analyst="alice"))
    duck, pg = answers
    assert [(c.name, c.type) for c in duck.columns] == [(c.name, c.type) for c in pg.columns]
    assert [r[0] for r in duck.rows] == [r[0] for r in pg.rows]
    assert [type(v) for v in duck.rows[0]] == [type(v) for v in pg.rows[0]]


def test_a_median_over_public_keys_runs_the_row_pipeline_alone(engine: Engine) -> None:
    # No value needs per-person sums, no group is selected by its units and the session sets k (no
    # count of persons per candidate is needed to choose it): one statement, and the groups and
    # histograms it measures are those of the same plan with a per-person COUNT beside.
    sql = (
        "SELECT department, MEDIAN(duration_minutes) FROM visits "
        "WHERE visit_date > DATE '2021-06-01' GROUP BY 1"
    )
    session = SessionBounds(rows=3)
    alone = engine.plan(sql, salt="s", bounds=session)
    beside = engine.plan(sql.replace(") FROM", "), COUNT(*) FROM"), salt="s", bounds=session)
    assert len(alone.statements) == 1 and len(beside.statements) == 2
    assert "no per-person sums statement" in engine.explain(sql, bounds=session).render()
    # Chosen per query, k needs the persons' counts per candidate: the per-person statement runs.
    assert len(engine.plan(sql, salt="s").statements) == 2
    measured = [plan.measure(*[engine.backend.run(s) for s in plan.statements]) for plan in (alone, beside)]
    by_key = [dict(zip(m.keys, m.histograms, strict=True)) for m in measured]
    assert len(by_key[0]) == 8 and by_key[0] == by_key[1]
    result = engine.execute(sql, analyst="alice")
    assert sorted(r[0] for r in result.rows) == sorted(k for (k,) in by_key[0])
    assert all(0 <= r[1] <= 600 for r in result.rows)


def test_without_a_main_statement_only_public_keys_are_released() -> None:
    # Groups then come from the row pipeline's rows: a key there that is not a declared value (it
    # cannot be, the rows are filtered, but were it) must never reach the answer.
    from dpproxy.release import choose_groups

    engine = Engine(load_policy(POLICY), None, dialect="duckdb")
    sql = "SELECT department, MEDIAN(duration_minutes) FROM visits GROUP BY 1"
    plan = engine.plan(sql, salt="s", bounds=SessionBounds(rows=3))
    assert not plan.query.needs_main_statement
    measured = plan.measure([("cardiology", 3, 7), ("a patient's secret", 4, 1)])
    released = choose_groups(plan.query, measured, plan.noise)
    declared = plan.query.keys[0].public_values
    assert [k for (k,) in released.keys] == list(declared)
    assert released.histograms[0][0][3] == 7 and all(sum(h[0]) == 0 for h in released.histograms[1:])


def test_explain_touches_neither_data_nor_budget(tmp_path: Path) -> None:
    engine = Engine(load_policy(POLICY), None)
    explanation = engine.explain(
        "SELECT department, AVG(cost) FROM visits WHERE duration_minutes > 30 GROUP BY department"
    )
    text = explanation.render()
    for name in ("selected_rows", "grid_values", "per_unit", "ranked_groups"):
        assert name in text
    # The demo's limits are ceilings: each query chooses k, a person's rows, below them.
    assert "its rows capped at 5 and its sums scaled by 5/n beyond that" in text
    assert "contribution bound k, a person's rows in the whole query: chosen among 1, 2, 4, 5" in text
    # AVG(cost) at the ceiling k = 5: centred sum with sensitivity k·(U−L)/2 on the cent grid, and
    # its count (k).
    assert "sensitivity 5000000 per group, ≤ 1 group(s) per unit" in text
    assert "sensitivity 5 per group" in text
    assert "every combination of their declared values is released" in text
    assert "cost: ε=0.5" in text


def test_parameters_are_bound_before_planning(engine: Engine) -> None:
    result = engine.execute(
        "SELECT COUNT(*) FROM patients WHERE age > $1 AND sex = $2", [200, "F"], analyst="alice"
    )
    assert result.rows[0][0] < 100  # nobody is older than 200 (ages are clipped to ≤ 120)


def test_a_cancelled_query_never_runs_and_costs_nothing(engine: Engine) -> None:
    cancel = Cancellation()
    cancel.cancel()
    with pytest.raises(QueryCanceled) as caught:
        engine.execute("SELECT COUNT(*) FROM patients", analyst="alice", cancel=cancel)
    assert caught.value.sqlstate == "57014" and "nothing was charged" in caught.value.message
    assert engine.budget("alice").spent.epsilon == 0


@pytest.mark.parametrize(
    ("kind", "slow_sql"),
    [
        ("duckdb", "SELECT COUNT(*) FROM range(100000000000) t(i) WHERE i % 7 = 3"),
        ("postgres", "SELECT pg_sleep(30)"),
    ],
)
def test_backend_query_is_interrupted_from_another_thread(kind: str, slow_sql: str, request) -> None:
    if kind == "duckdb":
        backend = open_backend(str(request.getfixturevalue("demo_duckdb")))
    else:
        backend = open_backend(request.getfixturevalue("demo_pg_dsn"))
    cancel = Cancellation()
    timer = threading.Timer(0.5, cancel.cancel)
    timer.start()
    started = time.monotonic()
    with pytest.raises(QueryCancelled) as caught:
        backend.run(slow_sql, cancel=cancel)
    assert caught.value.started
    assert time.monotonic() - started < 10
    # The connection is clean afterwards: the next query runs normally.
    assert backend.run("SELECT 1") == [(1,)]
    backend.close()


def test_describe_infers_parameter_and_result_types_without_running(tmp_path: Path) -> None:
    engine = Engine(load_policy(POLICY), None)
    description = engine.describe(
        "SELECT sex, COUNT(*), AVG(income) FROM patients WHERE age > $1 AND zip LIKE $2 "
        "AND enrolled < $3 GROUP BY sex LIMIT $4"
    )
    assert description.parameter_types == (PgType.INT4, PgType.TEXT, PgType.DATE, PgType.INT8)
    assert [(c.name, c.type) for c in description.columns] == [
        ("sex", PgType.VARCHAR),
        ("count", PgType.INT8),
        ("avg", PgType.NUMERIC),
    ]
    assert description.private
    # Types a client sends are kept.
    assert engine.describe("SELECT COUNT(*) FROM patients WHERE age > $1", [PgType.INT8]).parameter_types == (
        PgType.INT8,
    )


def test_unique_units_come_from_constraints_the_database_enforces(engine: Engine) -> None:
    # patients.patient_id is the primary key; visits has many rows per patient.
    assert "patient_id" in engine.unique_columns["patients"]
    assert "patient_id" not in engine.unique_columns.get("visits", ())
    patients = engine.plan("SELECT COUNT(*) FROM patients")
    visits = engine.plan("SELECT COUNT(*) FROM visits")
    assert patients.query.row_level and patients.sensitivities == (1,)
    assert not visits.query.row_level and visits.sensitivities == (5,)


def test_a_unit_column_without_a_constraint_is_bounded_per_unit(scratch_pg: str, tmp_path: Path) -> None:
    with Engine(parse_policy(MINIMAL_POLICY), open_backend(scratch_pg), None) as engine:
        assert "id" not in engine.unique_columns.get("people", ())
        assert "per_unit" in engine.plan("SELECT COUNT(*) FROM people").sql
    with psycopg.connect(scratch_pg, autocommit=True) as conn:
        conn.execute("ALTER TABLE people ADD PRIMARY KEY (id)")
    with Engine(parse_policy(MINIMAL_POLICY), open_backend(scratch_pg), None) as engine:
        assert engine.unique_columns["people"] == frozenset({"id"})
        assert "per_unit" not in engine.plan("SELECT COUNT(*) FROM people").sql


@pytest.mark.parametrize(
    ("sql", "types", "expected"),
    [
        # pgjdbc's setString on a date column sends a varchar parameter.
        ("SELECT COUNT(*) FROM visits WHERE visit_date >= $1", [PgType.VARCHAR], (PgType.VARCHAR,)),
        # SQLAlchemy Core writes LIMIT $1::INTEGER.
        ("SELECT sex, COUNT(*) FROM patients GROUP BY sex LIMIT $1::INTEGER", [], (PgType.INT4,)),
        # …and COUNT(DISTINCT (col)).
        ("SELECT COUNT(DISTINCT (patient_id)) FROM visits", [], ()),
    ],
)
def test_describe_accepts_what_drivers_send(sql: str, types: list, expected: tuple) -> None:
    engine = Engine(load_policy(POLICY), None)
    assert engine.describe(sql, types).parameter_types == expected


def test_limit_cast_and_parenthesised_distinct_execute(engine: Engine) -> None:
    result = engine.execute(
        "SELECT sex, COUNT(*) FROM patients GROUP BY sex LIMIT $1::INTEGER", ["2"], analyst="alice"
    )
    assert len(result.rows) == 2
    counted = engine.execute("SELECT COUNT(DISTINCT (patient_id)) FROM visits", analyst="alice")
    assert counted.columns[0].type is PgType.INT8


def test_a_repeated_question_is_answered_again_for_free(engine: Engine) -> None:
    """Free replay: same statement, parameters, ε and data: the stored answer, at no cost."""
    sql = "SELECT diagnosis, COUNT(*), AVG(income) FROM patients WHERE age > $1 GROUP BY diagnosis"
    first = engine.execute(sql, [30], analyst="alice")
    spent = engine.budget("alice").spent.epsilon
    again = engine.execute(sql, [30], analyst="alice")
    assert again.replayed and again.cost.epsilon == 0
    assert again.rows == first.rows and again.columns == first.columns
    assert "costs nothing" in (again.notice or "")
    assert engine.budget("alice").spent.epsilon == spent
    # Another parameter, another ε, another analyst: new questions, paid for.
    assert not engine.execute(sql, [31], analyst="alice").replayed
    assert not engine.execute(sql, [30], analyst="alice", epsilon=0.25).replayed
    assert not engine.execute(sql, [30], analyst="bob").replayed


def test_replay_can_be_switched_off(backend_dsn: str, tmp_path: Path) -> None:
    text = POLICY.read_text().replace("  mechanism: laplace", "  mechanism: laplace\n  replay: false")
    engine = Engine(
        parse_policy(text, source=str(POLICY)), open_backend(backend_dsn), SQLiteLedger(tmp_path / "l.sqlite")
    )
    with engine:
        for _ in range(2):
            assert not engine.execute("SELECT COUNT(*) FROM patients", analyst="alice").replayed
        assert engine.budget("alice").spent.epsilon == pytest.approx(1.0)


RR_POLICY = POLICY.read_text().replace(
    "    max_rows_per_unit: 5\n", "    max_rows_per_unit: 5\n    randomized_response: true\n"
)


def test_randomized_response_count_is_unbiased_within_its_bound(
    backend_dsn: str, truth_db: Path, tmp_path: Path
) -> None:
    """A table that opts in counts persons by the survey protocol: within the stated 95% bound."""
    engine = Engine(
        parse_policy(RR_POLICY, source=str(POLICY)),
        open_backend(backend_dsn),
        SQLiteLedger(tmp_path / "l.sqlite"),
    )
    with engine:
        sql = "SELECT COUNT(DISTINCT patient_id) FROM visits WHERE department = 'oncology'"
        [(true_count,)] = truth(truth_db, sql)
        plan = engine.plan(sql)
        assert plan.query.randomized_response and plan.responses is not None
        outside = 0
        for _ in range(20):
            released = engine.release(plan, [engine.backend.run(s) for s in plan.statements])
            [(estimate,)] = released.rows
            outside += abs(estimate - true_count) > released.columns[0].error95
        assert outside <= 4  # a 95% bound: 1 miss in 20 expected, 5 or more has probability < 2%
        result = engine.execute(sql, analyst="alice")
        assert result.cost.epsilon == pytest.approx(0.5) and result.cost.delta == 0
        assert "randomized response" in engine.explain(sql).render()
        # Other queries on the table use the usual mechanisms.
        assert not engine.plan("SELECT COUNT(*) FROM visits").query.randomized_response
        with pytest.raises(DPProxyError) as caught:
            engine.plan(
                "SELECT visit_date, COUNT(DISTINCT patient_id) FROM visits WHERE cost > 10 GROUP BY visit_date"
            )
        assert caught.value.sqlstate == "0A000" and "public GROUP BY keys" in caught.value.message


# --- queries BI tools send that are not plain aggregates (dpproxy.sql.probes, dpproxy.sql.series) ---


class _Recording(Backend):
    """A real backend that records every statement sent to it (and every other call), and can be
    tripped: then each call fails as an unreachable database would."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.dialect = inner.dialect
        self.default_schema = inner.default_schema
        self.sent: list[str] = []
        self.tripped = False

    def _check(self, what: str) -> None:
        self.sent.append(what)
        if self.tripped:
            raise BackendUnreachable("tripwire: the backend was called")

    def run(self, sql: str, *, cancel: Cancellation | None = None) -> list[tuple]:
        self._check(sql)
        return self.inner.run(sql, cancel=cancel)

    def unique_columns(self, schema: str | None = None) -> dict[str, set[str]]:
        self._check("unique_columns")
        return self.inner.unique_columns(schema)

    def tables(self, schema: str | None = None) -> dict[str, list[LiveColumn]]:
        self._check("tables")
        return self.inner.tables(schema)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def recorded(backend_dsn: str, tmp_path: Path):
    backend = _Recording(open_backend(backend_dsn))
    with Engine(load_policy(POLICY), backend, SQLiteLedger(tmp_path / "ledger.sqlite")) as e:
        backend.sent.clear()
        yield e, backend


# Tableau (`WHERE (1 = 0)`), Metabase (`WHERE 1 <> 1 LIMIT 0`, src/metabase/driver/sql_jdbc/sync/
# describe_database.clj), jupysql (`WHERE 1 = 0`), and the other spellings tools use.
PROBES = [
    ('SELECT * FROM "public"."visits" WHERE (1 = 0)', None),
    ('SELECT TRUE AS "_" FROM "public"."visits" WHERE 1 <> 1 LIMIT 0', [("_", PgType.BOOL)]),
    ("SELECT * FROM visits WHERE 1 = 0", None),
    ("SELECT * FROM visits WHERE false", None),
    ("SELECT * FROM visits LIMIT 0", None),
    ("SELECT * FROM (SELECT department, COUNT(*) AS n FROM visits GROUP BY department) AS v LIMIT 0", [
        ("department", PgType.VARCHAR), ("n", PgType.INT8)
    ]),
]  # fmt: skip
VISITS = [
    ("visit_id", PgType.INT8),
    ("patient_id", PgType.INT4),
    ("visit_date", PgType.DATE),
    ("department", PgType.VARCHAR),
    ("cost", PgType.NUMERIC),
    ("duration_minutes", PgType.INT4),
]


@pytest.mark.parametrize(("sql", "expected"), PROBES)
def test_a_zero_row_probe_has_its_columns_and_calls_no_backend_and_costs_nothing(
    recorded, sql: str, expected: list | None
) -> None:
    engine, backend = recorded
    backend.tripped = True
    result = engine.execute(sql, analyst="alice")
    assert [(c.name, c.type) for c in result.columns] == (expected or VISITS)
    assert result.rows == [] and result.cost.epsilon == 0 and not result.private
    assert [(c.name, c.type) for c in engine.describe(sql).columns] == (expected or VISITS)
    assert backend.sent == [] and engine.budget("alice").spent.epsilon == 0
    # SELECT * lists exactly the columns the shadow catalog shows for the table.
    if expected is None:
        [visits] = [t for t in engine.exposed_tables() if t.name == "visits"]
        assert list(visits.columns) == VISITS


def test_a_probe_of_a_table_that_is_not_exposed_is_refused(recorded) -> None:
    engine, backend = recorded
    with pytest.raises(DPProxyError) as caught:
        engine.execute('SELECT * FROM "public"."secrets" WHERE (1 = 0)', analyst="alice")
    assert caught.value.sqlstate == "42501" and backend.sent == []


def test_select_distinct_is_answered_and_charged_like_group_by(recorded) -> None:
    engine, _ = recorded
    # Superset's filter dropdown (superset/models/helpers.py, values_for_column).
    distinct = engine.execute(
        "SELECT DISTINCT diagnosis AS column_values FROM public.patients LIMIT 10000", analyst="alice"
    )
    grouped = engine.execute(
        "SELECT diagnosis AS column_values FROM public.patients GROUP BY diagnosis LIMIT 10000",
        analyst="alice",
    )
    # Public values: all of them, in key order, whether or not a row has them; nothing to noise.
    expected = [(v,) for v in sorted(["healthy", "flu", "cold", "asthma", "diabetes", "hypertension"])]
    assert distinct.rows == grouped.rows == expected
    assert [(c.name, c.type) for c in distinct.columns] == [("column_values", PgType.VARCHAR)]
    assert distinct.cost == grouped.cost
    # Keys without public values go through partition selection and are charged as GROUP BY is.
    before = engine.budget("alice").spent.epsilon
    zips = engine.execute("SELECT DISTINCT zip FROM patients", analyst="alice")
    charged = engine.budget("alice").spent.epsilon - before
    assert (
        zips.private
        and charged == pytest.approx(0.5)
        and zips.cost == engine.plan("SELECT zip FROM patients GROUP BY zip").cost
    )
    assert len(zips.rows) == len({r[0] for r in zips.rows})  # distinct keys


# Superset's series limit (superset/models/helpers.py, get_sqla_query: the inner metric is labelled
# `mme_inner__`, each inner key `<column>__`, the subquery `series_limit`).
SERIES = (
    "SELECT date_trunc('year', visit_date) AS __timestamp, department AS department, COUNT(*) AS count "
    "FROM public.visits JOIN (SELECT department AS department__, COUNT(*) AS mme_inner__ "
    "FROM public.visits GROUP BY department ORDER BY mme_inner__ DESC LIMIT 3) AS series_limit "
    "ON department = department__ GROUP BY date_trunc('year', visit_date), department "
    "ORDER BY count DESC LIMIT 10000"
)
SERIES_INNER = (
    "SELECT department AS department__, COUNT(*) AS mme_inner__ FROM public.visits GROUP BY department "
    "ORDER BY mme_inner__ DESC LIMIT 3"
)
SERIES_MAIN = (
    "SELECT date_trunc('year', visit_date) AS __timestamp, department AS department, COUNT(*) AS count "
    "FROM public.visits WHERE department IN ('cardiology') GROUP BY date_trunc('year', visit_date), "
    "department ORDER BY count DESC LIMIT 10000"
)


def test_series_limit_is_a_top_k_then_the_main_query_on_its_keys_both_charged(recorded) -> None:
    engine, backend = recorded
    top_k, main = engine.plan(SERIES_INNER), engine.plan(SERIES_MAIN)
    result = engine.execute(SERIES, analyst="alice")
    assert result.cost == top_k.cost + main.cost
    assert engine.budget("alice").spent.epsilon == pytest.approx(top_k.cost.epsilon + main.cost.epsilon)
    assert [(c.name, c.type) for c in result.columns] == [
        ("__timestamp", PgType.TIMESTAMP),
        ("department", PgType.VARCHAR),
        ("count", PgType.INT8),
    ]
    assert [(c.name, c.type) for c in engine.describe(SERIES).columns] == [
        (c.name, c.type) for c in result.columns
    ]
    # Two plans ran: the top-k's statements, then the main query's, which reads only the released
    # keys (at most 3 departments, inlined as constants); the answer's departments are among them.
    departments = ["cardiology", "dermatology", "emergency", "general", "neurology", "oncology",
                   "orthopedics", "pediatrics"]  # fmt: skip
    restricted = [s for s in backend.sent if "DATE_TRUNC" in s.upper()]
    assert len(restricted) == 1
    lists = {
        frozenset(re.findall(r"'([a-z]+)'", found)) for found in re.findall(r"IN \(([^)]*)\)", restricted[0])
    }
    # The restriction names the released keys, and the WHERE restricts the public values of
    # `department` to them (dpproxy.sql.public_keys): the rewrite keeps the rows of those alone.
    [released] = lists
    assert 1 <= len(released) <= 3 and released <= set(departments)
    assert result.rows and {row[1] for row in result.rows} <= released


def test_series_limit_reserves_both_costs_before_reading_anything(backend_dsn: str, tmp_path: Path) -> None:
    policy = load_policy(POLICY)
    backend = _Recording(open_backend(backend_dsn))
    with Engine(policy, backend, SQLiteLedger(tmp_path / "ledger.sqlite")) as engine:
        backend.sent.clear()
        one = engine.plan(SERIES_INNER).cost.epsilon
        # bob (2.0) spends all but 1.5 ε: one query (0.5) fits, the pair (1.0) … then only 0.75.
        engine.execute("SELECT COUNT(*) FROM patients", analyst="bob", epsilon=1.0)
        engine.execute("SELECT COUNT(*) FROM patients", analyst="bob", epsilon=0.25)
        left = 2.0 - engine.budget("bob").spent.epsilon
        assert one <= left < 2 * one
        backend.sent.clear()
        with pytest.raises(BudgetExhausted):
            engine.execute(SERIES, analyst="bob")
        assert backend.sent == [] and 2.0 - engine.budget("bob").spent.epsilon == pytest.approx(left)


def test_series_limit_keeps_both_queries_within_the_per_query_cap(backend_dsn: str, tmp_path: Path) -> None:
    """One statement, two private queries: their ε together is held to the analyst's per-query cap,
    refused before anything is read (an adversarial review had one statement spend twice the cap)."""
    text = (
        Path(POLICY)
        .read_text()
        .replace(
            "    epsilon: 2.0\n    delta: 1.0e-6\n",
            "    epsilon: 2.0\n    delta: 1.0e-6\n    max_epsilon_per_query: 0.5\n",
        )
    )
    assert "max_epsilon_per_query: 0.5" in text
    backend = _Recording(open_backend(backend_dsn))
    with Engine(parse_policy(text), backend, SQLiteLedger(tmp_path / "ledger.sqlite")) as engine:
        backend.sent.clear()
        with pytest.raises(InvalidParameter) as refused:
            engine.execute(SERIES, analyst="bob", epsilon=0.5)
        assert "ε = 1 in all, more than the per-query cap ε = 0.5" in refused.value.message
        assert "SET dpproxy.epsilon = 0.25" in (refused.value.hint or "")
        assert backend.sent == [] and engine.budget("bob").spent.epsilon == 0
        result = engine.execute(SERIES, analyst="bob", epsilon=0.25)
        assert result.cost.epsilon == pytest.approx(0.5)


def test_series_limit_over_public_keys_keeps_only_the_top_k(recorded) -> None:
    engine, _ = recorded
    # A bar chart with a series limit: the main query's keys are all public (zero-filled when
    # released); the join's answer has the released top-k departments only.
    result = engine.execute(
        "SELECT department AS department, SUM(cost) AS total FROM public.visits JOIN (SELECT department "
        "AS department__, SUM(cost) AS mme_inner__ FROM public.visits GROUP BY department ORDER BY "
        "SUM(cost) DESC LIMIT 2) AS series_limit ON department = department__ GROUP BY department "
        "ORDER BY total DESC LIMIT 10000",
        analyst="alice",
    )
    assert len(result.rows) == 2 and len({row[0] for row in result.rows}) == 2
