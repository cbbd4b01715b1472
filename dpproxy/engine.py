"""The pipeline of one statement (DESIGN §2): the only module that knows all the parts.

    parse → bind → analyze (policy) → rewrite (SQL for the backend) → plan noise and cost
    → budget.reserve → backend.run → measure → select groups → noise → post-process → budget.commit

Every entry point (CLI, wire server, Python API) calls `Engine.execute`, `Engine.plan` or
`Engine.explain`; none of them forks this pipeline. No error text from the backend ever leaves a
private query: it becomes PrivateQueryFailed's fixed message, and the cost stays charged (whether
the database failed can depend on the data). A query that never reached the data is not charged.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from sqlglot import exp

from dpproxy.backends import (
    Backend,
    BackendError,
    BackendUnreachable,
    Cancellation,
    LiveColumn,
    QueryCancelled,
    open_backend,
)
from dpproxy.budget import Ledger, epsilon_equivalent, open_ledger
from dpproxy.errors import (
    BackendUnavailable,
    InvalidParameter,
    PolicyError,
    PrivateQueryFailed,
    PublicSubqueryFailed,
    QueryCanceled,
    UnknownAnalyst,
)
from dpproxy.mechanisms import (
    Cost,
    QueryNoise,
    RandomizedResponseCount,
    plan_query_noise,
    randomized_response_count_plan,
)
from dpproxy.policy import AnalystPolicy, Policy, check_against_schema, load_policy
from dpproxy.release import Measurement, choose_groups, finish_rows, measure, release_aggregates, selectors
from dpproxy.sql.analyze import (
    analyze,
    answer_subqueries,
    bind_parameters,
    infer_parameter_types,
    parse_statement,
)
from dpproxy.sql.literals import placeholder_value
from dpproxy.sql.numbers import emit
from dpproxy.sql.query import AnalyzedQuery, ConstantQuery, PrivateQuery, PublicQuery
from dpproxy.sql.rewrite import RewriteState, rewrite
from dpproxy.sql.types import PgType, from_column_type


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

    @property
    def notice(self) -> str | None:
        """What the analyst is told after a private query: cost, budget left, ± error per column."""
        if not self.private:
            return None
        if self.replayed:
            parts = ["dpproxy: the same question was answered before; its stored answer costs nothing"]
        else:
            parts = [f"dpproxy: this query spent ε={_fmt(self.cost.epsilon)}"]
            if self.cost.rho:
                parts[0] = (
                    f"dpproxy: this query spent ρ={_fmt(self.cost.rho)} (ε={_fmt(self.cost.epsilon)} alone)"
                )
            if self.cost.delta:
                parts[0] += f", δ={_fmt(self.cost.delta)}"
        if self.budget is not None:
            left = self.budget.remaining
            parts.append(
                f"ε remaining {_fmt(left.epsilon)} of {_fmt(self.budget.limit.epsilon)}"
                + (f" (δ remaining {_fmt(left.delta)})" if self.budget.limit.delta else "")
            )
        errors = [
            f"{c.name} ±{_fmt(c.error95)}" if c.error95 is not None else f"{c.name}: {c.error_note}"
            for c in self.columns
            if c.error95 is not None or c.error_note is not None
        ]
        if errors:
            parts.append("95% error: " + ", ".join(errors))
        return "; ".join(parts)


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if abs(value) >= 1e6 or abs(value) < 1e-3:
        return f"{value:.3g}"
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"


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


@dataclass(frozen=True)
class Plan:
    """A private query ready to run: its SQL, its noise and its cost. Built without data or budget."""

    query: PrivateQuery
    rewrite: RewriteState
    dialect: str
    noise: QueryNoise
    epsilon: float
    delta: float
    responses: RandomizedResponseCount | None = None  # COUNT by randomized response

    @functools.cached_property
    def statements(self) -> tuple[str, ...]:
        """The rewritten SQL in the backend's dialect, main statement first (built once per plan)."""
        return tuple(self.rewrite.statements(self.dialect))

    @property
    def sql(self) -> str:
        return self.statements[0]

    @property
    def cost(self) -> Cost:
        return self.noise.cost

    @property
    def sensitivities(self) -> tuple[int, ...]:
        return tuple(c.sensitivity(self.query.max_rows) for c in self.query.components)

    def measure(self, *row_sets: Sequence[Sequence[object]]) -> Measurement:
        """True values per group from each statement's rows (the certificates' seam; see release.py)."""
        return measure(self.query, *row_sets)


@dataclass(frozen=True)
class Explanation:
    text: str  # the statement as analyzed
    kind: str  # "private", "public" or "constant"
    steps: tuple[tuple[str, str, str], ...] = ()  # (pass, summary, SQL after it)
    final_sql: str = ""
    released: tuple[tuple[str, int, int, float, float], ...] = ()  # (component, sensitivity, g, scale, ±95%)
    selection: str | None = None
    cost: Cost = Cost.ZERO
    outputs: tuple[tuple[str, str], ...] = ()  # (name, type)
    auxiliary: tuple[tuple[str, str, str], ...] = ()  # the row pipeline's statements
    choices: tuple[str, ...] = ()  # releases by the exponential mechanism
    subqueries: str | None = None  # how subqueries over public tables were answered, if any

    def render(self) -> str:
        lines = [f"query: {self.text}", f"kind: {self.kind}"]
        if self.subqueries:
            lines.append(f"subqueries: {self.subqueries}")
        for i, (name, summary, sql) in enumerate(self.steps, 1):
            lines += ["", f"-- pass {i}: {name} — {summary}", sql]
        if self.final_sql:
            lines += ["", "-- final SQL sent to the backend", self.final_sql]
        elif self.auxiliary:
            lines += ["", "-- no per-person sums statement: every value comes from the row pipeline"]
        for name, summary, sql in self.auxiliary:
            lines += ["", f"-- row pipeline, {name}: {summary}", sql]
        if self.released:
            lines += ["", "released values (per group; sensitivity and noise in grid units):"]
            for name, sensitivity, groups, scale, error in self.released:
                lines.append(
                    f"  {name}: sensitivity {sensitivity} per group, ≤ {groups} group(s) per unit, "
                    f"noise scale {scale:.6g}, ±{error:.6g} at 95%"
                )
        if self.choices:
            lines += ["", "chosen by the exponential mechanism:", *(f"  {c}" for c in self.choices)]
        if self.selection:
            lines += ["", f"partition selection: {self.selection}"]
        lines += ["", f"cost: ε={_fmt(self.cost.epsilon)}, δ={_fmt(self.cost.delta)}"]
        if self.outputs:
            lines.append("result columns: " + ", ".join(f"{n} {t}" for n, t in self.outputs))
        return "\n".join(lines)


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
    # Per table, the columns the database enforces unique and not NULL; read from the backend at
    # start (a privacy unit among them means one row per person).
    unique_columns: dict[str, frozenset[str]] = field(default_factory=dict)
    _public_columns: dict[str, list[tuple[str, PgType]]] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    # Plans of recent statements: a repeated statement (dashboards) skips parsing and rewriting,
    # and keeps its salt, so its per-unit selection is the same each time.
    _plans: OrderedDict[tuple[object, ...], Plan] = field(default_factory=OrderedDict, init=False)

    def __post_init__(self) -> None:
        if not self.dialect:
            self.dialect = self.backend.dialect if self.backend is not None else "postgres"
        if self.backend is not None:
            self._check_schema()

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

    def analyze(self, sql: str, params: Sequence[object] = ()) -> AnalyzedQuery:
        return self._analyze_tree(bind_parameters(parse_statement(sql), params), answer=True)

    def _analyze_tree(self, tree: exp.Expression, *, answer: bool) -> AnalyzedQuery:
        """Analyze a parsed, parameter-bound statement. Its subqueries over public tables are run
        first and inlined (`answer`, with a backend), or replaced by placeholders of their type."""
        run = self._run_subquery if answer and self.backend is not None else None
        inlined = answer_subqueries(tree, self.policy, self._public_columns, run)
        query = analyze(inlined.tree, self.policy, self._public_columns, self.unique_columns)
        if inlined.subqueries and isinstance(query, PrivateQuery):
            return dataclasses.replace(
                query, inlined_subqueries=True, subquery_placeholders=inlined.placeholders
            )
        return query

    def _run_subquery(self, query: PublicQuery) -> list[tuple]:
        """Rows of a subquery over public tables, run on its own before the private query is planned."""
        backend = self._backend()
        try:
            return backend.run(query.sql.sql(backend.dialect))
        except QueryCancelled:
            raise QueryCanceled("canceling statement due to user request; nothing was charged") from None
        except BackendUnreachable:
            raise BackendUnavailable("cannot reach the backing database; nothing was charged") from None
        except BackendError:
            raise PublicSubqueryFailed(query.text) from None

    def describe(self, sql: str, parameter_types: Sequence[PgType | None] = ()) -> Description:
        """Parameter and result types of a statement, without data or budget.

        Parameters the client did not type are inferred from their context; the statement is then
        analyzed with placeholder values of those types, which gives the result columns.
        """
        tree = parse_statement(sql)
        types = infer_parameter_types(tree, self.policy, parameter_types)
        contexts = infer_parameter_types(tree, self.policy)
        placeholders = [
            placeholder_value(t, contexts[i] if i < len(contexts) else None) for i, t in enumerate(types)
        ]
        query = self._analyze_tree(bind_parameters(tree, placeholders), answer=False)
        outputs = query.outputs if isinstance(query, PublicQuery) else query.finish.outputs
        columns = tuple(ResultColumn(o.name, o.type) for o in outputs)
        return Description(types, columns, isinstance(query, PrivateQuery))

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

    def plan_private(self, query: PrivateQuery, epsilon: float, *, salt: str | None = None) -> Plan:
        state = rewrite(query, salt=salt, dialect=self.dialect)
        if query.randomized_response:
            responses = randomized_response_count_plan(
                epsilon,
                self.policy.defaults.delta,
                max_groups=query.max_groups,
                mechanism=self.policy.defaults.mechanism,
                accounting=self.policy.defaults.accounting,
            )
            return Plan(
                query, state, self.dialect, responses.noise, epsilon, self.policy.defaults.delta, responses
            )
        components = [(c.sensitivity(query.max_rows), query.max_groups) for c in query.components]
        selection = query.max_groups if query.needs_selection else None
        noise = plan_query_noise(
            self.policy.defaults.mechanism,
            epsilon,
            self.policy.defaults.delta,
            components,
            selection,
            accounting=self.policy.defaults.accounting,
            selectors=selectors(query).requests,
        )
        return Plan(query, state, self.dialect, noise, epsilon, self.policy.defaults.delta)

    def plan(
        self,
        sql: str,
        params: Sequence[object] = (),
        *,
        epsilon: float | None = None,
        salt: str | None = None,
    ) -> Plan:
        """The plan of a private query, without touching data or budget."""
        query = self.analyze(sql, params)
        if not isinstance(query, PrivateQuery):
            raise InvalidParameter("this query reads no protected table: it has no private plan")
        return self.plan_private(query, self.query_epsilon(epsilon), salt=salt)

    def explain(
        self, sql: str, params: Sequence[object] = (), *, epsilon: float | None = None
    ) -> Explanation:
        query = self.analyze(sql, params)
        if isinstance(query, ConstantQuery):
            return Explanation(
                query.text, "constant", outputs=tuple((o.name, o.type.value) for o in query.finish.outputs)
            )
        if isinstance(query, PublicQuery):
            return Explanation(
                query.text,
                "public (no noise, no cost)",
                final_sql=query.sql.sql(self.dialect),
                outputs=tuple((o.name, o.type.value) for o in query.outputs),
            )
        plan = self.plan_private(query, self.query_epsilon(epsilon))
        steps = tuple(
            (step.name, step.summary, emit(plan.rewrite.query(i), self.dialect, pretty=True))
            for i, step in enumerate(plan.rewrite.steps)
        )
        if plan.responses is not None:
            tally = plan.responses.tally_noise
            released: tuple[tuple[str, int, int, float, float], ...] = (
                (
                    "tallies of reported ones and of reported zeros (randomized response: each person "
                    "reports the WHERE condition truthfully with probability 3/4)",
                    1,
                    query.max_groups,
                    tally.scale,
                    tally.error95(),
                ),
            )
        else:
            released = tuple(
                (
                    c.kind.value + (f"({c.argument.sql('postgres')})" if c.argument is not None else ""),
                    sensitivity,
                    query.max_groups,
                    spec.scale,
                    spec.error95(),
                )
                for c, sensitivity, spec in zip(
                    query.components, plan.sensitivities, plan.noise.columns, strict=True
                )
            )
        selection = None
        if plan.noise.selection is not None:
            s = plan.noise.selection
            selection = (
                f"a group is released when its noisy count of units reaches {s.threshold} "
                f"(Laplace scale {s.scale:.6g}; ε={_fmt(s.epsilon)}, δ={_fmt(s.delta)})"
            )
        elif query.keys:
            selection = (
                "all keys are public: every combination of their declared values is released (zero-filled)"
            )
        chosen = selectors(query)
        choices = []
        for a, index in chosen.by_aggregate.items():
            spec = plan.noise.selectors[index]
            choices.append(
                f"{query.aggregates[a].text}: exponential mechanism over {spec.candidates} candidates per "
                f"group (score sensitivity {spec.sensitivity}, noise scale {spec.scale:.6g})"
            )
        if chosen.top_k is not None and query.top_k is not None:
            spec = plan.noise.selectors[chosen.top_k]
            choices.append(
                f"top {query.top_k[1]} groups by report-noisy-top-k on "
                f"{query.components[query.top_k[0]].kind.value} (score sensitivity {spec.sensitivity}, "
                f"noise scale {spec.scale:.6g})"
            )
        auxiliary = tuple(
            (step.name, step.summary, emit(step.select, self.dialect, pretty=True))
            for step in plan.rewrite.auxiliary
        )
        return Explanation(
            query.text,
            "private",
            steps,
            emit(plan.rewrite.query(), self.dialect, pretty=True) if steps else "",
            released,
            selection,
            plan.cost,
            tuple((o.name, o.type.value) for o in query.finish.outputs),
            auxiliary,
            tuple(choices),
            _subqueries_note(query),
        )

    # -- execution ---------------------------------------------------------------------------------

    def analyst(self, name: str) -> AnalystPolicy:
        analyst = self.policy.analyst(name)
        if analyst is None:
            raise UnknownAnalyst(
                f'analyst "{name}" is not in the policy', hint="ask the data owner to add you"
            )
        return analyst

    def budget(self, analyst: str) -> BudgetStatus:
        policy = self.analyst(analyst)
        spent = self.ledger.spent(analyst) if self.ledger is not None else Cost.ZERO
        return BudgetStatus(analyst, spent, Cost(policy.epsilon, policy.delta))

    def execute(
        self,
        sql: str,
        params: Sequence[object] = (),
        *,
        analyst: str,
        epsilon: float | None = None,
        cancel: Cancellation | None = None,
    ) -> Result:
        """Answer one statement for an analyst: noisy rows, what it cost, and the budget left.

        `cancel` lets another thread interrupt the backend query (57014); a private query that had
        started reading data stays charged.
        """
        who = self.analyst(analyst)
        chosen = self.query_epsilon(epsilon, who)
        key = self._plan_key(sql, params, chosen)
        plan = self._cached(key)
        if plan is None:
            query = self.analyze(sql, params)
            if isinstance(query, ConstantQuery):
                columns = tuple(ResultColumn(o.name, o.type) for o in query.finish.outputs)
                return Result(columns, finish_rows(query.finish, [], [], [()], [[]]))
            if isinstance(query, PublicQuery):
                return self._run_public(query, cancel)
            plan = self.plan_private(query, chosen)
            self._remember(key, plan)
        replay = self._replay_key(plan) if self.policy.defaults.replay and self.ledger is not None else None
        if replay is not None:
            stored = self.ledger.replay_get(who.name, replay)  # type: ignore[union-attr]
            if stored is not None:
                return self._replayed(stored, who)
        result = self.run(plan, analyst=who, cancel=cancel)
        if replay is not None:
            self.ledger.replay_put(who.name, replay, encode_result(result))  # type: ignore[union-attr]
        return result

    def _replay_key(self, plan: Plan) -> str:
        """The policy, the normalised statement (parameters bound), ε, δ and the operator's data epoch.

        Nothing else, and nothing read from the database: no table statistics, no file times, and no
        call to the backend at all. Whether a repeat is free (a stored answer) or charged (a fresh one)
        is a bit the analyst sees; keyed this way it says only whether this analyst asked this very
        question in this epoch before (and whether its answer was since evicted among their own oldest,
        or forgotten by an operator's reset), which they already know. A key that followed the data
        would say, for free and with certainty, whether a table was written in between (rolled-back
        writes included): in a rarely written table, when one person arrived. The price is that within
        an epoch a repeat gets the answer from before any write; `defaults.data_epoch` says when the
        operator wants new answers.
        """
        material = json.dumps(
            [
                self._policy_digest,
                plan.query.text,
                repr(plan.epsilon),
                repr(plan.delta),
                self.policy.defaults.data_epoch,
            ]
        )
        return hashlib.sha256(material.encode()).hexdigest()

    @functools.cached_property
    def _policy_digest(self) -> str:
        # Bounds, limits, mechanism and accounting change what an answer means: a new policy, new answers.
        return hashlib.sha256(repr((self.policy.defaults, self.policy.tables)).encode()).hexdigest()

    def _replayed(self, payload: bytes, analyst: AnalystPolicy) -> Result:
        columns, rows = decode_result(payload)
        spent = self.ledger.spent(analyst.name) if self.ledger is not None else Cost.ZERO
        status = BudgetStatus(analyst.name, spent, Cost(analyst.epsilon, analyst.delta))
        return Result(columns, rows, Cost.ZERO, status, private=True, replayed=True)

    PLAN_CACHE_SIZE = 512

    @staticmethod
    def _plan_key(sql: str, params: Sequence[object], epsilon: float) -> tuple[object, ...] | None:
        key: tuple[object, ...] = (sql, tuple(params), epsilon)
        try:
            hash(key)
        except TypeError:
            return None
        return key

    def _cached(self, key: tuple[object, ...] | None) -> Plan | None:
        if key is None:
            return None
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
            return plan

    def _remember(self, key: tuple[object, ...] | None, plan: Plan) -> None:
        if key is None or plan.query.inlined_subqueries:
            return
        with self._lock:
            self._plans[key] = plan
            while len(self._plans) > self.PLAN_CACHE_SIZE:
                self._plans.popitem(last=False)

    def _backend(self) -> Backend:
        if self.backend is None:
            raise BackendUnavailable("no backing database is configured", hint="pass --backend")
        return self.backend

    def _run_public(self, query: PublicQuery, cancel: Cancellation | None = None) -> Result:
        backend = self._backend()
        try:
            rows = backend.run(query.sql.sql(backend.dialect), cancel=cancel)
        except QueryCancelled:
            raise QueryCanceled("canceling statement due to user request") from None
        except BackendUnreachable:
            raise BackendUnavailable("cannot reach the backing database") from None
        except BackendError:
            raise PrivateQueryFailed() from None
        columns = tuple(ResultColumn(o.name, o.type) for o in query.outputs)
        return Result(columns, rows)

    def run(self, plan: Plan, *, analyst: AnalystPolicy, cancel: Cancellation | None = None) -> Result:
        """Reserve the plan's cost, run it, noise it, commit the cost.

        The charge stands as soon as any statement of the plan has been sent to the backend, whatever
        happens next: a cancel, a lost connection or a failure after that point can depend on the data
        the statements already read (a cancel timed between two statements would otherwise tell, for
        free, whether the first one failed). Only a failure before the first statement was sent
        (BackendUnreachable, or QueryCancelled with started=False, on the first) releases the cost.
        """
        if plan.query.subquery_placeholders:
            raise InvalidParameter("internal: a plan whose subqueries hold placeholders cannot be run")
        backend = self._backend()
        limit = Cost(analyst.epsilon, analyst.delta)
        reservation = None
        if self.ledger is not None:
            reservation = self.ledger.reserve(
                analyst.name,
                plan.cost,
                limit,
                statement=plan.query.text,
                accounting=self.policy.defaults.accounting,
            )
        row_sets: list[list[tuple]] = []
        try:
            for sql in plan.statements:
                row_sets.append(backend.run(sql, cancel=cancel))
        except (BackendUnreachable, QueryCancelled) as failure:
            # Unreachable and not-started cancels are raised before their statement is sent.
            sent = bool(row_sets) or (isinstance(failure, QueryCancelled) and failure.started)
            if reservation is not None:
                finish = self.ledger.commit if sent else self.ledger.release  # type: ignore[union-attr]
                finish(reservation)
            charged = "its privacy cost has been charged" if sent else "nothing was charged"
            if isinstance(failure, QueryCancelled):
                raise QueryCanceled(f"canceling statement due to user request; {charged}") from None
            raise BackendUnavailable(f"cannot reach the backing database; {charged}") from None
        except BaseException:
            if reservation is not None:
                self.ledger.commit(reservation)  # type: ignore[union-attr]
            raise PrivateQueryFailed() from None
        try:
            result = self.release(plan, row_sets)
        except BaseException:
            if reservation is not None:
                self.ledger.commit(reservation)  # type: ignore[union-attr]
            raise PrivateQueryFailed() from None
        status = None
        if reservation is not None:
            self.ledger.commit(reservation)  # type: ignore[union-attr]
            spent = reservation.spent if reservation.spent is not None else self.ledger.spent(analyst.name)  # type: ignore[union-attr]
            status = BudgetStatus(analyst.name, spent, limit)
        return Result(result.columns, result.rows, plan.cost, status, private=True)

    def release(self, plan: Plan, row_sets: Sequence[Sequence[Sequence[object]]]) -> Result:
        """The noisy answer of a plan from the rows its statements returned: groups chosen, fresh
        noise drawn, post-processed. Each call is a new release (tests repeat it to measure the
        privacy loss between neighbouring databases); it charges nothing: `run` charges."""
        query = plan.query
        groups = choose_groups(query, measure(query, *row_sets), plan.noise)
        released = release_aggregates(query, groups, plan.noise, plan.responses)
        finish = query.finish
        out_rows = finish_rows(
            finish,
            [k.type for k in query.keys],
            [a.result_type for a in query.aggregates],
            released.keys,
            released.aggregates,
        )
        columns = []
        for output in finish.outputs:
            error: float | str | None = None
            node = output.expression
            if node.name.startswith("__agg_") and node.key == "column":
                error = released.errors[int(node.name.removeprefix("__agg_"))]
            if isinstance(error, str):
                columns.append(ResultColumn(output.name, output.type, None, error))
            else:
                columns.append(ResultColumn(output.name, output.type, error))
        return Result(tuple(columns), out_rows)


def _subqueries_note(query: PrivateQuery) -> str | None:
    if query.subquery_placeholders:
        return (
            "run first over the public tables and inlined as constants; without a backend they are "
            "shown as placeholder values of their type"
        )
    if query.inlined_subqueries:
        return "run first over the public tables; their rows are inlined as the constants shown"
    return None


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
        }
    ).encode()


def decode_result(payload: bytes) -> tuple[tuple[ResultColumn, ...], list[tuple[object, ...]]]:
    data = json.loads(payload)
    columns = tuple(ResultColumn(name, PgType(t), error, note) for name, t, error, note in data["columns"])
    rows = [tuple(_decode_value(v) for v in row) for row in data["rows"]]
    return columns, rows


def connect(
    policy: str | Path | Policy, backend: str | Backend | None, ledger: str | Path | Ledger | None = None
) -> Engine:
    """dpproxy.connect(policy, backend, ledger): the Python API's one entry point (see Engine.open)."""
    return Engine.open(policy, backend, ledger)
