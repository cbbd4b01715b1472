"""What a statement means, written plainly before the analyzer reads it: functions of constants folded
into constants (to_date, to_timestamp: dpproxy.sql.datetimes; now(), current_date and constant date
and interval arithmetic: dpproxy.sql.clock), and `agg(…) FILTER (WHERE cond)` written as the
aggregate of a CASE, which PostgreSQL computes alike:

    COUNT(*) FILTER (WHERE c)                 →  COUNT(CASE WHEN c THEN 1 END)
    SUM(x) FILTER (WHERE c)                   →  SUM(CASE WHEN c THEN x END)
    COUNT(DISTINCT x) FILTER (WHERE c)        →  COUNT(DISTINCT CASE WHEN c THEN x END)
    percentile_cont(f) WITHIN GROUP (ORDER BY x) FILTER (WHERE c)
        →  percentile_cont(f) WITHIN GROUP (ORDER BY CASE WHEN c THEN x END)

Every aggregate dpproxy answers ignores NULL arguments, and a row where `c` is not true gives NULL,
so each is the aggregate over the rows where `c` holds. The analyzer then checks the rewritten
statement as if the user had written it: the rewrite grants nothing. Text only; nothing here runs SQL.
"""

from __future__ import annotations

from sqlglot import exp

from dpproxy.errors import NotSupported
from dpproxy.sql.clock import fold_clock
from dpproxy.sql.datetimes import fold_constant_calls


def fold_constants(tree: exp.Expression) -> exp.Expression:
    """The statement with functions of constants folded and aggregate FILTERs rewritten."""
    return rewrite_filters(fold_clock(fold_constant_calls(tree)))


def rewrite_filters(tree: exp.Expression) -> exp.Expression:
    """`agg(…) FILTER (WHERE cond)` as `agg(CASE WHEN cond THEN … END)` (the module docstring)."""
    if not any(isinstance(n, exp.Filter) for n in tree.walk()):
        return tree
    return tree.transform(_rewrite_filter, copy=True)


def _when(condition: exp.Expression, value: exp.Expression) -> exp.Expression:
    return exp.Case(ifs=[exp.If(this=exp.Paren(this=condition.copy()), true=value)])


def _rewrite_filter(node: exp.Expression) -> exp.Expression:
    if not isinstance(node, exp.Filter):
        return node
    where = node.expression
    condition = where.this if isinstance(where, exp.Where) else where
    call = node.this.copy()
    function = call.this if isinstance(call, exp.WithinGroup) else call
    if isinstance(call, exp.WithinGroup):
        order = call.expression
        keys = order.expressions if isinstance(order, exp.Order) else []
        for key in keys:
            key.set("this", _when(condition, key.this))
        return call
    if not isinstance(function, exp.AggFunc):
        raise NotSupported(
            f"FILTER (WHERE …) applies to aggregate functions only, not {function.sql('postgres')}",
            hint="write the condition in the aggregate: SUM(CASE WHEN … THEN x END)",
        )
    argument = function.this
    if isinstance(function, exp.Count) and (argument is None or isinstance(argument, exp.Star)):
        function.set("this", _when(condition, exp.Literal.number(1)))
        return call
    if isinstance(argument, exp.Distinct):
        values = argument.expressions
        if len(values) != 1:
            raise NotSupported("FILTER on an aggregate of several DISTINCT expressions is not supported")
        values[0].replace(_when(condition, values[0].copy()))
        return call
    if argument is None or function.expressions:
        name = function.sql_name() if hasattr(function, "sql_name") else function.key
        raise NotSupported(
            f"FILTER (WHERE …) on {name} with these arguments is not supported",
            hint="write the condition in the aggregate: SUM(CASE WHEN … THEN x END)",
        )
    function.set("this", _when(condition, argument))
    return call
