"""The console's pages over HTTP: budgets from the ledger, the policy without credentials, the
planner's ± from a plan alone, and the audit log's filters."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dpproxy.budget import SharedBudget, open_ledger
from dpproxy.policy import Refresh, load_policy, parse_policy
from dpproxy.privacy.accounting import Cost
from tests.console.consoles import Client, served

POLICY = Path(__file__).resolve().parent.parent.parent / "policies" / "demo.yaml"


@pytest.fixture(scope="module")
def client():
    policy = load_policy(POLICY)
    with open_ledger(":memory:") as ledger:
        for epsilon in (0.5, 0.25, 1.0):
            ledger.commit(ledger.reserve("alice", Cost(epsilon, 0.0), Cost(10.0, 1e-5), statement="SELECT 1"))
        ledger.release(ledger.reserve("alice", Cost(2.0, 0.0), Cost(10.0, 1e-5), statement="SELECT 2"))
        with served(policy, ledger) as running:
            logged_in = Client(running.url)
            assert logged_in.login().status == 303
            yield logged_in


def test_budgets_show_spent_and_remaining_and_a_chart_of_each_charge(client):
    page = client.request("/budgets").body
    alice = page[page.index('id="budget-alice"') : page.index('id="budget-bob"')]
    assert '<dd class="spent">1.75</dd>' in alice and '<dd class="remaining">8.25</dd>' in alice
    assert "<dt>charges drawn</dt><dd>3</dd>" in alice  # the released reservation is not spending
    points = re.search(r'<polyline class="spent" points="([^"]+)"', alice)[1].split()
    heights = [float(p.split(",")[1]) for p in points]
    assert heights == sorted(heights, reverse=True) and len(set(heights)) == 4  # 0, 0.5, 0.75, 1.75
    bob = page[page.index('id="budget-bob"') :]
    assert '<dd class="spent">0</dd>' in bob and '<dd class="remaining">2</dd>' in bob


def test_budgets_mark_resets_and_refreshes_and_show_the_data_sets_budget() -> None:
    """bob's budget refreshes daily, alice's was reset, and the data set has a budget of its own."""
    text = POLICY.read_text().replace("    epsilon: 2.0\n", "    epsilon: 2.0\n    refresh: daily\n")
    text = text.replace("analysts:\n", "budget: {epsilon: 20.0, delta: 1.0e-5}\n\nanalysts:\n", 1)
    policy = parse_policy(text)
    shared = SharedBudget(Cost(20.0, 1e-5))
    with open_ledger(":memory:") as ledger:
        ledger.commit(ledger.reserve("alice", Cost(1.0, 0.0), Cost(10.0, 1e-5), shared=shared))
        ledger.reset("alice", by="operator")
        ledger.commit(ledger.reserve("alice", Cost(0.5, 0.0), Cost(10.0, 1e-5), shared=shared))
        ledger.commit(
            ledger.reserve("bob", Cost(0.25, 0.0), Cost(2.0, 1e-6), refresh=Refresh.DAILY, shared=shared)
        )
        with served(policy, ledger) as running:
            client = Client(running.url)
            assert client.login().status == 303
            page = client.request("/budgets").body
    alice = page[page.index('id="budget-alice"') : page.index('id="budget-bob"')]
    assert '<dd class="spent">0.5</dd>' in alice and re.search(r'<text class="mark"[^>]*>reset</text>', alice)
    bob = page[page.index('id="budget-bob"') : page.index('id="budget-data-set"')]
    assert '<dd class="spent">0.25</dd>' in bob and re.search(
        r'<text class="mark"[^>]*>daily refresh</text>', bob
    )
    shared_part = page[page.index('id="budget-data-set"') :]
    assert "the data set&#39;s budget" in shared_part or "the data set's budget" in shared_part
    assert '<dd class="spent">1.75</dd>' in shared_part  # alice's reset gives the data set nothing back


def test_the_policy_page_shows_bounds_and_limits_never_a_verifier(client):
    page = client.request("/policy").body
    for shown in ("patient_id", "0 … 500000", "healthy, flu, cold", "at most 5 row(s) per unit", "zip_info"):
        assert shown in page
    assert "SCRAM-SHA-256$" not in page and "md5" not in page.replace("SCRAM, md5", "")
    for verifier in re.findall(r'"(SCRAM-SHA-256\$[^"]+)"', POLICY.read_text()):
        for part in re.split(r"[$:]", verifier)[2:]:
            assert part not in page


def test_the_planner_reports_the_proxys_error_bars_without_data(client):
    def plan(**query: str) -> dict:
        path = "/planner.json?" + "&".join(f"{k}={v}" for k, v in query.items())
        return json.loads(client.request(path).body)

    count = plan(table="patients", column="*", aggregate="COUNT", epsilon="0.1")
    # The noise's 30 (3 at ε = 1) and half a unit for rounding back from the fine grid, rounded up.
    assert count["sql"] == 'SELECT COUNT(*) FROM "patients"' and count["error"] == 31.0
    assert plan(table="patients", column="*", aggregate="COUNT", epsilon="1")["error"] == 4.0
    total = plan(table="visits", column="cost", aggregate="SUM", epsilon="1")
    # At the ceiling (the demo's limits are ceilings; a query's chosen k is at most 5), with a sixth
    # of ε spent on choosing k (privacy/bounds.value_parts).
    assert total["error_text"] == "±3.595e+05" and total["cost_epsilon"] == pytest.approx(1.0)
    small, large = (
        plan(table="patients", column="age", aggregate="AVG", epsilon="0.5", rows=rows)["error"]
        for rows in ("100", "10000")
    )
    assert small > large > 0
    refused = plan(table="patients", column="zip", aggregate="SUM", epsilon="0.5")
    assert refused["problem"].startswith("42883:") and refused["error"] is None
    outside = plan(table="patients", column="age", aggregate="AVG", epsilon="5")
    assert outside["problem"].startswith("22023: per-query epsilon 5 is outside the range")
    page = client.request("/planner?table=visits&column=cost&aggregate=SUM&epsilon=1").body
    assert "±3.595e+05" in page and 'value="cost" selected' in page


def test_the_audit_page_checks_its_filters(client):
    page = client.request("/audit?since=yesterday").body
    assert "Write since and until as dates" in page
    page = client.request("/audit?status=bogus").body
    assert "Status is one of ok, refused, failed" in page
    page = client.request("/audit?analyst=alice&status=ok&since=2020-01-01").body
    # The fixture's charges were made through the ledger alone: each still has its record.
    assert 'value="alice" selected' in page and "SELECT 1" in page and "No statement matches." not in page
    page = client.request("/audit?analyst=bob&status=ok&since=2020-01-01").body
    assert 'value="bob" selected' in page and "No statement matches." in page
