"""`dpproxy query` and `dpproxy explain`: one statement through the engine, from the command line."""

from __future__ import annotations

from pathlib import Path

import click

from dpproxy.cli.common import (
    BACKEND_ENV,
    BACKEND_HELP,
    _ledger_spec,
    _run,
    format_table,
    ledger_option,
    parse_param,
    policy_option,
)


@click.command()
@policy_option
@click.option("--backend", required=True, envvar=BACKEND_ENV, help=BACKEND_HELP)
@click.option("--analyst", required=True, help="Analyst name from the policy (whose budget is charged).")
@click.option("--epsilon", type=float, default=None, help="Per-query ε, within the policy's limits.")
@click.option("--param", "params", multiple=True, help="Value for $1, $2, … (repeat in order).")
@ledger_option
@click.argument("sql")
def query(
    policy_path: Path,
    backend: str,
    analyst: str,
    epsilon: float | None,
    params: tuple[str, ...],
    ledger: str | None,
    sql: str,
) -> None:
    """Run SQL and print its differentially private answer, its cost and the budget left."""
    from dpproxy.engine import Engine

    def action() -> None:
        with Engine.open(policy_path, backend, _ledger_spec(ledger, policy_path)) as engine:
            result = engine.execute(sql, [parse_param(p) for p in params], analyst=analyst, epsilon=epsilon)
        click.echo(format_table([c.name for c in result.columns], result.rows))
        if result.notice:
            click.echo(result.notice)

    _run(action)


@click.command()
@policy_option
@click.option(
    "--backend",
    default=None,
    envvar=BACKEND_ENV,
    help="Optional: check the policy against it and emit its dialect (PostgreSQL, DuckDB or sc://… Spark).",
)
@click.option(
    "--dialect",
    type=click.Choice(["postgres", "duckdb", "spark"]),
    default=None,
    help="SQL dialect to show when no backend is given [default: postgres].",
)
@click.option("--epsilon", type=float, default=None, help="Per-query ε to plan with.")
@click.option("--param", "params", multiple=True, help="Value for $1, $2, … (repeat in order).")
@click.argument("sql")
def explain(
    policy_path: Path,
    backend: str | None,
    dialect: str | None,
    epsilon: float | None,
    params: tuple[str, ...],
    sql: str,
) -> None:
    """Show each rewrite pass's SQL, every released value's sensitivity, noise and cost.

    Touches neither data nor budget.
    """
    from dpproxy.engine import Engine
    from dpproxy.policy import load_policy

    def action() -> None:
        engine = Engine.open(load_policy(policy_path), backend, None)
        if dialect:
            engine.dialect = dialect
        with engine:
            click.echo(engine.explain(sql, [parse_param(p) for p in params], epsilon=epsilon).render())

    _run(action)
