"""`dpproxy serve` and `dpproxy console`: the wire server (one process or several workers) and the
data owners' console, with the options and the running of the server that `dpproxy demo` shares.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import click

from dpproxy import __version__
from dpproxy.backends import BackendError
from dpproxy.cli.common import (
    BACKEND_ENV,
    BACKEND_HELP,
    OptionDecorator,
    _address,
    _ledger_spec,
    _processes,
    fail,
    ledger_option,
    policy_option,
    port_option,
    seconds_option,
)
from dpproxy.cli.dsn import served_database
from dpproxy.errors import BackendUnavailable, DPProxyError

if TYPE_CHECKING:
    from dpproxy.console import BackgroundConsole
    from dpproxy.engine import Engine
    from dpproxy.policy import Policy
    from dpproxy.wire.server import Operations, ServerConfig


class _Tls(TypedDict):
    tls_cert: Path | None
    tls_key: Path | None


def _tls_options(tls_cert: Path | None, tls_key: Path | None) -> _Tls:
    """--tls-cert and --tls-key as their ServerConfig fields, once checked: both or neither."""
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("give both --tls-cert and --tls-key, or neither")
    if tls_key is not None and tls_key.exists() and tls_key.stat().st_mode & 0o037:
        # As PostgreSQL refuses one: a key others can read (or a group can write) is not private.
        raise click.UsageError(
            f"the TLS key {tls_key} can be read by other users (mode {tls_key.stat().st_mode & 0o777:04o}): "
            f"make it readable by its owner only (chmod 600 {tls_key}; 640 for a group that must read it)"
        )
    return {"tls_cert": tls_cert, "tls_key": tls_key}


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


def workers_option(default_help: str) -> OptionDecorator:
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


backend_timeout_option = seconds_option(
    "--backend-timeout",
    30.0,
    "Seconds one backend query may run before it is stopped (57014; a private query that had started "
    "stays charged). 0: no limit. Clients can set a shorter statement_timeout.",
)


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
    ledger: str | None = None,
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
        ledger=ledger,
    )


def _metrics_line(metrics_host: str, metrics_port: int | None) -> str | None:
    if metrics_port is None:
        return None
    return f"metrics at http://{_address(metrics_host, metrics_port)}/metrics"


@click.command()
@policy_option
@click.option("--backend", required=True, envvar=BACKEND_ENV, help=BACKEND_HELP)
@host_option
@port_option(6432)
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
@seconds_option(
    "--idle-timeout", 3600.0, "Seconds a connection may stay silent before it is closed (0: never)."
)
@seconds_option(
    "--shutdown-grace", 10.0, "On SIGTERM, seconds running queries get to finish before they are cancelled."
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

    config = ServerConfig(
        host=host,
        port=port,
        **_tls_options(tls_cert, tls_key),
        idle_timeout=idle_timeout,
        shutdown_grace=shutdown_grace,
        database=database or served_database(backend),
    )
    assert config.database is not None
    ledger_spec = _ledger_spec(ledger, policy_path)
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

    operations = _operations(
        metrics_port, metrics_host, log_format, log_level, policy_path, pid_file, ledger_spec
    )
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


@click.command("console")
@policy_option
@ledger_option
@host_option
@port_option(6433)
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
    with open_ledger(_ledger_spec(ledger, policy_path, create=False)) as opened:
        app = Console(loaded, opened)

        def ready(bound: int) -> None:
            click.echo(f"dpproxy {__version__} console at http://{_address(host, bound)}/; Ctrl-C stops it")

        try:
            run_console(app, host=host, port=port, ready=ready)
        except OSError as e:
            click.echo(f"ERROR: cannot listen on {_address(host, port)}: {e.strerror or e}", err=True)
            sys.exit(1)
    click.echo("dpproxy: console stopped", err=True)
