"""The ledger in one PostgreSQL table, shared by any number of processes.

This module is the PostgreSQL store of dpproxy.budget.ledger.Ledger: its layout (entries, exact
totals as numeric, stored answers, the audit log, the schema version), its one migration step of its
own, its transactions (READ COMMITTED, from a pool) under per-analyst advisory locks, and owner
liveness: each live ledger instance holds a session advisory lock on a connection of its own. What
the ledger does with them is written once, in dpproxy.budget.ledger.
"""

from __future__ import annotations

import re
import secrets
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from dpproxy.audit import Status
from dpproxy.budget.composition import signed_amounts
from dpproxy.budget.ledger import REPLAY_LIMIT, EntryStatus, Ledger, check_list
from dpproxy.errors import DPProxyError
from dpproxy.privacy.accounting import Cost

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


# Indexes named within PostgreSQL's 63 bytes (the entries' own, older, is not).
_INDEXES = ("replay_seq", "audit_at", "audit_analyst_at")


def _pg_index_name(table: str, suffix: str) -> str:
    """An index name within PostgreSQL's 63 bytes, distinct per table even when the table's is long."""
    name = f"{table}_{suffix}"
    if len(name) <= 63:
        return name
    return f"{table[: 63 - len(suffix) - 10]}_{zlib.crc32(table.encode()):08x}_{suffix}"


class PostgresLedger(Ledger):
    """A ledger in one PostgreSQL table (created on first open), shared by any number of processes.

    Beside it live `<table>_meta`, `<table>_totals`, `<table>_replay` and `<table>_audit`.
    Reservations of one analyst are serialised by a transaction-scoped advisory lock; the owner of
    each ledger instance is a session advisory lock held on a dedicated connection. If that
    connection is lost while the instance lives on, another instance opening the table takes its
    open reservations for orphans and abandons them: still spent, but their commit then fails.
    """

    PLACEHOLDER = "%s"
    FOR_UPDATE = " FOR UPDATE"  # a release changes the totals without the analyst's lock

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
        super().__init__(
            tables=lambda suffix: sql.Identifier(*parts[:-1], parts[-1] + suffix).as_string(),
            where=f"table {table}",
            replay_limit=replay_limit,
        )
        name = parts[-1]
        self._indexes = {
            "analyst_status": sql.Identifier(name + "_analyst_status").as_string(),
            **{suffix: sql.Identifier(_pg_index_name(name, suffix)).as_string() for suffix in _INDEXES},
        }
        self._analyst_lock_class = _lock_key("dpproxy ledger analyst", table)
        self._owner_lock_class = _lock_key("dpproxy ledger owner", table)
        self._schema_lock_class = _lock_key("dpproxy ledger schema", table)
        self._replay_lock_class = _lock_key("dpproxy ledger replay", table)
        self._closed = False
        try:
            self._owner_conn = psycopg.connect(dsn, autocommit=True)
        except psycopg.Error as exc:  # an unparsable DSN too: libpq's text may quote its password
            from dpproxy.backends.postgres import mask_password

            raise DPProxyError(
                f"cannot connect to the PostgreSQL privacy ledger: {mask_password(str(exc), dsn)}",
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

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._abandon_own()
        finally:
            self._closed = True
            assert self._pool is not None
            self._pool.close()
            self._owner_conn.close()

    def __repr__(self) -> str:
        return f"PostgresLedger(table={self.table!r})"

    # --- The store interface -------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, *, durable: bool = True) -> Iterator[psycopg.Connection[Any]]:
        if self._closed or self._pool is None:
            raise ValueError(f"the privacy ledger table {self.table} is closed")
        with self._pool.connection() as conn, conn.transaction():
            yield conn

    def _read(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._transaction() as conn:
            return conn.execute(query, params).fetchall()

    def _lock(self, conn: psycopg.Connection[Any], kind: str, analyst: str | None) -> None:
        # Read committed: every statement after the lock sees what the previous holder committed.
        lock_class = {
            "analyst": self._analyst_lock_class,
            "replay": self._replay_lock_class,
            # Concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog: serialise it.
            "schema": self._schema_lock_class,
        }[kind]
        key = _lock_key(analyst) if analyst is not None else 0
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (lock_class, key))

    def _insert(self, conn: psycopg.Connection[Any], query: str, params: Sequence[Any]) -> int:
        (row_id,) = conn.execute(query + " RETURNING id", params).fetchone()
        return int(row_id)

    def _stamp(self, moment: datetime) -> datetime:
        return moment

    def _moment(self, stored: Any) -> datetime:
        return stored.astimezone(UTC)

    def _change_totals(self, conn: psycopg.Connection[Any], analyst: str, cost: Cost, sign: int) -> None:
        # In numeric, by the database: a release changes them without the analyst's lock.
        conn.execute(
            self._sql(
                "INSERT INTO {totals} (analyst, epsilon, delta, rho) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (analyst) DO UPDATE SET epsilon = {totals}.epsilon + excluded.epsilon, "
                "delta = {totals}.delta + excluded.delta, rho = {totals}.rho + excluded.rho"
            ),
            (analyst, *signed_amounts(cost, sign)),
        )

    @contextmanager
    def _dead_owners(
        self, conn: psycopg.Connection[Any], owners: list[int | None]
    ) -> Iterator[list[int | None]]:
        dead = []
        for owner in owners:
            # Succeeds only if no live session holds the owner's lock; released at commit.
            if (
                owner is None
                or conn.execute(
                    "SELECT pg_try_advisory_xact_lock(%s, %s)", (self._owner_lock_class, owner)
                ).fetchone()[0]
            ):
                dead.append(owner)
        yield dead

    def _schema(self) -> list[str]:
        t, i = self._tables, self._indexes
        return [
            f"CREATE TABLE IF NOT EXISTS {t['meta']} (key text PRIMARY KEY, value text NOT NULL)",
            f"""CREATE TABLE IF NOT EXISTS {t["entries"]} (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                analyst text NOT NULL,
                epsilon double precision NOT NULL CHECK (epsilon >= 0),
                delta double precision NOT NULL CHECK (delta >= 0),
                rho double precision CHECK (rho IS NULL OR rho >= 0),
                status text NOT NULL CHECK (status IN ({check_list(EntryStatus)})),
                statement text NOT NULL DEFAULT '',
                owner integer,
                created_at timestamptz NOT NULL,
                finished_at timestamptz
            )""",
            f"CREATE INDEX IF NOT EXISTS {i['analyst_status']} ON {t['entries']} (analyst, status)",
            # Exact sums (numeric) of each analyst's entries that are not released (ε: of those with ρ = 0).
            f"CREATE TABLE IF NOT EXISTS {t['totals']} (analyst text PRIMARY KEY, epsilon numeric NOT NULL, "
            "delta numeric NOT NULL, rho numeric NOT NULL DEFAULT 0)",
            f"""CREATE TABLE IF NOT EXISTS {t["replay"]} (
                seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                analyst text NOT NULL,
                key text NOT NULL,
                payload bytea NOT NULL,
                created_at timestamptz NOT NULL,
                UNIQUE (analyst, key)
            )""",
            f"CREATE INDEX IF NOT EXISTS {i['replay_seq']} ON {t['replay']} (analyst, seq)",
            f"""CREATE TABLE IF NOT EXISTS {t["audit"]} (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                at timestamptz NOT NULL,
                analyst text NOT NULL,
                client text NOT NULL DEFAULT '',
                session_id text NOT NULL DEFAULT '',
                statement_id bigint NOT NULL DEFAULT 0,
                statement text NOT NULL DEFAULT '',
                parameters text NOT NULL DEFAULT '[]',
                kind text NOT NULL DEFAULT '',
                status text NOT NULL CHECK (status IN ({check_list(Status)})),
                sqlstate text,
                message text,
                epsilon double precision NOT NULL DEFAULT 0,
                delta double precision NOT NULL DEFAULT 0,
                rho double precision NOT NULL DEFAULT 0,
                replayed boolean NOT NULL DEFAULT false,
                rows bigint NOT NULL DEFAULT 0,
                duration double precision,
                stages text NOT NULL DEFAULT '{{}}',
                entry_id bigint UNIQUE
            )""",
            f"CREATE INDEX IF NOT EXISTS {i['audit_at']} ON {t['audit']} (at)",
            f"CREATE INDEX IF NOT EXISTS {i['audit_analyst_at']} ON {t['audit']} (analyst, at)",
        ]

    def _add_audit_message(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(self._sql("ALTER TABLE {audit} ADD COLUMN IF NOT EXISTS message text"))

    def _add_rho_total(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            self._sql("ALTER TABLE {totals} ADD COLUMN IF NOT EXISTS rho numeric NOT NULL DEFAULT 0")
        )
