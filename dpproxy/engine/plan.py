"""A private query's plan: the SQL it sends, the noise it adds and what it costs, made from an analysed
query and the policy without touching data or budget.

Everything a plan sends to the backend is emitted here, once per plan: its statements
(`Plan.statements`) and, for refined quantiles, the second statement with one place for the coarse
bins the first picks choose (`Plan.refinements`). The release step only writes those integers into
it. `explain` renders a plan; the engine runs one; neither is imported here.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from sqlglot import exp

from dpproxy.policy import Policy
from dpproxy.privacy import (
    Cost,
    QueryNoise,
    RandomizedResponseCount,
    plan_query_noise,
    randomized_response_count_plan,
)
from dpproxy.release import ExactGroups, exact_groups, selectors
from dpproxy.results import ResultColumn
from dpproxy.sql.query import PrivateQuery
from dpproxy.sql.rewrite import RewriteState, rewrite
from dpproxy.sql.rewrite.row_pipeline import RefinementStatement, refinement_statement


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

    @functools.cached_property
    def refinements(self) -> dict[int, RefinementStatement]:
        """The second statement of each refined histogram, by histogram (dpproxy.release.quantiles)."""
        steps = {step.name: step.select for step in self.rewrite.auxiliary}
        return {
            h: refinement_statement(steps[f"histogram_{h}"], h, self.dialect)
            for h, histogram in enumerate(self.query.histograms)
            if histogram.fine and f"histogram_{h}" in steps
        }

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


def plan_private(
    query: PrivateQuery, policy: Policy, epsilon: float, dialect: str, *, salt: str | None = None
) -> Plan:
    """The plan of an analysed private query at the query's ε (chosen within the policy's limits by
    the caller): the rewrite for `dialect` (per-person choices salted with `salt`, random when None)
    and the noise of every released value, with the policy's mechanism, δ and accounting."""
    state = rewrite(query, salt=salt, dialect=dialect)
    defaults = policy.defaults
    if query.randomized_response:
        responses = randomized_response_count_plan(
            epsilon,
            defaults.delta,
            max_groups=query.max_groups,
            mechanism=defaults.mechanism,
            accounting=defaults.accounting,
        )
        return Plan(query, state, dialect, responses.noise, epsilon, defaults.delta, responses)
    components = [(c.sensitivity(query.max_rows), query.max_groups) for c in query.components]
    selection = query.max_groups if query.needs_selection else None
    noise = plan_query_noise(
        defaults.mechanism,
        epsilon,
        defaults.delta,
        components,
        selection,
        accounting=defaults.accounting,
        selectors=selectors(query).requests,
    )
    return Plan(query, state, dialect, noise, epsilon, defaults.delta)


def answer_columns(plan: Plan, errors: Sequence[float | str | None]) -> tuple[ResultColumn, ...]:
    """The answer's columns, each output that is an aggregate with its 95% figure (`errors`, by
    aggregate: a ± in the column's units, or a text for those shown otherwise)."""
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
