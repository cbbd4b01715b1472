"""The `dpproxy` command: click commands over the engine, the policy loader, the ledger and the demo.

Errors are rendered here, once: a DPProxyError becomes "ERROR <SQLSTATE>: message" (and its hint)
on stderr with exit status 1. Nothing here computes privacy: it only calls the engine.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import NoReturn

import click

from dpproxy import __version__
from dpproxy.errors import DPProxyError

DEFAULT_LEDGER_ENV = "DPPROXY_LEDGER"


def default_ledger_path() -> Path:
    """$DPPROXY_LEDGER, else $XDG_DATA_HOME/dpproxy/ledger.sqlite (~/.local/share/…)."""
    if os.environ.get(DEFAULT_LEDGER_ENV):
        return Path(os.environ[DEFAULT_LEDGER_ENV])
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "dpproxy" / "ledger.sqlite"


def fail(error: DPProxyError) -> NoReturn:
    click.echo(f"ERROR {error.sqlstate}: {error.message}", err=True)
    if error.hint:
        click.echo(f"HINT: {error.hint}", err=True)
    sys.exit(1)


def _run(action: Callable[[], None]) -> None:
    try:
        action()
    except DPProxyError as e:
        fail(e)


def parse_param(text: str) -> object:
    """--param values: an integer, else a decimal number, else text (write 'text:42' to force text)."""
    if text.startswith("text:"):
        return text.removeprefix("text:")
    if text.upper() == "NULL":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return Decimal(text)
    except InvalidOperation:
        return text


def format_table(names: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A psql-style aligned table."""
    from dpproxy.sql.postprocess import to_text

    cells = [["" if v is None else to_text(v) for v in row] for row in rows]
    numeric = [
        all(isinstance(r[i], (int, float, Decimal)) or r[i] is None for r in rows) for i in range(len(names))
    ]
    widths = [max([len(n)] + [len(c[i]) for c in cells]) for i, n in enumerate(names)]
    lines = [" | ".join(n.center(w) for n, w in zip(names, widths, strict=True)).rstrip()]
    lines.append("-+-".join("-" * w for w in widths))
    for row in cells:
        lines.append(
            " | ".join(
                (v.rjust(w) if numeric[i] else v.ljust(w))
                for i, (v, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
    lines.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(lines)


policy_option = click.option(
    "--policy",
    "policy_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Policy YAML file.",
)
ledger_option = click.option(
    "--ledger",
    default=None,
    help=f"Budget ledger: a SQLite file or a postgresql:// DSN [default: ${DEFAULT_LEDGER_ENV} or "
    "~/.local/share/dpproxy/ledger.sqlite].",
)


def _ledger_spec(ledger: str | None) -> str:
    return ledger or str(default_ledger_path())


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="dpproxy")
def main() -> None:
    """dpproxy: differentially private SQL over PostgreSQL or DuckDB.

    Analysts send ordinary SQL; dpproxy bounds each person's contribution, adds calibrated noise and
    charges the analyst's privacy budget. Start with `dpproxy demo --init DIR`, then try
    `dpproxy explain` and `dpproxy query`.
    """


@main.command()
@policy_option
@click.option("--backend", required=True, help="postgresql://… DSN, or a DuckDB file path.")
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
        with Engine.open(policy_path, backend, _ledger_spec(ledger)) as engine:
            result = engine.execute(sql, [parse_param(p) for p in params], analyst=analyst, epsilon=epsilon)
        click.echo(format_table([c.name for c in result.columns], result.rows))
        if result.notice:
            click.echo(result.notice)

    _run(action)


@main.command()
@policy_option
@click.option("--backend", default=None, help="Optional: check the policy against it and emit its dialect.")
@click.option(
    "--dialect",
    type=click.Choice(["postgres", "duckdb"]),
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


@main.group()
def budget() -> None:
    """Show or reset analysts' privacy budgets."""


@budget.command("show")
@policy_option
@ledger_option
@click.argument("analysts", nargs=-1)
def budget_show(policy_path: Path, ledger: str | None, analysts: tuple[str, ...]) -> None:
    """Spent and remaining budget per analyst (all analysts of the policy by default)."""
    from dpproxy.engine import Engine

    def action() -> None:
        with Engine.open(policy_path, None, _ledger_spec(ledger)) as engine:
            names = list(analysts) or [a.name for a in engine.policy.analysts]
            rows = []
            for name in names:
                status = engine.budget(name)
                left = status.remaining
                rows.append(
                    (
                        name,
                        status.spent.epsilon,
                        left.epsilon,
                        status.limit.epsilon,
                        status.spent.delta,
                        status.limit.delta,
                    )
                )
        click.echo(format_table(["analyst", "ε spent", "ε left", "ε budget", "δ spent", "δ budget"], rows))

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


@main.group()
def policy() -> None:
    """Check, draft and secure policy files."""


@policy.command("check")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--backend", default=None, help="Also check tables, columns and types against this database.")
def policy_check(file: Path, backend: str | None) -> None:
    """Validate a policy file (and, with --backend, against the live schema)."""
    from dpproxy.backends import open_backend
    from dpproxy.policy import check_against_schema, load_policy

    def action() -> None:
        loaded = load_policy(file)
        click.echo(f"{file}: OK ({len(loaded.tables)} table(s), {len(loaded.analysts)} analyst(s))")
        if backend:
            with open_backend(backend) as db:
                live = {}
                for schema in {t.schema for t in loaded.tables}:
                    tables = db.tables(schema)
                    live.update(
                        {
                            t.name: tables[t.name]
                            for t in loaded.tables
                            if t.schema == schema and t.name in tables
                        }
                    )
            problems = check_against_schema(loaded, live)
            if problems:
                for p in problems:
                    click.echo(f"  - {p}", err=True)
                raise SystemExit(1)
            click.echo(f"{file}: matches the schema of {backend}")

    _run(action)


@policy.command("passwd")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
def policy_passwd(password_stdin: bool) -> None:
    """Print a SCRAM-SHA-256 verifier to paste as an analyst's password."""
    from dpproxy.scram import make_verifier

    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise click.UsageError("the password must not be empty")
    click.echo(make_verifier(password))


@policy.command("init")
@click.option("--backend", required=True, help="Database to read tables and columns from.")
@click.option("--schema", default=None, help="Schema to read [default: the backend's default].")
def policy_init(backend: str, schema: str | None) -> None:
    """Print a draft policy for a database's tables, to edit and check."""
    from dpproxy.backends import open_backend
    from dpproxy.policy import draft_policy

    def action() -> None:
        with open_backend(backend) as db:
            click.echo(draft_policy(db.tables(schema)))

    _run(action)


@main.command()
@click.option(
    "--init",
    "init_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory to build the demo database in (demo.duckdb).",
)
@click.option(
    "--persons",
    type=click.IntRange(min=100),
    default=100_000,
    show_default=True,
    help="Number of persons to generate.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed of the generator.")
@click.option(
    "--postgres",
    "postgres_dsn",
    default=None,
    help="Also load the demo tables into this PostgreSQL database.",
)
def demo(init_dir: Path, persons: int, seed: int, postgres_dsn: str | None) -> None:
    """Build the demo dataset (patients, visits, zip_info) on DuckDB, optionally load it into PostgreSQL."""
    from dpproxy.demo import build_demo, load_into_postgres

    path = init_dir / "demo.duckdb"
    init_dir.mkdir(parents=True, exist_ok=True)
    summary = build_demo(path, persons, seed=seed, progress=_delayed_progress("generating demo data"))
    click.echo(
        f"built {summary.path}: {summary.persons:,} patients, {summary.visits:,} visits, "
        f"{summary.zips:,} zip codes "
        f"in {summary.seconds:.1f} s"
    )
    if postgres_dsn:
        load_into_postgres(path, postgres_dsn, progress=_delayed_progress("loading into PostgreSQL"))
        click.echo(f"loaded into {postgres_dsn}")


def _delayed_progress(label: str) -> Callable[[int, int], None]:
    """A progress callback that shows a bar only once the work has taken more than two seconds."""
    started = time.monotonic()
    state: dict[str, object] = {}

    def update(done: int, total: int) -> None:
        bar = state.get("bar")
        if bar is None:
            if time.monotonic() - started < 2.0 or done >= total:
                return
            bar = click.progressbar(length=total, label=label, file=sys.stderr)
            bar.__enter__()  # type: ignore[attr-defined]
            state["bar"] = bar
            state["done"] = 0
        bar.update(done - int(state["done"]))  # type: ignore[attr-defined]
        state["done"] = done
        if done >= total:
            bar.__exit__(None, None, None)  # type: ignore[attr-defined]

    return update


if __name__ == "__main__":  # pragma: no cover
    main()
