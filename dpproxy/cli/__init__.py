"""The `dpproxy` command: click commands over the engine, the policy loader, the ledger and the demo.

Errors are rendered here, once: a DPProxyError becomes "ERROR <SQLSTATE>: message" (and its hint)
on stderr with exit status 1. Nothing here computes privacy: it only calls the engine.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from dpproxy import __version__
from dpproxy.backends import BackendError
from dpproxy.errors import BackendUnavailable, DPProxyError

if TYPE_CHECKING:
    from dpproxy.audit import AuditEntry
    from dpproxy.console import BackgroundConsole
    from dpproxy.engine import Engine
    from dpproxy.policy import Policy
    from dpproxy.wire.server import Operations, ServerConfig

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
    except BackendError as e:  # its text names where the DSN points, never its password or token
        fail(BackendUnavailable(str(e)))


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


BACKEND_HELP = (
    "postgresql://… DSN, a DuckDB file path, or a Spark Connect URL sc://HOST:15002/;token=…;use_ssl=true."
)

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
    """dpproxy: differentially private SQL over PostgreSQL, DuckDB or Apache Spark.

    Analysts send ordinary SQL; dpproxy bounds each person's contribution, adds calibrated noise and
    charges the analyst's privacy budget. Start with `dpproxy demo` and connect with psql, or serve
    your own data with `dpproxy serve`; `dpproxy explain` shows what a query is rewritten into.
    """


@main.command()
@policy_option
@click.option("--backend", required=True, help=BACKEND_HELP)
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
@click.option(
    "--backend",
    default=None,
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


def _moment(value: str | None, name: str) -> datetime | None:
    """--since/--until: an ISO 8601 date or date and time; without a zone, UTC."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an ISO 8601 date or time (write e.g. 2026-03-01 or 2026-03-01T14:30)",
            param_hint=name,
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


_AUDIT_FIELDS = (
    "at",
    "analyst",
    "client",
    "session_id",
    "statement_id",
    "kind",
    "status",
    "sqlstate",
    "epsilon",
    "delta",
    "rho",
    "replayed",
    "rows",
    "duration",
    "statement",
    "parameters",
    "stages",
    "entry_id",
)


@main.command("audit")
@click.option(
    "--policy",
    "policy_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Policy YAML file (optional: its server.audit_retention_days is applied first).",
)
@ledger_option
@click.option("--analyst", default=None, help="Only this analyst's statements.")
@click.option("--since", default=None, help="Only statements from this ISO date/time on (UTC if no zone).")
@click.option("--until", default=None, help="Only statements before this ISO date/time.")
@click.option(
    "--status",
    type=click.Choice(["ok", "refused", "failed", "running", "abandoned"]),
    default=None,
    help="Only statements that ended so.",
)
@click.option(
    "--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True
)
@click.option(
    "--limit", type=click.IntRange(min=0), default=1000, show_default=True, help="At most N, newest first."
)
def audit(
    policy_path: Path | None,
    ledger: str | None,
    analyst: str | None,
    since: str | None,
    until: str | None,
    status: str | None,
    fmt: str,
    limit: int,
) -> None:
    """The audit log: every statement analysts sent, newest first, with what it cost."""
    from dpproxy.budget import open_ledger
    from dpproxy.engine import Engine

    start, end = _moment(since, "--since"), _moment(until, "--until")
    spec = _ledger_spec(ledger)
    local = not spec.startswith(("postgresql://", "postgres://")) and spec != ":memory:"
    if local and not Path(spec).expanduser().exists():
        raise click.ClickException(
            f"no privacy ledger at {spec} (pass --ledger FILE or a postgresql:// DSN, or set "
            f"${DEFAULT_LEDGER_ENV})"
        )

    def action() -> None:
        if policy_path is not None:
            with Engine.open(policy_path, None, spec) as engine:
                assert engine.ledger is not None
                entries = engine.ledger.audit_entries(
                    analyst=analyst, since=start, until=end, status=status, limit=limit
                )
        else:
            with open_ledger(spec) as opened:
                entries = opened.audit_entries(
                    analyst=analyst, since=start, until=end, status=status, limit=limit
                )
        click.echo(format_audit(entries, fmt), nl=fmt != "csv")

    _run(action)


# C0 and C1 control characters (ESC, CSI, BEL, …) in an audit table's statement column.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")

# What a spreadsheet reads as a formula at the start of a cell (OWASP, "CSV Injection").
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: object) -> object:
    """A CSV cell a spreadsheet shows as text: an analyst's `=HYPERLINK(…)` (or any text starting
    with = + - @, a tab or a carriage return) gets a leading single quote, as OWASP advises, so that
    opening the export never evaluates what an analyst wrote. Numbers are left as they are."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def format_audit(entries: Sequence[AuditEntry], fmt: str) -> str:
    """Audit entries as a table, CSV (a header, then one line per statement) or a JSON array."""
    import csv
    import io
    import json

    def fields(entry: AuditEntry) -> dict[str, object]:
        return {
            "at": entry.at.isoformat(),
            "analyst": entry.analyst,
            "client": entry.client,
            "session_id": entry.session_id,
            "statement_id": entry.statement_id,
            "kind": entry.kind,
            "status": entry.status,
            "sqlstate": entry.sqlstate,
            "epsilon": entry.cost.epsilon,
            "delta": entry.cost.delta,
            "rho": entry.cost.rho,
            "replayed": entry.replayed,
            "rows": entry.rows,
            "duration": entry.duration,
            "statement": entry.statement,
            "parameters": list(entry.parameters),
            "stages": entry.stages,
            "entry_id": entry.entry_id,
        }

    if fmt == "json":
        return json.dumps([fields(e) for e in entries], ensure_ascii=False, indent=1)
    if fmt == "csv":
        out = io.StringIO()
        # Text cells quoted: a carriage return in a statement stays inside its cell (unquoted, it would
        # end the record for most readers: the writer quotes only for "\n").
        writer = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)
        writer.writerow(_AUDIT_FIELDS)
        for entry in entries:
            row = fields(entry)
            row["parameters"] = json.dumps(row["parameters"], ensure_ascii=False)
            row["stages"] = json.dumps(row["stages"], sort_keys=True)
            writer.writerow(["" if row[f] is None else _csv_cell(row[f]) for f in _AUDIT_FIELDS])
        return out.getvalue()
    headers = ["at", "analyst", "client", "session", "#", "kind", "status", "sqlstate", "ε", "δ", "rows"]
    headers += ["ms", "statement"]
    rows = []
    for entry in entries:
        text = " ".join(entry.statement.split())
        if entry.parameters:
            text += " -- " + json.dumps(list(entry.parameters), ensure_ascii=False)
        # What an analyst wrote never drives the operator's terminal: control characters escaped.
        text = _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)
        epsilon = entry.cost.epsilon if not entry.replayed else "replayed"
        rows.append(
            (
                entry.at.strftime("%Y-%m-%d %H:%M:%S"),
                entry.analyst,
                entry.client,
                entry.session_id,
                entry.statement_id,
                entry.kind,
                entry.status,
                entry.sqlstate or "",
                epsilon,
                entry.cost.delta,
                entry.rows,
                Decimal(f"{entry.duration * 1000:.1f}") if entry.duration is not None else None,
                text if len(text) <= 80 else text[:77] + "...",
            )
        )
    return format_table(headers, rows)


@main.group()
def policy() -> None:
    """Check, draft and secure policy files."""


@policy.command("check")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--backend",
    default=None,
    help="Also check tables, columns and types against this database (a DSN, DuckDB file or sc://… URL).",
)
def policy_check(file: Path, backend: str | None) -> None:
    """Validate a policy file (and, with --backend, against the live schema)."""
    from dpproxy.backends import open_backend
    from dpproxy.policy import check_against_schema, load_policy

    def action() -> None:
        loaded = load_policy(file)
        click.echo(f"{file}: OK ({len(loaded.tables)} table(s), {len(loaded.analysts)} analyst(s))")
        for table in loaded.tables:
            vouched = table.vouched()
            if vouched:
                click.echo(f"  note: {vouched}")
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
            click.echo(f"{file}: matches the schema of {_shown_backend(backend)}")

    _run(action)


@policy.command("passwd")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@click.option(
    "--md5-user",
    metavar="NAME",
    default=None,
    help="Print the md5_password of analyst NAME instead (only for `server: {auth_methods: [md5]}`).",
)
def policy_passwd(password_stdin: bool, md5_user: str | None) -> None:
    """Print a SCRAM-SHA-256 verifier to paste as an analyst's password.

    With --md5-user, print PostgreSQL's md5 hash of the password for that analyst instead, to paste
    as `md5_password` (md5 is weaker than SCRAM: prefer SCRAM wherever the clients support it).
    """
    from dpproxy.scram import make_verifier
    from dpproxy.wire.auth import md5_password

    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise click.UsageError("the password must not be empty")
    if md5_user is not None:
        if not md5_user:
            raise click.UsageError("--md5-user needs the analyst's name")
        click.echo(md5_password(password, md5_user))
    else:
        click.echo(make_verifier(password))


@policy.command("init")
@click.option(
    "--backend",
    required=True,
    help="Database to read tables and columns from (a DSN, DuckDB file or sc://… URL).",
)
@click.option(
    "--schema",
    default=None,
    help="Schema to read (on Spark: the database) [default: the backend's default: public, main or default].",
)
def policy_init(backend: str, schema: str | None) -> None:
    """Print a draft policy for a database's tables, to edit and check."""
    from dpproxy.backends import open_backend
    from dpproxy.policy import draft_policy

    def action() -> None:
        with open_backend(backend) as db:
            tables = db.tables(schema)
            if schema and schema != db.default_schema:  # the draft names the schema on each table
                tables = {f"{schema}.{name}": columns for name, columns in tables.items()}
            click.echo(draft_policy(tables))

    _run(action)


@policy.command("reload")
@click.option(
    "--pid-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The file `dpproxy serve --pid-file` wrote.",
)
@click.option("--pid", type=click.IntRange(min=1), default=None, help="The process id of `dpproxy serve`.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=120.0,
    show_default=True,
    help="Seconds to wait for the server's answer.",
)
def policy_reload(pid_file: Path | None, pid: int | None, timeout: float) -> None:
    """Make a running `dpproxy serve` re-read its policy file (SIGHUP) and say whether it took it.

    New connections get the new policy; connected sessions keep theirs; spending is kept. A policy
    with problems is refused (they are printed, exit status 1) and the running one stays. Exit
    status 2 when no server answered.
    """
    import signal

    from dpproxy.wire.reload import read_status, status_path

    if (pid_file is None) == (pid is None):
        raise click.UsageError("give --pid-file or --pid")
    if pid_file is not None:
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            click.echo(
                f"ERROR: {pid_file} holds no process id: is `dpproxy serve --pid-file` running?", err=True
            )
            sys.exit(2)
    assert pid is not None
    path = status_path(pid_file, pid)
    before = read_status(path)
    if before is None:
        click.echo(
            f"ERROR: process {pid} has written no reload status ({path}): is it `dpproxy serve`"
            f"{' started with this --pid-file' if pid_file else ' (with --pid-file, give that)'}?",
            err=True,
        )
        sys.exit(2)
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        click.echo(f"ERROR: no process {pid}: the server is not running", err=True)
        sys.exit(2)
    except PermissionError:
        click.echo(f"ERROR: not allowed to signal process {pid} (run as the server's user)", err=True)
        sys.exit(2)
    deadline = time.monotonic() + timeout
    while True:
        after = read_status(path)
        if after is not None and after.generation > before.generation:
            break
        if time.monotonic() >= deadline:
            click.echo(f"ERROR: the server (process {pid}) did not answer within {timeout:g} s", err=True)
            sys.exit(2)
        time.sleep(0.05)
    if after.accepted:
        click.echo(
            f"policy {after.policy} reloaded (generation {after.generation}): {after.tables} table(s), "
            f"{after.analysts} analyst(s); new connections use it, connected sessions keep theirs"
        )
        return
    click.echo(
        f"policy {after.policy} refused: {len(after.problems)} problem(s); the running policy stays", err=True
    )
    for problem in after.problems:
        click.echo(f"  - {problem}", err=True)
    sys.exit(1)


def _tls_options(tls_cert: Path | None, tls_key: Path | None) -> None:
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("give both --tls-cert and --tls-key, or neither")


def open_served_engine(
    policy_path: Path,
    backend: str,
    ledger: str,
    backend_timeout: float,
    database: str,
    *,
    policy: Policy | None = None,
) -> Engine:
    """The engine `serve` and `demo` serve; also each worker process's (so: a picklable recipe).
    `policy`: one already read from `policy_path` (a reload) instead of reading the file."""
    from dpproxy.backends import open_backend
    from dpproxy.engine import Engine

    opened = open_backend(backend, statement_timeout_s=backend_timeout)
    try:
        engine = Engine.open(policy if policy is not None else policy_path, opened, ledger)
    except BaseException:
        opened.close()
        raise
    engine.database = database  # a `db.schema.table` name must name the served database
    return engine


def _serve(
    engine: Engine,
    config: ServerConfig,
    announce: Callable[[int, int | None], None],
    workers: int,
    factory: Callable[..., Engine],
    operations: Operations | None = None,
    ledger: str | None = None,
    on_reload: Callable[[Policy], None] | None = None,
) -> None:
    """Run the wire server until SIGTERM/SIGINT; exit 0 after a clean shutdown. One worker: in this
    process, on `engine`; more: `engine` is closed and each worker process opens its own (the
    supervisor reads budgets for the metrics through its own connection to `ledger`).
    `announce(port, metrics port or None)` once it serves; `on_reload(policy)` after each accepted
    policy reload."""
    from dpproxy.logs import configure
    from dpproxy.wire.server import Operations, run_server
    from dpproxy.wire.workers import WorkersFailed, run_workers

    ops = operations or Operations()
    configure(ops.log_format, ops.log_level)
    try:
        if workers == 1:
            status = run_server(
                engine,
                config,
                ready=lambda server: announce(server.port, server.metrics_port),
                operations=ops,
                on_reload=on_reload,
            )
        else:
            view = None
            if ops.metrics_port is not None and ledger is not None:
                from dpproxy.engine import Engine

                view = Engine.open(engine.policy, None, ledger)
            engine.close()
            status = run_workers(
                factory, config, workers, ready=announce, operations=ops, budget=view, on_reload=on_reload
            )
    except OSError as e:  # serve() has closed the engine already
        click.echo(f"ERROR: cannot listen on {config.host}:{config.port}: {e.strerror or e}", err=True)
        sys.exit(1)
    except WorkersFailed as e:
        click.echo(f"ERROR: the worker processes could not serve: {e}", err=True)
        sys.exit(1)
    click.echo("dpproxy: stopped", err=True)
    sys.exit(status)


def workers_option(default_help: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    return click.option(
        "--workers",
        type=click.IntRange(min=1),
        default=None,
        help="Worker processes serving connections on the one port, each with its own engine and backend "
        f"connections, sharing the ledger [default: {default_help}].",
    )


def _worker_count(workers: int | None, ledger: str) -> int:
    """--workers, checked against the ledger: an in-memory ledger lives in one process."""
    from dpproxy.wire.workers import default_workers

    if ledger == ":memory:":
        if workers not in (None, 1):
            raise click.UsageError(
                "--ledger :memory: keeps budgets in one process: use --workers 1 or a file"
            )
        return 1
    return workers or default_workers()


backend_timeout_option = click.option(
    "--backend-timeout",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds one backend query may run before it is stopped (57014; a private query that had started "
    "stays charged). 0: no limit. Clients can set a shorter statement_timeout.",
)


def served_database(backend: str) -> str:
    """The database name `serve` answers to by default: the PostgreSQL DSN's dbname (else libpq's
    default, the user name), `spark` for a Spark Connect URL (which names no database), or a DuckDB
    file's name without its extension."""
    from dpproxy.backends import _PG_KEYWORDS, _PG_URL

    if _is_spark(backend):
        return SPARK_DATABASE

    if _PG_URL.match(backend) or _PG_KEYWORDS.search(backend):
        import getpass

        import psycopg

        try:
            params = psycopg.conninfo.conninfo_to_dict(backend)
        except psycopg.Error:
            params = {}
        return str(
            params.get("dbname")
            or os.environ.get("PGDATABASE")
            or params.get("user")
            or os.environ.get("PGUSER")
            or getpass.getuser()
        )
    return Path(backend.removeprefix("duckdb:")).stem


SPARK_DATABASE = "spark"  # what `serve --backend sc://…` answers to without --database


def _is_spark(backend: str) -> bool:
    return backend.strip().lower().startswith("sc://")


def _shown_backend(backend: str) -> str:
    """A backend DSN as it may be printed: a PostgreSQL password or a Spark token masked."""
    if _is_spark(backend):
        from dpproxy.backends.spark import mask_url

        return mask_url(backend)
    if _PG_DSN.match(backend) or "=" in backend:
        return mask_dsn(backend)
    return backend


_PG_DSN = re.compile(r"^postgres(ql)?://", re.IGNORECASE)


def mask_dsn(dsn: str) -> str:
    """A DSN as it may be shown: its password replaced by ***, whatever form it was written in."""
    import psycopg

    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "the PostgreSQL database (its DSN could not be parsed)"
    if "password" not in params:
        return dsn
    if _URL_PASSWORD.match(dsn):
        return _URL_PASSWORD.sub(r"\1***@", dsn, count=1)
    params["password"] = "***"
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


def mask_password(text: str, dsn: str) -> str:
    """`text` (a driver's error, which may quote the DSN) with the DSN's password replaced by ***."""
    import psycopg

    try:
        password = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
    except psycopg.Error:
        return "the DSN could not be parsed"
    return text.replace(str(password), "***") if password else text


_URL_PASSWORD = re.compile(r"^(postgres(?:ql)?://[^:@/]*:)[^@/]*@", re.IGNORECASE)


host_option = click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0 for all)."
)


def operations_options(command: Callable[..., None]) -> Callable[..., None]:
    """--metrics-port, --metrics-host, --log-format and --log-level (serve and demo); the choices are
    dpproxy.logs.LOG_FORMATS and LOG_LEVELS (not imported here: `dpproxy` starts without them)."""
    for option in reversed(
        (
            click.option(
                "--metrics-port",
                type=click.IntRange(0, 65535),
                default=None,
                help="Serve Prometheus metrics on http://METRICS-HOST:PORT/metrics (0: any free port).",
            ),
            click.option(
                "--metrics-host",
                default="127.0.0.1",
                show_default=True,
                help="Address the metrics endpoint listens on (with --metrics-port).",
            ),
            click.option(
                "--log-format",
                type=click.Choice(("text", "json")),
                default="text",
                show_default=True,
                help="Log lines on stderr as text, or as JSON objects (one a line) for a log collector.",
            ),
            click.option(
                "--log-level",
                type=click.Choice(("debug", "info", "warning", "error")),
                default="warning",
                show_default=True,
                help="Least severe log lines shown (info: also a line per statement, its kind and outcome).",
            ),
        )
    ):
        command = option(command)
    return command


def _operations(
    metrics_port: int | None,
    metrics_host: str,
    log_format: str,
    log_level: str,
    policy_file: Path | None = None,
    pid_file: Path | None = None,
) -> Operations:
    from dpproxy.wire.reload import status_path
    from dpproxy.wire.server import Operations

    return Operations(
        metrics_host=metrics_host,
        metrics_port=metrics_port,
        log_format=log_format,
        log_level=log_level,
        policy_file=policy_file,
        status_file=status_path(pid_file, os.getpid()) if policy_file is not None else None,
    )


def _metrics_line(metrics_host: str, metrics_port: int | None) -> str | None:
    if metrics_port is None:
        return None
    return f"metrics at http://{_address(metrics_host, metrics_port)}/metrics"


@main.command()
@policy_option
@click.option("--backend", required=True, help=BACKEND_HELP)
@host_option
@click.option(
    "--port", type=click.IntRange(0, 65535), default=6432, show_default=True, help="TCP port to listen on."
)
@ledger_option
@click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="PEM certificate: clients asking for TLS (sslmode=require) get it. Needs --tls-key.",
)
@click.option(
    "--tls-key",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="PEM private key of --tls-cert.",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(min=0),
    default=3600.0,
    show_default=True,
    help="Seconds a connection may stay silent before it is closed (0: never).",
)
@click.option(
    "--shutdown-grace",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="On SIGTERM, seconds running queries get to finish before they are cancelled.",
)
@backend_timeout_option
@click.option(
    "--database",
    default=None,
    help="The database name clients connect to (others get 3D000), which current_database() returns "
    "[default: the backend's: the DSN's dbname for PostgreSQL, the file name without extension for DuckDB, "
    "spark for Spark].",
)
@workers_option("the number of cores")
@click.option(
    "--console-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Also serve the data owners' console on this port (needs a `console:` section in the policy).",
)
@click.option(
    "--console-host",
    default="127.0.0.1",
    show_default=True,
    help="Address the console listens on (with --console-port).",
)
@operations_options
@click.option(
    "--pid-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the server's process id here (removed on exit), for `dpproxy policy reload --pid-file`.",
)
def serve(
    policy_path: Path,
    backend: str,
    host: str,
    port: int,
    ledger: str | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    idle_timeout: float,
    shutdown_grace: float,
    backend_timeout: float,
    database: str | None,
    workers: int | None,
    console_port: int | None,
    console_host: str,
    metrics_port: int | None,
    metrics_host: str,
    log_format: str,
    log_level: str,
    pid_file: Path | None,
) -> None:
    """Serve the PostgreSQL wire protocol: analysts connect with psql, drivers and BI tools.

    Stops on SIGTERM or Ctrl-C: running queries get a grace period, then are cancelled. SIGHUP (or
    `dpproxy policy reload`) re-reads the policy file for new connections; a policy with problems is
    refused and the running one stays.
    """
    import functools

    from dpproxy.wire.server import ServerConfig

    _tls_options(tls_cert, tls_key)
    config = ServerConfig(
        host=host,
        port=port,
        tls_cert=tls_cert,
        tls_key=tls_key,
        idle_timeout=idle_timeout,
        shutdown_grace=shutdown_grace,
        database=database or served_database(backend),
    )
    assert config.database is not None
    ledger_spec = _ledger_spec(ledger)
    processes = _worker_count(workers, ledger_spec)
    factory = functools.partial(
        open_served_engine, policy_path, backend, ledger_spec, backend_timeout, config.database
    )
    try:
        engine = factory()
    except DPProxyError as e:
        fail(e)
    except BackendError as e:  # its text names where the DSN points, never its password
        fail(BackendUnavailable(str(e)))
    except ValueError as e:  # an unrecognised DSN (never echoed: it may hold a password)
        raise click.UsageError(str(e)) from None

    for table in engine.policy.tables:
        vouched = table.vouched()
        if vouched:
            click.echo(f"dpproxy: note: {vouched}", err=True)

    analysts = len(engine.policy.analysts)
    console = None
    if console_port is not None:
        console = _start_console(engine, ledger_spec, processes, console_host, console_port)

    def announce(bound: int, metrics_bound: int | None = None) -> None:
        tls = "TLS available" if tls_cert else "no TLS"
        click.echo(
            f"dpproxy {__version__} listening on {_address(host, bound)} "
            f"(policy {policy_path}, {analysts} analyst(s), {tls}, {_processes(processes)}); Ctrl-C stops it"
        )
        if console is not None:
            click.echo(f"console for data owners at {console.url}")
        metrics_line = _metrics_line(metrics_host, metrics_bound)
        if metrics_line:
            click.echo(metrics_line)
        sys.stdout.flush()

    operations = _operations(metrics_port, metrics_host, log_format, log_level, policy_path, pid_file)
    if pid_file is not None:
        pid_file.write_text(f"{os.getpid()}\n")
    try:
        on_reload = console.console.set_policy if console is not None else None
        _serve(engine, config, announce, processes, factory, operations, ledger_spec, on_reload)
    finally:
        if pid_file is not None:
            with contextlib.suppress(OSError):
                pid_file.unlink()


def _start_console(
    engine: Engine, ledger_spec: str, processes: int, host: str, port: int
) -> BackgroundConsole:
    """The owners' console on its own thread of this process (the supervisor's when there are
    several workers: it then reads the ledger through its own connection, as each worker does).
    Exits with an error when the policy has no `console:` section or the port cannot be bound."""
    from dpproxy.budget import open_ledger
    from dpproxy.console import BackgroundConsole, Console

    if engine.policy.console is None or not engine.policy.console.owners:
        engine.close()
        raise click.UsageError(
            f"--console-port: the policy {engine.policy.source} has no `console:` section listing the owners "
            "who may log in; add one (README: Policy reference, console) or leave out --console-port"
        )
    assert engine.ledger is not None
    ledger = engine.ledger if processes == 1 else open_ledger(ledger_spec)
    try:
        console = Console(engine.policy, ledger, enforced_unique=engine.enforced_unique)
        return BackgroundConsole(console, host=host, port=port).start()
    except OSError as e:
        engine.close()
        click.echo(f"ERROR: the console cannot listen on {_address(host, port)}: {e.strerror or e}", err=True)
        sys.exit(1)


@main.command("console")
@policy_option
@ledger_option
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0 for all)."
)
@click.option(
    "--port", type=click.IntRange(0, 65535), default=6433, show_default=True, help="TCP port to listen on."
)
def console_command(policy_path: Path, ledger: str | None, host: str, port: int) -> None:
    """Serve the data owners' console alone: budgets over time, the audit log, the policy and the
    accuracy planner, read-only, behind a login from the policy's `console:` section.

    Reads the policy and the ledger only: it never opens the backing database.
    """
    from dpproxy.budget import open_ledger
    from dpproxy.console import Console, run_console
    from dpproxy.policy import load_policy

    try:
        loaded = load_policy(policy_path)
    except DPProxyError as e:
        fail(e)
    if loaded.console is None or not loaded.console.owners:
        raise click.UsageError(
            f"the policy {policy_path} has no `console:` section listing the owners who may log in; "
            "add one (README: Policy reference, console)"
        )
    with open_ledger(_ledger_spec(ledger)) as opened:
        app = Console(loaded, opened)

        def ready(bound: int) -> None:
            click.echo(f"dpproxy {__version__} console at http://{_address(host, bound)}/; Ctrl-C stops it")

        try:
            run_console(app, host=host, port=port, ready=ready)
        except OSError as e:
            click.echo(f"ERROR: cannot listen on {_address(host, port)}: {e.strerror or e}", err=True)
            sys.exit(1)
    click.echo("dpproxy: console stopped", err=True)


def _processes(count: int) -> str:
    return "1 process" if count == 1 else f"{count} worker processes"


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


DEMO_ANALYSTS = (("alice", "alice-demo"), ("bob", "bob-demo"))
DEMO_DATABASE = "demo"  # the database name `dpproxy demo` serves (current_database())


def default_demo_dir() -> Path:
    """$XDG_DATA_HOME/dpproxy/demo, else ~/.local/share/dpproxy/demo."""
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "dpproxy" / "demo"


@contextlib.contextmanager
def demo_policy_path() -> Iterator[Path]:
    """The demo policy shipped inside the package (policies/demo.yaml links to the same file)."""
    from importlib.resources import as_file, files

    with as_file(files("dpproxy") / "data" / "demo.yaml") as path:
        yield path


@main.command()
@click.option(
    "--init",
    "init_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Only build the demo database in this directory (demo.duckdb), then exit.",
)
@click.option(
    "--dir",
    "data_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the demo data and its ledger live [default: $XDG_DATA_HOME/dpproxy/demo or "
    "~/.local/share/dpproxy/demo]. Built there if missing.",
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
    help="With --init: also load the demo tables into this PostgreSQL database.",
)
@click.option(
    "--spark",
    "spark_url",
    default=None,
    metavar="URL",
    help="With --init: also load the demo tables into a Spark database (--spark-database) through this "
    "Spark Connect URL (sc://HOST:15002/;token=…), and write DIR/demo-spark.yaml, the demo policy for it.",
)
@click.option(
    "--spark-database",
    default="demo",
    show_default=True,
    help="With --spark: the Spark database the demo tables are loaded into (replaced if present).",
)
@host_option
@click.option(
    "--port", type=click.IntRange(0, 65535), default=6432, show_default=True, help="TCP port to listen on."
)
@backend_timeout_option
@workers_option("the number of cores")
@click.option(
    "--console-port",
    type=click.IntRange(0, 65535),
    default=6433,
    show_default=True,
    help="Port of the data owners' console (its login is printed).",
)
@click.option(
    "--console-host", default="127.0.0.1", show_default=True, help="Address the console listens on."
)
@operations_options
def demo(
    init_dir: Path | None,
    data_dir: Path | None,
    persons: int,
    seed: int,
    postgres_dsn: str | None,
    spark_url: str | None,
    spark_database: str,
    host: str,
    port: int,
    backend_timeout: float,
    workers: int | None,
    console_port: int,
    console_host: str,
    metrics_port: int | None,
    metrics_host: str,
    log_format: str,
    log_level: str,
) -> None:
    """Serve generated sample data (patients, visits, zip_info) for psql and other clients.

    Builds the data on first use, then serves it on embedded DuckDB with the demo policy. With
    --init DIR, only builds the data (and with --postgres or --spark, loads it into PostgreSQL or
    Spark too).
    """
    import psycopg

    from dpproxy.demo import load_into_postgres

    if init_dir is not None:
        path = _build_demo(init_dir, persons, seed)
        if postgres_dsn:
            try:
                load_into_postgres(path, postgres_dsn, progress=_delayed_progress("loading into PostgreSQL"))
            except psycopg.Error as e:
                target = mask_dsn(postgres_dsn)
                click.echo(
                    f"ERROR: could not load the demo into {target}: {mask_password(str(e), postgres_dsn)}",
                    err=True,
                )
                sys.exit(1)
            click.echo(f"loaded into {mask_dsn(postgres_dsn)}")
        if spark_url:
            _demo_into_spark(path, init_dir, spark_url, spark_database)
        return
    if postgres_dsn:
        raise click.UsageError("--postgres is only used with --init")
    if spark_url:
        raise click.UsageError("--spark is only used with --init")

    import functools

    directory = data_dir or default_demo_dir()
    path = directory / "demo.duckdb"
    if not path.exists():
        _build_demo(directory, persons, seed)
    ledger = directory / "ledger.sqlite"
    processes = _worker_count(workers, str(ledger))
    with demo_policy_path() as policy_path:
        # Every worker opens the DuckDB file read-only, which DuckDB allows from several processes.
        factory = functools.partial(
            open_served_engine, policy_path, str(path), str(ledger), backend_timeout, DEMO_DATABASE
        )
        try:
            engine = factory()
        except DPProxyError as e:
            fail(e)
        console = _start_console(engine, str(ledger), processes, console_host, console_port)
        operations = _operations(metrics_port, metrics_host, log_format, log_level)
        _demo_serve(engine, host, port, path, ledger, processes, factory, console.url, operations)


DEMO_OWNER = ("carol", "carol-demo")  # the demo policy's console login (dpproxy/data/demo.yaml)


def _demo_serve(
    engine: Engine,
    host: str,
    port: int,
    path: Path,
    ledger: Path,
    processes: int,
    factory: Callable[[], Engine],
    console_url: str,
    operations: Operations | None = None,
) -> None:
    from dpproxy.wire.server import ServerConfig

    analysts = ", ".join(
        f"{name} / {password} (ε budget {engine.analyst(name).epsilon:g})" for name, password in DEMO_ANALYSTS
    )

    def announce(bound: int, metrics_bound: int | None = None) -> None:
        address = _address(host if host not in ("0.0.0.0", "::", "") else "127.0.0.1", bound)
        lines = [
            f"dpproxy {__version__} demo: serving {path} on {_address(host, bound)} "
            f"({_processes(processes)})",
            f"  analysts (user / password): {analysts}",
            f"  budgets are kept in {ledger}",
            "",
            "Connect with:",
            f'  psql "postgresql://{DEMO_ANALYSTS[0][0]}@{address}/{DEMO_DATABASE}"',
            "then try: SELECT diagnosis, COUNT(*), AVG(income) FROM patients GROUP BY diagnosis;",
            "",
            f"Console for data owners: {console_url} (log in as {DEMO_OWNER[0]} / {DEMO_OWNER[1]})",
            "Ctrl-C stops the server.",
        ]
        metrics_line = operations and _metrics_line(operations.metrics_host, metrics_bound)
        if metrics_line:
            lines.insert(-1, metrics_line)
        click.echo("\n".join(lines))

    config = ServerConfig(host=host, port=port, database=DEMO_DATABASE)
    _serve(engine, config, announce, processes, factory, operations, str(ledger))


SPARK_DEMO_POLICY = "demo-spark.yaml"


def _demo_into_spark(path: Path, directory: Path, url: str, database: str) -> None:
    """Load the demo into the Spark database `database`, write the demo policy pointing at it, and
    say how to serve it (the token masked: the operator puts their own back)."""
    from dpproxy.backends.spark import client_errors, mask_url, operator_text, token_of
    from dpproxy.demo import load_into_spark
    from dpproxy.policy.model import is_valid_name

    if not is_valid_name(database):
        raise click.UsageError("--spark-database must be lowercase letters, digits and _")
    shown = mask_url(url)
    try:
        errors = client_errors()
    except BackendError as e:
        fail(BackendUnavailable(str(e)))
    try:
        load_into_spark(path, url, database=database, progress=_delayed_progress("loading into Spark"))
    except (BackendError, ValueError) as e:  # neither text holds the token
        click.echo(f"ERROR: could not load the demo into Spark: {e}", err=True)
        sys.exit(1)
    except errors as e:
        click.echo(f"ERROR: could not load the demo into Spark: {operator_text(e, token_of(url))}", err=True)
        sys.exit(1)
    policy = directory / SPARK_DEMO_POLICY
    policy.write_text(spark_demo_policy(database))
    click.echo(f"loaded into {shown} (Spark database {database})")
    click.echo(f"wrote {policy}, the demo policy for it (each table has schema: {database})")
    token_note = "  (write your token in place of ***)" if ";token=***" in shown.lower() else ""
    click.echo(
        f"serve it with:\n  dpproxy serve --policy {policy} --backend '{shown}' "
        f"--database {DEMO_DATABASE} --ledger {directory / 'ledger.sqlite'}{token_note}"
    )


def spark_demo_policy(database: str) -> str:
    """The demo policy with `schema: <database>` on each table: on Spark the demo tables live in
    that database, not in the backend's default one."""
    with demo_policy_path() as shipped:
        text = shipped.read_text()
    header = (
        "# The demo policy for the demo data loaded into Spark (`dpproxy demo --init DIR --spark URL`):\n"
        f"# the tables live in the Spark database {database}.\n"
    )
    for old, new in (
        ("  patients:\n", f"  patients:\n    schema: {database}\n"),
        ("  visits:\n", f"  visits:\n    schema: {database}\n"),
        ("  zip_info: {public: true}", f"  zip_info: {{public: true, schema: {database}}}"),
    ):
        if text.count(old) != 1:
            raise RuntimeError("the shipped demo policy does not have the expected table entries")
        text = text.replace(old, new)
    return header + text


def _build_demo(directory: Path, persons: int, seed: int) -> Path:
    from dpproxy.demo import build_demo

    path = directory / "demo.duckdb"
    directory.mkdir(parents=True, exist_ok=True)
    summary = build_demo(path, persons, seed=seed, progress=_delayed_progress("generating demo data"))
    click.echo(
        f"built {summary.path}: {summary.persons:,} patients, {summary.visits:,} visits, "
        f"{summary.zips:,} zip codes "
        f"in {summary.seconds:.1f} s"
    )
    return path


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
