"""The privacy-budget ledger: what each analyst has spent, kept persistently and changed atomically.

This module owns the ledger, the composition of costs, and the replay store. A query's cost is
reserved before it runs (refused with BudgetExhausted if it does not fit), committed once it has
run, or released if it never touched data. An analyst's spending is the exact sum of every entry
that is reserved, committed or abandoned. Only a released entry, whose query provably never ran,
gives its cost back. The sums are kept exactly (decimal arithmetic, no rounding) in a per-analyst
totals row updated in the same transaction as the entries, so a reservation reads one row, however
long the history.

Composition. A cost is a Cost(ε, δ, ρ) from dpproxy.mechanisms, of one of two kinds. With ρ = 0
it is (ε, δ)-DP (pure accounting, or a pure-DP query under zCDP accounting): ε and δ compose
sequentially and add up. With ρ > 0 it is δ-approximately ρ-zCDP (zCDP accounting, Gaussian noise):
ρ and δ add up, and its ε is only the display value of the query on its own, never charged. What an
analyst has spent is worth, in ε,

    ε-equivalent = Σε(entries with ρ = 0) + zcdp_to_approx_dp(Σρ, δ_budget − Σδ)

(with Σρ = 0 it is plain Σε, the pure accounting of old): the zCDP part is converted to (ε, δ)-DP
once, for the whole history, at all the δ its own δ and the sequential part leave (Bun & Steinke
2016; the conversion is OpenDP's), then composed sequentially with the rest, which is conservative.
A cost fits when, with it, the ε-equivalent is within the analyst's ε and Σδ within their δ
(strictly below it when Σρ > 0: the conversion needs some δ). Since √ρ, not ρ, drives the ε of a
Gaussian, many small zCDP queries are worth far less ε than the sum of their separate conversions:
that is why a deployment chooses `accounting: zcdp`. Entries from an earlier pure-accounting era
keep counting through Σε, whichever accounting the deployment uses now, and ρ left from a zCDP era
keeps counting after a switch back to pure accounting: switching never resets anything.

Two stores share that contract: a SQLite file (the default, WAL mode, writes under BEGIN IMMEDIATE)
and a PostgreSQL table (a per-analyst advisory transaction lock). In both, no two reservations, from
threads or from separate processes sharing the store, can together overspend.

Crash safety: every ledger instance is an *owner* that holds a lock for as long as it lives (an
flock'd file beside the SQLite file, a session advisory lock in PostgreSQL). A reservation whose
owner is gone was left by a process that died mid-query; its query may have read data, so on the
next open it is marked 'abandoned' and stays spent for good. Reservations of owners that are still
alive (another server process on the same store) are left alone.

Free replay. The store also keeps, per analyst, answers already released (`replay_put`), under a key
the engine derives from the normalised statement, its parameters, its ε and the data version; a
repeat of the same question gets the stored answer back (`replay_get`) and pays nothing. This is
privacy-safe: a stored answer is a function of a release that was already charged to the same
analyst, and handing it out again is post-processing, which costs no privacy. Averaging repeats
then gains nothing (the analyst sees the same noise), which is exactly why repeats may be free. The
key includes the data version, so after the data changes a question is answered afresh and charged;
a stale answer, had one been served, would still reveal nothing new. The key includes ε because an
answer bought at one ε is not the answer asked for at another: its noise, and the ± error shown
with it, belong to the ε it was paid at. Keys are per analyst: an answer released to one analyst
is never handed to another, whose budget did not pay for it (and two analysts sharing answers
would make their budgets meaningless as separate limits). The store keeps the newest
`replay_limit` answers per analyst (REPLAY_LIMIT by default) so it cannot grow without bound; an
evicted answer is simply bought again.

This module never sees SQL beyond an opaque statement string kept for audit, never computes a
query's privacy cost (costs come from dpproxy.mechanisms, limits from the policy) and never reads
or builds a replay key or payload: both are opaque to it.
"""

from __future__ import annotations

import decimal
import math
import os
import re
import secrets
import sqlite3
import threading
import time
import uuid
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Self

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from dpproxy.errors import BudgetExhausted, DPProxyError
from dpproxy.mechanisms import FIT_RELATIVE_TOLERANCE, Cost, zcdp_to_approx_dp
from dpproxy.policy import ACCOUNTING

try:  # flock tells a live owner from a dead one; without it every other owner is taken as dead.
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "REPLAY_LIMIT",
    "SCHEMA_VERSION",
    "EntryStatus",
    "Ledger",
    "LedgerEntry",
    "PostgresLedger",
    "Reservation",
    "SQLiteLedger",
    "epsilon_equivalent",
    "open_ledger",
]

# Version of the ledger's table layout, stored in the store's meta table. Bump it, and add a step to
# the store's migration, when the layout changes. 2: the per-analyst totals table. 3: ρ in the
# totals (zCDP composition) and the replay store.
SCHEMA_VERSION = 3

# Stored answers kept per analyst; older ones are evicted (and bought again if asked again).
REPLAY_LIMIT = 10_000

# Exact sums of doubles: every double is a finite decimal whose digits lie between 10^308 and
# 10^-1074, so 1500 digits hold any sum or difference of them without rounding (400 did not: a
# double near 1e-231 alone has over 500). Should rounding ever be needed, Inexact is raised rather
# than a total silently rounded.
_EXACT = decimal.Context(prec=1500, Emin=-2000, Emax=2000, traps=[decimal.Inexact, decimal.InvalidOperation])
_ZERO = decimal.Decimal(0)

# The conversion takes δ < 1; a larger δ budget (an unlimited one) is converted at just below 1,
# which only overstates the ε.
_BELOW_ONE = math.nextafter(1.0, 0.0)

# Replay keys are hex digests the engine computes (e.g. SHA-256); anything else is a caller's bug.
_REPLAY_KEY = re.compile(r"[0-9a-f]{16,128}")


def _exact_add(total: decimal.Decimal, amount: float) -> decimal.Decimal:
    return _EXACT.add(total, decimal.Decimal(amount))


def _exact_sub(total: decimal.Decimal, amount: float) -> decimal.Decimal:
    return _EXACT.subtract(total, decimal.Decimal(amount))


def _float_up(value: decimal.Decimal) -> float:
    """The smallest float >= value."""
    nearest = float(value)
    return math.nextafter(nearest, math.inf) if decimal.Decimal(nearest) < value else nearest


def _float_down(value: decimal.Decimal) -> float:
    """The largest float <= value."""
    nearest = float(value)
    return math.nextafter(nearest, -math.inf) if decimal.Decimal(nearest) > value else nearest


EXHAUSTED_HINT = (
    "ask the data owner to raise the budget, or lower the per-query epsilon with SET dpproxy.epsilon"
)


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


def epsilon_equivalent(spent: Cost, limit: Cost) -> float:
    """What spending, as Ledger.spent returns it, is worth in ε against `limit`'s δ, rounded up.

    spent.epsilon plus the conversion of spent.rho at the δ left (limit δ − spent.delta); infinite
    when ρ was spent and no δ is left (module doc).
    """
    return _Totals(
        decimal.Decimal(spent.epsilon), decimal.Decimal(spent.delta), decimal.Decimal(spent.rho)
    ).worth(limit.delta)


class Ledger(ABC):
    """Per-analyst privacy spending and stored answers. Thread-safe; several processes may share one store."""

    def reserve(
        self, analyst: str, cost: Cost, limit: Cost, *, statement: str = "", accounting: str = "pure"
    ) -> Reservation:
        """Hold `cost` for one query if everything spent so far plus `cost` fits within `limit`.

        Atomic with every other reservation on the same store. Raises BudgetExhausted, leaving the
        ledger unchanged, when it does not fit (module doc: ε-equivalent within ε, Σδ within δ).
        `accounting` is the policy's `defaults.accounting`: under "pure" a cost may not carry ρ (the
        engine charges Gaussian noise as its (ε, δ) conversion); under "zcdp" it may (then its ε is
        for display and not charged), and the refusal message speaks of ρ as well as ε.
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
        return self._reserve(analyst, cost, limit, statement, accounting)

    def commit(self, reservation: Reservation) -> None:
        """The query ran: its cost is spent for good."""
        self._finish(reservation, EntryStatus.COMMITTED)

    def release(self, reservation: Reservation) -> None:
        """The query never touched data: its cost is given back."""
        self._finish(reservation, EntryStatus.RELEASED)

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
            max(0.0, _float_down(_EXACT.subtract(decimal.Decimal(limit.delta), totals.delta))),
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
    def _totals_of(self, analyst: str) -> _Totals: ...

    @abstractmethod
    def _reserve(
        self, analyst: str, cost: Cost, limit: Cost, statement: str, accounting: str
    ) -> Reservation: ...

    @abstractmethod
    def _finish(self, reservation: Reservation, status: EntryStatus) -> None: ...

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


# --------------------------------------------------------------------------------------------------
# Shared arithmetic and checks


def _charged_epsilon(cost: Cost) -> float:
    """The ε a cost adds to the sequential part: all of it when ρ = 0; none when ρ > 0 (display only)."""
    return cost.epsilon if cost.rho == 0 else 0.0


@dataclass(frozen=True)
class _Totals:
    """Exact sums of one analyst's entries that are not released: ε of those with ρ = 0, all δ and ρ."""

    epsilon: decimal.Decimal = _ZERO
    delta: decimal.Decimal = _ZERO
    rho: decimal.Decimal = _ZERO

    def plus(self, cost: Cost) -> _Totals:
        return _Totals(
            _exact_add(self.epsilon, _charged_epsilon(cost)),
            _exact_add(self.delta, cost.delta),
            _exact_add(self.rho, cost.rho),
        )

    def minus(self, cost: Cost) -> _Totals:
        return _Totals(
            _exact_sub(self.epsilon, _charged_epsilon(cost)),
            _exact_sub(self.delta, cost.delta),
            _exact_sub(self.rho, cost.rho),
        )

    @property
    def spent(self) -> Cost:
        return Cost(float(self.epsilon), float(self.delta), float(self.rho))

    def delta_left(self, limit_delta: float) -> decimal.Decimal:
        return _EXACT.subtract(decimal.Decimal(limit_delta), self.delta)

    def worth(self, limit_delta: float) -> float:
        """The ε-equivalent (module doc), rounded up: Σε, plus Σρ converted at the δ left."""
        epsilon = _float_up(self.epsilon)
        if self.rho == 0:
            return epsilon
        delta_left = _float_down(self.delta_left(limit_delta))
        if not delta_left > 0:
            return math.inf
        # The conversion grows with ρ and shrinks with δ: ρ rounded up and δ down only overstate it.
        converted = zcdp_to_approx_dp(_float_up(self.rho), min(delta_left, _BELOW_ONE))
        return _float_up(_EXACT.add(decimal.Decimal(epsilon), decimal.Decimal(converted)))

    def fits_within(self, limit: Cost) -> bool:
        if self.rho == 0:
            # Plain sequential composition, with Cost's forgiveness of float rounding.
            return Cost(float(self.epsilon), float(self.delta)).fits_within(limit)
        # Converting ρ needs some δ left over: Σδ strictly below the limit, compared exactly.
        if not self.delta < decimal.Decimal(limit.delta):
            return False
        if math.isinf(limit.epsilon):
            return True
        return self.worth(limit.delta) <= limit.epsilon * (1.0 + FIT_RELATIVE_TOLERANCE)


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


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def _fmt_pair(cost: float, remains: float) -> tuple[str, str]:
    # "costs ε=0.5 but only ε=0.5 remain" would be nonsense: add digits until they differ.
    for precision in (6, 10, 17):
        a, b = f"{cost:.{precision}g}", f"{remains:.{precision}g}"
        if a != b:
            break
    return a, b


def _check_fits(analyst: str, total: _Totals, cost: Cost, limit: Cost, accounting: str) -> _Totals:
    """The totals with `cost` added, if they fit within `limit`; else BudgetExhausted."""
    after = total.plus(cost)
    if after.fits_within(limit):
        return after
    if accounting == "pure" and after.rho == 0:
        raise _pure_refusal(analyst, total, cost, limit)
    raise _zcdp_refusal(analyst, total, after, cost, limit)


def _pure_refusal(analyst: str, total: _Totals, cost: Cost, limit: Cost) -> BudgetExhausted:
    spent = total.spent
    remains_eps = max(0.0, limit.epsilon - spent.epsilon)
    remains_delta = max(0.0, limit.delta - spent.delta)
    cost_eps, remains_eps_text = _fmt_pair(cost.epsilon, remains_eps)
    cost_delta, remains_delta_text = _fmt_pair(cost.delta, remains_delta)
    return BudgetExhausted(
        f'privacy budget exhausted for analyst "{analyst}": this query costs ε={cost_eps}, '
        f"δ={cost_delta} but only ε={remains_eps_text}, δ={remains_delta_text} remain of "
        f"ε={_fmt(limit.epsilon)}, δ={_fmt(limit.delta)}",
        hint=EXHAUSTED_HINT,
    )


def _zcdp_refusal(analyst: str, total: _Totals, after: _Totals, cost: Cost, limit: Cost) -> BudgetExhausted:
    """Says what the query costs (ρ and its ε), what is spent (ρ and its ε-equivalent), what remains."""
    delta_after = _float_down(after.delta_left(limit.delta))
    if cost.rho > 0:
        costs = f"ρ={_fmt(cost.rho)}" + (f", δ={_fmt(cost.delta)}" if cost.delta else "")
        if delta_after > 0:
            costs += f" (ε={_fmt(zcdp_to_approx_dp(cost.rho, min(delta_after, _BELOW_ONE)))} on its own)"
    else:
        costs = f"ε={_fmt(cost.epsilon)}" + (f", δ={_fmt(cost.delta)}" if cost.delta else "")
    if after.rho > 0 and not delta_after > 0:
        # All of δ spent is a reason here, so the two may well print alike.
        why = (
            f"with it δ={_fmt(float(after.delta))} of δ={_fmt(limit.delta)} would be spent, and converting "
            "ρ to ε needs some δ left"
        )
    elif not Cost(0.0, float(after.delta)).fits_within(limit):
        spent_delta, budget_delta = _fmt_pair(float(after.delta), limit.delta)
        why = f"with it δ={spent_delta} of δ={budget_delta} would be spent"
    else:
        worth_after, budget = _fmt_pair(after.worth(limit.delta), limit.epsilon)
        why = f"with it the spending would be worth ε={worth_after} of ε={budget}"
    spent = total.spent
    spent_parts = [f"ρ={_fmt(spent.rho)}", f"δ={_fmt(spent.delta)}"]
    if spent.epsilon:
        spent_parts.append(f"ε={_fmt(spent.epsilon)} in pure-DP queries")
    worth_before = total.worth(limit.delta)
    return BudgetExhausted(
        f'privacy budget exhausted for analyst "{analyst}": this query costs {costs} but {why}; '
        f"spent so far: {', '.join(spent_parts)}, worth ε={_fmt(worth_before)}; remaining: "
        f"ε={_fmt(max(0.0, limit.epsilon - worth_before))}, "
        f"δ={_fmt(max(0.0, _float_down(total.delta_left(limit.delta))))} of "
        f"ε={_fmt(limit.epsilon)}, δ={_fmt(limit.delta)}",
        hint=EXHAUSTED_HINT,
    )


def _exact_totals(amounts: Iterable[tuple[float, float, float | None]]) -> _Totals:
    totals = _Totals()
    for e, d, r in amounts:
        totals = totals.plus(Cost(float(e), float(d), float(r or 0.0)))
    return totals


def _finish_problem(
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


def _now() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------------------------------
# SQLite


class _OwnerLocks:
    """Owner liveness for a SQLite ledger: one flock'd file per live ledger instance.

    flock locks belong to an open file description, so the kernel drops them when the process
    dies, and two ledger instances in one process do not see each other's locks as their own.
    """

    def __init__(self, directory: Path) -> None:
        self._directory = directory

    def claim(self, owner: str) -> BinaryIO | None:
        """Lock a file for `owner`; a file object, so that dropping the ledger also frees it."""
        if fcntl is None:
            return None
        self._directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock_file = open(self._directory / owner, "ab", buffering=0)  # noqa: SIM115 - lives with the ledger
        try:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            lock_file.close()
            raise
        return lock_file

    def give_up(self, owner: str, lock_file: BinaryIO | None) -> None:
        if lock_file is None:
            return
        with suppress(FileNotFoundError):
            os.unlink(self._directory / owner)
        lock_file.close()

    @contextmanager
    def dead(self, owners: Iterable[str | None]) -> Iterator[list[str | None]]:
        """The owners among `owners` whose process is gone, held locked until the block ends."""
        dead: list[str | None] = []
        held: list[tuple[str, BinaryIO]] = []
        try:
            for owner in owners:
                if owner is None or fcntl is None or not _is_token(owner):
                    dead.append(owner)
                    continue
                try:
                    lock_file = open(self._directory / owner, "rb", buffering=0)  # noqa: SIM115
                except FileNotFoundError:
                    dead.append(owner)
                    continue
                try:
                    fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    lock_file.close()  # its owner is alive
                    continue
                held.append((owner, lock_file))
                dead.append(owner)
            yield dead
        finally:
            for owner, lock_file in held:
                self.give_up(owner, lock_file)


def _is_token(owner: str) -> bool:
    return re.fullmatch(r"[0-9a-f]{32}", owner) is not None


_SQLITE_TABLE = "dpproxy_ledger"
_SQLITE_META = "dpproxy_ledger_meta"
_SQLITE_TOTALS = "dpproxy_ledger_totals"
_SQLITE_REPLAY = "dpproxy_ledger_replay"

_SQLITE_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {_SQLITE_META} (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS {_SQLITE_TABLE} (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    analyst TEXT NOT NULL,
    epsilon REAL NOT NULL CHECK (epsilon >= 0),
    delta REAL NOT NULL CHECK (delta >= 0),
    rho REAL CHECK (rho IS NULL OR rho >= 0),
    status TEXT NOT NULL CHECK (status IN ('reserved', 'committed', 'released', 'abandoned')),
    statement TEXT NOT NULL DEFAULT '',
    owner TEXT,
    created_at TEXT NOT NULL,
    finished_at TEXT
);
CREATE INDEX IF NOT EXISTS {_SQLITE_TABLE}_analyst_status ON {_SQLITE_TABLE} (analyst, status);
CREATE INDEX IF NOT EXISTS {_SQLITE_TABLE}_reserved_owner ON {_SQLITE_TABLE} (owner)
    WHERE status = 'reserved';
CREATE TABLE IF NOT EXISTS {_SQLITE_TOTALS} (
    analyst TEXT PRIMARY KEY,
    -- exact decimal sums of the analyst's entries that are not released (ε: of those with ρ = 0)
    epsilon TEXT NOT NULL,
    delta TEXT NOT NULL,
    rho TEXT NOT NULL DEFAULT '0'
);
CREATE TABLE IF NOT EXISTS {_SQLITE_REPLAY} (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- age: the oldest are evicted first
    analyst TEXT NOT NULL,
    key TEXT NOT NULL,
    payload BLOB NOT NULL,
    created_at TEXT NOT NULL,
    UNIQUE (analyst, key)
);
CREATE INDEX IF NOT EXISTS {_SQLITE_REPLAY}_analyst_seq ON {_SQLITE_REPLAY} (analyst, seq);
"""


def _check_replay_limit(replay_limit: int) -> int:
    if isinstance(replay_limit, bool) or not isinstance(replay_limit, int) or replay_limit < 1:
        raise ValueError(f"replay_limit must be an integer >= 1, not {replay_limit!r}")
    return replay_limit


class SQLiteLedger(Ledger):
    """A ledger in one SQLite file (or ":memory:", which is neither shared nor persistent).

    One connection serves all threads under a lock; separate processes (or instances) are kept
    apart by SQLite's own write lock, taken up front with BEGIN IMMEDIATE. Beside the file, SQLite
    keeps `<file>-wal` and `<file>-shm`, and this ledger a directory `<file>-owners` with one locked
    file per live ledger instance: back up and move the ledger with all of them closed.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0, replay_limit: int = REPLAY_LIMIT
    ) -> None:
        self.path = os.fspath(path)
        self.replay_limit = _check_replay_limit(replay_limit)
        in_memory = self._in_memory = self.path == ":memory:"
        self._mutex = threading.RLock()
        self._owner = uuid.uuid4().hex
        self._owner_locks = _OwnerLocks(Path(self.path + "-owners")) if not in_memory else None
        self._owner_file: BinaryIO | None = None
        self._conn: sqlite3.Connection | None = sqlite3.connect(
            self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            if not in_memory:
                self._use_wal(busy_timeout)
            # FULL: a reservation must be on disk before its query runs, even across power loss.
            self._conn.execute("PRAGMA synchronous=FULL")
            self._create_schema()
            if self._owner_locks is not None:
                self._owner_file = self._owner_locks.claim(self._owner)
            self._abandon_orphans()
        except BaseException:
            self._conn.close()
            self._conn = None
            if self._owner_locks is not None:
                self._owner_locks.give_up(self._owner, self._owner_file)
            raise

    def _use_wal(self, busy_timeout: float) -> None:
        assert self._conn is not None
        # Switching to WAL needs a moment of exclusive access and fails at once, without the busy
        # handler, while another opener holds the file: retry until the busy timeout. The mode then
        # sticks to the file, so later opens find it already set.
        deadline = time.monotonic() + busy_timeout
        while True:
            try:
                mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as exc:
                contended = "locked" in str(exc) or "busy" in str(exc)
                if not contended or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        if str(mode).lower() != "wal":
            raise DPProxyError(
                f"cannot put the privacy ledger {self.path} in WAL mode (it is in {mode!r} mode)",
                hint="the ledger must be on a local file system that supports SQLite's WAL mode",
            )

    def _create_schema(self) -> None:
        with self._write() as conn:
            for statement in _SQLITE_SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                f"INSERT OR IGNORE INTO {_SQLITE_META} (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
            (version,) = conn.execute(
                f"SELECT value FROM {_SQLITE_META} WHERE key = 'schema_version'"
            ).fetchone()
            _check_schema_version(int(version), self.path)
            if int(version) < SCHEMA_VERSION:
                self._migrate(conn)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Bring a version 1 or 2 store to SCHEMA_VERSION, inside the schema transaction.

        Version 1 had no totals, version 2 no ρ total (and no replay table, created above): sum every
        analyst's entries once, exactly. For version 2 the ε and δ sums come out as they were.
        """
        totals_columns = {row[1] for row in conn.execute(f"PRAGMA table_info({_SQLITE_TOTALS})")}
        if "rho" not in totals_columns:
            conn.execute(f"ALTER TABLE {_SQLITE_TOTALS} ADD COLUMN rho TEXT NOT NULL DEFAULT '0'")
        conn.execute(f"DELETE FROM {_SQLITE_TOTALS}")
        for (analyst,) in conn.execute(f"SELECT DISTINCT analyst FROM {_SQLITE_TABLE}").fetchall():
            self._store_totals(conn, analyst, _exact_totals(self._spending(conn, analyst)))
        conn.execute(
            f"UPDATE {_SQLITE_META} SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),)
        )

    @contextmanager
    def _write(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """A write transaction that holds the database's write lock from its first statement.

        durable=False skips the fsync at commit (a crash of the machine may lose the change, not a
        crash of the process): only for changes whose loss leaves the ledger conservative.
        """
        with self._mutex:
            conn = self._open_connection()
            if not self._in_memory:
                conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _open_connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ValueError(f"the privacy ledger {self.path} is closed")
        return self._conn

    def _read(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._mutex:
            return self._open_connection().execute(query, params).fetchall()

    def _abandon_orphans(self) -> None:
        with self._write() as conn:
            owners = [
                owner
                for (owner,) in conn.execute(
                    f"SELECT DISTINCT owner FROM {_SQLITE_TABLE} WHERE status = 'reserved'"
                )
                if owner != self._owner
            ]
            if not owners or self._owner_locks is None:
                return
            with self._owner_locks.dead(owners) as dead:
                finished = _now().isoformat()
                for owner in dead:
                    conn.execute(
                        f"UPDATE {_SQLITE_TABLE} SET status = 'abandoned', finished_at = ? "
                        "WHERE status = 'reserved' AND owner IS ?",
                        (finished, owner),
                    )

    def _spending(self, conn: sqlite3.Connection, analyst: str) -> list[tuple[float, float, float | None]]:
        return conn.execute(
            f"SELECT epsilon, delta, rho FROM {_SQLITE_TABLE} WHERE analyst = ? AND status != 'released'",
            (analyst,),
        ).fetchall()

    def _totals(self, conn: sqlite3.Connection, analyst: str) -> _Totals:
        row = conn.execute(
            f"SELECT epsilon, delta, rho FROM {_SQLITE_TOTALS} WHERE analyst = ?", (analyst,)
        ).fetchone()
        if row is None:
            return _Totals()
        return _Totals(decimal.Decimal(row[0]), decimal.Decimal(row[1]), decimal.Decimal(row[2]))

    def _store_totals(self, conn: sqlite3.Connection, analyst: str, totals: _Totals) -> None:
        conn.execute(
            f"INSERT INTO {_SQLITE_TOTALS} (analyst, epsilon, delta, rho) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (analyst) DO UPDATE SET epsilon = excluded.epsilon, delta = excluded.delta, "
            "rho = excluded.rho",
            (analyst, str(totals.epsilon), str(totals.delta), str(totals.rho)),
        )

    def _totals_of(self, analyst: str) -> _Totals:
        with self._mutex:
            return self._totals(self._open_connection(), analyst)

    def _reserve(self, analyst: str, cost: Cost, limit: Cost, statement: str, accounting: str) -> Reservation:
        with self._write() as conn:
            after = _check_fits(analyst, self._totals(conn, analyst), cost, limit, accounting)
            self._store_totals(conn, analyst, after)
            cursor = conn.execute(
                f"INSERT INTO {_SQLITE_TABLE} (analyst, epsilon, delta, rho, status, statement, owner, "
                "created_at) VALUES (?, ?, ?, ?, 'reserved', ?, ?, ?)",
                (
                    analyst,
                    float(cost.epsilon),
                    float(cost.delta),
                    float(cost.rho),
                    statement,
                    self._owner,
                    _now().isoformat(),
                ),
            )
            entry_id = cursor.lastrowid
        assert entry_id is not None
        return Reservation(id=entry_id, analyst=analyst, cost=cost, spent=after.spent)

    def _finish(self, reservation: Reservation, status: EntryStatus) -> None:
        # Losing a commit to a machine crash is safe (the entry stays reserved, then abandoned: spent);
        # losing a release only keeps a cost that could have been returned. Neither needs an fsync.
        with self._write(durable=False) as conn:
            row = conn.execute(
                f"SELECT analyst, epsilon, delta, rho, status FROM {_SQLITE_TABLE} WHERE id = ?",
                (reservation.id,),
            ).fetchone()
            problem = _finish_problem(reservation, status, row)
            if problem is not None:
                raise ValueError(problem)
            conn.execute(
                f"UPDATE {_SQLITE_TABLE} SET status = ?, finished_at = ? WHERE id = ?",
                (str(status), _now().isoformat(), reservation.id),
            )
            if status == EntryStatus.RELEASED:
                totals = self._totals(conn, reservation.analyst)
                self._store_totals(conn, reservation.analyst, totals.minus(reservation.cost))

    def reset(self, analyst: str) -> int:
        with self._write() as conn:
            conn.execute(f"DELETE FROM {_SQLITE_REPLAY} WHERE analyst = ?", (analyst,))
            conn.execute(f"DELETE FROM {_SQLITE_TOTALS} WHERE analyst = ?", (analyst,))
            return conn.execute(f"DELETE FROM {_SQLITE_TABLE} WHERE analyst = ?", (analyst,)).rowcount

    def _replay_get(self, analyst: str, key: str) -> bytes | None:
        rows = self._read(
            f"SELECT payload FROM {_SQLITE_REPLAY} WHERE analyst = ? AND key = ?", (analyst, key)
        )
        return bytes(rows[0][0]) if rows else None

    def _replay_put(self, analyst: str, key: str, payload: bytes) -> None:
        # Losing a stored answer to a machine crash only means buying it again: no fsync needed.
        with self._write(durable=False) as conn:
            inserted = conn.execute(
                f"INSERT OR IGNORE INTO {_SQLITE_REPLAY} (analyst, key, payload, created_at) "
                "VALUES (?, ?, ?, ?)",
                (analyst, key, payload, _now().isoformat()),
            ).rowcount
            if inserted:
                conn.execute(
                    f"DELETE FROM {_SQLITE_REPLAY} WHERE analyst = ? AND seq <= (SELECT seq FROM "
                    f"{_SQLITE_REPLAY} WHERE analyst = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)",
                    (analyst, analyst, self.replay_limit),
                )

    def _replay_forget(self, analyst: str) -> int:
        with self._write() as conn:
            return conn.execute(f"DELETE FROM {_SQLITE_REPLAY} WHERE analyst = ?", (analyst,)).rowcount

    def history(self, analyst: str, limit: int = 50) -> list[LedgerEntry]:
        if limit < 0:
            raise ValueError(f"history limit must be >= 0, not {limit}")
        rows = self._read(
            f"SELECT id, analyst, epsilon, delta, status, statement, created_at, finished_at, rho "
            f"FROM {_SQLITE_TABLE} WHERE analyst = ? ORDER BY id DESC LIMIT ?",
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
                created_at=datetime.fromisoformat(row[6]),
                finished_at=datetime.fromisoformat(row[7]) if row[7] is not None else None,
                rho=row[8] or 0.0,
            )
            for row in rows
        ]

    def analysts(self) -> list[str]:
        return [a for (a,) in self._read(f"SELECT DISTINCT analyst FROM {_SQLITE_TABLE} ORDER BY analyst")]

    def close(self) -> None:
        with self._mutex:
            if self._conn is None:
                return
            try:
                with self._write() as conn:
                    conn.execute(
                        f"UPDATE {_SQLITE_TABLE} SET status = 'abandoned', finished_at = ? "
                        "WHERE status = 'reserved' AND owner = ?",
                        (_now().isoformat(), self._owner),
                    )
            finally:
                self._conn.close()
                self._conn = None
                if self._owner_locks is not None:
                    self._owner_locks.give_up(self._owner, self._owner_file)
                    self._owner_file = None

    def __repr__(self) -> str:
        return f"SQLiteLedger({self.path!r})"


def _check_schema_version(version: int, where: str) -> None:
    if version > SCHEMA_VERSION:
        raise DPProxyError(
            f"the privacy ledger {where} has schema version {version}, newer than this dpproxy "
            f"understands ({SCHEMA_VERSION})",
            hint="upgrade dpproxy, or point it at another ledger",
        )
    # Older versions are migrated by the store, inside its schema transaction.


# --------------------------------------------------------------------------------------------------
# PostgreSQL


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
        self.replay_limit = _check_replay_limit(replay_limit)
        self._table = sql.Identifier(*parts)
        self._meta = sql.Identifier(*parts[:-1], parts[-1] + "_meta")
        self._totals_table = sql.Identifier(*parts[:-1], parts[-1] + "_totals")
        self._replay = sql.Identifier(*parts[:-1], parts[-1] + "_replay")
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
            (version,) = conn.execute(
                sql.SQL("SELECT value FROM {} WHERE key = 'schema_version'").format(meta)
            ).fetchone()
            _check_schema_version(int(version), f"table {self.table}")
            if int(version) < SCHEMA_VERSION:
                self._migrate(conn)

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        """Bring a version 1 or 2 table to SCHEMA_VERSION, inside the schema transaction.

        Version 1 had no totals, version 2 no ρ total (and no replay table, created above): sum every
        analyst's entries once, exactly, in Python (PostgreSQL's float8 → numeric cast keeps only 15
        digits, which is not the double's value).
        """
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
            totals = _exact_totals(amounts)
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
                conn.execute(
                    sql.SQL(
                        "UPDATE {} SET status = 'abandoned', finished_at = %s "
                        "WHERE status = 'reserved' AND owner IS NOT DISTINCT FROM %s"
                    ).format(self._table),
                    (finished, owner),
                )

    def _totals(self, conn: psycopg.Connection[Any], analyst: str) -> _Totals:
        row = conn.execute(
            sql.SQL("SELECT epsilon, delta, rho FROM {} WHERE analyst = %s").format(self._totals_table),
            (analyst,),
        ).fetchone()
        if row is None:
            return _Totals()
        return _Totals(decimal.Decimal(row[0]), decimal.Decimal(row[1]), decimal.Decimal(row[2]))

    def _add_to_totals(self, conn: psycopg.Connection[Any], analyst: str, cost: Cost, sign: int) -> None:
        # Through _EXACT: Decimal's default context would round the product to 28 digits.
        epsilon, delta, rho = (
            _EXACT.multiply(decimal.Decimal(value), sign)
            for value in (_charged_epsilon(cost), cost.delta, cost.rho)
        )
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

    def _totals_of(self, analyst: str) -> _Totals:
        with self._transaction() as conn:
            return self._totals(conn, analyst)

    def _reserve(self, analyst: str, cost: Cost, limit: Cost, statement: str, accounting: str) -> Reservation:
        with self._transaction() as conn:
            # Read committed: every statement after the lock sees all reservations made before it.
            self._lock_analyst(conn, analyst)
            after = _check_fits(analyst, self._totals(conn, analyst), cost, limit, accounting)
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
        return Reservation(id=entry_id, analyst=analyst, cost=cost, spent=after.spent)

    def _finish(self, reservation: Reservation, status: EntryStatus) -> None:
        with self._transaction() as conn:
            row = conn.execute(
                sql.SQL(
                    "SELECT analyst, epsilon, delta, rho, status FROM {} WHERE id = %s FOR UPDATE"
                ).format(self._table),
                (reservation.id,),
            ).fetchone()
            problem = _finish_problem(reservation, status, row)
            if problem is not None:
                raise ValueError(problem)
            conn.execute(
                sql.SQL("UPDATE {} SET status = %s, finished_at = %s WHERE id = %s").format(self._table),
                (str(status), _now(), reservation.id),
            )
            if status == EntryStatus.RELEASED:
                self._add_to_totals(conn, reservation.analyst, reservation.cost, -1)

    def reset(self, analyst: str) -> int:
        with self._transaction() as conn:
            self._lock_analyst(conn, analyst)
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


# --------------------------------------------------------------------------------------------------


def open_ledger(spec: str | os.PathLike[str], *, replay_limit: int = REPLAY_LIMIT) -> Ledger:
    """A PostgresLedger for a postgresql:// or postgres:// URL, else a SQLite file at that path."""
    if isinstance(spec, str) and spec.startswith(("postgresql://", "postgres://")):
        return PostgresLedger(spec, replay_limit=replay_limit)
    if os.fspath(spec) == ":memory:":
        return SQLiteLedger(":memory:", replay_limit=replay_limit)
    path = Path(spec).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    return SQLiteLedger(path, replay_limit=replay_limit)
