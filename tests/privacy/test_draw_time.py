"""Draw time does not depend on the values drawn, at every scale (docs/privacy.md, "How noise is drawn").

A batch's running time is a function of the work it does: the 64-bit words it reads, the elements of
each stage, the stage-2 slots it runs (a function of the batch size and the scale only), and two rare
events (a stage-3 decision, more undecided elements than slots). SamplerStats.work() counts exactly
those. The deterministic checks draw batches whose values are all small or all large and require the
same work; before, at scale 1e12 the large ones sent about 30% of their elements to the slow exact
path and the small ones 0.03%. Wall-clock time is measured where timings belong, in a benchmark:
`python bench/noise.py --timing` prints the AUC of a draw's time against |value| per scale.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats

from dpproxy.privacy import sampling
from dpproxy.privacy.sampling import (
    STATS,
    _bernoulli_exp_gaussian,
    _Bits,
    _geometric,
    _geometric_high,
    _geometric_undecided_bound,
    _laplace,
    _Mode,
    _slot_count,
    _split_of,
    sample_discrete_gaussian,
    sample_discrete_laplace,
)

SCALES = [1.0, 1e3, 1e6, 1e9, 1e12, 1e15, 1e20, 1e300, 2.0**-40]


def seeded(seed: int) -> Callable[[int], bytes]:
    rng = np.random.default_rng(seed)
    return lambda k: rng.bytes(k)


def prefixes_with_neg_log_in(low: float, high: float, n: int, seed: int) -> np.ndarray:
    """53-bit prefixes of U uniform on [e^−high, e^−low]: −ln U, the geometric's value over its
    scale, in [low, high]."""
    u = np.random.default_rng(seed).uniform(math.exp(-high), math.exp(-low), n)
    return np.minimum(np.floor(u * 2.0**53), 2.0**53 - 1).astype(np.uint64)


def work_of(draw: Callable[[], object]) -> tuple[int, ...]:
    STATS.reset()
    draw()
    work = STATS.work()
    assert STATS.geometric_exact == STATS.bernoulli_exact == STATS.slot_overflows == 0
    return work


@pytest.mark.parametrize("scale", SCALES)
def test_geometric_batches_of_small_and_large_values_do_the_same_work(scale: float) -> None:
    n = 4_000
    batches = {
        "small": prefixes_with_neg_log_in(0.0, 0.05, n, 1),
        "large": prefixes_with_neg_log_in(8.0, 12.0, n, 2),
        "uniform": prefixes_with_neg_log_in(0.0, 30.0, n, 3),
    }
    works, sizes = {}, {}
    for name, prefixes in batches.items():
        out: list[np.ndarray] = []

        def draw(p: np.ndarray = prefixes, into: list[np.ndarray] = out) -> None:
            into.append(_geometric(scale, p, _Bits(seeded(4)), _Mode()).values)

        works[name] = work_of(draw)
        sizes[name] = float(np.mean(np.abs(out[0].astype(np.float64))))
    assert works["small"] == works["large"] == works["uniform"]
    if scale >= 1.0:  # the batches do differ: values ~0.025·b against ~10·b
        assert sizes["large"] > 100 * sizes["small"]


@pytest.mark.parametrize("sigma", SCALES)
def test_gaussian_acceptance_of_small_and_large_candidates_does_the_same_work(sigma: float) -> None:
    """The Bernoulli(exp(−γ)) decisions on the smallest, middle and largest candidates of a pool
    (γ from about 0 to about 8 and beyond): the same work."""
    t = float(math.floor(sigma) + 1) if sigma < 2.0**52 else sigma
    pool = _laplace(t, 30_000, _Bits(seeded(5)), _Mode())
    order = np.argsort(np.abs(pool.values.astype(np.float64)), kind="stable")
    n = 4_000
    chosen = {"small": order[:n], "middle": order[13_000 : 13_000 + n], "large": order[-n:]}
    works = {
        name: work_of(
            lambda i=index: _bernoulli_exp_gaussian(pool.take(i), sigma, t, _Bits(seeded(6)), _Mode())
        )
        for name, index in chosen.items()
    }
    assert works["small"] == works["middle"] == works["large"]


@pytest.mark.parametrize("scale", SCALES)
def test_batches_do_the_same_work_whatever_they_draw(scale: float) -> None:
    """300 batches of 16 values from each sampler: no stage-3 decision, no slot overflow, and the
    same work for all batches that drew as many candidates. A batch draws more candidates only after
    rejections ((−, 0) for the Laplace, the Bernoulli for the Gaussian), and in rejection sampling
    how many are rejected is independent of the values kept."""
    source = _Bits(seeded(7))
    for sampler in (sampling._laplace, sampling._gaussian):
        works: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
        for _ in range(300):
            STATS.reset()
            sampler(scale, 16, source, _Mode())
            assert STATS.geometric_exact == STATS.bernoulli_exact == STATS.slot_overflows == 0
            works.setdefault((STATS.rounds, STATS.geometric, STATS.bernoulli), set()).add(STATS.work())
        assert all(len(same_candidates) == 1 for same_candidates in works.values())


@pytest.mark.parametrize("scale", [1e6, 1e9, 2.0**31 - 1])
def test_the_float_stage_leaves_fewer_elements_than_the_slots_assume(scale: float) -> None:
    """The slots per batch assume stage 1 leaves a draw undecided with probability at most
    _geometric_undecided_bound(b) (scale b < 2^31, the largest stage 1 sees): measured, it is below
    half of it."""
    n = 1_000_000
    prefixes = np.frombuffer(seeded(11)(8 * n), dtype="<u8") >> np.uint64(11)
    STATS.reset()
    _geometric_high(prefixes, scale, _Bits(seeded(12)), _Mode())
    assert STATS.geometric_undecided <= 0.5 * n * _geometric_undecided_bound(scale)
    assert _split_of(scale)[0] == 0


@pytest.mark.parametrize(("n", "p"), [(1, 2.0**-40), (16, 1e-10), (10_000, 1e-4), (4_000_000, 2.0**-12)])
def test_slot_counts_leave_overflow_below_two_to_the_minus_64(n: int, p: float) -> None:
    slots = _slot_count(n, p)
    assert stats.binom.logsf(slots, n, p) <= math.log(2.0**-64)
    assert slots == n or stats.binom.logsf(slots - 1, n, p) > math.log(2.0**-64) - 20  # and not wasteful


_TINY_SCALES = """
import sys
import numpy as np
from dpproxy.privacy.exact_stages import _exact_neg_log_above
from dpproxy.privacy.sampling import _Bits, sample_discrete_gaussian, sample_discrete_laplace
from fractions import Fraction
for scale in (2.0**-30 * 0.99, 2.0**-31, 2.0**-100, 1e-300, 5e-324):
    for force in (False, True):
        n = 200 if force else 20_000
        for sampler in (sample_discrete_gaussian, sample_discrete_laplace):
            draws = sampler(scale, n, force_exact=force)
            assert draws.shape == (n,) and not draws.any(), (scale, force)
# V < exp(-2^80) is decided from V's first nonzero bit, not by computing exp(-2^80).
words = iter([0, 1])
bits = _Bits(lambda k: next(words).to_bytes(8, "little"))
assert _exact_neg_log_above(0, 53, Fraction(2**80), bits) is False
for scale in (1.7976931348623157e308, 1e300):
    for sampler in (sample_discrete_gaussian, sample_discrete_laplace):
        assert sampler(scale, 50).dtype == object
print("ok")
"""


def test_every_positive_scale_returns_promptly() -> None:
    """σ below 2^-30 used to hang the discrete Gaussian (exp(−γ) of a γ near 2^59 turned into a
    number with 10^18 digits). At every positive float scale, down to the smallest subnormal and up
    to the largest float, both samplers answer — exactly: below 2^-20, P(Z ≠ 0) < e^(−2^39) — and
    in a subprocess, so that a hang in C fails the test instead of blocking it."""
    result = subprocess.run(
        [sys.executable, "-c", _TINY_SCALES], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    # In-process too, for the samplers' defaults.
    assert not sample_discrete_gaussian(2.0**-40, 1_000).any()
    assert not sample_discrete_laplace(2.0**-40, 1_000).any()
