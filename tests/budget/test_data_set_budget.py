"""Budgets a data owner governs (README, Policy reference: `budget`, `refresh`, `server.ledger`):
one budget for the whole data set that every analyst's queries spend together, refresh windows, the
ledger named in the policy, and operator resets in the audit log — on both stores, and through the
commands an operator types."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import dpproxy.budget.ledger as ledger_module
from dpproxy.budget import DATASET_BUDGET, Ledger, SharedBudget
from dpproxy.cli import main
from dpproxy.errors import BudgetExhausted, PolicyError
from dpproxy.policy import DATASET, Refresh, account_key, next_refresh, parse_policy
from dpproxy.privacy.accounting import Cost

POLICY = Path(__file__).parents[2] / "policies" / "demo.yaml"
OWN = Cost(10.0, 1e-5)
SHARED = SharedBudget(Cost(1.0, 1e-5))
HALF = Cost(0.5, 0.0)


# --- refresh windows: UTC calendar days, ISO weeks, months -------------------------------------------


def test_refresh_windows_are_utc_calendar_windows() -> None:
    sunday = datetime(2026, 11, 29, 23, 59, tzinfo=UTC)
    assert account_key("alice", Refresh.NEVER, sunday) == "alice"
    assert account_key("alice", Refresh.DAILY, sunday) == "alice@2026-11-29"
    assert account_key("alice", Refresh.WEEKLY, sunday) == "alice@2026-11-23"  # the Monday before
    assert account_key(DATASET, Refresh.MONTHLY, sunday) == "*@2026-11-01"
    assert next_refresh(Refresh.DAILY, sunday) == datetime(2026, 11, 30, tzinfo=UTC)
    assert next_refresh(Refresh.WEEKLY, sunday) == datetime(2026, 11, 30, tzinfo=UTC)
    assert next_refresh(Refresh.MONTHLY, datetime(2026, 12, 31, 12, tzinfo=UTC)) == datetime(
        2027, 1, 1, tzinfo=UTC
    )
    assert next_refresh(Refresh.NEVER, sunday) is None


# --- the policy ---------------------------------------------------------------------------------------


def _policy_text(**extra: object) -> str:
    policy = yaml.safe_load(POLICY.read_text())
    policy.update(extra)
    return yaml.safe_dump(policy, sort_keys=False)


def test_the_policy_reads_the_data_sets_budget_refreshes_and_ledger() -> None:
    text = _policy_text(
        budget={"epsilon": 20.0, "delta": 1.0e-5, "refresh": "monthly"}, server={"ledger": "l.db"}
    )
    text = text.replace("    epsilon: 2.0\n", "    epsilon: 2.0\n    refresh: daily\n")
    policy = parse_policy(text)
    assert policy.budget is not None and (policy.budget.epsilon, policy.budget.delta) == (20.0, 1.0e-5)
    assert policy.budget.refresh is Refresh.MONTHLY and policy.server.ledger == "l.db"
    assert policy.analyst("bob").refresh is Refresh.DAILY and policy.analyst("alice").refresh is Refresh.NEVER
    bad = _policy_text(budget={"epsilon": 0, "refresh": "hourly"}, server={"ledger": ""})
    with pytest.raises(PolicyError) as caught:
        parse_policy(bad)
    problems = str(caught.value)
    for expected in (
        "budget.epsilon: must be greater than 0",
        "budget.delta: missing",
        "budget.refresh: `hourly` is not a refresh; write one of never, daily, weekly, monthly",
        "server.ledger: is empty",
    ):
        assert expected in problems


# --- the ledger, on both stores ---------------------------------------------------------------------


def test_two_analysts_together_cannot_spend_more_than_the_data_set(ledger: Ledger) -> None:
    first = ledger.reserve("alice", HALF, OWN, shared=SHARED)
    assert first.shared_spent is not None and first.shared_spent.epsilon == 0.5
    ledger.commit(first)
    ledger.commit(ledger.reserve("bob", HALF, OWN, shared=SHARED))
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("alice", HALF, OWN, shared=SHARED)  # alice has 9.5 of her own left
    assert caught.value.sqlstate == "53400"
    assert str(caught.value).startswith(
        f"privacy budget exhausted for {DATASET_BUDGET}: this query costs ε=0.5"
    )
    # Nothing was written by the refusal; each analyst spent what they were granted.
    assert ledger.spent("alice").epsilon == 0.5 and ledger.spent(DATASET).epsilon == 1.0


def test_a_release_gives_back_to_both_budgets(ledger: Ledger) -> None:
    ledger.release(ledger.reserve("alice", HALF, OWN, shared=SHARED))
    assert ledger.spent("alice") == Cost.ZERO and ledger.spent(DATASET).epsilon == 0.0


def test_an_analysts_reset_keeps_the_data_sets_spending_and_is_audited(ledger: Ledger) -> None:
    ledger.commit(ledger.reserve("alice", HALF, OWN, shared=SHARED))
    assert ledger.reset("alice", by="operator-os-user") == 1
    assert ledger.spent("alice") == Cost.ZERO
    assert ledger.spent(DATASET).epsilon == 0.5  # a person's loss is not undone by forgetting who asked
    (reset, *_) = ledger.audit_entries()
    assert (reset.analyst, reset.kind, reset.status, reset.client) == (
        "alice",
        "operator",
        "ok",
        "operator operator-os-user",
    )
    assert reset.statement == "budget reset of analyst alice: 1 ledger entry removed"
    assert ledger.reset_data_set(by="owner").epsilon == 0.5
    assert ledger.spent(DATASET) == Cost.ZERO
    assert ledger.audit_entries()[0].statement == "budget reset of the data set's budget (all analysts)"


def test_a_reservation_released_after_a_data_set_reset_leaves_the_new_totals_alone(ledger: Ledger) -> None:
    """An operator resets the data set's budget while a query holds a reservation; the query then
    never reaches the data and is released. Its cost is no longer in the data set's totals: taken
    from them, it left them negative, and the budget of 1.0 granted 1.9 (an adversarial review)."""
    held = ledger.reserve("alice", Cost(0.9, 0.0), OWN, shared=SHARED)
    ledger.reset_data_set(by="owner")
    after = ledger.reserve("bob", Cost(0.3, 0.0), OWN, shared=SHARED)  # counted in the new totals
    ledger.release(held)
    assert ledger.spent(DATASET).epsilon == pytest.approx(0.3)
    assert ledger.spent("alice") == Cost.ZERO  # the analyst's own totals still give it back
    ledger.commit(after)
    granted = 0.3
    for _ in range(10):
        try:
            ledger.commit(ledger.reserve("bob", Cost(0.2, 0.0), OWN, shared=SHARED))
            granted += 0.2
        except BudgetExhausted:
            break
    assert granted <= 1.0 + 1e-9
    ledger.release(ledger.reserve("alice", Cost(0.05, 0.0), OWN, shared=SHARED))  # after: given back
    assert ledger.spent(DATASET).epsilon == pytest.approx(granted)


def test_a_release_racing_a_data_set_reset_waits_for_it(store, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The release reads the reset line under the data set's lock: read before the reset committed,
    it took its cost from the totals the reset was deleting, and the total went to -0.9 (PostgreSQL;
    an adversarial review granted 1.9 against 1.0). SQLite serialises both whole."""
    import threading
    import time

    first, second = store.open(), store.open()
    reservation = first.reserve("alice", Cost(0.9, 0.0), OWN, shared=SHARED)
    audited = ledger_module.Ledger._operator_record

    def slow(self, conn, analyst, what, by):  # type: ignore[no-untyped-def]
        if analyst == DATASET:
            time.sleep(1.0)  # after the totals' DELETE and the new line, before the commit
        return audited(self, conn, analyst, what, by)

    monkeypatch.setattr(ledger_module.Ledger, "_operator_record", slow)
    reset = threading.Thread(target=lambda: second.reset_data_set(by="operator"))
    reset.start()
    time.sleep(0.3)
    first.release(reservation)
    reset.join()
    assert first.spent(DATASET) == Cost.ZERO
    first.commit(first.reserve("bob", Cost(0.6, 0.0), OWN, shared=SHARED))
    with pytest.raises(BudgetExhausted):
        first.reserve("bob", Cost(0.6, 0.0), OWN, shared=SHARED)


def test_a_refreshed_budget_counts_the_current_window_and_keeps_the_earlier_ones(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    yesterday = datetime(2026, 11, 27, 12, tzinfo=UTC)
    today = datetime(2026, 11, 28, 9, tzinfo=UTC)
    daily = SharedBudget(Cost(1.0, 1e-5), Refresh.DAILY)
    monkeypatch.setattr(ledger_module, "_now", lambda: yesterday)
    ledger.commit(
        ledger.reserve("alice", Cost(1.0, 0.0), Cost(1.0, 1e-5), refresh=Refresh.DAILY, shared=daily)
    )
    with pytest.raises(BudgetExhausted):
        ledger.reserve("alice", HALF, Cost(1.0, 1e-5), refresh=Refresh.DAILY, shared=daily)
    monkeypatch.setattr(ledger_module, "_now", lambda: today)
    assert ledger.spent_now("alice", Refresh.DAILY) == Cost.ZERO
    ledger.commit(ledger.reserve("alice", HALF, Cost(1.0, 1e-5), refresh=Refresh.DAILY, shared=daily))
    assert ledger.spent_now("alice", Refresh.DAILY).epsilon == 0.5
    assert ledger.spent("alice@2026-11-27").epsilon == 1.0  # the earlier window stays in the ledger
    assert ledger.spent_now(DATASET, Refresh.DAILY).epsilon == 0.5
    assert [e.epsilon for e in ledger.history("alice")] == [0.5, 1.0]
    ledger.reset("alice")
    assert ledger.spent("alice@2026-11-27") == Cost.ZERO  # a reset forgets every window


def test_a_changed_refresh_counts_what_the_new_window_already_spent(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Totals are kept per window key: a reload from daily to never (or back, or to weekly) read a
    key nothing had been added to, and let 2.0 be spent against 1.0 (an adversarial review). The new
    window's total is rebuilt from the entries once the refresh changes."""
    wednesday = datetime(2026, 11, 25, 12, tzinfo=UTC)
    thursday = datetime(2026, 11, 26, 9, tzinfo=UTC)
    limit = Cost(1.0, 1e-5)
    shared = SharedBudget(Cost(1.5, 1e-5), Refresh.DAILY)
    monkeypatch.setattr(ledger_module, "_now", lambda: wednesday)
    ledger.commit(ledger.reserve("alice", Cost(1.0, 0.0), limit, refresh=Refresh.DAILY, shared=shared))
    for refresh in (Refresh.NEVER, Refresh.DAILY, Refresh.MONTHLY, Refresh.NEVER):
        with pytest.raises(BudgetExhausted):
            ledger.reserve("alice", HALF, limit, refresh=refresh)
    monkeypatch.setattr(ledger_module, "_now", lambda: thursday)
    ledger.commit(ledger.reserve("alice", HALF, limit, refresh=Refresh.DAILY))  # a new day
    with pytest.raises(BudgetExhausted):
        ledger.reserve("alice", HALF, limit, refresh=Refresh.WEEKLY)  # 1.5 this week
    assert ledger.spent_now("alice", Refresh.WEEKLY).epsilon == 1.5
    # The data set's budget alike: 1.0 spent on Wednesday, counted once it never refreshes.
    never = SharedBudget(Cost(1.5, 1e-5), Refresh.NEVER)
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("bob", Cost(0.6, 0.0), limit, shared=never)
    assert DATASET_BUDGET in str(caught.value)


def test_a_data_set_window_rebuilt_after_an_analysts_reset_still_counts_what_they_spent(
    ledger: Ledger,
) -> None:
    """A reset forgets the analyst's own spending, not the data set's: their entries stay, under a
    name no analyst has, for a data-set window rebuilt when its refresh changes."""
    ledger.commit(
        ledger.reserve("alice", Cost(1.0, 0.0), OWN, shared=SharedBudget(Cost(1.5, 1e-5), Refresh.DAILY))
    )
    assert ledger.reset("alice") == 1 and ledger.analysts() == []
    with pytest.raises(BudgetExhausted):
        ledger.reserve("bob", Cost(0.6, 0.0), OWN, shared=SharedBudget(Cost(1.5, 1e-5), Refresh.NEVER))
    assert ledger.spent("alice") == Cost.ZERO and ledger.history("alice") == []


def test_a_clock_stepped_back_does_not_open_a_window_already_spent(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An NTP step, a VM restored from a snapshot, or a host with a slower clock on a shared ledger:
    a reservation is never charged to a window earlier than the newest entry's."""
    today = datetime(2026, 11, 28, 9, tzinfo=UTC)
    monkeypatch.setattr(ledger_module, "_now", lambda: today)
    ledger.commit(ledger.reserve("alice", Cost(1.0, 0.0), Cost(1.0, 1e-5), refresh=Refresh.DAILY))
    monkeypatch.setattr(ledger_module, "_now", lambda: datetime(2026, 11, 27, 8, tzinfo=UTC))
    with caplog.at_level("WARNING", logger="dpproxy.budget"), pytest.raises(BudgetExhausted):
        ledger.reserve("alice", HALF, Cost(1.0, 1e-5), refresh=Refresh.DAILY)
    assert "ahead of this host's clock" in caplog.text


# --- the commands: the ledger the policy names --------------------------------------------------------


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def governed(demo_duckdb: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The demo policy with a data-set budget, bob's budget refreshed daily, and the ledger named in
    the policy (relative to it); a copy of the demo data."""
    text = _policy_text(budget={"epsilon": 1.0, "delta": 1.0e-5}, server={"ledger": "state/ledger.sqlite"})
    text = text.replace("    epsilon: 2.0\n", "    epsilon: 2.0\n    refresh: daily\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    data = tmp_path / "demo.duckdb"
    shutil.copy(demo_duckdb, data)
    return policy, data


def test_commands_use_the_ledger_the_policy_names(governed: tuple[Path, Path], tmp_path: Path) -> None:
    policy, data = governed
    ledger = tmp_path / "state" / "ledger.sqlite"
    code, out, _ = run("policy", "check", str(policy))
    assert code == 0, out
    # Reading budgets never creates a ledger: the error names the path the policy gave.
    code, _, err = run("budget", "show", "--policy", str(policy))
    assert code == 1 and f"no privacy ledger at {ledger}" in err and not ledger.exists()
    code, _, err = run("audit", "--policy", str(policy))
    assert code == 1 and f"no privacy ledger at {ledger}" in err and not ledger.exists()
    # What spends budget creates it (the server, or a query from the command line).
    for analyst, age in (("alice", 30), ("bob", 40)):
        code, out, _ = run(
            "query", "--policy", str(policy), "--backend", str(data), "--analyst", analyst,
            f"SELECT COUNT(*) FROM patients WHERE age > {age}",
        )  # fmt: skip
        assert code == 0 and "the data set's budget (all analysts): ε remaining" in out
    code, _, err = run(
        "query", "--policy", str(policy), "--backend", str(data), "--analyst", "alice",
        "SELECT COUNT(*) FROM patients WHERE age > 50",
    )  # fmt: skip
    assert code == 1 and f"ERROR 53400: privacy budget exhausted for {DATASET_BUDGET}" in err
    code, out, _ = run("budget", "show", "--policy", str(policy))
    assert code == 0
    rows = {
        line.split("|")[0].strip(): [c.strip() for c in line.split("|")] for line in out.splitlines()[2:5]
    }
    assert rows["alice"][1] == "0.5" and rows["bob"][1] == "0.5" and rows["* (data set)"][1] == "1"
    tomorrow = next_refresh(Refresh.DAILY, datetime.now(UTC))
    assert tomorrow is not None and rows["bob"][-1] == f"daily, next {tomorrow:%Y-%m-%d} 00:00 UTC"
    assert rows["alice"][-1] == "never"
    # A reset is an operator action in the audit log, with who did it.
    code, out, _ = run("budget", "reset", "--policy", str(policy), "bob", "--yes")
    assert code == 0 and "reset bob: 1 ledger entry removed" in out
    code, out, _ = run("audit", "--policy", str(policy), "--format", "json")
    assert code == 0
    (latest, *_) = __import__("json").loads(out)
    assert (latest["analyst"], latest["kind"]) == ("bob", "operator")
    assert latest["statement"] == "budget reset of analyst bob: 1 ledger entry removed"
    assert latest["client"].startswith("operator ")
    # The data set's budget is still spent: a reset of bob gives nothing back to it.
    code, _, err = run(
        "query", "--policy", str(policy), "--backend", str(data), "--analyst", "bob",
        "SELECT COUNT(*) FROM patients WHERE age > 60",
    )  # fmt: skip
    assert code == 1 and DATASET_BUDGET in err
    code, out, _ = run("budget", "reset", "--policy", str(policy), "--data-set", "--yes")
    assert code == 0 and "reset the data set's budget" in out


def test_under_zcdp_the_data_sets_budget_composes_rho_too(ledger: Ledger) -> None:
    shared = SharedBudget(Cost(1.0, 1e-5))
    ledger.commit(ledger.reserve("alice", Cost(0.5, 0.0, 0.015), OWN, accounting="zcdp", shared=shared))
    ledger.commit(ledger.reserve("bob", Cost(0.5, 0.0, 0.015), OWN, accounting="zcdp", shared=shared))
    assert ledger.spent(DATASET).rho == pytest.approx(0.03)
    with pytest.raises(BudgetExhausted) as caught:  # ρ = 0.045 is worth more than ε = 1 at δ = 1e-5
        ledger.reserve("alice", Cost(0.5, 0.0, 0.015), OWN, accounting="zcdp", shared=shared)
    assert str(caught.value).startswith(
        f"privacy budget exhausted for {DATASET_BUDGET}: this query costs ρ=0.01"
    )


def test_budget_show_reports_what_the_server_charged_to_the_ledger_the_policy_names(
    governed: tuple[Path, Path], tmp_path: Path
) -> None:
    """`dpproxy serve --policy P` without --ledger creates and charges the policy's ledger;
    `dpproxy budget show --policy P` reads the same one."""
    import os

    import psycopg

    from tests.wire.proxy import REPO, start_serve

    policy, data = governed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("DPPROXY_LEDGER", None)
    process, port = start_serve(["--policy", str(policy), "--backend", str(data), "--database", "demo"], env)
    try:
        dsn = f"host=127.0.0.1 port={port} dbname=demo user=alice password=alice-demo sslmode=disable"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT COUNT(*) FROM patients").fetchall()
            budget = conn.execute("SHOW dpproxy.budget").fetchall()
        assert [row[-1] for row in budget] == ["analyst", "data set"]
        assert float(budget[1][0]) == 0.5  # what alice spent, of the data set's 1.0
    finally:
        process.terminate()
        assert process.wait(timeout=60) == 0
    assert (tmp_path / "state" / "ledger.sqlite").exists()
    code, out, _ = run("budget", "show", "--policy", str(policy), "alice")
    assert code == 0 and out.splitlines()[2].split("|")[1].strip() == "0.5"
