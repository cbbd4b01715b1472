"""`dpproxy policy check | passwd | init | reload`: check, draft and secure policy files, and make a
running server re-read its own.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

import click
from sqlglot import exp

from dpproxy.cli.common import BACKEND_ENV, OptionDecorator, _run, seconds_option
from dpproxy.cli.dsn import _shown_backend

if TYPE_CHECKING:
    from dpproxy.backends import Backend
    from dpproxy.policy import Policy, ValueRange
    from dpproxy.policy.live_schema import LiveColumnLike


def _backend_option(purpose: str, *, required: bool) -> OptionDecorator:
    """--backend of `policy check` and `policy init`: the database whose schema they read."""
    return click.option(
        "--backend",
        required=required,
        envvar=BACKEND_ENV,
        help=f"{purpose} (a DSN, DuckDB file or sc://… URL; or ${BACKEND_ENV}).",
    )


@click.group()
def policy() -> None:
    """Check, draft and secure policy files."""


@policy.command("check")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_backend_option("Also check tables, columns and types against this database", required=False)
def policy_check(file: Path, backend: str | None) -> None:
    """Validate a policy file (and, with --backend, against the live schema)."""
    from dpproxy.backends import open_backend
    from dpproxy.policy import check_against_schema, load_policy, reference_warnings

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
                foreign_keys: dict[str, list[tuple[str, str, str]]] = {}
                for schema in {t.schema for t in loaded.tables}:
                    tables = db.tables(schema)
                    live.update(
                        {
                            t.name: tables[t.name]
                            for t in loaded.tables
                            if t.schema == schema and t.name in tables
                        }
                    )
                    for table, fks in _foreign_keys(db, schema).items():
                        foreign_keys.setdefault(table, []).extend(fks)
                ceilings = _ceiling_warnings(db, loaded, live) + _bounds_warnings(db, loaded, live)
            for warning in [*reference_warnings(loaded, foreign_keys), *ceilings]:
                click.echo(f"  warning: {warning}")
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
@_backend_option("Database to read tables and columns from", required=True)
@click.option(
    "--schema",
    default=None,
    help="Schema to read (on Spark: the database) [default: the backend's default: public, main or default].",
)
def policy_init(backend: str, schema: str | None) -> None:
    """Print a draft policy for a database's tables, to edit and check (it reads, with your
    connection, the most rows one person has and where each column's values lie)."""
    from dpproxy.backends import open_backend
    from dpproxy.policy import draft_policy

    def action() -> None:
        with open_backend(backend) as db:
            tables = db.tables(schema)
            prefix = f"{schema}." if schema and schema != db.default_schema else ""
            # The draft reaches persons through foreign keys, keyed as the tables are.
            foreign_keys = {
                prefix + table: [(column, prefix + target, referenced) for column, target, referenced in fks]
                for table, fks in _foreign_keys(db, schema).items()
            }
            if prefix:  # the draft names the schema on each table
                tables = {prefix + name: columns for name, columns in tables.items()}
            most_rows = _most_rows_reader(db, schema)
            ranges = _value_range_reader(db, schema, tables)
            click.echo(
                draft_policy(
                    tables,
                    foreign_keys=foreign_keys,
                    most_rows=most_rows,
                    value_ranges=ranges,
                    unitless_rows=_unitless_rows_reader(db, schema),
                )
            )

    _run(action)


# A rows ceiling this many times the most rows one person has is called far above it.
FAR_ABOVE = 2


def _ceiling_warnings(db: Backend, loaded: Policy, live: Mapping[str, object]) -> list[str]:
    """A warning for each protected table whose rows ceiling is far above the most rows one person
    has (counted with the data owner's connection): with bounds chosen per query, counts over public
    keys, quantiles of a whole table and private groups keep k at or above a quarter of the ceiling
    (docs/privacy.md §3), so such a ceiling costs accuracy."""
    from dpproxy.policy import drafting

    warnings = []
    for table in loaded.tables:
        unit = table.privacy_unit
        if table.public or unit is None or table.unit_reference is not None or table.name not in live:
            continue
        if table.contribution_bounds != "chosen" or table.max_rows_per_unit <= 1:
            continue
        most = _most_rows_reader(db, table.schema)(table.name, unit)
        if most is None or table.max_rows_per_unit < FAR_ABOVE * most:
            continue
        warnings.append(
            f"tables.{table.name}.max_rows_per_unit is {table.max_rows_per_unit}, and the most rows one "
            f"person has in {table.name} is {most}: with bounds chosen per query many queries keep at "
            f"least a quarter of the ceiling per person, so a ceiling this far above costs accuracy; "
            f"write max_rows_per_unit: {drafting.rows_ceiling(most)} (the count rounded up to a power "
            "of two: analysts see the ceiling)"
        )
    return warnings


def _bounds_warnings(db: Backend, loaded: Policy, live: Mapping[str, Sequence[LiveColumnLike]]) -> list[str]:
    """A warning for each summable number column of a protected table whose declared range is far
    wider (FAR_ABOVE times or more) than where 99% of its values lie (read with the data owner's
    connection, as `policy init` reads them): the noise of its SUM and AVG grows with upper - lower.
    Nothing is said when those values are all one value (a column of mostly zeros would be cut to
    them), and the warning says that values outside the bounds are clipped: the owner decides."""
    from dpproxy.policy.drafting import TYPICAL_SHARE, value_text

    warnings = []
    for table in loaded.tables:
        if table.public or table.name not in live:
            continue
        columns = [
            c
            for c in table.columns
            if c.type.is_number and c.summable and c.bounded and c.name != table.privacy_unit
        ]
        if not columns:
            continue
        found = _value_range_reader(db, table.schema, live)(table.name, [c.name for c in columns])
        for column in columns:
            where = found.get(column.name)
            if where is None or where.low is None or where.high is None:
                continue
            low, high = Decimal(str(where.low)), Decimal(str(where.high))
            assert isinstance(column.lower, Decimal) and isinstance(column.upper, Decimal)
            declared = column.upper - column.lower
            if not (low.is_finite() and high.is_finite()):  # NaN or infinities among the values
                continue
            if high <= low or declared < FAR_ABOVE * (high - low):
                continue
            typical = f"[{value_text(where.low)}, {value_text(where.high)}]"
            warnings.append(
                f"tables.{table.name}.columns.{column.name}: lower..upper is [{column.lower}, "
                f"{column.upper}], {declared / (high - low):.0f} times as wide as where {TYPICAL_SHARE} of "
                f"its values lie, {typical}: an average's noise grows with upper - lower (a sum's with the "
                "larger of |lower| and |upper|), and bounds near that range shrink it as much, but values "
                "outside the bounds are clipped (check that what lies beyond matters little)"
            )
    return warnings


def _most_rows_reader(db: Backend, schema: str | None) -> Callable[[str, str], int | None]:
    """The most rows one person has in a table (keyed as the draft keys it), counted by the data
    owner's own connection for the draft's `max_rows_per_unit`; None when the count fails (a view
    that cannot be read, a timeout): the draft then keeps its restrictive 1."""

    def most_rows(table: str, unit: str) -> int | None:
        per_person = (
            exp.select(exp.alias_(exp.Count(this=exp.Star()), "n"))
            .from_(_source(table, schema))
            .where(exp.column(unit, quoted=True).is_(exp.null()).not_())
            .group_by(exp.column(unit, quoted=True))
            .subquery("per_person")
        )
        row = _first_row(db, exp.select(exp.Max(this=exp.column("n"))).from_(per_person))
        return int(row[0]) if row is not None and row[0] is not None else None  # type: ignore[call-overload]

    return most_rows


def _source(table: str, schema: str | None) -> exp.Table:
    """A table keyed as the draft keys it (`schema.table` or `table`), in `schema`, quoted."""
    return exp.table_(table.rpartition(".")[2], db=schema or None, quoted=True)


def _first_row(db: Backend, select: exp.Select) -> Sequence[object] | None:
    """The first row of a statement the data owner's own connection runs for a draft or a check, or
    None when it fails (a view that cannot be read, a timeout: the draft or check is still made)."""
    from dpproxy.backends import BackendError

    try:
        rows = db.run(select.sql(dialect=db.dialect))
    except BackendError:
        return None
    return rows[0] if rows else None


# A draft says where this share of a number column's values lie: between these two quantiles.
TYPICAL_QUANTILES = (0.005, 0.995)


def _value_range_reader(
    db: Backend, schema: str | None, tables: Mapping[str, Sequence[LiveColumnLike]]
) -> Callable[[str, Sequence[str]], Mapping[str, ValueRange]]:
    """Where the values of a table's number, date and time columns lie (keyed as the draft keys
    tables), read in one statement per table by the data owner's own connection, for the comments
    that help them choose `lower` and `upper`: the least, the most, and for numbers the quantiles
    TYPICAL_QUANTILES (approximate on Spark). An empty mapping when the statement fails (a view that
    cannot be read, a timeout): the draft then says nothing about the values."""
    from dpproxy.policy import ValueRange

    def value_ranges(table: str, columns: Sequence[str]) -> Mapping[str, ValueRange]:
        types = {c.name: c.type for c in tables.get(table, ())}
        selected: list[exp.Expression] = []
        for column in columns:
            ref = exp.column(column, quoted=True)
            selected += [exp.Min(this=ref.copy()), exp.Max(this=ref.copy())]
            column_type = types.get(column)
            if column_type is not None and column_type.is_number:  # read in this order below
                selected += [
                    exp.WithinGroup(
                        this=exp.PercentileDisc(this=exp.Literal.number(q)),
                        expression=exp.Order(expressions=[exp.Ordered(this=ref.copy())]),
                    )
                    for q in TYPICAL_QUANTILES
                ]
        row = _first_row(db, exp.select(*selected).from_(_source(table, schema)))
        if row is None:
            return {}
        values = iter(row)
        found: dict[str, ValueRange] = {}
        for column in columns:
            least, most = next(values), next(values)
            column_type = types.get(column)
            low = high = None
            if column_type is not None and column_type.is_number:
                low, high = next(values), next(values)
            if least is not None and most is not None:  # no value, nothing to say
                found[column] = ValueRange(least, most, low, high)
        return found

    return value_ranges


def _unitless_rows_reader(db: Backend, schema: str | None) -> Callable[[str, str], int | None]:
    """How many rows of a table have no unit (NULL), counted by the data owner's own connection for
    the draft's note; None when the count fails."""

    def unitless_rows(table: str, unit: str) -> int | None:
        count = exp.select(exp.Count(this=exp.Star())).from_(_source(table, schema))
        row = _first_row(db, count.where(exp.column(unit, quoted=True).is_(exp.null())))
        return int(row[0]) if row is not None and row[0] is not None else None  # type: ignore[call-overload]

    return unitless_rows


def _foreign_keys(db: Backend, schema: str | None) -> dict[str, list[tuple[str, str, str]]]:
    """`schema`'s one-column foreign keys to tables of the same schema, per table: (column,
    referenced table, referenced column), as the backend declares them (none on Spark)."""
    own = schema or db.default_schema
    found: dict[str, list[tuple[str, str, str]]] = {}
    for c in db.structure(schema).constraints:
        one = len(c.columns) == 1 and len(c.referenced_columns) == 1
        if c.kind == "f" and one and c.referenced_table and (c.referenced_schema or own) == own:
            found.setdefault(c.table, []).append((c.columns[0], c.referenced_table, c.referenced_columns[0]))
    return found


@policy.command("reload")
@click.option(
    "--pid-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The file `dpproxy serve --pid-file` wrote.",
)
@click.option("--pid", type=click.IntRange(min=1), default=None, help="The process id of `dpproxy serve`.")
@seconds_option("--timeout", 120.0, "Seconds to wait for the server's answer.")
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
