"""The records a session keeps: its phase and transaction status, what a statement produced
(Outcome), prepared statements and portals.

Data only: nothing here acts on a message, runs a statement or encodes bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from dpproxy.backends import Cancellation
from dpproxy.results import ResultStream
from dpproxy.wire.codec import ErrorResponse
from dpproxy.wire.router import Statement
from dpproxy.wire.types import WireColumn


class TransactionStatus(StrEnum):
    IDLE = "I"
    IN_BLOCK = "T"
    FAILED = "E"


class Phase(StrEnum):
    STARTUP = "startup"
    AUTHENTICATING = "authenticating"
    READY = "ready"
    CLOSED = "closed"


@dataclass
class Outcome:
    """What running one statement produced, before it is encoded for the client."""

    tag: str
    columns: tuple[WireColumn, ...] | None = None  # None: no result set (CommandComplete only)
    rows: list[tuple[object, ...]] = field(default_factory=list)
    notices: list[ErrorResponse] = field(default_factory=list)
    empty: bool = False  # an empty query string: EmptyQueryResponse
    formats: tuple[int, ...] = ()  # result formats chosen by the statement itself (BINARY cursors)
    counted: bool = False  # tag takes the row count ("SELECT n", "FETCH n")
    copy: list[bytes] | None = None  # COPY … TO STDOUT: CopyData payloads (copyout.py: header, rows…)
    copy_width: int = 0  # COPY: the number of columns CopyOutResponse announces
    copy_format: int = 0  # COPY: the format CopyOutResponse announces, 0 text (and CSV) or 1 binary
    # A private answer released in batches (rows stays empty): the session sends each batch as it
    # comes, then the notice and "SELECT n"; `cancel` interrupts it until it is sent.
    stream: ResultStream | None = None
    cancel: Cancellation | None = None


# A prepared statement's result columns when they depend on a cursor (FETCH): resolved late.
FROM_CURSOR = "from cursor"


@dataclass
class PreparedStatement:
    name: str
    statement: Statement
    parameter_oids: tuple[int, ...]
    columns: tuple[WireColumn, ...] | str | None  # str: FROM_CURSOR
    text: str = ""  # as the client sent it (Parse, PREPARE), for the audit records of its executions


@dataclass
class Portal:
    """A Bind's portal or a DECLAREd cursor (they share one namespace, as in PostgreSQL)."""

    name: str
    prepared: PreparedStatement | None
    parameters: list[object]
    formats: tuple[int, ...]
    columns: tuple[WireColumn, ...] | None
    holdable: bool = False
    cursor: bool = False
    outcome: Outcome | None = None
    position: int = 0
    done: bool = False


def expand_formats(formats: Sequence[int], count: int) -> tuple[int, ...]:
    """A Bind's (or a cursor's) format codes, one per column: none means text, one means all."""
    if not formats:
        return (0,) * count
    if len(formats) == 1:
        return (formats[0],) * count
    return tuple(formats)
