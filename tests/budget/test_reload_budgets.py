"""Budgets follow a policy reload at once, for sessions still on the earlier policy too (README,
"Policy reload"): the data set's budget, the per-query cap and the analyst's refresh window are the
current policy's (or the lower of both), so no session connected before a reload spends what the
policy now in force would refuse, nor spends where that policy does not count it.

A session still on the earlier policy is its engine: `old`, once `new = old.with_policy(…)` is made
current (what `serve` does on SIGHUP)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from dpproxy.engine import Engine
from dpproxy.errors import BudgetExhausted, InvalidParameter
from dpproxy.policy import Refresh, parse_policy
from dpproxy.sql.bounds import SessionBounds

POLICY = Path(__file__).parents[2] / "policies" / "demo.yaml"
QUERY = "SELECT COUNT(*) FROM patients WHERE age > {}"


def _text(change: dict | None = None, **alice: object) -> str:
    policy = yaml.safe_load(POLICY.read_text())
    policy["defaults"]["replay"] = False  # every query charged
    policy["analysts"]["alice"].update(alice)
    policy.update(change or {})
    return yaml.safe_dump(policy, sort_keys=False)


@pytest.fixture
def engines(demo_duckdb: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    """(start, reload): an engine on the demo policy, and a function that reloads it with a policy
    text and returns the new engine, made current."""
    database = tmp_path / "demo.duckdb"
    shutil.copyfile(demo_duckdb, database)
    opened: list[Engine] = []

    def start(text: str) -> Engine:
        engine = Engine.open(parse_policy(text), str(database), tmp_path / "ledger.sqlite")
        opened.append(engine)
        return engine

    def reload(engine: Engine, text: str) -> Engine:
        new = engine.with_policy(parse_policy(text))
        new.make_current()
        return new

    yield start, reload
    opened[0].close()


def test_a_lowered_data_set_budget_holds_sessions_on_the_earlier_policy(engines) -> None:  # type: ignore[no-untyped-def]
    start, reload = engines
    old = start(_text({"budget": {"epsilon": 100.0, "delta": 1e-3}}))
    new = reload(old, _text({"budget": {"epsilon": 1.0, "delta": 1e-3}}))
    answered = 0
    with pytest.raises(BudgetExhausted):
        for i in range(5):
            old.execute(QUERY.format(i), analyst="alice")
            answered += 1
    assert answered == 2  # 2 × 0.5 of the data set's 1.0
    status = new.data_set_budget()
    assert status is not None and status.spent.epsilon == pytest.approx(1.0)
    assert old.data_set_budget() == status  # what the session is shown is the budget in force


def test_a_data_set_budget_added_by_a_reload_counts_sessions_on_the_earlier_policy(engines) -> None:  # type: ignore[no-untyped-def]
    start, reload = engines
    old = start(_text())
    new = reload(old, _text({"budget": {"epsilon": 1.0, "delta": 1e-3}}))
    old.execute(QUERY.format(0), analyst="alice")
    status = new.data_set_budget()
    assert status is not None and status.spent.epsilon == pytest.approx(0.5)


def test_a_lowered_per_query_cap_holds_sessions_on_the_earlier_policy(engines) -> None:  # type: ignore[no-untyped-def]
    start, reload = engines
    old = start(_text())
    defaults = yaml.safe_load(POLICY.read_text())["defaults"]
    lowered = _text({"defaults": {**defaults, "epsilon": 0.1, "max_epsilon": 0.2}})
    reload(old, lowered)
    with pytest.raises(InvalidParameter) as refused:
        old.execute(QUERY.format(0), analyst="alice", epsilon=1.0)
    assert "0.001 to 0.2" in refused.value.message
    answer = old.execute(QUERY.format(1), analyst="alice")  # its policy's default ε, 0.5, capped at 0.2
    assert answer.cost.epsilon == pytest.approx(0.2)


def test_an_analysts_own_cap_and_the_defaults_cap_meet_at_the_lower(engines) -> None:  # type: ignore[no-untyped-def]
    start, reload = engines
    old = start(_text(max_epsilon_per_query=0.3))  # alice's own cap, below the policy's 1.0
    reload(old, _text({"defaults": {**yaml.safe_load(POLICY.read_text())["defaults"], "max_epsilon": 0.8}}))
    with pytest.raises(InvalidParameter):
        old.execute(QUERY.format(0), analyst="alice", epsilon=0.5)
    assert old.analyst("alice").max_epsilon_per_query == pytest.approx(0.3)


def test_a_reloaded_refresh_window_is_where_sessions_on_the_earlier_policy_spend(engines) -> None:  # type: ignore[no-untyped-def]
    start, reload = engines
    old = start(_text(epsilon=2.0, refresh="daily"))
    new = reload(old, _text(epsilon=2.0, refresh="never"))
    assert old.analyst("alice").refresh is Refresh.NEVER
    for i in range(4):
        old.execute(QUERY.format(i), analyst="alice")
    assert new.budget("alice").spent.epsilon == pytest.approx(2.0)  # counted where the policy counts
    with pytest.raises(BudgetExhausted):
        new.execute(QUERY.format(9), analyst="alice")
    with pytest.raises(BudgetExhausted):
        old.execute(QUERY.format(9), analyst="alice")


def test_accuracy_first_never_goes_past_a_cap_below_the_earlier_policys_least_epsilon(engines) -> None:  # type: ignore[no-untyped-def]
    """The earlier policy's min_epsilon (0.01) above the cap now in force (0.005): the least ε that
    meets a target is the cap's at most (an adversarial review was charged 0.01)."""
    start, reload = engines
    defaults = yaml.safe_load(POLICY.read_text())["defaults"]
    old = start(_text({"defaults": {**defaults, "min_epsilon": 0.01}}))
    reload(old, _text(max_epsilon_per_query=0.005))
    answer = old.execute(QUERY.format(0), analyst="alice", bounds=SessionBounds(target_error=1e6))
    assert answer.cost.epsilon <= 0.005


def test_a_reload_while_a_statement_is_prepared_holds_at_its_charge(engines) -> None:  # type: ignore[no-untyped-def]
    """The analyst's limits are read when the statement is charged, not when it arrived: preparing
    it (public subqueries run on the backend first) may take seconds, and a reload in between that
    lowered the budget or removed the analyst must hold for it (an adversarial review answered three
    such queries, 3.0 against a budget lowered to 0.5)."""
    from dpproxy.errors import UnknownAnalyst
    from dpproxy.privacy import Cost

    start, reload = engines
    old = start(_text(epsilon=10.0))
    arrived = old.analyst("alice")  # what the statement read on arrival
    reload(old, _text(epsilon=0.4))
    with pytest.raises(BudgetExhausted):
        old.charge(arrived, Cost(0.5, 0.0), "SELECT …")
    without = yaml.safe_load(_text())
    del without["analysts"]["alice"]
    reload(old, yaml.safe_dump(without))
    with pytest.raises(UnknownAnalyst):
        old.charge(arrived, Cost(0.5, 0.0), "SELECT …")


def test_a_per_query_cap_lowered_while_a_statement_is_prepared_holds_at_its_charge(engines) -> None:  # type: ignore[no-untyped-def]
    """The per-query cap, like the budget, is the one in force at the charge: a statement planned at
    ε = 0.5 before a reload lowered the cap to 0.2 is refused (22023) and charges nothing."""
    from dpproxy.privacy import Cost

    start, reload = engines
    old = start(_text(epsilon=10.0))
    arrived = old.analyst("alice")
    assert old.policy.epsilon_limits(arrived)[1] >= 0.5
    reload(old, _text(epsilon=10.0, max_epsilon_per_query=0.2))
    with pytest.raises(InvalidParameter) as refused:
        old.charge(arrived, Cost(0.5, 0.0), "SELECT …")
    assert refused.value.sqlstate == "22023"
    assert "per-query cap in force now (ε = 0.2" in refused.value.message
    assert old.budget("alice").spent.epsilon == 0.0
    old.charge(arrived, Cost(0.2, 0.0), "SELECT …")  # at the cap: reserved
