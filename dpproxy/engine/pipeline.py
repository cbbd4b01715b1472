"""The pipeline of one statement (docs/architecture.md §2–3): the engine, the only part that knows all
the others.

    parse → bind → analyze (policy) → plan (rewrite, noise, cost; dpproxy.engine.plan)
    → charge.reserve → backend.run → exact groups → choose groups → noise → post-process → commit

Every entry point (CLI, wire server, Python API) calls `Engine.execute`, `Engine.plan` or
`Engine.explain`; none of them forks this pipeline. `Engine.prepare` is the one way from a statement to
what runs (cached only for an identical input: dpproxy.engine.caches). Every private path — plain,
series limit (dpproxy.engine.series), streamed (dpproxy.engine.streaming), refined quantile — is
charged through one `Charge` (dpproxy.engine.charge): no error text from the backend ever leaves a
private query, and the cost stands once a statement reached the data, else it is released.

Each statement's audit record (dpproxy.audit: the one the wire session made, else one of the
engine's own, client "local") gets its kind, its cost, whether it was replayed, the rows released
and the seconds spent planning, in the backend and releasing; a charged statement's record is
written by the ledger with its charge. Records the engine made itself are handed to its AuditLog.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqlglot import exp

from dpproxy.audit import CURRENT, StatementRecord, new_session_id
from dpproxy.audit_log import AuditLog
from dpproxy.backends import Backend, BackendUnreachable, Cancellation, LiveColumn, open_backend
from dpproxy.budget import Ledger, SharedBudget, open_ledger
from dpproxy.engine.accuracy import least_epsilon
from dpproxy.engine.caches import PlanCaches, PublicStatement, cache_key
from dpproxy.engine.charge import Charge, backend_failure, reached_data, within_cap
from dpproxy.engine.clipping import explain_clipping
from dpproxy.engine.collector import gc_paused
from dpproxy.engine.plan import Plan, answer_columns, plan_private
from dpproxy.engine.released import ReleasedPlan, analyze_released, plan_released, post_process_released
from dpproxy.engine.replay import answer_plan
from dpproxy.engine.series import SeriesStatement, execute_series, series_parts, with_placeholder_keys
from dpproxy.errors import (
    BackendUnavailable,
    DPProxyError,
    InvalidParameter,
    PolicyError,
    PublicQueryFailed,
    PublicSubqueryFailed,
    UnknownAnalyst,
    failure,
)
from dpproxy.explain import Explanation, explain_plan
from dpproxy.policy import DATASET, AnalystPolicy, Policy, check_against_schema, load_policy
from dpproxy.policy.live_schema import units_kept_not_null
from dpproxy.privacy import Cost
from dpproxy.release import choose_groups, exact_groups, post_process, release_aggregates
from dpproxy.release.bounds import choose_bounds, choose_distinct, fixed_bounds_notes
from dpproxy.release.groups import hidden_groups_notes
from dpproxy.release.quantiles import refine_quantiles
from dpproxy.results import (
    BudgetStatus,
    Result,
    ResultColumn,
    ResultStream,
    format_number,
    rows_without_person_notes,
)
from dpproxy.sql.analyze import (
    analyze,
    answer_subqueries,
    bind_parameters,
    infer_parameter_types,
    parse_statement,
)
from dpproxy.sql.bounds import SessionBounds, distinct_bounds, with_session_bounds
from dpproxy.sql.clock import reads_clock, with_statement_clock
from dpproxy.sql.probes import EmptyQuery
from dpproxy.sql.public import backend_sql
from dpproxy.sql.query import AnalyzedQuery, ConstantQuery, PrivateQuery, PublicQuery
from dpproxy.sql.released import ReleasedQuery
from dpproxy.sql.statement import array_parameters, placeholders
from dpproxy.sql.types import PgType, from_column_type

log = logging.getLogger("dpproxy.engine")


@dataclass(frozen=True)
class ExposedTable:
    """A table as analysts may see it: its name and columns, never its rows or statistics."""

    name: str
    columns: tuple[tuple[str, PgType], ...]
    public: bool
    privacy_unit: str | None


@dataclass(frozen=True)
class Description:
    """What a statement takes and returns, known before it runs (extended protocol's Describe)."""

    parameter_types: tuple[PgType, ...]
    columns: tuple[ResultColumn, ...]
    private: bool
    arrays: frozenset[int] = frozenset()  # parameters that are arrays of their type (`= ANY($1)`)


@dataclass
class Engine:
    """Differentially private answers to SQL over a policy's tables.

    >>> engine = Engine.open("policies/demo.yaml", "demo-data/demo.duckdb")   # doctest: +SKIP
    >>> engine.execute("SELECT COUNT(*) FROM patients", analyst="alice").rows  # doctest: +SKIP
    """

    policy: Policy
    backend: Backend | None
    ledger: Ledger | None = None
    dialect: str = ""
    # Per table, the columns the database enforces unique and not NULL, read from the backend at
    # start, and the privacy units the policy vouches unique (`unit_unique: true`): a privacy unit
    # among them means one row per person.
    unique_columns: dict[str, frozenset[str]] = field(default_factory=dict)
    # The served database's name (what current_database() answers): a `db.schema.table` name must
    # give it. None (the Python API, `dpproxy query`) accepts any database name.
    database: str | None = None
    _public_columns: dict[str, list[tuple[str, PgType]]] = field(default_factory=dict, init=False)
    # What the cold path answered for recent exact inputs (dpproxy.engine.caches): a repeated
    # statement skips parsing and rewriting, and a private one keeps its salt, so its per-unit
    # selection is the same each time. Nothing re-binds new constants into a cached plan.
    caches: PlanCaches = field(default_factory=PlanCaches, init=False, repr=False, compare=False)
    # The salt of a new plan's per-person choices (tests make it fixed to compare plans).
    new_salt: Callable[[], str] = field(default=lambda: secrets.token_hex(8), repr=False, compare=False)
    # Records of statements asked without a wire session (the CLI, the Python API): one session id
    # per engine, statements numbered from 1.
    _local_session: str = field(default_factory=new_session_id, init=False)
    _local_statements: itertools.count[int] = field(default_factory=lambda: itertools.count(1), init=False)
    # Where statements' records are written (dpproxy.audit_log): one per ledger, shared by the engines
    # `with_policy` makes; by default a new one when there is a ledger.
    audit_log: AuditLog | None = field(default=None, repr=False, compare=False)
    # The policy in force for this engine and those `with_policy` made from it (see `analyst`).
    _live: _LivePolicy = field(init=False)
    # unique_columns as read from the backend, before the policy's `unit_unique` is added.
    enforced_unique: dict[str, frozenset[str]] = field(default_factory=dict, init=False)
    # Tables whose unit column is NOT NULL (dpproxy.results.rows_without_person_notes).
    unit_not_null: frozenset[str] = field(default=frozenset(), init=False)

    def __post_init__(self) -> None:
        if not self.dialect:
            self.dialect = self.backend.dialect if self.backend is not None else "postgres"
        if self.backend is not None:
            self._check_schema()
        self.enforced_unique = dict(self.unique_columns)  # what the database itself enforces
        self._live = _LivePolicy(self.policy)
        # The policy's word adds to what the database enforces, never takes from it.
        for table in self.policy.tables:
            if table.unit_unique and table.privacy_unit is not None:
                known = self.unique_columns.get(table.name, frozenset())
                self.unique_columns[table.name] = known | {table.privacy_unit}
        if self.ledger is not None and self.audit_log is None:
            self.audit_log = AuditLog(self.ledger, retention_days=self.policy.server.audit_retention_days)
            try:
                self.audit_log.prune()  # at open, then once a day while the log writes
            except Exception as error:
                log.error("could not delete old audit records: %s", failure(error))

    def with_policy(self, policy: Policy) -> Engine:
        """This engine for another policy (a policy reload): the same backend, ledger, dialect,
        database and audit log, the policy checked against the live schema as a new engine's is
        (`__post_init__`), and the unique columns read again. Closing either engine closes the
        shared parts: close only the one in use last."""
        engine = dataclasses.replace(self, policy=policy, unique_columns={})  # same audit_log
        engine._live = self._live  # `make_current` once it serves
        if self.audit_log is not None:
            self.audit_log.retention_days = policy.server.audit_retention_days
        return engine

    def audit(self, record: StatementRecord) -> None:
        """Write a finished statement's record (in a thread of the audit log's; cheap, never raises).
        A charged statement's row exists already: this completes it."""
        if self.audit_log is not None:
            self.audit_log.submit(record)

    def flush_audit(self) -> None:
        """Wait until every record handed to `audit` so far is written."""
        if self.audit_log is not None:
            self.audit_log.flush()

    @classmethod
    def open(
        cls,
        policy: str | Path | Policy,
        backend: str | Backend | None,
        ledger: str | Path | Ledger | None = None,
    ) -> Engine:
        """The documented entry point: a policy file, a backend DSN (or DuckDB path) and a ledger."""
        loaded = policy if isinstance(policy, Policy) else load_policy(policy)
        opened = open_backend(backend) if isinstance(backend, str) else backend
        ledger_obj = open_ledger(ledger) if isinstance(ledger, (str, Path)) else ledger
        return cls(loaded, opened, ledger_obj)

    def close(self) -> None:
        if self.audit_log is not None:
            self.audit_log.close()
        if self.backend is not None:
            self.backend.close()
        if self.ledger is not None:
            self.ledger.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- schema ------------------------------------------------------------------------------------

    def _check_schema(self) -> None:
        """Refuse to serve a policy that does not match the live schema (types drive the rewrite)."""
        assert self.backend is not None
        live: dict[str, list[LiveColumn]] = {}
        schemas = {t.schema for t in self.policy.tables}
        for schema in schemas:
            try:
                tables = self.backend.tables(schema)
            except BackendUnreachable as e:
                raise BackendUnavailable(f"cannot reach the backing database: {e}") from None
            for table in self.policy.tables:
                if table.schema == schema and table.name in tables:
                    live[table.name] = tables[table.name]
        problems = check_against_schema(self.policy, live)
        if problems:
            raise PolicyError(problems, source=f"{self.policy.source} against the backend")
        self.unit_not_null = units_kept_not_null(self.policy, live)
        for schema in schemas:
            enforced = self.backend.unique_columns(schema)
            for table in self.policy.tables:
                if table.schema == schema and table.name in enforced:
                    self.unique_columns[table.name] = frozenset(enforced[table.name])
        for table in self.policy.tables:
            if table.public and not table.columns and table.name in live:
                self._public_columns[table.name] = [
                    (c.name, from_column_type(c.type) if c.type is not None else PgType.TEXT)
                    for c in live[table.name]
                ]

    def exposed_tables(self) -> tuple[ExposedTable, ...]:
        """The structure the shadow catalog shows: exposed tables and columns, in policy order."""
        tables = []
        for table in self.policy.tables:
            columns = tuple((c.name, from_column_type(c.type)) for c in table.columns) or tuple(
                self._public_columns.get(table.name, ())
            )
            tables.append(ExposedTable(table.name, columns, table.public, table.privacy_unit))
        return tuple(tables)

    # -- planning ----------------------------------------------------------------------------------

    @with_statement_clock
    def analyze(self, sql: str, params: Sequence[object] = ()) -> AnalyzedQuery | EmptyQuery | ReleasedQuery:
        return self.analyze_tree(bind_parameters(parse_statement(sql), params), answer=True)

    def analyze_tree(
        self, tree: exp.Expression, *, answer: bool
    ) -> AnalyzedQuery | EmptyQuery | ReleasedQuery:
        """Analyze a parsed, parameter-bound statement. Its subqueries over public tables are run
        first and inlined (`answer`, with a backend), or replaced by placeholders of their type; so
        are a public table's values of a GROUP BY key joined to it read (or left to partition
        selection)."""
        parts = series_parts(self, tree, answer=answer)
        if parts is not None:
            # Described or explained (execute runs these itself): the main query, with placeholder
            # constants for the keys the top-k query would release.
            tree = with_placeholder_keys(parts.series, parts.inner)
        run = self._run_subquery if answer and self.backend is not None else None
        try:
            inlined = answer_subqueries(tree, self.policy, self._public_columns, run, database=self.database)
            query = analyze(
                inlined.tree,
                self.policy,
                self._public_columns,
                self.unique_columns,
                database=self.database,
                fetch_key_values=run,  # GROUP BY keys of a joined public table (dpproxy.sql.public_keys)
            )
        except DPProxyError as refused:
            # Refused as one private query: maybe a query over a private aggregate's answer.
            released = analyze_released(self, tree, refused, answer=answer)
            if released is None:
                raise
            return released
        if inlined.subqueries and isinstance(query, PrivateQuery):
            return dataclasses.replace(
                query, inlined_subqueries=True, subquery_placeholders=inlined.placeholders
            )
        return query

    def _run_subquery(self, query: PublicQuery) -> list[tuple]:
        """Rows of a subquery over public tables, run on its own before the private query is planned."""
        backend = self.backend_or_fail()
        try:
            return backend.run(backend_sql(query.sql, backend.dialect))
        except Exception as error:
            failed = functools.partial(PublicSubqueryFailed, query.text)
            raise backend_failure(error, charged=False, failed=failed) from None

    @with_statement_clock
    def describe(self, sql: str, parameter_types: Sequence[PgType | None] = ()) -> Description:
        """Parameter and result types of a statement, without data or budget.

        Parameters the client did not type are inferred from their context; the statement is then
        analyzed with placeholder values of those types, which gives the result columns.
        """
        tree = parse_statement(sql)
        types = infer_parameter_types(tree, self.policy, parameter_types)
        contexts = infer_parameter_types(tree, self.policy)
        query = self.analyze_tree(bind_parameters(tree, placeholders(tree, types, contexts)), answer=False)
        outputs = (
            query.outputs
            if isinstance(query, (PublicQuery, EmptyQuery, ReleasedQuery))
            else query.post_processing.outputs
        )
        columns = tuple(ResultColumn(o.name, o.type) for o in outputs)
        arrays = frozenset(array_parameters(tree))
        return Description(types, columns, isinstance(query, (PrivateQuery, ReleasedQuery)), arrays)

    def query_epsilon(self, epsilon: float | None, analyst: AnalystPolicy | None = None) -> float:
        """The per-query ε: the policy default (capped by the analyst's own per-query limit), or a
        requested value within the policy's limits."""
        low, high = self.policy.epsilon_limits(analyst)
        if epsilon is None:
            return min(self.policy.defaults.epsilon, high)
        if not low <= epsilon <= high:
            raise InvalidParameter(
                f"per-query epsilon {epsilon:g} is outside the range the policy allows ({low:g} to {high:g})",
                hint="choose a value in that range, e.g. SET dpproxy.epsilon = "
                + f"{self.policy.defaults.epsilon:g}",
            )
        return float(epsilon)

    def plan_private(
        self,
        query: PrivateQuery,
        epsilon: float,
        *,
        salt: str | None = None,
        bounds: SessionBounds | None = None,
    ) -> Plan:
        """The plan of an analysed private query; `bounds`: those the analyst set for the session
        (dpproxy.sql.bounds), within the ceilings, instead of choosing them."""
        return plan_private(with_session_bounds(query, bounds), self.policy, epsilon, self.dialect, salt=salt)

    @with_statement_clock
    def plan(
        self,
        sql: str,
        params: Sequence[object] = (),
        *,
        epsilon: float | None = None,
        salt: str | None = None,
        bounds: SessionBounds | None = None,
    ) -> Plan:
        """The plan of a private query, without touching data or budget."""
        query = self.analyze(sql, params)
        if isinstance(query, ReleasedQuery):  # the private aggregate's plan: the outer query is free
            query = query.private
        if isinstance(query, EmptyQuery):
            raise InvalidParameter(f"this query has no rows ({query.reason}): it has no private plan")
        if not isinstance(query, PrivateQuery):
            raise InvalidParameter("this query reads no protected table: it has no private plan")
        return self.plan_private(query, self.query_epsilon(epsilon), salt=salt, bounds=bounds)

    @with_statement_clock
    def explain(
        self,
        sql: str,
        params: Sequence[object] = (),
        *,
        epsilon: float | None = None,
        bounds: SessionBounds | None = None,
    ) -> Explanation:
        tree = bind_parameters(parse_statement(sql), params)
        parts = series_parts(self, tree, answer=False)
        query = self.analyze_tree(tree, answer=True)
        if isinstance(query, ConstantQuery):
            return Explanation(
                query.text,
                "constant",
                outputs=tuple((o.name, o.type.value) for o in query.post_processing.outputs),
            )
        if isinstance(query, EmptyQuery):
            return Explanation(
                query.text,
                f"empty ({query.reason}): answered with its columns and no rows; no backend call, no cost",
                outputs=tuple((o.name, o.type.value) for o in query.outputs),
            )
        if isinstance(query, PublicQuery):
            return Explanation(
                query.text,
                "public (no noise, no cost)",
                final_sql=backend_sql(query.sql, self.dialect),
                outputs=tuple((o.name, o.type.value) for o in query.outputs),
            )
        chosen = self.query_epsilon(epsilon)
        target = None
        if bounds is not None and bounds.target_error is not None:
            # Accuracy first (dpproxy.engine.accuracy): the ε the target would cost, said.
            private = query.private if isinstance(query, ReleasedQuery) else query
            low, high = self.policy.epsilon_limits(None)
            chosen = least_epsilon(
                self.plan_private(private, chosen, bounds=bounds), bounds.target_error, low, high
            )
            target = (
                f"dpproxy.target_error = {bounds.target_error:g}: the least ε that meets it is {chosen:g}"
            )
        if isinstance(query, ReleasedQuery):
            explanation = explain_plan(self.plan_private(query.private, chosen, bounds=bounds), self.dialect)
            note = (
                f"the outer query is computed from the released rows of {query.source} "
                f"(post-processing, no further cost): {query.outer.sql('postgres')}"
            )
            outputs = tuple((o.name, o.type.value) for o in query.outputs)
            explanation = dataclasses.replace(explanation, text=query.text, subqueries=note, outputs=outputs)
            return dataclasses.replace(explanation, target=target)
        plan = self.plan_private(query, chosen, bounds=bounds)
        clipping = explain_clipping(self, plan, bounds) if parts is None else None
        explanation = dataclasses.replace(explain_plan(plan, self.dialect), target=target, clipping=clipping)
        if parts is None:
            return explanation
        top_k = self.plan_private(parts.inner, chosen, bounds=bounds)
        note = (
            f"series limit: the top-k query ({parts.inner.text}) is asked first as a private query "
            f"(ε={format_number(top_k.cost.epsilon)}); the keys it releases replace the join, inlined as "
            "constants (placeholders shown); the cost is both queries'"
        )
        return dataclasses.replace(
            explanation, text=tree.sql("postgres"), cost=explanation.cost + top_k.cost, subqueries=note
        )

    # -- execution ---------------------------------------------------------------------------------

    def analyst(self, name: str) -> AnalystPolicy:
        """The analyst's policy, with the limits in force now: after a reload, a session on an earlier
        policy gets the lower of both policies' ε, δ and per-query caps (the analyst's own, or
        max_epsilon) and the current refresh window; one the current policy no longer lists is refused."""
        analyst = self.policy.analyst(name)
        if analyst is None:
            raise UnknownAnalyst(
                f'analyst "{name}" is not in the policy', hint="ask the data owner to add you"
            )
        current = self._live.policy
        if current is self.policy:
            return analyst
        now = current.analyst(name)
        if now is None:
            raise UnknownAnalyst(
                f'analyst "{name}" is no longer in the policy (it was reloaded)',
                hint="ask the data owner to add you again",
            )
        cap = min(self.policy.epsilon_limits(analyst)[1], current.epsilon_limits(now)[1])
        return dataclasses.replace(
            analyst,
            epsilon=min(analyst.epsilon, now.epsilon),
            delta=min(analyst.delta, now.delta),
            max_epsilon_per_query=cap,
            refresh=now.refresh,
        )

    def make_current(self) -> None:
        """This engine's policy is now the one in force for every engine of its lineage (the ones
        `with_policy` made): sessions still on an earlier one are held to its limits too."""
        self._live.policy = self.policy

    def budget(self, analyst: str) -> BudgetStatus:
        """The analyst's spending in their current refresh window, with the data set's if the
        policy has a data-set budget."""
        policy = self.analyst(analyst)
        spent = self.ledger.spent_now(analyst, policy.refresh) if self.ledger is not None else Cost.ZERO
        return BudgetStatus(analyst, spent, Cost(policy.epsilon, policy.delta), self.data_set_budget())

    def data_set_budget(self) -> BudgetStatus | None:
        """The data set's budget in force now (the current policy's, after a reload) and what every
        analyst together has spent of it in its current window; None when it has no `budget:`."""
        budget = self._live.policy.budget
        if budget is None:
            return None
        spent = self.ledger.spent_now(DATASET, budget.refresh) if self.ledger is not None else Cost.ZERO
        return BudgetStatus(DATASET, spent, Cost(budget.epsilon, budget.delta))

    @with_statement_clock  # one now() for the statement (dpproxy.sql.clock)
    def execute(
        self,
        sql: str,
        params: Sequence[object] = (),
        *,
        analyst: str,
        epsilon: float | None = None,
        cancel: Cancellation | None = None,
        stream: bool = False,
        record: StatementRecord | None = None,
        bounds: SessionBounds | None = None,
    ) -> Result | ResultStream:
        """Answer one statement for an analyst: noisy rows, what it cost, and the budget left.

        `cancel` lets another thread interrupt the backend query (57014); a private query that had
        started reading data stays charged. `stream`: a private query whose release is per group
        (dpproxy.release.stream) comes back as a ResultStream, released batch by batch in canonical
        order as the backend returns its rows, never held whole; any other statement as a Result.
        `record`: the statement's audit record (else dpproxy.audit.CURRENT's, else one of the
        engine's own, written when the statement ends): filled in here, written with any charge.
        """
        given = record if record is not None else CURRENT.get()
        own = given is None
        if given is None:
            given = StatementRecord(
                analyst,
                sql,
                tuple(params),
                client="local",
                session_id=self._local_session,
                statement_id=next(self._local_statements),
            )
        started = time.perf_counter()
        timed_before = given.stages.get("backend", 0.0) + given.stages.get("noise", 0.0)
        try:
            result = self._execute(sql, params, analyst, epsilon, cancel, stream, given, bounds)
        except BaseException as error:
            given.failed(error)
            raise
        finally:
            timed = given.stages.get("backend", 0.0) + given.stages.get("noise", 0.0) - timed_before
            given.add_stage("plan", max(0.0, time.perf_counter() - started - timed))
            if own:
                given.finish()
                self.audit(given)
        if isinstance(result, Result) and not result.replayed:
            given.rows = len(result.rows)
        return result

    def _execute(
        self,
        sql: str,
        params: Sequence[object],
        analyst: str,
        epsilon: float | None,
        cancel: Cancellation | None,
        stream: bool,
        record: StatementRecord,
        bounds: SessionBounds | None = None,
    ) -> Result | ResultStream:
        who = self.analyst(analyst)
        chosen = self.query_epsilon(epsilon, who)
        prepared = self.prepare(sql, params, epsilon=chosen, bounds=bounds)
        if bounds is not None and bounds.target_error is not None:
            # Accuracy first: the least ε whose ± meets the target, from the plan alone.
            planned = prepared.private if isinstance(prepared, ReleasedPlan) else prepared
            if isinstance(planned, Plan):
                low, high = self.policy.epsilon_limits(who)
                chosen = least_epsilon(planned, bounds.target_error, low, high)
                prepared = self.prepare(sql, params, epsilon=chosen, bounds=bounds)
        if isinstance(prepared, PublicStatement):
            _kind(record, "public")
            return self._run_public(prepared, cancel, record=record)
        if isinstance(prepared, ConstantQuery):
            _kind(record, "constant")
            columns = tuple(ResultColumn(o.name, o.type) for o in prepared.post_processing.outputs)
            return Result(columns, post_process(prepared.post_processing, [], [], [()], [[]]))
        if isinstance(prepared, EmptyQuery):  # a probe: its columns, no rows, no backend call, no cost
            _kind(record, "empty")
            return Result(tuple(ResultColumn(o.name, o.type) for o in prepared.outputs), [])
        _kind(record, "private")
        if isinstance(prepared, SeriesStatement):
            return execute_series(self, prepared, who, chosen, cancel, record, bounds)
        if isinstance(prepared, ReleasedPlan):  # the aggregate answered alone, then post-processed
            answer = answer_plan(self, prepared.private, who, cancel, False, record)
            assert isinstance(answer, Result)
            return post_process_released(prepared, answer)
        return answer_plan(self, prepared, who, cancel, stream, record, bounds, clip=True)

    @with_statement_clock
    def prepare(
        self, sql: str, params: Sequence[object] = (), *, epsilon: float, bounds: SessionBounds | None = None
    ) -> Plan | PublicStatement | ConstantQuery | EmptyQuery | SeriesStatement | ReleasedPlan:
        """What `execute` runs for a statement at a per-query ε, from the caches when this exact input
        was analysed before (dpproxy.engine.caches), else analysed cold: a private plan, a statement over
        public tables, a constant query, a probe answered without data, or a series limit (analysed
        again when run: never cached). Touches neither data nor budget (public subqueries are run and
        inlined); the language tests compare it, cached and cold, statement by statement."""
        key = cache_key(sql, params, epsilon, bounds)
        cached = self.caches.public.get(key) or self.caches.private.get(key)
        if cached is not None:
            return cached
        tree = bind_parameters(parse_statement(sql), params)
        series = series_parts(self, tree, answer=True)
        if series is not None:
            return series
        query = self.analyze_tree(tree, answer=True)
        if isinstance(query, (ConstantQuery, EmptyQuery)):
            return query
        if isinstance(query, ReleasedQuery):  # planned afresh each time: its inner aggregate is
            return plan_released(self, query, epsilon, bounds)  # cached when sent alone
        if isinstance(query, PublicQuery):
            public = PublicStatement(query, backend_sql(query.sql, self.dialect))
            if not _has_subquery(tree) and not reads_clock(tree):  # data, or now(), of its moment
                self.caches.public.put(key, public)
            return public
        plan = self.plan_private(query, epsilon, salt=self.new_salt(), bounds=bounds)
        if not query.inlined_subqueries and not any(k.fetched for k in query.keys) and not reads_clock(tree):
            self.caches.private.put(key, plan)  # answers read from public tables are of their moment
        return plan

    @functools.cached_property
    def policy_digest(self) -> str:
        # Bounds, limits, mechanism and accounting change what an answer means: a new policy, new answers.
        return hashlib.sha256(repr((self.policy.defaults, self.policy.tables)).encode()).hexdigest()

    def backend_or_fail(self) -> Backend:
        if self.backend is None:
            raise BackendUnavailable("no backing database is configured", hint="pass --backend")
        return self.backend

    def _run_public(
        self,
        public: PublicStatement,
        cancel: Cancellation | None = None,
        *,
        record: StatementRecord | None = None,
    ) -> Result:
        backend = self.backend_or_fail()
        started = time.perf_counter()
        if record is not None:
            record.reached = True
        try:
            rows = backend.run(public.sql, cancel=cancel)
        except Exception as error:
            if record is not None:
                record.reached = reached_data(error)
            raise backend_failure(error, charged=None, failed=PublicQueryFailed) from None
        finally:
            if record is not None:
                record.add_stage("backend", time.perf_counter() - started)
        return Result(tuple(ResultColumn(name, pg_type) for name, pg_type in _columns_of(public.query)), rows)

    def run(
        self,
        plan: Plan,
        *,
        analyst: AnalystPolicy,
        cancel: Cancellation | None = None,
        record: StatementRecord | None = None,
    ) -> Result:
        """Reserve the plan's cost, run it, noise it, commit the cost: the charge stands once any
        statement of the plan was sent to the backend (dpproxy.engine.charge)."""
        if plan.query.subquery_placeholders:
            raise InvalidParameter("internal: a plan whose subqueries hold placeholders cannot be run")
        charge = self.charge(analyst, plan.cost, plan.query.text, record)
        return charge.commit(self.run_charged(plan, charge, cancel), plan.cost)

    def charge(
        self, analyst: AnalystPolicy, cost: Cost, statement: str, record: StatementRecord | None = None
    ) -> Charge:
        """Reserve `cost` (53400 beyond the budget) under the limits in force now, cap included."""
        analyst = self.analyst(analyst.name)
        within_cap(cost, self.policy.epsilon_limits(analyst)[1])
        limit = Cost(analyst.epsilon, analyst.delta)
        budget = self._live.policy.budget  # in force now, for sessions on an earlier policy too
        shared = None if budget is None else SharedBudget(Cost(budget.epsilon, budget.delta), budget.refresh)
        reservation = None
        if self.ledger is not None:
            reservation = self.ledger.reserve(
                analyst.name,
                cost,
                limit,
                statement=statement,
                accounting=self.policy.defaults.accounting,
                record=record,
                refresh=analyst.refresh,
                shared=shared,
            )
        return Charge(self.ledger, reservation, record, analyst.name, limit, shared)

    def run_charged(self, plan: Plan, charge: Charge, cancel: Cancellation | None) -> Result:
        """Run a plan's statements and release its answer under `charge` (made for it, maybe for more):
        on failure the charge is finished by its rule; on success the caller commits it."""
        record = charge.record
        if plan.query.subquery_placeholders:
            charge.abandon(sent=False)
            raise InvalidParameter("internal: a plan whose subqueries hold placeholders cannot be run")
        backend = self.backend_or_fail()
        row_sets: list[list[tuple]] = []
        started = time.perf_counter()
        if record is not None:
            record.reached = True
        try:
            for sql in plan.statements:
                row_sets.append(backend.run(sql, cancel=cancel))
                charge.sent()
        except BaseException as error:
            if record is not None:
                record.add_stage("backend", time.perf_counter() - started)
            raise charge.fail(error) from None
        released = time.perf_counter()
        if record is not None:
            record.add_stage("backend", released - started)
        try:
            return self.release(plan, row_sets, lambda sql: backend.run(sql, cancel=cancel))
        except BaseException as error:
            raise charge.fail(error) from None
        finally:
            if record is not None:
                record.add_stage("noise", time.perf_counter() - released)

    def release(
        self,
        plan: Plan,
        row_sets: Sequence[Sequence[Sequence[object]]],
        run: Callable[[str], Sequence[Sequence[object]]] | None = None,
    ) -> Result:
        """The noisy answer of a plan from the rows its statements returned: groups chosen, fresh
        noise drawn, post-processed. Each call is a new release (tests repeat it to measure the
        privacy loss between neighbouring databases); it charges nothing: `run` charges. Refined
        quantiles run their second statement (emitted with the plan: `Plan.refinements`) through
        `run`; nothing here writes SQL."""
        with gc_paused():
            return self._release(plan, row_sets, run)

    def _release(
        self,
        plan: Plan,
        row_sets: Sequence[Sequence[Sequence[object]]],
        run: Callable[[str], Sequence[Sequence[object]]] | None,
    ) -> Result:
        query = plan.query
        exact = exact_groups(query, *row_sets, salt=plan.distinct_salt)
        noise = plan.noise
        notes: tuple[str, ...] = ()
        values = -1
        if distinct_bounds(query):  # COUNT(DISTINCT x) per person: ℓ drawn, then its values
            exact, values, note = choose_distinct(query, exact, noise)
            notes = (note,)
        if exact.candidates is not None:  # bounds chosen per query: k and g, their values, the groups
            groups, chosen, noise = choose_bounds(query, exact, noise, plan.noise_at, values)
            notes = tuple(n for n in (chosen.note(), chosen.removed, *notes) if n)  # none: nothing bounded
        else:
            if values != -1:
                noise = plan.noise_at(-1, -1, values)
            groups = choose_groups(query, exact, noise)
        refined = refine_quantiles(query, plan.refinements if query.histograms else {}, groups, noise, run)
        released = release_aggregates(query, groups, noise, plan.responses, refined)
        post = query.post_processing
        out_rows = post_process(
            post,
            [k.type for k in query.keys],
            [a.result_type for a in query.aggregates],
            released.keys,
            released.columns,
            by_column=True,
        )
        hidden = hidden_groups_notes(query, noise, len(released.keys), groups.present)
        notes = (*fixed_bounds_notes(query), *notes, *hidden)
        notes = (*notes, *rows_without_person_notes(query.relation, self.unit_not_null))
        return Result(answer_columns(plan, released.errors), out_rows, notes=notes)

    # Answers with more rows than this are not stored for free replay: a repeat is charged again
    # (the stored bytes would grow with the answer). Decided by the released answer's size alone.
    REPLAY_MAX_ROWS = 100_000


@dataclass
class _LivePolicy:
    """The policy in force now, shared by an engine and its reloads (Engine.make_current)."""

    policy: Policy


def _columns_of(query: PublicQuery) -> list[tuple[str, PgType]]:
    """What a public query's answer is described by (`_run_public`): its columns' names and types."""
    return [(o.name, o.type) for o in query.outputs]


def _has_subquery(tree: exp.Expression) -> bool:
    return any(isinstance(node, (exp.Subquery, exp.Select)) and node is not tree for node in tree.walk())


def _kind(record: StatementRecord | None, kind: str) -> None:
    """The engine's kind of a statement, unless the session named it (a cursor, COPY, EXECUTE)."""
    if record is not None and not record.kind:
        record.kind = kind


def connect(
    policy: str | Path | Policy, backend: str | Backend | None, ledger: str | Path | Ledger | None = None
) -> Engine:
    """dpproxy.connect(policy, backend, ledger): the Python API's one entry point (see Engine.open)."""
    return Engine.open(policy, backend, ledger)
