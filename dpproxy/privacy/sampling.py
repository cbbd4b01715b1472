"""Exact, vectorised samplers of the discrete Laplace and discrete Gaussian, from the OS CSPRNG.

This module owns the draws behind NoiseSpec.sample: n independent values of

- the discrete Laplace with scale b, P(Z = z) ∝ exp(−|z|/b), and
- the discrete Gaussian with scale σ, P(Z = z) ∝ exp(−z²/(2σ²)),

where b and σ are the float scale read as an exact rational (Fraction(scale)): the distributions
OpenDP's make_laplace / make_gaussian sample on integer vectors. Calibration and costs are not here
(dpproxy.privacy.noise keeps OpenDP's maps for those); only the draw is.

How (the argument is docs/privacy.md, "How noise is drawn"): a geometric G = floor(−b·ln U) by
inversion, U a uniform real of which only the bits needed are read. Most elements are decided in
float64, but only when a rigorous error bound proves the whole interval of U that the bits read so far
allow lies in one cell [k, k + 1); the rest are decided exactly with `decimal` and directed bounds,
reading more bits of the same U until decided (never redrawing it, which would bias the result).
The discrete Laplace is ±G with the sign from the same word, (−, 0) rejected; the discrete Gaussian is
Canonne, Kamath & Steinke 2020, Algorithm 3, with its Bernoulli(exp(−γ)) decided the same way.
Nothing here uses a floating-point value as a random output, so no Mironov-style attack applies.

Random bits come from `bytes_source` (os.urandom unless a test injects a deterministic source), in
bulk, at most _MAX_REQUEST bytes per call. It never sees SQL, true values or group keys.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
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

import numpy as np

BytesSource = Callable[[int], bytes]

# Bytes asked of the source per call: a few draws' worth of a large batch, never more than 1 MiB.
_MAX_REQUEST = 1 << 20

# A uniform U in [0, 1) is read 53 bits at a time first: its prefix r gives U ∈ [r/2^53, (r+1)/2^53),
# both ends exact float64s. The 11 low bits of the same 64-bit word are independent of r: bit 0 is
# the discrete Laplace's sign.
_PREFIX_BITS = 53
_TWO_M53 = 2.0**-53
# Error allowances of the float decisions, relative: np.log / np.exp are assumed within 16 ulps
# (2^-52 relative each), far above the < 1 ulp of the implementations (tests/privacy/test_sampling.py
# checks them against correctly rounded `decimal` values); every float multiply or divide adds 2^-53.
_LOG_SLACK = 64 * 2.0**-52  # covers log (16 ulps) + one product (1/2 ulp) + rounding the bound itself
_EXP_SLACK = 64 * 2.0**-52
# Integers below this are exact in float64 with room for k + 1: beyond it the float path defers.
_FLOAT_INT_LIMIT = 2.0**52
# Scales the float path accepts; outside (never in practice), every element is decided exactly.
_FLOAT_MIN_SCALE = 2.0**-30
_FLOAT_MAX_SCALE = 2.0**60
# Values at least this large in magnitude make the result an object array of Python ints.
_INT64_SAFE = 1 << 62


@dataclass
class SamplerStats:
    """Counts since the process started (or since reset): elements decided, and those the float path
    left to the exact fallback. For benchmarks; not used by any decision."""

    geometric: int = 0
    geometric_exact: int = 0
    bernoulli: int = 0
    bernoulli_exact: int = 0

    def reset(self) -> None:
        self.geometric = self.geometric_exact = self.bernoulli = self.bernoulli_exact = 0


STATS = SamplerStats()


class _Bits:
    """Uniform 64-bit words from a byte source, fetched in bulk."""

    def __init__(self, source: BytesSource) -> None:
        self._source = source

    def words(self, n: int) -> np.ndarray:
        """n independent uniform words, as a uint64 array."""
        chunks = []
        remaining = 8 * n
        while remaining > 0:
            size = min(remaining, _MAX_REQUEST)
            data = self._source(size)
            if len(data) != size:
                raise RuntimeError("the random byte source returned fewer bytes than asked")
            chunks.append(data)
            remaining -= size
        return np.frombuffer(b"".join(chunks), dtype="<u8").astype(np.uint64, copy=False)

    def word(self) -> int:
        return int.from_bytes(self._source(8), "little")


# ---------------------------------------------------------------------------------------------------
# Exact decisions with `decimal`. Decimal's ln and exp are correctly rounded (to nearest), so the
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


def _exact_geometric(prefix: int, scale: Fraction, bits: _Bits) -> int:
    """floor(−scale·ln U) for U whose first 53 bits are `prefix`, reading more bits of U as needed."""
    p, m = prefix, _PREFIX_BITS
    magnitude = float(scale) * 64.0
    while True:
        lo, hi = _neg_log_bounds(p, m, scale, _precision(m, magnitude))
        if hi is not None:
            k = int(lo.to_integral_value(rounding=ROUND_FLOOR))
            if hi < k + 1:
                return k
        # Undecided: U's interval still straddles a cell boundary; 64 more bits of the same U.
        p = (p << 64) | bits.word()
        m += 64
        magnitude = float(scale) * (m * 0.7 + 1.0)


def _exact_bernoulli_exp(prefix: int, gamma: Fraction, bits: _Bits) -> bool:
    """V < exp(−gamma) for V uniform in [0, 1) whose first 53 bits are `prefix`, reading more as needed."""
    p, m = prefix, _PREFIX_BITS
    while True:
        near, down, up = _contexts(30 + math.ceil(0.302 * m))
        g_lo = down.divide(Decimal(gamma.numerator), Decimal(gamma.denominator))
        g_hi = up.divide(Decimal(gamma.numerator), Decimal(gamma.denominator))
        e_lo = near.exp(g_hi.copy_negate()).next_minus(near)
        e_hi = near.exp(g_lo.copy_negate()).next_plus(near)
        if Fraction(p + 1, 1 << m) <= Fraction(e_lo):
            return True
        if Fraction(p, 1 << m) >= Fraction(e_hi):
            return False
        p = (p << 64) | bits.word()
        m += 64


# ---------------------------------------------------------------------------------------------------
# Float decisions with a rigorous margin.


def _float_scale(scale: Fraction) -> float | None:
    """The scale as a float64 when it is one exactly and within the float path's range, else None."""
    approx = float(scale)
    if Fraction(approx) != scale or not _FLOAT_MIN_SCALE <= approx <= _FLOAT_MAX_SCALE:
        return None
    return approx


def _geometric_from_prefixes(
    prefixes: np.ndarray, exact_scale: Fraction, bits: _Bits, force_exact: bool = False
) -> np.ndarray:
    """floor(−scale·ln U) for each U whose first 53 bits are the element of `prefixes` (uint64 < 2^53).

    Returns int64, or an object array of Python ints if some value is beyond the int64-safe range.
    """
    n = prefixes.shape[0]
    out = np.zeros(n, dtype=np.int64)
    if n == 0:
        return out
    scale = _float_scale(exact_scale)
    if force_exact or scale is None:
        undecided = np.arange(n)
    else:
        low_end = prefixes.astype(np.float64) * _TWO_M53  # exact: prefixes < 2^53, a power-of-2 scaling
        high_end = (prefixes + np.uint64(1)).astype(np.float64) * _TWO_M53  # exact, at most 1
        with np.errstate(divide="ignore"):
            neg_log_low = -np.log(low_end)  # +inf at U's lower end 0: then undecided
        neg_log_high = np.where(high_end == 1.0, 0.0, -np.log(high_end))
        # −scale·ln U over the interval is in [lo, hi]: the float results within their error bounds.
        # neg_log_high is 0 or >= 2^-53, and scale >= 2^-30, so no product is subnormal.
        lo = (scale * neg_log_high) * (1.0 - _LOG_SLACK)
        hi = (scale * neg_log_low) * (1.0 + _LOG_SLACK)
        k = np.floor(lo)
        decided = (hi < k + 1.0) & (hi < _FLOAT_INT_LIMIT)
        out[decided] = k[decided].astype(np.int64)
        undecided = np.flatnonzero(~decided)
    STATS.geometric += n
    STATS.geometric_exact += len(undecided)
    if len(undecided) == 0:
        return out
    values = {int(i): _exact_geometric(int(prefixes[i]), exact_scale, bits) for i in undecided}
    if any(v >= _INT64_SAFE for v in values.values()):
        out = out.astype(object)
    for i, v in values.items():
        out[i] = v
    return out


def _check(scale: float, n: int) -> None:
    if not (isinstance(scale, float | int) and math.isfinite(scale) and scale > 0):
        raise ValueError("the noise scale must be a positive finite number")
    if n < 0:
        raise ValueError("the number of draws must be >= 0")


def sample_discrete_laplace(
    scale: float, n: int, bytes_source: BytesSource = os.urandom, *, force_exact: bool = False
) -> np.ndarray:
    """n independent draws of Z with P(Z = z) ∝ exp(−|z|/scale), scale read exactly as a rational.

    ±G with G geometric (P(G >= k) = q^k, q = exp(−1/scale)) and an independent fair sign, the
    pair (−, 0) rejected: P(Z = 0) ∝ (1 − q)/2 and P(Z = ±k) ∝ (1 − q)·q^k/2 for k >= 1.
    Returns int64, or an object array of Python ints when a value is beyond ±2^62.
    `force_exact` (tests only) decides every element by the exact fallback.
    """
    _check(scale, n)
    return _laplace(Fraction(scale), n, _Bits(bytes_source), force_exact)


def _laplace(scale: Fraction, n: int, bits: _Bits, force_exact: bool) -> np.ndarray:
    parts: list[np.ndarray] = []
    pending = n
    # Rejection keeps a draw with probability (1 + q)/2 >= 1/2: ask for a few more than expected.
    keep = (1.0 + math.exp(-1.0 / float(scale))) / 2.0
    while pending > 0:
        m = min(pending + int(pending * (1.0 - keep) / keep * 1.1) + 8, 1 << 22)
        words = bits.words(m)
        magnitude = _geometric_from_prefixes(words >> np.uint64(64 - _PREFIX_BITS), scale, bits, force_exact)
        negative = (words & np.uint64(1)).astype(bool)
        kept = ~(negative & (magnitude == 0))
        values = np.where(negative, -magnitude, magnitude)[kept][:pending]
        parts.append(values)
        pending -= values.shape[0]
    return _concatenate(parts)


def _concatenate(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=np.int64)
    if any(p.dtype == object for p in parts):
        return np.concatenate([p.astype(object) for p in parts])
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def _bernoulli_exp_gaussian(
    candidates: np.ndarray, sigma: float, t: int, bits: _Bits, force_exact: bool = False
) -> np.ndarray:
    """For each candidate Y, V < exp(−γ), γ = (|Y| − σ²/t)²/(2σ²), V an independent uniform."""
    n = candidates.shape[0]
    prefixes = bits.words(n) >> np.uint64(64 - _PREFIX_BITS)
    accept = np.zeros(n, dtype=bool)
    if n == 0:
        return accept
    float_path = _float_scale(Fraction(sigma)) is not None and t < _FLOAT_INT_LIMIT
    if force_exact or candidates.dtype == object or not float_path:
        undecided = np.arange(n)
    else:
        u = 2.0**-53
        y = np.abs(candidates).astype(np.float64)  # exact below 2^53; larger ones are left undecided
        c = (sigma * sigma) / float(t)  # σ²/t within 2 roundings: |c − σ²/t| <= 3u·c
        d = np.abs(y - c)
        # |(|Y| − σ²/t)| − d| <= 3u·c + u·(d + 3u·c) <= 8u·(c + d), generously (and rounding e itself).
        e = 8.0 * u * (c + d) * (1.0 + 4.0 * u)
        two_var = 2.0 * sigma * sigma
        gamma_lo = (np.maximum(d - e, 0.0) ** 2 / two_var) * (1.0 - 16.0 * u)
        gamma_hi = ((d + e) ** 2 / two_var) * (1.0 + 16.0 * u)
        # exp within its slack; an underflowed upper bound is replaced by one that is surely above.
        exp_lo = np.exp(-gamma_hi) * (1.0 - _EXP_SLACK)
        exp_hi = np.exp(-gamma_lo) * (1.0 + _EXP_SLACK) + 2.0**-1000
        v_lo = prefixes.astype(np.float64) * _TWO_M53
        v_hi = (prefixes + np.uint64(1)).astype(np.float64) * _TWO_M53
        yes = v_hi <= exp_lo
        no = v_lo >= exp_hi
        decided = (yes | no) & (y < _FLOAT_INT_LIMIT)
        accept = yes & decided
        undecided = np.flatnonzero(~decided)
    STATS.bernoulli += n
    STATS.bernoulli_exact += len(undecided)
    if len(undecided):
        sigma_exact = Fraction(sigma)
        shift = sigma_exact * sigma_exact / t
        for i in undecided:
            gamma = (abs(int(candidates[i])) - shift) ** 2 / (2 * sigma_exact * sigma_exact)
            accept[i] = _exact_bernoulli_exp(int(prefixes[i]), gamma, bits)
    return accept


def sample_discrete_gaussian(
    scale: float, n: int, bytes_source: BytesSource = os.urandom, *, force_exact: bool = False
) -> np.ndarray:
    """n independent draws of Z with P(Z = z) ∝ exp(−z²/(2·scale²)), scale read exactly as a rational.

    Canonne, Kamath & Steinke 2020, Algorithm 3: t = floor(σ) + 1, Y discrete Laplace with scale t,
    kept with probability exp(−(|Y| − σ²/t)²/(2σ²)); rejected candidates are redrawn in bulk.
    Returns int64, or an object array of Python ints when a value is beyond ±2^62.
    """
    _check(scale, n)
    sigma = float(scale)
    t = math.floor(sigma) + 1
    bits = _Bits(bytes_source)
    parts: list[np.ndarray] = []
    pending = n
    while pending > 0:
        # Acceptance is above 1/2 for every σ (CKS20, §5.3; about 0.6 to 0.8): oversample by half.
        m = min(pending + pending // 2 + 8, 1 << 22)
        candidates = _laplace(Fraction(t), m, bits, force_exact)
        accepted = candidates[_bernoulli_exp_gaussian(candidates, sigma, t, bits, force_exact)][:pending]
        parts.append(accepted)
        pending -= accepted.shape[0]
    return _concatenate(parts)
