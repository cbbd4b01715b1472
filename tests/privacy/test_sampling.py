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
from dpproxy.privacy.sampling import (
    STATS,
    _bernoulli_exp_gaussian,
    _Bits,
    _geometric_from_prefixes,
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


def words(*values: int) -> Callable[[int], bytes]:
    """A byte source that returns the given 64-bit words, in order, then fails."""
    stream = bytearray(b"".join(v.to_bytes(8, "little") for v in values))

    def source(k: int) -> bytes:
        assert k <= len(stream), "the sampler read more bits than the test provided"
        out = bytes(stream[:k])
        del stream[:k]
        return out

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
    for scale in (0.5, 3.7, 1e6, 1e9, 1e12):
        fast = sample_discrete_laplace(scale, 2_000, seeded(4))
        exact = sample_discrete_laplace(scale, 2_000, seeded(4), force_exact=True)
        assert fast.tolist() == exact.tolist()
    for sigma in (0.5, 3.7, 1e6):
        fast = sample_discrete_gaussian(sigma, 1_000, seeded(5))
        exact = sample_discrete_gaussian(sigma, 1_000, seeded(5), force_exact=True)
        assert fast.tolist() == exact.tolist()


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
    is left to the exact path, which reads 64 more bits of the same U and decides by them."""
    for k in (1, 2, 5, 20):
        with localcontext(Context(prec=80)):
            edge = (Decimal(-k) / Decimal(scale)).exp()  # U = edge ⇔ −b·ln U = k
            prefix = math.floor(edge * 2**53)
            edge_bits = edge * 2**117 - prefix * 2**64  # where the edge is in the next word
        for extension in (0, int(edge_bits) - 1, int(edge_bits) + 2, 2**64 - 1):
            before = STATS.geometric_exact
            [value] = _geometric_from_prefixes(
                np.array([prefix], dtype=np.uint64), Fraction(scale), _Bits(words(extension))
            ).tolist()
            assert STATS.geometric_exact == before + 1  # the float path did not decide it
            u_num = prefix * 2**64 + extension
            assert (
                value
                == _exact_cell(Fraction(scale), u_num, 117)
                == _exact_cell(Fraction(scale), u_num + 1, 117)
            )
            assert value in (k - 1, k)
        # Prefixes just off the edge are decided in float, and correctly.
        for neighbour in (prefix - 3, prefix + 3):
            [value] = _geometric_from_prefixes(
                np.array([neighbour], dtype=np.uint64), Fraction(scale), _Bits(words())
            ).tolist()
            assert (
                value
                == _exact_cell(Fraction(scale), neighbour, 53)
                == _exact_cell(Fraction(scale), neighbour + 1, 53)
            )


def test_bernoulli_at_its_edge_is_resolved_exactly() -> None:
    """V's 53-bit prefix straddles exp(−γ): the answer is decided by V's next bits."""
    sigma, t = 2.5, 3
    candidate = 7
    gamma = (Fraction(candidate) - Fraction(sigma) ** 2 / t) ** 2 / (2 * Fraction(sigma) ** 2)
    with localcontext(Context(prec=80)):
        edge = (-Decimal(gamma.numerator) / Decimal(gamma.denominator)).exp()
        prefix = math.floor(edge * 2**53)
        below = math.floor(edge * 2**117 - prefix * 2**64) - 2
    for extension, expected in ((below, True), (below + 4, False), (0, True), (2**64 - 1, False)):
        source = words(prefix << 11, extension)  # the prefix is the word's top 53 bits
        [accepted] = _bernoulli_exp_gaussian(np.array([candidate]), sigma, t, _Bits(source)).tolist()
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
    """U's first 53 + 3·64 bits all zero: −ln U > 169, times b = 2^60 is past 2^63."""
    scale = 2.0**60
    tail = (2**63 + 12345, 777, 999, 2**64 - 5)
    [value] = _geometric_from_prefixes(
        np.array([0], dtype=np.uint64), Fraction(scale), _Bits(words(0, 0, 0, *tail))
    ).tolist()
    u_num, u_bits = 0, 53
    for word in (0, 0, 0, *tail):
        u_num, u_bits = u_num << 64 | word, u_bits + 64
    assert type(value) is int and value > 2**63
    assert (
        value
        == _exact_cell(Fraction(scale), u_num, u_bits)
        == _exact_cell(Fraction(scale), u_num + 1, u_bits)
    )
    # Through the public sampler: its first bulk read is 9 words, the first with prefix 0 and sign +;
    # the first element's extensions come next, then whatever the others need.
    rest = seeded(12)
    designed = bytearray(b"".join(w.to_bytes(8, "little") for w in (0, *([2**63] * 8), 0, 0, 0, *tail)))

    def source(k: int) -> bytes:
        out = bytes(designed[:k])
        del designed[:k]
        return out + rest(k - len(out))

    draws = sample_discrete_laplace(scale, 1, source)
    assert draws.dtype == object and draws.tolist() == [value]


def test_numpy_log_and_exp_are_within_the_assumed_error() -> None:
    """The float path assumes np.log and np.exp within 16 ulps; check they are within 2 here."""
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.random(2_000), rng.random(500) * 2.0**-40, 1 - rng.random(500) * 2.0**-40])
    x = x[x > 0]
    ctx = Context(prec=40)
    for values, fn, exact in (
        (x, np.log, lambda v: ctx.ln(Decimal(v))),
        (-rng.random(3_000) * 700, np.exp, lambda v: ctx.exp(Decimal(v))),
    ):
        computed = fn(values)
        for v, c in zip(values.tolist(), computed.tolist(), strict=True):
            reference = exact(v)
            assert abs(Decimal(c) - reference) <= 2 * Decimal(math.ulp(float(reference)))


def test_default_source_is_the_os() -> None:
    assert sample_discrete_laplace.__defaults__ == (os.urandom,)
    assert sample_discrete_gaussian.__defaults__ == (os.urandom,)
