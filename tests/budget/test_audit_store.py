"""The audit table of both stores: a charged statement's record is written with its reservation and
finished with its commit or release; uncharged records are written on their own; `audit_entries`
filters and orders them; old ones are pruned (never one still reserved); schema 3 gains the table; the policy's retention is applied when an engine opens the ledger.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import yaml

from dpproxy.audit import StatementRecord, Status
from dpproxy.budget import SCHEMA_VERSION, Ledger, open_ledger
from dpproxy.engine import Engine
from dpproxy.errors import BudgetExhausted, PolicyError
from dpproxy.policy import parse_policy
from dpproxy.privacy.accounting import Cost
from tests.budget.stores import BUDGET, Store

DEMO_POLICY = Path(__file__).resolve().parents[2] / "dpproxy" / "data" / "demo.yaml"


def record(
    analyst: str = "alice", statement: str = "SELECT COUNT(*) FROM t", **fields: object
) -> StatementRecord:
    made = StatementRecord(analyst, statement, client="10.0.0.1:5000", session_id="ab" * 8, **fields)  # type: ignore[arg-type]
    return made


def test_a_charge_and_its_record_are_written_together(ledger: Ledger) -> None:
    sent = record(parameters=(40, "F", None, 1.5), statement_id=3, kind="private")
    reservation = ledger.reserve("alice", Cost(0.5, 0.0), BUDGET, statement="SELECT …", record=sent)
    (running,) = ledger.audit_entries()
    assert (running.status, running.cost, running.entry_id) == ("running", Cost(0.5, 0.0), reservation.id)
    assert running.parameters == (40, "F", None, 1.5) and running.statement_id == 3
    assert running.client == "10.0.0.1:5000" and running.session_id == "ab" * 8
    sent.rows = 7
    sent.add_stage("backend", 0.25)
    sent.finish()
    ledger.commit(reservation)
    (done,) = ledger.audit_entries()
    assert (done.status, done.rows, done.stages, done.kind) == ("ok", 7, {"backend": 0.25}, "private")
    assert done.duration == sent.duration and done.charged


def test_a_charge_reserved_without_a_record_still_gets_one(ledger: Ledger) -> None:
    """Callers of the Ledger that pass no record (the Python API's Engine.run) cannot charge
    without an audit row: the ledger writes one of the statement alone, finished with the charge."""
    reservation = ledger.reserve("alice", Cost(0.5, 0.0), BUDGET, statement="SELECT 1 FROM t")
    (running,) = ledger.audit_entries()
    assert (running.status, running.cost, running.entry_id) == ("running", Cost(0.5, 0.0), reservation.id)
    assert (running.statement, running.client, running.analyst) == ("SELECT 1 FROM t", "local", "alice")
    ledger.commit(reservation)
    (done,) = ledger.audit_entries()
    assert (done.status, done.cost) == ("ok", Cost(0.5, 0.0))


def test_a_reset_ends_the_records_of_charges_it_deletes(ledger: Ledger) -> None:
    """`budget reset` while a query runs deletes its entry: its record can never be finished, so it
    says abandoned rather than running for ever (which pruning would keep)."""
    ledger.reserve("alice", Cost(0.5, 0.0), BUDGET, record=record())
    ledger.reserve("bob", Cost(0.5, 0.0), BUDGET, record=record("bob"))
    ledger.reset("alice")
    statuses = {e.analyst: e.status for e in ledger.audit_entries()}
    assert statuses == {"alice": "abandoned", "bob": "running"}


def test_a_released_charge_records_no_cost(ledger: Ledger) -> None:
    sent = record()
    reservation = ledger.reserve("alice", Cost(0.5, 1e-7), BUDGET, record=sent)
    sent.error("57014")  # cancelled before its statement was sent: refused
    ledger.release(reservation, sent)
    (entry,) = ledger.audit_entries()
    assert (entry.status, entry.sqlstate, entry.cost) == ("refused", "57014", Cost.ZERO)
    assert ledger.spent("alice") == Cost.ZERO


def test_a_refused_reservation_writes_nothing(ledger: Ledger) -> None:
    sent = record()
    with pytest.raises(BudgetExhausted):
        ledger.reserve("alice", Cost(11.0, 0.0), BUDGET, record=sent)
    assert ledger.audit_entries() == [] and sent.cost == Cost.ZERO and sent.entry_id is None
    sent.error("53400")
    ledger.audit_write([sent])
    (entry,) = ledger.audit_entries()
    assert (entry.status, entry.sqlstate, entry.entry_id) == ("refused", "53400", None)


def test_entries_are_filtered_and_newest_first(ledger: Ledger) -> None:
    now = datetime.now(UTC)
    batch = []
    for i, (analyst, status) in enumerate(
        [("alice", Status.OK), ("bob", Status.OK), ("alice", Status.REFUSED), ("alice", Status.FAILED)]
    ):
        made = record(analyst, f"SELECT {i}", at=now - timedelta(hours=4 - i), statement_id=i)
        made.status = status
        batch.append(made)
    ledger.audit_write(batch)
    assert [e.statement for e in ledger.audit_entries()] == ["SELECT 3", "SELECT 2", "SELECT 1", "SELECT 0"]
    assert [e.statement for e in ledger.audit_entries(analyst="alice", limit=2)] == ["SELECT 3", "SELECT 2"]
    assert [e.statement for e in ledger.audit_entries(status="refused")] == ["SELECT 2"]
    window = ledger.audit_entries(since=now - timedelta(hours=3), until=now - timedelta(hours=1))
    assert [e.statement for e in window] == ["SELECT 2", "SELECT 1"]  # since inclusive, until not
    assert ledger.audit_entries(analyst="carol") == []
    with pytest.raises(ValueError, match="status must be one of"):
        ledger.audit_entries(status="bogus")
    with pytest.raises(ValueError, match="time zone"):
        ledger.audit_entries(since=datetime(2026, 1, 1))


def test_a_finished_record_is_completed_but_an_abandoned_one_stays(store: Store) -> None:
    first = store.open()
    sent = record()
    reservation = first.reserve("alice", Cost(0.5, 0.0), BUDGET, record=sent)
    first.commit(reservation)
    sent.add_stage("wire", 0.125)
    first.audit_write([sent])  # what the session adds once the answer was sent
    assert first.audit_entries()[0].stages == {"wire": 0.125}
    pending = record(statement="SELECT 2")
    first.reserve("alice", Cost(0.5, 0.0), BUDGET, record=pending)
    first.close()  # its open reservation is abandoned, and its record with it
    second = store.open()
    assert [(e.statement, e.status) for e in second.audit_entries()] == [
        ("SELECT 2", "abandoned"),
        ("SELECT COUNT(*) FROM t", "ok"),
    ]
    pending.finish()
    second.audit_write([pending])  # a late completion does not hide the abandonment
    assert second.audit_entries()[0].status == "abandoned"
    assert second.spent("alice").epsilon == 1.0


def test_prune_deletes_old_records_but_never_a_running_one(ledger: Ledger) -> None:
    old = datetime.now(UTC) - timedelta(days=400)
    finished = record(statement="old and done", at=old)
    running = record(statement="old and running", at=old)
    fresh = record(statement="fresh")
    ledger.audit_write([finished, fresh])
    ledger.reserve("alice", Cost(0.5, 0.0), BUDGET, record=running)
    assert ledger.prune_audit(datetime.now(UTC) - timedelta(days=365)) == 1
    assert sorted(e.statement for e in ledger.audit_entries()) == ["fresh", "old and running"]


def test_version_3_ledger_gains_the_audit_table(store: Store) -> None:
    with store.open() as ledger:
        ledger.commit(ledger.reserve("alice", Cost(0.5, 0.0), BUDGET))
    drop = "DROP TABLE {}_audit"
    downgrade = "UPDATE {}_meta SET value = '3' WHERE key = 'schema_version'"
    if store.kind == "sqlite":
        with sqlite3.connect(store.spec) as conn:
            conn.execute(drop.format("dpproxy_ledger"))
            conn.execute(downgrade.format("dpproxy_ledger"))
    else:
        with psycopg.connect(store.spec) as conn:
            conn.execute(drop.format(store.table))
            conn.execute(downgrade.format(store.table))
    with store.open() as ledger:
        assert ledger.spent("alice").epsilon == 0.5
        assert ledger.audit_entries() == []
        ledger.audit_write([record()])
        assert len(ledger.audit_entries()) == 1
    query = "SELECT value FROM {}_meta WHERE key = 'schema_version'"
    if store.kind == "sqlite":
        with sqlite3.connect(store.spec) as conn:
            assert conn.execute(query.format("dpproxy_ledger")).fetchone() == (str(SCHEMA_VERSION),)
    else:
        with psycopg.connect(store.spec) as conn:
            assert conn.execute(query.format(store.table)).fetchone() == (str(SCHEMA_VERSION),)


def test_version_4_ledger_gains_the_audit_message_and_keeps_its_records(store: Store) -> None:
    with store.open() as ledger:
        ledger.audit_write([record(statement="before the message column")])
    table = "dpproxy_ledger" if store.kind == "sqlite" else store.table
    statements = [f"ALTER TABLE {table}_audit DROP COLUMN message", f"UPDATE {table}_meta SET value = '4'"]
    if store.kind == "sqlite":
        with sqlite3.connect(store.spec) as conn:
            for statement in statements:
                conn.execute(statement)
    else:
        with psycopg.connect(store.spec) as conn:
            for statement in statements:
                conn.execute(statement)
    with store.open() as ledger:
        (old,) = ledger.audit_entries()
        assert old.statement == "before the message column" and old.message is None
        refused = record(statement="SELECT zip FROM patients")
        refused.error("42501", 'SELECT zip would return raw rows of the protected table "patients"')
        ledger.audit_write([refused])
        assert ledger.audit_entries()[0].message == refused.message


def test_retention_is_a_policy_key_applied_when_the_engine_opens(tmp_path: Path) -> None:
    demo = yaml.safe_load(DEMO_POLICY.read_text())
    demo["server"] = {"audit_retention_days": -1}
    with pytest.raises(PolicyError, match=r"server\.audit_retention_days.*must be 0 or more"):
        parse_policy(yaml.safe_dump(demo))
    assert parse_policy(DEMO_POLICY.read_text()).server.audit_retention_days == 365
    ledger_path = tmp_path / "ledger.sqlite"
    with open_ledger(ledger_path) as ledger:
        ledger.audit_write(
            [
                record(statement="40 days old", at=datetime.now(UTC) - timedelta(days=40)),
                record(statement="10 days old", at=datetime.now(UTC) - timedelta(days=10)),
            ]
        )
    for days, kept in ((0, ["10 days old", "40 days old"]), (30, ["10 days old"])):
        demo["server"] = {"audit_retention_days": days}
        with Engine(parse_policy(yaml.safe_dump(demo)), None, open_ledger(ledger_path)) as engine:
            assert engine.ledger is not None
            assert [e.statement for e in engine.ledger.audit_entries()] == kept
