"""Free replay keyed on what the operator controls: the policy, the question, ε, δ and the data epoch.

Whether a repeat is free or charged is visible to the analyst. Were it keyed on the data's version
(write statistics, file times), it would say exactly when a table was written. These tests write to
the tables between two identical questions, on both backends, and check that the repeat is still
free within one epoch, that a new epoch answers afresh, and that replay never calls the backend.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import duckdb
import psycopg
import pytest

from dpproxy.backends import Backend, BackendUnreachable, Cancellation, LiveColumn, open_backend
from dpproxy.backends.duckdb import DuckDBBackend
from dpproxy.budget.sqlite import SQLiteLedger
from dpproxy.engine import Engine
from dpproxy.errors import BackendUnavailable
from dpproxy.policy import Policy, parse_policy
from dpproxy.sql.bounds import SessionBounds
from dpproxy.sql.clock import CLOCK, Clock

POLICY = """
version: 1
defaults: {{epsilon: 0.5, data_epoch: {epoch}}}
analysts: {{alice: {{epsilon: 10, delta: 1.0e-5}}}}
tables:
  people:
    privacy_unit: id
    columns: {{id: {{type: integer}}, age: {{type: integer, lower: 0, upper: 120}}}}
"""

SQL = "SELECT COUNT(*), AVG(age) FROM people WHERE age > 10"


def policy(epoch: str = "0") -> Policy:
    """The policy with `data_epoch` written as the YAML text `epoch`."""
    return parse_policy(POLICY.format(epoch=epoch))


def spent(engine: Engine) -> float:
    return engine.budget("alice").spent.epsilon


def build_duckdb(path: Path, persons: int) -> None:
    with duckdb.connect(str(path)) as conn:
        conn.execute("CREATE TABLE people (id integer, age integer)")
        conn.execute(f"INSERT INTO people SELECT i, i % 90 FROM range({persons}) t(i)")


@pytest.fixture
def people_pg(pg_conn: psycopg.Connection, pg_dsn: str) -> str:
    pg_conn.execute("CREATE TABLE people (id integer, age integer)")
    pg_conn.execute("INSERT INTO people SELECT i, i % 90 FROM generate_series(1, 500) i")
    return pg_dsn


def test_replay_epoch_a_write_to_postgres_does_not_end_replay(
    people_pg: str, pg_conn: psycopg.Connection, tmp_path: Path
) -> None:
    """Committed and rolled-back writes change PostgreSQL's write statistics; replay ignores them."""
    ledger = tmp_path / "ledger.sqlite"
    with Engine(policy(), open_backend(people_pg), SQLiteLedger(ledger)) as engine:
        first = engine.execute(SQL, analyst="alice")
        assert not first.replayed and spent(engine) == pytest.approx(0.5)
        before = _writes(pg_conn)
        pg_conn.execute("INSERT INTO people VALUES (9001, 50)")
        with pytest.raises(psycopg.errors.DivisionByZero), pg_conn.transaction():
            pg_conn.execute("INSERT INTO people VALUES (9002, 60)")
            pg_conn.execute("SELECT 1 / 0")  # rolls the insert back
        _wait_for_writes(pg_conn, before + 2)  # what the old data version followed
        again = engine.execute(SQL, analyst="alice")
        assert again.replayed and again.rows == first.rows and again.cost.epsilon == 0
        assert spent(engine) == pytest.approx(0.5)
    # A new epoch: the same question is answered afresh (it now sees the committed row) and charged.
    with Engine(policy("1"), open_backend(people_pg), SQLiteLedger(ledger)) as engine:
        fresh = engine.execute(SQL, analyst="alice")
        assert not fresh.replayed and spent(engine) == pytest.approx(1.0)
        assert engine.execute(SQL, analyst="alice").replayed
        assert spent(engine) == pytest.approx(1.0)


def _wait_for_writes(conn: psycopg.Connection, count: int) -> None:
    """Until the statistics show `count` inserts into people (they trail commits slightly)."""
    deadline = time.monotonic() + 10
    while _writes(conn) < count:
        assert time.monotonic() < deadline, "the write statistics never changed"
        conn.execute("SELECT pg_stat_force_next_flush()")
        time.sleep(0.1)


def _writes(conn: psycopg.Connection) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute("SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'people'").fetchone()
    return int(row[0]) if row else 0


def test_replay_epoch_a_rewritten_duckdb_file_does_not_end_replay(tmp_path: Path) -> None:
    """A DuckDB file replaced by one with other data (new size, new time): same epoch, same answer."""
    path, ledger = tmp_path / "people.duckdb", tmp_path / "ledger.sqlite"
    build_duckdb(path, 500)
    with Engine(policy(), open_backend(str(path)), SQLiteLedger(ledger)) as engine:
        first = engine.execute(SQL, analyst="alice")
    before = path.stat()
    build_duckdb(tmp_path / "new.duckdb", 501)
    os.replace(tmp_path / "new.duckdb", path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    assert path.stat().st_mtime_ns != before.st_mtime_ns
    with Engine(policy(), open_backend(str(path)), SQLiteLedger(ledger)) as engine:
        again = engine.execute(SQL, analyst="alice")
        assert again.replayed and again.rows == first.rows and spent(engine) == pytest.approx(0.5)
    with Engine(policy("2024-06-01"), open_backend(str(path)), SQLiteLedger(ledger)) as engine:
        assert not engine.execute(SQL, analyst="alice").replayed
        assert spent(engine) == pytest.approx(1.0)
        assert engine.execute(SQL, analyst="alice").replayed


def test_replay_epoch_is_part_of_the_key_and_other_epochs_keep_their_answers(tmp_path: Path) -> None:
    path, ledger = tmp_path / "people.duckdb", tmp_path / "ledger.sqlite"
    build_duckdb(path, 500)
    answers: dict[str, list[tuple[object, ...]]] = {}
    for epoch in ("0", "1", '"1"', "0"):  # text "1" is another epoch than 1; back to 0 finds 0's answer
        with Engine(policy(epoch), open_backend(str(path)), SQLiteLedger(ledger)) as engine:
            result = engine.execute(SQL, analyst="alice")
            assert result.replayed == (epoch in answers)
            assert result.rows == answers.setdefault(epoch, result.rows)
            assert engine.budget("alice").spent.epsilon == pytest.approx(0.5 * len(answers))
    assert len(answers) == 3


class _Tripwire(Backend):
    """A real backend until `trip()`; then every call is counted and fails as an unreachable database."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.dialect = inner.dialect
        self.default_schema = inner.default_schema
        self.tripped = False
        self.calls_after_trip = 0

    def trip(self) -> None:
        self.tripped = True

    def _check(self) -> None:
        if self.tripped:
            self.calls_after_trip += 1
            raise BackendUnreachable("tripwire: the backend was called")

    def run(self, sql: str, *, cancel: Cancellation | None = None) -> list[tuple]:
        self._check()
        return self.inner.run(sql, cancel=cancel)

    def unique_columns(self, schema: str | None = None) -> dict[str, set[str]]:
        self._check()
        return self.inner.unique_columns(schema)

    def tables(self, schema: str | None = None) -> dict[str, list[LiveColumn]]:
        self._check()
        return self.inner.tables(schema)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def tripwire(tmp_path: Path) -> Iterator[_Tripwire]:
    path = tmp_path / "people.duckdb"
    build_duckdb(path, 500)
    backend = _Tripwire(open_backend(str(path)))
    yield backend
    backend.close()


def test_replay_epoch_replay_never_calls_the_backend(tripwire: _Tripwire, tmp_path: Path) -> None:
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite")
    engine = Engine(policy(), tripwire, ledger)
    first = engine.execute(SQL, analyst="alice")
    tripwire.trip()
    again = engine.execute(SQL, analyst="alice")
    assert again.replayed and again.rows == first.rows
    assert tripwire.calls_after_trip == 0
    # A question not asked before does need the backend (and, unreachable, is not charged).
    with pytest.raises(BackendUnavailable, match="nothing was charged"):
        engine.execute(SQL.replace("> 10", "> 11"), analyst="alice")
    assert tripwire.calls_after_trip == 1 and spent(engine) == pytest.approx(0.5)
    # Nor does replay need a backend at all: an engine without one hands out the stored answer.
    without = Engine(policy(), None, ledger, dialect="duckdb")
    stored = without.execute(SQL, analyst="alice")
    assert stored.replayed and stored.rows == first.rows
    ledger.close()


def test_replay_epoch_backend_offers_no_data_version() -> None:
    """No live statistics or file metadata may reach the replay key: the backends no longer offer any."""
    assert not hasattr(Backend, "data_version")
    with DuckDBBackend.from_statements([]) as backend:
        assert not hasattr(backend, "data_version")


def test_replay_keys_the_bounds_the_session_set_and_its_time_zone(tmp_path: Path) -> None:
    """A repeat under other session bounds (which the statement's text does not show) or in another
    time zone (which casts to timestamptz are folded in) is another question: answered afresh and
    charged, never the answer to the earlier settings; under the same ones, free."""
    path, ledger = tmp_path / "people.duckdb", tmp_path / "ledger.sqlite"
    build_duckdb(path, 500)
    text = POLICY.format(epoch=0).replace("privacy_unit: id", "privacy_unit: id\n    max_rows_per_unit: 10")
    with Engine(parse_policy(text), open_backend(str(path)), SQLiteLedger(ledger)) as engine:
        one, two = SessionBounds(rows=1), SessionBounds(rows=2)
        assert not engine.execute(SQL, analyst="alice", bounds=one).replayed
        assert engine.execute(SQL, analyst="alice", bounds=one).replayed
        again = engine.execute(SQL, analyst="alice", bounds=two)
        assert not again.replayed and "at most 2 row(s) per person" in " ".join(again.notes)
        assert spent(engine) == pytest.approx(1.0)
        token = CLOCK.set(Clock(datetime.now(UTC), ZoneInfo("Asia/Tokyo")))
        try:
            assert not engine.execute(SQL, analyst="alice", bounds=one).replayed
            assert engine.execute(SQL, analyst="alice", bounds=one).replayed
        finally:
            CLOCK.reset(token)
        assert spent(engine) == pytest.approx(1.5)
