"""The PostgreSQL type of an expression over released values (aggregate and key placeholders),
and the refusal of what post-processing cannot compute. Text only."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from sqlglot import exp

from dpproxy.errors import DatatypeMismatch, NotSupported, UndefinedFunction
from dpproxy.sql.datetimes import parse_temporal
from dpproxy.sql.postprocess.intervals import interval_end, refuse_outside_private
from dpproxy.sql.types import INTEGER_RANGE, PgType, arithmetic_result, check_comparable, from_sqlglot

Env = Mapping[str, object]


TypeEnv = Mapping[str, PgType]


_COMPARISONS: dict[type[exp.Expression], Callable[[object, object], bool]] = {
    exp.EQ: lambda a, b: a == b,
    exp.NEQ: lambda a, b: a != b,
    exp.GT: lambda a, b: a > b,  # type: ignore[operator]
    exp.GTE: lambda a, b: a >= b,  # type: ignore[operator]
    exp.LT: lambda a, b: a < b,  # type: ignore[operator]
    exp.LTE: lambda a, b: a <= b,  # type: ignore[operator]
}


_SUPPORTED = (
    "arithmetic (+ - * / %), comparisons, AND/OR/NOT, IS [NOT] NULL, BETWEEN, IN (…), CASE, CAST, "
    "round, abs, ceil, floor, sign, sqrt, power, exp, ln, log, greatest, least, coalesce, nullif, "
    "lower, upper, length, ||"
)

# Mathematical functions of released numbers: numeric when an argument is, else double precision.
MATH_FUNCTIONS = (exp.Sqrt, exp.Pow, exp.Exp, exp.Ln, exp.Log)


def _unsupported(node: exp.Expression) -> NotSupported:
    return NotSupported(
        f"{node.sql('postgres')} cannot be computed over released aggregates",
        hint=f"supported over aggregates: {_SUPPORTED}",
    )


def literal_type(node: exp.Literal) -> PgType:
    if node.is_string:
        return PgType.UNKNOWN
    text = node.this
    if "." in text or "e" in text.lower():
        return PgType.NUMERIC
    value = int(text)
    if INTEGER_RANGE[PgType.INT4][0] <= value <= INTEGER_RANGE[PgType.INT4][1]:
        return PgType.INT4
    if INTEGER_RANGE[PgType.INT8][0] <= value <= INTEGER_RANGE[PgType.INT8][1]:
        return PgType.INT8
    return PgType.NUMERIC


def _merge(types: list[PgType], node: exp.Expression) -> PgType:
    known = [t for t in types if t is not PgType.UNKNOWN]
    if not known:
        return PgType.TEXT
    result = known[0]
    for t in known[1:]:
        if result.is_number and t.is_number:
            result = arithmetic_result(result, t)
        elif result.is_text and t.is_text:
            result = PgType.TEXT
        elif result != t:
            raise DatatypeMismatch(f"{node.sql('postgres')} mixes {result.value} and {t.value} values")
    return result


def infer_type(node: exp.Expression, env: TypeEnv) -> PgType:
    """The PostgreSQL type of an expression over placeholders; rejects what cannot be evaluated."""
    if isinstance(node, exp.Column):
        name = node.name
        if name not in env:
            raise NotSupported(f"{node.sql('postgres')} is not a released value")
        return env[name]
    if isinstance(node, exp.Literal):
        return literal_type(node)
    if isinstance(node, exp.Boolean):
        return PgType.BOOL
    if isinstance(node, exp.Null):
        return PgType.UNKNOWN
    if isinstance(node, exp.Paren):
        return infer_type(node.this, env)
    if isinstance(node, exp.Neg):
        t = infer_type(node.this, env)
        if not t.is_number:
            raise DatatypeMismatch(f"cannot negate {t.value}: {node.sql('postgres')}")
        return t
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod)):
        left, right = infer_type(node.left, env), infer_type(node.right, env)
        left = PgType.NUMERIC if left is PgType.UNKNOWN else left
        right = PgType.NUMERIC if right is PgType.UNKNOWN else right
        if not (left.is_number and right.is_number):
            raise UndefinedFunction(
                f"operator does not exist: {left.value} {_operator(node)} {right.value}",
                hint="arithmetic works on numbers only",
            )
        return arithmetic_result(left, right)
    if isinstance(
        node,
        (
            *_COMPARISONS,
            exp.And,
            exp.Or,
            exp.Not,
            exp.Is,
            exp.In,
            exp.Between,
            exp.NullSafeEQ,
            exp.NullSafeNEQ,
        ),
    ):
        for child in node.iter_expressions():
            infer_type(child, env)
        return PgType.BOOL
    if isinstance(node, exp.Case):
        for branch in node.args.get("ifs") or []:
            infer_type(branch.this, env)
        values = [infer_type(b.args["true"], env) for b in node.args.get("ifs") or []]
        if node.args.get("default") is not None:
            values.append(infer_type(node.args["default"], env))
        return _merge(values, node)
    if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least)):
        return _merge([infer_type(a, env) for a in [node.this, *node.expressions]], node)
    if isinstance(node, exp.Nullif):
        infer_type(node.expression, env)
        return infer_type(node.this, env)
    if isinstance(node, exp.Abs):
        return infer_type(node.this, env)
    # PostgreSQL resolves sign, round, floor and ceil of an integer to their double precision forms
    # (its numbers' preferred type), as in rows (sql/rowexpr/arithmetic.py): the integer, as a double.
    if isinstance(node, exp.Sign):
        t = infer_type(node.this, env)
        return PgType.FLOAT8 if t.is_integer else t
    if isinstance(node, exp.Round):
        t = _number_argument(node, infer_type(node.this, env))
        if node.args.get("decimals") is not None:
            infer_type(node.args["decimals"], env)
            if t.is_float:  # round(x, n) takes an exact number only
                raise UndefinedFunction(
                    "function round(double precision, integer) does not exist",
                    hint="round(x) rounds a double to an integer; round(CAST(x AS numeric), n) to n decimals",
                )
            return PgType.NUMERIC
        return PgType.FLOAT8 if t.is_float or t.is_integer else PgType.NUMERIC
    if isinstance(node, (exp.Floor, exp.Ceil)):
        t = _number_argument(node, infer_type(node.this, env))
        return PgType.FLOAT8 if t.is_float or t.is_integer else PgType.NUMERIC
    if isinstance(node, MATH_FUNCTIONS):
        kinds = [infer_type(a, env) for a in node.iter_expressions()]
        if not all(t.is_number or t is PgType.UNKNOWN for t in kinds):
            raise UndefinedFunction(
                f"function {node.key}({', '.join(t.value for t in kinds)}) does not exist",
                hint="it takes numbers",
            )
        return PgType.NUMERIC if PgType.NUMERIC in kinds else PgType.FLOAT8
    if isinstance(node, exp.Cast):
        source = infer_type(node.this, env)
        target = from_sqlglot(node.args["to"])
        if target is PgType.UNKNOWN:
            raise NotSupported(f"CAST to {node.args['to'].sql('postgres')} is not supported over aggregates")
        _check_cast(source, target, node)
        return target
    if isinstance(node, (exp.Lower, exp.Upper)):
        infer_type(node.this, env)
        return PgType.TEXT
    if isinstance(node, exp.Length):
        infer_type(node.this, env)
        return PgType.INT4
    if isinstance(node, (exp.DPipe, exp.Concat)):
        for child in node.iter_expressions():
            infer_type(child, env)
        return PgType.TEXT
    if interval_end(node) is not None:  # left in place: no released aggregate to take it from
        raise refuse_outside_private(node)
    raise _unsupported(node)


def _number_argument(node: exp.Expression, argument: PgType) -> PgType:
    """round, floor and ceil take a number (or an untyped constant), as in PostgreSQL (42883)."""
    if not (argument.is_number or argument is PgType.UNKNOWN):
        raise UndefinedFunction(
            f"function {node.key}({argument.value}) does not exist",
            hint="it takes a number; for a date, use date_trunc or extract",
        )
    return argument


def _check_cast(source: PgType, target: PgType, node: exp.Cast) -> None:
    """Casts of released values that PostgreSQL has no cast for, or that fail on some value, are
    refused before anything runs (the rules of CAST in rows, sql/rowexpr/arithmetic.py): a date or
    time to or from a number or a boolean, a boolean to any number but integer, a number that is
    not an integer to boolean, and released text (a key's or MIN's values) to anything but text."""
    if source is PgType.UNKNOWN or source is target or target.is_text:
        return
    allowed = (
        (source.is_number and target.is_number)
        or (source.is_temporal and target.is_temporal)
        or (source is PgType.BOOL and target is PgType.INT4)
        or (source.is_integer and target is PgType.BOOL)
    )
    if not allowed:
        hint = (
            "compare the text directly; released text is not parsed"
            if source.is_text
            else "cast to integer"
            if source is PgType.BOOL and target.is_number
            else None
        )
        raise NotSupported(
            f"CAST of {source.value} to {target.value} is not supported over aggregates "
            f"({node.sql('postgres')})",
            hint=hint,
        )


def _operator(node: exp.Expression) -> str:
    return {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/", exp.Mod: "%"}.get(type(node), "?")


def check_comparisons(
    node: exp.Expression, env: TypeEnv, clause: str, originals: Mapping[str, exp.Expression]
) -> None:
    """Refuse comparisons of values of different kinds (`sex = 1` on a text key) by the rule row
    expressions follow (`check_comparable`), naming the expression as written: `originals` maps each
    placeholder to the expression it stands for."""

    def written(n: exp.Expression) -> str:
        def restore(m: exp.Expression) -> exp.Expression:
            if isinstance(m, exp.Column) and m.name in originals:
                return originals[m.name].copy()
            return m

        return n.transform(restore, copy=True).sql("postgres")

    for n in node.walk():
        if isinstance(n, (*_COMPARISONS, exp.NullSafeEQ, exp.NullSafeNEQ)):
            pairs = [(n.left, n.right)]
        elif isinstance(n, exp.In):
            pairs = [(n.this, e) for e in n.expressions]
        elif isinstance(n, exp.Between):
            pairs = [(n.this, n.args["low"]), (n.this, n.args["high"])]
        else:
            continue
        for a, b in pairs:
            left, right = infer_type(a, env), infer_type(b, env)
            check_comparable(left, right, n, clause, written(n))
            # A string constant compared with a date or time is read now, as PostgreSQL reads it
            # (22007 for text it cannot read), never when released values are compared.
            for one, other in ((a, right), (b, left)):
                if isinstance(one, exp.Literal) and one.is_string and other.is_temporal:
                    parse_temporal(one.this, other)
