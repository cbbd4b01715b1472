"""One tolerance rule for the suite's statistical checks: a test that compares random draws with a
probability fails by chance with probability at most FAMILY_ALPHA (one in a million) over all its
checks together, the budget split evenly among them (Bonferroni), and its thresholds are computed
exactly from the binomial or normal law, not from a rule of thumb in σ. A "must fail" check (an
interval of the wrong width, an old bound) asserts the observed share is below the same floor, so a
sharp test shows it has the power to fail at the tolerance it uses.
"""

from __future__ import annotations

import math
from statistics import NormalDist

# The most a test may fail by chance, in one run, whatever it checks.
FAMILY_ALPHA = 1e-6


def binomial_floor(p: float, trials: int, checks: int = 1) -> float:
    """The highest share s of `trials` for which a true probability p of success gives fewer than
    s·trials successes with probability at most FAMILY_ALPHA / checks: assert observed ≥ s."""
    alpha = FAMILY_ALPHA / checks
    log_p, log_q = math.log(p), math.log1p(-p)
    below = 0.0  # P[X < x]
    for x in range(trials + 1):
        mass = math.exp(
            math.lgamma(trials + 1)
            - math.lgamma(x + 1)
            - math.lgamma(trials - x + 1)
            + x * log_p
            + (trials - x) * log_q
        )
        if below + mass > alpha:
            return x / trials
        below += mass
    return 1.0


def normal_slack(checks: int = 1) -> float:
    """How many standard errors a two-sided check of an asymptotically normal statistic allows:
    |Z| exceeds it with probability FAMILY_ALPHA / checks."""
    return NormalDist().inv_cdf(1 - FAMILY_ALPHA / (2 * checks))
