"""Randomized response: the protocol costs ln 3 and tells the truth three times in four, its
estimate is unbiased within its error bound, and the noisy count of reports is DP when a unit is
added or removed.

Statistical checks use 5 or more standard errors (a false alarm is rarer than one in a million).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import opendp.prelude as dp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpproxy.policy import Mechanism
from dpproxy.privacy import randomized_response, randomized_response_count_plan
from tests.privacy.distributions import I64_VECTORS, SIGMAS, assert_privacy_loss_within

dp.enable_features("contrib")


def test_randomized_response_costs_ln3_and_tells_the_truth_three_times_in_four() -> None:
    spec = randomized_response()
    assert spec.epsilon == dp.m.make_randomized_response_bool(0.75).map(1)
    assert spec.epsilon == pytest.approx(math.log(3))
    n = 40_000
    said_yes_if_yes = sum(spec.respond([True] * n)) / n
    said_yes_if_no = sum(spec.respond([False] * n)) / n
    for observed, p in ((said_yes_if_yes, 0.75), (said_yes_if_no, 0.25)):
        assert abs(observed - p) <= SIGMAS * math.sqrt(p * (1 - p) / n)
    # Empirical privacy loss of one unit's report between its two possible bits: ln 3, both answers.
    for a, b in ((said_yes_if_yes, said_yes_if_no), (1 - said_yes_if_no, 1 - said_yes_if_yes)):
        slack = 5 * math.sqrt((1 - a) / (a * n) + (1 - b) / (b * n))
        assert abs(math.log(a / b) - spec.epsilon) <= slack
    assert spec.respond([]) == []


def test_responses_are_independent_bit_by_bit_and_tallies_match_them() -> None:
    spec = randomized_response()
    n = 20_000
    bits = [i % 3 == 0 for i in range(n)]
    reports = spec.respond(bits)
    truthful = [r == b for r, b in zip(reports, bits, strict=True)]
    pairs = Counter(zip(truthful[::2], truthful[1::2], strict=True))  # neighbours' coins are independent
    for outcome, p in (((True, True), 9 / 16), ((False, False), 1 / 16)):
        assert abs(pairs[outcome] / (n / 2) - p) <= SIGMAS * math.sqrt(p * (1 - p) / (n / 2))
    tallies = spec.respond_tallies([3, 0, 700, 0], [1, 5, 300, 0])
    assert tallies[3] == 0 and 0 <= tallies[0] <= 4 and 0 <= tallies[1] <= 5
    # Reported 1s over many groups of (60 ones, 40 zeros): mean 60·3/4 + 40/4, variance 100·3/16.
    groups = 2_000
    reported = np.array(spec.respond_tallies([60] * groups, [40] * groups), dtype=float)
    assert abs(reported.mean() - 55) <= SIGMAS * math.sqrt(100 * 3 / 16 / groups)
    assert reported.var() == pytest.approx(100 * 3 / 16, rel=0.2)  # 6 standard errors


def test_randomized_response_estimate_is_unbiased_and_error95_covers_it() -> None:
    spec = randomized_response()
    ones, zeros = 300, 700
    groups = 2_000
    reported = spec.respond_tallies([ones] * groups, [zeros] * groups)
    estimates = np.array([spec.estimate(r, ones + zeros) for r in reported])
    assert abs(estimates.mean() - ones) <= SIGMAS * math.sqrt(4 * 1000 * 3 / 16 / groups)
    error = spec.error95(ones + zeros)
    coverage = float((np.abs(estimates - ones) <= error).mean())
    assert coverage >= 0.95
    # Sound, and about 1.5 times the normal approximation's 1.96·√(3n/4) at this n.
    assert error <= 1.6 * 1.96 * math.sqrt(1000 * 3 / 4)


@pytest.mark.parametrize(("ones", "zeros"), [(0, 0), (2, 1)])
def test_randomized_response_count_is_dp_when_a_unit_is_added(ones: int, zeros: int) -> None:
    # The neighbour has one more unit whose bit is 1. n = 0 against n = 1 is where reports alone fail.
    plan = randomized_response_count_plan(1.0)
    assert plan.noise.cost.epsilon == plan.tally_noise.epsilon <= 1.0 and plan.noise.cost.delta == 0
    trials = 30_000
    outcomes = []
    for group_ones in (ones, ones + 1):
        releases = plan.release([group_ones] * trials, [zeros] * trials)
        outcomes.append(Counter((r.reported_ones, r.reported_zeros) for r in releases))
    sharpest = assert_privacy_loss_within(outcomes[0], outcomes[1], plan.noise.cost.epsilon)
    assert sharpest >= 0.3


def test_randomized_response_count_release_is_accurate_within_its_error95() -> None:
    plan = randomized_response_count_plan(0.5, max_groups=2)
    assert plan.tally_noise.d_in == 2  # one tally per group moves, in each of 2 groups
    laplace = dp.m.make_laplace(I64_VECTORS, dp.l1_distance(T="i64"), scale=plan.tally_noise.scale)
    assert laplace.map(2) == plan.noise.cost.epsilon <= 0.5
    ones, zeros = 120, 380
    releases = plan.release([ones] * 3_000, [zeros] * 3_000)
    assert sum(r.respondents for r in releases) / 3_000 == pytest.approx(500, abs=1.0)
    misses = sum(abs(r.estimate - ones) > r.error95 for r in releases)
    assert misses <= 0.05 * len(releases)
    assert all(r.respondents == r.reported_ones + r.reported_zeros for r in releases)


def test_randomized_response_count_under_zcdp_uses_discrete_gaussian_tallies() -> None:
    plan = randomized_response_count_plan(1.0, 1e-6, max_groups=4, accounting="zcdp")
    assert plan.tally_noise.mechanism == Mechanism.GAUSSIAN and plan.noise.cost.rho > 0
    assert plan.noise.cost.epsilon <= 1.0 and plan.noise.cost.delta == 0
    assert plan.tally_noise.d_in == pytest.approx(2.0)  # L2 = √g
    release = plan.release([10], [10])[0]
    assert release.respondents == release.reported_ones + release.reported_zeros


@settings(max_examples=30, deadline=None)
@given(n=st.integers(min_value=0, max_value=10**9))
def test_randomized_response_error_grows_like_the_square_root_of_n(n: int) -> None:
    error = randomized_response().error95(n)
    assert error == pytest.approx(2 * math.sqrt(2 * n / (4 * math.log(3)) * math.log(40)))
