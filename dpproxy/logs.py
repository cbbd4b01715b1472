"""The server's logs: text for a terminal or JSON lines for a log collector, every line tagged with the
statement being handled.

This module owns the log format (`configure`, `serve/demo --log-format`) and the one line written per
finished statement (`statement_logged`, at INFO). Each line carries its time, level, logger, message
and process, and — when written while a statement is handled, on the event loop or in a worker thread
(dpproxy.wire.server runs blocking calls in a copy of the caller's context) — that statement's session
id and statement id, read from `dpproxy.audit.CURRENT`.

It never logs a statement's text, its parameters or a value read from the data: the per-statement line
holds the kind, outcome, SQLSTATE, rows released (a count), cost and duration only. What other modules
log is theirs to keep free of data (see docs/architecture.md).
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

from pythonjsonlogger.json import JsonFormatter

from dpproxy.audit import CURRENT, StatementRecord

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "StatementContext", "configure", "statement_logged"]

LOG_FORMATS: tuple[str, ...] = ("text", "json")
LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error")

statements_log = logging.getLogger("dpproxy.statements")


class StatementContext(logging.Filter):
    """Adds `session_id` and `statement_id` to every record: the statement being handled in the
    record's context (dpproxy.audit.CURRENT), unless the call gave them (`extra=`); empty otherwise."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "session_id"):
            current = CURRENT.get()
            record.session_id = current.session_id if current is not None else None
            record.statement_id = current.statement_id if current is not None else None
        return True


class _Json(JsonFormatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, process, session_id,
    statement_id, the worker's index (with --workers), then any `extra=` fields of the call."""

    def __init__(self, worker: int | None) -> None:
        super().__init__(
            ["message"],
            static_fields={} if worker is None else {"worker": worker},
            json_ensure_ascii=False,
        )

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        log_data["time"] = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        log_data["level"] = record.levelname
        log_data["logger"] = record.name
        super().add_fields(log_data, record, message_dict)
        log_data["process"] = record.process
        log_data["session_id"] = getattr(record, "session_id", None)
        log_data["statement_id"] = getattr(record, "statement_id", None)


class _Text(logging.Formatter):
    """`dpproxy: WARNING message [session S statement N]` (`dpproxy[worker i]: …` in a worker)."""

    def __init__(self, worker: int | None) -> None:
        prefix = "dpproxy" if worker is None else f"dpproxy[worker {worker}]"
        super().__init__(f"{prefix}: %(levelname)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        session = getattr(record, "session_id", None)
        if session:
            text += f" [session {session} statement {getattr(record, 'statement_id', None)}]"
        return text


def configure(log_format: str = "text", level: str = "warning", *, worker: int | None = None) -> None:
    """Send the process's logs to stderr in `log_format` ("text" or "json") from `level` up, replacing
    any handler set before. `worker`: the worker process's index (wire/workers.py), shown on each line."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}")
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Json(worker) if log_format == "json" else _Text(worker))
    handler.addFilter(StatementContext())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level.upper())
    # A policy reload's outcome is always shown (its problems are errors anyway).
    logging.getLogger("dpproxy.reload").setLevel(min(logging.INFO, root.level))


def statement_logged(record: StatementRecord) -> None:
    """The INFO line for one finished statement (an EngineCatalogAuth hook): what it was and how it
    ended, never its text or a value."""
    if not statements_log.isEnabledFor(logging.INFO):
        return
    statements_log.info(
        "statement %s %s%s",
        record.kind or "?",
        record.status.value,
        f" {record.sqlstate}" if record.sqlstate else "",
        extra={
            "session_id": record.session_id,
            "statement_id": record.statement_id,
            "analyst": record.analyst,
            "kind": record.kind,
            "status": record.status.value,
            "sqlstate": record.sqlstate,
            "rows": record.rows,
            "epsilon": record.cost.epsilon,
            "delta": record.cost.delta,
            "replayed": record.replayed,
            "duration": record.duration,
        },
    )
