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

import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

from dpproxy.privacy.accounting import Cost

__all__ = ["CURRENT", "StatementRecord", "Status"]


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

    def add_stage(self, stage: str, seconds: float) -> None:
        self.stages[stage] = self.stages.get(stage, 0.0) + seconds

    def finish(self) -> None:
        if self.duration is None:
            self.duration = time.perf_counter() - self.started


# The statement being handled in this context (set by the wire session, copied into the worker
# threads that run it): log records written meanwhile carry its session id and statement id.
CURRENT: ContextVar[StatementRecord | None] = ContextVar("dpproxy_statement", default=None)
