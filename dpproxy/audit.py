"""One record per statement an analyst sends: what the audit log stores, the metrics count and the
logs are tagged with.

This module owns the record's shape (`StatementRecord` while the statement runs, `AuditEntry` as it
is read back), its one status enum, the audit table's columns and how a record fills them, the
filters of an audit query (and how a since/until filter is written), and the context variable that
names the statement being handled (its session id and statement id tag every log line written while
it runs). The wire session creates a record when a statement arrives and finishes it when the answer
has been sent; the engine fills in what only it knows (the kind, the cost charged, whether the
answer was replayed, the rows released, the time of each stage); the ledger writes it — in the same
transaction as the charge when the statement was charged (dpproxy.budget), on its own otherwise
(dpproxy.audit_log, the writer thread).

It imports nothing of dpproxy but a cost's type: every module below the engine (the ledger, the
logs, the metrics) may import it.

A record holds the statement's text and its parameters as the analyst sent them (parameters apart
from the text), never a value read from a protected table: the rows released are counted, not kept.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from dpproxy.errors import DPProxyError, InternalError
from dpproxy.privacy.accounting import Cost

__all__ = [
    "ABANDONED",
    "AUDIT_COLUMNS",
    "AUDIT_FINISH_COLUMNS",
    "CURRENT",
    "KINDS",
    "RUNNING",
    "STORED_STATUSES",
    "AuditEntry",
    "AuditQuery",
    "StatementRecord",
    "Status",
    "audit_entry",
    "audit_finish_values",
    "audit_values",
    "new_session_id",
    "parse_moment",
]


class Status(StrEnum):
    """How a statement ended, and what its stored record says meanwhile."""

    OK = "ok"  # answered
    REFUSED = "refused"  # an error decided before any data was read (policy, budget, syntax, …)
    FAILED = "failed"  # an error after the backend was reached (backend failure, cancel, time limit)
    # Stored only: "running" while its charge is reserved (written with the reservation), "abandoned"
    # when its process died meanwhile (written with the ledger entry's abandonment: its cost stays
    # spent).
    RUNNING = "running"
    ABANDONED = "abandoned"


# What a record's kind may say: the router's kinds of statement, the engine's split of its own,
# "query" for a statement refused before either could tell, and "operator" for an operator's action
# (a budget reset, a policy reload, a console login). `dpproxy audit --kind`, the console's filter.
KINDS = (
    "private",
    "public",
    "constant",
    "empty",
    "catalog",
    "session",
    "transaction",
    "cursor",
    "explain",
    "copy",
    "prepared",
    "query",
    "operator",
)

RUNNING = Status.RUNNING.value
ABANDONED = Status.ABANDONED.value
# What a stored record's status may say: the audit table's CHECK, `dpproxy audit --status`, the
# console's filter.
STORED_STATUSES = tuple(status.value for status in Status)


@dataclass
class StatementRecord:
    """One statement, from its arrival to its answer. Mutable while the statement runs; written once."""

    analyst: str
    statement: str
    parameters: tuple[object, ...] = ()
    client: str = ""  # "host:port" of the client, "local" for the CLI and the Python API
    session_id: str = ""
    statement_id: int = 0
    at: datetime = field(default_factory=lambda: datetime.now(UTC))
    # What the statement was: private, public, constant, empty, catalog, session, transaction,
    # cursor, explain, copy, prepared (the router's kinds, with the engine's split of its own).
    kind: str = ""
    status: Status = Status.OK
    sqlstate: str | None = None
    # The error's message as the analyst read it (dpproxy's own text: it never quotes a value from a
    # protected table, and a backend's message is never passed on).
    message: str | None = None
    cost: Cost = Cost.ZERO  # charged to the analyst's budget
    replayed: bool = False
    rows: int = 0  # rows released to the client
    # Seconds spent in each stage: "plan" (parse, analyse, rewrite, plan the noise), "backend",
    # "noise" (release and post-processing), "wire" (encoding and sending).
    stages: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    duration: float | None = None  # seconds, set when finished
    # Whether a statement was sent to the backing database (set by the engine): an error after it
    # is "failed", before it "refused".
    reached: bool = False
    # The stored row, once written (with its charge: by the ledger's reserve), and the ledger entry
    # of its charge, if any.
    audit_id: int | None = None
    entry_id: int | None = None

    def add_stage(self, stage: str, seconds: float) -> None:
        self.stages[stage] = self.stages.get(stage, 0.0) + seconds

    def finish(self) -> None:
        if self.duration is None:
            self.duration = time.perf_counter() - self.started

    def error(self, sqlstate: str | None, message: str | None = None) -> None:
        """The statement ends with an error: failed if the backend was reached, else refused."""
        self.status = Status.FAILED if self.reached else Status.REFUSED
        self.sqlstate = sqlstate
        if message is not None:
            self.message = message

    def failed(self, error: BaseException) -> None:
        """The statement ends with `error`: its SQLSTATE and message when it is one of ours (they
        never hold protected values), else only the internal error's SQLSTATE."""
        if isinstance(error, DPProxyError):
            self.error(error.sqlstate, error.message)
        else:
            self.error(InternalError.sqlstate)

    def parameters_json(self) -> str:
        """The parameters as JSON text: numbers, strings, booleans and NULL as such, anything else
        (dates, decimals, bytes) as its text."""
        return json.dumps([_json_value(v) for v in self.parameters], ensure_ascii=False)

    def stages_json(self) -> str:
        return json.dumps({k: round(v, 9) for k, v in self.stages.items()}, sort_keys=True)


def _json_value(value: object) -> object:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return "\\x" + bytes(value).hex()
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    return str(value)


def new_session_id() -> str:
    """A session id unique across worker processes and restarts: random, 16 hex digits."""
    return secrets.token_hex(8)


@dataclass(frozen=True)
class AuditEntry:
    """One stored record, as `Ledger.audit_entries` reads it back."""

    id: int
    at: datetime
    analyst: str
    client: str
    session_id: str
    statement_id: int
    statement: str
    parameters: tuple[object, ...]
    kind: str
    status: str  # a Status value
    sqlstate: str | None
    cost: Cost
    replayed: bool
    rows: int
    duration: float | None
    stages: dict[str, float] = field(hash=False)
    entry_id: int | None = None  # the ledger entry of its charge, if it was charged
    message: str | None = None  # a refused or failed statement's error message (schema 5 on)

    @property
    def charged(self) -> bool:
        return self.entry_id is not None


# The audit table's columns, in the order audit_values gives them and audit_entry reads them.
AUDIT_COLUMNS = (
    "at",
    "analyst",
    "client",
    "session_id",
    "statement_id",
    "statement",
    "parameters",
    "kind",
    "status",
    "sqlstate",
    "message",
    "epsilon",
    "delta",
    "rho",
    "replayed",
    "rows",
    "duration",
    "stages",
    "entry_id",
)

# What finishing a record changes (by its row id): from its status to its stages.
AUDIT_FINISH_COLUMNS = AUDIT_COLUMNS[AUDIT_COLUMNS.index("status") : AUDIT_COLUMNS.index("entry_id")]


def audit_values(record: StatementRecord, *, status: str | None = None) -> tuple[Any, ...]:
    """A record as the audit table's row (AUDIT_COLUMNS order; `at` as a datetime)."""
    cost = record.cost
    return (
        record.at,
        record.analyst,
        record.client,
        record.session_id,
        record.statement_id,
        record.statement,
        record.parameters_json(),
        record.kind,
        status or str(record.status),
        record.sqlstate,
        record.message,
        float(cost.epsilon),
        float(cost.delta),
        float(cost.rho),
        bool(record.replayed),
        int(record.rows),
        record.duration,
        record.stages_json(),
        record.entry_id,
    )


def audit_finish_values(record: StatementRecord) -> tuple[Any, ...]:
    """A record's AUDIT_FINISH_COLUMNS."""
    values = dict(zip(AUDIT_COLUMNS, audit_values(record), strict=True))
    return tuple(values[c] for c in AUDIT_FINISH_COLUMNS)


def audit_entry(row: Sequence[Any], at: datetime) -> AuditEntry:
    """An AuditEntry from a row of (id, *AUDIT_COLUMNS); `at` already read as an aware datetime."""
    values = dict(zip(("id", *AUDIT_COLUMNS), row, strict=True))
    try:
        stages = json.loads(values["stages"] or "{}")
    except ValueError:
        stages = {}
    return AuditEntry(
        id=int(values["id"]),
        at=at,
        analyst=values["analyst"],
        client=values["client"],
        session_id=values["session_id"],
        statement_id=int(values["statement_id"]),
        statement=values["statement"],
        parameters=_entry_parameters(values["parameters"]),
        kind=values["kind"],
        status=values["status"],
        sqlstate=values["sqlstate"],
        message=values["message"],
        cost=Cost(values["epsilon"], values["delta"], values["rho"]),
        replayed=bool(values["replayed"]),
        rows=int(values["rows"]),
        duration=values["duration"],
        stages=stages,
        entry_id=values["entry_id"],
    )


def _entry_parameters(text: str | None) -> tuple[Any, ...]:
    """A stored record's parameters, read back from their JSON text."""
    if not text:
        return ()
    try:
        value = json.loads(text)
    except ValueError:
        return (text,)
    return tuple(value) if isinstance(value, list) else (value,)


@dataclass(frozen=True)
class AuditQuery:
    """Which stored records to read: of one analyst, at or after `since`, before `until`, with this
    status and kind; the newest `limit`. Checked when made (ValueError)."""

    analyst: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    status: str | None = None
    limit: int = 1000
    # One kind (KINDS), or "!kind" for every kind but that one (the console's "all but catalog").
    kind: str | None = None

    def __post_init__(self) -> None:
        limit = self.limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be an integer >= 0, not {limit!r}")
        if self.status is not None and self.status not in STORED_STATUSES:
            raise ValueError(f"status must be one of {', '.join(STORED_STATUSES)}, not {self.status!r}")
        if self.kind is not None and self.kind.removeprefix("!") not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        for name, moment in (("since", self.since), ("until", self.until)):
            if moment is not None and (not isinstance(moment, datetime) or moment.tzinfo is None):
                raise ValueError(f"{name} must be a datetime with a time zone, not {moment!r}")

    def conditions(self) -> list[tuple[str, str, Any]]:
        """(column, operator, value) of each filter given; a record must meet them all."""
        given = (
            ("analyst", "=", self.analyst),
            ("at", ">=", self.since),
            ("at", "<", self.until),
            ("status", "=", self.status),
            (
                "kind",
                "<>" if (self.kind or "").startswith("!") else "=",
                (self.kind or "").removeprefix("!") or None,
            ),
        )
        return [condition for condition in given if condition[2] is not None]


def parse_moment(text: str) -> datetime | None:
    """A since/until filter as written (`dpproxy audit --since`, the console's audit page): an ISO 8601
    date or date and time, UTC unless it says otherwise; None if blank. ValueError when malformed."""
    text = text.strip()
    if not text:
        return None
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


# The statement being handled in this context (set by the wire session, copied into the worker
# threads that run it): log records written meanwhile carry its session id and statement id.
CURRENT: ContextVar[StatementRecord | None] = ContextVar("dpproxy_statement", default=None)
