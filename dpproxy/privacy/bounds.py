"""Choosing a query's contribution bounds privately (docs/privacy.md §3, "Bounds chosen per query").

Two choices, each by report-noisy-max over a handful of candidate bounds (dpproxy.sql.bounds), with
integer scores of L∞ sensitivity 1 under adding or removing one person:

- k, a person's rows in the whole query (kind "rows"): the score of candidate k_j is
  −|above_j − m|, above_j the persons whose rows exceed k_j. The choice aims at leaving about m
  persons above the bound, m the 95% error of a released value of sensitivity 1 (ln(20)/ε for a
  Laplace count at its ε): lowering k by one row removes one row of each person above it while it
  narrows a count's 95% noise by m rows, so the two balance where about m persons are above
  (for a query that also has an average or a spread, 2m; `BoundRequest.spread`). Leaving few
  persons above k keeps what bounding removes small beside the noise, in every group. Adding a
  person moves each above_j by at most 1. The aim is never more than a tenth of the persons present
  (scored in tenths, as the public keys' rule below, without its floor): with fewer persons than m
  (a WHERE on 14 planes of 25 to 40 flights, m about 15) every candidate left fewer than m above,
  the smallest scored best, and k = 1 released 17 ± 8 for 342 flights (an accuracy audit). With so
  few persons the choice is still mostly noise; the ± then says so when k is large.
  A query of averages and spreads only (with a spread, when there is no GROUP BY), none of a share
  (an argument in [0, 1], whose per-person values spread over its whole range), aims at a quarter of
  the persons above k instead (score
  −max(0, 4·above_j − persons, persons − 4·above_{j−1}): how far the candidate's interval of rows
  (k_{j−1}, k_j] is from the persons' upper quartile, which adding a person moves by at most 3:
  noised for 3; `quartile`). An
  average is a ratio: scaling a person's rows changes it only through the weights — by little
  unless the heaviest persons' values differ from the others' — while its noise grows with k, and
  a variance's with k times the squared range. On MovieLens (bench/realdata.py; 60 runs each) k
  at the persons' upper quartile gave median errors of 5.8% (STDDEV), 5.2% (an AVG under a WHERE),
  3.2% and 1.1% (AVGs) where the rule for counts gave 10–13% for the first two; a share, whose
  heaviest persons answer differently, moved from 3.9% to 8.9% — what scaling does to weights, and
  outside its ± every time — so a share keeps the rule for counts. An aim at an eighth of the
  persons let the others' noise back (9.7%, 11.1%).
  Averages and spreads per group (a GROUP BY over more than 4 groups or private keys; over at most 4
  public groups a group's sum is a quarter of the query's or more, and they keep the quarter), shares
  among them, aim at half the persons above k
  (−max(0, 2·above_j − persons, persons − 2·above_{j−1}), sensitivity 1; `half`): a group's sum is
  smaller than the query's, so its noise, which grows with k, weighs more beside it. Over k = 1 …
  128 the error per group was flat up to about the persons' median and grew beyond (airline delays
  per carrier, MovieLens ratings per genre, InstEval ratings per department); the median rule
  lowered the benchmarks' grouped errors by a third (InstEval 2.4% → 1.6% per department); at the
  upper quartile the error per group was up to twice that of any k below the median, and a share's
  (which the rule for counts gives a k near the ceiling) up to four times (0.09 vs 0.01–0.02 for
  airline delays per carrier).
  Without a quantile among them (`lower`), they aim lower still, at three quarters of the persons
  above k (their lower quartile: −max(0, 4·above_j − 3·persons, 3·persons − 4·above_{j−1}),
  sensitivity 3): fixed k = 1 … 64 put the least error per group well below the persons' median
  (flights' delays per month and per carrier at k = 2–4, InstEval's per department at 16, their
  medians 54 and 22 rows), and over 20 runs each the lower quartile beat the median on 7 of 9 grouped
  averages and shares (median error per carrier 5.1 → 4.0 minutes, per month 3.4 → 3.1, MovieLens
  per genre 0.80 → 0.63; InstEval per lecture age 0.022 → 0.025 the one loss). Quantiles per group
  keep the median: they keep each person's first k rows rather than reweighting them.
  Counts and sums over public keys (every key public, G zero-filled groups released) aim at about
  m·G persons above k, or a tenth of the persons when that is fewer (score −(|10·above_j − aim| +
  max(0, aim − 10·above_{j−1}))/2, aim = min(10·m·G, persons), which adding a person moves by at
  most 10: noised for 10, the same noise per person above as the plain rule's; the second term
  breaks the tie among candidates that leave no one above, see `scores`): lowering k by one row
  removes one row of each person above it, from whichever groups hold it, while it narrows the 95%
  noise of every one of the G groups by m rows, so the sum of the groups' errors is least where
  about m·G persons are above. The aim at m
  left the weekly flights of a year (53 public weeks) at k = 512 and 15% off per week, where k = 256
  removes 4% of the rows and halves the noise: 8% off. What bounding removes is not in the ±, and a
  large group loses its share of it: where persons' rows are heavy-tailed the sum's optimum removes
  more than a large group's noise. So the choice stays at or above a quarter of the ceiling (the
  data owner's statement of the most rows a person has) and leaves at most a tenth of the persons
  above: unbounded, MovieLens ratings per genre went to k = 512 of 2,400, which removes 15% of the
  ratings, and the ± covered 77% of the genres' truths instead of 95%.
  Quantiles of a whole table (every aggregate a quantile, no GROUP BY) aim at a tenth of the persons
  above k, and never below a quarter of the ceiling (the same score with aim = persons, the same
  sensitivity of 10 and the same out-of-reach candidates; `decile`): a quantile's rank noise grows
  with k, while keeping each person's first k rows moves it little once few persons are above.
  The rule for counts left k at the ceiling (a 90th percentile of the flights' departure delays:
  rank ±38,420 of 336,776 rows, 6.2–10% off in the median of 20 runs); the persons' upper quartile
  reweights them enough to move a median by 7.5% where the heavy persons differ (the flights'
  median distance). At a tenth: k = 256 of 600, rank ±16,393, 2.9–5.7% off; the median distance
  1.1–1.9% (1.4–3.6% before); MovieLens' quantiles within their run-to-run spread.
  AVGs alone over a whole table (none of a share, no spread beside them) aim at the same tenth
  (`decile`; dpproxy.engine.plan._whole_table_averages): released with little noise, what reweighting
  the heavy persons moves is most of their error, outside the ±. The flights' average distance at
  the upper quartile: 3.3% off, its ± covering 1 of 15 runs; at a tenth 0.71% and 15 of 15.
  Without a GROUP BY (quantiles alone, AVGs alone) the tenth is located by the choice's noise to
  within about 2·scale·ln(rivals) tenths of a person (`BoundChoice.resolution`: the noise scale
  times the log of the rivals is about the largest of their noises; a score is half of 10·above),
  about 130–160 persons at ε = 0.5. Where a tenth of the persons is fewer than that (a WHERE
  leaving a few hundred persons) every candidate from the tenth's up scored within the noise and k
  was any of them, while an average's noise grows with k: the aim is then that many persons above,
  at most half of them (`resolved`; aim = max(persons, min(resolution, 5·persons)) in tenths,
  which adding a person moves by 0 to 5 in the same direction as 10·above_j, so each term still
  moves by at most 10). Flights, 40 runs each, median error ÷ the tolerance: the average air time
  from JFK to Los Angeles (344 planes) 2.24 → 1.04, its arrival delay 3.28 → 0.94, departure delays
  LaGuardia to Atlanta (684) 0.28 → 0.18, one carrier's (203 planes) distance and delay 4.3 → 2.1
  and 2.0; whole-table and large subsets unchanged (a tenth is more than the noise there: the
  average distance from JFK, 1,957 planes, 0.33 and 0.43 within their spread); the 90th
  percentile of departure delays LaGuardia to Atlanta 2.62 → 0.68, the median air time JFK to Los
  Angeles 0.25 → 0.12 (20 runs). The cost is what reweighting
  moves, outside the ±: Christmas Day's average distance (591 planes with 1 to 4 flights each: k
  = 1 leaves 19% of them above and moves it by 61 miles) 1.56 → 1.12 of the tolerance but its ±
  covering 26 of 40 runs instead of 33; MovieLens' average rating of dramas 20 of 30 instead of 29
  (its error 2.1% either way), its averages under a WHERE 7.8% → 3.8%, 3% → 1%, 11% → 7.4% (30
  runs). Twice that aim (the noise's 95% error) cut the small subsets' errors further but moved
  the average distance from JFK to 0.70 and its coverage to 31 of 40.
  Queries grouped by a key that is not public (partition selection), but averages and spreads, are
  planned at the same tenth (`decile`): the public keys' rule with an unknown number of groups, at
  its cap. k is then drawn after selection (`after_selection`, `for_released_groups`), by the public
  keys' rule for the G′ groups released: m·G′ persons above, at most the tenth. The flights' top 5
  destinations by count (about 100 destinations, 60 released): k = 512 of 600 and 15% off at the
  rule for counts, k = 256 and 7.6% off at a tenth (medians of 40 runs); the flights per origin (3
  airports) 4.8% off at the tenth, their ± covering 7 of 30 cells, 1.5% and 59 of 60 at m·3 (k =
  512, 20 runs); InstEval's top 5 lecturers (one or two released) 11% → 25% off, covered either way.
  The floor at a quarter of the ceiling holds only for a query without WHERE (`floor`): the ceiling
  is the data owner's statement of the most rows a person has in the table, and a WHERE may leave
  every person far fewer. The flights of each day of July (31 public days; planes there have at most
  75 flights, 39 at the 99th percentile): at the floor k was any of 256, 512 or 600 (every one leaves
  no person above) and the counts 67% off; without it k = 32 (2.8% of the rows removed), 8.3% off,
  and the ± covered 94% of the days' truths (medians of 20 runs).
  These are rules of thumb for where the error is least, not part of the guarantee: any candidate
  is private.
- g, the groups a person counts in for partition selection and COUNT(DISTINCT unit) (kind
  "groups"): with partition selection, the median of the persons' group counts (its threshold
  grows with g: a person counted in fewer groups lets smaller groups through); the score of g_j is
  −max(0, 2·wider_j − persons, persons − 2·wider_{j−1}), wider_j the persons with more than g_j
  groups (every person has more than "g_{−1}" = 0): how far the candidate's interval (g_{j−1}, g_j]
  is from the median. Adding a person raises `persons` by 1 and each wider_j by 0 or 1: each term
  moves by 1, the score by at most 1. The earlier score −|persons − 2·wider_j| tied every candidate
  when the persons share one count (a plane flies for one airline: one group each), and the choice
  was uniform over them: g = 120 as often as g = 1. Without partition selection
  (every key public) g only sizes COUNT(DISTINCT unit)'s noise against what it drops, as k does for
  rows: −|wider_j − m|, about m persons with more groups (`median` false). The median cut half the
  persons out of some of their groups: users per genre on MovieLens came out 22% low. So a query
  that releases COUNT(DISTINCT unit) per group through partition selection aims at a tenth of the
  persons with more groups than g (`decile`, the rows' score over wider_j, sensitivity 10, no
  floor): the flights' planes per destination came out 42% low at the median, their ± covering 6%
  of the cells, and 10% low at a tenth, covering 94% (dpproxy.engine.plan._groups_request).

Each choice costs its share of the query's budget, as OpenDP's map for report-noisy-max says (ε under
pure accounting, ρ under zCDP); the values released at the chosen bound are calibrated for it. The
chosen bound is released (the NOTICE and EXPLAIN show it): it is the output of these mechanisms.
Nothing here sees SQL or rows: only the candidates and the counts per candidate.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from dpproxy.privacy.accounting import Accounting
from dpproxy.privacy.noise import ERROR_ALPHA
from dpproxy.privacy.selectors import _calibrate_selector, _i64_scores, _noisy_max_measurement


def value_parts(values: int, choices: int) -> int:
    """A query's budget is split in parts: each released value (component, selector, partition
    selection) gets this many of them, each choice of a bound one, so that the choices together take
    about a sixth of the budget (one choice: a sixth beside one value or five, a seventh beside two
    or three; k and g together: a sixth beside one value, a seventh beside three), and never more
    than one value's share each. A choice spent too little picks a bound far from its aim often
    enough to cost more than its share; one spent a quarter left the values less than they could
    have (docs/privacy.md §3)."""
    return max(1, math.ceil(5 * choices / max(values, 1)))


@dataclass(frozen=True)
class BoundRequest:
    """A choice of bound a query asks for: its kind ("rows" or "groups"), its candidates, and for k
    how many times m the persons above it may be (`spread`: 2 for averages and spreads, see the
    module docstring)."""

    kind: str
    candidates: tuple[int, ...]
    spread: int = 1
    # k for a query of averages and spreads only: a quarter of the persons left above k (the module
    # docstring), instead of m.
    quartile: bool = False
    # …of averages per group: half of them (the median of the persons' rows); with `lower`, three
    # quarters (their lower quartile: averages, spreads and shares per group, no quantile).
    half: bool = False
    lower: bool = False
    # g: the median of the persons' group counts when partition selection reads the counts of
    # persons (its threshold grows with g); else, as for k, about m persons with more groups.
    median: bool = True
    # k: the public groups the answer releases (every key public), else 1: the rule that aims at m
    # persons above aims at m per group, at most a tenth of the persons (the module docstring).
    cells: int = 1
    # k for a query of quantiles only without GROUP BY, or grouped by a key that is not public (but
    # averages and spreads): a tenth of the persons above k, k at least a quarter of the ceiling with
    # `floor` (the module docstring); g for a query releasing COUNT(DISTINCT unit) per group through
    # partition selection: a tenth of the persons with more groups than g, no floor.
    decile: bool = False
    # k, with `decile`, for a query without GROUP BY: no fewer persons above than the choice's own
    # noise typically moves it by, up to half of them (the module docstring; BoundChoice.resolution).
    resolved: bool = False
    # k, with `decile`, for a query grouped by keys that are not public: chosen once partition
    # selection has released its groups, at m persons above per released group, at most a tenth
    # (BoundChoice.after_selection).
    selected: bool = False
    # k, with `cells` > 1 or `decile`: no candidate below a quarter of the ceiling. False when a WHERE
    # narrows the rows read (the ceiling says how many rows a person has in the whole table).
    floor: bool = True
    # ℓ (kind "distinct"): how many times ℓ a person moves the counts of distinct values of all groups
    # together (the query's COUNT(DISTINCT …)s; DistinctChoice).
    weight: int = 1
    # k of the averages and spreads of a query with two k's (dpproxy.sql.bounds.mean_components).
    means: bool = False


@dataclass(frozen=True)
class BoundChoice:
    """Report-noisy-max over candidate bounds (see the module docstring)."""

    kind: str  # "rows" (k) or "groups" (g)
    candidates: tuple[int, ...]
    target: int  # rows: the persons aimed to be left above k; groups: unused (the median, a tenth)
    accounting: Accounting
    scale: float
    epsilon: float
    rho: float
    quartile: bool = False  # rows: a quarter of the persons aimed to be left above k, not `target`
    median: bool = True  # groups: the median of the persons' group counts; else `target` persons above g
    half: bool = False  # rows, with `quartile`: half the persons above k (averages per group)
    # `target` is m per public group: never more than a tenth of the persons above (CAPPED_SHARE).
    capped: bool = False
    # With `capped`: a tenth of the persons above k (or with more groups than g, over wider_j)
    # whatever `target` is (BoundRequest.decile).
    decile: bool = False
    # With `capped`: candidates below a quarter of the ceiling out of reach (BoundRequest.floor; never
    # for g).
    floor: bool = True
    # rows, with `half`: three quarters of the persons above k, not half (BoundRequest.lower).
    lower: bool = False
    # rows, with `capped`: m per public group released (BoundRequest.cells), not m for the query.
    per_group: bool = False
    # rows, with `decile`: the aim is at least `resolution` (BoundRequest.resolved).
    resolved: bool = False
    # rows, with `decile`: drawn after partition selection, at `target` (m) per released group
    # (BoundRequest.selected; `for_released_groups`).
    after_selection: bool = False
    # rows: the averages' and spreads' own k (BoundRequest.means).
    means: bool = False

    def for_released_groups(self, groups: int) -> BoundChoice:
        """This choice once partition selection has released `groups` groups (`after_selection`): the
        public keys' aim, `target` (m) persons above per released group, at most a tenth of the
        persons (the module docstring), with the same candidates, floor, sensitivity and noise, so
        the same cost. `groups` is partition selection's output, already drawn and paid for (an
        analyst may not see it whole, under HAVING or LIMIT), so the aim is fixed before the scores
        are read, as a public key domain's is."""
        if not self.after_selection:
            return self
        return dataclasses.replace(
            self, target=self.target * max(1, groups), decile=False, per_group=True, after_selection=False
        )

    def scores(self, counts: Sequence[int], persons: int) -> list[int]:
        weight = _quantile_weight(self.kind, self.quartile, self.median, self.half, self.lower)
        if weight is None and self.capped:
            # −(|10·above_j − aim| + max(0, aim − 10·above_{j−1})) // 2, aim = min(10·target,
            # persons) (persons for `decile`), every person above "k_{−1}": how far the candidate's
            # count is from the aim, and how far its interval (k_{j−1}, k_j] lies above it. The
            # second half breaks the tie among candidates that leave no one above (the first alone
            # scores them all −aim, and the choice was uniform among them: k = 512, 600 or 1,000
            # alike where no plane has more than 575 rows). Adding a person moves 10·above by 0 or
            # 10 and the aim by 0 or 1, so each term by at most 10 and their halved sum too.
            # Candidates below a quarter of the ceiling are out of reach (a constant, whatever the data).
            # With `resolved`, the aim is raised to what the choice tells apart, up to half the
            # persons: max(persons, min(resolution, 5·persons)) moves by 0 to 5 when a person is
            # added, in the same direction as 10·above, so each term still moves by at most 10.
            aim = int(persons) if self.decile else min(CAPPED_SHARE * self.target, int(persons))
            if self.decile and self.resolved:
                aim = max(aim, min(self.resolution, HALF_IN_TENTHS * int(persons)))
            previous = [int(persons), *(int(above) for above in counts)][: len(counts)]
            return [
                -OUT_OF_REACH
                if self._below_floor(bound)
                else -(abs(CAPPED_SHARE * int(above) - aim) + max(0, aim - CAPPED_SHARE * before)) // 2
                for above, before, bound in zip(counts, previous, self.candidates, strict=True)
            ]
        if weight is None:
            return [-abs(int(above) - self.target) for above in counts]
        # A quantile of the persons' rows or groups, scored as the distance from the candidate's
        # interval (b_{j-1}, b_j] of persons' values to the quantile with a share v/w of the persons
        # above it: −max(0, w·above_j − v·persons, v·persons − w·above_{j-1}), every person above
        # "b_{-1}" = 0. When many persons share one value (one group each, one row each), every
        # candidate at or above it had the same score under −|persons − w·above_j|, and the choice
        # was uniform among them.
        w, v = weight
        people = int(persons)
        previous = [people, *(int(above) for above in counts)][: len(counts)]
        return [
            -max(0, w * int(above) - v * people, v * people - w * before)
            for above, before in zip(counts, previous, strict=True)
        ]

    @property
    def floored(self) -> bool:
        """Candidates below a quarter of the ceiling are out of reach (`capped` with `floor`, and some
        candidate is below it)."""
        weight = _quantile_weight(self.kind, self.quartile, self.median, self.half, self.lower)
        return weight is None and self.capped and any(self._below_floor(b) for b in self.candidates)

    def _below_floor(self, bound: int) -> bool:
        """With `floor`, a candidate below a quarter of the ceiling, out of reach."""
        return self.floor and 4 * bound < self.candidates[-1]

    def select(self, counts: Sequence[int], persons: int) -> int:
        """The index of the chosen candidate, from the true counts per candidate (above_j or
        wider_j) and the persons present."""
        if len(self.candidates) == 1:
            return 0
        measurement = _noisy_max_measurement(self.accounting, self.scale, False)
        return int(measurement(_i64_scores(self.scores(counts, persons))))

    def score_error95(self) -> float:
        """With probability >= 95% the chosen candidate's score is within this of the best one's."""
        rivals = len(self.candidates) - 1
        return 0.0 if rivals <= 0 else self.scale * math.log(rivals / ERROR_ALPHA)

    @property
    def resolution(self) -> int:
        """The persons above k, in tenths of a person (the scores' unit before halving), that the
        choice's noise typically moves it by: the noise scale times the log of the rivals, about
        the largest of their noises, doubled (a score is half of 10·above); a constant of the
        candidates and the noise, whatever the data."""
        rivals = len(self.candidates) - 1
        return 0 if rivals <= 0 else math.ceil(2 * self.scale * math.log(max(rivals, 2)))


def _quantile_weight(
    kind: str, quartile: bool, median: bool, half: bool, lower: bool = False
) -> tuple[int, int] | None:
    """(w, v) of a choice that aims at a quantile of the persons' rows or groups (a share v/w of them
    above the bound: (4, 1) for the upper quartile of rows, (2, 1) for a median, (4, 3) for the lower
    quartile), None for one that aims at `target` persons above. Adding a person moves w·above_j by 0
    or w and v·persons by v, so the score moves by at most max(v, w − v)."""
    if kind == "rows":
        if not quartile:
            return None
        return ((4, 3) if lower else (2, 1)) if half else (4, 1)
    return (2, 1) if median else None


def _score_sensitivity(weight: tuple[int, int]) -> int:
    """How far a quantile aim's score moves when a person is added (_quantile_weight)."""
    w, v = weight
    return max(v, w - v)


# A choice aiming at m persons above per public group leaves at most 1/CAPPED_SHARE of them above,
# and picks no bound below a quarter of the ceiling (scored -OUT_OF_REACH, far beyond any noise).
CAPPED_SHARE = 10
OUT_OF_REACH = 10**15
# Half the persons, in the tenths the capped scores count in: the most a `resolved` aim reaches.
HALF_IN_TENTHS = CAPPED_SHARE // 2


@lru_cache(maxsize=1024)
def bound_choice(
    kind: str,
    candidates: tuple[int, ...],
    target: int,
    accounting: Accounting,
    budget: float,
    quartile: bool = False,
    median: bool = True,
    half: bool = False,
    capped: bool = False,
    decile: bool = False,
    floor: bool = True,
    lower: bool = False,
    resolved: bool = False,
    selected: bool = False,
    means: bool = False,
) -> BoundChoice:
    """The choice among `candidates`, paid for by `budget` (ε under pure accounting, ρ under zCDP);
    `capped`: `target` is m per public group, never more than a tenth of the persons above, nor (with
    `floor`) a bound below a quarter of the ceiling; `decile`: k (or g) aims at a tenth of the persons
    above, nor (with `floor`) a bound below a quarter of the ceiling, and with `resolved` no fewer
    than the choice tells apart (BoundChoice.resolution), up to half of them."""
    half = half and quartile and kind == "rows"
    lower = lower and half
    weight = _quantile_weight(kind, quartile, median, half, lower)
    decile = decile and weight is None
    capped = (capped or decile) and weight is None
    # The floor (no k below a quarter of the ceiling) stays where it was asked with the cap; but k
    # never aims at more than a tenth of the persons above it, whatever the rule: with fewer persons
    # than m (a WHERE on 14 planes), aiming at m above chose k = 1 and released 17 ± 8 for 342 rows.
    floor = floor and capped
    per_group = capped and not decile
    capped = capped or (kind == "rows" and weight is None)
    scale, epsilon, rho = 0.0, 0.0, 0.0
    if len(candidates) > 1:
        sensitivity = CAPPED_SHARE if capped else 1 if weight is None else _score_sensitivity(weight)
        scale, cost = _calibrate_selector(accounting, sensitivity, budget)
        epsilon, rho = (cost, 0.0) if accounting == Accounting.PURE else (0.0, cost)
    return BoundChoice(
        kind,
        candidates,
        target,
        accounting,
        scale,
        epsilon,
        rho,
        quartile,
        median,
        half,
        capped,
        decile,
        floor,
        lower,
        per_group,
        decile and resolved,
        decile and selected and kind == "rows" and not resolved,
        means and kind == "rows",
    )


# COUNT(DISTINCT x)'s scores are the generalised exponential mechanism's, rationals of sensitivity 1,
# floored on a grid this fine (sensitivity DISTINCT_GRID as integers).
DISTINCT_GRID = 1000
# …and its t aims at the best candidate with probability 1 − DISTINCT_BETA (Raskhodnikova & Smith).
DISTINCT_BETA = 0.05


@dataclass(frozen=True)
class DistinctChoice:
    """ℓ, the distinct values of x each person may be counted for in COUNT(DISTINCT x), chosen by the
    generalised exponential mechanism (Raskhodnikova & Smith 2016) over the candidates' counts
    M(ℓ_j) — the most values that can be given to persons holding them, at most ℓ_j each
    (dpproxy.release.distinct) — as Knop & Steinke (2023) do; docs/privacy.md §3.

    M(ℓ), summed over the groups, moves by at most Δ_j = weight·ℓ_j when a person is added or removed
    (`weight`: the query's COUNT(DISTINCT …)s; a person's ℓ is shared among their groups). The score to
    maximise is q_j = M(ℓ_j) − penalty·ℓ_j, the count less its 95% noise (penalty: that noise per unit of
    ℓ, data independent). The mechanism scores candidate i by min_j ((q_i − tΔ_i) − (q_j − tΔ_j))/(Δ_i +
    Δ_j), of sensitivity 1 whatever the data (each term moves by at most (Δ_i + Δ_j)/(Δ_i + Δ_j)), with t
    = 2·ln(J/β)/ε: a candidate of larger sensitivity must win by more. M saturates at the number of values
    as soon as there are enough persons to carry them, so the choice is the ℓ where it does."""

    candidates: tuple[int, ...]
    weight: int
    penalty: float
    accounting: Accounting
    scale: float  # report-noisy-max's, for scores floored on the grid (sensitivity DISTINCT_GRID)
    epsilon: float
    rho: float
    kind: str = "distinct"

    def scores(self, counts: Sequence[int]) -> list[int]:
        """floor(DISTINCT_GRID · score) of each candidate, from the true M(ℓ_j) (exact rationals: the
        floor moves by at most DISTINCT_GRID when the score moves by at most 1)."""
        rivals = len(self.candidates)
        t = Fraction(self.scale) / DISTINCT_GRID * Fraction(math.log(rivals / DISTINCT_BETA))
        penalty = Fraction(self.penalty)
        sens = [self.weight * bound for bound in self.candidates]
        shifted = [
            int(m) - penalty * bound - t * s
            for m, bound, s in zip(counts, self.candidates, sens, strict=True)
        ]
        return [
            math.floor(DISTINCT_GRID * min((a - b) / (si + sj) for b, sj in zip(shifted, sens, strict=True)))
            for a, si in zip(shifted, sens, strict=True)
        ]

    def select(self, counts: Sequence[int]) -> int:
        """The index of the chosen ℓ, from the true M(ℓ_j) summed over the groups and COUNT(DISTINCT …)s."""
        if len(self.candidates) == 1:
            return 0
        measurement = _noisy_max_measurement(self.accounting, self.scale, False)
        return int(measurement(_i64_scores(self.scores(counts))))


@lru_cache(maxsize=1024)
def distinct_choice(
    candidates: tuple[int, ...], weight: int, penalty: float, accounting: Accounting, budget: float
) -> DistinctChoice:
    """The choice of ℓ among `candidates`, paid for by `budget` (ε under pure accounting, ρ under zCDP)."""
    scale, epsilon, rho = 0.0, 0.0, 0.0
    if len(candidates) > 1:
        scale, cost = _calibrate_selector(accounting, DISTINCT_GRID, budget)
        epsilon, rho = (cost, 0.0) if accounting == Accounting.PURE else (0.0, cost)
    return DistinctChoice(candidates, weight, penalty, accounting, scale, epsilon, rho)
