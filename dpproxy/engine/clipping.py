"""Value ranges chosen per query (docs/privacy.md §3, "Value ranges chosen per query"): an AVG of a
column whose declared range is wide is answered as two private queries under one charge — a histogram
of the column's values first, then the query with the AVG's argument clipped to the range the
histogram shows the values in.

A column's declared bounds are the most any value may be (an arrival delay of −90 to 1,300 minutes),
while an average's noise grows with the width of the range its values are clipped to: nearly all
delays lie within −60 to 200, and the noise of a delay averaged per airline was five times what that
narrower range needs. The data owner cannot know the range a question needs (delays of one route, of
one month); the query learns it privately:

1. **The histogram** (`histogram_sql`): for each such column, `SELECT <bin of the column>, COUNT(*)
   … WHERE <the query's WHERE> AND <bin> IN (−1, …, BINS) GROUP BY 1`, over the query's own tables
   and joins, BINS equal bins of the declared range (EXPRESSION_BINS of an expression's derived
   one). It is an ordinary private query, analysed and planned as any other: its keys are the values
   the query names (public, zero-filled), and each person counts for one row in all
   (`SessionBounds(rows=1)`: a person's rows are scaled to one row's worth), so a person moves the
   whole histogram by at most 1. It takes 1/SHARE of the query's ε, split among the columns, with
   Laplace noise under pure accounting (δ = 0: `histogram_plan`).
2. **The range** (`chosen_range`): from the released counts and their 95% error e, the bins that hold
   at least HELD·e persons' worth (a bin of no one's reaches 3e with probability 6·10^-5 under
   Laplace noise, 0.2% that one of 34 does, 0.8% one of 130), widened by MARGIN
   bins on each side, and further while the bins beyond hold more than CUT_SHARE of the persons; the
   declared range when the histogram holds fewer than MIN_PERSONS · e persons' worth, or when the
   range would not halve it; for a column a statement without GROUP BY reads in spreads only, the
   held bins and MARGIN more, not widened, if they hold nearly all persons (`mode_range`).
   Post-processing of released counts: any range is private.
3. **The query** (`clipped_tree`): the statement with each such AVG's argument `x` written as
   `CASE WHEN x IS NULL THEN NULL ELSE LEAST(GREATEST(x, lo), hi) END` (sql/bounds.clipped_argument,
   which the analyser also reads back), analysed afresh (the
   analyser derives its range from the constants) and answered at the rest of ε.

Both statements are the analyser's, as every statement that reaches the backend is; the released
range is said in the NOTICE. One reservation holds both costs before anything runs, as for a series
limit (dpproxy.engine.series): the clipped query's cost is the statement's own at the rest of ε,
known before its range is. The charge stands once the histogram was sent (dpproxy.engine.charge).

Which queries: a plain SELECT (no WITH, subquery, window or set operation; no HAVING that reads an
AVG or a spread, and no ORDER BY with LIMIT or OFFSET, which would keep or drop rows by clipped
values) over tables whose bounds each query chooses (not `contribution_bounds: fixed`, not every
row its own person) and which do not say `value_ranges: declared`, whose AVGs take a bare column
of a protected table with a declared number range of more than MIN_STEPS steps of its
grid (a rating of 1 to 5 is its own range; a double always qualifies), or an expression of such
columns whose range as the analyser derives it qualifies alike
(`_expression`: the flights' average speed, `distance / air_time * 60` over 0 to 15,000, went from
6.4% off to 0.7%), at most MAX_COLUMNS such columns or expressions; not under
`dpproxy.target_error`. VAR and STDDEV (of a column or such an expression) are clipped to that range
widened by its own width on each side it narrows (CLIPPED, `spread_range`). Everything else runs as before.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

import sqlglot
from sqlglot import exp

from dpproxy.audit import StatementRecord
from dpproxy.backends import Cancellation
from dpproxy.engine.caches import kept_key
from dpproxy.engine.plan import Plan, plan_private
from dpproxy.engine.protocol import EngineLike
from dpproxy.errors import DPProxyError, PrivateQueryFailed
from dpproxy.policy import AnalystPolicy, ColumnPolicy, ColumnType, Mechanism, TablePolicy
from dpproxy.privacy import Cost
from dpproxy.privacy.accounting import even_share, remainder, sum_up
from dpproxy.results import Result
from dpproxy.sql.aggregates import SPREADS as SPREAD_FUNCTIONS
from dpproxy.sql.bounds import SessionBounds, clipped_argument, contribution_bounds, with_session_bounds
from dpproxy.sql.intervals import Interval
from dpproxy.sql.nodes import parse_postgres
from dpproxy.sql.query import PrivateQuery

# Equal bins of the declared range in the histogram.
BINS = 32
# …and of an expression's derived range (not a FILTER's or CASE's: its column's), far wider than where
# its values lie (a speed's 0 to 15,000 for 76 to 703: at 32 bins the flights' average speed per
# airline was clipped to 0 to 2,344, 11–12% off).
EXPRESSION_BINS = 128
# The histograms take 1/SHARE of the query's ε (as a choice of bounds takes about a sixth).
SHARE = 6
# At most this many columns' ranges chosen in one query.
MAX_COLUMNS = 3
# A declared range of at most this many steps of its grid is the column's own domain: not narrowed.
MIN_STEPS = 128
# Digits of bins / (upper − lower) in the histogram's bin expression, and its least value: a range
# wider than bins / MIN_PER_BIN (3.2·10^10; an expression's 1.28·10^11) is not narrowed (its factor,
# from which the bins' edges are read, would be rounded by more than 0.05%).
PER_BIN_DIGITS = 12
MIN_PER_BIN = Decimal("1e-9")
# A bin holds values when its count is at least HELD times the counts' 95% error e: 2e let a bin of no
# one's through in 4% of histograms (33 bins), which made the range span the declared one.
HELD = 3
# Bins added on each side of those that hold HELD·e persons' worth.
MARGIN = 3
# A range is chosen only over MIN_PERSONS·e persons' worth (about 720 at ε = 0.5): with fewer, bins
# reaching HELD·e are the mode's alone (a carrier's 200 planes: delays clipped at 40, 15% cut) or noise.
MIN_PERSONS = 20
# …and cuts at most this share of them on each side (less the noise of the bins beyond it): bins are
# added to the range until it does.
CUT_SHARE = 0.03
# A spread's range around the mode (`mode_range`) needs FEW_PERSONS·e persons' worth in it (about 216).
FEW_PERSONS = 6
# Each person counts for one row's worth in a histogram (their rows scaled to it).
ONE_ROW = SessionBounds(rows=1)
# The aggregates whose argument is clipped: averages, whose noise grows with the range, and spreads
# (VAR, STDDEV), with its square. A spread is ruled by its tails, which clipping cuts (the flights'
# standard deviation of delays 12–16% low at the averages' range; at the declared one 44.6 ± 100):
# its range is the averages' widened by its own width on each side it narrows (`spread_range`:
# delays clipped at 605 instead of 257, 1% low), for a quarter of the declared range's noise.
AVERAGES = (exp.Avg,)
SPREADS = tuple(SPREAD_FUNCTIONS)
CLIPPED = (*AVERAGES, *SPREADS)
# The names an AVG's or a spread's Aggregate.text starts with, as the analyser writes them.
NAMES = ("avg", *sorted({name for _, name in SPREAD_FUNCTIONS.values()}))


@dataclass(frozen=True)
class Column:
    """A column whose values a query's averages read, with its declared range; or an expression of
    such columns an AVG takes, with the range the analyser derives for it (`expression`)."""

    table: str
    policy: ColumnPolicy  # an expression's: named by its SQL, its derived range, its grid's scale
    sql: exp.Expression  # as the statement names it
    expression: bool = False

    @property
    def label(self) -> str:
        """How the NOTICE and EXPLAIN name it: table.column, or the expression as written."""
        return self.sql.sql("postgres") if self.expression else f"{self.table}.{self.policy.name}"

    @property
    def lower(self) -> Decimal:
        assert isinstance(self.policy.lower, Decimal)
        return self.policy.lower

    @property
    def upper(self) -> Decimal:
        assert isinstance(self.policy.upper, Decimal)
        return self.policy.upper

    @property
    def bins(self) -> int:
        """How many equal bins its histogram has: EXPRESSION_BINS for an expression's derived range,
        BINS for a declared one (a column's, or a FILTER's or CASE's, which is its column's)."""
        return _bins(self.sql if self.expression else None)

    @property
    def per_bin(self) -> Decimal:
        """bins / (upper − lower), to PER_BIN_DIGITS decimals (a numeric constant of at most 18)."""
        width = self.upper - self.lower
        return (Decimal(self.bins) / width).quantize(Decimal(1).scaleb(-PER_BIN_DIGITS))

    def edge(self, i: int) -> Decimal:
        """The lower edge of bin i as the histogram's SQL computes bins (from `per_bin`, rounded),
        at most the upper bound."""
        return min(self.lower + i / self.per_bin, self.upper)


@dataclass(frozen=True)
class ClipParts:
    """A statement answered with value ranges chosen per query: its tree, its columns, and the
    session's bounds (which the clipped query keeps)."""

    tree: exp.Select
    columns: tuple[Column, ...]
    bounds: SessionBounds | None
    tables: dict[str, TablePolicy]  # by the name the statement refers to each with
    # Each clipped AVG's or spread's argument, by its SQL (`x` and `t.x` are one column, clipped alike).
    arguments: dict[str, Column] = dataclasses.field(default_factory=dict)
    # The columns (by `_key`) an AVG reads, and those a spread reads (clipped to `spread_range`).
    averaged: frozenset[tuple[str, str]] = frozenset()
    spread: frozenset[tuple[str, str]] = frozenset()


def clip_parts(engine: EngineLike, plan: Plan, bounds: SessionBounds | None) -> ClipParts | None:
    """The statement of `plan` taken apart for value ranges chosen per query; None when it is not
    one (the module docstring)."""
    query = plan.query
    if contribution_bounds(query) is None or query.inlined_subqueries or query.subquery_placeholders:
        return None
    if bounds is not None and bounds.target_error is not None:
        return None
    if not any(a.kind.is_mean for a in query.aggregates):
        return None
    try:
        tree = parse_postgres(query.text)
    except sqlglot.errors.ParseError:
        return None
    if not isinstance(tree, exp.Select) or tree.args.get("with") is not None:
        return None
    having = tree.args.get("having")
    if (having is not None and any(isinstance(n, CLIPPED) for n in having.walk())) or (
        tree.args.get("order") is not None and (tree.args.get("limit") or tree.args.get("offset"))
    ):
        # Rows kept or dropped by a clipped value (HAVING AVG(x) > 1000 dropped a group averaging
        # 7,375); HAVING COUNT(*) > 100 reads nothing clipped (no output alias there either).
        return None
    if any(isinstance(n, (exp.Subquery, exp.Window, exp.SetOperation)) for n in tree.walk()):
        return None
    if any(isinstance(n, exp.Select) and n is not tree for n in tree.walk()):
        return None
    tables = _tables(engine, tree)
    if tables is None:
        return None
    intervals = {
        a.text: (a.interval, a.scale) for a in query.aggregates if a.kind.is_mean and a.interval is not None
    }
    found: dict[tuple[str, str], Column] = {}
    arguments: dict[str, Column] = {}
    averaged: set[tuple[str, str]] = set()
    spread: set[tuple[str, str]] = set()
    for node in tree.find_all(*CLIPPED):
        argument = node.this
        if isinstance(argument, exp.Column):
            column = _column(tables, argument)
        else:
            derived = next(filter(None, (intervals.get(t) for t in _texts(argument.sql("postgres")))), None)
            column = None if derived is None else _expression(tables, argument, *derived)
        if column is not None:
            column = found.setdefault(_key(column), column)
            arguments[argument.sql("postgres")] = column
            (spread if isinstance(node, SPREADS) else averaged).add(_key(column))
    if not found or len(found) > MAX_COLUMNS:
        return None
    return ClipParts(
        tree, tuple(found.values()), bounds, tables, arguments, frozenset(averaged), frozenset(spread)
    )


def _texts(argument: str) -> tuple[str, ...]:
    """The texts the analyser gives an AVG or a spread of `argument`'s SQL (Aggregate.text): how an
    aggregate of the statement is matched with the analysed one (its interval, its reach)."""
    return tuple(f"{name}({argument})" for name in NAMES)


def _tables(engine: EngineLike, tree: exp.Select) -> dict[str, TablePolicy] | None:
    """The tables of the FROM and its joins by the name the statement refers to them with; None when
    one is not a plain table of the policy."""
    found: dict[str, TablePolicy] = {}
    sources = [tree.args.get("from_"), *(tree.args.get("joins") or [])]
    for source in sources:
        if source is None:
            return None
        table = source.this
        if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
            return None
        policy = engine.policy.table(table.name if table.this.quoted else table.name.lower())
        if policy is None or any(t is policy for t in found.values()):
            # A table under two names (a self-join): a histogram of one alias's values would clip
            # the other's (AVG(b.x) answered 494 for 3,275 from a.x's range).
            return None
        found[table.alias_or_name.lower()] = policy
    return found


def _column(tables: dict[str, TablePolicy], node: exp.Column) -> Column | None:
    """The protected column `node` names, when its range qualifies (the module docstring)."""
    found = _protected(tables, node)
    if found is None:
        return None
    table, column = found
    if not column.summable or not isinstance(column.lower, Decimal):
        return None
    assert isinstance(column.upper, Decimal)
    return Column(table.name, column, node) if _wide(column.lower, column.upper, column.grid_scale) else None


def _protected(tables: dict[str, TablePolicy], node: exp.Column) -> tuple[TablePolicy, ColumnPolicy] | None:
    """The table and bounded number column `node` names, of a protected table whose ranges each query
    may choose; not its privacy unit."""
    table = _table_of(tables, node)
    if table is None or table.public or table.unit_is_row or table.value_ranges != "chosen":
        return None
    name = _name(node)
    column = table.column(name)
    if column is None or not column.type.is_number or not column.bounded or name == table.privacy_unit:
        return None
    return table, column


def _name(node: exp.Column) -> str:
    return node.name if node.this.quoted else node.name.lower()


def _table_of(tables: dict[str, TablePolicy], node: exp.Column) -> TablePolicy | None:
    """The table of the statement `node` reads from: by its qualifier, else the one table that has
    such a column."""
    if node.table:
        return tables.get(node.table.lower())
    candidates = [t for t in tables.values() if t.column(_name(node)) is not None]
    return candidates[0] if len(candidates) == 1 else None


def _bins(expression: exp.Expression | None) -> int:
    """BINS for a declared range: a column (under parentheses or casts), or a CASE whose values are
    columns or constants (a FILTER's); EXPRESSION_BINS for an expression's derived range, a
    FILTER'd expression's too."""

    def declared(node: exp.Expression | None) -> bool:
        while isinstance(node, (exp.Paren, exp.Cast)):
            node = node.this
        if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal):
            return True
        if node is None or isinstance(node, (exp.Column, exp.Literal, exp.Null)):
            return True
        if isinstance(node, exp.Case):
            values = [branch.args.get("true") for branch in node.args.get("ifs") or []]
            return all(declared(v) for v in [*values, node.args.get("default")])
        return False

    return BINS if declared(expression) else EXPRESSION_BINS


def _wide(lower: Decimal, upper: Decimal, scale: int, bins: int = BINS) -> bool:
    """More than MIN_STEPS steps of the grid, and a bin factor within PER_BIN_DIGITS."""
    width = upper - lower
    return width.scaleb(scale) > MIN_STEPS and MIN_PER_BIN <= bins / width < 10**12


def _expression(
    tables: dict[str, TablePolicy], node: exp.Expression, interval: Interval, scale: int
) -> Column | None:
    """An AVG's or a spread's argument other than a bare column (`distance / air_time * 60`, a
    FILTER's CASE) when each column it
    reads is a protected column `_column` would take (the analyser refuses a public table's column
    in an aggregate's argument), and the range the analyser derives for it (`interval`, on its grid
    of `scale` digits) is wide: a column of its own, named by its SQL. Its histogram and clipped
    form are the analyser's, as a column's are."""
    protected = []
    for column in node.find_all(exp.Column):
        found = _protected(tables, column)
        if found is None or not found[1].summable:
            return None
        protected.append(found[0].name)
    if not protected or not isinstance(interval.lo, Decimal) or not isinstance(interval.hi, Decimal):
        return None
    # Outwards onto its grid: a derived bound such as (x − 10) / 3's −3.333… has more digits than a
    # statement's constant may.
    unit = Decimal(1).scaleb(-scale)
    lower = interval.lo.quantize(unit, rounding=ROUND_FLOOR).normalize()
    upper = interval.hi.quantize(unit, rounding=ROUND_CEILING).normalize()
    if not _wide(lower, upper, scale, _bins(node)):
        return None
    policy = ColumnPolicy(_normalised(tables, node), ColumnType.NUMERIC, lower, upper, scale=scale)
    return Column(protected[0], policy, node, expression=True)


def _normalised(tables: dict[str, TablePolicy], node: exp.Expression) -> str:
    """An expression's SQL with each column named by its table's policy name and in lower case
    unless quoted: `x * 2`, `X * 2` and `t.x * 2` are one expression, with one histogram and range."""
    copy = node.copy()
    for column in copy.find_all(exp.Column):
        table = _table_of(tables, column)
        name = _name(column)
        column.set("this", exp.to_identifier(name, quoted=column.this.quoted))
        if table is not None:
            column.set("table", exp.to_identifier(table.name))
    return copy.sql("postgres")


def _literal(value: Decimal) -> exp.Expression:
    text = format(value, "f")
    number = exp.Literal.number(text.lstrip("-"))
    return exp.Neg(this=number) if text.startswith("-") else number


def histogram_sql(parts: ClipParts, column: Column) -> str:
    """The histogram statement of `column` (the module docstring, 1): the bin of a value is
    floor((x::double precision − lower) · bins / (upper − lower)), bins for the upper bound itself
    (counted in the last bin), −1 for a value at the lower bound that double arithmetic puts a hair
    below it (an expression's: (0 + 0.7) · 3 is 2.0999999999999996, under its bound 2.1; counted in
    the first bin); NULL for NULL, which no named key holds."""
    # In double precision: exact arithmetic on a numeric column made the histogram five times slower
    # (DuckDB, DECIMAL(38, 10)), and a bin needs no exactness.
    x = exp.Cast(this=column.sql.copy(), to=exp.DataType.build("double"))
    offset = exp.Paren(this=exp.Sub(this=x, expression=exp.Paren(this=_literal(column.lower))))
    scaled = exp.Mul(this=offset, expression=_literal(column.per_bin))
    bins = exp.Cast(this=exp.Floor(this=scaled), to=exp.DataType.build("integer"))
    named = exp.In(this=bins.copy(), expressions=[_literal(Decimal(i)) for i in range(-1, column.bins + 1)])
    where = parts.tree.args.get("where")
    condition = named if where is None else exp.and_(exp.Paren(this=where.this.copy()), named)
    select = exp.select(exp.alias_(bins, "bin"), exp.Count(this=exp.Star()))
    select.set("from_", parts.tree.args["from_"].copy())
    select.set("joins", [j.copy() for j in parts.tree.args.get("joins") or []])
    return select.where(condition).group_by(exp.Literal.number(1)).sql("postgres")


def chosen_range(
    column: Column, counts: Sequence[tuple[object, object]], error: float | None
) -> tuple[Decimal, Decimal]:
    """The range of `column` from its released histogram (the module docstring, 2), or its declared
    range: with fewer than MIN_PERSONS · e persons' worth in all, with no bin holding HELD·e, or when
    the range would not halve the declared one."""
    if error is None:
        return column.lower, column.upper
    by_bin, total, held = _held(column, counts, error)
    bins = column.bins
    if total < MIN_PERSONS * error or not held:
        return column.lower, column.upper
    low, high = max(0, held[0] - MARGIN), min(bins, held[-1] + 1 + MARGIN)  # bins low … high − 1
    while high < bins and _holding(by_bin, range(high, bins), error) > CUT_SHARE * total:
        high += 1
    while low > 0 and _holding(by_bin, range(0, low), error) > CUT_SHARE * total:
        low -= 1
    lower, upper = _edges(column, low, high)
    if 2 * (upper - lower) > column.upper - column.lower:
        # Less than halving the range halves the noise less than the clipping may move the answer
        # (the flights' distances: 0 to 2,812 of 5,000 cut Honolulu's flights): the declared range.
        return column.lower, column.upper
    return lower, upper


def _holding(by_bin: dict[int, float], bins: Iterable[int], error: float) -> float:
    """What `bins` hold, less what noise clamped at 0 puts in an empty bin (Laplace: e/6; Gaussian: less)."""
    return sum(by_bin.get(i, 0.0) - error / 6 for i in bins)


def _held(
    column: Column, counts: Sequence[tuple[object, object]], error: float
) -> tuple[dict[int, float], float, list[int]]:
    """The released counts by bin (a bin beyond either end read as the end's), their total less
    what noise clamped at 0 puts in each named bin, and the bins holding HELD·e or more."""
    by_bin: dict[int, float] = {}
    for b, c in counts:
        if b is not None and c is not None:
            i = max(0, min(int(b), column.bins - 1))  # type: ignore[call-overload]
            by_bin[i] = by_bin.get(i, 0.0) + float(c)  # type: ignore[arg-type]
    # Less what noise clamped at 0 puts in each of the named bins (as `_holding`): over
    # 130 bins that alone is about 22e, more than MIN_PERSONS·e, and a review saw an expression's
    # histogram of 500 persons narrowed 30 times in 40, cutting 12% of them, where 32 bins narrowed
    # it 3 times.
    total = sum(by_bin.values()) - (column.bins + 2) * error / 6
    held = [i for i in range(column.bins) if by_bin.get(i, 0.0) >= HELD * error]
    return by_bin, total, held


def mode_range(
    column: Column, counts: Sequence[tuple[object, object]], error: float | None
) -> tuple[Decimal, Decimal] | None:
    """A spread's range from a histogram of few persons (under MIN_PERSONS·e persons' worth, where
    chosen_range keeps the declared range): the bins holding HELD·e and MARGIN more on each side,
    used as it is (not widened), when they hold FEW_PERSONS·e persons' worth and the bins beyond
    hold no more than CUT_SHARE of the persons plus twice their noise's spread (a second mode or a
    wide tail: None); None too with no bin held, or when it would not halve the declared range.
    Values beyond it are cut, which lowers a spread (the NOTICE says so)."""
    if error is None:
        return None
    by_bin, total, held = _held(column, counts, error)
    if total >= MIN_PERSONS * error or not held:
        return None
    low, high = max(0, held[0] - MARGIN), min(column.bins, held[-1] + 1 + MARGIN)
    inside = _holding(by_bin, range(low, high), error)
    outside = [i for i in range(column.bins) if not low <= i < high]
    beyond = _holding(by_bin, outside, error)
    # Each bin's noise: Laplace of scale e/3 (e is its 95% error, ln 20 ≈ 3 scales).
    if inside < FEW_PERSONS * error or beyond > CUT_SHARE * total + 2 * math.sqrt(len(outside)) * error / 3:
        return None
    lower, upper = _edges(column, low, high)
    if 2 * (upper - lower) > column.upper - column.lower:
        return None
    return lower, upper


def spread_range(column: Column, chosen: tuple[Decimal, Decimal]) -> tuple[Decimal, Decimal]:
    """A spread's range: the averages' `chosen` range widened by its own width on each side where
    it narrowed the declared one, within the declared range (CLIPPED): a function of the released
    range and the policy alone."""
    lower, upper = chosen
    width = upper - lower
    if lower > column.lower:
        lower = max(column.lower, lower - width)
    if upper < column.upper:
        upper = min(column.upper, upper + width)
    return lower, upper


def _edges(column: Column, low: int, high: int) -> tuple[Decimal, Decimal]:
    """The range from the lower edge of bin `low` to the upper edge of bin `high` − 1, rounded
    outwards onto the column's grid, within the declared range."""
    unit = Decimal(1).scaleb(-column.policy.grid_scale)
    lower = column.edge(low).quantize(unit, rounding=ROUND_FLOOR) if low > 0 else column.lower
    upper = column.edge(high).quantize(unit, rounding=ROUND_CEILING) if high < column.bins else column.upper
    return max(lower, column.lower), min(upper, column.upper)


def clipped_tree(
    parts: ClipParts,
    ranges: dict[tuple[str, str], tuple[Decimal, Decimal]],
    modes: frozenset[tuple[str, str]] = frozenset(),
) -> tuple[exp.Select, dict[str, Column]]:
    """The statement with each AVG's argument clipped to its column's range, and each spread's to
    that range widened (`spread_range`; the module docstring, 3) unless it is a range around the
    mode (`modes`: `mode_range`'s, used as they are), and the clipped arguments' SQL with their
    columns."""
    tree = parts.tree.copy()
    arguments: dict[str, Column] = {}
    for node in list(tree.find_all(*CLIPPED)):
        argument = node.this
        column = parts.arguments.get(argument.sql("postgres"))
        if column is None:
            continue
        lower, upper = ranges[_key(column)]
        if isinstance(node, SPREADS) and _key(column) not in modes:
            lower, upper = spread_range(column, (lower, upper))
        if lower <= column.lower and upper >= column.upper:
            continue
        guarded = clipped_argument(
            argument,
            _literal(lower) if lower > column.lower else None,
            _literal(upper) if upper < column.upper else None,
        )
        node.set("this", guarded)
        arguments[guarded.sql("postgres")] = column
    return tree, arguments


def with_reach(query: PrivateQuery, arguments: dict[str, Column]) -> PrivateQuery:
    """`query` (the clipped statement, analysed) with each clipped aggregate's declared range as its
    reach (Aggregate.reach): what its interval's ends are clamped into, and, for a spread, what the
    most it can be is read from. Release only: neither the SQL nor the noise reads it."""
    by_text = {text: column for sql, column in arguments.items() for text in _texts(sql)}
    aggregates = []
    for aggregate in query.aggregates:
        column = by_text.get(aggregate.text)
        if column is not None and aggregate.kind.is_mean:
            reach = Interval(column.lower, column.upper)
            aggregate = dataclasses.replace(aggregate, reach=reach)
        aggregates.append(aggregate)
    return dataclasses.replace(query, aggregates=tuple(aggregates))


def histogram_plan(engine: EngineLike, sql: str, share: float) -> Plan | None:
    """The histogram statement's plan at `share`, one row per person; None when it is not private.
    Under pure accounting its noise is Laplace's whatever the policy's mechanism: its keys are
    public and a person moves it by at most 1 in L1, so it is ε-DP with δ = 0, and the statement's δ
    stays the clipped statement's alone (a Gaussian histogram spent the per-query δ once more)."""
    try:
        query = engine.analyze_tree(parse_postgres(sql), answer=True)
    except DPProxyError:  # of the text and the policy alone, before any charge: the plain statement
        return None
    if not isinstance(query, PrivateQuery):
        return None
    policy = engine.policy
    if policy.defaults.accounting == "pure" and policy.defaults.mechanism is not Mechanism.LAPLACE:
        laplace = dataclasses.replace(policy.defaults, mechanism=Mechanism.LAPLACE)
        policy = dataclasses.replace(policy, defaults=laplace)
    query = with_session_bounds(query, ONE_ROW)
    return plan_private(query, policy, share, engine.dialect, salt=engine.new_salt())


def _clips(engine: EngineLike, parts: ClipParts) -> bool:
    """Whether the statement clipped to a range (bins 1 to half its bins of each one, in its place)
    is analysed as a private query: checked before anything is charged, so that a statement the
    analyser would refuse once clipped is answered plainly instead of failing after its histogram."""
    placeholder = {_key(c): _edges(c, 1, c.bins // 2) for c in parts.columns}
    try:
        return isinstance(engine.analyze_tree(clipped_tree(parts, placeholder)[0], answer=True), PrivateQuery)
    except DPProxyError:
        return False


def run_clipped(
    engine: EngineLike,
    plan: Plan,
    parts: ClipParts,
    who: AnalystPolicy,
    cancel: Cancellation | None,
    record: StatementRecord | None,
) -> Result:
    """The histograms, then the clipped statement, under one charge of the statement's ε. A range
    this analyst was released before over the same rows (`stored_ranges`) is used again, its
    histogram not asked: its share of ε goes to the statement."""
    if not _clips(engine, parts):
        return engine.run(plan, analyst=who, cancel=cancel, record=record)
    statements = {_key(column): histogram_sql(parts, column) for column in parts.columns}
    spread_only = _spread_only(parts)
    stored, modes = stored_ranges(engine, who, statements, spread_only)
    fresh = [column for column in parts.columns if _key(column) not in stored]
    epsilon = plan.epsilon
    # Shares whose sum, rounded up as the ledger adds, is at most the statement's ε.
    share = even_share(epsilon / SHARE, len(fresh)) if fresh else 0.0
    rest = remainder(epsilon, sum_up([share] * len(fresh))) if fresh else epsilon
    histograms = []
    for column in fresh:
        histogram = histogram_plan(engine, statements[_key(column)], share)
        if histogram is None:
            return engine.run(plan, analyst=who, cancel=cancel, record=record)
        histograms.append(histogram)
    estimate = engine.plan_private(plan.query, rest, bounds=None)
    total = Cost.ZERO
    for histogram in histograms:
        total = total + histogram.cost
    total = total + estimate.cost
    charge = engine.charge(who, total, plan.query.text, record)
    answers = [engine.run_charged(histogram, charge, cancel) for histogram in histograms]
    try:
        ranges = dict(stored)
        chosen: dict[tuple[str, str], tuple[Decimal, Decimal]] = {}
        near: dict[tuple[str, str], tuple[Decimal, Decimal]] = {}
        for column, released in zip(fresh, answers, strict=True):
            counts = [(row[0], row[1]) for row in released.rows]
            error = released.columns[1].error95
            key = _key(column)
            chosen[key] = ranges[key] = chosen_range(column, counts, error)
            around = mode_range(column, counts, error) if key in spread_only else None
            if around is not None:  # kept for replay only once shown
                near[key] = ranges[key] = around
                modes.add(key)
        tree, arguments = clipped_tree(parts, ranges, frozenset(modes))
        main = engine.analyze_tree(tree, answer=True)
        if not isinstance(main, PrivateQuery):
            raise PrivateQueryFailed()
        main = with_reach(main, arguments)
        main_plan = engine.plan_private(main, rest, bounds=parts.bounds)
        if not main_plan.cost.fits_within(estimate.cost):
            raise PrivateQueryFailed()
    except BaseException as error:
        raise charge.fail(error, keep=True) from None
    result = engine.run_charged(main_plan, charge, cancel)
    notes = tuple(
        note
        for c in parts.columns
        for note in _notes(parts, c, ranges[_key(c)], None if _key(c) in stored else share, _key(c) in modes)
    )
    result = dataclasses.replace(result, notes=(*result.notes, *notes))
    committed = charge.commit(result, total)
    store_ranges(engine, who, statements, chosen, near)
    return committed


def _key(column: Column) -> tuple[str, str]:
    return (column.table, column.policy.name)


def _spread_only(parts: ClipParts) -> set[tuple[str, str]]:
    """The columns the statement reads in spreads and in no AVG, without a GROUP BY: their range may
    be `mode_range`'s (per group, the histogram's mode may be another group's: a group far from it
    was cut to nothing)."""
    return set() if parts.tree.args.get("group") else set(parts.spread - parts.averaged)


def _range_key(engine: EngineLike, histogram: str, mode: bool = False) -> str | None:
    """Where a range released to an analyst is kept (the replay store, `defaults.replay`), keyed by
    its histogram's statement (the statement's tables, joins and WHERE, the column and its bins) as a
    replayed answer is by its statement (caches.kept_key), a range around the mode (`mode_range`)
    apart; None without replay or a ledger."""
    if engine.ledger is None or not engine.policy.defaults.replay:
        return None
    kind = "mode range" if mode else "value range"
    return kept_key(engine.policy_digest, engine.policy.defaults.data_epoch, kind, histogram)


def stored_ranges(
    engine: EngineLike,
    who: AnalystPolicy,
    histograms: dict[tuple[str, str], str],
    spread_only: Collection[tuple[str, str]] = (),
) -> tuple[dict[tuple[str, str], tuple[Decimal, Decimal]], set[tuple[str, str]]]:
    """The ranges of the columns whose histogram statements `histograms` holds, released to this
    analyst before, in this data epoch, over the same rows: using one again is post-processing of a
    release they already hold, as a replayed answer is (docs/privacy.md §3). A column in
    `spread_only` reads the range around the mode its histogram gave, where it gave one (those
    columns are the second set returned); any other column, the chosen range."""
    found: dict[tuple[str, str], tuple[Decimal, Decimal]] = {}
    modes: set[tuple[str, str]] = set()
    for column, sql in histograms.items():
        for mode in (True, False) if column in spread_only else (False,):
            key = _range_key(engine, sql, mode)
            if key is None or engine.ledger is None:
                break
            payload = engine.ledger.replay_get(who.name, key)
            if payload is not None:
                lower, upper = json.loads(payload)
                found[column] = (Decimal(lower), Decimal(upper))
                if mode:
                    modes.add(column)
                break
    return found, modes


def store_ranges(
    engine: EngineLike,
    who: AnalystPolicy,
    histograms: dict[tuple[str, str], str],
    chosen: dict[tuple[str, str], tuple[Decimal, Decimal]],
    modes: dict[tuple[str, str], tuple[Decimal, Decimal]],
) -> None:
    """Keep the ranges just released to this analyst for their later statements (`stored_ranges`):
    each histogram's chosen range and, where it gave one, its range around the mode."""
    for ranges, mode in ((chosen, False), (modes, True)):
        for column, (lower, upper) in ranges.items():
            key = _range_key(engine, histograms[column], mode)
            if key is not None and engine.ledger is not None:
                engine.ledger.replay_put(who.name, key, json.dumps([str(lower), str(upper)]).encode())


def _notes(
    parts: ClipParts, column: Column, chosen: tuple[Decimal, Decimal], share: float | None, mode: bool = False
) -> list[str]:
    """What the NOTICE says of the column's range: for its averages, for its spreads (`mode`: a
    range around the mode, `mode_range`'s)."""
    notes = []
    if _key(column) in parts.averaged:
        notes.append(_note(column, chosen, share))
    if mode:
        notes.append(_note(column, chosen, share, "spreads", mode=True))
    elif _key(column) in parts.spread:
        widened = spread_range(column, chosen)
        narrowed = chosen[0] > column.lower or chosen[1] < column.upper
        if narrowed and widened[0] <= column.lower and widened[1] >= column.upper:
            lower, upper = format(column.lower, "f"), format(column.upper, "f")
            spent = "" if share is None else f" at ε = {share:.3g}"
            notes.append(
                f"spreads of {column.label}: its declared range {lower} to {upper} kept (the range a "
                f"private histogram{spent} found, widened by its width on each side it narrows, spans it)"
            )
        else:
            notes.append(_note(column, widened, share, "spreads"))
    return notes


def _note(
    column: Column,
    chosen: tuple[Decimal, Decimal],
    share: float | None,
    what: str = "averages",
    mode: bool = False,
) -> str:
    lower, upper = (format(end, "f") for end in chosen)
    name = column.label
    declared_lower, declared_upper = format(column.lower, "f"), format(column.upper, "f")
    source = (
        "the range a private histogram released to you earlier over the same rows (no ε spent on it now)"
        if share is None
        else f"a private histogram of its values, at ε = {share:.3g}"
    )
    declared = "the range its columns' bounds give it" if column.expression else "its declared range"
    if chosen[0] <= column.lower and chosen[1] >= column.upper:
        return (
            f"{what} of {name}: {declared} {declared_lower} to {declared_upper} kept ({source}, "
            "found no range half as wide)"
        )
    if mode:
        return (
            f"{what} of {name}: values clipped to {lower} to {upper} ({declared} {declared_lower} to "
            f"{declared_upper}), the bins around the most common values ({source}, of too few persons "
            "to show where the rest lie); values beyond them are cut, which makes a spread smaller "
            "(not in the ±)"
        )
    widened = ", then widened by its width on each side it narrows" if what == "spreads" else ""
    return (
        f"{what} of {name}: values clipped to {lower} to {upper} ({declared} {declared_lower} to "
        f"{declared_upper}), a range chosen privately ({source}{widened}); what lies outside it moves "
        "them (not in the ±)"
    )


def explain_clipping(engine: EngineLike, plan: Plan, bounds: SessionBounds | None) -> str | None:
    """What EXPLAIN says of a statement answered with value ranges chosen per query; None for any
    other."""
    parts = clip_parts(engine, plan, bounds)
    if parts is None:
        return None
    share = even_share(plan.epsilon / SHARE, len(parts.columns))
    names = ", ".join(f"{c.label} ({c.lower:f} to {c.upper:f})" for c in parts.columns)
    kinds = " and ".join(k for k, read in (("averages", parts.averaged), ("spreads", parts.spread)) if read)
    spreads = (
        "; spreads' arguments clipped to that range widened by its width on each side it narrows"
        " (without a GROUP BY, a column only spreads read over too few persons: the bins around its mode)"
        if parts.spread
        else ""
    )
    return (
        f"{kinds} of {names}: a private histogram of each column's values ({BINS} bins of its "
        f"declared range, {EXPRESSION_BINS} of the range an expression's columns' bounds give it, "
        "one row per person, "
        f"ε = {share:.3g} each{_laplace(engine)}) is asked "
        "first; the statement "
        f"then runs with the AVGs' arguments clipped to the bins that hold at least {HELD} times the "
        f"counts' 95% error, {MARGIN} more on each side (more while those beyond hold over "
        f"{CUT_SHARE:.0%} of the persons; the declared range when that does not halve it, or over "
        f"fewer than {MIN_PERSONS} times that error in persons){spreads}, at the rest of ε; the "
        "plan below is the statement's before clipping"
    )


def _laplace(engine: EngineLike) -> str:
    defaults = engine.policy.defaults
    if defaults.accounting == "pure" and defaults.mechanism is not Mechanism.LAPLACE:
        return ", Laplace noise: δ = 0"
    return ""
