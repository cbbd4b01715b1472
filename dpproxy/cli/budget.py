"""`dpproxy budget show` and `dpproxy budget reset`: the analysts' privacy budgets in the ledger."""

from __future__ import annotations

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
    """Spent and remaining budget per analyst (all analysts of the policy by default)."""
    from dpproxy.engine import Engine
    from dpproxy.results import budget_figure, remaining_figure, spent_figure

    def action() -> None:
        with Engine.open(policy_path, None, _ledger_spec(ledger)) as engine:
            names = list(analysts) or [a.name for a in engine.policy.analysts]
            rows = []
            zcdp = engine.policy.defaults.accounting == "zcdp"
            for name in names:
                status = engine.budget(name)
                left = status.remaining
                limit = status.limit
                # Six significant digits: spent rounded up, left rounded down (results.budget_figure).
                row = [
                    name,
                    Decimal(spent_figure(status.epsilon_spent, limit.epsilon)),
                    Decimal(remaining_figure(left.epsilon, limit.epsilon)),
                    Decimal(budget_figure(limit.epsilon, up=False)),
                    Decimal(spent_figure(status.spent.delta, limit.delta)),
                    # As a decimal too, so that δ spent and δ budget are written alike (0.0000001,
                    # not 1e-07 beside 0.0000000812334).
                    Decimal(budget_figure(limit.delta, up=False)),
                ]
                if zcdp:
                    row.append(Decimal(budget_figure(status.spent.rho, up=True)))
                rows.append(tuple(row))
        headers = ["analyst", "ε spent", "ε left", "ε budget", "δ spent", "δ budget"]
        # Under zCDP the ledger composes ρ; ε spent is its conversion at the analyst's δ.
        click.echo(format_table(headers + (["ρ spent"] if zcdp else []), rows))

    _run(action)


@budget.command("reset")
@policy_option
@ledger_option
@click.argument("analyst")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def budget_reset(policy_path: Path, ledger: str | None, analyst: str, yes: bool) -> None:
    """Forget an analyst's spending (an operator decision: it resets their privacy loss accounting)."""
    from dpproxy.engine import Engine

    def action() -> None:
        with Engine.open(policy_path, None, _ledger_spec(ledger)) as engine:
            engine.analyst(analyst)
            if not yes:
                click.confirm(f"Reset the privacy budget of {analyst!r}?", abort=True)
            assert engine.ledger is not None
            removed = engine.ledger.reset(analyst)
        click.echo(f"reset {analyst}: {removed} ledger entr{'y' if removed == 1 else 'ies'} removed")

    _run(action)
