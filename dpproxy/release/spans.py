"""Interval arithmetic for error bars, rounded outwards: every span holds the exact one.

This module owns Span, a closed interval of Decimals, and the operations error bars need (difference,
product, square, square root, quotient, shift, power-of-ten scaling), each rounded so that the
computed interval contains the exact one, and `reach`, the ± from a released value that covers a span.

It never sees noise, rows or aggregates: only the numbers it is handed.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal
from typing import NamedTuple

FLOOR = Context(prec=60, rounding=ROUND_FLOOR)
CEILING = Context(prec=60, rounding=ROUND_CEILING)
_EXACT = Context(prec=130)  # products of two 60-digit numbers, unrounded
INFINITY = Decimal("Infinity")


class Span(NamedTuple):
    """A closed interval [lo, hi] of Decimals (either end may be infinite). A tuple: error bars
    build several per group and aggregate, and tuples are the cheapest to build."""

    lo: Decimal
    hi: Decimal

    def within(self, other: Span) -> Span | None:
        """The intersection; None when empty (the bounds it came from did not all hold)."""
        lo, hi = max(self.lo, other.lo), min(self.hi, other.hi)
        return Span(lo, hi) if lo <= hi else None

    def minus(self, other: Span) -> Span:
        return Span(FLOOR.subtract(self.lo, other.hi), CEILING.subtract(self.hi, other.lo))

    def times(self, other: Span) -> Span:
        """The product of two spans of non-negative numbers."""
        assert self.lo >= 0 and other.lo >= 0
        return Span(FLOOR.multiply(self.lo, other.lo), CEILING.multiply(self.hi, other.hi))

    def squared(self) -> Span:
        low = min(abs(self.lo), abs(self.hi)) if self.lo > 0 or self.hi < 0 else Decimal(0)
        high = max(abs(self.lo), abs(self.hi))
        return Span(FLOOR.multiply(low, low), CEILING.multiply(high, high))

    def root(self) -> Span:
        """√ of a span of non-negative numbers."""
        return Span(_root(self.lo, FLOOR), _root(self.hi, CEILING))

    def shifted(self, offset: int) -> Span:
        return Span(FLOOR.add(self.lo, Decimal(offset)), CEILING.add(self.hi, Decimal(offset)))

    def scaleb(self, exponent: int) -> Span:
        """× 10^exponent, exact: from grid units to the column's."""
        return Span(self.lo.scaleb(exponent, FLOOR), self.hi.scaleb(exponent, CEILING))


NON_NEGATIVE = Span(Decimal(0), INFINITY)


def _root(value: Decimal, context: Context) -> Decimal:
    """√value rounded as `context` rounds (down or up). Decimal's sqrt rounds to nearest: the
    result is stepped once outwards when its exact square shows it on the wrong side."""
    if value.is_infinite() or value == 0:
        return value
    root = context.sqrt(value)
    square = _EXACT.multiply(root, root)
    if context.rounding == ROUND_FLOOR and square > value:
        return context.next_minus(root)
    if context.rounding == ROUND_CEILING and square < value:
        return context.next_plus(root)
    return root


def noisy_span(noisy: int, error: float) -> Span:
    """Where the true component lies when its noise is within ±error."""
    value, margin = Decimal(noisy), Decimal(error)
    return Span(FLOOR.subtract(value, margin), CEILING.add(value, margin))


def quotient(numerator: Span, denominator: Span) -> Span:
    """{s/n} over the box, for a denominator > 0: s/n is monotone in n for each s, so the ends are
    at the corners, the lower one at the smallest s, the upper one at the largest."""
    assert denominator.lo > 0
    lows = (FLOOR.divide(numerator.lo, n) for n in (denominator.lo, denominator.hi))
    highs = (CEILING.divide(numerator.hi, n) for n in (denominator.lo, denominator.hi))
    return Span(min(lows), max(highs))


def bessel(count: Decimal, context: Context) -> Decimal:
    """N/(N − 1), the sample variance's factor (falling in N; 1 in the limit), rounded as `context`."""
    if count.is_infinite():
        return Decimal(1)
    return context.divide(count, count - 1)


def reach(released: object, span: Span) -> float:
    """The ± from a released value that reaches both ends of `span`: it covers every value in it.
    Rounded up to a float, so that the figure shown is never below the exact one."""
    value = Decimal(released) if isinstance(released, int | float) else released
    assert isinstance(value, Decimal)
    distance = max(CEILING.subtract(value, span.lo), CEILING.subtract(span.hi, value))
    figure = float(distance)
    return math.nextafter(figure, math.inf) if Decimal(figure) < distance else figure
