"""Expressions over released values compiled to Python closures over a row of released values
(aggregates, then keys, then outputs), evaluated once per released group."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from sqlglot import exp

from dpproxy.errors import NotSupported
from dpproxy.sql.postprocess.inference import (
    _COMPARISONS,
    MATH_FUNCTIONS,
    Env,
    TypeEnv,
    _unsupported,
    infer_type,
)
from dpproxy.sql.postprocess.values import (
    _arith,
    _cast,
    _compare,
    _literal_value,
    _to_decimal,
    convert,
    round_numeric,
    to_text,
    within_type,
)
from dpproxy.sql.types import PgType

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
        if isinstance(node, (exp.Neg, exp.Abs)):
            sign = operator.neg if isinstance(node, exp.Neg) else abs
            result = infer_type(node, self.types)
            if result.is_integer:  # -CAST(-32768 AS smallint) leaves smallint, as in PostgreSQL
                return _strict(c(node.this), lambda v: within_type(sign(v), result))
            return _strict(c(node.this), sign)
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod)):
            result = infer_type(node, self.types)
            left, right = c(node.left), c(node.right)
            return lambda row: _arith(node, left(row), right(row), result)
        if type(node) in _COMPARISONS:
            compare = _COMPARISONS[type(node)]
            return _strict_pair(c(node.left), c(node.right), lambda a, b: compare(*_compare(a, b)))
        if isinstance(node, (exp.NullSafeEQ, exp.NullSafeNEQ)):
            left, right = c(node.left), c(node.right)
            equal = isinstance(node, exp.NullSafeEQ)

            def null_safe(row: Sequence[object]) -> object:
                a, b = left(row), right(row)
                if a is not None and b is not None:
                    a, b = _compare(a, b)
                return (a == b) is equal

            return null_safe
        if isinstance(node, (exp.And, exp.Or)):
            left, right = c(node.left), c(node.right)
            # Three-valued logic: False decides an AND, True an OR; else NULL if either is NULL.
            decisive = isinstance(node, exp.Or)

            def connective(row: Sequence[object]) -> object:
                a, b = left(row), right(row)
                if a is decisive or b is decisive:
                    return decisive
                return None if a is None or b is None else not decisive

            return connective
        if isinstance(node, exp.Not):
            return _strict(c(node.this), operator.not_)
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
        if isinstance(node, exp.Sign):
            result_type = infer_type(node, self.types)
            return _strict(c(node.this), lambda v: convert((v > 0) - (v < 0), result_type))
        if isinstance(node, exp.Round):
            return self._round(node)
        if isinstance(node, (exp.Floor, exp.Ceil)):
            # In the type inference gives it (an integer's floor is a double, as in PostgreSQL).
            result_type = infer_type(node, self.types)
            to_integer = math.floor if isinstance(node, exp.Floor) else math.ceil
            return _strict(c(node.this), lambda v: convert(_integral(v, to_integer), result_type))
        if isinstance(node, exp.Cast):
            inner = c(node.this)
            return lambda row: _cast(node, inner(row))
        if isinstance(node, exp.Lower):
            return _strict(c(node.this), lambda v: to_text(v).lower())
        if isinstance(node, exp.Upper):
            return _strict(c(node.this), lambda v: to_text(v).upper())
        if isinstance(node, exp.Length):
            return _strict(c(node.this), lambda v: len(to_text(v)))
        if isinstance(node, exp.DPipe):
            return _strict_pair(c(node.this), c(node.expression), lambda a, b: to_text(a) + to_text(b))
        if isinstance(node, exp.Concat):
            parts = [c(a) for a in node.expressions]
            return lambda row: "".join(to_text(v) for v in (p(row) for p in parts) if v is not None)
        if isinstance(node, MATH_FUNCTIONS):
            return self._math(node)
        raise _unsupported(node)

    def _math(self, node: exp.Expression) -> Compiled:
        """sqrt, power, exp, ln, log(x) (base 10) and log(b, x) of released numbers: in numeric
        (Decimal) when an argument is numeric, else in double precision; outside a function's
        domain (a noisy count below zero, say) NULL, as a division by zero is over released values."""
        numeric = infer_type(node, self.types) is PgType.NUMERIC
        parts = [self.compile(a) for a in node.iter_expressions()]
        kind = type(node)

        def math_function(row: Sequence[object]) -> object:
            values = [p(row) for p in parts]
            if any(v is None for v in values):
                return None
            try:
                if numeric:
                    return _decimal_math(kind, [_to_decimal(v) for v in values])
                return _float_math(kind, [float(v) for v in values])  # type: ignore[arg-type]
            except (ArithmeticError, ValueError):
                return None

        return math_function

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
        result_type = infer_type(node, self.types)
        inner = self.compile(node.this)
        decimals = self.compile(node.args["decimals"]) if node.args.get("decimals") is not None else None

        def rounding(row: Sequence[object]) -> object:
            value = inner(row)
            if value is None:
                return None
            if decimals is None:
                if isinstance(value, float):
                    return float(round(value))  # PostgreSQL rounds float8 halves to even (rint)
                # In the type inference gives it: round(integer) is round(double precision).
                return convert(round_numeric(_to_decimal(value), 0), result_type)
            digits = decimals(row)
            if not isinstance(digits, int):
                raise NotSupported("round() digits must be an integer")
            return round_numeric(_to_decimal(value), digits)

        return rounding


def _strict(inner: Compiled, function: Callable[[Any], object]) -> Compiled:
    """`function` of one value, NULL when the value is NULL: PostgreSQL's strict functions and
    operators (-x, NOT, abs, sign, floor, lower, length, …) over released values."""

    def strict(row: Sequence[object]) -> object:
        value = inner(row)
        return None if value is None else function(value)

    return strict


def _strict_pair(left: Compiled, right: Compiled, function: Callable[[Any, Any], object]) -> Compiled:
    """`function` of two values, NULL when either is NULL (comparisons, ||)."""

    def strict(row: Sequence[object]) -> object:
        a, b = left(row), right(row)
        return None if a is None or b is None else function(a, b)

    return strict


def _integral(value: object, to_integer: Callable[[Any], int]) -> object:
    """floor or ceil of a released number, in its own kind: a double stays a double, else numeric."""
    if isinstance(value, float):
        return float(to_integer(value))
    return Decimal(to_integer(_to_decimal(value)))


def _decimal_math(kind: type[exp.Expression], values: list[Decimal]) -> Decimal:
    if kind is exp.Sqrt:
        return values[0].sqrt()
    if kind is exp.Exp:
        return values[0].exp()
    if kind is exp.Ln:
        return values[0].ln()
    if kind is exp.Pow:
        return values[0] ** values[1]
    if len(values) == 1:  # log(x): base 10
        return values[0].log10()
    return values[1].ln() / values[0].ln()  # log(b, x)


def _float_math(kind: type[exp.Expression], values: list[float]) -> float:
    if kind is exp.Sqrt:
        return math.sqrt(values[0])
    if kind is exp.Exp:
        return math.exp(values[0])
    if kind is exp.Ln:
        return math.log(values[0])
    if kind is exp.Pow:
        return math.pow(values[0], values[1])
    if len(values) == 1:
        return math.log10(values[0])
    return math.log(values[1], values[0])
