"""The exact stages of the samplers' decisions: double-double arithmetic on 181 bits (stage 2) and
`decimal` on as many bits as it takes (stage 3), with their error bounds.

This module owns, for one element at a time, the two decisions dpproxy.privacy.sampling's float stage
leaves undecided: floor(−b·ln U) (a geometric draw) and −ln V > γ (a Bernoulli(exp(−γ)) coin), given
the first bits of the uniform U or V:

- stage 2 (_stage2_geometric, _stage2_bernoulli): −ln U in double-double arithmetic on U's first
  181 bits (_dd_neg_log, built from the error-free transformations and double-word algorithms of
  Joldes, Muller & Popescu 2017, which sampling also uses for the discrete Gaussian's γ), within
  _DD_LOG_ERROR; None when those bits do not prove the answer. The same operations run whatever the
  slot holds, so a slot's time does not depend on the value drawn;
- stage 3 (_exact_geometric, _exact_neg_log_above): `decimal` with directed roundings, reading 64
  more bits of the same uniform at a time until the answer is proved. It always answers.

Either answer is the one the exact distribution gives for those bits (docs/privacy.md, "How noise is
drawn"). It never draws a batch, never chooses which elements reach stage 2 or 3 or how many slots
a batch runs, and never counts work: dpproxy.privacy.sampling does all that, and keeps SamplerStats.
The only random bits it reads are stage 3's further words of a uniform already begun, from the source
it is handed. Nothing here returns a floating-point value as a random output, and it never sees SQL,
true values or group keys.
"""

from __future__ import annotations

import math
from decimal import (
    MAX_EMAX,
    MIN_EMIN,
    ROUND_CEILING,
    ROUND_FLOOR,
    ROUND_HALF_EVEN,
    Context,
    Decimal,
    DivisionByZero,
    InvalidOperation,
)
from fractions import Fraction
from functools import lru_cache
from typing import Protocol

# Shared with the float stage (dpproxy.privacy.sampling imports them from here).
# Integers below this are exact in float64 with room for k + 1: beyond it the float path defers.
_FLOAT_INT_LIMIT = 2.0**52
# Absolute allowances that cover results in (or rounded to) the subnormal range.
_TINY = 2.0**-1000

# |computed − true| of stage 2's −ln U is at most this times (1 + −ln U) (about 2^-98 in fact: 15
# double-double operations of relative error <= 16u² each on values <= 1 + −ln U, a series truncated
# at 2^-112; the test compares it with `decimal` on adversarial inputs).
_DD_LOG_ERROR = 2.0**-92


class _Words(Protocol):
    """Further uniform 64-bit words, one at a time (dpproxy.privacy.sampling._Bits)."""

    def word(self) -> int: ...


# ---------------------------------------------------------------------------------------------------
# Stage 2: double-double arithmetic (pairs hi + lo of float64s, ~106 bits), one slot at a time in
# Python floats: the same operations whatever the slot holds, and no numpy call overhead (a batch
# runs at least one slot). The building blocks are error-free transformations and the algorithms of
# Joldes, Muller & Popescu, "Tight and rigorous error bounds for basic building blocks of double-word
# arithmetic" (2017); u = 2^-53.

_SPLITTER = 134217729.0  # 2^27 + 1


def _two_sum(a: float, b: float) -> tuple[float, float]:
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _fast_two_sum(a: float, b: float) -> tuple[float, float]:
    """Exact for |a| >= |b| (or a = 0)."""
    s = a + b
    return s, b - (s - a)


def _two_prod(a: float, b: float) -> tuple[float, float]:
    p = a * b
    c = _SPLITTER * a
    ah = c - (c - a)
    al = a - ah
    c = _SPLITTER * b
    bh = c - (c - b)
    bl = b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _dd_add(xh: float, xl: float, yh: float, yl: float) -> tuple[float, float]:
    """AccurateDWPlusDW: relative error <= 3u²."""
    sh, sl = _two_sum(xh, yh)
    th, tl = _two_sum(xl, yl)
    sh, sl = _fast_two_sum(sh, sl + th)
    return _fast_two_sum(sh, sl + tl)


def _dd_add_f(xh: float, xl: float, y: float) -> tuple[float, float]:
    """DWPlusFP: relative error <= 2u²."""
    sh, sl = _two_sum(xh, y)
    return _fast_two_sum(sh, xl + sl)


def _dd_mul(xh: float, xl: float, yh: float, yl: float) -> tuple[float, float]:
    """DWTimesDW without a fused multiply-add: relative error <= 7u²."""
    ch, cl = _two_prod(xh, yh)
    return _fast_two_sum(ch, cl + (xh * yl + (xl * yh + xl * yl)))


def _dd_mul_f(xh: float, xl: float, y: float) -> tuple[float, float]:
    """DWTimesFP1: relative error <= 2u²."""
    ch, cl1 = _two_prod(xh, y)
    th, tl = _fast_two_sum(ch, xl * y)
    return _fast_two_sum(th, tl + cl1)


def _dd_div(xh: float, xl: float, yh: float, yl: float) -> tuple[float, float]:
    """DWDivDW2: relative error <= 15u² + 56u³."""
    th = xh / yh
    rh, rl = _dd_mul_f(yh, yl, th)
    return _fast_two_sum(th, ((xh - rh) + (xl - rl)) / yh)


def _dd_from_fraction(value: Fraction) -> tuple[float, float]:
    """hi + lo within 2^-106 relative of value (both roundings to nearest)."""
    hi = float(value)
    return hi, float(value - Fraction(hi))


@lru_cache(maxsize=1)
def _log_tables() -> tuple[list[float], list[float], float, float, float]:
    """ln(c_j), c_j = 1 + (j + 1/2)/256, as double-doubles; ln 2 as 40 + 53 + 53 bits (so E·ln 2 is
    exact in its first two parts for |E| < 2^13)."""
    ctx = Context(prec=60)
    his, los = [], []
    for j in range(256):
        value = ctx.ln(ctx.add(1, ctx.divide(2 * j + 1, 512)))
        hi = float(value)
        his.append(hi)
        los.append(float(ctx.subtract(value, Decimal(hi))))
    ln2 = ctx.ln(2)
    first = math.ldexp(float(ctx.multiply(ln2, 1 << 40).to_integral_value()), -40)
    second = float(ctx.subtract(ln2, Decimal(first)))
    third = float(ctx.subtract(ctx.subtract(ln2, Decimal(first)), Decimal(second)))
    return his, los, first, second, third


_TWO_THIRDS_HI, _TWO_THIRDS_LO = _dd_from_fraction(Fraction(2, 3))


def _dd_neg_log(prefix: int, w1: int, w2: int) -> tuple[float, float, float] | None:
    """−ln U as a double-double for U whose first 181 bits are `prefix` (53 bits), w1 and w2 (64 each).

    Returns (hi, lo, width): the true −ln U is in [hi + lo − width − e, hi + lo + e] with
    e = _DD_LOG_ERROR·(1 + hi) for every U those bits allow; None when U's first 117 bits are all
    zero (left to stage 3).
    """
    # R = U·2^53 = prefix + w1/2^64 + w2/2^128 when the prefix is not 0 (R >= 1); otherwise
    # R = U·2^117 = w1 + w2/2^64 (R >= 1 unless w1 = 0): exact parts, then one rounded sum. The bits
    # left out (w2's last 11, U's past the 181st) are below 2^-116 (2^-52 with the prefix 0) in units
    # of R: through −ln, U's interval is that much over R wide at most.
    if prefix:
        rh, rl = _two_sum(float(prefix), (w1 >> 11) * 2.0**-53)
        rh, rl = _dd_add_f(rh, rl, (w1 & 2047) * 2.0**-64 + (w2 >> 11) * 2.0**-117)
        shift, width = -53, 2.0**-116 / rh
    elif w1:
        rh, rl = _two_sum(float((w1 >> 11) << 11), float(w1 & 2047))
        rh, rl = _dd_add_f(rh, rl, (w2 >> 11) * 2.0**-53)
        shift, width = -117, 2.0**-52 / rh
    else:
        return None
    # R = f·2^(e−1), f ∈ [1, 2); ln f = ln c_j + 2·atanh(s), s = (f − c_j)/(f + c_j), |s| <= 2^-10.
    mantissa, exponent = math.frexp(rh)
    fh = mantissa * 2.0
    fl = math.ldexp(rl, 1 - exponent)
    j = min(math.floor((fh - 1.0) * 256.0), 255)
    c = 1.0 + (j + 0.5) / 256.0
    dh, dl = _two_sum(fh - c, fl)  # fh − c is exact (Sterbenz)
    qh, ql = _two_sum(fh, c)
    qh, ql = _fast_two_sum(qh, ql + fl)
    sh, sl = _dd_div(dh, dl, qh, ql)
    s2h, s2l = _dd_mul(sh, sl, sh, sl)
    s3h, s3l = _dd_mul(s2h, s2l, sh, sl)
    t3h, t3l = _dd_mul(s3h, s3l, _TWO_THIRDS_HI, _TWO_THIRDS_LO)
    # 2s⁵/5 + 2s⁷/7 + 2s⁹/9 <= 2^-51: float is enough; the next term is below 2^-112.
    tail = (s3h * s2h) * (0.4 + s2h * (2.0 / 7.0 + s2h * (2.0 / 9.0)))
    ah, al = _dd_add(2.0 * sh, 2.0 * sl, t3h, t3l)
    ah, al = _dd_add_f(ah, al, tail)
    ln_c_hi, ln_c_lo, ln2_first, ln2_second, ln2_third = _log_tables()
    lh, ll = _dd_add(ln_c_hi[j], ln_c_lo[j], ah, al)
    # ln U = ln f + E·ln 2, E = e − 1 + shift.
    e = float(exponent - 1 + shift)
    ph, pl = _two_prod(e, ln2_second)
    ph, pl = _dd_add_f(ph, pl, e * ln2_first)
    ph, pl = _dd_add_f(ph, pl, e * ln2_third)
    lh, ll = _dd_add(lh, ll, ph, pl)
    return -lh, -ll, width


def _stage2_geometric(prefix: int, w1: int, w2: int, scale: float) -> int | None:
    """floor(−scale·ln U), scale < 2^31, or None when not proved."""
    neg_log = _dd_neg_log(prefix, w1, w2)
    if neg_log is None:
        return None
    xh, xl, width = neg_log
    vh, vl = _dd_mul_f(xh, xl, scale)
    above = scale * _DD_LOG_ERROR * (1.0 + xh) + abs(vh) * 2.0**-100 + _TINY  # v <= vh + vl + above
    below = above + scale * width  # v >= vh + vl − below
    k = math.floor(vh)
    if vh == k and vl < 0.0:  # vh + vl is just below the integer vh
        k -= 1
    d1, e1 = _two_sum(vh - k, vl)  # the fraction vh + vl − k ∈ [0, 1), exactly d1 + e1 (vh − k exact)
    if (
        d1 + e1 >= below * (1.0 + 2.0**-50)
        and (1.0 - d1) - e1 > above * (1.0 + 2.0**-50)
        and vh < _FLOAT_INT_LIMIT
    ):
        return k
    return None


def _stage2_bernoulli(prefix: int, w1: int, w2: int, gamma: tuple[float, float, float]) -> bool | None:
    """V < exp(−γ), i.e. −ln V > γ, or None when not proved; γ within gamma[2] of gamma[0] + gamma[1]."""
    neg_log = _dd_neg_log(prefix, w1, w2)
    if neg_log is None:
        return None
    xh, xl, width = neg_log
    gh, gl, gamma_error = gamma
    dh, dl = _dd_add(xh, xl, -gh, -gl)  # −ln V − γ
    above = (_DD_LOG_ERROR * (1.0 + xh) + gamma_error + abs(dh) * 2.0**-100 + _TINY) * (1.0 + 2.0**-50)
    below = above + width * (1.0 + 2.0**-50)
    if (dh - below) + dl > 0.0:
        return True
    if (dh + above) + dl < 0.0:
        return False
    return None


# ---------------------------------------------------------------------------------------------------
# Stage 3: exact decisions with `decimal`. Decimal's ln is correctly rounded (to nearest), so the
# neighbours of a result bracket the true value; products and quotients are rounded towards −∞ or +∞.


def _contexts(prec: int) -> tuple[Context, Context, Context]:
    traps = [InvalidOperation, DivisionByZero]
    common = {"prec": prec, "Emin": MIN_EMIN, "Emax": MAX_EMAX, "traps": traps}
    return (
        Context(rounding=ROUND_HALF_EVEN, **common),
        Context(rounding=ROUND_FLOOR, **common),
        Context(rounding=ROUND_CEILING, **common),
    )


def _ln_bounds(x: int, near: Context) -> tuple[Decimal, Decimal]:
    """[lo, hi] ∋ ln(x), x >= 1 an integer."""
    value = near.ln(Decimal(x))
    return value.next_minus(near), value.next_plus(near)


def _neg_log_bounds(p: int, m: int, scale: Fraction, prec: int) -> tuple[Decimal, Decimal | None]:
    """Bounds on −scale·ln U over U ∈ [p/2^m, (p + 1)/2^m): [lo, hi], hi None when p = 0 (unbounded)."""
    near, down, up = _contexts(prec)
    ln2_lo, ln2_hi = _ln_bounds(2, near)
    num, den = Decimal(scale.numerator), Decimal(scale.denominator)
    # −ln U >= m·ln 2 − ln(p + 1), the value at U's upper end.
    _, ln_next_hi = _ln_bounds(p + 1, near)
    lo = down.divide(down.multiply(down.subtract(down.multiply(Decimal(m), ln2_lo), ln_next_hi), num), den)
    if p == 0:
        return lo, None
    ln_p_lo, _ = _ln_bounds(p, near)
    hi = up.divide(up.multiply(up.subtract(up.multiply(Decimal(m), ln2_hi), ln_p_lo), num), den)
    return lo, hi


def _precision(m: int, magnitude: float) -> int:
    """Digits that resolve a prefix of m bits of U on a value of about `magnitude` grid units."""
    return 30 + math.ceil(0.302 * m) + max(0, math.ceil(math.log10(max(magnitude, 1.0))))


def _exact_geometric(p: int, m: int, scale: Fraction, bits: _Words) -> int:
    """floor(−scale·ln U) for U whose first m bits are p, reading 64 more bits of U at a time as needed."""
    while True:
        magnitude = float(scale) * (m * 0.7 + 1.0)
        lo, hi = _neg_log_bounds(p, m, scale, _precision(m, magnitude))
        if hi is not None:
            k = int(lo.to_integral_value(rounding=ROUND_FLOOR))
            if hi < k + 1:
                return k
        # Undecided: U's interval still straddles a cell boundary; 64 more bits of the same U.
        p = (p << 64) | bits.word()
        m += 64


def _exact_neg_log_above(p: int, m: int, gamma: Fraction, bits: _Words) -> bool:
    """−ln V > gamma (that is, V < exp(−gamma)) for V whose first m bits are p, reading more as needed.

    Compared as logarithms, never by computing exp(−gamma): a huge gamma (a tiny σ) is decided as
    soon as V's bits are not all zero, instead of hanging on a number with 10^18 digits."""
    while True:
        prec = _precision(m, m * 0.7 + 1.0)
        lo, hi = _neg_log_bounds(p, m, Fraction(1), prec)  # −ln V ∈ (lo, hi]
        _, down, up = _contexts(prec)
        g_lo = down.divide(Decimal(gamma.numerator), Decimal(gamma.denominator))
        g_hi = up.divide(Decimal(gamma.numerator), Decimal(gamma.denominator))
        if lo >= g_hi:
            return True
        if hi is not None and hi <= g_lo:
            return False
        p = (p << 64) | bits.word()
        m += 64
