"""The analyzed form of a statement: what the rewriter, the noise planner and post-processing read.

A private query is reduced to integer *components* per group (row counts, value counts, unit counts,
sums on a fixed-point grid) that are bounded per privacy unit and then noised; *aggregates* (COUNT,
SUM, AVG) are computed from noisy components; *outputs*, HAVING and ORDER BY are expressions over
aggregates and group keys, evaluated on released values only (post-processing).

Placeholders: output, HAVING and ORDER BY expressions refer to released values through columns
named `__agg_<i>` and `__key_<j>`; nothing else reaches post-processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from fractions import Fraction

from sqlglot import exp

from dpproxy.sql.intervals import Interval
from dpproxy.sql.relation import Relation
from dpproxy.sql.types import PgType


class ComponentKind(StrEnum):
    ROWS = "rows"  # COUNT(*): a unit's rows in a group
    VALUES = "values"  # COUNT(x): a unit's rows in a group where x is not NULL
    UNITS = "units"  # COUNT(DISTINCT unit): 1 per unit present in a group
    SUM = "sum"  # sum of clipped values on the grid
    CENTRED_SUM = "centred_sum"  # sum of (clipped grid value − centre), for AVG
    CENTRED_SQUARES = "centred_squares"  # sum of (clipped grid value − centre)², for VAR and STDDEV
    # COUNT(DISTINCT x): distinct values among a person's bounded rows, computed by the row pipeline
    # (a person adds at most max_rows_per_unit rows to a group, so at most that many new values).
    DISTINCT_VALUES = "distinct_values"
    # Randomized response: 1 per person for whom the indicator argument is 1 on any of their rows.
    ANY_UNITS = "any_units"

    @property
    def row_pipeline(self) -> bool:
        return self is ComponentKind.DISTINCT_VALUES


@dataclass(frozen=True)
class Component:
    """One integer per group, computed exactly by the backend from contribution-bounded rows."""

    kind: ComponentKind
    argument: exp.Expression | None = None  # row-level SQL (clipped columns), for VALUES / SUMs
    interval: Interval | None = None  # the argument's clip interval, for SUMs
    scale: int = 0  # grid: values are round(x · 10^scale)
    centre: int = 0  # grid units, for CENTRED_SUM
    identity: str = ""  # equal identities are one component (shared noise, charged once)
    within_interval: bool = False  # the argument is already clipped to `interval` (a bounded column)
    # How the backend computes the argument (dpproxy.sql.numbers): in double precision, or as an
    # exact integer; otherwise an exact decimal. It decides how the argument is put on the grid.
    double: bool = False
    exact_integer: bool = False

    @property
    def grid_range(self) -> tuple[int, int]:
        assert self.interval is not None
        return self.interval.on_grid(self.scale)

    def contribution_range(self, max_rows: int) -> tuple[int, int]:
        """The integer range one unit's contribution to one group is clamped into (grid units).

        A unit adds at most `max_rows` rows' worth to a group: r rows for COUNT(*) and COUNT(x),
        r·[min(L, 0), max(U, 0)] for a sum of values clipped to [L, U], and r·[L − c, U − c] for a
        sum centred at c. COUNT(DISTINCT unit) adds 1.
        """
        if self.kind in (ComponentKind.UNITS, ComponentKind.ANY_UNITS):
            return 0, 1
        if self.kind in (ComponentKind.ROWS, ComponentKind.VALUES, ComponentKind.DISTINCT_VALUES):
            return 0, max_rows
        lo, hi = self.grid_range
        if self.kind is ComponentKind.SUM:
            return max_rows * min(lo, 0), max_rows * max(hi, 0)
        if self.kind is ComponentKind.CENTRED_SQUARES:
            half_width = max(hi - self.centre, self.centre - lo)
            return 0, max_rows * half_width * half_width
        return max_rows * (lo - self.centre), max_rows * (hi - self.centre)

    def sensitivity(self, max_rows: int) -> int:
        """Per-group L∞ sensitivity in grid units under add/remove of one unit (docs/privacy.md §4): the
        largest absolute contribution of one unit. COUNT: r. COUNT(DISTINCT unit): 1. SUM over
        [L, U]: r·max(|L|, |U|) — not U − L, which is the replace-one sensitivity. Centred sum:
        r·max(U − c, c − L), i.e. r·(U − L)/2 at the midpoint. Centred sum of squares:
        r·max(U − c, c − L)².
        """
        lo, hi = self.contribution_range(max_rows)
        return max(1, abs(lo), abs(hi))


@dataclass(frozen=True)
class Histogram:
    """Per-group counts of a value over candidates, for the exponential mechanism (quantiles, MODE).

    Numeric candidates: K points c_j = lo + j·(hi − lo)/(K − 1) over the argument's bounded range on its
    grid; bin j holds the values in [c_j, c_{j+1}). Value candidates (MODE): the listed values, bin j
    holds the rows equal to values[j].
    """

    argument: exp.Expression  # row-level SQL (clipped columns)
    candidates: int  # K
    interval: Interval | None = None  # numeric candidates: the argument's range
    scale: int = 0  # numeric candidates: its grid
    values: tuple[object, ...] | None = None  # value candidates
    identity: str = ""
    double: bool = False  # the argument is computed in double precision (see Component)
    exact_integer: bool = False
    # Quantiles over a grid finer than the K points: each coarse bin j is cut into `fine` sub-bins
    # (sub-bin s holds the values with ((v − lo)·(K − 1)) mod (hi − lo) in [s·(hi − lo)/fine,
    # (s + 1)·(hi − lo)/fine)), counted in a second pass inside a window of coarse bins
    # (dpproxy.release.quantiles). 0: no refinement.
    fine: int = 0

    # A refinement's window: the first pick's coarse bin and this many on each side.
    WINDOW_RADIUS = 1

    @property
    def fine_candidates(self) -> int:
        """The most candidates a refined pick has: the coarse bins outside a full window, plus the
        window's sub-bins."""
        width = min(self.candidates, 2 * self.WINDOW_RADIUS + 1)
        return self.candidates - width + width * self.fine

    def window(self, centre: int) -> range:
        """The coarse bins refined around a first pick."""
        return range(
            max(0, centre - self.WINDOW_RADIUS), min(self.candidates, centre + self.WINDOW_RADIUS + 1)
        )

    def bin_value(self, coarse: int, sub: int | None, *, discrete: bool) -> Decimal:
        """The value released for a refined pick: the middle of the bin (coarse bin `coarse`, or its
        sub-bin `sub`), on the grid when the result is discrete (the lowest grid value >= the middle's
        floor that the bin holds), within the range."""
        assert self.interval is not None and self.fine > 0
        lo, hi = self.interval.on_grid(self.scale)
        span, steps = hi - lo, self.candidates - 1
        if sub is None:
            start, end = Fraction(coarse * span, steps), Fraction((coarse + 1) * span, steps)
        else:
            start = Fraction(coarse * span * self.fine + sub * span, steps * self.fine)
            end = Fraction(coarse * span * self.fine + (sub + 1) * span, steps * self.fine)
        middle = min((start + end) / 2, Fraction(span))
        if discrete:
            first = math.ceil(start)
            return Decimal(lo + min(span, max(first, math.floor(middle)))).scaleb(-self.scale)
        value = Fraction(lo) + middle
        return (Decimal(value.numerator) / Decimal(value.denominator)).scaleb(-self.scale)

    def candidate(self, index: int) -> object:
        if self.values is not None:
            return self.values[index]
        assert self.interval is not None
        if self.candidates == 1:
            return self.interval.lo
        lo, hi = self.interval.on_grid(self.scale)
        step = Fraction(hi - lo, self.candidates - 1)
        grid = lo + round(step * index)
        return Decimal(grid).scaleb(-self.scale)


class AggregateKind(StrEnum):
    COUNT = "count"  # COUNT(*)
    COUNT_VALUES = "count_values"  # COUNT(x)
    COUNT_UNITS = "count_units"  # COUNT(DISTINCT unit)
    SUM = "sum"
    AVG = "avg"
    VAR_POP = "var_pop"
    VAR_SAMP = "var_samp"
    STDDEV_POP = "stddev_pop"
    STDDEV_SAMP = "stddev_samp"
    COUNT_DISTINCT = "count_distinct"  # COUNT(DISTINCT x) of a column other than the privacy unit
    # COUNT(DISTINCT unit) … WHERE p by randomized response: components (units for which p holds on
    # some row, all units); released as the debiased estimate from noisy tallies.
    COUNT_RESPONSES = "count_responses"
    QUANTILE = "quantile"  # MIN, MAX, MEDIAN, PERCENTILE_CONT, PERCENTILE_DISC
    MODE = "mode"

    @property
    def is_spread(self) -> bool:
        return self in (
            AggregateKind.VAR_POP,
            AggregateKind.VAR_SAMP,
            AggregateKind.STDDEV_POP,
            AggregateKind.STDDEV_SAMP,
        )

    @property
    def is_mean(self) -> bool:
        """An AVG, VAR or STDDEV: a mean of the persons' scaled rows, which bounding a person's rows
        reweights but does not shrink; its argument may be clipped to a range chosen per query."""
        return self is AggregateKind.AVG or self.is_spread


@dataclass(frozen=True)
class Aggregate:
    kind: AggregateKind
    # Indexes into PrivateQuery.components: AVG (centred sum, count); VAR and STDDEV (centred squares,
    # centred sum, count); the others one component.
    components: tuple[int, ...]
    result_type: PgType
    text: str  # as written, normalised: "sum(income)"
    interval: Interval | None = None  # argument range (SUM, AVG): released values are clamped into it
    scale: int = 0
    centre: int = 0
    histogram: int = -1  # QUANTILE, MODE: index into PrivateQuery.histograms
    alpha: Fraction | None = None  # QUANTILE: the fraction (0: MIN, 1: MAX)
    # An AVG whose argument the engine clipped to a range chosen per query (dpproxy.engine.clipping):
    # the column's declared range, which the value as asked lies in. Its interval's ends are clamped
    # into it, not into `interval`, and an end that reaches a clipped bound reaches on to the
    # declared one (dpproxy.release.intervals).
    reach: Interval | None = None


@dataclass(frozen=True)
class GroupKey:
    sql: exp.Expression  # row-level SQL
    type: PgType
    text: str  # normalised SQL, to match select-list expressions against keys
    public_values: tuple[object, ...] | None = None  # released without selection, zero-filled
    # Where the key's public values come from when the policy does not list them (a public table, a
    # declared date range), or why it has none; for explain (dpproxy.sql.public_keys).
    origin: str | None = None
    # Its values were read from a public table when the query was planned: the plan holds public data
    # of that moment and is never reused for a later execution of the same text.
    fetched: bool = False
    # Every value it can take between its first and last public value is one of them (KeyValues).
    contiguous: bool = False
    # The backend computes it in double precision whatever its nominal type (an epoch of a
    # timestamp: numeric in PostgreSQL's catalog, a double as rewritten): spelled as a double.
    double: bool = False


@dataclass(frozen=True)
class OutputColumn:
    name: str
    expression: exp.Expression  # over placeholders
    type: PgType


@dataclass(frozen=True)
class SortKey:
    expression: exp.Expression  # over placeholders, or an output position placeholder
    descending: bool
    nulls_first: bool


@dataclass(frozen=True)
class PostProcessing:
    """Everything that runs on released values: projection, HAVING, ORDER BY, LIMIT/OFFSET."""

    outputs: tuple[OutputColumn, ...]
    having: exp.Expression | None
    order_by: tuple[SortKey, ...]
    limit: int | None
    offset: int


# With bounds chosen per query, the scaled components (rows, values, sums) are computed on a grid this
# many times finer (ContributionBounds): scaling a person's contribution by k/n truncates on that grid,
# so a small count loses at most 1/FINE of a row per person and group, not a whole row (which would
# bias an average's count against its sum). The noise is added on the fine grid, and the noisy value
# brought back to the component's own grid after (dpproxy.release.aggregates).
FINE = 1000


@dataclass(frozen=True)
class ContributionBounds:
    """The contribution bounds a query chooses from, within its tables' ceilings (docs/privacy.md §3,
    "Bounds chosen per query"). Each person's rows in one group are scaled down to at most `row_cap`
    rows' worth, and their rows in the whole query to at most k rows' worth, k one of `rows` (no
    group of theirs is cut); the groups a person counts in for partition selection and
    COUNT(DISTINCT unit) are at most g of them, g one of `groups` (empty: no such count), `group_cap`
    at most (the row pipeline's quantiles and distinct counts keep a person's first `group_cap`). The
    main statement computes every candidate's values in one pass; the release chooses k and g
    privately (dpproxy.privacy.bounds) and releases those. One candidate: nothing to choose."""

    rows: tuple[int, ...]  # candidates for k, ascending; the last is the ceiling
    groups: tuple[int, ...]  # candidates for g, ascending; () when no count of units is released
    row_cap: int  # the ceiling of one person's rows in one group
    group_cap: int  # the ceiling of one person's groups (at most the public keys' domain)

    @property
    def choose_rows(self) -> bool:
        return len(self.rows) > 1

    @property
    def choose_groups(self) -> bool:
        return len(self.groups) > 1

    def component_bound(self, component: Component, k: int) -> tuple[int, int]:
        """(per-group sensitivity, groups) for the noise of a scaled component at candidate k, on the
        fine grid (FINE): one person adds at most min(k, row_cap) rows' worth to one group and k
        rows' worth in all, which the planner's L1 (groups × sensitivity) and L2 (√groups ×
        sensitivity) bound from above."""
        per_group = min(k, self.row_cap)
        return FINE * component.sensitivity(per_group), -(-k // per_group)

    @staticmethod
    def scaled(component: Component) -> bool:
        """Whether a component is scaled per person (and so on the fine grid): not a count of units,
        not the row pipeline's."""
        return not component.kind.row_pipeline and component.kind is not ComponentKind.UNITS


@dataclass(frozen=True)
class PrivateQuery:
    relation: Relation
    where: exp.Expression | None
    keys: tuple[GroupKey, ...]
    components: tuple[Component, ...]
    aggregates: tuple[Aggregate, ...]
    post_processing: PostProcessing
    text: str  # the statement, normalised (parameters bound)
    histograms: tuple[Histogram, ...] = ()
    randomized_response: bool = False  # the one aggregate is COUNT_RESPONSES (see AggregateKind)
    # The database enforces one row per unit (PRIMARY KEY, or UNIQUE and NOT NULL, through the
    # joins): no per-unit bounding is needed, and each unit touches one row of one group.
    unit_unique: bool = False
    # Keep at most max_rows_per_unit actual rows per unit and group (sample) instead of clamping
    # each unit's per-group contribution to what that many rows can add (clamp, the default).
    sample_rows: bool = False
    # Subqueries over public tables were answered when the statement was planned and are inlined as
    # constants (dpproxy.sql.subqueries): the plan holds public data of that moment, so it is never
    # reused for a later execution of the same text.
    inlined_subqueries: bool = False
    # …answered with placeholder constants of their type (no backend: Describe, explain): such a
    # plan gives types and the shape of the rewrite, and is never run.
    subquery_placeholders: bool = False
    # The bounds chosen per query within the ceilings (None: the limits are fixed, or every row is
    # its own person, or randomized response).
    bounds: ContributionBounds | None = None
    # The analyst asked what bounding and partition selection leave out (SET
    # dpproxy.estimate_left_out = on): noisy estimates of the rows' worth k removes and of the
    # groups that hold persons, each one more released value (dpproxy.release.left_out).
    estimate_left_out: bool = False

    @property
    def needs_row_pipeline(self) -> bool:
        """Aggregates computed from bounded rows rather than per-person sums (a second statement)."""
        return bool(self.histograms) or any(c.kind.row_pipeline for c in self.components)

    @property
    def needs_main_statement(self) -> bool:
        """The per-person sums statement: not when every value comes from the row pipeline, no
        group needs selecting (its count of units) and no bound is chosen (from its counts of
        persons per candidate) — a MEDIAN over public keys with fixed limits, say."""
        return (
            not self.needs_row_pipeline
            or self.needs_selection
            or any(not c.kind.row_pipeline for c in self.components)
            or (self.bounds is not None and self.bounds.choose_rows and bool(self.histograms))
        )

    @property
    def valued_components(self) -> list[int]:
        """Components the main statement computes from a per-row value (not counts of rows or units,
        not the row pipeline's)."""
        return [
            i for i, c in enumerate(self.components) if c.argument is not None and not c.kind.row_pipeline
        ]

    @property
    def needs_selection(self) -> bool:
        """Keys not all public: groups are released through DP partition selection."""
        return any(k.public_values is None for k in self.keys)

    @property
    def row_level(self) -> bool:
        """Every row is its own unit: `row` tables, and relations whose unit is enforced unique."""
        return self.relation.unit_is_row or self.unit_unique

    @property
    def one_group_per_unit(self) -> bool:
        """Every GROUP BY key reads only sources with one row per person (Relation.reads_one_row_per_
        unit): each person's rows share one key, so each person is in exactly one group."""
        return bool(self.keys) and all(self.relation.reads_one_row_per_unit(k.sql) for k in self.keys)

    @property
    def key_domain_size(self) -> int | None:
        """How many groups can be released when every key is public (their product), else None."""
        if self.needs_selection:
            return None
        return math.prod(len(k.public_values or ()) for k in self.keys)

    @property
    def max_groups(self) -> int:
        """Released groups of this query one unit can contribute to (1 without GROUP BY): the
        policy's max_groups_per_unit, or fewer when the public keys allow fewer groups in all."""
        if not self.keys or self.row_level:
            return 1
        domain = self.key_domain_size
        return self.relation.max_groups if domain is None else max(1, min(self.relation.max_groups, domain))

    @property
    def bounds_groups(self) -> bool:
        """Each unit's groups must be cut to max_groups: not when no more groups can be released
        (rows in groups outside the public values are never released, so need no bound)."""
        if not self.keys or self.row_level:
            return False
        domain = self.key_domain_size
        return domain is None or domain > self.relation.max_groups

    @property
    def max_rows(self) -> int:
        return 1 if self.row_level else self.relation.max_rows


@dataclass(frozen=True)
class PublicQuery:
    """A query that reads public tables only: run as written, no noise, no cost."""

    sql: exp.Expression
    outputs: tuple[OutputColumn, ...]
    text: str


@dataclass(frozen=True)
class ConstantQuery:
    """A SELECT without FROM: evaluated by dpproxy itself."""

    post_processing: PostProcessing
    text: str


AnalyzedQuery = PrivateQuery | PublicQuery | ConstantQuery


def aggregate_placeholder(index: int) -> exp.Column:
    return exp.column(f"__agg_{index}", quoted=True)


def key_placeholder(index: int) -> exp.Column:
    return exp.column(f"__key_{index}", quoted=True)


def output_placeholder(index: int) -> exp.Column:
    return exp.column(f"__out_{index}", quoted=True)
