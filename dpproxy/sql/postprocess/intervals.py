"""`dp_interval_low(x)` and `dp_interval_high(x)` (Snowflake's names): the ends of a released
aggregate's 95% interval, as values of the answer, for clients that never see a NOTICE.

The analyzer (dpproxy.sql.private) checks the call and replaces it by its argument over a placeholder
for one end of one aggregate's interval: `dp_interval_low(ROUND(AVG(x), 1))` becomes
`ROUND("__low_0", 1)`. The argument is an aggregate of the same SELECT as written, or the output
alias of one (Snowflake's form), optionally under parentheses, CASTs to number types and ROUND with
an integer constant: each is monotone non-decreasing, so the same transformation of the ends of an
interval holding the aggregate bounds the transformed aggregate. The release computes each end a
query reads from released values and released ± only (dpproxy.release.aggregates), and the
post-processing reads those columns after the aggregates' (dpproxy.release.post_processing).

Everything here depends on the query text only. Text only: nothing here runs SQL or sees a value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from sqlglot import exp

from dpproxy.errors import GroupingError, NotSupported, UndefinedFunction
from dpproxy.sql.query import PostProcessing
from dpproxy.sql.types import PgType, from_sqlglot

# The functions and the end of the interval each returns.
INTERVAL_FUNCTIONS = {"dp_interval_low": "low", "dp_interval_high": "high"}

_PLACEHOLDER = re.compile(r"__(low|high)_(\d+)")

_FORMS = (
    "an aggregate of the same SELECT (COUNT(*), SUM(x), AVG(x), VAR/STDDEV), or its output alias, "
    "optionally under CAST to a number type or ROUND(…, n)"
)


def interval_end(node: exp.Expression) -> str | None:
    """The end ("low" or "high") a call of dp_interval_low / dp_interval_high returns, else None."""
    if isinstance(node, exp.Anonymous) and isinstance(node.this, str):
        return INTERVAL_FUNCTIONS.get(node.this.lower())
    return None


def interval_placeholder(aggregate: int, end: str) -> exp.Column:
    """The placeholder of one end ("low" or "high") of aggregate `aggregate`'s interval."""
    return exp.column(slot_name(aggregate, end), quoted=True)


def slot_name(aggregate: int, end: str) -> str:
    return f"__{end}_{aggregate}"


def interval_types(aggregate_types: Sequence[PgType]) -> dict[str, PgType]:
    """Each interval end's placeholder and its type: the aggregate's result type."""
    return {slot_name(a, end): t for a, t in enumerate(aggregate_types) for end in ("low", "high")}


def interval_slots(post: PostProcessing) -> tuple[tuple[int, str], ...]:
    """The interval ends a query's post-processing reads, as (aggregate, end), in a fixed order: the
    release computes these columns, in this order, after the aggregates' own."""
    expressions = [o.expression for o in post.outputs]
    expressions += [k.expression for k in post.order_by]
    if post.having is not None:
        expressions.append(post.having)
    found = set()
    for expression in expressions:
        for column in expression.find_all(exp.Column):
            match = _PLACEHOLDER.fullmatch(column.name)
            if match is not None:
                found.add((int(match[2]), match[1]))
    return tuple(sorted(found))


def function_written(call: exp.Expression) -> str:
    """A call as the analyst wrote it, with its function name in lower case (sqlglot's own spelling
    of the arguments, which keeps MEDIAN a MEDIAN)."""
    assert isinstance(call, exp.Anonymous)
    arguments = ", ".join(a.sql() for a in call.expressions)
    return f"{call.this.lower()}({arguments})"


def interval_argument(
    call: exp.Anonymous, output_alias: Callable[[exp.Column], exp.Expression | None]
) -> exp.Expression:
    """The argument of a dp_interval_* call, as written, with an output alias replaced by its
    expression (`output_alias`: the select-list expression a bare column names, if it names one
    and no input column); refused unless it is an aggregate under monotone forms only (_FORMS)."""
    written = function_written(call)
    name = call.this.lower()
    if len(call.expressions) != 1:
        raise UndefinedFunction(
            f"function {written} does not exist: {name}() takes one argument",
            hint=f"write {name}(COUNT(*)), with {_FORMS}",
        )
    argument = call.expressions[0].copy()
    core = _core(argument)
    if isinstance(core, exp.Column):
        target = output_alias(core)
        if target is not None:
            if core is argument:
                argument = target.copy()
            else:
                core.replace(target.copy())
            core = _core(argument)
    if not isinstance(core, (exp.AggFunc, exp.WithinGroup, exp.Filter)):
        raise NotSupported(
            f"{written}: the argument is not a released aggregate; {name}() takes {_FORMS}",
            hint=f"apply other arithmetic outside it, e.g. {name}(COUNT(*)) + 1",
        )
    return argument


def _core(node: exp.Expression) -> exp.Expression:
    """The node under the monotone forms around it (the first node that is not one of them)."""
    while _monotone(node):
        node = node.this
    return node


def _monotone(node: exp.Expression) -> bool:
    """Parentheses, a CAST to a number type, or ROUND to an integer constant number of digits:
    each maps x <= y to f(x) <= f(y) (casts to integers and ROUND round to the nearest, whatever
    their rule for halves)."""
    if isinstance(node, exp.Cast):
        return from_sqlglot(node.args["to"]).is_number
    if isinstance(node, exp.Round):
        return round_digits(node) is not None
    return isinstance(node, exp.Paren)


def round_digits(node: exp.Round) -> int | None:
    """The digits ROUND(x, n) keeps: 0 without n, n when it is an integer constant (a bound parameter
    comes in parentheses, a negative one under a minus), else None."""
    digits = node.args.get("decimals")
    sign = 1
    while isinstance(digits, (exp.Paren, exp.Neg)):
        sign = -sign if isinstance(digits, exp.Neg) else sign
        digits = digits.this
    if digits is None:
        return 0
    if isinstance(digits, exp.Literal) and not digits.is_string and digits.this.isdigit():
        return sign * int(digits.this)
    return None


def refuse_exponential(call: exp.Anonymous, aggregate: str) -> NotSupported:
    """The refusal of an interval for an aggregate the exponential mechanism releases."""
    written = function_written(call)
    return NotSupported(
        f"{written}: {aggregate} is released by the exponential mechanism, whose 95% bound is on ranks "
        "or counts (shown in the NOTICE), not an interval of values; dp_interval_* is not available for it",
        hint="dp_interval_low/high take COUNT, SUM, AVG, VAR, STDDEV, MEDIAN and percentile aggregates",
    )


def refuse_misplaced(tree: exp.Select) -> None:
    """dp_interval_* reads released values: in WHERE, GROUP BY or an aggregate's argument (read per
    row, before anything is released) it is refused, as PostgreSQL refuses aggregates there (42803)."""
    places = [("WHERE", tree.args.get("where")), ("GROUP BY", tree.args.get("group"))]
    for clause, node in places:
        for call in node.find_all(exp.Anonymous) if node is not None else ():
            if interval_end(call) is not None:
                raise GroupingError(
                    f"{function_written(call)} is not allowed in {clause}",
                    hint="it reads a released aggregate: use it in the select list, HAVING or ORDER BY",
                )
    for call in tree.find_all(exp.Anonymous):
        if interval_end(call) is None:
            continue
        parent = call.parent
        while parent is not None and parent is not tree:
            if isinstance(parent, (exp.AggFunc, exp.WithinGroup, exp.Filter)):
                raise GroupingError(
                    f"{function_written(call)} is not allowed inside an aggregate ({parent.sql('postgres')})",
                    hint="it reads a released aggregate: apply it to the aggregate instead",
                )
            parent = parent.parent


def refuse_outside_private(call: exp.Expression) -> NotSupported:
    """dp_interval_* where there is no released aggregate (a statement without a protected table)."""
    written = function_written(call) if isinstance(call, exp.Anonymous) else call.sql("postgres")
    return NotSupported(
        f"{written}: dp_interval_low/high take an aggregate of a query over protected tables",
        hint="answers about public tables or constants are exact and have no interval",
    )


__all__ = [
    "INTERVAL_FUNCTIONS",
    "interval_argument",
    "interval_end",
    "interval_placeholder",
    "interval_slots",
    "interval_types",
    "refuse_exponential",
    "refuse_misplaced",
    "refuse_outside_private",
    "slot_name",
]
