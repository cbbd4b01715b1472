"""`dpproxy audit`: the audit log read from the ledger, as a table, CSV or JSON (`format_audit`).

What an analyst wrote is shown so that it never drives the operator's terminal (control characters
escaped) nor a spreadsheet (formula-like CSV cells quoted).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import click

from dpproxy.audit import AUDIT_COLUMNS, KINDS, STORED_STATUSES, AuditEntry, parse_moment
from dpproxy.cli.common import _ledger_spec, _run, format_table, ledger_option


def _moment(value: str | None, name: str) -> datetime | None:
    """--since/--until: an ISO 8601 date or date and time; without a zone, UTC (audit.parse_moment)."""
    if value is None:
        return None
    try:
        moment = parse_moment(value)
    except ValueError:
        moment = None
    if moment is None:  # malformed, or blank
        raise click.BadParameter(
            f"{value!r} is not an ISO 8601 date or time (write e.g. 2026-03-01 or 2026-03-01T14:30)",
            param_hint=name,
        )
    return moment


# The CSV and JSON fields: the audit table's columns, the long texts last (a terminal or a spreadsheet
# shows the short ones first).
_LAST = ("statement", "parameters", "stages", "entry_id")
_AUDIT_FIELDS = (*(c for c in AUDIT_COLUMNS if c not in _LAST), *_LAST)


@click.command("audit")
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
    type=click.Choice(STORED_STATUSES),
    default=None,
    help="Only statements that ended so.",
)
@click.option(
    "--kind",
    type=click.Choice(KINDS),
    default=None,
    help="Only statements of this kind (operator: budget resets, policy reloads, console logins).",
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
    kind: str | None,
    fmt: str,
    limit: int,
) -> None:
    """The audit log: every statement analysts sent and every operator action, newest first, with
    what it cost."""
    from dpproxy.budget import open_ledger
    from dpproxy.engine import Engine

    start, end = _moment(since, "--since"), _moment(until, "--until")
    spec = _ledger_spec(ledger, policy_path, create=False)

    def action() -> None:
        if policy_path is not None:
            with Engine.open(policy_path, None, spec) as engine:
                assert engine.ledger is not None
                entries = engine.ledger.audit_entries(
                    analyst=analyst, since=start, until=end, status=status, limit=limit, kind=kind
                )
        else:
            with open_ledger(spec) as opened:
                entries = opened.audit_entries(
                    analyst=analyst, since=start, until=end, status=status, limit=limit, kind=kind
                )
        click.echo(format_audit(entries, fmt), nl=fmt != "csv")

    _run(action)


# C0 and C1 control characters (ESC, CSI, BEL, …) and the bidirectional overrides and isolates
# (U+202A–U+202E, U+2066–U+2069, which reorder what is shown) in an audit table's statement column.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# The same in a CSV cell, but for the line breaks and tabs a quoted cell holds.
_CSV_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escaped(text: str, pattern: re.Pattern[str] = _CONTROL) -> str:
    """What an analyst wrote, unable to drive the operator's terminal: those characters as \\x1b
    or \\u202e."""
    return pattern.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


# What a spreadsheet reads as a formula at the start of a cell (OWASP, "CSV Injection").
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: object) -> object:
    """A CSV cell a spreadsheet shows as text: an analyst's `=HYPERLINK(…)` (or any text starting
    with = + - @, a tab or a carriage return) gets a leading single quote, as OWASP advises, so that
    opening the export never evaluates what an analyst wrote. Numbers are left as they are."""
    if isinstance(value, str):
        value = _escaped(value, _CSV_CONTROL)  # a CSV export is read in terminals too
        if value.startswith(_FORMULA_START):
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
            "message": entry.message,
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
        text = _escaped(text)
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
