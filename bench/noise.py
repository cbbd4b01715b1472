"""Noise benchmark: values/s of OpenDP's samplers and dpproxy's (dpproxy.privacy.sampling), the exact
fallback's rate, and the time to release 10,000 groups × 3 aggregates through the real release path.

    python bench/noise.py [--repeat 5] [--draws 200000]

For each mechanism and scale, in one run and interleaved, it reports medians over the repetitions of:
  opendp   values/s of make_laplace / make_gaussian on an i64 vector of zeros (what NoiseSpec.sample
           called before), over at most 50,000 draws (it is slow);
  ours     values/s of sample_discrete_laplace / sample_discrete_gaussian, over --draws draws;
  exact    the share of geometric draws (and Bernoulli decisions) the float path left to the exact
           fallback.
Then `release 10k×3`: Engine.plan of `SELECT grp, COUNT(*), SUM(n), AVG(y) … GROUP BY grp` (four
noisy components, since AVG is a sum and a count), synthetic ExactGroups of 10,000 groups, then
choose_groups (partition selection), release_aggregates (noise, aggregates, error bars) and
post_process, as Engine.release does after reading the backend's rows. Machines are shared and
noisy: read medians and ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opendp.prelude as dp

from dpproxy.engine import Engine
from dpproxy.policy import parse_policy
from dpproxy.privacy import sampling
from dpproxy.release import choose_groups, post_process, release_aggregates
from dpproxy.release.exact import ExactGroups

dp.enable_features("contrib")

SCALES = [1.0, 3.7, 1e3, 1e6, 1e9, 1e12]
POLICY = """
version: 1
defaults: {epsilon: 1.0, delta: 1.0e-6}
tables:
  t:
    privacy_unit: pid
    max_rows_per_unit: 1
    max_groups_per_unit: 1
    columns:
      pid: {type: integer, summable: false}
      grp: {type: text}
      n: {type: integer, lower: 0, upper: 10}
      y: {type: numeric, lower: 0, upper: 100, scale: 2}
"""
RELEASE_SQL = "SELECT grp, COUNT(*), SUM(n), AVG(y) FROM t GROUP BY grp"


def rate(draw, n: int) -> float:
    start = time.perf_counter()
    draw(n)
    return n / (time.perf_counter() - start)


def opendp_sampler(mechanism: str, scale: float):
    vectors = dp.vector_domain(dp.atom_domain(T="i64"))
    if mechanism == "laplace":
        m = dp.m.make_laplace(vectors, dp.l1_distance(T="i64"), scale=scale)
    else:
        m = dp.m.make_gaussian(vectors, dp.l2_distance(T="f64"), scale=scale)
    return lambda n: m([0] * n)


def ours(mechanism: str, scale: float):
    sampler = (
        sampling.sample_discrete_laplace if mechanism == "laplace" else sampling.sample_discrete_gaussian
    )
    return lambda n: sampler(scale, n).tolist()


def release_time(repeat: int) -> tuple[float, float]:
    engine = Engine(parse_policy(POLICY), None)
    plan = engine.plan(RELEASE_SQL, epsilon=1.0)
    query, noise = plan.query, plan.noise
    k = len(noise.columns)
    groups = 10_000
    exact = ExactGroups(
        keys=[(f"g{i:05d}",) for i in range(groups)],
        components=[[1_000 + i % 97] * k for i in range(groups)],
        units=[1_000 + i % 97 for i in range(groups)],
    )
    totals, noise_only = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        chosen = choose_groups(query, exact, noise)
        released = release_aggregates(query, chosen, noise)
        post_process(
            query.post_processing,
            [key.type for key in query.keys],
            [a.result_type for a in query.aggregates],
            released.keys,
            released.aggregates,
        )
        totals.append(time.perf_counter() - start)
        start = time.perf_counter()
        for spec in noise.columns:
            spec.sample(groups)
        noise_only.append(time.perf_counter() - start)
    return statistics.median(totals), statistics.median(noise_only)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--draws", type=int, default=200_000)
    args = parser.parse_args()
    header = ("mechanism", "scale", "opendp/s", "ours/s", "×", "exact geo", "exact bern")
    print("{:9} {:>8} {:>12} {:>12} {:>6} {:>10} {:>10}".format(*header))
    for mechanism in ("laplace", "gaussian"):
        for scale in SCALES:
            theirs_fn, ours_fn = opendp_sampler(mechanism, scale), ours(mechanism, scale)
            ours_fn(1_000)  # warm up
            theirs, mine = [], []
            sampling.STATS.reset()
            for _ in range(args.repeat):
                theirs.append(rate(theirs_fn, min(args.draws, 50_000)))
                mine.append(rate(ours_fn, args.draws))
            stats = sampling.STATS
            geo = stats.geometric_exact / max(stats.geometric, 1)
            bern = stats.bernoulli_exact / max(stats.bernoulli, 1)
            t, o = statistics.median(theirs), statistics.median(mine)
            row = f"{mechanism:9} {scale:>8.3g} {t:>12,.0f} {o:>12,.0f} {o / t:>6.1f}"
            print(f"{row} {geo:>10.2e} {bern:>10.2e}")
    total, noise_only = release_time(args.repeat)
    print(f"release 10k groups × 3 aggregates (4 noisy components + selection): {total * 1e3:.1f} ms median")
    print(f"  of which drawing the 4 × 10,000 component values: {noise_only * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
