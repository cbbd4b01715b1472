"""Exposed tables by name, and SQL over public tables only (run as written, no noise).

Used for queries that read public tables only, and for `… IN (SELECT col FROM public_table …)`
inside a private query: public data is fixed, so filtering by it adds no sensitivity. Such SQL
may call the functions listed here and nothing else (it runs on the backend as written, in the
backend's dialect: `backend_sql`).
"""

from __future__ import annotations

from sqlglot import exp

from dpproxy.errors import NotSupported, PolicyViolation
from dpproxy.policy import Policy, TablePolicy
from dpproxy.sql import numbers
from dpproxy.sql.names import check_database, check_schema, function_name, identifier_name, table_schemas

PUBLIC_FUNCTIONS: tuple[type[exp.Expression], ...] = (
    exp.Lower, exp.Upper, exp.Initcap, exp.Length, exp.Substring, exp.Trim, exp.Left, exp.Right,
    exp.Concat, exp.DPipe, exp.Replace, exp.StrPosition, exp.Abs, exp.Round, exp.Floor, exp.Ceil,
    exp.Sign, exp.Greatest, exp.Least, exp.Coalesce, exp.Nullif, exp.Cast, exp.TimestampTrunc,
    exp.DateTrunc, exp.Extract, exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max, exp.Stddev,
    exp.StddevPop, exp.StddevSamp, exp.Variance, exp.VariancePop, exp.Case, exp.If, exp.RowNumber,
    exp.Lag, exp.Lead, exp.First, exp.Last, exp.Mod, exp.Pow, exp.Sqrt,
)  # fmt: skip


def exposed_table(node: exp.Table, policy: Policy, database: str | None = None) -> TablePolicy:
    """The policy's table a FROM item names, or 42501 (the same answer whether or not it exists); a
    schema no exposed table is in is 3F000 and another database 0A000, as in PostgreSQL."""
    if not isinstance(node.this, exp.Identifier):
        # generate_series(…), unnest(…) and other set-returning functions parse as tables.
        raise NotSupported(
            f"table functions such as {node.this.sql('postgres')} are not supported in FROM",
            hint="read tables of the policy",
        )
    name = node.name if node.this.quoted else node.name.lower()
    schema = node.args.get("db")
    catalog = node.args.get("catalog")
    if catalog is not None:  # spelled only then: this runs for every table of every statement
        check_database(catalog, node.sql("postgres"), database)
    check_schema(schema, policy)
    table = policy.table(name)
    if table is None or (schema is not None and identifier_name(schema) not in table_schemas(table)):
        exposed = ", ".join(t.name for t in policy.tables) or "none"
        written = ".".join(p.name for p in (schema, node.this) if p is not None)
        raise PolicyViolation(
            f'table "{written}" is not exposed by the policy',
            hint=f"exposed tables: {exposed}",
        )
    return table


def check_public_sql(tree: exp.Expression, policy: Policy) -> None:
    """Refuse anything but reads of public tables with allowed functions."""
    for node in tree.walk():
        if isinstance(node, exp.Table) and isinstance(node.parent, (exp.From, exp.Join)):
            table = exposed_table(node, policy)
            if not table.public:
                raise NotSupported(
                    f'a subquery may only read public tables; "{table.name}" is protected',
                    hint="join protected tables on their privacy unit instead",
                )
        elif isinstance(node, exp.Func) and not isinstance(node, (*PUBLIC_FUNCTIONS, exp.Connector)):
            # (AND, OR and XOR are Func nodes in sqlglot, not functions.)
            name = function_name(node)
            raise NotSupported(
                f"function {name}() is not supported", hint="query public tables with plain SQL"
            )
        elif isinstance(node, (exp.Into, exp.Lock)):
            raise PolicyViolation("SELECT INTO and row locks are not allowed")


def physical_tables(tree: exp.Expression, policy: Policy) -> exp.Expression:
    """A copy whose table references name the backing database's schema where the policy gives one."""
    tree = tree.copy()
    for node in tree.find_all(exp.Table):
        if isinstance(node.parent, (exp.From, exp.Join)):
            table = exposed_table(node, policy)
            node.set("db", exp.to_identifier(table.schema, quoted=True) if table.schema else None)
    return tree


def backend_sql(tree: exp.Expression, dialect: str) -> str:
    """The SQL text a public query runs as on a backend of `dialect` (`tree` typed by
    annotate_types, as analyze_public leaves it). On Spark, spelled with PostgreSQL's meaning where
    the transpiled text would change it: a quotient of integers is integer division (`DIV`), a cast
    of a non-integer to an integer type rounds (half away from zero) instead of truncating, and the
    spellings of `numbers.emit` (timestamp types, extract fields, NULL conditions)."""
    if dialect != "spark":
        return tree.sql(dialect)
    tree = tree.copy()
    for node in list(tree.find_all(exp.Div)):
        integers = all(_typed(side, exp.DataType.INTEGER_TYPES) for side in (node.this, node.expression))
        node.set("typed", integers)
    for node in list(tree.find_all(exp.Cast)):
        if node.to.is_type(*exp.DataType.INTEGER_TYPES) and _typed(node.this, exp.DataType.REAL_TYPES):
            node.set("this", exp.Round(this=node.this, decimals=exp.Literal.number(0)))
    return numbers.emit(tree, "spark")


def _typed(node: exp.Expression, kinds: set[exp.DataType.Type]) -> bool:
    return node.type is not None and node.type.is_type(*kinds)
