"""The pipeline of one statement (docs/architecture.md): the only module that knows all the parts.

    parse → bind → analyze (policy) → rewrite (SQL for the backend) → plan noise and cost
    → budget.reserve → backend.run → exact groups → choose groups → noise → post-process → budget.commit

Every entry point (CLI, wire server, Python API) calls `Engine.execute`, `Engine.plan` or
`Engine.explain`; none of them forks this pipeline. No error text from the backend ever leaves a
private query: it becomes PrivateQueryFailed's fixed message, and the cost stays charged (whether
the database failed can depend on the data). A query that never reached the data is not charged.

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
import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqlglot import exp

from dpproxy.audit import CURRENT, AuditLog, StatementRecord, Status, new_session_id
from dpproxy.backends import (
    Backend,
    BackendError,
    BackendUnreachable,
    Cancellation,
    LiveColumn,
    QueryCancelled,
    open_backend,
)
from dpproxy.budget import Ledger, Reservation, open_ledger
from dpproxy.errors import (
    BackendUnavailable,
    DPProxyError,
    InternalError,
    InvalidParameter,
    NotSupported,
    PolicyError,
    PrivateQueryFailed,
    PublicSubqueryFailed,
    QueryCanceled,
    UndefinedColumn,
    UnknownAnalyst,
    failure,
)
from dpproxy.explain import Explanation, explain_plan
from dpproxy.policy import AnalystPolicy, Policy, check_against_schema, load_policy
from dpproxy.privacy import (
    Cost,
    QueryNoise,
    RandomizedResponseCount,
    plan_query_noise,
    randomized_response_count_plan,
)
from dpproxy.release import (
    ExactGroups,
    choose_groups,
    exact_groups,
    post_process,
    release_aggregates,
    selectors,
)
from dpproxy.release.quantiles import refine_quantiles
from dpproxy.release.stream import StreamedRelease, StreamOrderError, streamable
from dpproxy.results import (
    BudgetStatus,
    Result,
    ResultColumn,
    ResultStream,
    decode_result,
    encode_result,
    format_number,
)
from dpproxy.sql.analyze import (
    analyze,
    answer_subqueries,
    bind_parameters,
    infer_parameter_types,
    parse_statement,
)
from dpproxy.sql.literals import placeholder_value
from dpproxy.sql.probes import EmptyQuery
from dpproxy.sql.public import backend_sql
from dpproxy.sql.query import AnalyzedQuery, ConstantQuery, PrivateQuery, PublicQuery
from dpproxy.sql.rewrite import RewriteState, rewrite
from dpproxy.sql.rewrite.state import Step, key_column
from dpproxy.sql.series import SeriesLimit, series_limit
from dpproxy.sql.shape import (
    Shape,
    Template,
    count_sentinels,
    emitted,
    parameter_key,
    parameter_numeral,
    public_parameter_classes,
    public_sentinels,
    public_template,
    sentinel,
    statement_shape,
    template,
    token_shape,
    token_slots,
    with_sentinels,
    with_values,
)
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

    def measure(self, *row_sets: Sequence[Sequence[object]]) -> ExactGroups:
        """True values per group from each statement's rows: the certificates' seam (see
        dpproxy.release.exact); nothing in production shows them."""
        return exact_groups(self.query, *row_sets)


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
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    # Plans of recent statements: a repeated statement (dashboards) skips parsing and rewriting,
    # and keeps its salt, so its per-unit selection is the same each time.
    _plans: OrderedDict[tuple[object, ...], Plan] = field(default_factory=OrderedDict, init=False)
    # Learned statement shapes (dpproxy.sql.shape), by (shape text, ε): a template plan and the
    # sentinels its constants' slots hold; and public queries with their backend SQL, by exact text.
    _shapes: OrderedDict[tuple[str, float], _LearnedShape] = field(default_factory=OrderedDict, init=False)
    # The same shapes by their tokens (dpproxy.sql.shape.token_shape): per (skeleton, ε), the learned
    # shapes with that skeleton.
    _token_shapes: OrderedDict[tuple[tuple[object, ...], float], list[_TokenEntry]] = field(
        default_factory=OrderedDict, init=False
    )
    _publics: OrderedDict[tuple[object, ...], tuple[PublicQuery, str]] = field(
        default_factory=OrderedDict, init=False
    )
    _sightings: OrderedDict[tuple[str, float], None] = field(default_factory=OrderedDict, init=False)
    # Public statements with parameters, by (text, parameters' classes): the analysed query and its
    # backend SQL as a template holding the parameters' constants (dpproxy.sql.shape).
    _public_templates: OrderedDict[tuple[str, tuple[object, ...]], tuple[PublicQuery, Template]] = field(
        default_factory=OrderedDict, init=False
    )
    _public_sightings: OrderedDict[tuple[str, tuple[object, ...]], None] = field(
        default_factory=OrderedDict, init=False
    )
    # Records of statements asked without a wire session (the CLI, the Python API): one session id
    # per engine, statements numbered from 1.
    _local_session: str = field(default_factory=new_session_id, init=False)
    _local_statements: itertools.count[int] = field(default_factory=lambda: itertools.count(1), init=False)
    # Where statements' records are written (dpproxy.audit): one per ledger, shared by the engines
    # `with_policy` makes; by default a new one when there is a ledger.
    audit_log: AuditLog | None = field(default=None, repr=False, compare=False)
    # The policy in force for this engine and those `with_policy` made from it (see `analyst`).
    _live: _LivePolicy = field(init=False)
    # unique_columns as read from the backend, before the policy's `unit_unique` is added.
    enforced_unique: dict[str, frozenset[str]] = field(default_factory=dict, init=False)

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

    def analyze(self, sql: str, params: Sequence[object] = ()) -> AnalyzedQuery | EmptyQuery:
        return self._analyze_tree(bind_parameters(parse_statement(sql), params), answer=True)

    def _analyze_tree(self, tree: exp.Expression, *, answer: bool) -> AnalyzedQuery | EmptyQuery:
        """Analyze a parsed, parameter-bound statement. Its subqueries over public tables are run
        first and inlined (`answer`, with a backend), or replaced by placeholders of their type."""
        parts = self._series_parts(tree, answer=answer)
        if parts is not None:
            # Described or explained (execute runs these itself): the main query, with placeholder
            # constants for the keys the top-k query would release.
            series, inner = parts
            tree = series.restricted([self._placeholder_keys(series, inner)], self._key_types(series, inner))
        run = self._run_subquery if answer and self.backend is not None else None
        inlined = answer_subqueries(tree, self.policy, self._public_columns, run, database=self.database)
        query = analyze(
            inlined.tree, self.policy, self._public_columns, self.unique_columns, database=self.database
        )
        if inlined.subqueries and isinstance(query, PrivateQuery):
            return dataclasses.replace(
                query, inlined_subqueries=True, subquery_placeholders=inlined.placeholders
            )
        return query

    # -- series limits (dpproxy.sql.series) ---------------------------------------------------------

    def _series_parts(self, tree: exp.Expression, *, answer: bool) -> tuple[SeriesLimit, PrivateQuery] | None:
        """A series-limited query whose top-k subquery is private, taken apart; None for any other
        statement (over public tables only, the join runs as written)."""
        series = series_limit(tree)
        if series is None:
            return None
        inner = self._analyze_tree(series.inner, answer=answer)
        if not isinstance(inner, PrivateQuery):
            return None
        self._key_positions(series, inner)  # every link names a column of the top-k query
        return series, inner

    @staticmethod
    def _key_positions(series: SeriesLimit, inner: PrivateQuery) -> list[int]:
        names = [o.name.lower() for o in inner.post_processing.outputs]
        for _, name in series.links:
            if name not in names:
                raise UndefinedColumn(f'column "{name}" is not an output of the series-limit subquery')
        return [names.index(name) for _, name in series.links]

    def _key_types(self, series: SeriesLimit, inner: PrivateQuery) -> list[PgType]:
        outputs = inner.post_processing.outputs
        return [outputs[i].type for i in self._key_positions(series, inner)]

    def _placeholder_keys(self, series: SeriesLimit, inner: PrivateQuery) -> tuple[object, ...]:
        return tuple(placeholder_value(t) for t in self._key_types(series, inner))

    def _execute_series(
        self, series: SeriesLimit, inner: PrivateQuery, text: str, who: AnalystPolicy, epsilon: float,
        cancel: Cancellation | None, record: StatementRecord | None = None,
    ) -> Result:  # fmt: skip
        """The top-k query, then the main query restricted to the keys it released; both charged.

        One reservation holds both costs before anything runs: the main query's cost is known before
        its keys are (it is planned first with placeholder keys; inlined constants change which rows
        it reads, not its components, contribution bounds or selection), so an analyst whose budget
        cannot pay for both is refused before either reads data, rather than charged for a top-k
        whose chart is then refused. The reservation is committed in full once the top-k query was
        sent, whatever happens next (docs/privacy.md §8); were the main query's real plan to cost
        more than its estimate, it is not run (PrivateQueryFailed, the top-k part charged).
        """
        inner_plan = self.plan_private(inner, epsilon)
        types = self._key_types(series, inner)
        estimate = self._analyze_tree(
            series.restricted([self._placeholder_keys(series, inner)], types), answer=False
        )
        if not isinstance(estimate, PrivateQuery):
            raise NotSupported(
                "a series limit over a main query on public tables only is not supported",
                hint="ask the main query and the top-k query separately",
            )
        main_cost = self.plan_private(estimate, epsilon).cost
        total = inner_plan.cost + main_cost
        reservation = self._reserve(who, total, text, record)
        ranked = self._run_reserved(inner_plan, reservation, cancel, sent_before=False, record=record)
        positions = self._key_positions(series, inner)
        keys = [tuple(row[i] for i in positions) for row in ranked.rows]
        try:
            main = self._analyze_tree(series.restricted(keys, types), answer=True)
            if isinstance(main, EmptyQuery):  # no key released: the join has no rows
                result = Result(tuple(ResultColumn(o.name, o.type) for o in main.outputs), [])
                return self._committed(result, total, reservation, who, record)
            assert isinstance(main, PrivateQuery)
            main_plan = self.plan_private(main, epsilon)
            actual = main_plan.cost
            if not (actual.fits_within(main_cost) and actual.rho <= main_cost.rho * (1 + 1e-9)):
                raise PrivateQueryFailed()
        except BaseException as error:
            if reservation is not None:
                _failed(record, error, sent=True)
                self.ledger.commit(reservation, record)  # type: ignore[union-attr]
            raise
        result = self._run_reserved(main_plan, reservation, cancel, sent_before=True, record=record)
        if not main.needs_selection:
            # Public keys are released zero-filled, all of them; the join keeps only the top k.
            result = self._series_rows(series, keys, result)
        return self._committed(result, total, reservation, who, record)

    @staticmethod
    def _series_rows(series: SeriesLimit, keys: Sequence[tuple[object, ...]], result: Result) -> Result:
        """The released rows whose series columns hold one of the released keys (post-processing
        of released values), when the main query selects each link expression as a column."""
        selected = [
            (item.this if isinstance(item, exp.Alias) else item).sql("postgres")
            for item in series.main.expressions
        ]
        links = [expression.sql("postgres") for expression, _ in series.links]
        if not all(link in selected for link in links):
            return result
        positions = [selected.index(link) for link in links]
        wanted = set(keys)
        rows = [row for row in result.rows if tuple(row[i] for i in positions) in wanted]
        return dataclasses.replace(result, rows=rows)

    def _run_subquery(self, query: PublicQuery) -> list[tuple]:
        """Rows of a subquery over public tables, run on its own before the private query is planned."""
        backend = self._backend()
        try:
            return backend.run(backend_sql(query.sql, backend.dialect))
        except QueryCancelled as failure:
            raise QueryCanceled(
                f"canceling statement due to {failure.reason}; nothing was charged", hint=failure.hint
            ) from None
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
        outputs = (
            query.outputs if isinstance(query, (PublicQuery, EmptyQuery)) else query.post_processing.outputs
        )
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
        if isinstance(query, EmptyQuery):
            raise InvalidParameter(f"this query has no rows ({query.reason}): it has no private plan")
        if not isinstance(query, PrivateQuery):
            raise InvalidParameter("this query reads no protected table: it has no private plan")
        return self.plan_private(query, self.query_epsilon(epsilon), salt=salt)

    def explain(
        self, sql: str, params: Sequence[object] = (), *, epsilon: float | None = None
    ) -> Explanation:
        tree = bind_parameters(parse_statement(sql), params)
        parts = self._series_parts(tree, answer=False)
        query = self._analyze_tree(tree, answer=True)
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
        explanation = explain_plan(self.plan_private(query, chosen), self.dialect)
        if parts is None:
            return explanation
        top_k = self.plan_private(parts[1], chosen)
        note = (
            f"series limit: the top-k query ({parts[1].text}) is asked first as a private query "
            f"(ε={format_number(top_k.cost.epsilon)}); the keys it releases replace the join, inlined as "
            "constants (placeholders shown); the cost is both queries'"
        )
        return dataclasses.replace(
            explanation, text=tree.sql("postgres"), cost=explanation.cost + top_k.cost, subqueries=note
        )

    # -- execution ---------------------------------------------------------------------------------

    def analyst(self, name: str) -> AnalystPolicy:
        """The analyst's policy, with the limits in force now: after a policy reload, a session
        still on an earlier policy gets the lower of its policy's limits and the current one's, and
        an analyst the current policy no longer lists is refused (spending stops at once)."""
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
        caps = [c for c in (analyst.max_epsilon_per_query, now.max_epsilon_per_query) if c is not None]
        return dataclasses.replace(
            analyst,
            epsilon=min(analyst.epsilon, now.epsilon),
            delta=min(analyst.delta, now.delta),
            max_epsilon_per_query=min(caps) if caps else None,
        )

    def make_current(self) -> None:
        """This engine's policy is now the one in force for every engine of its lineage (the ones
        `with_policy` made): sessions still on an earlier one are held to its limits too."""
        self._live.policy = self.policy

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
        stream: bool = False,
        record: StatementRecord | None = None,
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
            result = self._execute(sql, params, analyst, epsilon, cancel, stream, given)
        except DPProxyError as error:
            given.error(error.sqlstate)
            raise
        except BaseException:
            given.error(InternalError.sqlstate)
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
    ) -> Result | ResultStream:
        who = self.analyst(analyst)
        chosen = self.query_epsilon(epsilon, who)
        key = self._plan_key(sql, params, chosen)
        public = self._public_cached(key)
        if public is not None:  # the public fast path: no parsing, no analysis, no DP work
            _kind(record, "public")
            return self._run_public(*public, cancel, record=record)
        classes = public_parameter_classes(params) if params else None
        if classes is not None:  # a public statement seen with other parameters: its constants re-bound
            learned = self._public_template(sql, classes)
            if learned is not None:
                _kind(record, "public")
                values = tuple(emitted(p, self.dialect) for p in params)
                return self._run_public(learned[0], learned[1].bind(values), cancel, record=record)
        plan = self._cached(key)
        if plan is None:  # a learned shape, found from the tokens without parsing
            plan = self._token_hit(sql, chosen, params)
            if plan is not None:
                self._remember(key, plan)
        if plan is None:
            tree = bind_parameters(parse_statement(sql), params)
            shape = statement_shape(tree)
            plan = self._shape_hit(shape, chosen) if shape is not None else None
            if plan is not None:
                self._remember(key, plan)
        if plan is None:
            parts = self._series_parts(tree, answer=True)
            if parts is not None:  # never cached nor replayed: its second statement follows a release
                _kind(record, "private")
                return self._execute_series(*parts, tree.sql("postgres"), who, chosen, cancel, record)
            query = self._analyze_tree(tree, answer=True)
            if isinstance(query, ConstantQuery):
                _kind(record, "constant")
                columns = tuple(ResultColumn(o.name, o.type) for o in query.post_processing.outputs)
                return Result(columns, post_process(query.post_processing, [], [], [()], [[]]))
            if isinstance(query, EmptyQuery):  # a probe: its columns, no rows, no backend call, no cost
                _kind(record, "empty")
                return Result(tuple(ResultColumn(o.name, o.type) for o in query.outputs), [])
            if isinstance(query, PublicQuery):
                _kind(record, "public")
                public = (query, backend_sql(query.sql, self.dialect))
                if not _has_subquery(tree):  # an inlined subquery's answer is data of its moment
                    self._remember_public(key, public)
                    if classes is not None:
                        self._learn_public(sql, params, classes, public)
                return self._run_public(*public, cancel, record=record)
            salt = secrets.token_hex(8)  # as rewrite draws it; kept to confirm the statement's shape
            plan = self.plan_private(query, chosen, salt=salt)
            if shape is not None and not query.inlined_subqueries:
                self._learn_shape(shape, tree, plan, salt, sql=sql, params=params)
            self._remember(key, plan)
        _kind(record, "private")
        replay = self._replay_key(plan) if self.policy.defaults.replay and self.ledger is not None else None
        if replay is not None:
            stored = self.ledger.replay_get(who.name, replay)  # type: ignore[union-attr]
            if stored is not None:
                replayed = self._replayed(stored, who)
                record.replayed = True
                record.cost = Cost.ZERO
                record.rows = len(replayed.rows)
                return replayed
        if stream and streamable(plan.query, len(plan.statements)):
            return self._stream(plan, who, cancel, replay, record)
        result = self.run(plan, analyst=who, cancel=cancel, record=record)
        if replay is not None and len(result.rows) <= self.REPLAY_MAX_ROWS:
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

    def _public_cached(self, key: tuple[object, ...] | None) -> tuple[PublicQuery, str] | None:
        if key is None:
            return None
        with self._lock:
            return self._publics.get(key)

    def _remember_public(self, key: tuple[object, ...] | None, public: tuple[PublicQuery, str]) -> None:
        """A public query by its exact text and parameters (ε does not matter to it, but is in the
        key): it reads public tables only, so its SQL depends on the text and the policy alone."""
        if key is None:
            return
        with self._lock:
            self._publics[key] = public
            while len(self._publics) > self.PLAN_CACHE_SIZE:
                self._publics.popitem(last=False)

    def _public_template(self, sql: str, classes: tuple[object, ...]) -> tuple[PublicQuery, Template] | None:
        with self._lock:
            if not self._public_templates:
                return None
            learned = self._public_templates.get((sql, classes))
            if learned is not None:
                self._public_templates.move_to_end((sql, classes))
            return learned

    def _learn_public(
        self, sql: str, params: Sequence[object], classes: tuple[object, ...], cold: tuple[PublicQuery, str]
    ) -> None:
        """Learn a public statement's template (dpproxy.sql.shape) the second time it is seen with
        parameters of these classes: analysed with sentinel values, its backend SQL must hold each
        sentinel's constant, and binding this execution's constants into it must give exactly the
        cold analysis's SQL and output columns; otherwise nothing is cached."""
        key = (sql, classes)
        with self._lock:
            if key not in self._public_sightings:
                self._public_sightings[key] = None
                while len(self._public_sightings) > self.PLAN_CACHE_SIZE:
                    self._public_sightings.popitem(last=False)
                return
        sentinels = public_sentinels(classes, secrets.token_hex(6))
        try:
            query = self._analyze_tree(bind_parameters(parse_statement(sql), sentinels), answer=False)
        except DPProxyError:
            return
        if not isinstance(query, PublicQuery) or _columns_of(query) != _columns_of(cold[0]):
            return
        learned = public_template(
            backend_sql(query.sql, self.dialect), tuple(emitted(s, self.dialect) for s in sentinels)
        )
        if learned is None or learned.bind(tuple(emitted(p, self.dialect) for p in params)) != cold[1]:
            return
        with self._lock:
            self._public_templates[key] = (query, learned)
            while len(self._public_templates) > self.PLAN_CACHE_SIZE:
                self._public_templates.popitem(last=False)

    def _shape_hit(self, shape: Shape, epsilon: float) -> Plan | None:
        """The plan of a statement whose shape was learned: the learned plan with this statement's
        constants in its text, its row filter and its SQL (dpproxy.sql.shape)."""
        with self._lock:
            learned = self._shapes.get((shape.text, epsilon))
            if learned is None:
                return None
            self._shapes.move_to_end((shape.text, epsilon))
        return learned.bind(shape.values)

    def _token_hit(self, sql: str, epsilon: float, params: Sequence[object] = ()) -> Plan | None:
        """`_shape_hit` without parsing: the statement's tokens equal a learned statement's but for
        the numerals of its slots (every other numeral equal too), and so do its parameters' constants
        but for those of parameters that are slots, so its bound tree is the learned one's with
        these numerals in the slots, and so is its shape (dpproxy.sql.shape)."""
        with self._lock:
            if not self._token_shapes:
                return None
        tokens = token_shape(sql)
        if tokens is None:
            return None
        with self._lock:
            entries = self._token_shapes.get((tokens.skeleton, epsilon))
            if entries is None:
                return None
            self._token_shapes.move_to_end((tokens.skeleton, epsilon))
            entries = list(entries)
        for entry in entries:
            if len(params) != len(entry.parameters) or not all(
                f is None or f == n for f, n in zip(entry.fixed, tokens.numerals, strict=True)
            ):
                continue
            numerals = [
                parameter_numeral(p) if f is None else None
                for f, p in zip(entry.parameters, params, strict=True)
            ]
            if any(
                (n is None) if f is None else (f != parameter_key(p))
                for f, n, p in zip(entry.parameters, numerals, params, strict=True)
            ):
                continue
            values = tuple(tokens.numerals[i] if i >= 0 else numerals[-i - 1] for i in entry.slots)
            return entry.learned.bind(values)  # type: ignore[arg-type]
        return None

    def _learn_shape(
        self,
        shape: Shape,
        tree: exp.Expression,
        plan: Plan,
        salt: str,
        *,
        sql: str | None = None,
        params: Sequence[object] = (),
    ) -> None:
        """Confirm and remember a statement's shape (dpproxy.sql.shape): analysed again with sentinel
        numbers in its slots and planned with the same salt, the statement must give the same plan
        with the sentinels where its constants were — in its text, row filter and SQL only, each
        sentinel as often as its constant's slot — or the shape is not cached. The plan for the
        sentinels becomes the template; any later statement of the shape gets the template with its
        own constants. Never called for a plan whose subqueries were answered. `sql` and `params`: the
        statement as sent: the shape is then also found by its tokens (`_token_hit`)."""
        # A shape is confirmed the second time it is seen: a first sighting costs nothing more.
        with self._lock:
            if (shape.text, plan.epsilon) not in self._sightings:
                self._sightings[(shape.text, plan.epsilon)] = None
                while len(self._sightings) > self.PLAN_CACHE_SIZE:
                    self._sightings.popitem(last=False)
                return
        sentinels = tuple(sentinel(i) for i in range(len(shape.slots)))
        try:
            query = self._analyze_tree(with_sentinels(tree, shape), answer=False)
        except DPProxyError:
            return
        if not isinstance(query, PrivateQuery) or query.inlined_subqueries:
            return
        sentinel_plan = self.plan_private(query, plan.epsilon, salt=salt)
        outside = repr(dataclasses.replace(query, text="", where=None)) + repr(sentinel_plan.noise)
        if count_sentinels(outside, sentinels) or repr(sentinel_plan.responses) != repr(plan.responses):
            return
        learned = _LearnedShape.of(sentinel_plan, sentinels)
        bound = learned.bind(shape.values)
        if (
            bound.statements != plan.statements
            or bound.query.text != plan.query.text
            or repr(bound.query) != repr(plan.query)
            or repr(bound.noise) != repr(plan.noise)
        ):
            return
        tokens = token_shape(sql) if sql is not None else None
        found = token_slots(tokens, shape, tree, params) if tokens is not None else None
        with self._lock:
            self._shapes[(shape.text, plan.epsilon)] = learned
            while len(self._shapes) > self.PLAN_CACHE_SIZE:
                self._shapes.popitem(last=False)
            if tokens is not None and found is not None:
                slots, slotted = found
                fixed = tuple(None if i in slots else n for i, n in enumerate(tokens.numerals))
                parameters = tuple(
                    None if k + 1 in slotted else parameter_key(p) for k, p in enumerate(params)
                )
                entries = self._token_shapes.setdefault((tokens.skeleton, plan.epsilon), [])
                # A few sets of fixed constants per skeleton, the newest last.
                kept = [e for e in entries if (e.fixed, e.parameters) != (fixed, parameters)][-7:]
                entries[:] = [*kept, _TokenEntry(fixed, parameters, slots, learned)]
                while len(self._token_shapes) > self.PLAN_CACHE_SIZE:
                    self._token_shapes.popitem(last=False)

    def _run_public(
        self,
        query: PublicQuery,
        sql: str | None = None,
        cancel: Cancellation | None = None,
        *,
        record: StatementRecord | None = None,
    ) -> Result:
        backend = self._backend()
        started = time.perf_counter()
        if record is not None:
            record.reached = True
        try:
            rows = backend.run(
                sql if sql is not None else backend_sql(query.sql, backend.dialect), cancel=cancel
            )
        except QueryCancelled as failure:
            if record is not None:
                record.reached = failure.started
            raise QueryCanceled(f"canceling statement due to {failure.reason}", hint=failure.hint) from None
        except BackendUnreachable:
            if record is not None:
                record.reached = False
            raise BackendUnavailable("cannot reach the backing database") from None
        except BackendError:
            raise PrivateQueryFailed() from None
        finally:
            if record is not None:
                record.add_stage("backend", time.perf_counter() - started)
        return Result(tuple(ResultColumn(name, pg_type) for name, pg_type in _columns_of(query)), rows)

    def run(
        self,
        plan: Plan,
        *,
        analyst: AnalystPolicy,
        cancel: Cancellation | None = None,
        record: StatementRecord | None = None,
    ) -> Result:
        """Reserve the plan's cost, run it, noise it, commit the cost.

        The charge stands as soon as any statement of the plan has been sent to the backend, whatever
        happens next: a cancel, a lost connection or a failure after that point can depend on the data
        the statements already read (a cancel timed between two statements would otherwise tell, for
        free, whether the first one failed). Only a failure before the first statement was sent
        (BackendUnreachable, or QueryCancelled with started=False, on the first) releases the cost.
        """
        if plan.query.subquery_placeholders:
            raise InvalidParameter("internal: a plan whose subqueries hold placeholders cannot be run")
        reservation = self._reserve(analyst, plan.cost, plan.query.text, record)
        result = self._run_reserved(plan, reservation, cancel, sent_before=False, record=record)
        return self._committed(result, plan.cost, reservation, analyst, record)

    def _reserve(
        self, analyst: AnalystPolicy, cost: Cost, statement: str, record: StatementRecord | None = None
    ) -> Reservation | None:
        if self.ledger is None:
            return None
        return self.ledger.reserve(
            analyst.name,
            cost,
            Cost(analyst.epsilon, analyst.delta),
            statement=statement,
            accounting=self.policy.defaults.accounting,
            record=record,
        )

    def _run_reserved(
        self,
        plan: Plan,
        reservation: Reservation | None,
        cancel: Cancellation | None,
        *,
        sent_before: bool,
        record: StatementRecord | None = None,
    ) -> Result:
        """Run a plan's statements and release its answer under a reservation made for it (and maybe
        more). On failure the reservation is finished — committed once anything was sent, by this
        plan or (`sent_before`) an earlier one under the same reservation — and the error raised; on
        success it is left for `_committed`."""
        if plan.query.subquery_placeholders:
            error = InvalidParameter("internal: a plan whose subqueries hold placeholders cannot be run")
            if reservation is not None:
                _failed(record, error, sent=sent_before)
                finish = self.ledger.commit if sent_before else self.ledger.release  # type: ignore[union-attr]
                finish(reservation, record)
            raise error
        backend = self._backend()
        row_sets: list[list[tuple]] = []
        started = time.perf_counter()
        if record is not None:
            record.reached = True
        try:
            for sql in plan.statements:
                row_sets.append(backend.run(sql, cancel=cancel))
        except (BackendUnreachable, QueryCancelled) as failure:
            # Unreachable and not-started cancels are raised before their statement is sent.
            sent = sent_before or bool(row_sets) or (isinstance(failure, QueryCancelled) and failure.started)
            stopped = _stopped(failure, sent=sent)
            if record is not None:
                record.add_stage("backend", time.perf_counter() - started)
                _failed(record, stopped, sent=sent)
            if reservation is not None:
                finish = self.ledger.commit if sent else self.ledger.release  # type: ignore[union-attr]
                finish(reservation, record)
            raise stopped from None
        except BaseException:
            if record is not None:
                record.add_stage("backend", time.perf_counter() - started)
                _failed(record, PrivateQueryFailed(), sent=True)
            if reservation is not None:
                self.ledger.commit(reservation, record)  # type: ignore[union-attr]
            raise PrivateQueryFailed() from None
        released = time.perf_counter()
        if record is not None:
            record.add_stage("backend", released - started)
        try:
            return self.release(plan, row_sets, lambda sql: backend.run(sql, cancel=cancel))
        except BaseException:
            if record is not None:
                _failed(record, PrivateQueryFailed(), sent=True)
            if reservation is not None:
                self.ledger.commit(reservation, record)  # type: ignore[union-attr]
            raise PrivateQueryFailed() from None
        finally:
            if record is not None:
                record.add_stage("noise", time.perf_counter() - released)

    def _committed(
        self,
        result: Result,
        cost: Cost,
        reservation: Reservation | None,
        analyst: AnalystPolicy,
        record: StatementRecord | None = None,
    ) -> Result:
        status = None
        if record is not None:
            record.status = Status.OK
            record.sqlstate = None
            record.reached = True
            if result.rows or record.rows == 0:
                record.rows = len(result.rows)
        if reservation is not None:
            self.ledger.commit(reservation, record)  # type: ignore[union-attr]
            spent = reservation.spent if reservation.spent is not None else self.ledger.spent(analyst.name)  # type: ignore[union-attr]
            status = BudgetStatus(analyst.name, spent, Cost(analyst.epsilon, analyst.delta))
        return Result(result.columns, result.rows, cost, status, private=True)

    def release(
        self,
        plan: Plan,
        row_sets: Sequence[Sequence[Sequence[object]]],
        run: Callable[[str], Sequence[Sequence[object]]] | None = None,
    ) -> Result:
        """The noisy answer of a plan from the rows its statements returned: groups chosen, fresh
        noise drawn, post-processed. Each call is a new release (tests repeat it to measure the
        privacy loss between neighbouring databases); it charges nothing: `run` charges. Refined
        quantiles run their second statement, built from their first picks, through `run`."""
        query = plan.query
        groups = choose_groups(query, exact_groups(query, *row_sets), plan.noise)
        refined = refine_quantiles(query, plan.rewrite, plan.dialect, groups, plan.noise, run)
        released = release_aggregates(query, groups, plan.noise, plan.responses, refined)
        post = query.post_processing
        out_rows = post_process(
            post,
            [k.type for k in query.keys],
            [a.result_type for a in query.aggregates],
            released.keys,
            released.columns,
            by_column=True,
        )
        return Result(self._columns(plan, released.errors), out_rows)

    @staticmethod
    def _columns(plan: Plan, errors: Sequence[float | str | None]) -> tuple[ResultColumn, ...]:
        """The answer's columns, each output that is an aggregate with its 95% figure."""
        columns = []
        for output in plan.query.post_processing.outputs:
            error: float | str | None = None
            node = output.expression
            while isinstance(node, (exp.Cast, exp.Paren)):  # COUNT(*)::int4 keeps its ±
                node = node.this
            if node.name.startswith("__agg_") and node.key == "column":
                error = errors[int(node.name.removeprefix("__agg_"))]
            if isinstance(error, str):
                columns.append(ResultColumn(output.name, output.type, None, error))
            else:
                columns.append(ResultColumn(output.name, output.type, error))
        return tuple(columns)

    # -- streamed answers (dpproxy.release.stream) --------------------------------------------------

    # Answers with more rows than this are not stored for free replay: a repeat is charged again
    # (the stored bytes would grow with the answer). Decided by the released answer's size alone.
    REPLAY_MAX_ROWS = 100_000

    def _stream(
        self,
        plan: Plan,
        analyst: AnalystPolicy,
        cancel: Cancellation | None,
        replay: str | None,
        record: StatementRecord | None = None,
    ) -> ResultStream:
        """Reserve the plan's cost now (a refusal is raised here, before any row), and return its
        answer as batches released while the backend's rows arrive, in canonical key order.

        The backend sorts the main statement's rows by the group keys' canonical order (`_ordered_sql`)
        and each batch is released as `release` releases a whole answer (dpproxy.release.stream):
        the rows sent are those, in the order, `release` would send. The charge follows `run`'s rule:
        it stands once the statement was sent, whatever happens next (a client that goes away
        mid-answer, a cancel, a failure); a stream closed before it started releases it.
        """
        if plan.query.subquery_placeholders:
            raise InvalidParameter("internal: a plan whose subqueries hold placeholders cannot be run")
        reservation = self._reserve(analyst, plan.cost, plan.query.text, record)
        backend = self._backend()
        finished = False
        result: ResultStream

        def finish(sent: bool, error: BaseException | None = None) -> None:
            nonlocal finished
            if record is not None:
                record.reached = sent
                if error is not None:
                    _failed(record, error, sent=sent)
                record.rows = result.rows
            if reservation is not None and not finished:
                finished = True
                (self.ledger.commit if sent else self.ledger.release)(reservation, record)  # type: ignore[union-attr]

        def timed(stage: str, since: float) -> float:
            now = time.perf_counter()
            if record is not None:
                record.add_stage(stage, now - since)
            return now

        def batches() -> Iterator[list[tuple[object, ...]]]:
            nonlocal finished
            release = StreamedRelease(plan.query, plan.noise)
            stored: list[tuple[object, ...]] | None = [] if replay is not None else None
            source = backend.stream(self._ordered_sql(plan, backend.dialect), cancel=cancel)
            sent = False
            try:
                clock = time.perf_counter()
                for rows in source:
                    sent = True
                    clock = timed("backend", clock)
                    out = release.release(rows)
                    clock = timed("noise", clock)
                    if stored is not None:
                        stored.extend(out)
                        if len(stored) > self.REPLAY_MAX_ROWS:
                            stored = None
                    if out:
                        yield out
                        clock = time.perf_counter()
                    if release.done:  # LIMIT met: the rest of the answer is never read
                        break
            except GeneratorExit:
                finish(sent=True)  # asked for at least once: the statement was sent
                raise
            except (BackendUnreachable, QueryCancelled) as failure:
                sent = sent or (isinstance(failure, QueryCancelled) and failure.started)
                stopped = _stopped(failure, sent=sent)
                finish(sent, stopped)
                raise stopped from None
            except StreamOrderError:
                finish(sent=True, error=PrivateQueryFailed())
                log.error("a streamed answer was refused: the backend did not return groups in key order")
                raise PrivateQueryFailed() from None
            except BaseException:
                finish(sent=True, error=PrivateQueryFailed())
                raise PrivateQueryFailed() from None
            finally:
                source.close()
            columns = self._columns(plan, release.errors())
            if reservation is not None:
                finished = True
            if record is not None:
                record.rows = result.rows
            summary = self._committed(Result(columns, []), plan.cost, reservation, analyst, record)
            if stored is not None and replay is not None:
                self.ledger.replay_put(analyst.name, replay, encode_result(Result(columns, stored)))  # type: ignore[union-attr]
            result.summary = summary

        unknown: list[float | str | None] = [None] * len(plan.query.aggregates)
        result = ResultStream(self._columns(plan, unknown), batches(), lambda: finish(sent=False))
        return result

    @staticmethod
    def _ordered_sql(plan: Plan, dialect: str) -> str:
        """The main statement with its rows sorted in the canonical order of their group keys
        (docs/privacy.md §6): each key ascending, NULLs last, text by bytes (COLLATE "C"; Spark's
        strings compare by bytes), numbers by value, which release.stream checks row by row."""
        quote = "`" if dialect == "spark" else '"'
        text_collation = "" if dialect == "spark" else ' COLLATE "C"'
        order = []
        for j, key in enumerate(plan.query.keys):
            collation = text_collation if key.type in (PgType.TEXT, PgType.VARCHAR) else ""
            order.append(f"{quote}{key_column(j)}{quote}{collation} ASC NULLS LAST")
        return f"SELECT * FROM ({plan.sql}) AS {quote}__streamed{quote} ORDER BY {', '.join(order)}"


@dataclass(frozen=True)
class _LearnedShape:
    """A learned shape's template plan (its slots hold sentinels) and where the sentinels stand in
    its text and statements, found once."""

    plan: Plan
    sentinels: tuple[str, ...]
    text: Template
    statements: tuple[Template, ...]
    # The rewrite's steps and auxiliary statements that hold a sentinel (the row filter's): a bound
    # plan whose release reads its rewrite (refined quantiles build a second statement from it) has
    # them with its values; any other bound plan has an empty rewrite (its statements are bound,
    # and nothing else reads it: explain plans afresh), so that no reader can see a sentinel.
    bound_steps: tuple[int, ...]
    bound_auxiliary: tuple[int, ...]
    bound_final: bool

    @classmethod
    def of(cls, plan: Plan, sentinels: tuple[str, ...]) -> _LearnedShape:
        texts = tuple(template(sql, sentinels) for sql in plan.statements)

        def holds(select: exp.Expression) -> bool:
            return any(isinstance(n, exp.Literal) and n.this in sentinels for n in select.walk())

        def holding(steps: tuple[Step, ...]) -> tuple[int, ...]:
            return tuple(i for i, step in enumerate(steps) if holds(step.select))

        state = plan.rewrite
        return cls(
            plan,
            sentinels,
            template(plan.query.text, sentinels),
            texts,
            holding(state.steps),
            holding(state.auxiliary),
            state.final is not None and holds(state.final),
        )

    def bind(self, values: tuple[str, ...]) -> Plan:
        """The template plan with these numerals in its slots: text, row filter, rewrite and
        statements."""
        query = self.plan.query
        replacements = dict(zip(self.sentinels, values, strict=True))
        where = query.where
        if where is not None:
            where = with_values(where, replacements)
        state = self.plan.rewrite

        def bound_steps(steps: tuple[Step, ...], indices: tuple[int, ...]) -> tuple[Step, ...]:
            if not indices:
                return steps
            out = list(steps)
            for i in indices:
                out[i] = dataclasses.replace(steps[i], select=with_values(steps[i].select, replacements))
            return tuple(out)

        rewrite = RewriteState()
        if any(histogram.fine for histogram in query.histograms):
            final = state.final
            if final is not None and self.bound_final:
                final = with_values(final, replacements)
            rewrite = dataclasses.replace(
                state,
                steps=bound_steps(state.steps, self.bound_steps),
                final=final,
                auxiliary=bound_steps(state.auxiliary, self.bound_auxiliary),
            )
        bound = dataclasses.replace(
            self.plan,
            query=dataclasses.replace(query, text=self.text.bind(values), where=where),
            rewrite=rewrite,
        )
        bound.__dict__["statements"] = tuple(t.bind(values) for t in self.statements)
        return bound


@dataclass(frozen=True)
class _TokenEntry:
    fixed: tuple[str | None, ...]  # the statement's abstracted numerals; None in its slots
    parameters: tuple[object | None, ...]  # each parameter's constant; None for a slot's
    slots: tuple[int, ...]  # what fills each slot: an abstracted numeral (i ≥ 0) or $k (−k)
    learned: _LearnedShape


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


def _failed(record: StatementRecord | None, error: BaseException, *, sent: bool) -> None:
    """A charged statement ends with `error`: its record says so before the charge is finished."""
    if record is None:
        return
    record.reached = sent
    record.error(error.sqlstate if isinstance(error, DPProxyError) else InternalError.sqlstate)


def _stopped(failure: BackendUnreachable | QueryCancelled, *, sent: bool) -> DPProxyError:
    """The analyst's error for a private query the backend did not finish, saying whether it was charged."""
    charged = "its privacy cost has been charged" if sent else "nothing was charged"
    if isinstance(failure, QueryCancelled):
        return QueryCanceled(f"canceling statement due to {failure.reason}; {charged}", hint=failure.hint)
    return BackendUnavailable(f"cannot reach the backing database; {charged}")


def connect(
    policy: str | Path | Policy, backend: str | Backend | None, ledger: str | Path | Ledger | None = None
) -> Engine:
    """dpproxy.connect(policy, backend, ledger): the Python API's one entry point (see Engine.open)."""
    return Engine.open(policy, backend, ledger)
