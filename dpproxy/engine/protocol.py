"""What the engine's parts (series limits, streaming, replay, queries over released rows) need of the
engine that runs them: they take it as an `EngineLike`, so none of them imports the pipeline, which
imports them all (no import circle, type hints included)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sqlglot import exp

from dpproxy.audit import StatementRecord
from dpproxy.backends import Backend, Cancellation
from dpproxy.budget import Ledger
from dpproxy.engine.charge import Charge
from dpproxy.engine.plan import Plan
from dpproxy.policy import AnalystPolicy, Policy
from dpproxy.privacy import Cost
from dpproxy.results import BudgetStatus, Result
from dpproxy.sql.bounds import SessionBounds
from dpproxy.sql.probes import EmptyQuery
from dpproxy.sql.query import AnalyzedQuery, PrivateQuery
from dpproxy.sql.released import ReleasedQuery


class EngineLike(Protocol):
    """The engine as its parts see it (dpproxy.engine.pipeline.Engine is one)."""

    policy: Policy
    ledger: Ledger | None
    database: str | None
    dialect: str
    new_salt: Callable[[], str]
    REPLAY_MAX_ROWS: int

    @property
    def policy_digest(self) -> str: ...

    def budget(self, analyst: str) -> BudgetStatus: ...

    def analyze_tree(
        self, tree: exp.Expression, *, answer: bool
    ) -> AnalyzedQuery | EmptyQuery | ReleasedQuery: ...

    def plan_private(
        self, query: PrivateQuery, epsilon: float, *, salt: str | None = None, bounds: SessionBounds | None
    ) -> Plan: ...

    def backend_or_fail(self) -> Backend: ...

    def run(
        self,
        plan: Plan,
        *,
        analyst: AnalystPolicy,
        cancel: Cancellation | None,
        record: StatementRecord | None,
    ) -> Result: ...

    def charge(
        self, analyst: AnalystPolicy, cost: Cost, statement: str, record: StatementRecord | None = None
    ) -> Charge: ...

    def run_charged(self, plan: Plan, charge: Charge, cancel: Cancellation | None) -> Result: ...
