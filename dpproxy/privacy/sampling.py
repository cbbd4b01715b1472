"""Exact, vectorised samplers of the discrete Laplace and discrete Gaussian, from the OS CSPRNG, whose
running time does not depend on the values drawn.

This module owns the draws behind NoiseSpec.sample: n independent values of

- the discrete Laplace with scale b, P(Z = z) ∝ exp(−|z|/b), and
- the discrete Gaussian with scale σ, P(Z = z) ∝ exp(−z²/(2σ²)),

where b and σ are the float scale read as an exact rational (Fraction(scale)): the distributions
OpenDP's make_laplace / make_gaussian sample on integer vectors. Calibration and costs are not here
(dpproxy.privacy.noise keeps OpenDP's maps for those); only the draw is.

How (the argument is docs/privacy.md, "How noise is drawn"): a geometric G = floor(−b·ln U) by
inversion, U a uniform real of which only the bits needed are read; at scales from 2^31 up, G is
2^K·H + L with L's K bits uniform, kept with probability exp(−L/b), and H a geometric of scale
b/2^K in [2^30, 2^31). The discrete Laplace is ±G with the sign from the same word, (−, 0) rejected;
the discrete Gaussian is Canonne, Kamath & Steinke 2020, Algorithm 3, its Bernoulli(exp(−γ)) read as
"−ln V > γ". Every decision is taken in three stages, each only where it has proved its answer:

1. float64 on every element, with rigorous error bounds;
2. double-double arithmetic on U's first 181 bits, on a fixed number of slots per batch: the
   elements stage 1 left undecided, padded with others up to a count that depends only on the batch
   size and the scale (more than that happens with probability below 2^-64);
3. `decimal`, reading more bits of the same U until decided, for what stage 2 left (below 2^-55 of
   the undecided elements).

So a batch does the same work whatever values it draws, except with probability below 2^-40 per
batch of up to 4M draws, at every scale (docs/privacy.md, "Why draw time does not depend on the
values drawn", says what holds; tests/privacy/test_draw_time.py measures it). Nothing
here uses a floating-point value as a random output, so no Mironov-style attack applies.

Of the three stages, this module runs stage 1 and schedules stages 2 and 3 (which elements reach
them, how many slots a batch runs, which bits each reads, the counts in STATS); it never takes a
stage-2 or stage-3 decision itself: those, with their error bounds, are dpproxy.privacy.exact_stages'.

Random bits come from `bytes_source` (os.urandom unless a test injects a deterministic source), in
bulk, at most _MAX_REQUEST bytes per call. It never sees SQL, true values or group keys.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from dpproxy.privacy.exact_stages import (
    _FLOAT_INT_LIMIT,
    _TINY,
    _dd_add,
    _dd_from_fraction,
    _dd_mul,
    _exact_geometric,
    _exact_neg_log_above,
    _fast_two_sum,
    _stage2_bernoulli,
    _stage2_geometric,
    _two_prod,
    _two_sum,
)

BytesSource = Callable[[int], bytes]

# Bytes asked of the source per call: a few draws' worth of a large batch, never more than 1 MiB.
_MAX_REQUEST = 1 << 20

# A uniform U in [0, 1) is read 53 bits at a time first: its prefix r gives U ∈ [r/2^53, (r+1)/2^53),
# both ends exact float64s. The 11 low bits of the same 64-bit word are independent of r: bit 0 is
# the discrete Laplace's sign.
_PREFIX_BITS = 53
_TWO_M53 = 2.0**-53
_U = 2.0**-53  # the unit roundoff of float64
# Error allowances of the float decisions, relative: np.log, np.exp and np.expm1 are assumed within
# 16 ulps (2^-52 relative each), far above the < 1 ulp of the implementations
# (tests/privacy/test_sampling.py checks them against correctly rounded `decimal` values); every
# float multiply or divide adds 2^-53.
_LOG_SLACK = 64 * 2.0**-52  # covers log (16 ulps) + one product (1/2 ulp) + rounding the bound itself
_EXP_SLACK = 64 * 2.0**-52
# Values at least this large in magnitude make the result an object array of Python ints.
_INT64_SAFE = 1 << 62

# Stage 2: a slot reads two more words of its U, which is then known to 53 + 128 = 181 bits.
_SLOT_WORDS = 2
_SLOT_BITS = _PREFIX_BITS + 64 * _SLOT_WORDS
# Slots per batch are chosen so that more undecided elements than slots has probability <= this.
_SLOT_OVERFLOW = 2.0**-64

# Geometric scales from 2^_SPLIT_BITS up are split into 2^K·H + L, H of scale in [2^30, 2^31).
_SPLIT_BITS = 31
# 2^K·H + L stays an int64 up to this K (H < 2^38 once decided by stages 1 and 2).
_INT64_SPLIT_BITS = 24
# Below this σ the discrete Gaussian's γ is bounded without dividing by σ (docs: "tiny σ").
_TINY_SIGMA = 2.0**-20
_TINY_SIGMA_GAMMA = 2.0**38  # γ >= this for every |y| >= 1 when σ < _TINY_SIGMA


def _geometric_undecided_bound(scale: float) -> float:
    """An upper bound on the probability that stage 1 leaves a geometric draw of scale <= 2^31
    undecided: about b·2^-44.7 (float error on −b·ln U, and U's 53-bit grid), taken 3× wider;
    tests/privacy/test_draw_time.py measures it."""
    return scale * 2.0**-43 + 2.0**-50


# The same for the discrete Gaussian's Bernoulli decisions (about 2^-44 at most), taken 16× wider.
_BERNOULLI_UNDECIDED_BOUND = 2.0**-40


@dataclass
class SamplerStats:
    """Counts since the process started (or since reset). For benchmarks and tests; not used by any
    decision. What a batch's time depends on: `words` (64-bit words read), the elements (`geometric`,
    `bernoulli`), the stage-2 slots run (`*_slots`, a function of the batch size and scale only), and
    the two rare events `*_exact` (stage-3 decisions) and `slot_overflows`. `*_undecided` (elements
    stage 1 left to stage 2) is informational: those elements fill slots that run anyway."""

    geometric: int = 0
    geometric_undecided: int = 0
    geometric_slots: int = 0
    geometric_exact: int = 0
    bernoulli: int = 0
    bernoulli_undecided: int = 0
    bernoulli_slots: int = 0
    bernoulli_exact: int = 0
    slot_overflows: int = 0
    rounds: int = 0  # rounds of candidates drawn (more than one only after rejections)
    words: int = 0

    def reset(self) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, 0)

    def work(self) -> tuple[int, ...]:
        """The counts a batch's running time is a function of."""
        return (
            self.words,
            self.rounds,
            self.geometric,
            self.geometric_slots,
            self.geometric_exact,
            self.bernoulli,
            self.bernoulli_slots,
            self.bernoulli_exact,
            self.slot_overflows,
        )


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
        STATS.words += n
        return np.frombuffer(b"".join(chunks), dtype="<u8").astype(np.uint64, copy=False)

    def word(self) -> int:
        STATS.words += 1
        data = self._source(8)
        if len(data) != 8:
            raise RuntimeError("the random byte source returned fewer bytes than asked")
        return int.from_bytes(data, "little")


@dataclass(frozen=True)
class _Mode:
    """How decisions are taken. Both flags are for tests: `exact` decides every element with `decimal`
    on the same bits the fast path would read (so both must give the same values), `all_slots` sends
    every element through stage 2."""

    exact: bool = False
    all_slots: bool = False


_FAST = _Mode()


# ---------------------------------------------------------------------------------------------------
# Stages 2 and 3 (their decisions are dpproxy.privacy.exact_stages'): the slots each batch runs.


@lru_cache(maxsize=4096)
def _slot_count(n: int, p: float) -> int:
    """Slots for a batch of n elements each undecided with probability <= p: the smallest s with
    P(Binomial(n, p) > s) <= _SLOT_OVERFLOW, by Chernoff's P(X >= k) <= (e·μ/k)^k·e^−μ (k > μ)."""
    mu = n * p
    target = math.log(_SLOT_OVERFLOW)
    k = math.floor(mu) + 1
    while k * (1.0 + math.log(mu / k)) - mu > target:
        k += 1
    return min(k - 1, n)


def _slots(
    undecided: np.ndarray, n: int, bound: float, bits: _Bits, mode: _Mode
) -> tuple[list[int], list[list[int]]]:
    """Stage 2's slots: the undecided elements first, then others (whose results are discarded) up to
    a count that depends on n and the scale only; and each slot's two extension words."""
    count = n if mode.all_slots else max(_slot_count(n, bound), 1)
    if len(undecided) > count:  # probability <= 2^-64 per batch
        STATS.slot_overflows += 1
        count = len(undecided)
    slots = undecided.tolist() + [i % n for i in range(count - len(undecided))]
    return slots, bits.words(_SLOT_WORDS * count).reshape(count, _SLOT_WORDS).tolist()


def _extended(prefix: int, extension: list[int]) -> int:
    """U's first 181 bits as an integer."""
    return (prefix << 128) | (extension[0] << 64) | extension[1]


# ---------------------------------------------------------------------------------------------------
# The geometric distribution, P(G >= k) = q^k, q = exp(−1/b).


@dataclass
class _Magnitudes:
    """Geometric draws: values (int64, or object when beyond int64), and the parts the discrete
    Gaussian's γ is computed from: values = 2^split·high + low, low's bits read from low_words
    (most significant first; None when split = 0), and which are kept (None: all)."""

    values: np.ndarray
    high: np.ndarray
    low_words: np.ndarray | None
    split: int
    kept: np.ndarray | None


def _split_of(scale: float) -> tuple[int, float]:
    """(K, scale/2^K): K = 0 below 2^31, else scale/2^K ∈ [2^30, 2^31) (exact: a power-of-2 scaling)."""
    if scale < 2.0**_SPLIT_BITS:
        return 0, scale
    _, exponent = math.frexp(scale)
    k = exponent - _SPLIT_BITS
    return k, math.ldexp(scale, -k)


def _geometric_high(prefixes: np.ndarray, scale: float, bits: _Bits, mode: _Mode) -> np.ndarray:
    """floor(−scale·ln U) for each U whose first 53 bits are the element of `prefixes` (uint64 < 2^53),
    scale < 2^31 a float. Returns int64, or an object array when a value is beyond the int64-safe range."""
    n = prefixes.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    low_end = prefixes.astype(np.float64)
    low_end *= _TWO_M53  # exact: prefixes < 2^53, a power-of-2 scaling
    high_end = low_end + _TWO_M53  # exact, at most 1
    with np.errstate(divide="ignore", over="ignore", under="ignore", invalid="ignore"):
        # −scale·ln U over the interval is in [lo, hi]: the float results within their error bounds
        # (products that underflow only make lo smaller, and hi carries an absolute allowance).
        hi = np.log(low_end, out=low_end)  # −inf at U's lower end 0: then undecided
        hi *= -scale * (1.0 + _LOG_SLACK)
        hi += _TINY
        lo = np.log(high_end, out=high_end)
        lo *= -scale * (1.0 - _LOG_SLACK)
        np.maximum(lo, 0.0, out=lo)  # −ln U >= 0 (and ln 1 may come out as −0)
        k = np.floor(lo, out=lo)
        out = k.astype(np.int64)  # the undecided ones are overwritten below
        k += 1.0
        decided = (hi < k) & (hi < _FLOAT_INT_LIMIT)
    undecided = np.flatnonzero(~decided)
    STATS.geometric += n
    STATS.geometric_undecided += len(undecided)
    slots, extension = _slots(undecided, n, _geometric_undecided_bound(scale), bits, mode)
    STATS.geometric_slots += len(slots)
    exact_scale = Fraction(scale)
    values: dict[int, int] = {}
    real = len(undecided)
    slot_prefixes = prefixes[slots].tolist()
    left = []
    if mode.exact:
        for i in np.flatnonzero(decided).tolist():
            values[i] = _exact_geometric(int(prefixes[i]), _PREFIX_BITS, exact_scale, bits)
        left = list(range(real))
    else:
        for j, (prefix, (w1, w2)) in enumerate(zip(slot_prefixes, extension, strict=True)):
            k2 = _stage2_geometric(prefix, w1, w2, scale)  # every slot, padding included
            if j < real:
                if k2 is None:
                    left.append(j)
                else:
                    out[slots[j]] = k2
    for j in left:
        values[slots[j]] = _exact_geometric(
            _extended(slot_prefixes[j], extension[j]), _SLOT_BITS, exact_scale, bits
        )
    STATS.geometric_exact += len(values)
    if any(v >= _INT64_SAFE for v in values.values()):
        out = out.astype(object)
    for i, v in values.items():
        out[i] = v
    return out


def _geometric(scale: float, prefixes: np.ndarray, bits: _Bits, mode: _Mode) -> _Magnitudes:
    """Geometric draws of scale `scale` (a float, read exactly), one per prefix.

    Below 2^31, inversion. From 2^31 up, G = 2^K·H + L: H of scale b/2^K ∈ [2^30, 2^31) by inversion,
    L uniform on [0, 2^K) from K fresh bits, the pair kept with probability exp(−L/b) (decided on a
    fresh word V: 1 − V > 1 − exp(−L/b)). Kept pairs have P ∝ q^(2^K·H)·q^L = q^G: G is geometric.
    """
    n = prefixes.shape[0]
    k_split, scale_high = _split_of(scale)
    high = _geometric_high(prefixes, scale_high, bits, mode)
    if k_split == 0:
        return _Magnitudes(high, high, None, 0, None)
    count = -(-k_split // 64)
    low_words = bits.words(n * count).reshape(n, count)
    acceptance = bits.words(n)
    kept = _split_acceptance(low_words, k_split, scale_high, acceptance, Fraction(scale), bits, mode)
    if k_split <= _INT64_SPLIT_BITS and high.dtype != object and (n == 0 or int(high.max()) < 1 << 37):
        values = (high << np.int64(k_split)) | (low_words[:, 0] >> np.uint64(64 - k_split)).astype(np.int64)
    else:
        values = np.array(
            [
                (int(h) << k_split) | _low_int(row, k_split)
                for h, row in zip(high.tolist(), low_words, strict=True)
            ],
            dtype=object,
        )
    return _Magnitudes(values, high, low_words, k_split, kept)


def _low_int(row: np.ndarray, k_split: int) -> int:
    """L, the first k_split bits of the row's words (most significant first), as a Python int."""
    value = int.from_bytes(row.astype(">u8").tobytes(), "big")
    return value >> (64 * len(row) - k_split)


def _low_fraction(low_words: np.ndarray, k_split: int) -> tuple[np.ndarray, float]:
    """ℓ = L/2^K in float64 (relative error <= 2^-53) and an absolute error allowance beyond it."""
    if k_split <= 64:
        low = low_words[:, 0] >> np.uint64(64 - k_split)
        return np.ldexp(low.astype(np.float64), -k_split), 0.0
    return low_words[:, 0].astype(np.float64) * 2.0**-64, 2.0**-64


def _low_fraction_dd(row: list[int], k_split: int) -> tuple[float, float]:
    """ℓ = L/2^K as a double-double from L's words (most significant first), within 2^-117
    (exact when K <= 64)."""
    if k_split <= 64:
        low = row[0] >> (64 - k_split)
        hi, lo = _fast_two_sum(float((low >> 11) << 11), float(low & 2047))
        return math.ldexp(hi, -k_split), math.ldexp(lo, -k_split)
    top = row[0]
    return _fast_two_sum(((top >> 11) << 11) * 2.0**-64, (top & 2047) * 2.0**-64 + (row[1] >> 11) * 2.0**-117)


def _split_acceptance(
    low_words: np.ndarray,
    k_split: int,
    scale_high: float,
    acceptance: np.ndarray,
    scale: Fraction,
    bits: _Bits,
    mode: _Mode,
) -> np.ndarray:
    """V < exp(−L/b) for each element: with τ = 1 − exp(−L/b) = −expm1(−ℓ/scale_high) <= 2^-30 and
    D = 2^64 − 1 − V's word, 1 − V ∈ (D/2^64, (D + 1)/2^64]: accept when D/2^64 >= τ's upper bound,
    reject when (D + 1)/2^64 <= its lower bound. Undecided only when the word is one of the one or two
    next to τ (probability about 2^-63): then `decimal` on V's further bits."""
    ell, ell_error = _low_fraction(low_words, k_split)
    tau = -np.expm1(-(ell / scale_high))
    allowance = 2.0 * ell_error / scale_high
    tau_hi = tau * (1.0 + _EXP_SLACK) + allowance + 2.0**-1070
    tau_lo = tau * (1.0 - _EXP_SLACK) - allowance
    complement = ~acceptance
    d = np.minimum(complement, np.uint64(1 << 53)).astype(np.float64) * 2.0**-64  # exact below 2^53
    accept = d >= tau_hi
    reject = (d + 2.0**-64) <= tau_lo
    undecided = np.flatnonzero(~(accept | reject)) if not mode.exact else np.arange(len(acceptance))
    for i in undecided:
        gamma = Fraction(_low_int(low_words[i], k_split)) / scale
        accept[i] = _exact_neg_log_above(int(acceptance[i]), 64, gamma, bits)
        STATS.geometric_exact += 1
    return accept


# ---------------------------------------------------------------------------------------------------
# The samplers.


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
    `force_exact` (tests only) decides every element with `decimal`.
    """
    _check(scale, n)
    return _laplace(float(scale), n, _Bits(bytes_source), _Mode(exact=force_exact)).values


@dataclass
class _Candidates:
    """Discrete Laplace draws with the parts of their magnitudes (see _Magnitudes)."""

    values: np.ndarray
    high: np.ndarray
    low_words: np.ndarray | None
    split: int

    def take(self, index: np.ndarray) -> _Candidates:
        low = None if self.low_words is None else self.low_words[index]
        return _Candidates(self.values[index], self.high[index], low, self.split)


def _laplace(scale: float, n: int, bits: _Bits, mode: _Mode) -> _Candidates:
    parts: list[_Candidates] = []
    pending = n
    # Rejection keeps a draw with probability (1 + q)/2 >= 1/2: ask for a few more than expected.
    keep = (1.0 + math.exp(-1.0 / scale)) / 2.0
    while pending > 0:
        STATS.rounds += 1
        m = min(pending + int(pending * (1.0 - keep) / keep * 1.1) + 8, 1 << 22)
        words = bits.words(m)
        magnitude = _geometric(scale, words >> np.uint64(64 - _PREFIX_BITS), bits, mode)
        negative = (words & np.uint64(1)).astype(bool)
        kept = ~(negative & (magnitude.values == 0))
        if magnitude.kept is not None:
            kept &= magnitude.kept
        index = np.flatnonzero(kept)[:pending]
        values = magnitude.values[index]
        values = np.where(negative[index], -values, values)
        low = None if magnitude.low_words is None else magnitude.low_words[index]
        parts.append(_Candidates(values, magnitude.high[index], low, magnitude.split))
        pending -= len(index)
    return _concatenate(parts, _Candidates(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), None, 0))


def _join(arrays: list[np.ndarray]) -> np.ndarray:
    if any(a.dtype == object for a in arrays):
        return np.concatenate([a.astype(object) for a in arrays])
    return np.concatenate(arrays) if len(arrays) > 1 else arrays[0]


def _concatenate(parts: list[_Candidates], empty: _Candidates) -> _Candidates:
    if not parts:
        return empty
    if len(parts) == 1:
        return parts[0]
    low = None if parts[0].low_words is None else np.concatenate([p.low_words for p in parts])  # type: ignore[misc]
    return _Candidates(_join([p.values for p in parts]), _join([p.high for p in parts]), low, parts[0].split)


@dataclass(frozen=True)
class _GaussianConstants:
    """σ and t exactly, and the floats and double-doubles γ is computed from:
    γ = (|Y|/σ − σ/t)²/2 with |Y|/σ = (H + ℓ)·a, a = 2^K/σ, ℓ = L/2^K."""

    sigma: Fraction
    t: Fraction
    tiny: bool
    a: float
    a_lo: float
    rho: float
    rho_lo: float


@lru_cache(maxsize=1024)
def _gaussian_constants(sigma: float, t: float, k_split: int) -> _GaussianConstants:
    exact_sigma, exact_t = Fraction(sigma), Fraction(t)
    if sigma < _TINY_SIGMA:
        return _GaussianConstants(exact_sigma, exact_t, True, 0.0, 0.0, 0.0, 0.0)
    a, a_lo = _dd_from_fraction(Fraction(2**k_split) / exact_sigma)
    rho, rho_lo = _dd_from_fraction(exact_sigma / exact_t)
    return _GaussianConstants(exact_sigma, exact_t, False, a, a_lo, rho, rho_lo)


def _bernoulli_exp_gaussian(
    candidates: _Candidates, sigma: float, t: float, bits: _Bits, mode: _Mode = _FAST
) -> np.ndarray:
    """For each candidate Y, V < exp(−γ), γ = (|Y| − σ²/t)²/(2σ²), V an independent uniform."""
    n = candidates.values.shape[0]
    prefixes = bits.words(n) >> np.uint64(64 - _PREFIX_BITS)
    accept = np.zeros(n, dtype=bool)
    if n == 0:
        return accept
    consts = _gaussian_constants(sigma, t, candidates.split)
    high = candidates.high
    if high.dtype == object:
        huge = np.array([h >= 1 << 52 for h in high.tolist()], dtype=bool)
        high = np.where(huge, 0, high).astype(np.int64)
    else:
        huge = high >= 1 << 52 if int(high.max()) >= 1 << 52 else None
    h = high.astype(np.float64)  # exact below 2^53
    # Bounds on −γ (arrays reused in place: this runs on every candidate).
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        if consts.tiny:
            # t = 1, no split: γ = σ²/2 for Y = 0, and γ >= 2^38 for |Y| >= 1 (|Y|/σ >= 2^20).
            minus_gamma_lo = np.where(h == 0.0, 0.0, -_TINY_SIGMA_GAMMA)
            minus_gamma_hi = np.where(
                h == 0.0, -((sigma * sigma * 0.5) * (1.0 + 4.0 * _U) + 2.0**-1070), -np.inf
            )
        else:
            ell_error = 0.0
            if candidates.low_words is not None:
                ell, ell_error = _low_fraction(candidates.low_words, candidates.split)
                h += ell
            big_a = h
            big_a *= consts.a  # |Y|/σ
            r = big_a - consts.rho
            np.abs(r, out=r)
            # |r − true r| <= 5.1u·(A + ρ) + a·ℓ's allowance: taken as 8u and 2×.
            e_r = big_a + consts.rho
            e_r *= 8.0 * _U
            e_r += 2.0 * consts.a * ell_error + 2.0**-1070
            r_hi = r + e_r
            r -= e_r
            r_lo = np.maximum(r, 0.0, out=r)
            # γ <= r_hi²/2 and >= r_lo²/2, each rounding allowed for by a factor 1 ± 4u (exact).
            minus_gamma_lo = np.multiply(r_lo, r_lo, out=r_lo)
            minus_gamma_lo *= -0.5 * (1.0 - 4.0 * _U)
            minus_gamma_hi = np.multiply(r_hi, r_hi, out=r_hi)
            minus_gamma_hi *= -0.5 * (1.0 + 4.0 * _U)
            minus_gamma_hi -= 2.0**-1070
        # exp within its slack, scaled by 2^53 (exactly) to compare with V's prefix r:
        # V ∈ [r, r + 1)/2^53. An underflowed upper bound is replaced by one that is surely above.
        exp_lo = np.exp(minus_gamma_hi, out=minus_gamma_hi)
        exp_lo *= (1.0 - _EXP_SLACK) * 2.0**53
        exp_hi = np.exp(minus_gamma_lo, out=minus_gamma_lo)
        exp_hi *= (1.0 + _EXP_SLACK) * 2.0**53
        exp_hi += _TINY * 2.0**53
    v = prefixes.astype(np.float64)
    no = v >= exp_hi
    v += 1.0  # exact: prefixes < 2^53
    yes = v <= exp_lo
    decided = yes | no
    if huge is not None:
        decided &= ~huge
    accept = yes & decided
    undecided = np.flatnonzero(~decided)
    STATS.bernoulli += n
    STATS.bernoulli_undecided += len(undecided)
    slots, extension = _slots(undecided, n, _BERNOULLI_UNDECIDED_BOUND, bits, mode)
    STATS.bernoulli_slots += len(slots)
    real = len(undecided)
    slot_prefixes = prefixes[slots].tolist()
    left = []
    if mode.exact:
        for i in np.flatnonzero(decided).tolist():
            accept[i] = _exact_neg_log_above(
                int(prefixes[i]), _PREFIX_BITS, _gamma(candidates, i, consts), bits
            )
        STATS.bernoulli_exact += n - real
        left = list(range(real))
    else:
        highs = candidates.high[slots].tolist()
        rows = [None] * len(slots) if candidates.low_words is None else candidates.low_words[slots].tolist()
        for j, (prefix, (w1, w2)) in enumerate(zip(slot_prefixes, extension, strict=True)):
            gamma = _gamma_dd(highs[j], rows[j], candidates.split, consts)  # every slot, padding included
            yes = _stage2_bernoulli(prefix, w1, w2, gamma)
            if j < real:
                if yes is None or highs[j] >= 1 << 52:
                    left.append(j)
                else:
                    accept[slots[j]] = yes
    for j in left:
        i = slots[j]
        v = _extended(slot_prefixes[j], extension[j])
        accept[i] = _exact_neg_log_above(v, _SLOT_BITS, _gamma(candidates, i, consts), bits)
        STATS.bernoulli_exact += 1
    return accept


def _gamma(candidates: _Candidates, i: int, consts: _GaussianConstants) -> Fraction:
    y = abs(int(candidates.values[i]))
    sigma = consts.sigma
    return (y - sigma * sigma / consts.t) ** 2 / (2 * sigma * sigma)


def _gamma_dd(
    high: int, row: list[int] | None, k_split: int, consts: _GaussianConstants
) -> tuple[float, float, float]:
    """γ for a candidate of magnitude 2^K·high + L as a double-double, and a bound on its error."""
    h = float(min(high, 1 << 52))  # exact; larger ones are left to stage 3
    if consts.tiny:
        if high:  # only a rejection can be proved: −ln V <= 126 < 2^38 <= γ
            return _TINY_SIGMA_GAMMA, 0.0, 0.0
        sigma = float(consts.sigma)
        sh, sl = _two_prod(sigma, sigma)
        return sh * 0.5, sl * 0.5, 2.0**-1000
    ell_hi, ell_lo = (0.0, 0.0) if row is None else _low_fraction_dd(row, k_split)
    yh, yl = _two_sum(h, ell_hi)
    yh, yl = _fast_two_sum(yh, yl + ell_lo)
    ah, al = _dd_mul(yh, yl, consts.a, consts.a_lo)  # |Y|/σ
    rh, rl = _dd_add(ah, al, -consts.rho, -consts.rho_lo)  # |Y|/σ − σ/t
    gh, gl = _dd_mul(rh, rl, rh, rl)
    error = 2.0**-100 * (ah + consts.rho + 1.0) * (abs(rh) + 1.0) + 2.0**-1000
    return gh * 0.5, gl * 0.5, error


def sample_discrete_gaussian(
    scale: float, n: int, bytes_source: BytesSource = os.urandom, *, force_exact: bool = False
) -> np.ndarray:
    """n independent draws of Z with P(Z = z) ∝ exp(−z²/(2·scale²)), scale read exactly as a rational.

    Canonne, Kamath & Steinke 2020, Algorithm 3: Y discrete Laplace with scale t, kept with
    probability exp(−(|Y| − σ²/t)²/(2σ²)); rejected candidates are redrawn in bulk. The kept Y have
    P ∝ exp(−|y|/t)·exp(−(|y| − σ²/t)²/(2σ²)) ∝ exp(−y²/(2σ²)) for every t > 0; t = floor(σ) + 1 as
    in the paper below 2^52, σ itself above (both exact floats). Every σ > 0 is drawn exactly: below
    2^-20, |Y| >= 1 has γ >= 2^38 and is rejected as soon as V's bits are not all zero.
    Returns int64, or an object array of Python ints when a value is beyond ±2^62.
    """
    _check(scale, n)
    return _gaussian(float(scale), n, _Bits(bytes_source), _Mode(exact=force_exact))


def _gaussian(sigma: float, n: int, bits: _Bits, mode: _Mode) -> np.ndarray:
    t = float(math.floor(sigma) + 1) if sigma < 2.0**52 else sigma
    parts: list[np.ndarray] = []
    pending = n
    while pending > 0:
        # Acceptance is above 1/2 for every σ (CKS20, §5.3; about 0.6 to 0.8): oversample by half.
        STATS.rounds += 1
        m = min(pending + pending // 2 + 8, 1 << 22)
        candidates = _laplace(t, m, bits, mode)
        accepted = candidates.values[_bernoulli_exp_gaussian(candidates, sigma, t, bits, mode)][:pending]
        parts.append(accepted)
        pending -= accepted.shape[0]
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return _join(parts)
