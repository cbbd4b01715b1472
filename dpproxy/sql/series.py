"""Superset's series limit: a time series split by a dimension, restricted to its top k values.

A chart with "series limit" k joins its main aggregate to a top-k subquery of the same table
(Superset's `get_sqla_query` in superset/models/helpers.py names the inner metric `mme_inner__`
and each inner key `<column>__`):

    SELECT date_trunc('day', visit_date) AS __timestamp, department AS department, COUNT(*) AS count
    FROM public.visits
    JOIN (SELECT department AS department__, COUNT(*) AS mme_inner__ FROM public.visits
          GROUP BY department ORDER BY mme_inner__ DESC LIMIT 5) AS series_limit
      ON department = department__
    GROUP BY date_trunc('day', visit_date), department ORDER BY count DESC LIMIT 10000

Run as one SQL statement, the join would let the inner query's exact ranking decide which rows
the outer one reads. dpproxy splits it (`series_limit`): the inner query is a private query of its
own (its groups' noisy values sorted and cut at k, as any ORDER BY … LIMIT), and the main query is then
asked with the join replaced by a condition on the released keys, inlined as constants
(`SeriesLimit.restricted`), as subqueries over public tables are (dpproxy.sql.subqueries). The
keys are a DP release, so the second query's text depends on the data only through it. The engine
charges both (dpproxy.engine).

Text only: nothing here runs SQL or sees data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlglot import exp

from dpproxy.errors import NotSupported
from dpproxy.sql import literals
from dpproxy.sql.nodes import conjuncts, strip_parens
from dpproxy.sql.types import PgType

__all__ = ["SeriesLimit", "series_limit"]


@dataclass(frozen=True)
class SeriesLimit:
    """A main query joined to a top-k subquery on equal keys, taken apart."""

    inner: exp.Select  # the top-k query, asked on its own
    main: exp.Select  # the main query without the join
    # Per join condition: the main query's expression, and the inner output column it must equal.
    links: tuple[tuple[exp.Expression, str], ...]

    def restricted(self, keys: Sequence[Sequence[object]], types: Sequence[PgType]) -> exp.Select:
        """The main query reading only rows whose link expressions equal one of `keys` (one value
        per link, in link order, typed `types`). A NULL key matches nothing, as in the join;
        no keys at all leave a condition that is never true (the query is then empty)."""
        alternatives = []
        for key in sorted({tuple(k) for k in keys if all(v is not None for v in k)}, key=repr):
            equalities = [
                exp.EQ(this=expression.copy(), expression=literals.constant(value, pg_type))
                for (expression, _), value, pg_type in zip(self.links, key, types, strict=True)
            ]
            alternatives.append(exp.and_(*equalities) if len(equalities) > 1 else equalities[0])
        if len(self.links) == 1 and alternatives:
            condition: exp.Expression = exp.In(
                this=self.links[0][0].copy(), expressions=[a.expression for a in alternatives]
            )
        elif alternatives:
            condition = exp.or_(*[exp.Paren(this=a) for a in alternatives])
        else:
            condition = exp.false()
        query = self.main.copy()
        where = query.args.get("where")
        if where is not None:
            condition = exp.and_(exp.Paren(this=where.this), exp.Paren(this=condition))
        query.set("where", exp.Where(this=condition))
        return query


def series_limit(tree: exp.Expression) -> SeriesLimit | None:
    """The parts of a series-limited query (see the module docstring), or None for any other."""
    if not isinstance(tree, exp.Select):
        return None
    joins = list(tree.args.get("joins") or [])
    found = [
        j
        for j in joins
        if isinstance(j.this, exp.Subquery)
        and isinstance(j.this.this, exp.Select)
        and j.this.this.args.get("group") is not None
        and j.this.this.args.get("limit") is not None
        and j.this.this.args.get("order") is not None
    ]
    if len(found) != 1:
        return None
    join = found[0]
    if join.args.get("side") or (join.args.get("kind") or "INNER").upper() != "INNER":
        return None
    subquery: exp.Subquery = join.this
    inner: exp.Select = subquery.this
    alias = (subquery.alias or "").lower()
    names = {_output_name(item): item for item in inner.expressions}
    on = join.args.get("on")
    if on is None or join.args.get("using"):
        return None
    links = []
    for condition in conjuncts(on):
        if not isinstance(condition, exp.EQ):
            return None
        sides = [condition.this, condition.expression]
        inner_side = [s for s in sides if _inner_column(s, alias, names)]
        if len(inner_side) != 1:
            return None
        outer = sides[1 - sides.index(inner_side[0])]
        if outer.find(exp.Subquery, exp.Select) or any(
            _inner_column(c, alias, names) for c in outer.find_all(exp.Column)
        ):
            return None
        links.append((outer, inner_side[0].name.lower()))
    main = tree.copy()
    main.set("joins", [j.copy() for j in joins if j is not join] or None)
    if any(isinstance(n, exp.Column) and n.table.lower() == alias for n in main.walk() if alias):
        raise NotSupported(
            f"the main query may use {subquery.alias} only in its join condition",
            hint=f"select and group by the main table's columns, not {subquery.alias}'s",
        )
    return SeriesLimit(inner.copy(), main, tuple(links))


def _output_name(item: exp.Expression) -> str:
    return item.alias_or_name.lower()


def _inner_column(node: exp.Expression, alias: str, names: dict[str, exp.Expression]) -> bool:
    """A column of the top-k subquery: qualified by its alias, or a name only it has (Superset writes
    `department = department__`, the `__` suffix making the name the subquery's own)."""
    node = strip_parens(node)
    if not isinstance(node, exp.Column) or node.name.lower() not in names:
        return False
    if node.table:
        return node.table.lower() == alias
    return node.name.lower().endswith("__")
