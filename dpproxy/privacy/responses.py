"""Randomized response: the classic survey protocol, and a count of units that is DP by it under
add/remove.

This module owns RandomizedResponseSpec (each unit's bit reported truthfully with probability 3/4,
by OpenDP's exact Bernoulli coins), the unbiased estimate of a count of 1s and its ± at 95%, and
RandomizedResponseCount, which adds noise to each group's tallies of reports so that the release is
DP when a unit is added or removed (the reports alone are not).

It never sees SQL, group keys or who the units are: only tallies of bits per group, by position.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dpproxy.policy import Mechanism
from dpproxy.privacy import opendp_names as dp
from dpproxy.privacy.accounting import Accounting
from dpproxy.privacy.checks import check_histogram
from dpproxy.privacy.noise import ERROR_ALPHA, NoiseSpec
from dpproxy.privacy.planning import QueryNoise, plan_query_noise

# The classic survey protocol: a fair coin says "answer truthfully" or "answer by a second fair coin".
RANDOMIZED_RESPONSE_TRUTH = 0.75


@lru_cache(maxsize=1)
def _randomized_response_bit() -> dp.Measurement:
    return dp.m.make_randomized_response_bool(RANDOMIZED_RESPONSE_TRUTH)


@lru_cache(maxsize=256)
def _randomized_response_bits(length: int) -> dp.Measurement:
    # RAPPOR's flip: with probability f a bit is replaced by a fair coin, so it is reported truthfully
    # with probability 1 − f/2: f = 1/2 is the survey protocol's 3/4, bit by bit, independently.
    return dp.m.make_randomized_response_bitvec(
        dp.bitvector_domain(max_weight=length), dp.discrete_distance(), f=2 * (1 - RANDOMIZED_RESPONSE_TRUTH)
    )


# Bernoulli(q) centred is sub-Gaussian with variance proxy (1 − 2q)/(2 ln((1 − q)/q)) (Kearns & Saul
# 1998, optimal; Berend & Kontorovich 2013): for q = 1/4 or 3/4, 1/(4 ln 3) ≈ 0.228 (Hoeffding: 1/4).
_RESPONSE_VARIANCE_PROXY = 1.0 / (4.0 * math.log(3.0))


@dataclass(frozen=True)
class RandomizedResponseSpec:
    """The classic survey protocol (Warner 1965): each unit's bit is reported truthfully with
    probability 3/4 (a fair coin says truth; else a second fair coin is the answer).

    What it guarantees: ε = ln 3 (OpenDP make_randomized_response_bool(3/4), its map at d_in = 1)
    against a change of one unit's bit, even to someone who sees every reported bit; the reports are
    a post-processing of each unit's own coin, so that holds for anything computed from them.
    What it does not: under add/remove of a unit (our neighbouring relation) the reports alone are not
    DP at all. The number of respondents n changes by one with certainty, and even the count of
    reported 1s alone gives it away in small groups (n = 0: no 1 is ever reported; n = 1: one is, with
    probability >= 1/4). RandomizedResponseCount adds what is needed for that.

    Estimator of the true count of 1s: E[reported 1s] = (3/4)m + (1/4)(n − m), so m = 2·reported − n/2.
    """

    epsilon: float  # ln 3, per unit, against a change of its bit (from the map)

    def respond(self, bits: Sequence[bool]) -> list[bool]:
        """Each bit reported through the protocol, independently (one OpenDP draw per bit)."""
        flags = np.fromiter((bool(b) for b in bits), dtype=bool)
        return [bool(b) for b in self._respond(flags)]

    def respond_tallies(self, ones: Sequence[int], zeros: Sequence[int]) -> list[int]:
        """Reported 1s per group of `ones[i]` units whose bit is 1 and `zeros[i]` whose bit is 0.

        The sum of independent reports depends on the bits only through these counts, so this is
        distributed exactly as responding unit by unit: a group's bits never need to leave the database.
        """
        ones_list = check_histogram(ones, None, "tallies of 1s")
        zeros_list = check_histogram(zeros, len(ones_list), "tallies of 0s")
        sizes = np.array([a + b for a, b in zip(ones_list, zeros_list, strict=True)], dtype=np.int64)
        ends = np.cumsum(sizes)
        starts = ends - sizes
        flags = np.zeros(int(ends[-1]) if len(ends) else 0, dtype=bool)
        for start, count in zip(starts.tolist(), ones_list, strict=True):
            flags[start : start + count] = True
        reported = np.concatenate([[0], np.cumsum(self._respond(flags), dtype=np.int64)])
        return [int(reported[end] - reported[start]) for start, end in zip(starts, ends, strict=True)]

    @staticmethod
    def _respond(flags: np.ndarray) -> np.ndarray:
        if len(flags) == 0:
            return flags
        packed = np.packbits(flags).tobytes()
        released = _randomized_response_bits(len(flags))(packed)
        return np.unpackbits(np.frombuffer(released, dtype=np.uint8), count=len(flags)).astype(bool)

    @staticmethod
    def estimate(reported_ones: float, n: float) -> float:
        """Unbiased estimate of the number of units whose bit is 1: 2·reported − n/2."""
        return 2.0 * reported_ones - n / 2.0

    @staticmethod
    def error95(n: float) -> float:
        """± on `estimate` from the protocol's coins alone, at 95%, for n respondents (sub-Gaussian
        tail with Kearns-Saul's variance proxy). Pass a released n, never the true one."""
        return _response_error(max(float(n), 0.0), ERROR_ALPHA)


def _response_error(n: float, alpha: float) -> float:
    # 2·Σ(Y_i − q_i): P(|Σ| >= s) <= 2·exp(−s²/(2nσ²)).
    return 2.0 * math.sqrt(2.0 * n * _RESPONSE_VARIANCE_PROXY * math.log(2.0 / alpha))


@lru_cache(maxsize=1)
def randomized_response() -> RandomizedResponseSpec:
    return RandomizedResponseSpec(_randomized_response_bit().map(1))


@dataclass(frozen=True)
class RandomizedResponseRelease:
    """One group's released tallies, and what is estimated from them."""

    reported_ones: int  # noisy tally of reported 1s
    reported_zeros: int  # noisy tally of reported 0s
    respondents: int  # their sum: the noisy number of units n
    estimate: float  # of the number of units whose bit is 1: 1.5·ones − 0.5·zeros
    error95: float  # ± on estimate, protocol coins and tally noise together, at 95%


@dataclass(frozen=True)
class RandomizedResponseCount:
    """A count of units whose bit is 1, by randomized response, that is DP under add/remove.

    Construction: every unit's bit goes through the protocol (RandomizedResponseSpec), then each group
    releases its two tallies, reported 1s and reported 0s, each with independent noise from `noise`
    (one component of sensitivity 1 over g groups). Adding a unit adds exactly 1 to one of the two
    tallies of each of its (at most g) groups, whatever its coins said, so the tally vector moves by
    L1 = g (L2 = √g): for every outcome of the unit's coins the release is ε-DP (or ρ-zCDP) by the
    noise's map, and so is the mixture over them. Hence the cost is noise.cost, δ = 0 under pure
    accounting, and nothing needs a tail bound on n. Per unit, against a change of its bit, the release
    is also at most ln 3-DP (g·ln 3 over g groups), being a post-processing of the reports, whatever the
    noise. Noising (reported 1s, n) instead would move by L1 = 2 per group, twice the noise.
    """

    response: RandomizedResponseSpec
    noise: QueryNoise  # one component (1, g); its cost is what the ledger charges

    @property
    def tally_noise(self) -> NoiseSpec:
        return self.noise.columns[0]

    def release(self, ones: Sequence[int], zeros: Sequence[int]) -> list[RandomizedResponseRelease]:
        """Per group: `ones[i]` units whose bit is 1, `zeros[i]` whose bit is 0 (distinct units)."""
        reported = self.response.respond_tallies(ones, zeros)
        draws = self.tally_noise.sample(2 * len(reported))
        # The error bound: tally noise within a on both tallies (probability >= 1 − 2·α/4), then n is
        # at most the released n + 2a, and the coins' part at that n holds with probability 1 − α/2.
        a = self.tally_noise.error_at(ERROR_ALPHA / 4)
        releases = []
        for i, (reported_ones, group_ones, group_zeros) in enumerate(zip(reported, ones, zeros, strict=True)):
            noisy_ones = reported_ones + draws[2 * i]
            noisy_zeros = int(group_ones) + int(group_zeros) - reported_ones + draws[2 * i + 1]
            respondents = noisy_ones + noisy_zeros
            error = _response_error(max(respondents, 0) + 2 * a, ERROR_ALPHA / 2) + 2 * a
            estimate = self.response.estimate(noisy_ones, respondents)
            releases.append(RandomizedResponseRelease(noisy_ones, noisy_zeros, respondents, estimate, error))
        return releases


def randomized_response_count_plan(
    epsilon: float,
    delta: float = 0.0,
    *,
    max_groups: int = 1,
    mechanism: Mechanism | str = Mechanism.LAPLACE,
    accounting: Accounting | str = Accounting.PURE,
) -> RandomizedResponseCount:
    """The plan of a randomized-response count over groups (see RandomizedResponseCount), within the
    request's (epsilon, delta) as plan_query_noise splits it. A query releasing more than this count
    can instead pass the component (1, max_groups) to plan_query_noise itself and draw two values of
    that component's noise per group."""
    noise = plan_query_noise(mechanism, epsilon, delta, [(1, max_groups)], None, accounting=accounting)
    return RandomizedResponseCount(randomized_response(), noise)
