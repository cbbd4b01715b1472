"""Names and limits of a statement's select list, as PostgreSQL gives them: an output column's name,
GROUP BY / ORDER BY positions, LIMIT and OFFSET constants. Text only."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from sqlglot import exp

from dpproxy.errors import DPProxyError, InvalidParameter, NotSupported, SyntaxProblem
from dpproxy.sql.names import function_name
from dpproxy.sql.rowexpr import constant_value
from dpproxy.sql.types import PgType, from_sqlglot


def select_position(node: exp.Literal, clause: str) -> int:
    """A select-list position in GROUP BY or ORDER BY (a bound parameter is a value, not a position:
    bind_parameters writes numbers in parentheses)."""
    if not node.this.isdigit():
        raise SyntaxProblem(
            f"non-integer constant in {clause}: {node.this}", hint=f"{clause} takes positions 1, 2, …"
        )
    return int(node.this)


def limit_of(tree: exp.Select, key: str) -> int | None:
    node = tree.args.get(key)
    if node is None:
        return None
    if isinstance(node, exp.Fetch):  # FETCH FIRST n ROWS ONLY (SQL's spelling of LIMIT; n is 1 if left out)
        options = node.args.get("limit_options")
        if options is not None and (options.args.get("with_ties") or options.args.get("percent")):
            raise NotSupported("FETCH … WITH TIES and FETCH … PERCENT are not supported", hint="use LIMIT n")
        node = node.args.get("count") or exp.Literal.number(1)
    value_node = node.expression if isinstance(node, (exp.Limit, exp.Offset)) else node
    if isinstance(value_node, exp.Null):
        return None
    try:
        number = constant_value(value_node)
    except DPProxyError:
        number = None
    if not isinstance(number, Decimal) or number != number.to_integral_value() or number < 0:
        raise InvalidParameter(f"{key.upper()} must be a non-negative integer constant")
    return int(number)


def repeated_name(names: Iterable[str]) -> str | None:
    """The first name that comes again in `names` (None: each comes once): a table's two columns of
    one name cannot be told apart."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def output_name(item: exp.Expression) -> str:
    """The column name PostgreSQL would give a select-list item."""
    if isinstance(item, exp.Alias):
        return item.alias
    node = item
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Cast):
        inner = node.this
        if isinstance(inner, (exp.Column, exp.Func)):
            return output_name(inner)
        target = from_sqlglot(node.args["to"])
        return {
            PgType.INT4: "int4",
            PgType.INT8: "int8",
            PgType.FLOAT8: "float8",
            PgType.NUMERIC: "numeric",
            PgType.TEXT: "text",
        }.get(target, "?column?")
    if isinstance(node, exp.Column):
        return node.name
    if isinstance(node, exp.Window):  # SUM(n) OVER (), RANK() OVER (…): named after the function
        return output_name(node.this)
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    if isinstance(node, exp.WithinGroup):
        return {
            exp.PercentileCont: "percentile_cont",
            exp.PercentileDisc: "percentile_disc",
            exp.Mode: "mode",
        }.get(type(node.this), "?column?")
    if isinstance(node, exp.Func):
        names = {
            exp.Count: "count",
            exp.Sum: "sum",
            exp.Avg: "avg",
            exp.Ceil: "ceil",
            exp.Length: "length",
            exp.Substring: "substring",
            exp.TimestampTrunc: "date_trunc",
            exp.Extract: "extract",
            exp.VariancePop: "var_pop",
            exp.Variance: "var_samp",
            exp.StddevPop: "stddev_pop",
            exp.StddevSamp: "stddev_samp",
            exp.Stddev: "stddev",
        }
        return names.get(type(node), function_name(node))
    if isinstance(node, exp.Boolean):
        return "bool"
    return "?column?"
