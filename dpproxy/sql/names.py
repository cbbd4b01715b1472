"""Qualified names, resolved as PostgreSQL resolves them, to the short forms the analyzer reads.

PostgreSQL accepts a table as `t`, `s.t` or `db.s.t` and a column as `col`, `t.col`, `s.t.col` or
`db.s.t.col` (BI tools such as Metabase qualify every column). `qualify_names` checks every such
name against the FROM items it can see — the database must be the served one, the schema one the
table is exposed in, the table one of the FROM clause under its own name (not hidden by an alias) —
and returns a copy where tables are `t` or `s.t` and columns `col` or `t.col`, so that a qualified
statement means, and is rewritten to, exactly what its unqualified form is.

Nothing here reads data or the backend: the names come from the query text and the policy.
"""

from __future__ import annotations

from sqlglot import exp

from dpproxy.errors import InvalidSchema, NotSupported, UndefinedTable
from dpproxy.policy import Policy, TablePolicy

# The schema under which exposed tables are listed in the shadow catalog (and may be qualified).
EXPOSED_SCHEMA = "public"


def identifier_name(node: exp.Expression | None) -> str:
    """An identifier as PostgreSQL folds it: unquoted names in lower case."""
    if isinstance(node, exp.Identifier):
        return node.name if node.quoted else node.name.lower()
    return node.name.lower() if node is not None else ""


def check_database(catalog: exp.Expression | None, written: str, database: str | None) -> None:
    """A database qualifier must name the served database (`current_database()`); PostgreSQL answers
    any other with 0A000. With `database` unknown (no session), any name is taken as the served one."""
    if catalog is None:
        return
    name = identifier_name(catalog)
    if database is not None and name != database:
        raise NotSupported(
            f"cross-database references are not implemented: {written}",
            hint=f'this server serves the database "{database}": qualify names with it, or leave it out',
        )


def table_schemas(table: TablePolicy) -> frozenset[str]:
    """The schemas a policy's table may be qualified with."""
    return frozenset({EXPOSED_SCHEMA} | ({table.schema} if table.schema else set()))


def exposed_schemas(policy: Policy) -> frozenset[str]:
    return frozenset(s for t in policy.tables for s in table_schemas(t))


def check_schema(schema: exp.Expression | None, policy: Policy) -> None:
    """A schema qualifier must name a schema the shadow catalog shows: else 3F000, as PostgreSQL."""
    if schema is None:
        return
    name = identifier_name(schema)
    known = exposed_schemas(policy)
    if name not in known:
        raise InvalidSchema(
            f'schema "{name}" does not exist',
            hint=f"exposed tables are in schema {', '.join(sorted(known))}",
        )


def qualify_names(tree: exp.Expression, policy: Policy, database: str | None = None) -> exp.Expression:
    """A copy of `tree` whose tables are `t` or `s.t` and whose columns are `col` or `t.col` (see the
    module docstring); the same tree when nothing is qualified beyond that."""
    if not any(
        isinstance(n, (exp.Table, exp.Column))
        and (n.args.get("catalog") or (isinstance(n, exp.Column) and n.args.get("db")))
        for n in tree.walk()
    ):
        return tree
    tree = tree.copy()
    for node in list(tree.find_all(exp.Table)):
        catalog = node.args.get("catalog")
        if catalog is not None:
            check_database(catalog, _written(node), database)
            node.set("catalog", None)
    for node in list(tree.find_all(exp.Column)):
        if node.args.get("db") is None and node.args.get("catalog") is None:
            continue
        written = _written(node)
        check_database(node.args.get("catalog"), written, database)
        _column_table(node, policy, written)
        node.set("catalog", None)
        node.set("db", None)
    return tree


def _written(node: exp.Expression) -> str:
    parts = [node.args.get(k) for k in ("catalog", "db", "table", "this")]
    return ".".join(p.sql("postgres") for p in parts if p is not None)


def _column_table(node: exp.Column, policy: Policy, written: str) -> None:
    """Check that `s.t` of `s.t.col` is a FROM item visible where the column stands (this query's or
    an enclosing one's), named by its table name with no alias, in schema `s`."""
    schema = identifier_name(node.args.get("db"))
    table = identifier_name(node.args.get("table"))
    aliased: list[str] = []
    named: set[str] = set()  # the schemas of FROM items of that name, when `s` is not one of them
    select = node.find_ancestor(exp.Select)
    while select is not None:
        for item in _from_items(select):
            if not isinstance(item, exp.Table) or identifier_name(item.this) != table:
                continue
            found = policy.table(table)
            if found is None:
                return  # not a table of the policy: reading it is refused as such
            item_schema = identifier_name(item.args.get("db")) if item.args.get("db") else None
            schemas = table_schemas(found) if found is not None else frozenset()
            if item_schema is not None:
                schemas = schemas & {item_schema}
            if schema not in schemas:
                named.update(schemas)
                continue
            if item.args.get("alias") is not None:
                aliased.append(item.alias)
                continue
            return
        select = select.find_ancestor(exp.Select)
    if aliased:
        raise UndefinedTable(
            f'invalid reference to FROM-clause entry for table "{table}" ({written})',
            hint=f'Perhaps you meant to reference the table alias "{aliased[0]}".',
        )
    if named:
        hint = f'"{table}" is in schema {", ".join(sorted(named))}: write {table}.{node.name}'
    else:
        hint = f'add "{table}" to the FROM clause, or qualify the column with a table the query reads'
    raise UndefinedTable(f'missing FROM-clause entry for table "{table}" ({written})', hint=hint)


def _from_items(select: exp.Select) -> list[exp.Expression]:
    from_ = select.args.get("from_") or select.args.get("from")
    items = [from_.this] if from_ is not None else []
    items += [join.this for join in select.args.get("joins") or []]
    return items


def function_name(node: exp.Expression) -> str:
    """A function's name as PostgreSQL spells it, for messages: sqlglot's internal names
    (str_to_date for to_date, unix_to_time for to_timestamp) are never shown to a user."""
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    text = node.sql("postgres")
    head = text.split("(", 1)[0].strip()
    if head and all(c.isalnum() or c in "_." for c in head):
        return head.lower()
    return node.sql_name().lower()
