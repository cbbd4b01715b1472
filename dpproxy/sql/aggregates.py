"""Aggregates of private queries: each COUNT, SUM, AVG, VAR/STDDEV, quantile and MODE reduced to
integer components per group (the values noise is added to) or to a histogram over candidates (for
the exponential mechanism), with the grid their sums are exact on. Nothing here reads data."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import ClassVar, TypeVar

from sqlglot import exp

from dpproxy.errors import InvalidParameter, NotSupported, PolicyViolation, UndefinedFunction, UndefinedTable
from dpproxy.policy import DEFAULT_GRID_SCALE
from dpproxy.sql.datetimes import epoch_grid, epoch_grid_sql
from dpproxy.sql.intervals import Interval
from dpproxy.sql.names import function_name
from dpproxy.sql.query import Aggregate, AggregateKind, Component, ComponentKind, Histogram
from dpproxy.sql.rowexpr import Typed, constant_value, row_expression
from dpproxy.sql.types import PgType, avg_result, sum_result

SUPPORTED_AGGREGATES = (
    "COUNT(*), COUNT(expr), COUNT(DISTINCT expr), SUM, AVG, VAR_POP, VAR_SAMP, STDDEV_POP, STDDEV_SAMP, "
    "MIN, MAX, MEDIAN, PERCENTILE_CONT/PERCENTILE_DISC(f) WITHIN GROUP (ORDER BY x), MODE() WITHIN GROUP"
)

T = TypeVar("T")


def _index_of(items: list[T], item: T, key: Callable[[T], object]) -> int:
    """The index of the first of `items` with `item`'s key, `item` appended when there is none: equal
    components and histograms are computed (and charged) once, equal aggregates released once."""
    wanted = key(item)
    for i, existing in enumerate(items):
        if key(existing) == wanted:
            return i
    items.append(item)
    return len(items) - 1


# VAR and STDDEV as sqlglot reads them, with their kind and the name their Aggregate.text starts with
# (dpproxy.engine.clipping clips the same ones).
SPREADS: dict[type[exp.Expression], tuple[AggregateKind, str]] = {
    exp.VariancePop: (AggregateKind.VAR_POP, "var_pop"),
    exp.Variance: (AggregateKind.VAR_SAMP, "var_samp"),
    exp.StddevPop: (AggregateKind.STDDEV_POP, "stddev_pop"),
    exp.StddevSamp: (AggregateKind.STDDEV_SAMP, "stddev_samp"),
    exp.Stddev: (AggregateKind.STDDEV_SAMP, "stddev_samp"),
}


class AggregateRules:
    """The aggregate part of the private-query analyzer (a mixin: `scope`, `relation`, `components`,
    `aggregates` and `histograms` are the analyzer's)."""

    def _component(self, component: Component) -> int:
        return _index_of(self.components, component, lambda c: c.identity)

    def _add_aggregate(self, aggregate: Aggregate) -> int:
        return _index_of(self.aggregates, aggregate, lambda a: (a.text, a.kind))

    def _aggregate(self, node: exp.Expression) -> int:
        if isinstance(node, exp.Filter):
            raise NotSupported(
                "aggregate FILTER (WHERE …) is not supported",
                hint="write SUM(CASE WHEN … THEN 1 ELSE 0 END) or move the condition to WHERE",
            )
        if isinstance(node, exp.WithinGroup):
            return self._within_group(node)
        if isinstance(node, (exp.Min, exp.Max)):
            if node.expressions:
                raise NotSupported(f"{node.sql_name()} takes one argument here")
            alpha = Fraction(0) if isinstance(node, exp.Min) else Fraction(1)
            return self._quantile(node.this, alpha, node.sql_name().lower(), continuous=False)
        if isinstance(node, exp.Median):
            return self._quantile(node.this, Fraction(1, 2), "median", continuous=True)
        if isinstance(node, exp.Count):
            return self._count(node)
        if isinstance(node, (exp.Sum, exp.Avg)):
            return self._sum_or_avg(node)
        if type(node) in self._SPREADS:
            return self._spread(node)
        name = function_name(node).upper()
        raise NotSupported(
            f"aggregate {name} is not supported yet", hint=f"supported aggregates: {SUPPORTED_AGGREGATES}"
        )

    def _count(self, node: exp.Count) -> int:
        arg = node.this
        unit = self.relation.unit_name
        if isinstance(arg, exp.Column) and isinstance(arg.this, exp.Star):
            # COUNT(t.*): t's rows whose row value is not NULL, which is every row of t unless a LEFT
            # JOIN extends it with NULLs: COUNT(*) there, as PostgreSQL counts.
            source = next((s for s in self.relation.sources if arg.table.lower() in s.names), None)
            if source is None:
                raise UndefinedTable(f'missing FROM-clause entry for table "{arg.table}" (COUNT)')
            if source.alias in self.relation.nullable:
                raise NotSupported(
                    f"COUNT({arg.sql('postgres')}) of a table on the nullable side of a LEFT JOIN is not "
                    "supported",
                    hint="count one of its columns that is never NULL",
                )
            arg = None
        if arg is None or isinstance(arg, exp.Star):
            component = self._component(Component(ComponentKind.ROWS, identity="rows"))
            return self._add_aggregate(Aggregate(AggregateKind.COUNT, (component,), PgType.INT8, "count(*)"))
        if isinstance(arg, exp.Distinct):
            # COUNT(DISTINCT (x)) is COUNT(DISTINCT x) (SQLAlchemy writes it so).
            columns = [c.unnest() if isinstance(c, exp.Paren) else c for c in arg.expressions]
            scope = self.scope.in_clause("COUNT(DISTINCT …)")
            if len(columns) == 1 and isinstance(columns[0], exp.Column):
                _, column = scope.resolve(columns[0])
                if unit is not None and column.is_unit:
                    component = self._component(Component(ComponentKind.UNITS, identity="units"))
                    return self._add_aggregate(
                        Aggregate(
                            AggregateKind.COUNT_UNITS, (component,), PgType.INT8, f"count(distinct {unit})"
                        )
                    )
            if len(columns) != 1:
                raise NotSupported("COUNT(DISTINCT …) of several expressions is not supported")
            # Another column: each person adds at most max_rows_per_unit rows to a group, hence at
            # most that many distinct values; computed over the bounded rows (row pipeline).
            typed = row_expression(columns[0], scope)
            text = typed.sql.sql("postgres")
            component = self._component(
                Component(ComponentKind.DISTINCT_VALUES, typed.sql, identity=f"distinct:{text}")
            )
            return self._add_aggregate(
                Aggregate(
                    AggregateKind.COUNT_DISTINCT,
                    (component,),
                    PgType.INT8,
                    f"count(distinct {columns[0].sql('postgres')})",
                )
            )
        typed = row_expression(arg, self.scope.in_clause("COUNT argument"))
        text = typed.sql.sql("postgres")
        component = self._component(Component(ComponentKind.VALUES, typed.sql, identity=f"values:{text}"))
        return self._add_aggregate(
            Aggregate(AggregateKind.COUNT_VALUES, (component,), PgType.INT8, f"count({arg.sql('postgres')})")
        )

    def _histogram(self, histogram: Histogram) -> int:
        return _index_of(self.histograms, histogram, lambda h: h.identity)

    def _within_group(self, node: exp.WithinGroup) -> int:
        function = node.this
        order = node.expression
        keys = order.expressions if isinstance(order, exp.Order) else []
        if len(keys) != 1:
            raise NotSupported("WITHIN GROUP takes exactly one ORDER BY expression")
        ordered = keys[0]
        descending = bool(ordered.args.get("desc"))
        argument = ordered.this
        if isinstance(function, exp.Mode):
            return self._mode(argument)
        if isinstance(function, (exp.PercentileCont, exp.PercentileDisc)):
            fraction = constant_value(function.this)
            if not isinstance(fraction, Decimal) or not 0 <= fraction <= 1:
                raise InvalidParameter(
                    "the fraction of percentile_cont/percentile_disc must be a constant between 0 and 1"
                )
            alpha = Fraction(str(fraction))
            if descending:
                alpha = 1 - alpha
            continuous = isinstance(function, exp.PercentileCont)
            name = "percentile_cont" if continuous else "percentile_disc"
            return self._quantile(argument, alpha, name, continuous=continuous)
        raise NotSupported(
            f"{function.sql_name()}() WITHIN GROUP is not supported",
            hint="supported: percentile_cont, percentile_disc, mode",
        )

    # Quantile candidates: at most this many points over a column's range (the exponential
    # mechanism's error grows only with the log of their number).
    MAX_CANDIDATES: ClassVar[int] = 1000
    # …and, when the grid is finer than that, this many sub-bins per coarse bin, counted in a second
    # pass inside a window around a first, coarse pick (docs/privacy.md, quantiles).
    FINE_BINS: ClassVar[int] = 334

    def _quantile(self, arg: exp.Expression, alpha: Fraction, name: str, *, continuous: bool) -> int:
        """MIN (α = 0), MAX (α = 1), MEDIAN and percentiles per group, by the exponential mechanism
        over the argument's bounded range (dpproxy.privacy.selectors.QuantileSpec)."""
        temporal = self._temporal_argument(arg, name, continuous=continuous)
        if temporal is not None:
            typed, interval, scale, result = temporal
        else:
            typed, interval, scale, _within = self._bounded_argument(arg, name.upper())
            result = PgType.FLOAT8 if continuous else typed.type
        lo, hi = interval.on_grid(scale)
        candidates = max(1, min(self.MAX_CANDIDATES, hi - lo + 1))
        # Grid values per coarse bin, rounded up: more sub-bins than that would be empty.
        per_bin = -(-(hi - lo) // max(1, candidates - 1))
        fine = min(self.FINE_BINS, per_bin) if hi - lo + 1 > candidates else 0
        fine = fine if fine > 1 else 0
        if (hi - lo) * max(candidates - 1, fine) >= 2**63:
            # The histograms' bins are (v − lo)·(K − 1) div (hi − lo) and a remainder by it times the
            # sub-bins, in 64-bit integers (rewrite/row_pipeline.py): past 2^63 a row reaching the
            # top of the range would fail the query — a bit of one person's value, noise-free.
            raise NotSupported(
                f"{name.upper()}({arg.sql('postgres')}) over the range [{interval.lo}, {interval.hi}] is "
                f"not supported ({name.upper()} argument): its histogram's integer arithmetic could overflow",
                hint="clamp the argument to the range that matters, e.g. LEAST(GREATEST(x, 0), 1000000), "
                "or ask the data owner for narrower bounds",
            )
        text = typed.sql.sql("postgres")
        refined = f"{fine}:" if fine else ""
        histogram = self._histogram(
            Histogram(
                typed.sql,
                candidates,
                interval,
                scale,
                identity=f"range:{scale}:{candidates}:{refined}{text}",
                double=typed.double,
                exact_integer=typed.exact_integer,
                fine=fine,
            )
        )
        return self._add_aggregate(
            Aggregate(
                AggregateKind.QUANTILE,
                (),
                result,
                f"{name}({alpha}:{arg.sql('postgres')})",
                interval,
                scale,
                histogram=histogram,
                alpha=alpha,
            )
        )

    def _temporal_argument(
        self, arg: exp.Expression, name: str, *, continuous: bool
    ) -> tuple[Typed, Interval, int, PgType] | None:
        """MIN, MAX or percentile_disc of a date or time column: the column on the epoch grid of its
        declared range (dpproxy.sql.datetimes.epoch_grid: days for a date, seconds for a timestamp),
        released as a value of the column's type; None when the argument is not a date or time."""
        bare = arg.unnest() if isinstance(arg, exp.Paren) else arg
        if isinstance(bare, exp.Distinct):
            return None
        scope = self.scope.in_clause(f"{name.upper()} argument")
        typed = row_expression(arg, scope)
        if not typed.type.is_temporal:
            return None
        written = arg.sql("postgres")
        if continuous:
            raise UndefinedFunction(
                f"function {name}({typed.type.value}) does not exist",
                hint=f"{name} interpolates numbers; for a date or time use "
                f"percentile_disc(f) WITHIN GROUP (ORDER BY {written})",
            )
        named = _one_column(bare)
        if named is None and isinstance(bare, exp.Cast):
            # A cast between date and timestamp is monotone: its MIN, MAX or percentile is the cast
            # of the column's, on the grid of the cast's type over the column's range (dbt's
            # freshness check writes max(d::timestamp)). Not to or from timestamptz: the session's
            # time zone would decide.
            inner = _one_column(bare.this)
            if inner is not None and (row_expression(inner, scope).type, typed.type) in _MONOTONE_CASTS:
                named = inner
        if named is None:
            raise NotSupported(
                f"{name.upper()}({written}): MIN, MAX and percentile_disc of a date or time are "
                "released for a column with a declared range (or CASE WHEN … THEN that column END), "
                "not for another expression",
                hint=f"aggregate the column itself, e.g. {name.upper()}(<date column>)",
            )
        source, column = scope.resolve(named)
        if column.temporal_range is None:
            table = getattr(source, "label", None) or "the table"
            policy_type = {PgType.DATE: "date", PgType.TIMESTAMP: "timestamp"}.get(column.type, "timestamptz")
            example = f"{{type: {policy_type}, lower: 2000-01-01, upper: 2030-12-31}}"
            raise PolicyViolation(
                f"{name.upper()}({written}) needs a declared range for the {column.type.value} column "
                f'"{column.name}" of table "{table}": the policy gives it no lower and upper',
                hint=f"ask the data owner to declare the range its values lie in, in the policy's "
                f"tables.{table}.columns: {column.name}: {example}; MIN and MAX are then released "
                "over that range",
            )
        interval = epoch_grid(column.temporal_range, typed.type)
        sql, exact = epoch_grid_sql(typed.sql, typed.type)
        numeric = Typed(sql, PgType.INT8 if exact else PgType.NUMERIC, interval)
        return numeric, interval, 0, typed.type

    def _mode(self, arg: exp.Expression) -> int:
        """MODE() WITHIN GROUP (ORDER BY x) by report-noisy-max over x's public values, or over a
        bounded integer column's values when there are at most MAX_CANDIDATES of them."""
        scope = self.scope.in_clause("MODE argument")
        typed = row_expression(arg, scope)
        if typed.uses_unit:
            raise PolicyViolation(f'the privacy unit "{self.relation.unit_name}" cannot be a MODE argument')
        bare = arg.unnest() if isinstance(arg, exp.Paren) else arg
        column = scope.resolve(bare)[1] if isinstance(bare, exp.Column) else None
        text = typed.sql.sql("postgres")
        if column is not None and column.public_values is not None:
            histogram = Histogram(
                typed.sql, len(column.public_values), values=column.public_values, identity=f"values:{text}"
            )
        elif typed.type.is_integer and typed.interval is not None and typed.interval.finite:
            lo, hi = typed.interval.on_grid(0)
            if hi - lo + 1 > self.MAX_CANDIDATES:
                raise NotSupported(
                    f"MODE over {arg.sql('postgres')} has {hi - lo + 1} possible values; at most "
                    f"{self.MAX_CANDIDATES} are supported",
                    hint="declare public_values for the column, or narrow its bounds",
                )
            histogram = Histogram(
                typed.sql,
                hi - lo + 1,
                typed.interval,
                0,
                identity=f"range:0:{hi - lo + 1}:{text}",
                double=typed.double,
                exact_integer=typed.exact_integer,
            )
        else:
            raise NotSupported(
                f"MODE() over {arg.sql('postgres')} needs the column's public_values, or a bounded "
                "integer column",
                hint="candidates must not come from the data: declare public_values in the policy",
            )
        index = self._histogram(histogram)
        return self._add_aggregate(
            Aggregate(AggregateKind.MODE, (), known_type(typed.type), f"mode({text})", histogram=index)
        )

    def _bounded_argument(self, arg: exp.Expression, name: str) -> tuple[Typed, Interval, int, bool]:
        """The checked argument of an aggregate that needs bounds: its range, grid scale, and whether
        it arrives already clipped to that range (a bounded column)."""
        if isinstance(arg, exp.Distinct):
            raise NotSupported(f"{name}(DISTINCT …) is not supported", hint=f"use {name}(expr)")
        self._check_summable(arg, name)
        typed = row_expression(arg, self.scope.in_clause(f"{name} argument"))
        if not typed.type.is_number:
            raise UndefinedFunction(
                f"function {name.lower()}({typed.type.value}) does not exist",
                hint=f"{name} needs a number",
            )
        if typed.uses_unit:
            raise PolicyViolation(
                f'the privacy unit "{self.relation.unit_name}" cannot be aggregated with {name}'
            )
        if typed.interval is not None and not typed.interval.finite:
            raise PolicyViolation(
                f"{name}({arg.sql('postgres')}) has no upper or lower bound (with fixed contribution "
                "limits a count or sum per person has none until it is clamped)",
                hint=f"clamp it, e.g. {name}(LEAST({arg.sql('postgres')}, 20))",
            )
        if typed.interval is None:
            raise PolicyViolation(
                f"{name}({arg.sql('postgres')}) has no bounds: the policy gives no lower/upper for "
                "its columns",
                hint="ask the data owner to declare lower and upper bounds for the column",
            )
        scale = self._grid_scale(arg, typed)
        bare = arg.unnest() if isinstance(arg, exp.Paren) else arg
        # A bounded column arrives clipped to exactly its bounds: no second clip is needed.
        return typed, typed.interval, scale, isinstance(bare, exp.Column)

    def _sum_or_avg(self, node: exp.Expression) -> int:
        name = "SUM" if isinstance(node, exp.Sum) else "AVG"
        arg = node.this
        typed, interval, scale, within = self._bounded_argument(arg, name)
        if isinstance(node, exp.Sum):
            component = self._clipped_sum(ComponentKind.SUM, typed, interval, scale, within)
            return self._bounded_aggregate(
                AggregateKind.SUM, (component,), sum_result(typed.type), "sum", arg, interval, scale
            )
        scale = self._centred_scale(typed, interval, scale)
        lo, hi = interval.on_grid(scale)
        centre = (lo + hi) // 2
        values, centred = self._values_and_centred_sum(typed, interval, scale, centre, within)
        return self._bounded_aggregate(
            AggregateKind.AVG, (centred, values), avg_result(typed.type), "avg", arg, interval, scale, centre
        )

    # The identity prefix of each kind of clipped sum: equal identities are one component.
    _SUM_IDENTITIES: ClassVar[dict[ComponentKind, str]] = {
        ComponentKind.SUM: "sum",
        ComponentKind.CENTRED_SUM: "centred",
        ComponentKind.CENTRED_SQUARES: "squares",
    }

    def _clipped_sum(
        self, kind: ComponentKind, typed: Typed, interval: Interval, scale: int, within: bool, centre: int = 0
    ) -> int:
        """The component of a sum of `typed` clipped to `interval` on the grid of `scale`: the values
        themselves (SUM), their offsets from `centre` (CENTRED_SUM) or the squares of those
        (CENTRED_SQUARES). Owns their identity (the centre is part of it for the centred ones) and
        tells the backend how the argument is computed (double, exact integer)."""
        text = typed.sql.sql("postgres")
        grid = f"{scale}:" if kind is ComponentKind.SUM else f"{scale}:{centre}:"
        return self._component(
            Component(
                kind,
                typed.sql,
                interval,
                scale,
                centre,
                identity=f"{self._SUM_IDENTITIES[kind]}:{grid}{text}",
                within_interval=within,
                double=typed.double,
                exact_integer=typed.exact_integer,
            )
        )

    def _bounded_aggregate(
        self,
        kind: AggregateKind,
        components: tuple[int, ...],
        result_type: PgType,
        name: str,
        arg: exp.Expression,
        interval: Interval,
        scale: int,
        centre: int = 0,
    ) -> int:
        """A SUM, AVG, VAR or STDDEV of `arg` from its components, released clamped into `interval`
        on the grid of `scale` (centred at `centre`), its text `name(arg)` as written."""
        text = f"{name}({arg.sql('postgres')})"
        return self._add_aggregate(Aggregate(kind, components, result_type, text, interval, scale, centre))

    def _values_and_centred_sum(
        self, typed: Typed, interval: Interval, scale: int, centre: int, within: bool
    ) -> tuple[int, int]:
        """The count of non-null values and their sum centred on `centre` (on the grid of `scale`)."""
        text = typed.sql.sql("postgres")
        values = self._component(Component(ComponentKind.VALUES, typed.sql, identity=f"values:{text}"))
        centred = self._clipped_sum(ComponentKind.CENTRED_SUM, typed, interval, scale, within, centre)
        return values, centred

    _SPREADS: ClassVar[dict[type[exp.Expression], tuple[AggregateKind, str]]] = SPREADS

    def _spread(self, node: exp.Expression) -> int:
        """VAR/STDDEV from a count, a centred sum and a centred sum of squares, on one grid whose
        squares stay exact in bigint: Var = Σ(x−c)²/n − (Σ(x−c)/n)²."""
        kind, name = self._SPREADS[type(node)]
        arg = node.this
        typed, interval, scale, within = self._bounded_argument(arg, name.upper())
        # Squares of grid values, times the rows one person may add, must stay far inside bigint.
        while True:
            lo, hi = interval.on_grid(scale)
            centre = (lo + hi) // 2
            half_width = max(hi - centre, centre - lo)
            if scale == 0 or self.relation.max_rows * half_width * half_width < 2**52:
                break
            scale -= 1
        if self.relation.max_rows * half_width * half_width >= 2**52:
            raise NotSupported(
                f"the bounds of {arg.sql('postgres')} are too wide for {name.upper()}",
                hint="declare tighter lower/upper bounds in the policy",
            )
        finer = self._centred_scale(typed, interval, scale)
        lo, hi = interval.on_grid(finer)
        if self.relation.max_rows * ((hi - lo) // 2) ** 2 < 2**52:
            scale, centre, half_width = finer, (lo + hi) // 2, (hi - lo) // 2
        values, centred = self._values_and_centred_sum(typed, interval, scale, centre, within)
        squares = self._clipped_sum(ComponentKind.CENTRED_SQUARES, typed, interval, scale, within, centre)
        result = PgType.FLOAT8 if typed.type.is_float else PgType.NUMERIC
        components = (squares, centred, values)
        return self._bounded_aggregate(kind, components, result, name, arg, interval, scale, centre)

    def _check_summable(self, arg: exp.Expression, name: str) -> None:
        self.scope.in_clause(f"{name} argument").check_summable(arg)

    def _centred_scale(self, typed: Typed, interval: Interval, scale: int) -> int:
        """The grid a centred sum is computed on: `scale`, or one digit finer when the bounds' midpoint
        is not on the grid of `scale` (an indicator in [0, 1], whose centre 0.5 is not an integer).
        On a grid without the midpoint the centre is rounded down and a value's largest offset from
        it is one grid step more than half the range: [0, 1] on the integer grid has offsets up to 1,
        on the grid of tenths up to 5 tenths, so its noise, relative to the range, is half as large
        (a quarter for centred squares). Kept only while every grid value, times the rows one person
        may add, stays far inside a 64-bit integer."""
        lo, hi = interval.on_grid(scale)
        if (lo + hi) % 2 == 0:
            return scale
        magnitude = max(interval.magnitude, Decimal(1)) * self.relation.max_rows
        return scale + 1 if magnitude.scaleb(scale + 1) < Decimal(2) ** 52 else scale

    def _grid_scale(self, arg: exp.Expression, typed: Typed) -> int:
        """Digits of the fixed-point grid a sum is computed on: sums are exact integer sums."""
        if typed.type.is_integer:
            return 0
        scope = self.scope.in_clause("aggregate argument")
        scales = [
            column.grid_scale
            for _, column in (scope.resolve(c) for c in arg.find_all(exp.Column))
            if column.fractional
        ]
        scale = max(scales, default=DEFAULT_GRID_SCALE)
        assert typed.interval is not None
        # Every grid value, times the rows one unit may add, must stay far inside a 64-bit integer.
        magnitude = max(typed.interval.magnitude, Decimal(1)) * self.relation.max_rows
        while scale > 0 and magnitude.scaleb(scale) >= Decimal(2) ** 52:
            scale -= 1
        if magnitude >= Decimal(2) ** 52:
            raise NotSupported(
                f"the bounds of {arg.sql('postgres')} are too wide to sum exactly",
                hint="declare tighter lower/upper bounds in the policy",
            )
        return scale


def known_type(pg_type: PgType) -> PgType:
    return PgType.TEXT if pg_type is PgType.UNKNOWN else pg_type


# Casts between date and time types whose MIN and MAX are the casts of the column's (monotone and
# independent of the session's time zone).
_MONOTONE_CASTS = frozenset({(PgType.DATE, PgType.TIMESTAMP), (PgType.TIMESTAMP, PgType.DATE)})


def _one_column(node: exp.Expression) -> exp.Column | None:
    """The column a date or time argument reads as is: the column itself, or a CASE each of whose
    results is that column or NULL (what FILTER (WHERE …) writes); None for any other expression."""
    if isinstance(node, exp.Paren):
        return _one_column(node.this)
    if isinstance(node, exp.Column):
        return node
    if not isinstance(node, exp.Case) or node.this is not None:
        return None
    results = [branch.args.get("true") for branch in node.args.get("ifs") or []]
    results.append(node.args.get("default"))
    columns = [r.unnest() if isinstance(r, exp.Paren) else r for r in results if r is not None]
    columns = [c for c in columns if not isinstance(c, exp.Null)]
    if not columns or not all(isinstance(c, exp.Column) for c in columns):
        return None
    if len({c.sql("postgres").lower() for c in columns}) != 1:
        return None
    return columns[0]  # type: ignore[return-value]
