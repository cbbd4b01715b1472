"""One record per statement an analyst sends: what the audit log stores, the metrics count and the
logs are tagged with.

This module owns the record's shape and the context variable that names the statement being handled
(its session id and statement id tag every log line written while it runs). The wire session creates
a record when a statement arrives and finishes it when the answer has been sent; the engine fills in
what only it knows (the kind, the cost charged, whether the answer was replayed, the rows released,
the time of each stage); the ledger writes it — in the same transaction as the charge when the
statement was charged (dpproxy.budget), on its own otherwise.

A record holds the statement's text and its parameters as the analyst sent them (parameters apart
from the text), never a value read from a protected table: the rows released are counted, not kept.
"""

from __future__ import annotations

import json
import logging
import queue
import secrets
import threading
import time
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from dpproxy.errors import failure
from dpproxy.privacy.accounting import Cost

if TYPE_CHECKING:
    from dpproxy.budget import Ledger

__all__ = [
    "ABANDONED",
    "CURRENT",
    "RUNNING",
    "AuditEntry",
    "AuditLog",
    "StatementRecord",
    "Status",
    "new_session_id",
]

log = logging.getLogger("dpproxy.audit")

# What a stored record's status may also say, besides a Status: "running" while its charge is
# reserved (written with the reservation), "abandoned" when its process died meanwhile (written
# with the ledger entry's abandonment: its cost stays spent).
RUNNING = "running"
ABANDONED = "abandoned"
STORED_STATUSES = ("ok", "refused", "failed", RUNNING, ABANDONED)


class Status(StrEnum):
    OK = "ok"  # answered
    REFUSED = "refused"  # an error decided before any data was read (policy, budget, syntax, …)
    FAILED = "failed"  # an error after the backend was reached (backend failure, cancel, time limit)


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

    def error(self, sqlstate: str | None) -> None:
        """The statement ends with an error: failed if the backend was reached, else refused."""
        self.status = Status.FAILED if self.reached else Status.REFUSED
        self.sqlstate = sqlstate

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
    status: str  # a Status value, or RUNNING / ABANDONED
    sqlstate: str | None
    cost: Cost
    replayed: bool
    rows: int
    duration: float | None
    stages: dict[str, float] = field(hash=False)
    entry_id: int | None = None  # the ledger entry of its charge, if it was charged

    @property
    def charged(self) -> bool:
        return self.entry_id is not None


class AuditLog:
    """Writes the records of statements that charged nothing (and the final state of those that
    did) to the ledger, in batches, from a thread of its own: the event loop never waits for it.
    Also deletes records older than the retention (`retention_days`, 0: keep them) when started
    and once a day.

    A record that was charged already has its row (written with the reservation); what is
    submitted for it afterwards only completes it (the wire stage, the final duration and status).
    """

    BATCH = 512
    LINGER = 0.05  # seconds a batch waits for more records
    PRUNE_EVERY = 86400.0

    def __init__(self, ledger: Ledger, *, retention_days: int = 0) -> None:
        self.ledger = ledger
        self.retention_days = retention_days
        self._queue: queue.SimpleQueue[StatementRecord | threading.Event | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._next_prune = 0.0

    def submit(self, record: StatementRecord) -> None:
        """Queue a finished record for writing. Cheap; never raises."""
        if self._closed:
            return
        if self._thread is None:
            self._start()
        self._queue.put(record)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every record submitted so far is written."""
        if self._thread is None:
            return
        done = threading.Event()
        self._queue.put(done)
        done.wait(timeout)

    def close(self) -> None:
        """Write what is queued, then stop."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(60)

    def prune(self) -> int:
        """Delete records older than the retention now; how many."""
        if self.retention_days <= 0:
            return 0
        return self.ledger.prune_audit(datetime.now(UTC) - timedelta(days=self.retention_days))

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="dpproxy-audit", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            self._maybe_prune()
            try:
                item = self._queue.get(timeout=60.0)
            except queue.Empty:
                continue
            batch: list[StatementRecord] = []
            waiters: list[threading.Event] = []
            stop = False
            # Gather for a moment: one transaction per LINGER seconds, not one per statement.
            deadline = time.monotonic() + self.LINGER
            while True:
                if item is None:
                    stop = True
                elif isinstance(item, threading.Event):
                    waiters.append(item)
                else:
                    batch.append(item)
                if len(batch) >= self.BATCH or stop or waiters:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    item = self._queue.get(timeout=left)
                except queue.Empty:
                    break
            if batch:
                self._write(batch)
            for waiter in waiters:
                waiter.set()
            if stop:
                return

    def _write(self, batch: Sequence[StatementRecord]) -> None:
        try:
            self.ledger.audit_write(batch)
        except Exception as error:
            # The records are lost, not the statements' answers; the operator's log says so (the
            # error's type and place: its text could quote a statement's parameters).
            log.error("could not write %d audit records: %s", len(batch), failure(error))

    def _maybe_prune(self) -> None:
        now = time.monotonic()
        if now < self._next_prune:
            return
        self._next_prune = now + self.PRUNE_EVERY
        try:
            pruned = self.prune()
        except Exception as error:
            log.error("could not delete old audit records: %s", failure(error))
            return
        if pruned:
            log.info("deleted %d audit records older than %d days", pruned, self.retention_days)


def entry_parameters(text: str | None) -> tuple[Any, ...]:
    """A stored record's parameters, read back from their JSON text."""
    if not text:
        return ()
    try:
        value = json.loads(text)
    except ValueError:
        return (text,)
    return tuple(value) if isinstance(value, list) else (value,)


# The statement being handled in this context (set by the wire session, copied into the worker
# threads that run it): log records written meanwhile carry its session id and statement id.
CURRENT: ContextVar[StatementRecord | None] = ContextVar("dpproxy_statement", default=None)
