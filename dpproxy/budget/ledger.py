"""The ledger, written once: what callers may ask of it, and how it does it in SQL on either store.

`Ledger` is the contract (its public methods check their arguments) and its one implementation:
reservations, commits and releases with their totals and audit rows, reset, replay, history, the
audit log's writes, reads and pruning, orphans, the schema version and its migration. A store
(dpproxy.budget.sqlite, dpproxy.budget.postgres) subclasses it and supplies the store interface at
the end of the class: its placeholder, transactions, locks, timestamps, an insert's new id, the
totals' arithmetic, owner liveness, its DDL and the one migration step that differs.

Statements are written once, with `?` for a parameter and the tables named {entries}, {meta},
{totals}, {replay} and {audit}; `_sql` renders them for the store.
"""

from __future__ import annotations

import dataclasses
import decimal
import math
import re
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar, Self

from dpproxy.audit import (
    ABANDONED,
    AUDIT_COLUMNS,
    AUDIT_FINISH_COLUMNS,
    RUNNING,
    AuditEntry,
    AuditQuery,
    StatementRecord,
    audit_entry,
    audit_finish_values,
    audit_values,
)
from dpproxy.budget.composition import Totals, check_fits, exact_totals, float_down
from dpproxy.budget.windows import WindowTotals
from dpproxy.errors import DPProxyError
from dpproxy.policy import ACCOUNTING, DATASET, Refresh, account_key
from dpproxy.privacy.accounting import Cost

# Version of the ledger's table layout, stored in the store's meta table. Bump it, and add a step to
# the migration, when the layout changes. 2: the per-analyst totals table. 3: ρ in the totals (zCDP
# composition) and the replay store. 4: the audit log. 5: the audit log's error messages.
SCHEMA_VERSION = 6

# Stored answers kept per analyst; older ones are evicted (and bought again if asked again).
REPLAY_LIMIT = 10_000

# Replay keys are hex digests the engine computes (e.g. SHA-256); anything else is a caller's bug.
_REPLAY_KEY = re.compile(r"[0-9a-f]{16,128}")

# The store's tables: the suffix each adds to the entries table's name.
_TABLES = {"entries": "", "meta": "_meta", "totals": "_totals", "replay": "_replay", "audit": "_audit"}
# The meta key of the newest entry id when the data set's budget was last reset (Ledger.reset_data_set).
_DATASET_RESET_KEY = "data_set_reset_entry"
RESET_ENTRIES = "*reset"  # whose entries a budget reset leaves: no analyst's name (lowercase identifiers)

_AUDIT_INSERT = (
    f"INSERT INTO {{audit}} ({', '.join(AUDIT_COLUMNS)}) VALUES ({', '.join('?' for _ in AUDIT_COLUMNS)})"
)
_AUDIT_FINISH = f"UPDATE {{audit}} SET {', '.join(c + ' = ?' for c in AUDIT_FINISH_COLUMNS)} WHERE id = ?"


class EntryStatus(StrEnum):
    RESERVED = "reserved"  # the query may be running: counted as spent
    COMMITTED = "committed"  # the query ran: spent for good
    RELEASED = "released"  # the query never touched data: not counted
    ABANDONED = "abandoned"  # its process died while it was reserved: spent for good


def check_list(values: Iterable[str]) -> str:
    """The values of a DDL CHECK (status IN (…)) list: 'a', 'b'."""
    return ", ".join(f"'{value}'" for value in values)


# How a refusal names the data set's budget (the policy's top-level `budget:`).
DATASET_BUDGET = "the data set's budget (all analysts together)"


@dataclass(frozen=True)
class SharedBudget:
    """The data set's budget, shared by every analyst: a query is granted only if it fits both this
    and the analyst's own, reserved in the same transaction."""

    limit: Cost
    refresh: Refresh = Refresh.NEVER


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
    # The totals the cost was added to (dpproxy.policy.refresh.account_key): the analyst's in its
    # window, and the data set's when it has a budget; a release takes it back from the same ones.
    accounts: tuple[str, ...] = ()
    # The data set's spending with this reservation included (None: no data-set budget).
    shared_spent: Cost | None = None


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


class Ledger(WindowTotals, ABC):
    """Per-analyst privacy spending and stored answers. Thread-safe; several processes may share one store."""

    # The store's parameter placeholder, and what locks the entry a commit or release reads.
    PLACEHOLDER: ClassVar[str]
    FOR_UPDATE: ClassVar[str]

    def __init__(self, *, tables: Callable[[str], str], where: str, replay_limit: int) -> None:
        """`tables`: the SQL name of the table with this suffix ("", "_meta", …); `where`: how a
        message names the store."""
        self.replay_limit = _check_replay_limit(replay_limit)
        self._tables = {table: tables(suffix) for table, suffix in _TABLES.items()}
        self._where = where
        self._owner: Any = None  # this instance's owner id, set by the store before _abandon_orphans

    def reserve(
        self,
        analyst: str,
        cost: Cost,
        limit: Cost,
        *,
        statement: str = "",
        accounting: str = "pure",
        record: StatementRecord | None = None,
        refresh: Refresh = Refresh.NEVER,
        shared: SharedBudget | None = None,
    ) -> Reservation:
        """Hold `cost` for one query if everything spent so far plus `cost` fits within `limit`
        (in the current window of `refresh`), and within the data set's budget `shared` if any.

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
        A refusal by the data set's budget says so (DATASET_BUDGET), not the analyst's.
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
            reservation = self._reserve(analyst, cost, limit, statement, accounting, record, refresh, shared)
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
        if not records:
            return
        # Losing records to a machine crash loses no charge (a charge's record is written with it).
        with self._transaction(durable=False) as conn:
            for record in records:
                if record.audit_id is None:
                    record.audit_id = self._insert(conn, self._sql(_AUDIT_INSERT), self._audit_row(record))
                else:
                    # Only once its charge is finished: an abandoned record stays so.
                    conn.execute(
                        self._sql(_AUDIT_FINISH + f" AND status NOT IN ('{RUNNING}', '{ABANDONED}')"),
                        self._audit_finish_row(record),
                    )

    def audit_entries(
        self,
        *,
        analyst: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        status: str | None = None,
        limit: int = 1000,
        kind: str | None = None,
    ) -> list[AuditEntry]:
        """Stored records, newest first: of one analyst, at or after `since`, before `until`, with
        this status (ok, refused, failed, running, abandoned) and kind (dpproxy.audit.KINDS; "!k"
        for every kind but k); at most `limit`."""
        query = AuditQuery(analyst, since, until, status, limit, kind)
        where, params = [], []
        for column, operator, value in query.conditions():
            where.append(f"{column} {operator} ?")
            params.append(self._stamp(value) if isinstance(value, datetime) else value)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        rows = self._read(
            self._sql(
                f"SELECT id, {', '.join(AUDIT_COLUMNS)} FROM {{audit}} {clause}"
                "ORDER BY at DESC, id DESC LIMIT ?"
            ),
            (*params, query.limit),
        )
        return [audit_entry(row, self._moment(row[1])) for row in rows]

    def prune_audit(self, before: datetime) -> int:
        """Delete records stored before `before`, except those whose charge is still reserved;
        return how many."""
        if not isinstance(before, datetime) or before.tzinfo is None:
            raise ValueError(f"before must be a datetime with a time zone, not {before!r}")
        with self._transaction(durable=False) as conn:
            return conn.execute(
                self._sql("DELETE FROM {audit} WHERE at < ? AND status <> ?"), (self._stamp(before), RUNNING)
            ).rowcount

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
        rows = self._read(
            self._sql("SELECT payload FROM {replay} WHERE analyst = ? AND key = ?"), (analyst, key)
        )
        return bytes(rows[0][0]) if rows else None

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
        # Losing a stored answer to a machine crash only means buying it again: no fsync needed.
        with self._transaction(durable=False) as conn:
            # Puts of one analyst take turns, so that eviction keeps exactly the newest replay_limit.
            self._lock(conn, "replay", analyst)
            inserted = conn.execute(
                self._sql(
                    "INSERT INTO {replay} (analyst, key, payload, created_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (analyst, key) DO NOTHING"
                ),
                (analyst, key, bytes(payload), self._stamp(_now())),
            ).rowcount
            if inserted:
                conn.execute(
                    self._sql(
                        "DELETE FROM {replay} WHERE analyst = ? AND seq <= (SELECT seq FROM {replay} "
                        "WHERE analyst = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)"
                    ),
                    (analyst, analyst, self.replay_limit),
                )

    def replay_forget(self, analyst: str) -> int:
        """Forget every answer stored for the analyst (reset does this too); return how many there were."""
        _check_analyst(analyst)
        with self._transaction() as conn:
            return conn.execute(self._sql("DELETE FROM {replay} WHERE analyst = ?"), (analyst,)).rowcount

    def reset(self, analyst: str, *, by: str = "") -> int:
        """Operator action: forget the analyst's entries, totals and stored answers; return how many
        entries. The data set's budget keeps what they spent (a person's loss is not undone by
        forgetting who asked). Audited in the same transaction (kind "operator", who: `by`)."""
        _check_analyst(analyst)
        with self._transaction() as conn:
            self._lock(conn, "analyst", analyst)
            # A query still running loses its entry: its record can never be finished, so it ends here.
            conn.execute(
                self._sql("UPDATE {audit} SET status = ? WHERE status = ? AND analyst = ?"),
                (ABANDONED, RUNNING, analyst),
            )
            conn.execute(self._sql("DELETE FROM {replay} WHERE analyst = ?"), (analyst,))
            self._delete_totals(conn, analyst)
            # Kept, under a name no analyst has, for the data set's windows rebuilt from the entries
            # (dpproxy.budget.windows); one still reserved can never be finished: spent for good.
            removed = conn.execute(
                self._sql(
                    "UPDATE {entries} SET analyst = ?, status = CASE WHEN status = 'reserved' "
                    "THEN 'abandoned' ELSE status END WHERE analyst = ?"
                ),
                (RESET_ENTRIES, analyst),
            ).rowcount
            entries = "ledger entry" if removed == 1 else "ledger entries"
            what = f"budget reset of analyst {analyst}: {removed} {entries} removed"
            self._operator_record(conn, analyst, what, by)
            return removed

    def reset_data_set(self, *, by: str = "") -> Cost:
        """Operator action: forget what the data set's budget has spent (every window); return what
        it had spent (a budget without refresh). Audited like `reset`. The analysts' own budgets are
        untouched."""
        with self._transaction() as conn:
            self._lock(conn, "analyst", DATASET)
            spent = self._totals(conn, DATASET).spent
            self._delete_totals(conn, DATASET)
            # Reservations made before now are no longer in the data set's totals: one released
            # later must not take its cost from the totals made after the reset (they would go
            # negative, or lose what later queries spent). Entry ids grow; the newest marks the line.
            (newest,) = conn.execute(self._sql("SELECT COALESCE(MAX(id), 0) FROM {entries}")).fetchone()
            self._set_meta(conn, _DATASET_RESET_KEY, str(int(newest)))
            self._operator_record(conn, DATASET, "budget reset of the data set's budget (all analysts)", by)
            return spent

    def secret(self, purpose: str) -> bytes:
        """32 random bytes kept in the ledger for `purpose`, drawn the first time and the same ever
        after, for every process sharing the ledger: what must survive restarts and policy
        reloads, such as the key of the decoy credentials of unknown user names (dpproxy.wire.auth)."""
        key = f"secret:{purpose}"
        with self._transaction() as conn:
            conn.execute(
                self._sql("INSERT INTO {meta} (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"),
                (key, secrets.token_hex(32)),
            )
            (value,) = conn.execute(self._sql("SELECT value FROM {meta} WHERE key = ?"), (key,)).fetchone()
        return bytes.fromhex(value)

    def _data_set_reset_line(self, conn: Any) -> int:
        """The newest entry id when the data set's budget was last reset (0: never)."""
        row = conn.execute(
            self._sql("SELECT value FROM {meta} WHERE key = ?"), (_DATASET_RESET_KEY,)
        ).fetchone()
        return int(row[0]) if row is not None else 0

    def spent_now(self, name: str, refresh: Refresh) -> Cost:
        """What the budget `name` (an analyst, or DATASET) has spent in its current window."""
        with self._transaction(durable=False) as conn:
            self._lock(conn, "analyst", name)
            return self._window_totals(conn, name, refresh, self._not_before_newest(conn, _now())).spent

    def _operator_record(self, conn: Any, analyst: str, what: str, by: str) -> None:
        """An operator's action in the audit log: kind "operator", its text, who (`by`)."""
        record = StatementRecord(analyst, what, client=f"operator {by}".strip(), kind="operator")
        record.finish()
        record.audit_id = self._insert(conn, self._sql(_AUDIT_INSERT), self._audit_row(record))

    def audit_operator(self, analyst: str, what: str, *, by: str = "") -> None:
        """Record an operator's action that changes no budget (a policy reload, a console login)."""
        with self._transaction(durable=False) as conn:
            self._operator_record(conn, analyst, what, by)

    def history(self, analyst: str, limit: int = 50) -> list[LedgerEntry]:
        """The analyst's latest entries, newest first."""
        if limit < 0:
            raise ValueError(f"history limit must be >= 0, not {limit}")
        rows = self._read(
            self._sql(
                "SELECT id, analyst, epsilon, delta, status, statement, created_at, finished_at, rho "
                "FROM {entries} WHERE analyst = ? ORDER BY id DESC LIMIT ?"
            ),
            (analyst, limit),
        )
        return [
            LedgerEntry(
                id=row[0],
                analyst=row[1],
                epsilon=row[2],
                delta=row[3],
                status=EntryStatus(row[4]),
                statement=row[5],
                created_at=self._moment(row[6]),
                finished_at=self._moment(row[7]) if row[7] is not None else None,
                rho=row[8] or 0.0,
            )
            for row in rows
        ]

    def analysts(self) -> list[str]:
        """Every analyst with at least one entry, sorted."""
        query = self._sql("SELECT DISTINCT analyst FROM {entries} WHERE analyst <> ? ORDER BY analyst")
        return [a for (a,) in self._read(query, (RESET_ENTRIES,))]

    @abstractmethod
    def close(self) -> None:
        """Close the store. Reservations of this instance still open are marked abandoned
        (`_abandon_own`, before the store lets go of its connections and owner lock)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- The implementation, once for both stores ---------------------------------------------------

    def _sql(self, template: str) -> str:
        """A statement for this store: its tables' names and its placeholder."""
        return template.format_map(self._tables).replace("?", self.PLACEHOLDER)

    def _reserve(
        self,
        analyst: str,
        cost: Cost,
        limit: Cost,
        statement: str,
        accounting: str,
        record: StatementRecord,
        refresh: Refresh,
        shared: SharedBudget | None,
    ) -> Reservation:
        shared_after = None
        with self._transaction() as conn:
            # Every statement after the lock sees all reservations made before it. The data set's
            # lock is always taken second: no two reservations wait for each other.
            self._lock(conn, "analyst", analyst)
            now = self._not_before_newest(conn, _now())
            own = account_key(analyst, refresh, now)
            accounts = (own,)
            after = check_fits(
                analyst, self._window_totals(conn, analyst, refresh, now), cost, limit, accounting
            )
            if shared is not None:
                key = account_key(DATASET, shared.refresh, now)
                self._lock(conn, "analyst", DATASET)
                shared_after = check_fits(
                    analyst,
                    self._window_totals(conn, DATASET, shared.refresh, now),
                    cost,
                    shared.limit,
                    accounting,
                    whose=DATASET_BUDGET,
                )
                accounts = (own, key)
            for account in accounts:
                self._change_totals(conn, account, cost, 1)
            entry_id = self._insert(
                conn,
                self._sql(
                    "INSERT INTO {entries} (analyst, epsilon, delta, rho, status, statement, owner, "
                    "created_at) VALUES (?, ?, ?, ?, 'reserved', ?, ?, ?)"
                ),
                (
                    analyst,
                    float(cost.epsilon),
                    float(cost.delta),
                    float(cost.rho),
                    statement,
                    self._owner,
                    self._stamp(now),
                ),
            )
            record.entry_id = entry_id
            record.audit_id = self._insert(conn, self._sql(_AUDIT_INSERT), self._audit_row(record, RUNNING))
        return Reservation(
            id=entry_id,
            analyst=analyst,
            cost=cost,
            spent=after.spent,
            accounts=accounts,
            shared_spent=shared_after.spent if shared_after is not None else None,
        )

    def _finish(self, reservation: Reservation, status: EntryStatus, record: StatementRecord | None) -> None:
        # A commit lost to a crash is safe (the entry stays reserved, then abandoned: spent), and a
        # lost release only keeps a cost: neither needs an fsync.
        with self._transaction(durable=False) as conn:
            if status == EntryStatus.RELEASED and any(map(_data_set_account, reservation.accounts)):
                self._lock(conn, "analyst", DATASET)  # the reset line is read under its lock
            row = conn.execute(
                self._sql("SELECT analyst, epsilon, delta, rho, status FROM {entries} WHERE id = ?")
                + self.FOR_UPDATE,
                (reservation.id,),
            ).fetchone()
            problem = _finish_problem(reservation, status, row)
            if problem is not None:
                raise ValueError(problem)
            conn.execute(
                self._sql("UPDATE {entries} SET status = ?, finished_at = ? WHERE id = ?"),
                (str(status), self._stamp(_now()), reservation.id),
            )
            if status == EntryStatus.RELEASED:
                reset_after = self._data_set_reset_line(conn) >= reservation.id
                for account in reservation.accounts or (reservation.analyst,):
                    if reset_after and _data_set_account(account):
                        continue  # reset since it was reserved: no longer in these totals
                    self._change_totals(conn, account, reservation.cost, -1)
            if record is not None and record.audit_id is not None:
                conn.execute(self._sql(_AUDIT_FINISH), self._audit_finish_row(record))

    def _audit_row(self, record: StatementRecord, status: str | None = None) -> tuple[Any, ...]:
        at, *rest = audit_values(record, status=status)
        return (self._stamp(at), *rest)

    def _audit_finish_row(self, record: StatementRecord) -> tuple[Any, ...]:
        return (*audit_finish_values(record), record.audit_id)

    def _totals(self, conn: Any, analyst: str) -> Totals:
        row = conn.execute(
            self._sql("SELECT epsilon, delta, rho FROM {totals} WHERE analyst = ?"), (analyst,)
        ).fetchone()
        return _totals_of_row(row)

    def _write_totals(self, conn: Any, analyst: str, totals: Totals) -> None:
        # As decimal text: SQLite keeps it so, PostgreSQL reads it into numeric exactly.
        conn.execute(
            self._sql(
                "INSERT INTO {totals} (analyst, epsilon, delta, rho) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (analyst) DO UPDATE SET epsilon = excluded.epsilon, delta = excluded.delta, "
                "rho = excluded.rho"
            ),
            (analyst, str(totals.epsilon), str(totals.delta), str(totals.rho)),
        )

    def _totals_of(self, analyst: str) -> Totals:
        rows = self._read(self._sql("SELECT epsilon, delta, rho FROM {totals} WHERE analyst = ?"), (analyst,))
        return _totals_of_row(rows[0] if rows else None)

    def _create_schema(self) -> None:
        """Create the tables if missing; refuse a newer layout, migrate an older one."""
        with self._transaction() as conn:
            self._lock(conn, "schema", None)
            for statement in self._schema():
                conn.execute(statement)
            conn.execute(
                self._sql(
                    "INSERT INTO {meta} (key, value) VALUES ('schema_version', ?) "
                    "ON CONFLICT (key) DO NOTHING"
                ),
                (str(SCHEMA_VERSION),),
            )
            (version,) = conn.execute(
                self._sql("SELECT value FROM {meta} WHERE key = 'schema_version'")
            ).fetchone()
            version = int(version)
            if version > SCHEMA_VERSION:
                raise DPProxyError(
                    f"the privacy ledger {self._where} has schema version {version}, newer than this "
                    f"dpproxy understands ({SCHEMA_VERSION})",
                    hint="upgrade dpproxy, or point it at another ledger",
                )
            if version < SCHEMA_VERSION:
                self._migrate(conn, version)

    def _migrate(self, conn: Any, version: int) -> None:
        """Bring a version 1 to 5 store to SCHEMA_VERSION, inside the schema transaction.

        Version 1 had no totals, version 2 no ρ total (and no replay table, created with the others):
        sum every analyst's entries once, exactly, in Python (PostgreSQL's float8 → numeric cast keeps
        only 15 digits, which is not the double's value); for version 2 the ε and δ sums come out as
        they were. Version 3 had no audit table (created with the others, empty). Version 4's audit
        table had no message column. Version 5's reset deleted entries (windows._keep_reset_costs)."""
        if version < 3:
            self._add_rho_total(conn)
            entries: dict[str, list[tuple[float, float, float | None]]] = {}
            for analyst, epsilon, delta, rho in conn.execute(
                self._sql("SELECT analyst, epsilon, delta, rho FROM {entries} WHERE status <> 'released'")
            ).fetchall():
                entries.setdefault(analyst, []).append((epsilon, delta, rho))
            conn.execute(self._sql("DELETE FROM {totals}"))
            for analyst, amounts in entries.items():
                self._write_totals(conn, analyst, exact_totals(amounts))
        if version == 4:  # (an older store's audit table is created with the column)
            self._add_audit_message(conn)
        if version < 6:
            self._keep_reset_costs(conn, self._stamp(_now()))
        conn.execute(
            self._sql("UPDATE {meta} SET value = ? WHERE key = 'schema_version'"), (str(SCHEMA_VERSION),)
        )

    def _abandon_orphans(self) -> None:
        """Mark abandoned the reservations (and their audit records) of owners that are gone."""
        with self._transaction() as conn:
            owners = [
                owner
                for (owner,) in conn.execute(
                    self._sql("SELECT DISTINCT owner FROM {entries} WHERE status = 'reserved'")
                ).fetchall()
                if owner != self._owner
            ]
            with self._dead_owners(conn, owners) as dead:
                finished = self._stamp(_now())
                for owner in dead:
                    self._abandon(conn, owner, finished)

    def _abandon_own(self) -> None:
        """Mark abandoned this instance's open reservations (when it closes)."""
        with self._transaction() as conn:
            self._abandon(conn, self._owner, self._stamp(_now()))

    def _abandon(self, conn: Any, owner: Any, finished: Any) -> None:
        """The owner's reserved entries and their audit rows say abandoned."""
        match, params = ("owner IS NULL", ()) if owner is None else ("owner = ?", (owner,))
        # The audit rows first: they are found through the entries that are still reserved.
        conn.execute(
            self._sql(
                "UPDATE {audit} SET status = ? WHERE status = ? AND entry_id IN "
                f"(SELECT id FROM {{entries}} WHERE status = 'reserved' AND {match})"
            ),
            (ABANDONED, RUNNING, *params),
        )
        conn.execute(
            self._sql(
                "UPDATE {entries} SET status = 'abandoned', finished_at = ? "
                f"WHERE status = 'reserved' AND {match}"
            ),
            (finished, *params),
        )

    # --- The store interface: what SQLite and PostgreSQL do differently -----------------------------

    @abstractmethod
    def _transaction(self, *, durable: bool = True) -> AbstractContextManager[Any]:
        """A write transaction on a connection (its `execute(query, params)` returns a cursor), committed
        when the block ends, rolled back on an exception. durable=False may skip the sync to disk at
        commit (a crash of the machine may lose the change, not a crash of the process): only for
        changes whose loss leaves the ledger conservative."""

    @abstractmethod
    def _read(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of one read-only statement."""

    @abstractmethod
    def _lock(self, conn: Any, kind: str, analyst: str | None) -> None:
        """Serialise this transaction with the others of `kind` ("analyst", "replay": per analyst;
        "schema") until it ends."""

    @abstractmethod
    def _insert(self, conn: Any, query: str, params: Sequence[Any]) -> int:
        """Run an INSERT of one row; the row's new id."""

    @abstractmethod
    def _stamp(self, moment: datetime) -> Any:
        """A moment as the store keeps it (audit rows are compared and sorted by it)."""

    @abstractmethod
    def _moment(self, stored: Any) -> datetime:
        """A stored moment read back."""

    @abstractmethod
    def _change_totals(self, conn: Any, analyst: str, cost: Cost, sign: int) -> None:
        """Add `cost` to the analyst's totals (sign 1) or take it from them (sign -1), exactly."""

    @abstractmethod
    def _dead_owners(self, conn: Any, owners: list[Any]) -> AbstractContextManager[list[Any]]:
        """The owners among `owners` whose ledger instance is gone (None: an owner unknown), kept
        from coming back until the block ends."""

    @abstractmethod
    def _schema(self) -> list[str]:
        """The DDL statements that create the tables and indexes of SCHEMA_VERSION when missing."""

    @abstractmethod
    def _add_rho_total(self, conn: Any) -> None:
        """Migration from version 2: the totals table gains its ρ column (0) unless it has it."""

    @abstractmethod
    def _add_audit_message(self, conn: Any) -> None:
        """Migration from version 4: the audit table gains its message column (NULL)."""


def _now() -> datetime:
    return datetime.now(UTC)


def _totals_of_row(row: Sequence[Any] | None) -> Totals:
    if row is None:
        return Totals()
    return Totals(decimal.Decimal(row[0]), decimal.Decimal(row[1]), decimal.Decimal(row[2]))


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


def _check_replay_limit(replay_limit: int) -> int:
    """A store's replay_limit, checked: an integer >= 1."""
    if isinstance(replay_limit, bool) or not isinstance(replay_limit, int) or replay_limit < 1:
        raise ValueError(f"replay_limit must be an integer >= 1, not {replay_limit!r}")
    return replay_limit


def _data_set_account(account: str) -> bool:  # "*", "*@2026-11-28"
    return account == DATASET or account.startswith(DATASET + "@")


def _finish_problem(
    reservation: Reservation, status: EntryStatus, row: tuple[str, float, float, float | None, str] | None
) -> str | None:
    """Why the stored entry `row` (analyst, ε, δ, ρ, status) cannot be finished, or None if it can."""
    verb = "committed" if status == EntryStatus.COMMITTED else "released"
    where = f"reservation {reservation.id} of analyst {reservation.analyst!r}"
    if row is None or row[0] == RESET_ENTRIES:
        return f"cannot mark {where} {verb}: no such ledger entry (never reserved, or removed by a reset)"
    analyst, epsilon, delta, rho, current = row
    rho = rho or 0.0
    cost = reservation.cost
    if (analyst, epsilon, delta, rho) != (reservation.analyst, cost.epsilon, cost.delta, cost.rho):
        return (
            f"cannot mark {where} {verb}: it does not match ledger entry {reservation.id} "
            f"(analyst {analyst!r}, ε={epsilon!r}, δ={delta!r}, ρ={rho!r})"
        )
    if current != EntryStatus.RESERVED:
        return f"cannot mark {where} {verb}: it is already {current}"
    return None
