"""The figures of a 53400 refusal (budget exhausted) are written as the notices, SHOW dpproxy.budget
and `dpproxy budget show` write them — six significant digits, what a query costs or has spent
rounded up and what is left rounded down — and small δ limits (1e-5, 1e-7) and δ = 0 print as
what they are, never as 0 or 0.0."""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dpproxy.budget.composition import Totals, check_fits
from dpproxy.budget.sqlite import SQLiteLedger
from dpproxy.cli import main
from dpproxy.errors import BudgetExhausted
from dpproxy.privacy.accounting import Cost
from dpproxy.results import BudgetStatus, Result, budget_figure, remaining_figure, spent_figure

POLICY = Path(__file__).resolve().parents[2] / "dpproxy" / "data" / "demo.yaml"
SELECTION_DELTA = 8.123339390042617e-08
ZERO_POINT_ZERO = re.compile(
    r"δ=0\.0(?![0-9])"
)  # a small δ printed as 0.0  # what partition selection of the demo's zips charges


def refusal(spent: Cost, cost: Cost, limit: Cost, accounting: str = "pure") -> str:
    with pytest.raises(BudgetExhausted) as caught:
        check_fits("alice", Totals().plus(spent), cost, limit, accounting)
    assert caught.value.sqlstate == "53400"
    return caught.value.message


@pytest.mark.parametrize(
    ("delta", "shown", "left"),
    [
        (1e-5, "0.00001", "9.91876e-06"),  # what is left, 9.918766…e-06, rounded down
        (1e-7, "1e-07", "1.87666e-08"),
        (0.0, "0", "0"),
    ],
)
def test_a_pure_refusal_writes_small_delta_limits_as_they_are(delta: float, shown: str, left: str) -> None:
    spent = Cost(9.8, min(delta, SELECTION_DELTA))
    message = refusal(spent, Cost(0.5, SELECTION_DELTA), Cost(10.0, delta))
    assert message == (
        'privacy budget exhausted for analyst "alice": this query costs ε=0.5, δ=8.12334e-08 but only '
        f"ε=0.2, δ={left} remain of ε=10, δ={shown}"
    )
    assert not ZERO_POINT_ZERO.search(message) and "e-05" not in message


def test_the_figures_are_rounded_as_the_notices_round_them() -> None:
    # ε left is 0.1999999999999993 (10 - 9.8 in floats): 0.2 after the float rounding the ledger
    # forgives; δ left rounded down, the cost rounded up.
    message = refusal(Cost(9.8, 1e-6), Cost(0.5, 1.0000004e-7), Cost(10.0, 1e-5))
    assert message.endswith("costs ε=0.5, δ=1.00001e-07 but only ε=0.2, δ=9e-06 remain of ε=10, δ=0.00001")


@pytest.mark.parametrize(("delta", "shown"), [(1e-5, "0.00001"), (1e-7, "1e-07")])
def test_a_zcdp_refusal_writes_small_delta_limits_as_they_are(delta: float, shown: str) -> None:
    # All of δ spent: ρ cannot be converted.
    message = refusal(Cost(0.5, delta), Cost(0.0, 0.0, 1e-9), Cost(5.0, delta), "zcdp")
    assert message == (
        'privacy budget exhausted for analyst "alice": this query costs ρ=1e-09 but with it '
        f"δ={shown} of δ={shown} would be spent, and converting ρ to ε needs some δ left; spent so far: "
        f"ρ=0, δ={shown}, ε=0.5 in pure-DP queries, worth ε=0.5; remaining: ε=4.5, δ=0 of ε=5, δ={shown}"
    )
    # δ over the limit.
    message = refusal(Cost(0.0, 0.0), Cost(0.5, 2 * delta), Cost(5.0, delta), "zcdp")
    assert f"with it δ={budget_figure(2 * delta, up=True)} of δ={shown} would be spent" in message
    assert message.endswith(f"remaining: ε=5, δ={shown} of ε=5, δ={shown}") and not ZERO_POINT_ZERO.search(
        message
    )


def test_the_notice_and_show_write_delta_alike() -> None:
    limit = Cost(10.0, 1e-7)
    spent = Cost(0.5, SELECTION_DELTA)
    status = BudgetStatus("alice", spent, limit)
    notice = Result((), [], Cost(0.5, SELECTION_DELTA), budget=status, private=True).notice
    assert notice is not None
    assert "spent ε=0.5, δ=8.12334e-08; ε remaining 9.5 of 10 (δ remaining 1.87666e-08)" in notice
    # SHOW dpproxy.budget's row (dpproxy.wire.session.commands): the same figures.
    assert (
        spent_figure(spent.delta, limit.delta),
        remaining_figure(status.remaining.delta, limit.delta),
    ) == (
        "8.12334e-08",
        "1.87666e-08",
    )
    assert budget_figure(1e-5, up=True) == "0.00001" and budget_figure(0.0, up=False) == "0"


def test_budget_show_writes_delta_spent_and_budget_alike(tmp_path: Path) -> None:
    spec = yaml.safe_load(POLICY.read_text())
    spec["analysts"]["alice"]["delta"] = 1e-7
    spec["analysts"]["bob"]["delta"] = 0
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(spec))
    ledger = tmp_path / "ledger.sqlite"
    with SQLiteLedger(str(ledger)) as store:
        store.commit(store.reserve("alice", Cost(0.5, SELECTION_DELTA), Cost(10.0, 1e-7)))
    result = CliRunner().invoke(main, ["budget", "show", "--policy", str(policy), "--ledger", str(ledger)])
    assert result.exit_code == 0, result.output
    rows = {
        line.split("|")[0].strip(): [c.strip() for c in line.split("|")]
        for line in result.output.splitlines()
    }
    assert rows["alice"][4:6] == ["0.0000000812334", "0.0000001"]
    assert rows["bob"][4:6] == ["0", "0"]
    assert Decimal(rows["alice"][5]) == Decimal("1e-7")


def test_a_spent_total_just_below_a_round_figure_shows_the_round_figure() -> None:
    """0.5 + 0.1 + 0.1 + 0.1 is 0.7999999999999996: against a budget of 1000 the slack forgiven as
    float rounding (1e-6) reached the figure below, and SHOW dpproxy.budget said 0.799999 spent."""
    assert spent_figure(0.5 + 0.1 + 0.1 + 0.1, 1000.0) == "0.8"
    assert spent_figure(0.5000000000000003, 1.0) == "0.5"
