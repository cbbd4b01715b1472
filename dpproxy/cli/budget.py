"""`dpproxy budget show` and `dpproxy budget reset`: the analysts' privacy budgets in the ledger."""

from __future__ import annotations

import getpass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import click

from dpproxy.cli.common import _ledger_spec, _run, format_table, ledger_option, policy_option


@click.group()
def budget() -> None:
    """Show or reset analysts' privacy budgets."""


@budget.command("show")
@policy_option
@ledger_option
@click.argument("analysts", nargs=-1)
def budget_show(policy_path: Path, ledger: str | None, analysts: tuple[str, ...]) -> None:
    """Spent and remaining budget per analyst (all analysts of the policy by default), in each one's
    current refresh window, and the data set's budget (all analysts together) when the policy has one."""
    from dpproxy.engine import Engine
    from dpproxy.policy import DATASET, Refresh, next_refresh
    from dpproxy.results import BudgetStatus, budget_figure, remaining_figure, spent_figure

    spec = _ledger_spec(ledger, policy_path, create=False)

    def row(name: str, status: BudgetStatus, refresh: Refresh, zcdp: bool) -> tuple[object, ...]:
        left, limit = status.remaining, status.limit
        # Six significant digits: spent rounded up, left rounded down (results.budget_figure).
        cells: list[object] = [
            name,
            Decimal(spent_figure(status.epsilon_spent, limit.epsilon)),
            Decimal(remaining_figure(left.epsilon, limit.epsilon)),
            Decimal(budget_figure(limit.epsilon, up=False)),
            Decimal(spent_figure(status.spent.delta, limit.delta)),
            # As a decimal too, so that δ spent and δ budget are written alike (0.0000001, not 1e-07
            # beside 0.0000000812334).
            Decimal(budget_figure(limit.delta, up=False)),
        ]
        if zcdp:
            cells.append(Decimal(budget_figure(status.spent.rho, up=True)))
        upcoming = next_refresh(refresh, datetime.now(UTC))
        cells.append(str(refresh) if upcoming is None else f"{refresh}, next {upcoming:%Y-%m-%d %H:%M} UTC")
        return tuple(cells)

    def action() -> None:
        with Engine.open(policy_path, None, spec) as engine:
            names = list(analysts) or [a.name for a in engine.policy.analysts]
            zcdp = engine.policy.defaults.accounting == "zcdp"
            rows = [row(name, engine.budget(name), engine.analyst(name).refresh, zcdp) for name in names]
            shared, budget = engine.data_set_budget(), engine.policy.budget
            if shared is not None and budget is not None and not analysts:
                rows.append(row(f"{DATASET} (data set)", shared, budget.refresh, zcdp))
        headers = ["analyst", "ε spent", "ε left", "ε budget", "δ spent", "δ budget"]
        # Under zCDP the ledger composes ρ; ε spent is its conversion at the analyst's δ.
        click.echo(format_table([*headers, *(["ρ spent"] if zcdp else []), "refresh"], rows))

    _run(action)


@budget.command("reset")
@policy_option
@ledger_option
@click.argument("analyst", required=False)
@click.option(
    "--data-set",
    "data_set",
    is_flag=True,
    help="Reset the data set's budget (all analysts together) instead of one analyst's.",
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def budget_reset(
    policy_path: Path, ledger: str | None, analyst: str | None, data_set: bool, yes: bool
) -> None:
    """Forget an analyst's spending, or with --data-set the data set's (an operator decision: it
    resets their privacy loss accounting). Recorded in the audit log with the OS user who did it."""
    from dpproxy.engine import Engine

    if (analyst is None) == (not data_set):
        raise click.UsageError("name one ANALYST, or pass --data-set (not both)")
    spec = _ledger_spec(ledger, policy_path, create=False)
    who = _os_user()

    def action() -> None:
        with Engine.open(policy_path, None, spec) as engine:
            assert engine.ledger is not None
            if analyst is None:
                if engine.policy.budget is None:
                    raise click.UsageError(f"the policy {policy_path} has no data-set budget (`budget:`)")
                if not yes:
                    click.confirm("Reset the data set's privacy budget (all analysts together)?", abort=True)
                engine.ledger.reset_data_set(by=who)
                click.echo("reset the data set's budget")
                return
            engine.analyst(analyst)
            if not yes:
                click.confirm(f"Reset the privacy budget of {analyst!r}?", abort=True)
            removed = engine.ledger.reset(analyst, by=who)
        click.echo(f"reset {analyst}: {removed} ledger entr{'y' if removed == 1 else 'ies'} removed")

    _run(action)


def _os_user() -> str:
    """Who runs the command, for the audit log (the OS user; "unknown" when it has no name)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
