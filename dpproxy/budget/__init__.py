"""The privacy-budget ledger: what each analyst has spent, kept persistently and changed atomically.

This package owns the ledger and the replay store. A query's cost is reserved before it runs
(refused with BudgetExhausted if it does not fit), committed once it has run, or released if it
never touched data. An analyst's spending is the exact sum of every entry that is reserved,
committed or abandoned. Only a released entry, whose query provably never ran, gives its cost back.
The sums are kept exactly (decimal arithmetic, no rounding) in a per-analyst totals row updated in
the same transaction as the entries, so a reservation reads one row, however long the history.

How costs compose (ρ and δ add up, the zCDP part is converted to ε once, for the whole history) is
dpproxy.budget.composition's job. dpproxy.budget.ledger holds the contract (Ledger), what callers
receive from it, and its implementation in SQL, written once; dpproxy.budget.sqlite and
dpproxy.budget.postgres are the two stores it runs on, each its DDL, migration step, transactions,
locks and owner liveness. This module re-exports what callers use and holds open_ledger, which
picks the store.

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

import os
from pathlib import Path

from dpproxy.audit import ABANDONED, RUNNING, AuditEntry
from dpproxy.budget.composition import epsilon_equivalent
from dpproxy.budget.ledger import (
    DATASET_BUDGET,
    REPLAY_LIMIT,
    SCHEMA_VERSION,
    EntryStatus,
    Ledger,
    LedgerEntry,
    Reservation,
    SharedBudget,
)

__all__ = [
    "ABANDONED",
    "DATASET_BUDGET",
    "REPLAY_LIMIT",
    "RUNNING",
    "SCHEMA_VERSION",
    "AuditEntry",
    "EntryStatus",
    "Ledger",
    "LedgerEntry",
    "Reservation",
    "SharedBudget",
    "epsilon_equivalent",
    "open_ledger",
]


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
