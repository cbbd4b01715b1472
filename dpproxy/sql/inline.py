"""Inline CTEs and row-level FROM-subqueries, so a private query reads base tables through joins.

    WITH v AS (SELECT patient_id, cost * 2 AS c2 FROM visits WHERE cost > 10)
    SELECT COUNT(*) FROM v a JOIN v b ON a.patient_id = b.patient_id WHERE a.c2 > 3
    becomes
    SELECT COUNT(*) FROM visits AS a__1 JOIN visits AS b__1 ON a__1.patient_id = b__1.patient_id
    WHERE (a__1.cost > 10) AND (b__1.cost > 10) AND a__1.cost * 2 > 3

A subquery is inlined when it is a row-level transformation: one SELECT with no aggregate, GROUP
BY, DISTINCT, window, ORDER BY or LIMIT, reading tables (and further inlinable subqueries) through
inner joins. Each use of a CTE is inlined separately, with fresh aliases, so a CTE may be used
twice (a self-join). Subqueries that group by something (per-unit aggregates) are left in place:
the analyzer treats them as derived sources. Nothing here consults the policy; the analyzer checks
what results. Pure function over sqlglot trees.
"""

from __future__ import annotations

from sqlglot import exp

from dpproxy.errors import NotSupported, UndefinedColumn, UndefinedTable


class _FreshNames:
    """Fresh table aliases for one statement: `alias__n`, n counted from 1 within the statement and
    skipping names it already uses, so that the same text is always inlined the same way (an analysis
    is a function of its input: nothing of other statements shows in its names)."""

    def __init__(self, tree: exp.Expression) -> None:
        self._used = {
            name.lower()
            for node in tree.find_all(exp.Table, exp.TableAlias)
            for name in (node.name, node.alias_or_name if isinstance(node, exp.Table) else "")
            if name
        }
        self._next = 1

    def __call__(self, alias: str) -> str:
        while True:
            name = f"{alias}__{self._next}"
            self._next += 1
            if name.lower() not in self._used:
                self._used.add(name.lower())
                return name


def inline(tree: exp.Select) -> exp.Select:
    """Return a copy of `tree` with its CTEs and row-level FROM-subqueries inlined."""
    expanded = expand_ctes(tree)
    inlined = _inline_from(expanded, _FreshNames(expanded))
    _refuse_column_aliases(inlined)
    return inlined


def _refuse_column_aliases(tree: exp.Expression) -> None:
    """Column alias lists that inlining did not apply (`FROM t AS x(a, b)`, an aggregating subquery's
    `AS q(a, b)`): read as if absent they would silently name other columns."""
    for alias in tree.find_all(exp.TableAlias):
        if alias.columns and isinstance(alias.parent, (exp.Table, exp.Subquery)):
            written = alias.sql("postgres")
            raise NotSupported(
                f"column alias lists such as {written} are not supported on a table or an aggregating "
                "subquery",
                hint="name the columns inside a subquery with AS, e.g. (SELECT a AS x FROM t) AS s",
            )


def expand_ctes(tree: exp.Expression) -> exp.Expression:
    """A copy of `tree` whose CTE references (in FROM and JOIN, at any depth) are replaced by their
    bodies as aliased subqueries, and without its WITH clause."""
    tree = tree.copy()
    with_ = tree.args.get("with_") or tree.args.get("with")
    ctes: dict[str, exp.Expression] = {}
    if with_ is not None:
        if with_.args.get("recursive"):
            raise NotSupported("WITH RECURSIVE is not supported", hint="write the CTE without recursion")
        for cte in with_.expressions:
            body = cte.this
            if not isinstance(body, exp.Select):
                raise NotSupported(
                    f"CTE {cte.alias} must be a single SELECT",
                    hint="set operations are not supported in CTEs",
                )
            # Earlier CTEs may be used by later ones.
            body = _replace_cte_references(body, ctes)
            names = cte.args["alias"].columns if cte.args.get("alias") is not None else []
            ctes[cte.alias.lower()] = _renamed(body, [n.name for n in names], cte.alias)
        tree.set("with_", None)
        tree.set("with", None)
    return _replace_cte_references(tree, ctes)


def _renamed(body: exp.Select, names: list[str], alias: str) -> exp.Select:
    """`body` with its first len(names) output columns renamed by position (a column alias list
    such as `WITH c(a, b) AS …` or `(…) AS q(a, b)`), as PostgreSQL applies one."""
    if not names:
        return body
    items = body.expressions
    if len(names) > len(items) or any(isinstance(i, exp.Star) or i.find(exp.Star) for i in items):
        raise NotSupported(
            f"{alias} names {len(names)} columns, but its SELECT list has {len(items)}"
            if len(names) > len(items)
            else f"a column alias list on {alias} needs its SELECT list written out",
            hint="name each column inside the subquery with AS",
        )
    body = body.copy()
    items = body.expressions
    # names is at most as long as items (checked above)
    renamed = [
        exp.alias_(i.this if isinstance(i, exp.Alias) else i, n, quoted=True)
        for i, n in zip(items, names, strict=False)
    ]
    body.set("expressions", [*renamed, *items[len(names) :]])
    return body


def _replace_cte_references(tree: exp.Expression, ctes: dict[str, exp.Expression]) -> exp.Expression:
    if not ctes:
        return tree
    tree = tree.copy()
    for table in list(tree.find_all(exp.Table)):
        name = table.name.lower()
        if table.args.get("db") is None and name in ctes and isinstance(table.parent, (exp.From, exp.Join)):
            alias = table.alias_or_name
            # The reference's own column list wins over the CTE's (both rename by position).
            written = table.args.get("alias")
            columns = [c.copy() for c in (written.columns if written is not None and written.columns else [])]
            table.replace(
                exp.Subquery(
                    this=ctes[name].copy(),
                    alias=exp.TableAlias(this=exp.to_identifier(alias), columns=columns or None),
                )
            )
    return tree


def is_row_level(select: exp.Expression) -> bool:
    """One SELECT without aggregation, grouping, distinct, windows, ordering or limits."""
    if not isinstance(select, exp.Select):
        return False
    for key in (
        "group",
        "having",
        "distinct",
        "order",
        "limit",
        "offset",
        "qualify",
        "windows",
        "with_",
        "with",
    ):
        if select.args.get(key):
            return False
    if select.find(exp.Window):
        return False
    return not any(isinstance(node, exp.AggFunc) for node in _own_nodes(select))


def _own_nodes(select: exp.Select):
    """Nodes of the select list and WHERE of this SELECT, not of nested subqueries."""
    for part in [*select.expressions, select.args.get("where")]:
        if part is None:
            continue
        for node in part.walk():
            if isinstance(node, (exp.Subquery, exp.Select)) and node is not part:
                continue
            yield node


def _inline_from(select: exp.Select, fresh: _FreshNames) -> exp.Select:
    """Inline the row-level subqueries of this SELECT's FROM and JOINs (recursively)."""
    from_ = select.args.get("from_") or select.args.get("from")
    if from_ is None:
        return select
    # Inline inside subqueries first, so that nested ones are flattened bottom-up.
    for node in [from_.this, *(j.this for j in select.args.get("joins") or [])]:
        if isinstance(node, exp.Subquery) and isinstance(node.this, exp.Select):
            node.set("this", _inline_from(node.this, fresh))
    # One subquery at a time: each merge rewrites the outer query, so re-read it afterwards.
    while True:
        from_ = select.args.get("from_") or select.args.get("from")
        if isinstance(from_.this, exp.Subquery) and is_row_level(from_.this.this):
            base, extra_joins, where = _flatten(select, from_.this, fresh)
            joins = list(select.args.get("joins") or [])
            select.set("from_", exp.From(this=base))
            select.set("joins", [*extra_joins, *joins] or None)
            if where is not None:
                _and_where(select, where)
            continue
        joins = list(select.args.get("joins") or [])
        for i, join in enumerate(joins):
            node = join.this
            if not (isinstance(node, exp.Subquery) and is_row_level(node.this)):
                continue
            if join.args.get("side") or join.args.get("kind") not in (None, "", "INNER"):
                raise NotSupported(
                    "only inner joins to subqueries are supported",
                    hint="filter inside the subquery, or join the table directly",
                )
            if join.args.get("using"):
                raise NotSupported("JOIN … USING a subquery is not supported", hint="write JOIN … ON")
            first, extra_joins, where = _flatten(select, node, fresh)
            joins = list(select.args.get("joins") or [])  # the merge rewrote this join's ON
            parts = [p for p in (joins[i].args.get("on"), where) if p is not None]
            merged = exp.Join(this=first, on=exp.and_(*parts) if parts else None)
            select.set("joins", [*joins[:i], merged, *extra_joins, *joins[i + 1 :]])
            break
        else:
            return select


# PostgreSQL's set-returning functions that sqlglot parses as plain function calls (beside those
# _SYSTEM_PREFIXES names: json_each, pg_ls_dir, ts_parse, …).
_SET_RETURNING = frozenset(
    {
        "generate_series",
        "generate_subscripts",
        "unnest",
        "regexp_matches",
        "regexp_split_to_table",
        "string_to_table",
        "txid_snapshot_xip",
        "aclexplode",
    }
)
# System functions (catalog, files, settings, sessions) many of which return sets.
_SYSTEM_PREFIXES = ("pg_", "ts_", "json")


def _set_returning(item: exp.Expression) -> str | None:
    """The name of a set-returning (or system) function `item` calls outside nested subqueries, if
    any. A deny-list: what it misses is a user-defined SETOF function, which no private query may
    call where it is read either."""
    for node in item.walk():
        if isinstance(node, (exp.Subquery, exp.Select)) and node is not item:
            continue
        if isinstance(node, (exp.Explode, exp.Unnest)):
            return "unnest"
        if type(node).__name__ in ("GenerateSeries", "ExplodingGenerateSeries"):
            return "generate_series"
        if isinstance(node, exp.Anonymous):
            name = str(node.this).lower()
            if name in _SET_RETURNING or name.startswith(_SYSTEM_PREFIXES):
                return name
    return None


def _and_where(select: exp.Select, condition: exp.Expression) -> None:
    where = select.args.get("where")
    parts = [condition, where.this] if where is not None else [condition]
    select.set("where", exp.Where(this=exp.and_(*[exp.Paren(this=p) for p in parts])))


def _flatten(
    outer: exp.Select, subquery: exp.Subquery, fresh: _FreshNames
) -> tuple[exp.Expression, list[exp.Join], exp.Expression | None]:
    """Merge a row-level subquery into `outer`: its FROM item, its joins, its WHERE (renamed), and
    every outer reference alias.col replaced by the subquery's expression for col."""
    alias = subquery.alias
    if not alias:
        raise NotSupported("a subquery in FROM needs an alias", hint="write (SELECT …) AS name")
    written = subquery.args["alias"]
    inner: exp.Select = _renamed(subquery.this, [c.name for c in written.columns or []], alias)
    if written.columns:
        written.set("columns", None)
    inner_from = inner.args.get("from_") or inner.args.get("from")
    if inner_from is None:
        raise NotSupported(f"subquery {alias} reads no table")
    if any(
        isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star))
        for item in inner.expressions
    ):
        raise NotSupported(
            f"SELECT * inside subquery {alias} is not supported",
            hint="list the columns the outer query needs",
        )
    # Fresh aliases for the subquery's own tables, so that two uses never collide.
    renames: dict[str, str] = {}
    items = [inner_from.this, *(j.this for j in inner.args.get("joins") or [])]
    for item in items:
        if isinstance(item, exp.Subquery):
            raise NotSupported(
                f"subquery {alias} reads a subquery that aggregates", hint="aggregate in the outer query"
            )
        old = item.alias_or_name
        new = fresh(old)
        renames[old.lower()] = new
        item.set("alias", exp.TableAlias(this=exp.to_identifier(new)))
    only_table = next(iter(renames.values())) if len(renames) == 1 else None

    def rename(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column):
            qualifier = node.table.lower() if node.table else ""
            if qualifier in renames:
                return exp.column(node.name, table=renames[qualifier], quoted=node.this.quoted)
            if qualifier:
                # As in PostgreSQL: a subquery in FROM cannot see the tables beside it (no LATERAL).
                raise UndefinedTable(
                    f'invalid reference to FROM-clause entry for table "{node.table}" in subquery {alias}',
                    hint="a subquery in FROM reads only its own tables; move the condition to the outer "
                    "WHERE or ON",
                )
            if only_table is not None:
                return exp.column(node.name, table=only_table, quoted=node.this.quoted)
            if not qualifier:
                raise NotSupported(
                    f"qualify column {node.name} inside subquery {alias}: it reads several tables",
                    hint="write table.column",
                )
        return node

    projections: dict[str, exp.Expression] = {}
    for item in inner.expressions:
        # Columns the outer query never reads are not analysed, but one that returns a set would
        # multiply the subquery's rows in PostgreSQL: the answer would be another one.
        returning_sets = _set_returning(item)
        if returning_sets is not None:
            raise NotSupported(
                f"{returning_sets}() in the select list of subquery {alias} is not supported: "
                "set-returning and system functions are not, even in a column the outer query does "
                "not read (a set multiplies the rows)",
                hint="drop the column, or aggregate the values without a set-returning function",
            )
        name = item.alias_or_name.lower()
        expression = item.this if isinstance(item, exp.Alias) else item
        projections[name] = expression.transform(rename)
    for join in inner.args.get("joins") or []:
        if join.args.get("on") is not None:
            join.set("on", join.args["on"].transform(rename))
    where = inner.args.get("where")
    where_sql = where.this.transform(rename) if where is not None else None

    # Unqualified outer columns mean the subquery's when it is the only thing the outer query reads.
    alone = not (outer.args.get("joins") or [])

    def substitute(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
            qualifier = node.table.lower() if node.table else None
            if qualifier == alias.lower() or (qualifier is None and alone):
                name = node.name.lower()
                if name not in projections:
                    raise UndefinedColumn(
                        f'subquery {alias} has no column "{node.name}"',
                        hint=f"its columns: {', '.join(projections)}",
                    )
                return exp.Paren(this=projections[name].copy())
        return node

    # A bare column of the select list keeps its name once replaced by an expression.
    outer.set(
        "expressions",
        [
            exp.alias_(item.transform(substitute), item.name, quoted=item.this.quoted)
            if isinstance(item, exp.Column) and not isinstance(item.this, exp.Star)
            else item.transform(substitute)
            for item in outer.expressions
        ],
    )
    # As in PostgreSQL, a bare name in ORDER BY means an output column first (Superset orders a
    # virtual dataset by `"AVG(income)"`), and in GROUP BY an input column first, then an output one.
    # Such a reference stays as written: the analyzer resolves it against the select list.
    outputs = {item.alias.lower() for item in outer.expressions if isinstance(item, exp.Alias)}

    def output_name(node: exp.Expression, *, input_first: bool) -> bool:
        if not isinstance(node, exp.Column) or node.table or isinstance(node.this, exp.Star):
            return False
        name = node.name.lower()
        return name in outputs and not (input_first and name in projections)

    order = outer.args.get("order")
    if order is not None:
        for ordered in order.expressions:
            if not output_name(ordered.this, input_first=False):
                ordered.set("this", ordered.this.transform(substitute))
    group = outer.args.get("group")
    if group is not None:
        group.set(
            "expressions",
            [
                key if output_name(key, input_first=True) else key.transform(substitute)
                for key in group.expressions
            ],
        )
    for key in ("where", "having", "joins"):
        value = outer.args.get(key)
        if value is None:
            continue
        if isinstance(value, list):
            outer.set(key, [v.transform(substitute) for v in value])
        else:
            outer.set(key, value.transform(substitute))
    return inner_from.this, list(inner.args.get("joins") or []), where_sql
