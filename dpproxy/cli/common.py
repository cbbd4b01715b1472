"""What every `dpproxy` command shares: the default ledger, how an error is rendered (once: a
DPProxyError becomes "ERROR <SQLSTATE>: message" and its hint on stderr, exit status 1), --param
values, the psql-style table, the --policy, --ledger and --backend options, the shape of an option
of seconds or of a port, and how a listening address and the number of processes are written in
messages.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import NoReturn

import click

from dpproxy.backends import BackendError
from dpproxy.errors import BackendUnavailable, DPProxyError

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


# The backend's DSN from the environment instead of the command line, where every local user can
# read it (/proc/PID/cmdline): a password or token in it stays out of the process list.
BACKEND_ENV = "DPPROXY_BACKEND"
BACKEND_HELP = (
    "postgresql://… DSN, a DuckDB file path, or a Spark Connect URL sc://HOST:15002/;token=…;use_ssl=true "
    f"[or ${BACKEND_ENV}: a password in the command line is readable by every local user]."
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
    help="Budget ledger: a SQLite file or a postgresql:// DSN [default: the policy's server.ledger, "
    f"else ${DEFAULT_LEDGER_ENV}, else ~/.local/share/dpproxy/ledger.sqlite].",
)


# What click.option returns: a decorator adding the option to a command.
OptionDecorator = Callable[[Callable[..., None]], Callable[..., None]]


def seconds_option(name: str, default: float, help_text: str) -> OptionDecorator:
    """An option of seconds: a number, 0 or more, its default shown (--backend-timeout, --idle-timeout
    and --shutdown-grace of serve and demo, --timeout of `policy reload`)."""
    return click.option(
        name, type=click.FloatRange(min=0), default=default, show_default=True, help=help_text
    )


def port_option(default: int) -> OptionDecorator:
    """--port, the TCP port a server listens on (serve and demo: the wire protocol; console)."""
    return click.option(
        "--port",
        type=click.IntRange(0, 65535),
        default=default,
        show_default=True,
        help="TCP port to listen on.",
    )


def _ledger_spec(ledger: str | None, policy_path: Path | None = None, *, create: bool = True) -> str:
    """The ledger a command uses: --ledger, else the policy's `server.ledger` (a relative path is
    read from the policy file's directory), else $DPPROXY_LEDGER or the default path. Unless
    `create` (serve and query, which spend budget), a SQLite ledger that does not exist is an error
    naming its path: reading budgets or the audit log never creates an empty ledger that would
    report nothing spent."""
    spec = ledger or _policy_ledger(policy_path) or str(default_ledger_path())
    local = not spec.startswith(("postgresql://", "postgres://")) and spec != ":memory:"
    if not create and local and not Path(spec).expanduser().exists():
        raise click.ClickException(
            f"no privacy ledger at {spec}: `dpproxy serve` creates it; pass --ledger FILE or a "
            f"postgresql:// DSN, name it in the policy (server.ledger), or set ${DEFAULT_LEDGER_ENV}"
        )
    return spec


def _policy_ledger(policy_path: Path | None) -> str | None:
    """The policy's `server.ledger`, resolved against the policy file's directory; None when the
    policy names none (or cannot be read: the command's own load reports why)."""
    if policy_path is None:
        return None
    from dpproxy.policy import load_policy

    try:
        named = load_policy(policy_path).server.ledger
    except DPProxyError:
        return None
    if named is None or named.startswith(("postgresql://", "postgres://")) or named == ":memory:":
        return named
    path = Path(named).expanduser()
    return str(path if path.is_absolute() else Path(policy_path).parent / path)


def _processes(count: int) -> str:
    return "1 process" if count == 1 else f"{count} worker processes"


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
