"""The engine end to end, on the demo data, on embedded DuckDB and on a real PostgreSQL.

What an analyst would notice: result types as PostgreSQL gives them for the raw query, noisy values
close to the truth within the stated error, public keys always all present, private keys only
through partition selection, post-processing on released values, budget arithmetic, refusals,
persistence, concurrency, and backend failures that never leak the database's text.
"""

from __future__ import annotations

import shutil
import threading
import time
from decimal import Decimal
from pathlib import Path

import duckdb
import psycopg
import pytest

from dpproxy.backends import Cancellation, QueryCancelled, open_backend
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
        assert all(isinstance(v, Decimal) for v in (row[4], row[5], row[6]))
        assert 0 <= row[4] <= 120 and 0 <= row[6] <= 500000  # AVG clamped into the bounds
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
    # No value needs per-person sums and no group is selected by its units: one statement, and the
    # groups and histograms it measures are those of the same plan with a per-person COUNT beside.
    sql = (
        "SELECT department, MEDIAN(duration_minutes) FROM visits "
        "WHERE visit_date > DATE '2021-06-01' GROUP BY 1"
    )
    alone = engine.plan(sql, salt="s")
    beside = engine.plan(sql.replace(") FROM", "), COUNT(*) FROM"), salt="s")
    assert len(alone.statements) == 1 and len(beside.statements) == 2
    assert "no per-person sums statement" in engine.explain(sql).render()
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
    plan = engine.plan("SELECT department, MEDIAN(duration_minutes) FROM visits GROUP BY 1", salt="s")
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
    for name in ("selected_rows", "grid_values", "per_unit", "bounded_groups"):
        assert name in text
    assert "contribution clamped to what 5 row(s) can add" in text
    # AVG(cost): centred sum with sensitivity r·(U−L)/2 on the cent grid, and its count (r).
    assert "sensitivity 5000000 per group, ≤ 3 group(s) per unit" in text
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
