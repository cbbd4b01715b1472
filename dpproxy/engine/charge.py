"""The one charge rule, and the one translation of backend failures into analyst errors.

A private statement's cost is reserved before anything runs. **It stands once any statement of it was
sent to the backend, whatever happens next; otherwise it is released** (docs/privacy.md §8): whether a
statement that reached the data fails, is cancelled or loses its connection can depend on that data,
and a cancel timed between two statements would otherwise tell, for free, whether the first failed.
`Charge` keeps that rule for every path that spends budget — a plain plan, a series limit's two plans
under one reservation, a streamed answer, a refined quantile's second statement — so no path decides
it by hand. `backend_failure` is the one place a backend exception becomes what the analyst reads; the
database's own text never does.

Nothing here knows SQL, noise or the policy; it sees the ledger, a reservation and an audit record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dpproxy.audit import StatementRecord, Status
from dpproxy.backends import BackendUnreachable, QueryCancelled
from dpproxy.budget import Ledger, Reservation, SharedBudget
from dpproxy.errors import (
    BackendUnavailable,
    DPProxyError,
    InvalidParameter,
    PrivateQueryFailed,
    QueryCanceled,
)
from dpproxy.policy import DATASET
from dpproxy.privacy import Cost
from dpproxy.results import BudgetStatus, Result


def backend_failure(
    error: BaseException,
    *,
    charged: bool | None,
    failed: Callable[[], DPProxyError] = PrivateQueryFailed,
) -> DPProxyError:
    """What the analyst reads when the backend did not answer: a cancel (57014, the reason as
    PostgreSQL words it), an unreachable database, or `failed()` for anything else (a fixed message:
    the database's text can depend on the data). `charged`: whether the statement's privacy cost stands
    (said at the end of the message), or None for a statement that spends no budget."""
    suffix = "" if charged is None else (
        "; its privacy cost has been charged" if charged else "; nothing was charged"
    )  # fmt: skip
    if isinstance(error, QueryCancelled):
        return QueryCanceled(f"canceling statement due to {error.reason}{suffix}", hint=error.hint)
    if isinstance(error, BackendUnreachable):
        return BackendUnavailable(f"cannot reach the backing database{suffix}")
    return failed()


def within_cap(cost: Cost, cap: float) -> None:
    """Refuse (22023) a statement whose ε is above the per-query cap in force when it is charged: a
    reload may lower the cap while the statement is prepared (public subqueries run first), and the
    cap, like the budget, holds at the charge."""
    if cost.epsilon > cap * (1 + 1e-9):
        raise InvalidParameter(
            f"this statement costs ε = {cost.epsilon:g}, more than the per-query cap in force now "
            f"(ε = {cap:g}: the policy was reloaded since the statement arrived)",
            hint=f"run it again, or SET dpproxy.epsilon = {cap:g} or less",
        )


def reached_data(error: BaseException) -> bool:
    """Whether the statement an exception interrupted had been sent: an unreachable database and a
    cancel that came before the statement started are raised before it is sent; anything else (the
    database's own failure, a cancel while it ran, a failure while releasing) comes after."""
    if isinstance(error, BackendUnreachable):
        return False
    if isinstance(error, QueryCancelled):
        return error.started
    return True


@dataclass
class Charge:
    """One statement's reservation (None without a ledger) and the rule that finishes it.

    `sent()` once a statement was handed to the backend and answered; `fail(error)` finishes the
    reservation by the rule (committed if anything was sent, by this statement or an earlier one,
    else released), marks the audit record and returns the analyst's error; `commit` finishes it on
    success. A charge is finished once: later calls change nothing."""

    ledger: Ledger | None
    reservation: Reservation | None
    record: StatementRecord | None
    analyst: str
    limit: Cost
    shared: SharedBudget | None = None  # the data set's budget, reserved with the analyst's
    was_sent: bool = False
    finished: bool = False

    def sent(self) -> None:
        self.was_sent = True

    def fail(self, error: BaseException, *, keep: bool = False) -> DPProxyError:
        """Finish by the rule after `error`; the analyst's error to raise: the backend's translated
        (`backend_failure`), or with `keep` an analyst error of dpproxy's own as it is (as is one
        raised over released values: DPProxyError.after_release)."""
        sent = self.was_sent or reached_data(error)
        if isinstance(error, DPProxyError) and (keep or error.after_release):
            analyst_error = error
        else:
            analyst_error = backend_failure(error, charged=sent)
        self._finish(sent, analyst_error)
        return analyst_error

    def abandon(self, *, sent: bool) -> None:
        """The answer stopped without an error of its own (a client that closed a stream)."""
        self._finish(sent or self.was_sent, None)

    def commit(self, result: Result, cost: Cost) -> Result:
        """The answer released: the charge stands; the result carries its cost and the budget left."""
        record = self.record
        if record is not None:
            record.status = Status.OK
            record.sqlstate = None
            record.reached = True
            if result.rows or record.rows == 0:
                record.rows = len(result.rows)
        status = None
        if self.reservation is not None and self.ledger is not None:
            if not self.finished:
                self.finished = True
                self.ledger.commit(self.reservation, record)
            reservation = self.reservation
            spent = reservation.spent
            if spent is None:
                spent = self.ledger.spent(reservation.accounts[0] if reservation.accounts else self.analyst)
            shared = None
            if self.shared is not None and reservation.shared_spent is not None:
                shared = BudgetStatus(DATASET, reservation.shared_spent, self.shared.limit)
            status = BudgetStatus(self.analyst, spent, self.limit, shared)
        return Result(result.columns, result.rows, cost, status, private=True, notes=result.notes)

    def _finish(self, sent: bool, error: DPProxyError | None) -> None:
        record = self.record
        if record is not None:
            record.reached = sent
            if error is not None:
                record.error(error.sqlstate, error.message)
        if self.finished or self.reservation is None or self.ledger is None:
            return
        self.finished = True
        (self.ledger.commit if sent else self.ledger.release)(self.reservation, record)
