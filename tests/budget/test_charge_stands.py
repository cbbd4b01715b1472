"""A plan's charge stands once any of its statements has been sent to the backend.

A plan can have two statements (the per-person sums, then the row pipeline). A cancel or a lost
backend on the second comes after the first has read the data: releasing the charge then would let
an analyst learn, for free, what the first statement did (whether it failed, how long it took). Only
a failure before the first statement was sent gives the cost back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dpproxy.backends import Backend, BackendUnreachable, Cancellation, LiveColumn, QueryCancelled
from dpproxy.backends.duckdb import DuckDBBackend
from dpproxy.budget.sqlite import SQLiteLedger
from dpproxy.engine import Engine
from dpproxy.errors import BackendUnavailable, DPProxyError, QueryCanceled
from dpproxy.policy import parse_policy

POLICY = """
version: 1
defaults: {epsilon: 0.5}
analysts: {alice: {epsilon: 10, delta: 1.0e-5}}
tables:
  people:
    privacy_unit: id
    columns: {id: {type: integer}, age: {type: integer, lower: 0, upper: 120}}
"""

# COUNT(*) comes from the per-person sums, MEDIAN from the row pipeline: two statements.
SQL = "SELECT COUNT(*), MEDIAN(age) FROM people"


class _FailsOnStatement(Backend):
    """A real DuckDB backend whose `nth` run (1-based) calls `before` first, then runs as usual."""

    def __init__(self, nth: int, before: Callable[[Cancellation | None], None]) -> None:
        self.inner = DuckDBBackend.from_statements(
            [
                "CREATE TABLE people (id integer, age integer)",
                "INSERT INTO people SELECT i % 300, i % 90 FROM range(1000) t(i)",
            ]
        )
        self.dialect = self.inner.dialect
        self.default_schema = self.inner.default_schema
        self.nth = nth
        self.before = before
        self.runs = 0

    def run(self, sql: str, *, cancel: Cancellation | None = None) -> list[tuple]:
        self.runs += 1
        if self.runs == self.nth:
            self.before(cancel)
        return self.inner.run(sql, cancel=cancel)

    def unique_columns(self, schema: str | None = None) -> dict[str, set[str]]:
        return self.inner.unique_columns(schema)

    def tables(self, schema: str | None = None) -> dict[str, list[LiveColumn]]:
        return self.inner.tables(schema)

    def close(self) -> None:
        self.inner.close()


def _cancelled_before_start(cancel: Cancellation | None) -> None:
    raise QueryCancelled("cancelled before it started", started=False)


def _unreachable(cancel: Cancellation | None) -> None:
    raise BackendUnreachable("no connection became free")


def _client_cancels(cancel: Cancellation | None) -> None:
    # A CancelRequest arriving between two statements: the real backend then refuses to start.
    assert cancel is not None
    cancel.cancel()


FAILURES = {
    "cancelled": (_cancelled_before_start, QueryCanceled, "57014"),
    "unreachable": (_unreachable, BackendUnavailable, "08006"),
    "client-cancel": (_client_cancels, QueryCanceled, "57014"),
}


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[SQLiteLedger]:
    with SQLiteLedger(tmp_path / "ledger.sqlite") as opened:
        yield opened


def run_failing(nth: int, failure: str, ledger: SQLiteLedger) -> DPProxyError:
    before, error, sqlstate = FAILURES[failure]
    with _FailsOnStatement(nth, before) as backend:  # the engine would close the ledger too
        engine = Engine(parse_policy(POLICY), backend, ledger)
        assert len(engine.plan(SQL).statements) == 2
        with pytest.raises(error) as caught:
            engine.execute(SQL, analyst="alice", cancel=Cancellation())
    assert caught.value.sqlstate == sqlstate
    assert backend.runs == nth
    return caught.value


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_charge_stands_after_the_first_statement_was_sent(failure: str, ledger: SQLiteLedger) -> None:
    error = run_failing(2, failure, ledger)
    assert "its privacy cost has been charged" in error.message
    assert "nothing was charged" not in error.message
    assert ledger.spent("alice").epsilon == pytest.approx(0.5)
    assert [e.status for e in ledger.history("alice")] == ["committed"]


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_charge_stands_not_when_nothing_was_sent(failure: str, ledger: SQLiteLedger) -> None:
    error = run_failing(1, failure, ledger)
    assert "nothing was charged" in error.message
    assert ledger.spent("alice").epsilon == 0
    assert [e.status for e in ledger.history("alice")] == ["released"]


def test_charge_stands_and_a_failed_question_is_not_replayed(ledger: SQLiteLedger) -> None:
    """Nothing was stored for the cancelled question: asking again runs it and charges it again."""
    run_failing(2, "cancelled", ledger)
    with _FailsOnStatement(0, _unreachable) as backend:
        result = Engine(parse_policy(POLICY), backend, ledger).execute(SQL, analyst="alice")
    assert not result.replayed and ledger.spent("alice").epsilon == pytest.approx(1.0)
