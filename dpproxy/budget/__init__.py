"""The privacy-budget ledger: what each analyst has spent, kept persistently and changed atomically.

This package owns the ledger and the replay store. A query's cost is reserved before it runs
(refused with BudgetExhausted if it does not fit), committed once it has run, or released if it
never touched data. An analyst's spending is the exact sum of every entry that is reserved,
committed or abandoned. Only a released entry, whose query provably never ran, gives its cost back.
The sums are kept exactly (decimal arithmetic, no rounding) in a per-analyst totals row updated in
the same transaction as the entries, so a reservation reads one row, however long the history.

How costs compose (ρ and δ add up, the zCDP part is converted to ε once, for the whole history) is
dpproxy.budget.composition's job. This module holds the interface every store implements (Ledger),
what callers receive from it, and open_ledger, which picks the store: dpproxy.budget.sqlite or
dpproxy.budget.postgres.

Two stores share that contract: a SQLite file (the default, WAL mode, writes under BEGIN IMMEDIATE)
and a PostgreSQL table (a per-analyst advisory transaction lock). In both, no two reservations, from
threads or from separate processes sharing the store, can together overspend.

Crash safety: every ledger instance is an *owner* that holds a lock for as long as it lives (an
flock'd file beside the SQLite file, a session advisory lock in PostgreSQL). A reservation whose
owner is gone was left by a process that died mid-query; its query may have read data, so on the
next open it is marked 'abandoned' and stays spent for good. Reservations of owners that are still
alive (another server process on the same store) are left alone.

Free replay. The store also keeps, per analyst, answers already released (`replay_put`), under a key
the engine derives from the policy, the normalised statement, its parameters, its ε and δ and the
operator's data epoch; a repeat of the same question gets the stored answer back (`replay_get`) and
pays nothing. This is privacy-safe: a stored answer is a function of a release that was already
charged to the same analyst, and handing it out again is post-processing, which costs no privacy.
Averaging repeats then gains nothing (the analyst sees the same noise), which is exactly why repeats
may be free. The key includes the data epoch, so once the operator declares new data a question is
answered afresh and charged; a stale answer, had one been served, would still reveal nothing new.
The key includes ε because an answer bought at one ε is not the answer asked for at another: its
noise, and the ± error shown with it, belong to the ε it was paid at. Keys are per analyst: an
answer released to one analyst is never handed to another, whose budget did not pay for it (and two
analysts sharing answers would make their budgets meaningless as separate limits). The store keeps
the newest `replay_limit` answers per analyst (REPLAY_LIMIT by default) so it cannot grow without
bound; an evicted answer is simply bought again.

Audit log. The store also keeps one record per statement an analyst sent (dpproxy.audit): a
charged statement's record is inserted in the same transaction as its reservation (status
"running"), finished in the same transaction as its commit or release, and marked "abandoned" in
the same transaction as its entry; so no charge is ever without its record, nor a record of a charge
without it. Records of statements that charged nothing are written on their own (`audit_write`).
`audit_entries` reads them back, `prune_audit` deletes old ones (never one whose charge is still
reserved).

The package never sees SQL beyond an opaque statement string kept for audit, never computes a
query's privacy cost (costs come from dpproxy.privacy, limits from the policy) and never reads or
builds a replay key or payload: both are opaque to it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Self

from dpproxy.audit import ABANDONED, RUNNING, AuditEntry, AuditQuery, StatementRecord
from dpproxy.budget.composition import Totals, epsilon_equivalent, float_down
from dpproxy.errors import DPProxyError
from dpproxy.policy import ACCOUNTING
from dpproxy.privacy.accounting import Cost

__all__ = [
    "ABANDONED",
    "REPLAY_LIMIT",
    "RUNNING",
    "SCHEMA_VERSION",
    "AuditEntry",
    "EntryStatus",
    "Ledger",
    "LedgerEntry",
    "Reservation",
    "epsilon_equivalent",
    "open_ledger",
]

# Version of the ledger's table layout, stored in the store's meta table. Bump it, and add a step to
# the store's migration, when the layout changes. 2: the per-analyst totals table. 3: ρ in the
# totals (zCDP composition) and the replay store. 4: the audit log.
SCHEMA_VERSION = 4

# Stored answers kept per analyst; older ones are evicted (and bought again if asked again).
REPLAY_LIMIT = 10_000

# Replay keys are hex digests the engine computes (e.g. SHA-256); anything else is a caller's bug.
_REPLAY_KEY = re.compile(r"[0-9a-f]{16,128}")


class EntryStatus(StrEnum):
    RESERVED = "reserved"  # the query may be running: counted as spent
    COMMITTED = "committed"  # the query ran: spent for good
    RELEASED = "released"  # the query never touched data: not counted
    ABANDONED = "abandoned"  # its process died while it was reserved: spent for good


@dataclass(frozen=True)
class Reservation:
    """A cost held for one query; hand it back to commit or release exactly once."""

    id: int
    analyst: str
    cost: Cost
    # The analyst's spending with this reservation included, for the notice after the query: Σε of
    # entries with ρ = 0, Σδ, Σρ. Its ε-equivalent is epsilon_equivalent(spent, limit).
    spent: Cost | None = None
    # The statement's audit record, written with the reservation and finished with it.
    record: StatementRecord | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class LedgerEntry:
    id: int
    analyst: str
    epsilon: float
    delta: float
    status: str  # an EntryStatus value
    statement: str
    created_at: datetime
    finished_at: datetime | None
    rho: float = 0.0  # entries written before schema 3 have none

    @property
    def cost(self) -> Cost:
        return Cost(self.epsilon, self.delta, self.rho)

    @property
    def counts_as_spent(self) -> bool:
        return self.status != EntryStatus.RELEASED


class Ledger(ABC):
    """Per-analyst privacy spending and stored answers. Thread-safe; several processes may share one store."""

    def reserve(
        self,
        analyst: str,
        cost: Cost,
        limit: Cost,
        *,
        statement: str = "",
        accounting: str = "pure",
        record: StatementRecord | None = None,
    ) -> Reservation:
        """Hold `cost` for one query if everything spent so far plus `cost` fits within `limit`.

        Atomic with every other reservation on the same store. Raises BudgetExhausted, leaving the
        ledger unchanged, when it does not fit (ε-equivalent within ε, Σδ within δ: see
        dpproxy.budget.composition).
        `accounting` is the policy's `defaults.accounting`: under "pure" a cost may not carry ρ (the
        engine charges Gaussian noise as its (ε, δ) conversion); under "zcdp" it may (then its ε is
        for display and not charged), and the refusal message speaks of ρ as well as ε.
        `record`: the statement's audit record, inserted (status "running", this cost) in the same
        transaction as the entry; its audit_id and entry_id are set. Not written when refused. A
        caller that gives none gets a record of the statement alone (client "local"): no charge is
        ever written without one.
        """
        _check_analyst(analyst)
        _check_accounting(accounting)
        _check_amount(cost, "cost", allow_infinite=False)
        _check_amount(limit, "limit", allow_infinite=True)
        if not isinstance(statement, str):
            raise TypeError(f"statement must be a str, not {type(statement).__name__}")
        if accounting == "pure" and cost.rho > 0:
            raise ValueError(
                f"a cost in ρ (ρ={cost.rho!r}) needs accounting='zcdp'; under pure accounting, charge "
                "Gaussian noise as its (ε, δ) conversion"
            )
        if record is None:
            record = StatementRecord(analyst, statement, client="local")
        record.cost = cost  # as its row says while reserved
        try:
            reservation = self._reserve(analyst, cost, limit, statement, accounting, record)
        except BaseException:  # nothing was written (its transaction rolled back, even at COMMIT)
            record.cost = Cost.ZERO
            record.audit_id = record.entry_id = None
            raise
        return dataclasses.replace(reservation, record=record)

    def commit(self, reservation: Reservation, record: StatementRecord | None = None) -> None:
        """The query ran: its cost is spent for good. Its audit record (`record`, else the one it was
        reserved with) is updated in the same transaction: status, SQLSTATE, rows, duration, stages."""
        self._finish(reservation, EntryStatus.COMMITTED, record or reservation.record)

    def release(self, reservation: Reservation, record: StatementRecord | None = None) -> None:
        """The query never touched data: its cost is given back (its audit record then says cost 0)."""
        chosen = record or reservation.record
        if chosen is not None:
            chosen.cost = Cost.ZERO
        self._finish(reservation, EntryStatus.RELEASED, chosen)

    def audit_write(self, records: Sequence[StatementRecord]) -> None:
        """Write finished records in one transaction: insert those not written yet, update those
        written with their charge (their final duration, stages, status)."""
        if records:
            self._audit_write(list(records))

    def audit_entries(
        self,
        *,
        analyst: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        status: str | None = None,
        limit: int = 1000,
    ) -> list[AuditEntry]:
        """Stored records, newest first: of one analyst, at or after `since`, before `until`, with
        this status (ok, refused, failed, running, abandoned); at most `limit`."""
        AuditQuery(analyst, since, until, status, limit)  # checks them
        return self._audit_entries(analyst, since, until, status, limit)

    def prune_audit(self, before: datetime) -> int:
        """Delete records stored before `before`, except those whose charge is still reserved;
        return how many."""
        if not isinstance(before, datetime) or before.tzinfo is None:
            raise ValueError(f"before must be a datetime with a time zone, not {before!r}")
        return self._prune_audit(before)

    def spent(self, analyst: str) -> Cost:
        """Sums of the analyst's reserved, committed and abandoned entries, exact to the nearest float:
        ε of those with ρ = 0 (the sequentially composed part), δ and ρ of all."""
        return self._totals_of(analyst).spent

    def spent_epsilon(self, analyst: str, limit: Cost, accounting: str = "pure") -> float:
        """What the analyst's spending is worth in ε at `limit`'s δ, for notices and `budget show`.

        Σε of entries with ρ = 0 plus Σρ converted at the δ left; the same under either accounting (ρ
        from a zCDP era still counts under pure accounting). Infinite when ρ was spent and no δ is left
        to convert it at.
        """
        _check_accounting(accounting)
        _check_amount(limit, "limit", allow_infinite=True)
        return self._totals_of(analyst).worth(limit.delta)

    def remaining(self, analyst: str, limit: Cost) -> Cost:
        """What is left of `limit` in ε-equivalent and δ (never negative); for notices, not for deciding."""
        totals = self._totals_of(analyst)
        return Cost(
            max(0.0, limit.epsilon - totals.worth(limit.delta)),
            max(0.0, float_down(totals.delta_left(limit.delta))),
        )

    def replay_get(self, analyst: str, key: str) -> bytes | None:
        """The answer stored for `analyst` under `key` by replay_put, or None. Never another analyst's."""
        _check_analyst(analyst)
        _check_replay_key(key)
        return self._replay_get(analyst, key)

    def replay_put(self, analyst: str, key: str, payload: bytes) -> None:
        """Store `payload` for `analyst` under `key`, durably; the first answer stored for a key wins.

        Idempotent: a later put under the same key keeps the first payload (two identical queries that
        raced both paid; the answer that is handed out from then on is one of theirs, consistently).
        Evicts the analyst's oldest answers beyond the store's replay_limit.
        """
        _check_analyst(analyst)
        _check_replay_key(key)
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
        self._replay_put(analyst, key, bytes(payload))

    def replay_forget(self, analyst: str) -> int:
        """Forget every answer stored for the analyst (reset does this too); return how many there were."""
        _check_analyst(analyst)
        return self._replay_forget(analyst)

    @abstractmethod
    def reset(self, analyst: str) -> int:
        """Operator action: delete every entry and stored answer of the analyst; return how many entries."""

    @abstractmethod
    def history(self, analyst: str, limit: int = 50) -> list[LedgerEntry]:
        """The analyst's latest entries, newest first."""

    @abstractmethod
    def analysts(self) -> list[str]:
        """Every analyst with at least one entry, sorted."""

    @abstractmethod
    def close(self) -> None:
        """Close the store. Reservations of this instance still open are marked abandoned."""

    @abstractmethod
    def _totals_of(self, analyst: str) -> Totals: ...

    @abstractmethod
    def _reserve(
        self,
        analyst: str,
        cost: Cost,
        limit: Cost,
        statement: str,
        accounting: str,
        record: StatementRecord | None = None,
    ) -> Reservation: ...

    @abstractmethod
    def _finish(
        self, reservation: Reservation, status: EntryStatus, record: StatementRecord | None = None
    ) -> None: ...

    @abstractmethod
    def _audit_write(self, records: list[StatementRecord]) -> None: ...

    @abstractmethod
    def _audit_entries(
        self,
        analyst: str | None,
        since: datetime | None,
        until: datetime | None,
        status: str | None,
        limit: int,
    ) -> list[AuditEntry]: ...

    @abstractmethod
    def _prune_audit(self, before: datetime) -> int: ...

    @abstractmethod
    def _replay_get(self, analyst: str, key: str) -> bytes | None: ...

    @abstractmethod
    def _replay_put(self, analyst: str, key: str, payload: bytes) -> None: ...

    @abstractmethod
    def _replay_forget(self, analyst: str) -> int: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _check_analyst(analyst: str) -> None:
    if not isinstance(analyst, str) or not analyst:
        raise ValueError(f"analyst must be a non-empty string, not {analyst!r}")


def _check_accounting(accounting: str) -> None:
    if accounting not in ACCOUNTING:
        raise ValueError(f"accounting must be one of {', '.join(ACCOUNTING)}, not {accounting!r}")


def _check_replay_key(key: str) -> None:
    if not isinstance(key, str) or not _REPLAY_KEY.fullmatch(key):
        raise ValueError(f"a replay key must be a lowercase hex digest of 16 to 128 digits, not {key!r}")


def _check_amount(amount: Cost, what: str, *, allow_infinite: bool) -> None:
    if not isinstance(amount, Cost):
        raise TypeError(f"{what} must be a Cost, not {type(amount).__name__}")
    # A limit's ρ means nothing (budgets are in ε and δ); a cost's is charged.
    for name in ("epsilon", "delta") if allow_infinite else ("epsilon", "delta", "rho"):
        value = getattr(amount, name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{what}.{name} must be a number, not {value!r}")
        if math.isnan(value) or value < 0 or (math.isinf(value) and not allow_infinite):
            bound = "a number >= 0" if allow_infinite else "a finite number >= 0"
            raise ValueError(f"{what}.{name} must be {bound}, not {value!r}")


def check_replay_limit(replay_limit: int) -> int:
    """A store's replay_limit, checked: an integer >= 1."""
    if isinstance(replay_limit, bool) or not isinstance(replay_limit, int) or replay_limit < 1:
        raise ValueError(f"replay_limit must be an integer >= 1, not {replay_limit!r}")
    return replay_limit


def check_schema_version(version: int, where: str) -> None:
    """Refuse a store laid out by a newer dpproxy (`where` names it in the message)."""
    if version > SCHEMA_VERSION:
        raise DPProxyError(
            f"the privacy ledger {where} has schema version {version}, newer than this dpproxy "
            f"understands ({SCHEMA_VERSION})",
            hint="upgrade dpproxy, or point it at another ledger",
        )
    # Older versions are migrated by the store, inside its schema transaction.


def finish_problem(
    reservation: Reservation, status: EntryStatus, row: tuple[str, float, float, float | None, str] | None
) -> str | None:
    """Why the stored entry `row` (analyst, ε, δ, ρ, status) cannot be finished, or None if it can."""
    verb = "committed" if status == EntryStatus.COMMITTED else "released"
    where = f"reservation {reservation.id} of analyst {reservation.analyst!r}"
    if row is None:
        return f"cannot mark {where} {verb}: no such ledger entry (never reserved, or removed by a reset)"
    analyst, epsilon, delta, rho, current = row
    rho = rho or 0.0
    if (analyst, epsilon, delta, rho) != (
        reservation.analyst,
        float(reservation.cost.epsilon),
        float(reservation.cost.delta),
        float(reservation.cost.rho),
    ):
        return (
            f"cannot mark {where} {verb}: it does not match ledger entry {reservation.id} "
            f"(analyst {analyst!r}, ε={epsilon!r}, δ={delta!r}, ρ={rho!r})"
        )
    if current != EntryStatus.RESERVED:
        return f"cannot mark {where} {verb}: it is already {current}"
    return None


def open_ledger(spec: str | os.PathLike[str], *, replay_limit: int = REPLAY_LIMIT) -> Ledger:
    """A PostgresLedger for a postgresql:// or postgres:// URL, else a SQLite file at that path."""
    if isinstance(spec, str) and spec.startswith(("postgresql://", "postgres://")):
        from dpproxy.budget.postgres import PostgresLedger

        return PostgresLedger(spec, replay_limit=replay_limit)
    from dpproxy.budget.sqlite import SQLiteLedger

    if os.fspath(spec) == ":memory:":
        return SQLiteLedger(":memory:", replay_limit=replay_limit)
    path = Path(spec).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    return SQLiteLedger(path, replay_limit=replay_limit)
