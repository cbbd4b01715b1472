"""The vectorised samplers draw exactly the discrete Laplace and discrete Gaussian OpenDP draws.

Draws use a seeded byte source, so these checks are deterministic once they pass; each threshold is
still a real test (a p-value of 1e-6, or exact agreement). The OpenDP comparison draws from the OS.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from decimal import Context, Decimal, localcontext
from fractions import Fraction

import numpy as np
import opendp.prelude as dp
import pytest
from scipy import stats

from dpproxy.policy import Mechanism
from dpproxy.privacy import NoiseSpec
from dpproxy.privacy.exact_stages import _dd_neg_log
from dpproxy.privacy.sampling import (
    _SLOT_BITS,
    STATS,
    _bernoulli_exp_gaussian,
    _Bits,
    _Candidates,
    _gaussian,
    _geometric,
    _geometric_high,
    _laplace,
    _Mode,
    sample_discrete_gaussian,
    sample_discrete_laplace,
)
from tests.privacy.distributions import I64_VECTORS

dp.enable_features("contrib")

P_VALUE = 1e-6
SCALES = [0.5, 1.0, 3.7, 1e3, 1e6]


def seeded(seed: int) -> Callable[[int], bytes]:
    rng = np.random.default_rng(seed)
    return lambda k: rng.bytes(k)


def words(*values: int, then: int | None = None) -> Callable[[int], bytes]:
    """A byte source that returns the given 64-bit words, in order, then fails (or, given `then`,
    continues with seeded random bytes)."""
    stream = bytearray(b"".join(v.to_bytes(8, "little") for v in values))
    rest = None if then is None else seeded(then)

    def source(k: int) -> bytes:
        if rest is None:
            assert k <= len(stream), "the sampler read more bits than the test provided"
        out = bytes(stream[:k])
        del stream[:k]
        return out if rest is None else out + rest(k - len(out))

    return source


# Exact CDFs of the two distributions, to bucket draws into cells of known probability.


def laplace_cdf(scale: float, z: np.ndarray) -> np.ndarray:
    """P[Z <= z] for the discrete Laplace: q^(−z)/(1+q) below 0, 1 − q^(z+1)/(1+q) from 0."""
    q = math.exp(-1.0 / scale)
    z = z.astype(float)
    neg = np.exp(np.minimum(z, 0) / scale) / (1 + q)
    pos = 1 - np.exp(-(np.maximum(z, 0) + 1) / scale) / (1 + q)
    return np.where(z < 0, neg, pos)


def gaussian_cdf(sigma: float, z: np.ndarray) -> np.ndarray:
    if sigma >= 100:
        # The sum of exp(−k²/2σ²) over k <= z is the normal integral up to z + 1/2, to within
        # 1/(24σ²) relative: far below what 200,000 draws can see.
        return stats.norm.cdf((z.astype(float) + 0.5) / sigma)
    bound = math.ceil(40 * sigma) + 10
    support = np.arange(-bound, bound + 1)
    weights = np.exp(-(support.astype(float) ** 2) / (2 * sigma**2))
    cumulative = np.cumsum(weights) / weights.sum()
    return np.interp(z, support, cumulative, left=0.0, right=1.0)


def assert_fits(draws: np.ndarray, cdf: Callable[[np.ndarray], np.ndarray], spread: float) -> None:
    """Chi-square of the draws against the exact distribution, in about 40 buckets, tails included."""
    cuts = np.unique(np.round(np.linspace(-4.0, 4.0, 41) * spread).astype(np.int64))
    cells = np.diff(np.concatenate([[0.0], cdf(cuts), [1.0]]))  # (−∞, c0], (c0, c1], …, (c_last, ∞)
    keep = cells * len(draws) >= 5
    observed = np.bincount(np.searchsorted(cuts, draws.astype(np.float64), side="left"), minlength=len(cells))
    # Merge cells too small for the test into their neighbour towards the centre.
    expected = cells * len(draws)
    obs, exp = observed[keep].astype(float), expected[keep]
    obs[0] += observed[: np.argmax(keep)].sum()
    exp[0] += expected[: np.argmax(keep)].sum()
    last = len(keep) - np.argmax(keep[::-1])
    obs[-1] += observed[last:].sum()
    exp[-1] += expected[last:].sum()
    assert len(obs) >= 3
    result = stats.chisquare(obs, exp * obs.sum() / exp.sum())
    assert result.pvalue > P_VALUE, f"chi-square p = {result.pvalue:.3g}"


def laplace_spread(scale: float) -> float:
    return max(scale, 1.0)


@pytest.mark.parametrize("scale", SCALES)
def test_discrete_laplace_matches_its_pmf(scale: float) -> None:
    draws = sample_discrete_laplace(scale, 200_000, seeded(1))
    assert draws.dtype == np.int64 and draws.shape == (200_000,)
    assert_fits(draws, lambda z: laplace_cdf(scale, z), laplace_spread(scale))


@pytest.mark.parametrize("sigma", SCALES)
def test_discrete_gaussian_matches_its_pmf(sigma: float) -> None:
    draws = sample_discrete_gaussian(sigma, 200_000, seeded(2))
    assert draws.dtype == np.int64 and draws.shape == (200_000,)
    assert_fits(draws, lambda z: gaussian_cdf(sigma, z), max(sigma, 1.0))


def test_small_scales_have_the_exact_probability_of_every_value() -> None:
    """b = 0.5: P(0) = (1 − q)/(1 + q) = 0.7616, P(±1) = 0.1031 each, q = e^−2: per value, 6 errors."""
    n = 200_000
    draws = sample_discrete_laplace(0.5, n, seeded(3))
    q = math.exp(-2.0)
    for z in (-2, -1, 0, 1, 2):
        p = (1 - q) / (1 + q) * q ** abs(z)
        assert abs((draws == z).mean() - p) <= 6 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("mechanism", [Mechanism.LAPLACE, Mechanism.GAUSSIAN])
def test_same_distribution_as_opendp_samplers(mechanism: Mechanism) -> None:
    scale = 3.7
    if mechanism == Mechanism.LAPLACE:
        theirs = dp.m.make_laplace(I64_VECTORS, dp.l1_distance(T="i64"), scale=scale)
    else:
        theirs = dp.m.make_gaussian(I64_VECTORS, dp.l2_distance(T="f64"), scale=scale)
    n = 30_000
    opendp_draws = np.array(theirs([0] * n))
    ours = np.array(NoiseSpec(mechanism, 1, 1, scale, 1.0, 0.0, 0.0).sample(n))
    edges = np.arange(-12, 13)  # (−∞, −12], …, (11, 12], (12, ∞)
    table = np.array(
        [
            np.bincount(np.searchsorted(edges, x, side="left"), minlength=len(edges) + 1)
            for x in (opendp_draws, ours)
        ]
    )
    table = table[:, table.min(axis=0) >= 5]
    assert table.shape[1] >= 10
    assert stats.chi2_contingency(table).pvalue > P_VALUE


def test_float_decisions_agree_with_exact_decisions_element_by_element() -> None:
    """On the same bits, the float path and the exact path (every element forced through it) give
    the same values: the float path only decides what is already decided."""
    for scale in (0.5, 3.7, 1e6, 1e9, 1e12, 3e20):
        fast = sample_discrete_laplace(scale, 2_000, seeded(4))
        exact = sample_discrete_laplace(scale, 2_000, seeded(4), force_exact=True)
        assert fast.tolist() == exact.tolist()
    for sigma in (0.5, 3.7, 1e6, 1e13):
        fast = sample_discrete_gaussian(sigma, 1_000, seeded(5))
        exact = sample_discrete_gaussian(sigma, 1_000, seeded(5), force_exact=True)
        assert fast.tolist() == exact.tolist()


@pytest.mark.parametrize(
    "scale", [0.3, 1.0, 3.7, 1e3, 1e9, 2.0**31 - 1, 2.0**31, 1e12, 1e15, 2.0**70, 1e300, 1e-300]
)
def test_double_double_decisions_agree_with_exact_decisions_element_by_element(scale: float) -> None:
    """Every element through stage 2 (double-double on 181 bits of U) and, on the same bits, every
    element decided by `decimal`: the same values, for both samplers, across the split at 2^31."""
    slots, exact = _Mode(all_slots=True), _Mode(all_slots=True, exact=True)
    before = STATS.geometric_exact
    fast = _laplace(scale, 400, _Bits(seeded(13)), slots).values
    assert STATS.geometric_exact - before <= 1  # stage 2 settles (nearly) everything
    assert fast.tolist() == _laplace(scale, 400, _Bits(seeded(13)), exact).values.tolist()
    before = STATS.bernoulli_exact
    fast = _gaussian(scale, 300, _Bits(seeded(14)), slots)
    assert STATS.bernoulli_exact - before <= 1
    assert fast.tolist() == _gaussian(scale, 300, _Bits(seeded(14)), exact).tolist()


def test_double_double_log_is_within_its_stated_error() -> None:
    """Stage 2's −ln U against `decimal` at 90 digits, on random and adversarial bits (U near 1,
    tiny U, the prefix 0, the edges of the log table): the true −ln U of every U the 181 bits allow
    lies in [x − width − e, x + e] with e = 2^-96·(1 + x), 16 times inside the bound the decisions use."""
    rng = np.random.default_rng(15)
    n = 3_000
    prefixes = [int(v) for v in rng.integers(0, 2**53, n, dtype=np.uint64)]
    prefixes[:50] = [2**53 - 1] * 50
    prefixes[50:100] = [int(v) for v in rng.integers(0, 4, 50)]
    prefixes[100:150] = [0] * 50
    edges = [(256 + j) << 44 for j in range(256)]
    prefixes[150:406] = edges
    prefixes[406:662] = [e - 1 for e in edges]
    extensions = rng.integers(0, 2**64, (n, 2), dtype=np.uint64).tolist()
    for i in range(100, 125):
        extensions[i][0] = int(rng.integers(0, 2**8))
    with localcontext(Context(prec=90)) as ctx:
        ln2 = ctx.ln(2)
        for prefix, (w1, w2) in zip(prefixes, extensions, strict=True):
            result = _dd_neg_log(prefix, w1, w2)
            if prefix == 0 and w1 == 0:
                assert result is None
                continue
            assert result is not None
            hi, lo, width = result
            x = Decimal(hi) + Decimal(lo)
            bits = (prefix << 128) | (w1 << 64) | w2
            for u in (bits, bits + 1):  # the ends of U's interval
                true = _SLOT_BITS * ln2 - Decimal(u).ln()
                error = max(true - x, x - Decimal(width) - true, Decimal(0))
                assert error <= Decimal(2.0**-96) * (1 + true)


@pytest.mark.parametrize("scale", [1.0, 3.7])
def test_exact_fallback_alone_matches_the_laplace_pmf(scale: float) -> None:
    draws = sample_discrete_laplace(scale, 4_000, seeded(6), force_exact=True)
    assert_fits(draws, lambda z: laplace_cdf(scale, z), laplace_spread(scale))


def test_exact_fallback_alone_matches_the_gaussian_pmf() -> None:
    before = STATS.bernoulli_exact
    draws = sample_discrete_gaussian(2.5, 3_000, seeded(7), force_exact=True)
    assert STATS.bernoulli_exact - before >= 3_000
    assert_fits(draws, lambda z: gaussian_cdf(2.5, z), 2.5)


def _exact_cell(scale: Fraction, u_num: int, u_bits: int) -> int:
    """floor(−scale·ln(u_num/2^u_bits)) at 80 digits (the tests' U are far from cell edges there)."""
    ctx = Context(prec=80)
    value = ctx.multiply(
        ctx.divide(Decimal(scale.numerator), Decimal(scale.denominator)),
        ctx.subtract(ctx.multiply(Decimal(u_bits), ctx.ln(Decimal(2))), ctx.ln(Decimal(u_num))),
    )
    return math.floor(value)


@pytest.mark.parametrize("scale", [1.0, 3.7, 1e9])
def test_words_at_cell_boundaries_are_resolved_exactly(scale: float) -> None:
    """A 53-bit prefix whose interval contains exp(−k/b), where the cell changes from k to k − 1,
    is left by the float stage to stage 2, which reads 128 more bits of the same U and decides by
    them; when those bits still straddle the edge, stage 3 reads on."""
    for k in (1, 2, 5, 20):
        with localcontext(Context(prec=80)):
            edge = (Decimal(-k) / Decimal(scale)).exp()  # U = edge ⇔ −b·ln U = k
            prefix = math.floor(edge * 2**53)
            edge_bits = edge * 2**117 - prefix * 2**64  # where the edge is in the next word
            edge_next = edge * 2**181 - prefix * 2**128 - int(edge_bits) * 2**64  # and in the one after
        for extension, last in (
            (0, 5),
            (int(edge_bits) - 1, 5),
            (int(edge_bits) + 2, 5),
            (2**64 - 1, 5),
            (int(edge_bits), int(edge_next) - 3),  # the edge lies in the third word: 181 bits decide
            (int(edge_bits), int(edge_next)),  # U's 181-bit interval holds the edge: stage 3 reads on
        ):
            before, before_exact = STATS.geometric_undecided, STATS.geometric_exact
            source = words(extension, last, 0, then=16)  # stage 2's two words, then stage 3's next one
            [value] = _geometric_high(
                np.array([prefix], dtype=np.uint64), scale, _Bits(source), _Mode()
            ).tolist()
            assert STATS.geometric_undecided == before + 1  # the float stage did not decide it
            assert value in (k - 1, k)
            u_num = (prefix << 128) | (extension << 64) | last
            cells = {_exact_cell(Fraction(scale), u, _SLOT_BITS) for u in (u_num, u_num + 1)}
            if len(cells) == 1:  # 181 bits decide: stage 2 did, or stage 3 on the same bits
                assert value == cells.pop()
            else:  # stage 3 read the next word (0)
                assert STATS.geometric_exact == before_exact + 1
                assert value == _exact_cell(Fraction(scale), u_num << 64, _SLOT_BITS + 64)
            if extension in (0, 2**64 - 1):  # far from the edge: the double-doubles decide
                assert STATS.geometric_exact == before_exact
        # Prefixes just off the edge are decided by their 53 bits, and correctly.
        for neighbour in (prefix - 3, prefix + 3, prefix - 2**12, prefix + 2**12):
            [value] = _geometric_high(
                np.array([neighbour], dtype=np.uint64), scale, _Bits(seeded(17)), _Mode()
            ).tolist()
            assert (
                value
                == _exact_cell(Fraction(scale), neighbour, 53)
                == _exact_cell(Fraction(scale), neighbour + 1, 53)
            )


def test_bernoulli_at_its_edge_is_resolved_exactly() -> None:
    """V's 53-bit prefix straddles exp(−γ): the answer is decided by V's next bits."""
    sigma, t = 2.5, 3.0
    candidate = 7
    gamma = (Fraction(candidate) - Fraction(sigma) ** 2 / Fraction(t)) ** 2 / (2 * Fraction(sigma) ** 2)
    with localcontext(Context(prec=80)):
        edge = (-Decimal(gamma.numerator) / Decimal(gamma.denominator)).exp()
        prefix = math.floor(edge * 2**53)
        below = math.floor(edge * 2**117 - prefix * 2**64) - 2
    candidates = _Candidates(np.array([candidate]), np.array([candidate]), None, 0)
    for extension, expected in ((below, True), (below + 4, False), (0, True), (2**64 - 1, False)):
        source = words(prefix << 11, extension, 0, then=18)  # the prefix is the word's top 53 bits
        [accepted] = _bernoulli_exp_gaussian(candidates, sigma, t, _Bits(source)).tolist()
        assert accepted is expected


def test_signs_are_symmetric_and_zero_is_not_doubled() -> None:
    n = 400_000
    draws = sample_discrete_laplace(1.0, n, seeded(8))
    positive, negative = int((draws > 0).sum()), int((draws < 0).sum())
    # Under symmetry, positive ~ Binomial(positive + negative, 1/2): 6 standard errors.
    assert abs(positive - negative) <= 6 * math.sqrt(positive + negative)
    q = math.exp(-1.0)
    p0 = (1 - q) / (1 + q)
    assert abs((draws == 0).mean() - p0) <= 6 * math.sqrt(p0 * (1 - p0) / n)
    gaussian = sample_discrete_gaussian(1e6, n, seeded(9))
    assert abs(int((gaussian > 0).sum()) - int((gaussian < 0).sum())) <= 6 * math.sqrt(n)


def test_zero_draws_and_bad_arguments() -> None:
    for sampler in (sample_discrete_laplace, sample_discrete_gaussian):
        empty = sampler(2.0, 0, words())
        assert empty.dtype == np.int64 and empty.shape == (0,)
        with pytest.raises(ValueError):
            sampler(2.0, -1)
        for scale in (0.0, -1.0, math.inf, math.nan):
            with pytest.raises(ValueError):
                sampler(scale, 3)
    assert NoiseSpec(Mechanism.GAUSSIAN, 1, 1, 3.0, 1.0, 0.0, 0.1).sample(0) == []


def test_noise_spec_returns_python_ints_from_the_given_source() -> None:
    spec = NoiseSpec(Mechanism.LAPLACE, 1, 1, 1e12, 1.0, 1e-12, 0.0)
    draws = spec.sample(1_000, seeded(10))
    assert len(draws) == 1_000 and all(type(z) is int for z in draws)
    assert draws == spec.sample(1_000, seeded(10))
    assert draws != spec.sample(1_000)  # from the OS: equal with probability far below 1e-100


def test_values_beyond_int64_are_exact_python_ints() -> None:
    """At b = 2^60, G = 2^30·H + L: Python ints assembled from H and the 30 bits of L, some of them
    past 2^62, with the discrete Laplace's distribution."""
    scale = 2.0**60
    prefixes = np.frombuffer(seeded(19)(8 * 2_000), dtype="<u8") >> np.uint64(11)
    magnitudes = _geometric(scale, prefixes, _Bits(seeded(20)), _Mode())
    assert magnitudes.values.dtype == object and magnitudes.split == 30
    assert magnitudes.low_words is not None
    low = (magnitudes.low_words[:, 0] >> np.uint64(34)).tolist()
    assert magnitudes.values.tolist() == [
        (h << 30) | lo for h, lo in zip(magnitudes.high.tolist(), low, strict=True)
    ]
    draws = sample_discrete_laplace(scale, 20_000, seeded(21))
    assert draws.dtype == object and all(type(z) is int for z in draws.tolist())
    assert max(abs(z) for z in draws.tolist()) > 2**62
    assert_fits(draws.astype(np.float64), lambda z: laplace_cdf(scale, z), scale)


@pytest.mark.parametrize("scale", [3.0 * 2.0**31, 1e12, 1e15])
def test_split_scales_match_the_pmf(scale: float) -> None:
    assert_fits(sample_discrete_laplace(scale, 100_000, seeded(22)), lambda z: laplace_cdf(scale, z), scale)
    assert_fits(sample_discrete_gaussian(scale, 100_000, seeded(23)), lambda z: gaussian_cdf(scale, z), scale)


def test_numpy_log_and_exp_are_within_the_assumed_error() -> None:
    """The float path assumes np.log, np.exp and np.expm1 within 16 ulps; check they are within 2 here."""
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.random(2_000), rng.random(500) * 2.0**-40, 1 - rng.random(500) * 2.0**-40])
    x = x[x > 0]
    ctx = Context(prec=40)
    for values, fn, exact in (
        (x, np.log, lambda v: ctx.ln(Decimal(v))),
        (-rng.random(3_000) * 700, np.exp, lambda v: ctx.exp(Decimal(v))),
        (-rng.random(3_000) * 2.0**-30, np.expm1, lambda v: ctx.exp(Decimal(v)) - 1),
    ):
        computed = fn(values)
        for v, c in zip(values.tolist(), computed.tolist(), strict=True):
            reference = exact(v)
            assert abs(Decimal(c) - reference) <= 2 * Decimal(math.ulp(float(reference)))


def test_default_source_is_the_os() -> None:
    assert sample_discrete_laplace.__defaults__ == (os.urandom,)
    assert sample_discrete_gaussian.__defaults__ == (os.urandom,)
