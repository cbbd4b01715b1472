"""`SELECT *` inside a FROM-subquery or a CTE, expanded to the columns the policy exposes.

    SELECT diagnosis, COUNT(*) FROM (SELECT * FROM patients WHERE age > 40) t1 GROUP BY 1
    becomes
    SELECT diagnosis, COUNT(*) FROM (SELECT patients.patient_id AS patient_id, patients.age AS age, …
                                     FROM patients WHERE age > 40) t1 GROUP BY 1

Ibis' `.filter()` and dbplyr's `mutate()` write every step as such a subquery. The expansion names
exactly the columns an analyst may see (a protected table's listed columns, a public table's listed
or live columns), in their declared order, as PostgreSQL expands `*` in table order: a column the
policy does not expose never appears, and the star of the statement itself is left alone (over a
protected table it asks for raw rows, which the analyser refuses). Nothing here reads data; the
analyser checks what results as if the analyst had written the list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlglot import exp

from dpproxy.policy import Policy
from dpproxy.sql.public import exposed_table
from dpproxy.sql.types import PgType


def expand_subquery_stars(
    tree: exp.Expression,
    policy: Policy,
    public_columns: Mapping[str, Sequence[tuple[str, PgType]]],
    database: str | None = None,
) -> exp.Expression:
    """A copy of `tree` whose FROM-subqueries and CTE bodies list columns instead of `*` / `t.*`."""
    if not any(isinstance(node, exp.Star) for node in tree.walk()):
        return tree
    tree = tree.copy()
    expander = _Expander(policy, public_columns, database)
    with_ = tree.args.get("with_") or tree.args.get("with")
    if with_ is not None:
        for cte in with_.expressions:
            if isinstance(cte.this, exp.Select):
                expander.expand(cte.this)
                expander.ctes[cte.alias.lower()] = _output_names(cte.this)
    if isinstance(tree, exp.Select):
        for item in _from_items(tree):
            if isinstance(item, exp.Subquery) and isinstance(item.this, exp.Select):
                expander.expand(item.this)
    return tree


def _from_items(select: exp.Select) -> list[exp.Expression]:
    from_ = select.args.get("from_") or select.args.get("from")
    items = [from_.this] if from_ is not None else []
    return items + [join.this for join in select.args.get("joins") or []]


@dataclass
class _Expander:
    """What the expansion knows of the sources a star may name: the policy's tables, the public
    tables' live columns, and the output names of the CTEs expanded so far."""

    policy: Policy
    public_columns: Mapping[str, Sequence[tuple[str, PgType]]]
    database: str | None
    ctes: dict[str, list[str]] = field(default_factory=dict)

    def expand(self, select: exp.Select) -> None:
        """Expand the stars of `select` (and, first, of the subqueries in its FROM), in place."""
        for item in _from_items(select):
            if isinstance(item, exp.Subquery) and isinstance(item.this, exp.Select):
                self.expand(item.this)
        if not any(_is_star(e) for e in select.expressions):
            return
        sources: list[tuple[str, list[str]]] = []
        for item in _from_items(select):
            names = self.source_columns(item)
            if names is None:
                return  # a source whose columns are unknown here: left for the analyser to refuse
            sources.append((item.alias_or_name, names))
        expanded: list[exp.Expression] = []
        for e in select.expressions:
            if isinstance(e, exp.Star):
                chosen = sources
            elif isinstance(e, exp.Column) and isinstance(e.this, exp.Star):
                chosen = [s for s in sources if s[0].lower() == e.table.lower()]
                if not chosen:
                    return  # `x.*` of no source: the analyser's 42P01
            else:
                expanded.append(e)
                continue
            for alias, names in chosen:
                for name in names:
                    column = exp.column(name, table=alias, quoted=True)
                    expanded.append(exp.alias_(column, name, quoted=True))
        select.set("expressions", expanded)

    def source_columns(self, item: exp.Expression) -> list[str] | None:
        """The columns `*` stands for in the FROM item `item`, in order; None when unknown here."""
        if isinstance(item, exp.Subquery) and isinstance(item.this, exp.Select):
            return _output_names(item.this)
        if not isinstance(item, exp.Table) or not isinstance(item.this, exp.Identifier):
            return None
        if item.args.get("db") is None and item.name.lower() in self.ctes:
            return list(self.ctes[item.name.lower()])
        table = exposed_table(item, self.policy, self.database)
        if table.columns:
            return [c.name for c in table.columns]
        return [name for name, _ in self.public_columns.get(table.name, ())] or None


def _is_star(e: exp.Expression) -> bool:
    return isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))


def _output_names(select: exp.Select) -> list[str]:
    return [e.alias_or_name for e in select.expressions]
