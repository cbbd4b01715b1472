"""The ledger in one PostgreSQL table, shared by any number of processes.

This module owns the PostgreSQL layout of the ledger (entries, exact totals as numeric, stored
answers, the schema version and its migration), its transactions under a per-analyst advisory lock,
and owner liveness: each live ledger instance holds a session advisory lock on a connection of its
own.

It never decides whether a cost fits (dpproxy.budget.composition does, called under the analyst's
lock) and never reads a replay key or payload beyond storing it.
"""

from __future__ import annotations

import decimal
import re
import secrets
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from dpproxy.audit import (
    ABANDONED,
    AUDIT_COLUMNS,
    AUDIT_FINISH_COLUMNS,
    RUNNING,
    AuditEntry,
    StatementRecord,
    audit_entry,
    audit_finish_values,
    audit_values,
)
from dpproxy.budget import (
    REPLAY_LIMIT,
    SCHEMA_VERSION,
    EntryStatus,
    Ledger,
    LedgerEntry,
    Reservation,
    check_replay_limit,
    check_schema_version,
    finish_problem,
)
from dpproxy.budget.composition import Totals, check_fits, exact_totals, signed_amounts
from dpproxy.errors import DPProxyError
from dpproxy.privacy.accounting import Cost


def _now() -> datetime:
    return datetime.now(UTC)


_PG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,55}")


def _lock_key(*parts: str) -> int:
    """A stable signed 32-bit key for pg_advisory_*lock(int, int)."""
    value = zlib.crc32("\x1f".join(parts).encode())
    return value - (1 << 32) if value >= 1 << 31 else value


def _read_committed(conn: psycopg.Connection[Any]) -> None:
    # Whatever the database's default: under REPEATABLE READ or SERIALIZABLE the snapshot would be
    # taken by the lock statement itself, before the lock is granted, and miss the reservation
    # committed by the previous holder. READ COMMITTED reads afresh after the lock.
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED


def _pg_index_name(table: str, suffix: str) -> str:
    """An index name within PostgreSQL's 63 bytes, distinct per table even when the table's is long."""
    name = f"{table}_{suffix}"
    if len(name) <= 63:
        return name
    return f"{table[: 63 - len(suffix) - 10]}_{zlib.crc32(table.encode()):08x}_{suffix}"


class PostgresLedger(Ledger):
    """A ledger in one PostgreSQL table (created on first open), shared by any number of processes.

    Beside it live `<table>_meta`, `<table>_totals` and `<table>_replay`. Reservations of one analyst
    are serialised by a transaction-scoped advisory lock; the owner of each ledger instance is a
    session advisory lock held on a dedicated connection. If that connection is lost while the
    instance lives on, another instance opening the table takes its open reservations for orphans
    and abandons them: still spent, but their commit then fails.
    """

    def __init__(
        self,
        dsn: str,
        *,
        table: str = "dpproxy_ledger",
        max_connections: int = 4,
        replay_limit: int = REPLAY_LIMIT,
    ) -> None:
        parts = table.split(".")
        if len(parts) > 2 or not all(_PG_NAME.fullmatch(p) for p in parts):
            raise ValueError(
                f"ledger table name {table!r} must be an identifier (letters, digits, _), "
                "optionally schema-qualified"
            )
        self.table = table
        self.replay_limit = check_replay_limit(replay_limit)
        self._table = sql.Identifier(*parts)
        self._meta = sql.Identifier(*parts[:-1], parts[-1] + "_meta")
        self._totals_table = sql.Identifier(*parts[:-1], parts[-1] + "_totals")
        self._replay = sql.Identifier(*parts[:-1], parts[-1] + "_replay")
        self._audit = sql.Identifier(*parts[:-1], parts[-1] + "_audit")
        self._audit_index = sql.Identifier(_pg_index_name(parts[-1], "audit_at"))
        self._audit_analyst_index = sql.Identifier(_pg_index_name(parts[-1], "audit_analyst_at"))
        self._index = sql.Identifier(parts[-1] + "_analyst_status")
        self._replay_index = sql.Identifier(_pg_index_name(parts[-1], "replay_seq"))
        self._analyst_lock_class = _lock_key("dpproxy ledger analyst", table)
        self._owner_lock_class = _lock_key("dpproxy ledger owner", table)
        self._schema_lock_class = _lock_key("dpproxy ledger schema", table)
        self._replay_lock_class = _lock_key("dpproxy ledger replay", table)
        self._closed = False
        try:
            self._owner_conn = psycopg.connect(dsn, autocommit=True)
        except psycopg.OperationalError as exc:
            raise DPProxyError(
                f"cannot connect to the PostgreSQL privacy ledger: {exc}",
                hint="check the ledger DSN and that the server is running",
            ) from exc
        self._pool: ConnectionPool | None = None
        try:
            self._owner = self._claim_owner()
            self._pool = ConnectionPool(
                dsn,
                min_size=1,
                max_size=max(1, max_connections),
                kwargs={"autocommit": True},
                configure=_read_committed,
                name=f"dpproxy-ledger-{table}",
                open=True,
            )
            self._create_schema()
            self._abandon_orphans()
        except BaseException:
            if self._pool is not None:
                self._pool.close()
            self._owner_conn.close()
            raise

    def _claim_owner(self) -> int:
        # Random ids may collide with a live owner: try until one is free (collisions are rare).
        while True:
            owner = secrets.randbits(31)
            (claimed,) = self._owner_conn.execute(
                "SELECT pg_try_advisory_lock(%s, %s)", (self._owner_lock_class, owner)
            ).fetchone()
            if claimed:
                return owner

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[Any]]:
        if self._closed or self._pool is None:
            raise ValueError(f"the privacy ledger table {self.table} is closed")
        with self._pool.connection() as conn, conn.transaction():
            yield conn

    def _create_schema(self) -> None:
        t, meta = self._table, self._meta
        with self._transaction() as conn:
            # Concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog: serialise it.
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (self._schema_lock_class,))
            conn.execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, value text NOT NULL)").format(
                    meta
                )
            )
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (key, value) VALUES ('schema_version', %s) ON CONFLICT (key) DO NOTHING"
                ).format(meta),
                (str(SCHEMA_VERSION),),
            )
            conn.execute(
                sql.SQL(
                    """CREATE TABLE IF NOT EXISTS {} (
                        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                        analyst text NOT NULL,
                        epsilon double precision NOT NULL CHECK (epsilon >= 0),
                        delta double precision NOT NULL CHECK (delta >= 0),
                        rho double precision CHECK (rho IS NULL OR rho >= 0),
                        status text NOT NULL
                            CHECK (status IN ('reserved', 'committed', 'released', 'abandoned')),
                        statement text NOT NULL DEFAULT '',
                        owner integer,
                        created_at timestamptz NOT NULL,
                        finished_at timestamptz
                    )"""
                ).format(t)
            )
            conn.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (analyst, status)").format(self._index, t)
            )
            # Exact sums (numeric) of each analyst's entries that are not released (ε: of those with ρ = 0).
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (analyst text PRIMARY KEY, epsilon numeric NOT NULL, "
                    "delta numeric NOT NULL, rho numeric NOT NULL DEFAULT 0)"
                ).format(self._totals_table)
            )
            conn.execute(
                sql.SQL(
                    """CREATE TABLE IF NOT EXISTS {} (
                        seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                        analyst text NOT NULL,
                        key text NOT NULL,
                        payload bytea NOT NULL,
                        created_at timestamptz NOT NULL,
                        UNIQUE (analyst, key)
                    )"""
                ).format(self._replay)
            )
            conn.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (analyst, seq)").format(
                    self._replay_index, self._replay
                )
            )
            conn.execute(
                sql.SQL(
                    """CREATE TABLE IF NOT EXISTS {} (
                        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                        at timestamptz NOT NULL,
                        analyst text NOT NULL,
                        client text NOT NULL DEFAULT '',
                        session_id text NOT NULL DEFAULT '',
                        statement_id bigint NOT NULL DEFAULT 0,
                        statement text NOT NULL DEFAULT '',
                        parameters text NOT NULL DEFAULT '[]',
                        kind text NOT NULL DEFAULT '',
                        status text NOT NULL
                            CHECK (status IN ('ok', 'refused', 'failed', 'running', 'abandoned')),
                        sqlstate text,
                        epsilon double precision NOT NULL DEFAULT 0,
                        delta double precision NOT NULL DEFAULT 0,
                        rho double precision NOT NULL DEFAULT 0,
                        replayed boolean NOT NULL DEFAULT false,
                        rows bigint NOT NULL DEFAULT 0,
                        duration double precision,
                        stages text NOT NULL DEFAULT '{{}}',
                        entry_id bigint UNIQUE
                    )"""
                ).format(self._audit)
            )
            conn.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (at)").format(self._audit_index, self._audit)
            )
            conn.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (analyst, at)").format(
                    self._audit_analyst_index, self._audit
                )
            )
            (version,) = conn.execute(
                sql.SQL("SELECT value FROM {} WHERE key = 'schema_version'").format(meta)
            ).fetchone()
            check_schema_version(int(version), f"table {self.table}")
            if int(version) < SCHEMA_VERSION:
                self._migrate(conn, int(version))

    def _migrate(self, conn: psycopg.Connection[Any], version: int) -> None:
        """Bring a version 1, 2 or 3 table to SCHEMA_VERSION, inside the schema transaction.

        Version 1 had no totals, version 2 no ρ total (and no replay table, created above): sum every
        analyst's entries once, exactly, in Python (PostgreSQL's float8 → numeric cast keeps only 15
        digits, which is not the double's value). Version 3 had no audit table (created above).
        """
        if version >= 3:
            conn.execute(
                sql.SQL("UPDATE {} SET value = %s WHERE key = 'schema_version'").format(self._meta),
                (str(SCHEMA_VERSION),),
            )
            return
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS rho numeric NOT NULL DEFAULT 0").format(
                self._totals_table
            )
        )
        entries: dict[str, list[tuple[float, float, float | None]]] = {}
        for analyst, epsilon, delta, rho in conn.execute(
            sql.SQL("SELECT analyst, epsilon, delta, rho FROM {} WHERE status <> 'released'").format(
                self._table
            )
        ):
            entries.setdefault(analyst, []).append((epsilon, delta, rho))
        conn.execute(sql.SQL("DELETE FROM {}").format(self._totals_table))
        for analyst, amounts in entries.items():
            totals = exact_totals(amounts)
            conn.execute(
                sql.SQL("INSERT INTO {} (analyst, epsilon, delta, rho) VALUES (%s, %s, %s, %s)").format(
                    self._totals_table
                ),
                (analyst, totals.epsilon, totals.delta, totals.rho),
            )
        conn.execute(
            sql.SQL("UPDATE {} SET value = %s WHERE key = 'schema_version'").format(self._meta),
            (str(SCHEMA_VERSION),),
        )

    def _abandon_orphans(self) -> None:
        with self._transaction() as conn:
            owners = [
                owner
                for (owner,) in conn.execute(
                    sql.SQL("SELECT DISTINCT owner FROM {} WHERE status = 'reserved'").format(self._table)
                )
                if owner != self._owner
            ]
            finished = _now()
            for owner in owners:
                if owner is not None:
                    # Succeeds only if no live session holds the owner's lock; released at commit.
                    (dead,) = conn.execute(
                        "SELECT pg_try_advisory_xact_lock(%s, %s)", (self._owner_lock_class, owner)
                    ).fetchone()
                    if not dead:
                        continue
                self._abandon_audit(conn, owner)
                conn.execute(
                    sql.SQL(
                        "UPDATE {} SET status = 'abandoned', finished_at = %s "
                        "WHERE status = 'reserved' AND owner IS NOT DISTINCT FROM %s"
                    ).format(self._table),
                    (finished, owner),
                )

    def _abandon_audit(self, conn: psycopg.Connection[Any], owner: int | None) -> None:
        """The audit rows of the owner's reserved entries say abandoned (before the entries do)."""
        conn.execute(
            sql.SQL(
                "UPDATE {a} SET status = %s WHERE status = %s AND entry_id IN (SELECT id FROM {t} "
                "WHERE status = 'reserved' AND owner IS NOT DISTINCT FROM %s)"
            ).format(a=self._audit, t=self._table),
            (ABANDONED, RUNNING, owner),
        )

    def _audit_insert(
        self, conn: psycopg.Connection[Any], record: StatementRecord, status: str | None
    ) -> int:
        (audit_id,) = conn.execute(
            sql.SQL("INSERT INTO {} ({}) VALUES ({}) RETURNING id").format(
                self._audit,
                sql.SQL(", ").join(sql.Identifier(c) for c in AUDIT_COLUMNS),
                sql.SQL(", ").join(sql.Placeholder() for _ in AUDIT_COLUMNS),
            ),
            audit_values(record, status=status),
        ).fetchone()
        return int(audit_id)

    def _audit_finish(self, conn: psycopg.Connection[Any], record: StatementRecord, extra: str = "") -> None:
        conn.execute(
            sql.SQL("UPDATE {} SET {} WHERE id = %s" + extra).format(
                self._audit,
                sql.SQL(", ").join(
                    sql.SQL("{} = %s").format(sql.Identifier(c)) for c in AUDIT_FINISH_COLUMNS
                ),
            ),
            (*audit_finish_values(record), record.audit_id),
        )

    def _totals(self, conn: psycopg.Connection[Any], analyst: str) -> Totals:
        row = conn.execute(
            sql.SQL("SELECT epsilon, delta, rho FROM {} WHERE analyst = %s").format(self._totals_table),
            (analyst,),
        ).fetchone()
        if row is None:
            return Totals()
        return Totals(decimal.Decimal(row[0]), decimal.Decimal(row[1]), decimal.Decimal(row[2]))

    def _add_to_totals(self, conn: psycopg.Connection[Any], analyst: str, cost: Cost, sign: int) -> None:
        epsilon, delta, rho = signed_amounts(cost, sign)
        conn.execute(
            sql.SQL(
                "INSERT INTO {t} (analyst, epsilon, delta, rho) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (analyst) DO UPDATE SET epsilon = {t}.epsilon + excluded.epsilon, "
                "delta = {t}.delta + excluded.delta, rho = {t}.rho + excluded.rho"
            ).format(t=self._totals_table),
            (analyst, epsilon, delta, rho),
        )

    def _lock_analyst(self, conn: psycopg.Connection[Any], analyst: str) -> None:
        conn.execute(
            "SELECT pg_advisory_xact_lock(%s, %s)",
            (self._analyst_lock_class, _lock_key(analyst)),
        )

    def _totals_of(self, analyst: str) -> Totals:
        with self._transaction() as conn:
            return self._totals(conn, analyst)

    def _reserve(
        self,
        analyst: str,
        cost: Cost,
        limit: Cost,
        statement: str,
        accounting: str,
        record: StatementRecord | None = None,
    ) -> Reservation:
        with self._transaction() as conn:
            # Read committed: every statement after the lock sees all reservations made before it.
            self._lock_analyst(conn, analyst)
            after = check_fits(analyst, self._totals(conn, analyst), cost, limit, accounting)
            self._add_to_totals(conn, analyst, cost, 1)
            (entry_id,) = conn.execute(
                sql.SQL(
                    "INSERT INTO {} (analyst, epsilon, delta, rho, status, statement, owner, created_at) "
                    "VALUES (%s, %s, %s, %s, 'reserved', %s, %s, %s) RETURNING id"
                ).format(self._table),
                (
                    analyst,
                    float(cost.epsilon),
                    float(cost.delta),
                    float(cost.rho),
                    statement,
                    self._owner,
                    _now(),
                ),
            ).fetchone()
            if record is not None:
                record.entry_id = entry_id
                record.audit_id = self._audit_insert(conn, record, RUNNING)
        return Reservation(id=entry_id, analyst=analyst, cost=cost, spent=after.spent)

    def _finish(
        self, reservation: Reservation, status: EntryStatus, record: StatementRecord | None = None
    ) -> None:
        with self._transaction() as conn:
            row = conn.execute(
                sql.SQL(
                    "SELECT analyst, epsilon, delta, rho, status FROM {} WHERE id = %s FOR UPDATE"
                ).format(self._table),
                (reservation.id,),
            ).fetchone()
            problem = finish_problem(reservation, status, row)
            if problem is not None:
                raise ValueError(problem)
            conn.execute(
                sql.SQL("UPDATE {} SET status = %s, finished_at = %s WHERE id = %s").format(self._table),
                (str(status), _now(), reservation.id),
            )
            if status == EntryStatus.RELEASED:
                self._add_to_totals(conn, reservation.analyst, reservation.cost, -1)
            if record is not None and record.audit_id is not None:
                self._audit_finish(conn, record)

    def reset(self, analyst: str) -> int:
        with self._transaction() as conn:
            self._lock_analyst(conn, analyst)
            # A query still running loses its entry: its record can never be finished, so it ends here.
            conn.execute(
                sql.SQL("UPDATE {} SET status = %s WHERE status = %s AND analyst = %s").format(self._audit),
                (ABANDONED, RUNNING, analyst),
            )
            conn.execute(sql.SQL("DELETE FROM {} WHERE analyst = %s").format(self._replay), (analyst,))
            conn.execute(sql.SQL("DELETE FROM {} WHERE analyst = %s").format(self._totals_table), (analyst,))
            cursor = conn.execute(
                sql.SQL("DELETE FROM {} WHERE analyst = %s").format(self._table), (analyst,)
            )
            return cursor.rowcount

    def _replay_get(self, analyst: str, key: str) -> bytes | None:
        with self._transaction() as conn:
            row = conn.execute(
                sql.SQL("SELECT payload FROM {} WHERE analyst = %s AND key = %s").format(self._replay),
                (analyst, key),
            ).fetchone()
        return bytes(row[0]) if row is not None else None

    def _replay_put(self, analyst: str, key: str, payload: bytes) -> None:
        with self._transaction() as conn:
            # Puts of one analyst take turns, so that eviction keeps exactly the newest replay_limit.
            conn.execute(
                "SELECT pg_advisory_xact_lock(%s, %s)", (self._replay_lock_class, _lock_key(analyst))
            )
            inserted = conn.execute(
                sql.SQL(
                    "INSERT INTO {} (analyst, key, payload, created_at) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT (analyst, key) DO NOTHING"
                ).format(self._replay),
                (analyst, key, payload, _now()),
            ).rowcount
            if inserted:
                conn.execute(
                    sql.SQL(
                        "DELETE FROM {r} WHERE analyst = %s AND seq <= (SELECT seq FROM {r} "
                        "WHERE analyst = %s ORDER BY seq DESC LIMIT 1 OFFSET %s)"
                    ).format(r=self._replay),
                    (analyst, analyst, self.replay_limit),
                )

    def _replay_forget(self, analyst: str) -> int:
        with self._transaction() as conn:
            return conn.execute(
                sql.SQL("DELETE FROM {} WHERE analyst = %s").format(self._replay), (analyst,)
            ).rowcount

    def history(self, analyst: str, limit: int = 50) -> list[LedgerEntry]:
        if limit < 0:
            raise ValueError(f"history limit must be >= 0, not {limit}")
        with self._transaction() as conn:
            rows = conn.execute(
                sql.SQL(
                    "SELECT id, analyst, epsilon, delta, status, statement, created_at, finished_at, rho "
                    "FROM {} WHERE analyst = %s ORDER BY id DESC LIMIT %s"
                ).format(self._table),
                (analyst, limit),
            ).fetchall()
        return [
            LedgerEntry(
                id=row[0],
                analyst=row[1],
                epsilon=row[2],
                delta=row[3],
                status=EntryStatus(row[4]),
                statement=row[5],
                created_at=row[6].astimezone(UTC),
                finished_at=row[7].astimezone(UTC) if row[7] is not None else None,
                rho=row[8] or 0.0,
            )
            for row in rows
        ]

    def _audit_write(self, records: list[StatementRecord]) -> None:
        with self._transaction() as conn:
            for record in records:
                if record.audit_id is None:
                    record.audit_id = self._audit_insert(conn, record, None)
                else:
                    # Only once its charge is finished: an abandoned record stays so.
                    self._audit_finish(conn, record, f" AND status NOT IN ('{RUNNING}', '{ABANDONED}')")

    def _audit_entries(
        self,
        analyst: str | None,
        since: datetime | None,
        until: datetime | None,
        status: str | None,
        limit: int,
    ) -> list[AuditEntry]:
        where: list[sql.Composable] = []
        params: list[Any] = []
        if analyst is not None:
            where.append(sql.SQL("analyst = %s"))
            params.append(analyst)
        if since is not None:
            where.append(sql.SQL("at >= %s"))
            params.append(since)
        if until is not None:
            where.append(sql.SQL("at < %s"))
            params.append(until)
        if status is not None:
            where.append(sql.SQL("status = %s"))
            params.append(status)
        clause = sql.SQL("WHERE {} ").format(sql.SQL(" AND ").join(where)) if where else sql.SQL("")
        with self._transaction() as conn:
            rows = conn.execute(
                sql.SQL("SELECT id, {} FROM {} {}ORDER BY at DESC, id DESC LIMIT %s").format(
                    sql.SQL(", ").join(sql.Identifier(c) for c in AUDIT_COLUMNS), self._audit, clause
                ),
                (*params, limit),
            ).fetchall()
        return [audit_entry(row, row[1].astimezone(UTC)) for row in rows]

    def _prune_audit(self, before: datetime) -> int:
        with self._transaction() as conn:
            return conn.execute(
                sql.SQL("DELETE FROM {} WHERE at < %s AND status <> %s").format(self._audit),
                (before, RUNNING),
            ).rowcount

    def analysts(self) -> list[str]:
        with self._transaction() as conn:
            rows = conn.execute(
                sql.SQL("SELECT DISTINCT analyst FROM {} ORDER BY analyst").format(self._table)
            ).fetchall()
        return [analyst for (analyst,) in rows]

    def close(self) -> None:
        if self._closed:
            return
        try:
            with self._transaction() as conn:
                self._abandon_audit(conn, self._owner)
                conn.execute(
                    sql.SQL(
                        "UPDATE {} SET status = 'abandoned', finished_at = %s "
                        "WHERE status = 'reserved' AND owner = %s"
                    ).format(self._table),
                    (_now(), self._owner),
                )
        finally:
            self._closed = True
            self._pool.close()
            self._owner_conn.close()

    def __repr__(self) -> str:
        return f"PostgresLedger(table={self.table!r})"
