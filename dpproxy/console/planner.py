"""The console's accuracy planner: the ± at 95% the proxy would report for one aggregate at one ε.

This module owns building the statement a data owner describes (a table, a column, an aggregate),
having the engine plan it without a backend or a ledger (as `dpproxy explain` without `--backend`),
and reading the ± from the plan's noise as the release would compute it (dpproxy.release.aggregates):
for COUNT and SUM the noise's own 95% bound; for AVG, whose ± depends on the group's noisy count,
the ± of a group with the number of rows the owner assumes and its mean mid-range.

It must never see data: the engine it is given has no backend, so nothing here can read a row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from dpproxy.engine import Engine
from dpproxy.errors import DPProxyError
from dpproxy.policy import Policy, TablePolicy
from dpproxy.release.aggregates import average_error, column_errors
from dpproxy.sql.query import AggregateKind

# The aggregates the planner offers, as the SQL function it writes.
AGGREGATES = ("COUNT", "SUM", "AVG")
DEFAULT_ROWS = 1000  # the rows a group is assumed to have for AVG


@dataclass(frozen=True)
class Estimate:
    """What the planner shows: the statement, its cost and the ±, or why the proxy would refuse it."""

    sql: str
    epsilon: float
    error: float | str | None = None  # ± at 95% in the column's units (a sentence for selectors)
    cost_epsilon: float | None = None
    cost_delta: float | None = None
    problem: str | None = None  # the proxy's refusal (SQLSTATE, message, hint): never a data value
    note: str | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "sql": self.sql,
            "epsilon": self.epsilon,
            "error": self.error,
            "error_text": error_text(self.error),
            "cost_epsilon": self.cost_epsilon,
            "cost_delta": self.cost_delta,
            "problem": self.problem,
            "note": self.note,
        }


def error_text(error: float | str | None) -> str:
    if error is None:
        return "—"
    if isinstance(error, str):
        return error
    return f"±{error:.4g}"


def plannable_tables(policy: Policy) -> list[TablePolicy]:
    """Protected tables (those the planner can speak of), in policy order."""
    return [t for t in policy.tables if not t.public]


def statement(table: str, column: str, aggregate: str) -> str:
    """The SQL the planner asks about. Names come from the policy (lowercase identifiers)."""
    argument = "*" if aggregate == "COUNT" and column in ("", "*") else f'"{column}"'
    return f'SELECT {aggregate}({argument}) FROM "{table}"'


def estimate(
    policy: Policy,
    table: str,
    column: str,
    aggregate: str,
    epsilon: float,
    rows: int = DEFAULT_ROWS,
    enforced_unique: Mapping[str, frozenset[str]] | None = None,
) -> Estimate:
    """The ± the proxy would report for `aggregate(column)` over `table` at `epsilon`, from the plan
    alone. `enforced_unique`: the columns the backing database enforces unique (Engine.enforced_unique),
    which decide, as the policy's `unit_unique` does, whether a person has one row."""
    aggregate = aggregate.upper()
    known = policy.table(table)
    if aggregate not in AGGREGATES or known is None or known.public:
        return Estimate("", epsilon, problem="pick a protected table, one of its columns and an aggregate")
    if column not in ("", "*") and known.column(column) is None:
        return Estimate("", epsilon, problem=f"table {table} has no column {column} in the policy")
    sql = statement(table, column, aggregate)
    engine = Engine(policy, None, None, unique_columns=dict(enforced_unique or {}))
    try:
        plan = engine.plan(sql, epsilon=epsilon)
    except DPProxyError as e:
        text = f"{e.sqlstate}: {e.message}" + (f" — {e.hint}" if e.hint else "")
        return Estimate(sql, epsilon, problem=text)
    query = plan.query
    agg = query.aggregates[0]
    group_errors: list[list[float | None]] = []
    note = None
    if agg.kind is AggregateKind.AVG and agg.interval is not None:
        # The ± of one group with `rows` rows and its mean mid-range, as the release computes it.
        group_errors = [[average_error(agg, plan.noise, int(rows), fine_grid=plan.chooses_bounds)]]
        note = f"for a group of {max(int(rows), 1):,} rows (the ± of AVG shrinks as groups grow)"
    error = column_errors(query, plan.noise, group_errors)[0]
    return Estimate(
        sql,
        epsilon,
        error=float(error) if isinstance(error, (int, float, Decimal)) else error,
        cost_epsilon=plan.cost.epsilon,
        cost_delta=plan.cost.delta,
        note=note,
    )
