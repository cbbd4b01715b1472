"""Post-processing: expressions over released (already noisy) values, with PostgreSQL semantics.

Projections, HAVING, ORDER BY and arithmetic over aggregates run here, in Python, on values that
have already been noised: post-processing cannot weaken differential privacy. This module never
sees a true aggregate or a row of a protected table; it only reads the placeholders the analyzer
put in place of aggregates and group keys.

Division by zero yields NULL instead of an error: the query has been paid for by then, and an
error would throw the released values away.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping, Sequence
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation, localcontext

from sqlglot import exp

from dpproxy.errors import DatatypeMismatch, InvalidText, NotSupported, UndefinedFunction
from dpproxy.sql.types import INTEGER_RANGE, PgType, arithmetic_result, boolean_from_text, from_sqlglot

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
    "round, abs, ceil, floor, sign, greatest, least, coalesce, nullif, lower, upper, length, ||"
)


def _unsupported(node: exp.Expression) -> NotSupported:
    return NotSupported(
        f"{node.sql('postgres')} cannot be computed over released aggregates",
        hint=f"supported over aggregates: {_SUPPORTED}",
    )


# -- types -----------------------------------------------------------------------------------------


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
    if isinstance(node, exp.Sign):
        t = infer_type(node.this, env)
        return t if not t.is_integer else PgType.INT4
    if isinstance(node, exp.Round):
        t = infer_type(node.this, env)
        if node.args.get("decimals") is not None:
            return PgType.NUMERIC
        return PgType.FLOAT8 if t.is_float else PgType.NUMERIC
    if isinstance(node, (exp.Floor, exp.Ceil)):
        t = infer_type(node.this, env)
        return PgType.FLOAT8 if t.is_float else PgType.NUMERIC
    if isinstance(node, exp.Cast):
        infer_type(node.this, env)
        target = from_sqlglot(node.args["to"])
        if target is PgType.UNKNOWN:
            raise NotSupported(f"CAST to {node.args['to'].sql('postgres')} is not supported over aggregates")
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
    raise _unsupported(node)


def _operator(node: exp.Expression) -> str:
    return {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/", exp.Mod: "%"}.get(type(node), "?")


# -- values ----------------------------------------------------------------------------------------


def _to_decimal(value: object) -> Decimal:
    if isinstance(value, Decimal):
        return value
    if isinstance(value, bool):
        raise DatatypeMismatch("boolean is not a number")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, str):
        try:
            return Decimal(value.strip())
        except InvalidOperation as e:
            raise InvalidText(f"invalid input syntax for type numeric: {value!r}") from e
    raise DatatypeMismatch(f"{type(value).__name__} is not a number")


def convert(value: object, target: PgType) -> object:
    """CAST semantics of PostgreSQL for the types dpproxy returns."""
    if value is None:
        return None
    if target.is_integer:
        if isinstance(value, bool):
            result = int(value)
        elif isinstance(value, int):
            result = value
        elif isinstance(value, float):
            result = round(value)  # rint: halves to even, as PostgreSQL casts float8
        else:
            result = int(_to_decimal(value).quantize(Decimal(1), rounding=ROUND_HALF_UP))
        lo, hi = INTEGER_RANGE[target]
        if not lo <= result <= hi:
            raise NotSupported(f"{target.value} out of range")
        return result
    if target is PgType.NUMERIC:
        return _to_decimal(value)
    if target.is_float:
        if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
            return float(value)
        return float(_to_decimal(value))
    if target.is_text:
        return to_text(value)
    if target is PgType.BOOL:
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            return value != 0
        parsed = boolean_from_text(str(value))
        if parsed is None:
            raise InvalidText(f"invalid input syntax for type boolean: {value!r}")
        return parsed
    if target is PgType.DATE:
        if isinstance(value, dt.datetime):
            return value.date()
        if isinstance(value, dt.date):
            return value
        return dt.date.fromisoformat(str(value).strip())
    if target in (PgType.TIMESTAMP, PgType.TIMESTAMPTZ):
        if isinstance(value, dt.datetime):
            return value
        if isinstance(value, dt.date):
            return dt.datetime(value.year, value.month, value.day)
        return dt.datetime.fromisoformat(str(value).strip())
    return value


def to_text(value: object) -> str:
    """PostgreSQL's text output of a value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value) if value != int(value) or abs(value) >= 1e16 else str(int(value))
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    return str(value)


def _arith(node: exp.Expression, a: object, b: object, result: PgType) -> object:
    if a is None or b is None:
        return None
    if result.is_integer:
        x, y = int(a), int(b)  # type: ignore[call-overload]
        if isinstance(node, exp.Add):
            return x + y
        if isinstance(node, exp.Sub):
            return x - y
        if isinstance(node, exp.Mul):
            return x * y
        if y == 0:
            return None
        quotient = abs(x) // abs(y)
        if isinstance(node, exp.Div):
            return quotient if (x >= 0) == (y > 0) else -quotient
        remainder = abs(x) % abs(y)
        return remainder if x >= 0 else -remainder
    if result.is_float:
        fx, fy = float(a), float(b)  # type: ignore[arg-type]
        if isinstance(node, exp.Add):
            return fx + fy
        if isinstance(node, exp.Sub):
            return fx - fy
        if isinstance(node, exp.Mul):
            return fx * fy
        if fy == 0:
            return None
        return fx / fy if isinstance(node, exp.Div) else math.fmod(fx, fy)
    dx, dy = _to_decimal(a), _to_decimal(b)
    with localcontext() as ctx:
        ctx.prec = 60
        if isinstance(node, exp.Add):
            return dx + dy
        if isinstance(node, exp.Sub):
            return dx - dy
        if isinstance(node, exp.Mul):
            return dx * dy
        if dy == 0:
            return None
        if isinstance(node, exp.Mod):
            return dx % dy
        quotient = dx / dy
        # PostgreSQL shows at least 16 significant digits of a numeric quotient.
        digits = max(_scale(dx), _scale(dy), 16 - max(quotient.adjusted() + 1, 0), 0)
        return quotient.quantize(Decimal(1).scaleb(-min(digits, 40)), rounding=ROUND_HALF_UP)


def _scale(value: Decimal) -> int:
    exponent = value.as_tuple().exponent
    return -exponent if isinstance(exponent, int) and exponent < 0 else 0


def _compare(a: object, b: object) -> tuple[object, object]:
    """Bring two values to comparable Python types, as PostgreSQL's implicit casts do."""
    if isinstance(a, str) and not isinstance(b, str):
        return convert(a, _python_type(b)), b
    if isinstance(b, str) and not isinstance(a, str):
        return a, convert(b, _python_type(a))
    if isinstance(a, float) and isinstance(b, Decimal):
        return Decimal(repr(a)), b
    if isinstance(b, float) and isinstance(a, Decimal):
        return a, Decimal(repr(b))
    return a, b


def _python_type(value: object) -> PgType:
    if isinstance(value, bool):
        return PgType.BOOL
    if isinstance(value, int):
        return PgType.INT8
    if isinstance(value, float):
        return PgType.FLOAT8
    if isinstance(value, Decimal):
        return PgType.NUMERIC
    if isinstance(value, dt.datetime):
        return PgType.TIMESTAMP
    if isinstance(value, dt.date):
        return PgType.DATE
    return PgType.TEXT


def _literal_value(node: exp.Literal) -> object:
    if node.is_string:
        return node.this
    t = literal_type(node)
    return int(node.this) if t.is_integer else Decimal(node.this)


Compiled = Callable[[Sequence[object]], object]


def compile_expression(node: exp.Expression, types: TypeEnv, slots: Mapping[str, int]) -> Compiled:
    """Turn an expression over placeholders into a function of a row of released values.

    `slots` maps each placeholder name to its position in the row. Compiled once per plan, run
    once per released group: post-processing costs a few closure calls per value.
    """
    return _Compiler(types, slots).compile(node)


def evaluate(node: exp.Expression, env: Env, types: TypeEnv) -> object:
    """Evaluate an expression once, placeholders read from `env`."""
    names = list(env)
    return compile_expression(node, types, {n: i for i, n in enumerate(names)})([env[n] for n in names])


class _Compiler:
    def __init__(self, types: TypeEnv, slots: Mapping[str, int]) -> None:
        self.types = types
        self.slots = slots

    def compile(self, node: exp.Expression) -> Compiled:
        c = self.compile
        if isinstance(node, exp.Column):
            index = self.slots[node.name]
            return lambda row: row[index]
        if isinstance(node, exp.Literal):
            value = _literal_value(node)
            return lambda row: value
        if isinstance(node, exp.Boolean):
            flag = bool(node.this)
            return lambda row: flag
        if isinstance(node, exp.Null):
            return lambda row: None
        if isinstance(node, exp.Paren):
            return c(node.this)
        if isinstance(node, exp.Neg):
            inner = c(node.this)

            def negate(row: Sequence[object]) -> object:
                value = inner(row)
                return None if value is None else -value  # type: ignore[operator]

            return negate
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod)):
            result = infer_type(node, self.types)
            left, right = c(node.left), c(node.right)
            return lambda row: _arith(node, left(row), right(row), result)
        if type(node) in _COMPARISONS:
            compare = _COMPARISONS[type(node)]
            left, right = c(node.left), c(node.right)

            def comparison(row: Sequence[object]) -> object:
                a, b = left(row), right(row)
                if a is None or b is None:
                    return None
                a, b = _compare(a, b)
                return compare(a, b)

            return comparison
        if isinstance(node, (exp.NullSafeEQ, exp.NullSafeNEQ)):
            left, right = c(node.left), c(node.right)
            equal = isinstance(node, exp.NullSafeEQ)

            def null_safe(row: Sequence[object]) -> object:
                a, b = left(row), right(row)
                if a is not None and b is not None:
                    a, b = _compare(a, b)
                return (a == b) is equal

            return null_safe
        if isinstance(node, exp.And):
            left, right = c(node.left), c(node.right)

            def conjunction(row: Sequence[object]) -> object:
                a, b = left(row), right(row)
                if a is False or b is False:
                    return False
                return None if a is None or b is None else True

            return conjunction
        if isinstance(node, exp.Or):
            left, right = c(node.left), c(node.right)

            def disjunction(row: Sequence[object]) -> object:
                a, b = left(row), right(row)
                if a is True or b is True:
                    return True
                return None if a is None or b is None else False

            return disjunction
        if isinstance(node, exp.Not):
            inner = c(node.this)

            def negation(row: Sequence[object]) -> object:
                value = inner(row)
                return None if value is None else not value

            return negation
        if isinstance(node, exp.Is):
            inner = c(node.this)
            target = node.expression
            if isinstance(target, exp.Null):
                return lambda row: inner(row) is None
            wanted = bool(target.this)
            return lambda row: inner(row) is wanted
        if isinstance(node, exp.Between):
            return self._between(node)
        if isinstance(node, exp.In):
            return self._in(node)
        if isinstance(node, exp.Case):
            return self._case(node)
        if isinstance(node, exp.Coalesce):
            result_type = infer_type(node, self.types)
            parts = [c(a) for a in [node.this, *node.expressions]]

            def coalesce(row: Sequence[object]) -> object:
                for part in parts:
                    value = part(row)
                    if value is not None:
                        return convert(value, result_type)
                return None

            return coalesce
        if isinstance(node, (exp.Greatest, exp.Least)):
            result_type = infer_type(node, self.types)
            parts = [c(a) for a in [node.this, *node.expressions]]
            pick = max if isinstance(node, exp.Greatest) else min

            def extreme(row: Sequence[object]) -> object:
                present = [v for v in (convert(p(row), result_type) for p in parts) if v is not None]
                return pick(present) if present else None  # type: ignore[type-var]

            return extreme
        if isinstance(node, exp.Nullif):
            first, second = c(node.this), c(node.expression)

            def nullif(row: Sequence[object]) -> object:
                a, b = first(row), second(row)
                if a is not None and b is not None:
                    x, y = _compare(a, b)
                    if x == y:
                        return None
                return a

            return nullif
        if isinstance(node, exp.Abs):
            inner = c(node.this)
            return lambda row: None if (v := inner(row)) is None else abs(v)  # type: ignore[arg-type]
        if isinstance(node, exp.Sign):
            inner = c(node.this)
            result_type = infer_type(node, self.types)

            def sign(row: Sequence[object]) -> object:
                value = inner(row)
                if value is None:
                    return None
                return convert((value > 0) - (value < 0), result_type)  # type: ignore[operator]

            return sign
        if isinstance(node, exp.Round):
            return self._round(node)
        if isinstance(node, (exp.Floor, exp.Ceil)):
            inner = c(node.this)
            down = isinstance(node, exp.Floor)

            def floor_ceil(row: Sequence[object]) -> object:
                value = inner(row)
                if value is None:
                    return None
                if isinstance(value, float):
                    return float(math.floor(value) if down else math.ceil(value))
                d = _to_decimal(value)
                return Decimal(math.floor(d) if down else math.ceil(d))

            return floor_ceil
        if isinstance(node, exp.Cast):
            inner = c(node.this)
            return lambda row: _cast(node, inner(row))
        if isinstance(node, (exp.Lower, exp.Upper)):
            inner = c(node.this)
            lower = isinstance(node, exp.Lower)

            def case_fold(row: Sequence[object]) -> object:
                value = inner(row)
                if value is None:
                    return None
                return to_text(value).lower() if lower else to_text(value).upper()

            return case_fold
        if isinstance(node, exp.Length):
            inner = c(node.this)
            return lambda row: None if (v := inner(row)) is None else len(to_text(v))
        if isinstance(node, exp.DPipe):
            left, right = c(node.this), c(node.expression)

            def pipe(row: Sequence[object]) -> object:
                a, b = left(row), right(row)
                return None if a is None or b is None else to_text(a) + to_text(b)

            return pipe
        if isinstance(node, exp.Concat):
            parts = [c(a) for a in node.expressions]
            return lambda row: "".join(to_text(v) for v in (p(row) for p in parts) if v is not None)
        raise _unsupported(node)

    def _between(self, node: exp.Between) -> Compiled:
        inner = self.compile(node.this)
        low, high = self.compile(node.args["low"]), self.compile(node.args["high"])
        symmetric = bool(node.args.get("symmetric"))

        def between(row: Sequence[object]) -> object:
            value, lo, hi = inner(row), low(row), high(row)
            if value is None or lo is None or hi is None:
                return None
            value, lo = _compare(value, lo)
            value, hi = _compare(value, hi)
            if symmetric and lo > hi:  # type: ignore[operator]
                lo, hi = hi, lo
            return lo <= value <= hi  # type: ignore[operator]

        return between

    def _in(self, node: exp.In) -> Compiled:
        inner = self.compile(node.this)
        items = [self.compile(e) for e in node.expressions]

        def membership(row: Sequence[object]) -> object:
            if not items:  # an inlined subquery without rows: false, even for NULL
                return False
            value = inner(row)
            if value is None:
                return None
            saw_null = False
            for item in items:
                candidate = item(row)
                if candidate is None:
                    saw_null = True
                    continue
                a, b = _compare(value, candidate)
                if a == b:
                    return True
            return None if saw_null else False

        return membership

    def _case(self, node: exp.Case) -> Compiled:
        result_type = infer_type(node, self.types)
        operand = self.compile(node.args["this"]) if node.args.get("this") is not None else None
        branches = [(self.compile(b.this), self.compile(b.args["true"])) for b in node.args.get("ifs") or []]
        default = self.compile(node.args["default"]) if node.args.get("default") is not None else None

        def case(row: Sequence[object]) -> object:
            operand_value = operand(row) if operand is not None else None
            for condition, value in branches:
                if operand is not None:
                    candidate = condition(row)
                    hit = operand_value is not None and candidate is not None and operand_value == candidate
                else:
                    hit = condition(row) is True
                if hit:
                    return convert(value(row), result_type)
            return convert(default(row), result_type) if default is not None else None

        return case

    def _round(self, node: exp.Round) -> Compiled:
        inner = self.compile(node.this)
        decimals = self.compile(node.args["decimals"]) if node.args.get("decimals") is not None else None

        def rounding(row: Sequence[object]) -> object:
            value = inner(row)
            if value is None:
                return None
            if decimals is None:
                if isinstance(value, float):
                    return float(round(value))  # PostgreSQL rounds float8 halves to even (rint)
                return _to_decimal(value).quantize(Decimal(1), rounding=ROUND_HALF_UP)
            digits = decimals(row)
            if not isinstance(digits, int):
                raise NotSupported("round() digits must be an integer")
            return _to_decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)

        return rounding


def _cast(node: exp.Cast, value: object) -> object:
    to: exp.DataType = node.args["to"]
    target = from_sqlglot(to)
    result = convert(value, target)
    if target is PgType.NUMERIC and isinstance(result, Decimal):
        params = [p for p in to.expressions if isinstance(p, exp.DataTypeParam)]
        if len(params) == 2:
            result = result.quantize(Decimal(1).scaleb(-int(params[1].name)), rounding=ROUND_HALF_UP)
    if target is PgType.VARCHAR and isinstance(result, str):
        params = [p for p in to.expressions if isinstance(p, exp.DataTypeParam)]
        if params:
            result = result[: int(params[0].name)]
    return result
