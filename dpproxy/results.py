"""What an answer is, as every entry point hands it over: the released rows and columns with their
95% errors, the cost, the budget left and the notice the analyst reads (`Result`), or the same
released in batches (`ResultStream`, for answers too large to hold); and the bytes a stored answer
is kept as for free replay (released values only, never true ones)."""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import TYPE_CHECKING

from dpproxy.budget import epsilon_equivalent
from dpproxy.privacy import (
    Cost,
)
from dpproxy.privacy.accounting import FIT_RELATIVE_TOLERANCE
from dpproxy.sql.types import PgType

if TYPE_CHECKING:
    from dpproxy.sql.relation import Relation


@dataclass(frozen=True)
class ResultColumn:
    name: str
    type: PgType
    error95: float | None = None  # ± at 95% of a released aggregate column; None when not one
    error_note: str | None = None  # the 95% bound of a quantile or mode, which is not a ± in value units


@dataclass(frozen=True)
class BudgetStatus:
    analyst: str
    spent: Cost  # ε of pure-DP queries, δ, and ρ of zCDP queries, as the ledger composes them
    limit: Cost
    # The data set's budget (the policy's top-level `budget:`), shared by every analyst; None without.
    shared: BudgetStatus | None = None

    @property
    def epsilon_spent(self) -> float:
        """Everything spent, in ε against the analyst's δ (ρ converted; equals spent.epsilon without ρ)."""
        return epsilon_equivalent(self.spent, self.limit)

    @property
    def remaining(self) -> Cost:
        return Cost(
            max(0.0, self.limit.epsilon - self.epsilon_spent), max(0.0, self.limit.delta - self.spent.delta)
        )


@dataclass(frozen=True)
class Result:
    columns: tuple[ResultColumn, ...]
    rows: list[tuple[object, ...]]
    cost: Cost = Cost.ZERO
    budget: BudgetStatus | None = None
    private: bool = False
    replayed: bool = False  # a stored answer to the same question, returned for free
    # Further sentences of the notice about how the answer was made (e.g. the bounds chosen for it).
    notes: tuple[str, ...] = ()

    @property
    def notice(self) -> str | None:
        """What the analyst is told after a private query: cost, budget left, ± error per column."""
        if not self.private:
            return None
        if self.replayed:
            parts = ["dpproxy: the same question was answered before; its stored answer costs nothing"]
        else:
            parts = [f"dpproxy: this query spent ε={budget_figure(self.cost.epsilon, up=True)}"]
            if self.cost.rho:
                parts[0] = (
                    f"dpproxy: this query spent ρ={budget_figure(self.cost.rho, up=True)} "
                    f"(ε={budget_figure(self.cost.epsilon, up=True)} alone)"
                )
            if self.cost.delta:
                parts[0] += f", δ={budget_figure(self.cost.delta, up=True)}"
        if self.budget is not None:
            left, limit = self.budget.remaining, self.budget.limit
            remaining = remaining_figure(left.epsilon, limit.epsilon)
            parts.append(
                f"ε remaining {remaining} of {format_number(limit.epsilon)}"
                + (f" (δ remaining {remaining_figure(left.delta, limit.delta)})" if limit.delta else "")
            )
            shared = self.budget.shared
            if shared is not None:
                left, limit = shared.remaining, shared.limit
                parts.append(
                    f"the data set's budget (all analysts): ε remaining "
                    f"{remaining_figure(left.epsilon, limit.epsilon)} of {format_number(limit.epsilon)}"
                )
        errors = [
            f"{c.name} ±{format_bound(c.error95)}" if c.error95 is not None else f"{c.name}: {c.error_note}"
            for c in self.columns
            if c.error95 is not None or c.error_note is not None
        ]
        if errors:
            parts.append("95% error: " + ", ".join(errors))
        parts.extend(self.notes)
        return "; ".join(parts)


class ResultStream:
    """A private answer released in batches of rows (dpproxy.release.stream), never held whole.

    `columns` are known before the first batch; iterating yields lists of released rows, running
    the backend query as it goes. Once the batches are exhausted, `summary` is the answer's Result
    without rows: the columns with their 95% figures, the cost, the budget left, and so the notice.
    `close()` stops the query (a stream closed early stays charged once its query was sent). A
    stream is iterated once, by one thread at a time.
    """

    def __init__(
        self,
        columns: tuple[ResultColumn, ...],
        batches: Iterator[list[tuple[object, ...]]],
        unstarted: Callable[[], None],
    ) -> None:
        self.columns = columns
        self._batches = batches
        self._unstarted = unstarted  # finishes what the stream holds when it is closed unstarted
        self._started = False
        self.rows = 0  # rows yielded so far
        self.summary: Result | None = None

    def __iter__(self) -> Iterator[list[tuple[object, ...]]]:
        return self

    def __next__(self) -> list[tuple[object, ...]]:
        self._started = True
        batch = next(self._batches)
        self.rows += len(batch)
        return batch

    def close(self) -> None:
        if not self._started:
            self._started = True
            self._unstarted()
        self._batches.close()

    def collect(self) -> Result:
        """The whole answer as one Result (for callers that want it held: COPY, FETCH, the CLI)."""
        rows = [row for batch in self for row in batch]
        assert self.summary is not None
        return Result(self.summary.columns, rows, self.summary.cost, self.summary.budget, private=True)


BUDGET_DIGITS = 6  # significant digits of a budget figure shown to an analyst or operator


def _round6(value: float, *, up: bool) -> Decimal:
    # repr: the shortest decimal that is this float, so 1e-05 is 0.00001, not 0.0000100000000000000008.
    exact = Decimal(repr(value))
    step = Decimal(1).scaleb(exact.adjusted() - BUDGET_DIGITS + 1)
    return exact.quantize(step, rounding=ROUND_CEILING if up else ROUND_FLOOR)


@functools.lru_cache(maxsize=4096)  # a pure function of floats; a session shows the same ones often
def budget_figure(value: float, *, up: bool, slack: float = 0.0) -> str:
    """A budget amount to BUDGET_DIGITS significant digits, rounded up (`up`, for what was spent)
    or down (for what is left), so that a figure shown never promises more than the ledger holds.
    `slack`: a distance to the other neighbour the ledger forgives as float rounding (0.49999999999999967
    left of 1 shows as 0.5, which a query of ε=0.5 fits in). The ledger keeps exact sums; display only."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    rounded = _round6(value, up=up)
    other = _round6(value, up=not up)
    exact = Decimal(repr(value))
    # Only a neighbour nearer than the rounded figure is float rounding (0.7999999999999996 spent
    # shows as 0.8, never as 0.799999 however large the slack).
    if abs(exact - other) <= Decimal(repr(slack)) and abs(exact - other) < abs(exact - rounded):
        rounded = other
    if rounded == 0:
        return "0"
    if -5 <= rounded.adjusted() < 15:
        text = format(rounded, "f")
        return text if "." not in text else text.rstrip("0").rstrip(".")
    return f"{float(rounded):.{BUDGET_DIGITS}g}"


def spent_figure(spent: float, limit: float) -> str:
    """What was spent against `limit`, rounded up but for the float rounding the ledger forgives
    (FIT_RELATIVE_TOLERANCE of the limit): 0.5000000000000003 of 1 shows as 0.5."""
    return budget_figure(spent, up=True, slack=_slack(limit))


def remaining_figure(left: float, limit: float) -> str:
    """What is left of `limit`, rounded down but for the same forgiveness."""
    return budget_figure(left, up=False, slack=_slack(limit))


def _slack(limit: float) -> float:
    return limit * FIT_RELATIVE_TOLERANCE if math.isfinite(limit) else 0.0


def hidden_groups_note(threshold: int, shown_from: int, *, released: int) -> str:
    """The notice's sentence about partition selection (dpproxy.release.groups.hidden_groups_notes):
    the threshold and where a group is all but sure to be shown, both of the plan; when no group was
    released, why the answer is empty and what would show the keys. No count of hidden groups: that
    would need its own share of ε (docs/privacy.md §5)."""
    text = (
        f"groups of fewer than ~{format_number(threshold)} persons are not shown (a group appears when "
        f"its noisy count of persons reaches {format_number(threshold)}; from {format_number(shown_from)} "
        "persons, with probability ≥ 95%)"
    )
    if released == 0:
        text += (
            "; no group reached it, so the answer is empty (whether any group exists is not revealed): "
            "to list every value of a key, the data owner can declare its values public (public_values "
            "in the policy); the query can name the values it wants (WHERE key IN (…)); or group by a "
            "coarser key, or spend a larger ε, which lowers the threshold"
        )
    return text


def rows_without_person_notes(relation: Relation, not_null: Collection[str]) -> tuple[str, ...]:
    """The notice's sentence that rows whose privacy unit is NULL were left out of the answer (README,
    "Rows without a person") and what would count them, or with `null_units: each_a_person` that each
    counts as a person, unless the database keeps that column NOT NULL (`not_null`: such tables): of
    the plan and the schema, never of the data (it is said whether or not such rows exist)."""
    found = relation.nullable_unit_table(not_null)
    if found is None:
        return ()
    table, unit, subquery = found
    if subquery is not None:
        return (
            f"rows of {table} whose {unit} is NULL are left out (subquery {subquery}, grouped by the "
            "privacy unit, reads only the rows that have one)",
        )
    if relation.null_unit_columns:
        return (
            f"rows of {table} whose {unit} is NULL each count as a person of their own "
            "(the policy's null_units: each_a_person; rows alike in every column are one person)",
        )
    return (
        f"rows of {table} whose {unit} is NULL are left out (they belong to no person; to "
        "count each as a person of its own, the data owner writes null_units: each_a_person in the policy)",
    )


def format_number(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if abs(value) >= 1e6 or abs(value) < 1e-3:
        return f"{value:.3g}"
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"


@functools.lru_cache(maxsize=4096)
def format_bound(value: float | None) -> str:
    """An error bound as format_number shows numbers, but rounded up at the digits shown: a "± at
    95%" printed below the bound it stands for would claim more accuracy than the answer has."""
    if value is None or value <= 0 or not math.isfinite(value):
        return format_number(value)
    exact = Decimal(repr(value))
    digits = 3 if value >= 1e6 or value < 1e-3 else 4 if value < 1000 else exact.adjusted() + 1
    rounded = exact.quantize(Decimal(1).scaleb(exact.adjusted() - digits + 1), rounding=ROUND_CEILING)
    return format_number(float(rounded))


_TAGS: dict[type, str] = {Decimal: "numeric", float: "float", dt.date: "date", dt.datetime: "timestamp"}


def _encode_value(value: object) -> object:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dt.datetime):
        return {"timestamp": value.isoformat()}
    if isinstance(value, dt.date):
        return {"date": value.isoformat()}
    if isinstance(value, Decimal):
        return {"numeric": str(value)}
    if isinstance(value, float):
        return {"float": repr(value)}
    raise TypeError(f"cannot store a {type(value).__name__} for replay")


def _decode_value(value: object) -> object:
    if not isinstance(value, dict):
        return value
    ((tag, text),) = value.items()
    if tag == "timestamp":
        return dt.datetime.fromisoformat(text)
    if tag == "date":
        return dt.date.fromisoformat(text)
    if tag == "numeric":
        return Decimal(text)
    return float(text)


def encode_result(result: Result) -> bytes:
    """A released answer as bytes for the replay store (noisy values only; never true ones)."""
    return json.dumps(
        {
            "columns": [[c.name, c.type.value, c.error95, c.error_note] for c in result.columns],
            "rows": [[_encode_value(v) for v in row] for row in result.rows],
            "notes": list(result.notes),
        }
    ).encode()


def decode_result(
    payload: bytes,
) -> tuple[tuple[ResultColumn, ...], list[tuple[object, ...]], tuple[str, ...]]:
    """A stored answer's columns, rows and notes (none in answers stored before notes were kept)."""
    data = json.loads(payload)
    columns = tuple(ResultColumn(name, PgType(t), error, note) for name, t, error, note in data["columns"])
    rows = [tuple(_decode_value(v) for v in row) for row in data["rows"]]
    return columns, rows, tuple(data.get("notes", ()))
