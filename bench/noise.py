"""Noise benchmark: values/s of OpenDP's samplers and dpproxy's (dpproxy.privacy.sampling), the load of
its slower stages, whether a draw's time says anything about its value, and the time to release
10,000 groups × 3 aggregates through the real release path.

    python bench/noise.py [--repeat 5] [--draws 200000] [--release-only] [--timing]

For each mechanism and scale, in one run and interleaved, it reports medians over the repetitions of:
  opendp   values/s of make_laplace / make_gaussian on an i64 vector of zeros (what NoiseSpec.sample
           called before), over at most 50,000 draws (it is slow);
  ours     values/s of sample_discrete_laplace / sample_discrete_gaussian, over --draws draws;
  stage 2  the share of geometric draws (and Bernoulli decisions) the float stage left to the
           double-double slots, and the slots run per element (padding included: what costs time);
  stage 3  how many decisions went to `decimal` (the rare, slow path; 0 expected).
`--timing` measures instead what the time of one draw says about its value: for each scale, single
draws timed one by one, and the AUC of "this draw took longer than that one" between the draws of
largest and smallest |value| (0.5: the time says nothing; the sampler before this one reached 0.7
at 1e12).
Then `release 10k×3`: Engine.plan of `SELECT grp, COUNT(*), SUM(n), AVG(y) … GROUP BY grp` (four
noisy components, since AVG is a sum and a count), synthetic ExactGroups of 10,000 groups, then
choose_groups (partition selection), release_aggregates (noise, aggregates, error bars) and
post_process, as Engine.release does after reading the backend's rows: the median CPU time of this
process (time.process_time: what the engine spends, whatever else the shared cores run) of each
stage, their total (the plan's printed apart), and the 4 × 10,000 draws alone. Machines are shared
and noisy: read medians and ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import opendp.prelude as dp

from dpproxy.engine import Engine
from dpproxy.engine.collector import gc_paused
from dpproxy.policy import parse_policy
from dpproxy.privacy import sampling
from dpproxy.release import choose_groups, post_process, release_aggregates
from dpproxy.release.exact import ExactGroups

dp.enable_features("contrib")

SCALES = [1.0, 3.7, 1e3, 1e6, 1e9, 1e12, 1e15]
TIMING_SCALES = [1.0, 1e3, 1e6, 1e9, 1e12, 1e15, 1e20]
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


STAGES = ("plan", "choose_groups", "release_aggregates", "post_process")


def release_time(repeat: int) -> tuple[dict[str, float], float]:
    """Medians over `repeat` runs of each stage of the 10k×3 release, and of the noise draws alone."""
    engine = Engine(parse_policy(POLICY), None)
    engine.plan(RELEASE_SQL, epsilon=1.0)  # warm up: imports, caches of OpenDP calibrations
    groups = 10_000
    timings: dict[str, list[float]] = {stage: [] for stage in STAGES}
    noise_only = []
    for _ in range(repeat):
        start = time.process_time()
        plan = engine.plan(RELEASE_SQL, epsilon=1.0)
        planned = time.process_time()
        query, noise = plan.query, plan.noise
        k = len(noise.columns)
        exact = ExactGroups(
            keys=[(f"g{i:05d}",) for i in range(groups)],
            components=[[1_000 + i % 97] * k for i in range(groups)],
            units=[1_000 + i % 97 for i in range(groups)],
        )
        with gc_paused():  # as Engine.release runs them
            start_release = time.process_time()
            chosen = choose_groups(query, exact, noise)
            chose = time.process_time()
            released = release_aggregates(query, chosen, noise)
            noised = time.process_time()
            post_process(
                query.post_processing,
                [key.type for key in query.keys],
                [a.result_type for a in query.aggregates],
                released.keys,
                released.columns,
                by_column=True,
            )
            done = time.process_time()
        for stage, seconds in zip(
            STAGES, (planned - start, chose - start_release, noised - chose, done - noised), strict=True
        ):
            timings[stage].append(seconds)
        start = time.process_time()
        for spec in noise.columns:
            spec.sample(groups)
        noise_only.append(time.process_time() - start)
    return {stage: statistics.median(t) for stage, t in timings.items()}, statistics.median(noise_only)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--draws", type=int, default=200_000)
    parser.add_argument("--release-only", action="store_true", help="only the 10k×3 release, per stage")
    parser.add_argument("--timing", action="store_true", help="only the time of a draw against its value")
    args = parser.parse_args()
    if args.timing:
        timing()
        return
    if not args.release_only:
        samplers(args.repeat, args.draws)
    release(args.repeat)


def samplers(repeat: int, draws: int) -> None:
    header = ("mechanism", "scale", "opendp/s", "ours/s", "×", "geo s2", "slots/elt", "bern s2", "stage 3")
    print("{:9} {:>8} {:>12} {:>12} {:>6} {:>9} {:>9} {:>9} {:>7}".format(*header))
    for mechanism in ("laplace", "gaussian"):
        for scale in SCALES:
            theirs_fn, ours_fn = opendp_sampler(mechanism, scale), ours(mechanism, scale)
            ours_fn(1_000)  # warm up
            theirs, mine = [], []
            sampling.STATS.reset()
            for _ in range(repeat):
                theirs.append(rate(theirs_fn, min(draws, 50_000)))
                mine.append(rate(ours_fn, draws))
            stats = sampling.STATS
            geo = stats.geometric_undecided / max(stats.geometric, 1)
            slots = (stats.geometric_slots + stats.bernoulli_slots) / max(stats.geometric, 1)
            bern = stats.bernoulli_undecided / max(stats.bernoulli, 1)
            exact = stats.geometric_exact + stats.bernoulli_exact
            t, o = statistics.median(theirs), statistics.median(mine)
            row = f"{mechanism:9} {scale:>8.3g} {t:>12,.0f} {o:>12,.0f} {o / t:>6.1f}"
            print(f"{row} {geo:>9.1e} {slots:>9.1e} {bern:>9.1e} {exact:>7}")


def auc(slow: list[int], fast: list[int]) -> float:
    """P(a time from `slow` > one from `fast`) + P(equal)/2, by ranks."""
    values = np.array(slow + fast, dtype=np.float64)
    order = values.argsort(kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for v in np.unique(values):  # ties share their mean rank
        tied = values == v
        ranks[tied] = ranks[tied].mean()
    n1, n2 = len(slow), len(fast)
    return float((ranks[:n1].sum() - n1 * (n1 + 1) / 2) / (n1 * n2))


def timing(draws: int = 4_000) -> None:
    print(
        f"{'mechanism':9} {'scale':>8} {'AUC':>6}  (time: the 20% largest |values| against the 20% smallest)"
    )
    for mechanism in ("laplace", "gaussian"):
        sampler = (
            sampling.sample_discrete_laplace if mechanism == "laplace" else sampling.sample_discrete_gaussian
        )
        for scale in TIMING_SCALES:
            sampler(scale, 1)
            times, values = [], []
            for _ in range(draws):
                start = time.perf_counter_ns()
                [value] = sampler(scale, 1).tolist()
                times.append(time.perf_counter_ns() - start)
                values.append(abs(value))
            # Ties (many equal |values| at small scales) in random order, not in the order drawn: the
            # machine's speed drifts during a run.
            tiebreak = np.random.default_rng(0).random(draws)
            order = np.lexsort((tiebreak, np.array(values, dtype=np.float64)))
            fifth = draws // 5
            large = [times[i] for i in order[-fifth:]]
            small = [times[i] for i in order[:fifth]]
            print(f"{mechanism:9} {scale:>8.3g} {auc(large, small):>6.3f}")


def release(repeat: int) -> None:
    stages, noise_only = release_time(repeat)
    released = sum(seconds for stage, seconds in stages.items() if stage != "plan")
    print(
        "release 10k groups × 3 aggregates (4 noisy components + selection), after the backend's rows: "
        f"{released * 1e3:.1f} ms median (plan {stages['plan'] * 1e3:.1f} ms more)"
    )
    for stage in STAGES[1:]:
        print(f"  {stage:20} {stages[stage] * 1e3:8.1f} ms")
    print(f"  drawing the 4 × 10,000 component values alone: {noise_only * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
