"""`dpproxy demo`: build the generated sample data (and load it into PostgreSQL or Spark), then serve
it on embedded DuckDB with the demo policy and the owners' console.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click

from dpproxy import __version__
from dpproxy.backends import BackendError
from dpproxy.cli.common import _address, _processes, fail, port_option
from dpproxy.cli.dsn import mask_dsn, mask_password
from dpproxy.cli.serve import (
    _metrics_line,
    _operations,
    _serve,
    _start_console,
    _worker_count,
    backend_timeout_option,
    host_option,
    open_served_engine,
    operations_options,
    workers_option,
)
from dpproxy.errors import BackendUnavailable, DPProxyError

if TYPE_CHECKING:
    from dpproxy.engine import Engine
    from dpproxy.wire.server import Operations


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


@click.command()
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
@port_option(6432)
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
