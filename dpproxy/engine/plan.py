"""A private query's plan: the SQL it sends, the noise it adds and what it costs, made from an analysed
query and the policy without touching data or budget.

Everything a plan sends to the backend is emitted here, once per plan: its statements
(`Plan.statements`) and, for refined quantiles, the second statement with one place for the coarse
bins the first picks choose (`Plan.refinements`). The release step only writes those integers into
it. `explain` renders a plan; the engine runs one; neither is imported here.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import secrets
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
from dpproxy.privacy.bounds import BoundRequest
from dpproxy.release import ExactGroups, exact_groups, selectors
from dpproxy.release.aggregates import column_errors, fine_components
from dpproxy.release.post_processing import refuse_constant_errors
from dpproxy.results import ResultColumn
from dpproxy.sql.bounds import (
    LOSES_ROWS,
    choosing,
    component_bounds,
    distinct_bounds,
    estimates_hidden,
    estimates_removed,
    keeps_rows_by_condition,
    mean_components,
)
from dpproxy.sql.postprocess.intervals import round_digits
from dpproxy.sql.query import FINE, Aggregate, AggregateKind, ComponentKind, PrivateQuery
from dpproxy.sql.rewrite import RewriteState, rewrite
from dpproxy.sql.rewrite.row_pipeline import RefinementStatement, refinement_statement
from dpproxy.sql.types import PgType, from_sqlglot


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
    # The policy's mechanism and accounting (for the noise at chosen bounds: Plan.noise_at).
    _defaults: tuple[str, str] = ("laplace", "pure")
    # Orders each person's values for COUNT(DISTINCT x) per group (dpproxy.release.distinct): drawn
    # per plan, or derived from the rewrite's salt when a test fixes it.
    distinct_salt: int = 0

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
        """Each component's per-group sensitivity in its own grid's units (with bounds chosen per
        query, at the ceilings; a component scaled per person, chosen or fixed, has its noise planned
        on the fine grid, FINE times it)."""
        fine = fine_components(self.query)
        return tuple(
            s // FINE if i in fine else s for i, (s, _) in enumerate(component_bounds(self.query, -1, -1))
        )

    @property
    def chooses_bounds(self) -> bool:
        """Whether the release chooses k and g from every candidate's values (PrivateQuery.bounds)."""
        return choosing(self.query)

    def noise_at(self, rows: int, groups: int, values: int = -1, means: int | None = None) -> QueryNoise:
        """The noise for the values at the chosen candidates (indexes into the query's bounds, and
        into distinct_bounds for ℓ; `means`, the averages' own k: sql.bounds.mean_components): the
        same shares, and so the same cost, as the plan's, with sensitivities for those bounds."""
        chooses = self.chooses_bounds or len(distinct_bounds(self.query)) > 1
        if not chooses or self.responses is not None:
            return self.noise
        key = (rows, groups, values, means)
        noise = self._noise_by_bounds.get(key)
        if noise is None:
            noise = _query_noise(self.query, self.epsilon, self.delta, self._defaults, *key)
            if noise.cost != self.noise.cost:  # both are the allocation: the same whatever the bounds
                raise AssertionError("the noise at a chosen bound must cost what the plan reserved")
            self._noise_by_bounds[key] = noise  # a function of the plan and the key: any thread's will do
        return noise

    @functools.cached_property
    def _noise_by_bounds(self) -> dict[tuple[int, int, int, int | None], QueryNoise]:
        """noise_at's answers, by its arguments (a plan is reused from the plan cache)."""
        return {}

    def measure(self, *row_sets: Sequence[Sequence[object]]) -> ExactGroups:
        """True values per group from each statement's rows: the certificates' seam (see
        dpproxy.release.exact); nothing in production shows them."""
        return exact_groups(self.query, *row_sets, salt=self.distinct_salt)


def plan_private(
    query: PrivateQuery, policy: Policy, epsilon: float, dialect: str, *, salt: str | None = None
) -> Plan:
    """The plan of an analysed private query at the query's ε (chosen within the policy's limits by
    the caller): the rewrite for `dialect` (per-person choices salted with `salt`, random when None)
    and the noise of every released value, with the policy's mechanism, δ and accounting. With bounds
    chosen per query, the noise planned is the ceilings' (the cost is the same for every candidate:
    Plan.noise_at)."""
    refuse_constant_errors(query.post_processing)
    state = rewrite(query, salt=salt, dialect=dialect)
    defaults = policy.defaults
    distinct_salt = (
        secrets.randbits(63) if salt is None else int(hashlib.sha256(salt.encode()).hexdigest()[:15], 16)
    )
    if query.randomized_response:
        responses = randomized_response_count_plan(
            epsilon,
            defaults.delta,
            max_groups=query.max_groups,
            mechanism=defaults.mechanism,
            accounting=defaults.accounting,
        )
        return Plan(query, state, dialect, responses.noise, epsilon, defaults.delta, responses)
    settings = (str(defaults.mechanism), str(defaults.accounting))
    noise = _query_noise(query, epsilon, defaults.delta, settings, -1, -1)
    return Plan(query, state, dialect, noise, epsilon, defaults.delta, None, settings, distinct_salt)


def _mixes(aggregate: Aggregate) -> bool:
    """An AVG, VAR or STDDEV: a mean of the persons' scaled rows, which scaling reweights but does not
    shrink. Not a quantile: its histogram keeps each person's first k rows in the group, and on the
    flights data (regional jets fly short legs many times) the median distance at the persons' upper
    quartile of rows was 7.5% above the rows' median, against 0.8% at the rule for counts' k."""
    return aggregate.kind.is_mean


def _spread(query: PrivateQuery) -> int:
    """How many times m the persons left above k may be (dpproxy.privacy.bounds): twice for an
    average or a spread (scaling a person's rows moves a weighted mean far less than it removes
    rows), once otherwise."""
    return 2 if any(_mixes(a) for a in query.aggregates) else 1


def _averages_only(query: PrivateQuery) -> bool:
    """Every aggregate is an AVG, VAR or STDDEV (with a GROUP BY, also a quantile), and without a
    GROUP BY none is of a share (an argument in [0, 1]): k then aims at a quantile of the persons'
    rows (dpproxy.privacy.bounds), as no count or sum loses what scaling removes. Per group a
    quantile's rank noise outweighs what keeping heavy persons' first k rows moves (the flights'
    median arrival delay per airport: 1–2 minutes off at the median's k, up to 200 at the count
    rule's, ±9,115 ranks against ±85,447); over a whole table it does not (see _mixes; quantiles
    alone there aim at a tenth of the persons instead, _aims_at_a_tenth). Over the
    whole table a share's per-person values spread over its whole range, so reweighting persons
    moves it by a good part of that range (9.6% on the MovieLens benchmark, never inside its ±),
    more than its noise; per group the noise weighs more, and a share's error at the median's k was
    a quarter of its error at the rule for counts' (airline delays per carrier, InstEval's share of
    top ratings per department)."""
    return (
        bool(query.aggregates)
        and not _whole_table_averages(query)
        and all(
            (_mixes(a) or (bool(query.keys) and a.kind is AggregateKind.QUANTILE))
            and (bool(query.keys) or not _share(a))
            for a in query.aggregates
        )
    )


def _whole_table_averages(query: PrivateQuery) -> bool:
    """AVGs only (none of a share, no VAR or STDDEV), without GROUP BY: k aims at a tenth of the
    persons above it (_aims_at_a_tenth), not at their upper quartile. A whole table's average is
    released with little noise, so what reweighting the heavy persons moves is most of its error,
    and none of it is in the ±. On the flights (15 runs each, persons' upper quartile against a
    tenth): the average distance 3.3% off with its ± covering 1 of 15 runs, against 0.71% and 15 of
    15 (planes flying many short legs weigh less at the quartile's k = 128); the average air time
    2.7%, 0 of 15, against 0.94%, 15 of 15; from JFK 4.1%, 5 of 15, against 1.2%, 15 of 15; the
    summer's average arrival delay 25%, 14 of 15, against 12%, 15 of 15. MovieLens' average
    ratings moved within their spread (2.2% against 2.4%, 13 of 15 covered against 15 of 15; under a
    WHERE 4.1% against 6.5% and 1.2% against 1.4%). A spread keeps the quartile: its noise grows with
    k times the squared range, and MovieLens' STDDEV of ratings went from 4.3% off to 23% at a tenth."""
    return (
        not query.keys
        and bool(query.aggregates)
        and all(a.kind is AggregateKind.AVG and not _share(a) for a in query.aggregates)
    )


def _aims_at_a_tenth(query: PrivateQuery) -> bool:
    """k aims at a tenth of the persons above it, and (without a WHERE) at least a quarter of the
    ceiling (dpproxy.privacy.bounds), for quantiles of a whole table, for averages of a whole table
    (_whole_table_averages) and for queries grouped by a key that is not public; averages and spreads
    per group keep their own rule (_averages_only).

    Per group that goes through partition selection, the count rule (about m persons above) is the
    public keys' rule for one group: as there, every released group's noise grows with k while the
    rows bounding removes are shared among the groups, and how many groups will be released is not
    known before the data is read (k is then drawn after selection, by the rule for the groups it
    released: BoundChoice.after_selection). The flights' top 5 destinations by count (`ORDER BY n DESC LIMIT
    5`, about 100 destinations), median of 40 runs: k = 512 of 600 and 15% off, the true top 5
    found 66% of the time, at the count rule; k = 256 (3.9% of the rows removed) and 7.6% off, 78%
    found, at a tenth.

    Every aggregate a quantile and no GROUP BY: a quantile's rank noise
    grows with k, while keeping each person's first k rows moves it little once few persons are
    above; the rule for counts (about m persons above) left k at the ceiling, and the persons'
    upper quartile moved the flights' median distance by 7.5% (see _mixes). Median errors over 20
    runs, three or four runs each: the flights' 90th percentile of departure delays 6.2–10% at the
    rule for counts, 2.9–5.7% at a tenth; their median distance 1.4–3.6%, 1.1–1.9%; MovieLens'
    median rating and 90th percentile of release years moved within their run-to-run spread
    (2.5–7.5% and 0.05–0.22% either way)."""
    if query.keys:
        return query.needs_selection
    quantiles = all(a.kind is AggregateKind.QUANTILE for a in query.aggregates)
    return (bool(query.aggregates) and quantiles) or _whole_table_averages(query)


def _counts_and_sums_of_private_groups(query: PrivateQuery) -> bool:
    """k is drawn after partition selection, aiming at m persons above per released group
    (BoundChoice.after_selection), for counts and sums grouped by keys that are not public: what
    was measured (the flights per origin 4.8% → 1.5% off, their ± covering 7 → 59 of 60 cells).
    With a quantile or a MODE beside them, k keeps the plan's rule; an average beside them has its
    own k (_rows_requests)."""
    counts = (AggregateKind.COUNT, AggregateKind.COUNT_VALUES, AggregateKind.COUNT_UNITS, AggregateKind.SUM)
    return bool(query.keys) and query.needs_selection and all(a.kind in counts for a in query.aggregates)


# At most this many public groups released: each group's sum is at least a quarter of the query's.
FEW_GROUPS = 4


def _many_groups(query: PrivateQuery) -> bool:
    """Averages and spreads per group aim k at half the persons above it (their median rows) when
    there are more than FEW_GROUPS groups or the keys are not public; over at most FEW_GROUPS
    public groups each group's sum is a large share of the query's, its noise weighs as little as a
    whole table's, and the whole table's aim (a quarter of the persons above) fits. The flights'
    average air time per origin (3 airports), 40 runs: 6.4% off and the ± covering 77 of 120 cells
    at half (k = 64, heavy planes' short legs reweighted), 4.4% and 116 of 120 at a quarter; their
    share delayed per origin 2.7% either way; InstEval's average rating in service and other
    courses (2 groups) 0.18% and 0.28%."""
    if not query.keys:
        return False
    cells = query.key_domain_size
    return cells is None or cells > FEW_GROUPS


def _spreads_only(query: PrivateQuery) -> bool:
    """Every aggregate a VAR or STDDEV: k aims at half the persons above it (their median rows; over
    many groups the lower quartile, as for averages there), not at a quarter. A spread's noise
    grows with k times its squared range, so the upper quartile's k was mostly noise. The rule reads
    row counts only: where the heavy persons' values lie apart from the others', weighing everyone
    alike moves the spread outside its ± (a review's 750 persons of 2 rows near 50 beside 250 of 100
    rows over 0–100: 48% off at the median's k = 2, 14% at the upper quartile's 4). Median errors
    over 20 runs, upper quartile against median: MovieLens' STDDEV of ratings 6.2% against 3.0–5.7%,
    InstEval's 0.47% against 0.34%; on the flights the STDDEV of one route's air times (344 planes:
    k = 64 against 8 or 16, around their mode: clipping.mode_range) 1.52 of its tolerance against
    0.66, of all arrival delays 14% against 18%, of all distances 3.6% against 2.4%."""
    return bool(query.aggregates) and all(a.kind.is_spread for a in query.aggregates)


def _has_quantile(query: PrivateQuery) -> bool:
    """Averages, spreads and shares per group aim k lower (three quarters of the persons above it)
    than quantiles per group (half): scaling a person's rows reweights an average, while a quantile
    keeps each person's first k rows (dpproxy.privacy.bounds)."""
    return any(a.kind is AggregateKind.QUANTILE for a in query.aggregates)


def _share(aggregate: Aggregate) -> bool:
    interval = aggregate.interval
    return interval is not None and interval.lo == 0 and interval.hi == 1


def _rows_requests(query: PrivateQuery, candidates: tuple[int, ...]) -> tuple[BoundRequest, ...]:
    """k's choices: one by the rule of the aggregates whose values k bounds (a COUNT(DISTINCT …) beside
    them is bounded by g and ℓ, not k: an AVG beside COUNT(DISTINCT unit) aims as an AVG alone), or
    two when averages and spreads stand beside counts, sums, quantiles or modes
    (sql.bounds.mean_components), each family's by the rule of a query of that family alone, unless
    both rules are one (then one choice, not two paid for the same aim)."""
    reading = tuple(a for a in query.aggregates if a.kind.is_mean or a.kind in LOSES_ROWS)
    viewed = dataclasses.replace(query, aggregates=reading) if reading else query
    averaged = mean_components(query)
    if not averaged:
        return (_rows_request(viewed, candidates),)
    others = _rows_request(_family(viewed, averaged, means=False), candidates)
    means = _rows_request(_family(viewed, averaged, means=True), candidates, means=True)
    if _aim(means) == _aim(others):
        return (dataclasses.replace(others, spread=max(others.spread, means.spread)),)
    return (others, means)


def _aim(request: BoundRequest) -> BoundRequest:
    """The request as k's scores read it (privacy.bounds.bound_choice), but for how many times m its
    target is: two rules that differ only there (a share over a whole table keeps the counts' rule,
    at twice m) are one choice, at the larger, as one k had — a second choice at half the ε cost more
    than the aim gained (the flights' count and share delayed, 30 runs: 0.71% and 2.2% off at one k,
    0.93% and 2.6% at two). A quantile of the persons' rows, or a tenth of them chosen before
    selection, reads no target at all."""
    request = dataclasses.replace(request, means=False, spread=1)
    if request.quartile or (request.decile and not request.selected):
        request = dataclasses.replace(request, cells=1)
    return request


def _rows_request(query: PrivateQuery, candidates: tuple[int, ...], means: bool = False) -> BoundRequest:
    """k's rule (dpproxy.privacy.bounds) for `query`'s aggregates; `means`: the averages' own k of a
    query with two (`_family`). Counts and sums over public keys aim k at m persons above per
    released group (their errors summed over the groups)."""
    return BoundRequest(
        "rows",
        candidates,
        _spread(query),
        _averages_only(query),
        half=_many_groups(query) or _spreads_only(query),
        # With `half` only (bound_choice); spreads alone over few groups aim at the median.
        lower=not _has_quantile(query) and _many_groups(query),
        cells=query.key_domain_size or 1,
        decile=_aims_at_a_tenth(query),
        floor=query.where is None and not keeps_rows_by_condition(query),
        resolved=not query.keys,
        selected=_counts_and_sums_of_private_groups(query),
        means=means,
    )


def _family(query: PrivateQuery, averaged: frozenset[int], *, means: bool) -> PrivateQuery:
    """The query as k's rule reads it for one of its two k's (sql.bounds.mean_components): its
    averages and spreads alone (`means`), or every other aggregate.
    Only the rule reads it; the components, their noise and the statement are the whole query's."""
    kept = tuple(a for a in query.aggregates if bool(set(a.components) & averaged) == means)
    return dataclasses.replace(query, aggregates=kept)


def _groups_request(query: PrivateQuery, candidates: tuple[int, ...]) -> BoundRequest:
    """g's rule (dpproxy.privacy.bounds): with partition selection, the persons' median number of
    groups (the threshold grows with g), but a tenth of the persons with more groups than g when the
    query releases COUNT(DISTINCT unit) per group: there a person cut out of a group is missing from
    its released count, which the median made confidently wrong. The flights' planes per airport
    (3 airports; 26% of the planes fly from all three) came out 14% low at g = 2, their ± covering
    none of 30 cells; at a tenth g = 4, 0.7% off and 21 of 30. Planes per destination (a plane
    flies to 8 in the median, 25 at the 90th percentile): 42% low and 17 of 281 cells covered at
    the median, 10% and 189 of 201 at a tenth, with 23% of the 89 destinations of 50 planes or more
    shown instead of 32% (the threshold grows with g); planes per carrier (one each) unchanged
    (10 runs each). Without partition selection, every key public, g aims at about m persons with
    more groups, as k does (`median` false)."""
    if query.needs_selection and any(c.kind is ComponentKind.UNITS for c in query.components):
        return BoundRequest("groups", candidates, median=False, decile=True, floor=False)
    return BoundRequest("groups", candidates, median=query.needs_selection)


def _query_noise(
    query: PrivateQuery,
    epsilon: float,
    delta: float,
    settings: tuple[str, str],
    rows: int,
    groups: int,
    values: int = -1,
    means: int | None = None,
) -> QueryNoise:
    mechanism, accounting = settings
    bounds = query.bounds if choosing(query) else None
    selection = None
    asked: tuple[BoundRequest, ...] = ()
    if query.needs_selection:
        selection = bounds.groups[groups] if bounds is not None and bounds.groups else query.max_groups
    if bounds is not None:
        if len(bounds.rows) > 1:
            asked += _rows_requests(query, bounds.rows)
        if len(bounds.groups) > 1:
            asked += (_groups_request(query, bounds.groups),)
    distinct = distinct_bounds(query)
    if len(distinct) > 1:  # ℓ of COUNT(DISTINCT x): a person moves each one's counts by ℓ in all
        counts = sum(1 for c in query.components if c.kind is ComponentKind.DISTINCT_VALUES)
        cells = query.key_domain_size or 1
        asked += (BoundRequest("distinct", distinct, cells=cells, weight=counts),)
    components = component_bounds(query, rows, groups, values, means)
    # What the bounds and selection leave out, when asked (release.left_out): one more value each.
    removed, hidden = estimates_removed(query), estimates_hidden(query)
    if removed:  # the pair (removed, kept) moves by at most the ceiling in all
        assert bounds is not None
        components.append((bounds.row_cap, 1))
    if hidden:  # the groups holding persons counted at g: a person makes at most g of them
        assert selection is not None
        components.append((selection, 1))
    noise = plan_query_noise(
        mechanism,
        epsilon,
        delta,
        components,
        selection,
        accounting=accounting,
        selectors=selectors(query, rows, groups).requests,
        choices=asked,
        allocated=bounds is not None or len(distinct) > 1,
    )
    if removed or hidden:  # the last columns, in the order appended
        columns = list(noise.columns)
        found = columns.pop() if hidden else None
        estimate = columns.pop() if removed else None
        noise = dataclasses.replace(noise, columns=tuple(columns), estimate=estimate, hidden=found)
    return noise


def errors_at(plan: Plan, epsilon: float) -> list[float | str | None]:
    """The 95% figure the NOTICE would give each aggregate of `plan` were it planned at `epsilon`,
    from the plan alone: those of counts and sums (at the ceilings when the bounds are chosen), None
    or a text for the others, whose figure depends on the data (dpproxy.engine.accuracy)."""
    noise = _query_noise(plan.query, epsilon, plan.delta, plan._defaults, -1, -1)
    return column_errors(plan.query, noise, [])


def answer_columns(plan: Plan, errors: Sequence[float | str | None]) -> tuple[ResultColumn, ...]:
    """The answer's columns, each output that is an aggregate with its 95% figure (`errors`, by
    aggregate: a ± in the column's units, or a text for those shown otherwise)."""
    columns = []
    for output in plan.query.post_processing.outputs:
        error: float | str | None = None
        node, wrappers = output.expression, []
        while isinstance(node, (exp.Cast, exp.Paren, exp.Round)):  # COUNT(*)::int4 keeps its ±
            wrappers.append(node)
            node = node.this
        if node.name.startswith("__agg_") and node.key == "column":
            index = int(node.name.removeprefix("__agg_"))
            error = errors[index]
            if isinstance(error, (int, float)):
                slack = _rounding_slack(wrappers, plan.query.aggregates[index].result_type)
                error = None if slack is None else error + slack
        if isinstance(error, str):
            columns.append(ResultColumn(output.name, output.type, None, error))
        else:
            columns.append(ResultColumn(output.name, output.type, error))
    return tuple(columns)


def _rounding_slack(wrappers: Sequence[exp.Expression], inner: PgType) -> float | None:
    """How much the casts and ROUNDs around a released aggregate (outermost first) may add to its ±:
    rounding the released value and the true one each moves them by at most half a unit of the last
    digit kept, so together by at most one unit (ROUND(AVG(x)::numeric, 1): 0.1; a cast of a
    double to an integer: 1; a cast of an integer, or to a double or a numeric: 0). None when a ROUND
    keeps a number of digits that is not a constant (the ± is then not shown)."""
    slack, current = 0.0, inner
    for node in reversed(wrappers):
        if isinstance(node, exp.Round):
            digits = round_digits(node)
            if digits is None:
                return None
            slack += 0.0 if current.is_integer and digits >= 0 else 10.0**-digits
        elif isinstance(node, exp.Cast):
            target = from_sqlglot(node.args["to"])
            if target.is_integer and not current.is_integer:
                slack += 1.0
            current = target
    return slack
