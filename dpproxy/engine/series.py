"""Series limits (dpproxy.sql.series): a join to a private top-k subquery, answered as two private
queries under one charge — the top-k first, then the main query restricted to the keys it released.

One reservation holds both costs before anything runs: the main query's cost is known before its keys
are (it is planned first with placeholder keys; inlined constants change which rows it reads, not its
components, contribution bounds or selection), so an analyst whose budget cannot pay for both is
refused before either reads data, rather than charged for a top-k whose chart is then refused. The
charge stands once the top-k query was sent, whatever happens next (dpproxy.engine.charge); were the
main query's real plan to cost more than its estimate, it is not run (PrivateQueryFailed, the top-k
part charged). Never cached nor replayed: its second statement follows a release.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from sqlglot import exp

from dpproxy.audit import StatementRecord
from dpproxy.backends import Cancellation
from dpproxy.engine.protocol import EngineLike
from dpproxy.errors import InvalidParameter, NotSupported, PrivateQueryFailed, UndefinedColumn
from dpproxy.policy import AnalystPolicy
from dpproxy.results import Result, ResultColumn
from dpproxy.sql.bounds import SessionBounds
from dpproxy.sql.literals import placeholder_value
from dpproxy.sql.probes import EmptyQuery
from dpproxy.sql.query import PrivateQuery
from dpproxy.sql.series import SeriesLimit, series_limit
from dpproxy.sql.types import PgType


@dataclass(frozen=True)
class SeriesStatement:
    """A series-limited statement taken apart: the join, its private top-k query, and its text."""

    series: SeriesLimit
    inner: PrivateQuery
    text: str


def series_parts(engine: EngineLike, tree: exp.Expression, *, answer: bool) -> SeriesStatement | None:
    """A series-limited query whose top-k subquery is private, taken apart; None for any other
    statement (over public tables only, the join runs as written)."""
    series = series_limit(tree)
    if series is None:
        return None
    inner = engine.analyze_tree(series.inner, answer=answer)
    if not isinstance(inner, PrivateQuery):
        return None
    key_positions(series, inner)  # every link names a column of the top-k query
    return SeriesStatement(series, inner, tree.sql("postgres"))


def key_positions(series: SeriesLimit, inner: PrivateQuery) -> list[int]:
    names = [o.name.lower() for o in inner.post_processing.outputs]
    for _, name in series.links:
        if name not in names:
            raise UndefinedColumn(f'column "{name}" is not an output of the series-limit subquery')
    return [names.index(name) for _, name in series.links]


def key_types(series: SeriesLimit, inner: PrivateQuery) -> list[PgType]:
    outputs = inner.post_processing.outputs
    return [outputs[i].type for i in key_positions(series, inner)]


def with_placeholder_keys(series: SeriesLimit, inner: PrivateQuery) -> exp.Select:
    """The main query restricted to one key of placeholder values (for its types and its cost)."""
    types = key_types(series, inner)
    return series.restricted([tuple(placeholder_value(t) for t in types)], types)


def execute_series(
    engine: EngineLike,
    statement: SeriesStatement,
    who: AnalystPolicy,
    epsilon: float,
    cancel: Cancellation | None,
    record: StatementRecord | None = None,
    bounds: SessionBounds | None = None,
) -> Result:
    """The top-k query, then the main query restricted to the keys it released; both charged."""
    series, inner = statement.series, statement.inner
    inner_plan = engine.plan_private(inner, epsilon, bounds=bounds)
    types = key_types(series, inner)
    estimate = engine.analyze_tree(with_placeholder_keys(series, inner), answer=False)
    if not isinstance(estimate, PrivateQuery):
        raise NotSupported(
            "a series limit over a main query on public tables only is not supported",
            hint="ask the main query and the top-k query separately",
        )
    main_cost = engine.plan_private(estimate, epsilon, bounds=bounds).cost
    total = inner_plan.cost + main_cost
    cap = engine.policy.epsilon_limits(who)[1]
    if total.epsilon > cap * (1 + 1e-9):  # one statement: both queries' ε within the per-query cap
        raise InvalidParameter(
            f"a series limit asks two private queries, ε = {epsilon:g} each: ε = {total.epsilon:g} in "
            f"all, more than the per-query cap ε = {cap:g}",
            hint=f"SET dpproxy.epsilon = {cap / 2:g} or less for this chart",
        )
    charge = engine.charge(who, total, statement.text, record)
    ranked = engine.run_charged(inner_plan, charge, cancel)
    positions = key_positions(series, inner)
    keys = [tuple(row[i] for i in positions) for row in ranked.rows]
    try:
        main = engine.analyze_tree(series.restricted(keys, types), answer=True)
        if isinstance(main, EmptyQuery):  # no key released: the join has no rows
            result = Result(tuple(ResultColumn(o.name, o.type) for o in main.outputs), [])
            return charge.commit(result, total)
        assert isinstance(main, PrivateQuery)
        main_plan = engine.plan_private(main, epsilon, bounds=bounds)
        actual = main_plan.cost
        if not (actual.fits_within(main_cost) and actual.rho <= main_cost.rho * (1 + 1e-9)):
            raise PrivateQueryFailed()
    except BaseException as error:
        raise charge.fail(error, keep=True) from None
    result = engine.run_charged(main_plan, charge, cancel)
    if not main.needs_selection:
        # Public keys are released zero-filled, all of them; the join keeps only the top k.
        result = _series_rows(series, keys, result)
    return charge.commit(result, total)


def _series_rows(series: SeriesLimit, keys: Sequence[tuple[object, ...]], result: Result) -> Result:
    """The released rows whose series columns hold one of the released keys (post-processing of
    released values), when the main query selects each link expression as a column."""
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
