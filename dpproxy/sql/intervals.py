"""Closed intervals of exact decimals: the range a row-level expression can take.

Used for two promises: sums are clipped to bounds derived from the policy (the sensitivity is computed
from these intervals, never from data), and no arithmetic sent to the backend can overflow for any
value the policy allows (so no data-dependent error can happen).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal


@dataclass(frozen=True)
class Interval:
    """[lo, hi]; a bound may be ±Infinity (a count of rows has no upper bound until clamped)."""

    lo: Decimal
    hi: Decimal

    def __post_init__(self) -> None:
        if self.lo > self.hi:
            raise ValueError(f"empty interval [{self.lo}, {self.hi}]")

    @staticmethod
    def point(value: Decimal | int) -> Interval:
        v = Decimal(value)
        return Interval(v, v)

    @property
    def finite(self) -> bool:
        return self.lo.is_finite() and self.hi.is_finite()

    @property
    def magnitude(self) -> Decimal:
        """The largest absolute value in the interval."""
        return max(abs(self.lo), abs(self.hi))

    @property
    def contains_zero(self) -> bool:
        return self.lo <= 0 <= self.hi

    def within(self, lo: Decimal | int, hi: Decimal | int) -> bool:
        return self.lo >= lo and self.hi <= hi

    def union(self, other: Interval) -> Interval:
        return Interval(min(self.lo, other.lo), max(self.hi, other.hi))

    def __add__(self, other: Interval) -> Interval:
        return Interval(self.lo + other.lo, self.hi + other.hi)

    def __sub__(self, other: Interval) -> Interval:
        return Interval(self.lo - other.hi, self.hi - other.lo)

    def __neg__(self) -> Interval:
        return Interval(-self.hi, -self.lo)

    def __mul__(self, other: Interval) -> Interval:
        products = [_times(a, b) for a in (self.lo, self.hi) for b in (other.lo, other.hi)]
        return Interval(min(products), max(products))

    def divide(self, divisor: Interval, *, integer_divisor: bool, truncate: bool) -> Interval | None:
        """Range of self / divisor, the divisor's zero excluded (the SQL guards it with NULLIF).

        A non-zero integer divisor has |divisor| >= 1, so |quotient| <= |dividend|. A fractional
        divisor that can come arbitrarily close to zero gives no bounded quotient: None.
        """
        if not (self.finite and divisor.finite):
            return None
        if not divisor.contains_zero:
            quotients = [a / b for a in (self.lo, self.hi) for b in (divisor.lo, divisor.hi)]
            if truncate:
                quotients = [_truncate(q) for q in quotients]
            return Interval(min(quotients), max(quotients))
        if integer_divisor:
            m = self.magnitude
            return Interval(-m, m)
        return None

    def modulo(self, divisor: Interval) -> Interval:
        # The sign follows the dividend and |a % b| < |b|, |a % b| <= |a|.
        m = min(self.magnitude, max(divisor.magnitude - 1, Decimal(0)))
        lo = -m if self.lo < 0 else Decimal(0)
        hi = m if self.hi > 0 else Decimal(0)
        return Interval(lo, hi)

    def abs(self) -> Interval:
        if self.contains_zero:
            return Interval(Decimal(0), self.magnitude)
        return Interval(min(abs(self.lo), abs(self.hi)), self.magnitude)

    def widen_to_integers(self) -> Interval:
        """Range after rounding to an integer in any direction (round, floor, ceil, casts)."""
        return Interval(_floor(self.lo, Decimal(1)), _ceiling(self.hi, Decimal(1)))

    def widen_to_digits(self, digits: int) -> Interval:
        """Range after rounding to `digits` decimal places in any direction."""
        quantum = Decimal(1).scaleb(-digits)
        return Interval(_floor(self.lo, quantum), _ceiling(self.hi, quantum))

    def on_grid(self, scale: int) -> tuple[int, int]:
        """The integer range of round(x * 10^scale) for x in the interval."""
        lo = (self.lo.scaleb(scale)).to_integral_value(ROUND_FLOOR)
        hi = (self.hi.scaleb(scale)).to_integral_value(ROUND_CEILING)
        return int(lo), int(hi)


def _floor(value: Decimal, quantum: Decimal) -> Decimal:
    # An infinite bound stays infinite (a count per person has no upper bound).
    return value.quantize(quantum, rounding=ROUND_FLOOR) if value.is_finite() else value


def _ceiling(value: Decimal, quantum: Decimal) -> Decimal:
    return value.quantize(quantum, rounding=ROUND_CEILING) if value.is_finite() else value


def _times(a: Decimal, b: Decimal) -> Decimal:
    # 0 · ∞ is 0 here: a zero bound times an unbounded one contributes nothing to the range.
    if a == 0 or b == 0:
        return Decimal(0)
    return a * b


def _truncate(value: Decimal) -> Decimal:
    return Decimal(math.trunc(value))


def hull(intervals: list[Interval | None]) -> Interval | None:
    """Smallest interval holding all of them; None if any is unbounded."""
    if not intervals or any(i is None for i in intervals):
        return None
    result = intervals[0]
    assert result is not None
    for i in intervals[1:]:
        assert i is not None
        result = result.union(i)
    return result
