"""Accuracy first (`SET dpproxy.target_error`): the analyst states the ± they need on each COUNT and
SUM, the engine spends the least ε that meets it at 95% within the per-query cap, or refuses saying
what it would cost; EXPLAIN shows the ε a target costs (dpproxy.engine.accuracy)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dpproxy.engine import Engine
from dpproxy.engine.accuracy import least_epsilon
from dpproxy.engine.plan import errors_at
from dpproxy.sql.bounds import SessionBounds
from tests.wire.proxy import Proxy, notices_of, running_proxy, write_policy

POLICY = Path(__file__).parent.parent / "policies" / "demo.yaml"
COUNT = "SELECT department, COUNT(*) FROM visits GROUP BY department"


@pytest.fixture(scope="module")
def engine(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    directory = tmp_path_factory.mktemp("accuracy")
    backend = directory / "demo.duckdb"
    shutil.copyfile(demo_duckdb, backend)
    with Engine.open(write_policy(directory / "policy.yaml"), str(backend), ":memory:") as opened:
        yield opened


def test_the_least_epsilon_meets_the_target_and_a_smaller_one_does_not(engine: Engine) -> None:
    plan = engine.plan(COUNT, epsilon=0.5)
    at_half = errors_at(plan, 0.5)[0]
    assert isinstance(at_half, float) and at_half > 0
    for target in (at_half, 2 * at_half, 0.8 * at_half):
        chosen = least_epsilon(plan, target, 0.001, 1.0)
        assert errors_at(plan, chosen)[0] <= target  # type: ignore[operator]
        # The least: 5% less would not do (the ± is shown rounded up to a whole count).
        assert errors_at(plan, chosen * 0.95)[0] > target  # type: ignore[operator]
    assert least_epsilon(plan, 2 * at_half, 0.001, 1.0) == pytest.approx(0.25, rel=0.03)  # ± ∝ 1/ε, rounded


def test_a_query_is_charged_the_least_epsilon_and_reports_a_plus_minus_within_the_target(
    engine: Engine,
) -> None:
    before = engine.budget("alice").spent.epsilon
    result = engine.execute(COUNT, analyst="alice", bounds=SessionBounds(target_error=400.0))
    (error,) = [c.error95 for c in result.columns if c.error95 is not None]
    assert error <= 400.0
    assert result.cost.epsilon < 0.5  # the session's ε would have given a ± the analyst did not need
    assert engine.budget("alice").spent.epsilon == pytest.approx(before + result.cost.epsilon)


def test_a_target_the_cap_cannot_meet_is_refused_with_its_cost_and_charges_nothing(engine: Engine) -> None:
    before = engine.budget("alice").spent.epsilon
    with pytest.raises(Exception) as caught:
        engine.execute(COUNT, analyst="alice", bounds=SessionBounds(target_error=1.0))
    assert getattr(caught.value, "sqlstate", None) == "22023"
    assert "dpproxy.target_error = 1 needs about ε = " in str(caught.value)
    assert "more than the per-query cap ε = 1" in str(caught.value)
    with pytest.raises(Exception) as caught:  # an average's ± depends on its group's count
        engine.execute(
            "SELECT AVG(duration_minutes) FROM visits",
            analyst="alice",
            bounds=SessionBounds(target_error=5.0),
        )
    assert getattr(caught.value, "sqlstate", None) == "0A000"
    assert engine.budget("alice").spent.epsilon == before


@pytest.fixture(scope="module")
def proxy(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    directory = tmp_path_factory.mktemp("accuracy-wire")
    backend = directory / "demo.duckdb"
    shutil.copyfile(demo_duckdb, backend)
    with running_proxy(
        write_policy(directory / "policy.yaml"), str(backend), directory / "ledger.sqlite"
    ) as running:
        yield running


def test_set_show_reset_and_explain_over_the_wire(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        notices = notices_of(conn)
        assert conn.execute("SHOW dpproxy.target_error").fetchone() == ("off",)
        conn.execute("SET dpproxy.target_error = 400")
        assert conn.execute("SHOW dpproxy.target_error").fetchone() == ("400",)
        explained = "\n".join(r[0] for r in conn.execute(f"EXPLAIN {COUNT}").fetchall())
        assert "accuracy: dpproxy.target_error = 400: the least ε that meets it is " in explained
        cost = float(explained.split("the least ε that meets it is ")[1].split()[0])
        spent = proxy.spent()
        conn.execute(COUNT).fetchall()
        assert proxy.spent() == pytest.approx(spent + cost)
        assert f"spent ε={cost:g}" in notices[-1]
        for bad in ("0", "-3", "wide", "nan"):
            with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
                conn.execute(f"SET dpproxy.target_error = '{bad}'")
            assert 'invalid value for parameter "dpproxy.target_error"' in str(caught.value)
        conn.execute("RESET dpproxy.target_error")
        assert conn.execute("SHOW dpproxy.target_error").fetchone() == ("off",)
        spent = proxy.spent()
        conn.execute(COUNT).fetchall()
        assert proxy.spent() == pytest.approx(spent + 0.5)  # the session's ε again
