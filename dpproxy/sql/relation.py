"""The relation a private query reads: its sources, how they are joined, and who its person is.

Joins are accepted only when one person's influence stays bounded after them:
  - protected ⨝ public, on equality keys (inner, or LEFT with the public table on the right): the
    public table is fixed data; a key that is not unique there can repeat a person's rows, which the
    per-unit bounding of the rewrite then caps;
  - protected ⨝ protected, when the tables share the privacy unit (same unit column name) and are
    joined on it: a person's joined rows come only from that person's rows.
Anything else — protected tables joined on another key, cross joins, RIGHT/FULL joins — could let
one person change other persons' rows, and is refused with what to write instead. Contribution
limits of the relation are the largest of its protected tables'; bounding applies to the joined
rows. The relation has one row per person (no bounding needed) only when the database enforces it:
every protected table's unit is unique (PRIMARY KEY, or UNIQUE NOT NULL) and every public table is
joined on one of its own enforced-unique columns.

A FROM-subquery that groups by the privacy unit is a derived source: one row per person, whose
aggregates (COUNT, SUM, AVG, MIN, MAX) the outer query may use like columns, with ranges derived
from the inner columns' bounds (with ceilings a count is at most max_rows_per_unit; with fixed limits
it has no upper bound until the query clamps it, e.g. LEAST(n, 20)). Nothing here reads data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from sqlglot import exp

from dpproxy.errors import DPProxyError, GroupingError, NotSupported, PolicyViolation
from dpproxy.policy import DEFAULT_GRID_SCALE, Policy, TablePolicy
from dpproxy.sql import numbers
from dpproxy.sql.intervals import Interval
from dpproxy.sql.nodes import conjuncts, strip_parens
from dpproxy.sql.public import exposed_table
from dpproxy.sql.rowexpr import row_condition, row_expression
from dpproxy.sql.rowexpr.typed import clip_sql
from dpproxy.sql.scope import RowScope, Source, SourceColumn, refuse_output_alias
from dpproxy.sql.types import PgType, avg_result, from_column_type, sum_result

INFINITY = Decimal("Infinity")


@dataclass(frozen=True)
class SchemaFacts:
    """What the live schema adds to the policy: public tables' columns, enforced-unique columns."""

    public_columns: Mapping[str, Sequence[tuple[str, PgType]]] = field(default_factory=dict)
    unique_columns: Mapping[str, Collection[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Relation:
    sources: tuple[Source, ...]
    joins: tuple[exp.Join, ...]  # as emitted: checked ON conditions, items under their aliases
    unit: exp.Column | None  # the person of each row, as emitted; None: every row is a person
    unit_name: str | None
    unit_unique: bool  # the database guarantees one row per person
    max_rows: int
    max_groups: int
    sample_rows: bool
    label: str
    nullable: frozenset[str] = frozenset()  # aliases of sources on the right of a LEFT JOIN
    # A table of the relation fixes its contribution limits (`contribution_bounds: fixed`): every
    # query uses them; otherwise they are ceilings within which each query chooses its bounds.
    fixed_bounds: bool = False
    # Aliases of the protected sources that hold at most one row per person (the database keeps
    # their unit unique, or a derived source grouped by it); every protected source is joined to
    # the others on the unit, so all of a person's rows read the same row of each of these.
    one_row_per_unit: frozenset[str] = frozenset()
    # The unit's table says `null_units: each_a_person`: its declared columns, which tell a row whose
    # unit is NULL apart (`unit_row`); empty when such rows are left out.
    null_unit_columns: tuple[exp.Column, ...] = ()

    @property
    def unit_row(self) -> exp.Expression | None:
        """With `null_units: each_a_person`, what tells apart a row whose unit is NULL: the digest of
        its declared columns (`_row_digest`), NULL for a row with a unit; None otherwise. A person is
        the unit and this together (RewriteContext.persons), so a row with a unit keeps the unit's
        own type and equality."""
        if self.unit is None or not self.null_unit_columns:
            return None
        return exp.Case(
            ifs=[
                exp.If(
                    this=exp.Is(this=self.unit.copy(), expression=exp.Null()),
                    true=_row_digest(self.null_unit_columns),
                )
            ]
        )

    def reads_one_row_per_unit(self, expression: exp.Expression) -> bool:
        """Whether `expression` (row-level SQL over the sources' aliases) reads only sources with one
        row per person, none on a LEFT JOIN's nullable side, and no subquery: it then takes one value
        for all of a person's rows."""
        if expression.find(exp.Subquery, exp.Select):
            return False
        kept = self.one_row_per_unit - self.nullable
        return all(column.table in kept for column in expression.find_all(exp.Column))

    @property
    def unit_is_row(self) -> bool:
        return self.unit is None

    def nullable_unit_table(self, not_null: Collection[str]) -> tuple[str, str, str | None] | None:
        """The table whose privacy-unit column the relation's persons are read from, when the rows
        it reads may have a NULL one (README, "Rows without a person"): its name, that column's, and
        the per-person subquery that read it if one did (it leaves them out whatever the table's
        null_units); `not_null`: the tables whose unit column the database keeps NOT NULL."""
        if self.unit is None or self.unit_name is None:
            return None
        source = next((s for s in self.sources if s.alias == self.unit.table), None)
        if source is None:
            return None
        of = source.persons_of  # a subquery: one row per person, whose rows are read without a NULL unit
        if source.policy is None and of is not None and of.privacy_unit is not None:
            # unit_unique: the policy vouches that the unit is never NULL, as for the table itself.
            kept = of.name in not_null or of.unit_unique
            return None if kept else (of.name, of.privacy_unit, source.label)
        if self.row_level or source.policy is None or source.policy.name in not_null:
            return None
        return source.label, self.unit_name, None

    @property
    def row_level(self) -> bool:
        return self.unit is None or self.unit_unique

    def scope(self, clause: str) -> RowScope:
        return RowScope(self.sources, clause)

    def from_items(self) -> tuple[exp.Expression, list[exp.Join]]:
        """Fresh copies of the FROM item and the joins, for building SQL."""
        return self.sources[0].item.copy(), [j.copy() for j in self.joins]


def _text(expression: exp.Expression) -> exp.Expression:
    return exp.Cast(this=expression, to=exp.DataType.build("text"))


def _row_digest(columns: Sequence[exp.Column]) -> exp.Expression:
    """MD5 of the row's values as one text, each written as its length, ':' and its text, or '-' for
    NULL: no two rows that differ in any of `columns` give the same text. Rows equal in all of them
    (every column a query can read) are one person: docs/privacy.md §3 says why that is sound."""
    tokens: list[exp.Expression] = []
    for column in columns:
        value = _text(column.copy())
        written = exp.DPipe(
            this=exp.DPipe(this=_text(exp.Length(this=value.copy())), expression=exp.Literal.string(":")),
            expression=value,
        )
        null = exp.Is(this=column.copy(), expression=exp.Null())
        tokens.append(exp.Case(ifs=[exp.If(this=null, true=exp.Literal.string("-"))], default=written))
    text = tokens[0]
    for token in tokens[1:]:
        text = exp.DPipe(this=text, expression=token)
    return exp.MD5(this=text)


def source_alias(index: int) -> str:
    return f"t{index}"


def build_relation(select: exp.Select, policy: Policy, facts: SchemaFacts) -> Relation:
    from_ = select.args.get("from_") or select.args.get("from")
    assert from_ is not None
    joins: list[exp.Join] = list(select.args.get("joins") or [])
    sources: list[Source] = []
    emitted_joins: list[exp.Join] = []
    links: list[tuple[tuple[int, str], tuple[int, str]]] = []
    nullable: set[str] = set()
    for index, node in enumerate([from_.this, *(j.this for j in joins)]):
        sources.append(_source(node, index, policy, facts))
        if index == 0:
            continue
        join = joins[index - 1]
        _check_join_kind(join, sources)
        on, join_links = _join_condition(join, sources)
        join_links += _implied_unit_links(sources, join_links)
        _check_nullable_side(join, sources, join_links)
        links.extend(join_links)
        emitted_joins.append(exp.Join(this=sources[-1].item, on=on, side=join.args.get("side")))
        if (join.args.get("side") or "").upper() == "LEFT":
            nullable.add(sources[-1].alias)
    return dataclasses.replace(_assemble(sources, emitted_joins, links, facts), nullable=frozenset(nullable))


def _source(node: exp.Expression, index: int, policy: Policy, facts: SchemaFacts) -> Source:
    alias = source_alias(index)
    if isinstance(node, exp.Table):
        table = exposed_table(node, policy)
        if node.args.get("sample") is not None:
            raise NotSupported(
                f'TABLESAMPLE on "{table.name}" is not supported in private queries',
                hint="bounding each person's contribution already limits what one person adds; query the "
                "whole table",
            )
        if node.args.get("only"):
            raise NotSupported(
                f'ONLY "{table.name}" is not supported', hint=f'read the table as "{table.name}"'
            )
        given = node.alias_or_name
        quoted = bool(node.args.get("alias") and node.args["alias"].this.quoted) or (
            not node.args.get("alias") and node.this.quoted
        )
        names = frozenset({given if quoted else given.lower()})
        if table.public:
            columns = tuple(
                SourceColumn(c.name, from_column_type(c.type), summable=False) for c in table.columns
            ) or tuple(
                SourceColumn(name, t, summable=False) for name, t in facts.public_columns.get(table.name, ())
            )
            if not columns:
                raise NotSupported(
                    f'the columns of public table "{table.name}" are not known',
                    hint="list them in the policy, or give a backend so dpproxy can read them",
                )
        else:
            columns = tuple(SourceColumn.of_policy(c, table) for c in table.columns)
        if table.unit_reference is not None:
            return _referencing_source(table, alias, names, columns, policy, facts)
        return Source(alias, names, table.name, table.public, columns, _table_item(table, alias), table)
    if isinstance(node, exp.Subquery) and isinstance(node.this, exp.Select):
        return _derived_source(node, alias, policy, facts)
    if isinstance(node, exp.Subquery):
        raise NotSupported(
            "set operations are not supported in FROM", hint="select from tables of the policy"
        )
    raise NotSupported(
        f"{node.sql('postgres')} is not supported in FROM",
        hint="read tables of the policy, joined with JOIN … ON",
    )


def _table_item(table: TablePolicy, alias: str) -> exp.Table:
    return exp.Table(
        this=exp.to_identifier(table.name, quoted=True),
        db=exp.to_identifier(table.schema, quoted=True) if table.schema else None,
        alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True)),
    )


def _referencing_source(
    table: TablePolicy,
    alias: str,
    names: frozenset[str],
    columns: tuple[SourceColumn, ...],
    policy: Policy,
    facts: SchemaFacts,
) -> Source:
    """A protected table whose person is reached through the tables it references
    (`privacy_unit: {references: orders, on: order_id}`, docs/privacy.md §3): read as its own columns
    plus the unit, joined up the chain,

        (SELECT r0.order_id, r0.price, r1.customer_id FROM order_items r0
         JOIN orders r1 ON r0.order_id = r1.order_id) AS t0

    Every key the chain joins on must be unique in the table it is read from (enforced by the
    database, or vouched for with key_unique: true): then a row reaches exactly one row at each step,
    so it belongs to one person, as if it carried the unit; a row whose chain ends in no row, or in a
    NULL unit, belongs to no person and is left out (the inner joins drop it, as a NULL unit is)."""
    inner = _table_item(table, "r0")
    joins = []
    current, index = table, 0
    unit_type = PgType.UNKNOWN
    while current.unit_reference is not None:
        reference = current.unit_reference
        target = policy.table(reference.table)
        assert target is not None and not target.public  # the policy resolved the chain when read
        if not reference.key_unique and reference.on not in facts.unique_columns.get(target.name, ()):
            raise NotSupported(
                f'the privacy unit of "{table.name}" is reached through {target.name}.{reference.on}, '
                "which is not known to be unique: a row could reach two persons",
                hint=f"add a PRIMARY KEY or UNIQUE NOT NULL constraint on {target.name}({reference.on}), or "
                f"vouch for it in the policy: privacy_unit: {{references: {target.name}, on: {reference.on}, "
                "key_unique: true}",
            )
        joins.append(
            exp.Join(
                this=_table_item(target, f"r{index + 1}"),
                on=exp.EQ(
                    this=exp.column(reference.on, table=f"r{index}", quoted=True),
                    expression=exp.column(reference.on, table=f"r{index + 1}", quoted=True),
                ),
            )
        )
        current, index = target, index + 1
    unit_name = table.privacy_unit
    assert unit_name is not None
    unit_policy = current.column(unit_name)
    if unit_policy is not None:
        unit_type = from_column_type(unit_policy.type)
    select = exp.select(
        *[exp.column(c.name, table="r0", quoted=True) for c in table.columns],
        exp.alias_(exp.column(unit_name, table=f"r{index}", quoted=True), unit_name, quoted=True),
    ).from_(inner)
    select.set("joins", joins)
    item = exp.Subquery(this=select, alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))
    unit = SourceColumn(unit_name, unit_type, summable=False, is_unit=True)
    return Source(alias, names, table.name, False, (*columns, unit), item, table)


def _implied_unit_links(
    sources: list[Source], links: list[tuple[tuple[int, str], tuple[int, str]]]
) -> list[tuple[tuple[int, str], tuple[int, str]]]:
    """Equal units implied by a join on a reference's key: `order_items.order_id = orders.order_id`,
    where order_items reaches its person through orders on order_id, joins rows of one person (the
    key is unique in orders, so the item's person is that order's person); so does a join of two
    tables that reach their person through the same key, on that key."""
    implied = []
    for a, b in links:
        for (i, column), (j, other) in ((a, b), (b, a)):
            source, target = sources[i], sources[j]
            reference = source.policy.unit_reference if source.policy is not None else None
            if reference is None or target.policy is None or source.unit is None or target.unit is None:
                continue
            # order_items.order_id = orders.order_id, or two tables referencing orders on order_id
            # joined on it (a self-join of order_items): the key finds one order, one person.
            if column == other == reference.on and (
                target.policy.name == reference.table or target.policy.unit_reference == reference
            ):
                implied.append(((i, source.unit.name), (j, target.unit.name)))
    return implied


def _check_join_kind(join: exp.Join, sources: list[Source]) -> None:
    right = sources[-1]
    side = (join.args.get("side") or "").upper()
    kind = (join.args.get("kind") or "").upper()
    if join.args.get("method") or join.args.get("natural"):
        raise NotSupported("NATURAL joins are not supported", hint="write JOIN … ON the columns")
    if kind in ("CROSS",) or (not join.args.get("on") and not join.args.get("using")):
        raise NotSupported(
            f'a join without a condition (cross join with "{right.label}") is not supported: '
            "it could repeat one person's rows without bound",
            hint="write JOIN … ON with equality on the joined columns",
        )
    if kind not in ("", "INNER", "OUTER"):
        raise NotSupported(f"{kind} JOIN is not supported", hint="use JOIN or LEFT JOIN")
    if side in ("RIGHT", "FULL"):
        raise NotSupported(
            f"{side} JOIN is not supported", hint="put the protected table first and use LEFT JOIN"
        )
    if side == "LEFT" and not right.public and right.unit is None:
        raise NotSupported(
            f'LEFT JOIN to the protected table "{right.label}" needs its privacy unit',
            hint="join protected tables with JOIN … ON their privacy unit",
        )


def _null_unit_columns(source: Source) -> tuple[exp.Column, ...]:
    """The declared columns of `source` when its table says `null_units: each_a_person` (a table of
    the policy read directly; a subquery's rows without a person are left out), else ()."""
    if source.policy is None or source.policy.null_units != "each_a_person":
        return ()
    return tuple(exp.column(c.name, table=source.alias, quoted=True) for c in source.columns)


def _check_nullable_side(
    join: exp.Join, sources: list[Source], links: list[tuple[tuple[int, str], tuple[int, str]]]
) -> None:
    """A protected table on the nullable side of a LEFT JOIN must be joined on its privacy unit to
    a protected table before it. Otherwise the rows it leaves unmatched carry a NULL person, and
    which rows those are depends on who else is in the data: bounded together as one pseudo-person,
    they would let one person's presence move other rows (more than the declared sensitivity).
    Joined on the unit, an unmatched row keeps the preserved table's person."""
    right = sources[-1]
    if (join.args.get("side") or "").upper() != "LEFT" or right.public or right.unit is None:
        return
    index = len(sources) - 1
    for a, b in links:
        mine, other = (a, b) if a[0] == index else (b, a)
        if mine == (index, right.unit.name) and other[0] < index:
            partner = sources[other[0]]
            if not partner.public and partner.unit is not None and partner.unit.name == other[1]:
                return
    raise NotSupported(
        f'LEFT JOIN puts the protected table "{right.label}" on the nullable side without joining it on '
        f'its privacy unit "{right.unit.name}" to a protected table before it: its unmatched rows would '
        "belong to no person",
        hint=f"put the protected table first (FROM {right.label} LEFT JOIN …), use JOIN, or join it ON "
        f"other.{right.unit.name} = {min(right.names)}.{right.unit.name}",
    )


def _join_condition(
    join: exp.Join, sources: list[Source]
) -> tuple[exp.Expression, list[tuple[tuple[int, str], tuple[int, str]]]]:
    """The checked ON condition as emitted, and the column equalities it links sources by."""
    scope = RowScope(tuple(sources), f'JOIN "{sources[-1].label}"')
    right = len(sources) - 1
    terms: list[exp.Expression] = []
    using = join.args.get("using")
    if using:
        for identifier in using:
            name = identifier.name.lower()
            left = next((i for i, s in enumerate(sources[:-1]) if s.column(name) is not None), None)
            if left is None or sources[right].column(name) is None:
                raise PolicyViolation(f'column "{name}" of USING is not exposed in both joined tables')
            terms.append(
                exp.EQ(
                    this=exp.column(name, table=sorted(sources[left].names)[0]),
                    expression=exp.column(name, table=sorted(sources[right].names)[0]),
                )
            )
    else:
        terms = conjuncts(join.args["on"])
    links = []
    for term in terms:
        bare = strip_parens(term)
        if (
            isinstance(bare, exp.EQ)
            and isinstance(strip_parens(bare.left), exp.Column)
            and isinstance(strip_parens(bare.right), exp.Column)
        ):
            (a_source, a_column) = scope.resolve(strip_parens(bare.left))
            (b_source, b_column) = scope.resolve(strip_parens(bare.right))
            if a_source is not b_source:
                links.append(
                    ((sources.index(a_source), a_column.name), (sources.index(b_source), b_column.name))
                )
    checked = [row_condition(t, scope.in_clause("JOIN condition")) for t in terms]
    return exp.and_(*[c.sql for c in checked]) if len(checked) > 1 else checked[0].sql, links


class _Classes:
    """Union-find over (source index, column): which columns a join makes equal."""

    def __init__(self) -> None:
        self.parent: dict[tuple[int, str], tuple[int, str]] = {}

    def find(self, key: tuple[int, str]) -> tuple[int, str]:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a: tuple[int, str], b: tuple[int, str]) -> None:
        self.parent[self.find(a)] = self.find(b)


def _assemble(
    sources: list[Source],
    joins: list[exp.Join],
    links: list[tuple[tuple[int, str], tuple[int, str]]],
    facts: SchemaFacts,
) -> Relation:
    classes = _Classes()
    linked_to: dict[int, set[int]] = {i: set() for i in range(len(sources))}
    for a, b in links:
        classes.union(a, b)
        linked_to[a[0]].add(b[0])
        linked_to[b[0]].add(a[0])
    for i in range(1, len(sources)):
        if not linked_to[i] & set(range(i)):
            raise NotSupported(
                f'the join of "{sources[i].label}" has no equality with the tables before it: a cross '
                "join could repeat one person's rows without bound",
                hint="join on equal columns, e.g. JOIN t ON t.key = other.key",
            )
    protected = [i for i, s in enumerate(sources) if not s.public]
    if not protected:
        raise NotSupported("internal: a private query reads no protected table")
    row_tables = [i for i in protected if sources[i].policy is not None and sources[i].policy.unit_is_row]
    if row_tables and len(protected) > 1:
        raise NotSupported(
            f'"{sources[row_tables[0]].label}" has one row per person and no privacy-unit column: it '
            "cannot be joined to another protected table",
            hint="query it alone, or join it to public tables",
        )
    unit_names = {sources[i].unit.name for i in protected if sources[i].unit is not None}
    if len(unit_names) > 1:
        raise NotSupported(
            "protected tables with different privacy units cannot be joined: "
            + ", ".join(
                f'"{sources[i].label}" ({sources[i].unit.name})' for i in protected if sources[i].unit
            ),
            hint="join tables that share the privacy unit, on that unit",
        )
    first = protected[0]
    for i in protected[1:]:
        a, b = (first, sources[first].unit.name), (i, sources[i].unit.name)  # type: ignore[union-attr]
        if classes.find(a) != classes.find(b):
            unit = sources[i].unit.name  # type: ignore[union-attr]
            raise NotSupported(
                f'the protected tables "{sources[first].label}" and "{sources[i].label}" must be joined on '
                f'their privacy unit "{unit}": another key would let one person change other persons\' rows',
                hint=f"add ON {min(sources[first].names)}.{unit} = {min(sources[i].names)}.{unit}",
            )

    def unique(i: int) -> bool:
        source = sources[i]
        if source.policy is None:  # a derived source: one row per person by construction
            return True
        enforced = facts.unique_columns.get(source.policy.name, ())
        if source.public:
            # Each row of the other side finds at most one row here when joined on a unique key.
            keys = {column for (j, column), _ in links if j == i} | {
                column for _, (j, column) in links if j == i
            }
            return bool(keys & set(enforced))
        return source.unit is not None and source.unit.name in enforced

    publics_unique = all(unique(i) for i, s in enumerate(sources) if s.public)
    if row_tables and not publics_unique:
        raise NotSupported(
            f'"{sources[row_tables[0]].label}" has one row per person: a public table joined to it must be '
            "joined on a key the database keeps unique, or a person's row could be repeated",
            hint="join on the public table's primary key",
        )
    unit_source = sources[first]
    unit = (
        exp.column(unit_source.unit.name, table=unit_source.alias, quoted=True)
        if unit_source.unit is not None
        else None
    )
    policies = [sources[i].policy for i in protected if sources[i].policy is not None]
    max_rows = max((p.max_rows_per_unit for p in policies), default=1)
    max_groups = max((p.max_groups_per_unit for p in policies), default=1)
    label = " ⋈ ".join(s.label for s in sources)
    return Relation(
        sources=tuple(sources),
        joins=tuple(joins),
        unit=unit,
        unit_name=unit_source.unit.name if unit_source.unit is not None else None,
        unit_unique=unit is not None and publics_unique and all(unique(i) for i in protected),
        max_rows=max_rows,
        max_groups=max_groups,
        sample_rows=any(p.row_bounding == "sample" for p in policies),
        label=label,
        fixed_bounds=any(p.contribution_bounds == "fixed" for p in policies),
        one_row_per_unit=frozenset(sources[i].alias for i in protected if unique(i)),
        null_unit_columns=_null_unit_columns(unit_source) if unit is not None else (),
    )


# -- derived per-unit sources ----------------------------------------------------------------------

_DERIVED_AGGREGATES = "COUNT, SUM, AVG, MIN, MAX"


def _derived_source(node: exp.Subquery, alias: str, policy: Policy, facts: SchemaFacts) -> Source:
    """A subquery grouped by the privacy unit: one row per person, aggregates as columns."""
    from dpproxy.sql.inline import inline  # inline's own imports do not reach here

    name = node.alias
    if not name:
        raise NotSupported("a subquery in FROM needs an alias", hint="write (SELECT …) AS name")
    inner = inline(node.this)
    for key in ("distinct", "order", "limit", "offset", "qualify", "windows"):
        if inner.args.get(key):
            raise NotSupported(f"{key.upper()} is not supported in subquery {name}")
    if inner.find(exp.Window):
        raise NotSupported(f"window functions are not supported in subquery {name}")
    relation = build_relation(inner, policy, facts)
    if relation.unit is None:
        raise NotSupported(
            f"subquery {name} aggregates a table with one row per person: aggregate it directly",
        )
    scope = relation.scope(f"subquery {name}")
    group = inner.args.get("group")
    keys = group.expressions if group is not None else []
    unit_keys = [
        k
        for k in keys
        if isinstance(strip_parens(k), exp.Column) and scope.resolve(strip_parens(k))[1].is_unit
    ]
    for key in unit_keys:
        _check_person_column(scope.resolve(strip_parens(key))[0], relation, name)
    if len(keys) != 1 or len(unit_keys) != 1:
        raise NotSupported(
            f'subquery {name} aggregates rows: it must GROUP BY the privacy unit "{relation.unit_name}" '
            "alone (one row per person)",
            hint=f"write GROUP BY {relation.unit_name}, and aggregate per person in the outer query",
        )
    where = inner.args.get("where")
    cap = None if relation.fixed_bounds else relation.max_rows
    projections: list[exp.Expression] = []
    columns: list[SourceColumn] = []
    for item in inner.expressions:
        expression = item.this if isinstance(item, exp.Alias) else item
        bare = strip_parens(expression)
        if isinstance(bare, exp.Column) and scope.resolve(bare)[1].is_unit:
            _check_person_column(scope.resolve(bare)[0], relation, name)
            unit_typed = row_expression(bare, scope)
            column_name = item.alias if isinstance(item, exp.Alias) else bare.name.lower()
            projections.append(exp.alias_(unit_typed.sql, column_name, quoted=True))
            columns.append(SourceColumn(column_name, unit_typed.type, is_unit=True, summable=False))
            continue
        if not isinstance(item, exp.Alias):
            raise NotSupported(
                f"name each aggregate of subquery {name} with AS", hint="e.g. COUNT(*) AS visits"
            )
        column, sql = _derived_aggregate(bare, item.alias, scope, cap)
        projections.append(exp.alias_(sql, item.alias, quoted=True))
        columns.append(column)
    if not any(c.is_unit for c in columns):
        raise NotSupported(
            f'subquery {name} must return its privacy unit "{relation.unit_name}"',
            hint=f"SELECT {relation.unit_name}, … GROUP BY {relation.unit_name}",
        )
    having = inner.args.get("having")
    aliases = [item.alias for item in inner.expressions if isinstance(item, exp.Alias)]
    condition, hidden = (
        (None, []) if having is None else _having_columns(having.this, name, relation, columns, aliases)
    )
    visible = len(columns)
    for hidden_name, aggregate in hidden:
        column, sql = _derived_aggregate(aggregate, hidden_name, scope, cap)
        projections.append(exp.alias_(sql, hidden_name, quoted=True))
        columns.append(column)
    base, joins = relation.from_items()
    body = exp.select(*projections, copy=False).from_(base, copy=False)
    for join in joins:
        body = body.join(join, copy=False)
    # Rows whose unit is NULL would make one group, as if they were one person: they are left out
    # (README, "Rows without a person"; with null_units: each_a_person too, as each is a person).
    unit = relation.unit
    assert unit is not None
    body = body.where(exp.Not(this=exp.Is(this=unit.copy(), expression=exp.Null())), copy=False)
    if where is not None:
        checked = row_condition(where.this, relation.scope(f"WHERE of subquery {name}"))
        body = body.where(exp.Paren(this=checked.sql), copy=False)
    body = body.group_by(unit.copy(), copy=False)
    item = exp.Subquery(this=body, alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))
    persons = next(s for s in relation.sources if s.alias == unit.table)  # a table, or a subquery's
    of = persons.policy or persons.persons_of
    source = Source(alias, frozenset({name.lower()}), name, False, tuple(columns), item, None, of)
    if condition is None:
        return source
    # HAVING keeps or drops a person's row by that person's own aggregates: the filter over the
    # hidden columns of the row, which the outer query never sees (one row per person, or none).
    try:
        checked = row_condition(condition, RowScope((source,), f"HAVING of subquery {name}"))
    except DPProxyError as error:  # its message names the aggregates as written, not their columns
        for hidden_name, aggregate in hidden:
            error.message = error.message.replace(
                exp.column(hidden_name, table=name.lower(), quoted=True).sql("postgres"),
                aggregate.sql("postgres"),
            )
        error.args = (error.message,)
        raise
    shown = columns[:visible]
    outputs = (exp.alias_(exp.column(c.name, table=alias, quoted=True), c.name, quoted=True) for c in shown)
    kept = exp.select(*outputs, copy=False)
    kept = kept.from_(item, copy=False).where(checked.sql, copy=False)
    filtered = exp.Subquery(this=kept, alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))
    return dataclasses.replace(source, columns=tuple(shown), item=filtered)


def _having_columns(
    condition: exp.Expression,
    name: str,
    relation: Relation,
    columns: Sequence[SourceColumn],
    aliases: Collection[str],
) -> tuple[exp.Expression, list[tuple[str, exp.Expression]]]:
    """A per-person subquery's HAVING over the person's row: each aggregate (with its FILTER, if any)
    read from a hidden column of that row, the privacy unit from its output column; and the hidden
    columns' names and aggregates. As in PostgreSQL, any other column must be in an aggregate, and
    an output alias is not a column there."""
    clause = f"HAVING of subquery {name}"
    scope = relation.scope(clause)
    hint = "repeat its expression, e.g. HAVING COUNT(*) > 5"
    hidden: list[tuple[str, exp.Expression]] = []
    taken = {c.name.lower() for c in columns}  # DuckDB and Spark match names whatever their case
    unit = next(c.name for c in columns if c.is_unit)

    def hide(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
            refuse_output_alias(node, aliases, relation.sources, clause, "in HAVING", hint)
            source, column = scope.resolve(node)
            if not column.is_unit:
                raise GroupingError(
                    f'column "{node.sql("postgres")}" must appear in the GROUP BY clause or be used in an '
                    f"aggregate function (HAVING of subquery {name})"
                )
            _check_person_column(source, relation, name)
            return exp.column(unit, table=name.lower(), quoted=True)
        if not (
            isinstance(node, exp.AggFunc)
            or (isinstance(node, exp.Filter) and isinstance(node.this, exp.AggFunc))
        ):
            return node
        number = len(hidden)
        while f"__having{number}" in taken:
            number += 1
        taken.add(f"__having{number}")
        hidden.append((f"__having{number}", node.copy()))
        return exp.column(f"__having{number}", table=name.lower(), quoted=True)

    return condition.copy().transform(hide), hidden


def _check_person_column(source: Source, relation: Relation, name: str) -> None:
    """A per-person subquery groups by the person of each row: a unit column of a table on the
    nullable side of a LEFT JOIN is NULL on the rows it leaves unmatched, which would then all be
    one person (and the rewrite, grouping by the relation's unit, would not match the SQL)."""
    if source.alias in relation.nullable:
        raise NotSupported(
            f'subquery {name} groups by the privacy unit of "{source.label}", which is on the nullable '
            "side of a LEFT JOIN",
            hint="group by the privacy unit of the table the LEFT JOIN starts from",
        )


def _derived_aggregate(
    node: exp.Expression, column_name: str, scope: RowScope, cap: int | None
) -> tuple[SourceColumn, exp.Expression]:
    """A per-person aggregate's column: its type, its bounds and its SQL. With ceilings (`cap`, the
    relation's max_rows_per_unit when bounds are chosen per query), a person's COUNT is at most the
    ceiling and their SUM at most what that many rows can add: clamped there, as the ceiling says no
    person has more rows (README, "Which aggregates may feed aggregates"). With fixed limits a
    COUNT or SUM has no upper bound until the outer query clamps it."""
    if not isinstance(node, (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)):
        raise NotSupported(
            f"{node.sql('postgres')} in a per-person subquery is not supported",
            hint=f"use {_DERIVED_AGGREGATES} over the person's rows",
        )
    arg = node.this
    if isinstance(node, exp.Count):
        if arg is None or isinstance(arg, exp.Star):
            sql: exp.Expression = exp.Count(this=exp.Star())
        elif isinstance(arg, exp.Distinct):
            checked = [row_expression(e, scope) for e in arg.expressions]
            sql = exp.Count(this=exp.Distinct(expressions=[c.sql for c in checked]))
        else:
            sql = exp.Count(this=row_expression(arg, scope).sql)
        if cap is None:
            return SourceColumn(column_name, PgType.INT8, Interval(Decimal(0), INFINITY)), sql
        capped = exp.Least(this=sql, expressions=[exp.Literal.number(cap)])
        return SourceColumn(column_name, PgType.INT8, Interval(Decimal(0), Decimal(cap))), capped
    if isinstance(arg, exp.Distinct):
        raise NotSupported(f"{node.key.upper()}(DISTINCT …) in a per-person subquery is not supported")
    typed = row_expression(arg, scope)
    if not typed.type.is_number and not isinstance(node, (exp.Min, exp.Max)):
        raise GroupingError(f"{node.key.upper()} needs a number: {arg.sql('postgres')}")
    if typed.uses_unit:
        raise PolicyViolation("the privacy unit cannot be aggregated")
    # A person's MIN or MAX of a column that may not be summed (an identifier: no bounds) is one of
    # its values, and may not be summed, averaged or ranked either; SUM and AVG of it are refused
    # here, as in the outer query (dpproxy.sql.aggregates).
    if isinstance(node, (exp.Sum, exp.Avg)):
        scope.check_summable(arg)
    scale = DEFAULT_GRID_SCALE if typed.type.is_float or typed.type is PgType.NUMERIC else 0
    fractional = scale > 0
    interval = typed.interval if typed.interval is not None and typed.interval.finite else None
    argument = typed.sql
    if typed.type.is_integer and isinstance(node, exp.Sum):
        # A sum of integers is a bigint on Spark (overflowing where PostgreSQL widens): widened there.
        argument = numbers.summable_integer(typed.sql)
    elif typed.type is PgType.NUMERIC and isinstance(node, (exp.Sum, exp.Avg)):
        # Whether a sum of decimals overflows (DuckDB's and Spark's 38 digits) must not depend on
        # the data: the bound alone has to keep it in range, however many rows the person has.
        if interval is None or interval.magnitude >= numbers.DECIMAL_SUM_LIMIT:
            raise NotSupported(
                f"{node.sql('postgres')} in a per-person subquery could overflow",
                hint=f"bound what it sums below {numbers.DECIMAL_SUM_LIMIT:.0f} in magnitude "
                "(declare tighter column bounds in the policy)",
            )
        argument = numbers.summable_decimal(typed.sql)
    if isinstance(node, exp.Sum):
        result = sum_result(typed.type)
        if cap is not None and interval is not None:
            reach = Interval(cap * min(interval.lo, Decimal(0)), cap * max(interval.hi, Decimal(0)))
            clamped = clip_sql(exp.Sum(this=argument), reach, result, double=result.is_float)
            return SourceColumn(column_name, result, reach, grid_scale=scale, fractional=fractional), clamped
        if interval is not None and interval.lo >= 0:
            interval = Interval(Decimal(0), INFINITY)
        elif interval is not None and interval.hi <= 0:
            interval = Interval(-INFINITY, Decimal(0))
        else:
            interval = None
        return SourceColumn(column_name, result, interval, grid_scale=scale, fractional=fractional), exp.Sum(
            this=argument
        )
    if isinstance(node, exp.Avg):
        return (
            SourceColumn(
                column_name, avg_result(typed.type), interval, grid_scale=scale, fractional=fractional
            ),
            exp.Avg(this=argument),
        )
    aggregate = exp.Min(this=typed.sql) if isinstance(node, exp.Min) else exp.Max(this=typed.sql)
    column = SourceColumn(
        column_name,
        typed.type,
        interval,
        summable=not scope.unsummable(arg),
        grid_scale=scale,
        fractional=fractional,
    )
    return column, aggregate
