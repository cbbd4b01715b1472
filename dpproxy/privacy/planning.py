"""One query's noise and cost: plan_query_noise and QueryNoise.

This module owns how a query's (ε, δ) is split over the values it releases (aggregate components,
selectors, partition selection) under pure or zCDP accounting, and the check that the planned cost
never exceeds the request. Each part is built by noise, selection or selectors, and its cost is read
from its OpenDP map; nothing here draws.

It never sees SQL, rows or group keys: only (sensitivity, max_groups) per component, the group limit
of partition selection, and the selector requests.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from dpproxy.errors import InvalidParameter
from dpproxy.policy import Mechanism
from dpproxy.privacy.accounting import (
    Accounting,
    Cost,
    even_share,
    remainder,
    rho_for,
    sum_up,
    zcdp_to_approx_dp,
)
from dpproxy.privacy.bounds import (
    BoundChoice,
    BoundRequest,
    DistinctChoice,
    bound_choice,
    distinct_choice,
    value_parts,
)
from dpproxy.privacy.checks import check_positive, check_unit_limits
from dpproxy.privacy.noise import NoiseSpec, gaussian_noise, laplace_noise
from dpproxy.privacy.selection import SelectionSpec, gaussian_partition_selection, partition_selection
from dpproxy.privacy.selectors import (
    ModeRequest,
    QuantileRequest,
    SelectorRequest,
    SelectorSpec,
    selector_for,
)


def _accounting(value: Accounting | str) -> Accounting:
    if isinstance(value, Accounting):
        return value
    try:
        return Accounting(value)
    except ValueError:
        raise InvalidParameter(f"unknown privacy accounting {value!r}: use pure or zcdp") from None


@dataclass(frozen=True)
class QueryNoise:
    columns: tuple[NoiseSpec, ...]  # one per released aggregate component, in the order requested
    selection: SelectionSpec | None
    cost: Cost  # what the ledger charges: (ε, δ) under pure accounting; (ρ, δ) (+ display ε) under zCDP
    selectors: tuple[SelectorSpec, ...] = ()  # one per SelectorRequest, in the order requested
    accounting: Accounting = Accounting.PURE
    conversion_delta: float = 0.0  # zCDP: the δ at which cost.epsilon holds (the request's)
    choices: tuple[BoundChoice | DistinctChoice, ...] = ()  # one per BoundRequest, in the order requested
    # The noise of the estimate of what bounding removed (dpproxy.release.left_out), planned as one
    # more component (dpproxy.engine.plan._query_noise); None when not asked.
    estimate: NoiseSpec | None = None
    # …and of the count of groups that hold persons beside those partition selection shows.
    hidden: NoiseSpec | None = None

    @property
    def approx_dp(self) -> Cost:
        """The (ε, δ) this query alone satisfies, for display."""
        if self.accounting == Accounting.PURE:
            return Cost(self.cost.epsilon, self.cost.delta)
        return Cost(self.cost.epsilon, self.conversion_delta)


def plan_query_noise(
    mechanism: Mechanism | str,
    epsilon: float,
    delta: float,
    components: Sequence[tuple[int, int]],
    selection_groups: int | None,
    *,
    accounting: Accounting | str = Accounting.PURE,
    selectors: Sequence[SelectorRequest] = (),
    choices: Sequence[BoundRequest] = (),
    allocated: bool = False,
) -> QueryNoise:
    """The noise for every value a query releases, and what the query costs.

    `components` holds (sensitivity, max_groups) per released aggregate component, in grid units;
    `selection_groups` is g for partition selection, None when every key is public or there is no
    GROUP BY; `selectors` the quantiles and modes the query releases.

    Rules:
    * ε is split equally over the k components, the s selectors, and one share for partition
      selection if present, except that each choice of a contribution bound (`choices`,
      dpproxy.privacy.bounds) gets one part where a value gets `value_parts` of them (the choices
      together about a sixth of ε). Shares are rounded down so that
      their upward-rounded sum is within ε. The choice of k aims at leaving ln(20)/ε_share persons
      above it (under zCDP, the 95% error of a unit-sensitivity value at the share, in units).
    * Selectors (pure accounting) get ε_i = share, as their map says (per group share/g for
      quantiles and modes).
    * Laplace: each component gets ε_i = share; its scale starts at b = d_in/ε_i and grows by tiny
      factors until the OpenDP map is <= ε_i.
    * Selection gets its ε share and all of δ (Laplace) or half of δ (Gaussian); its threshold is the
      smallest integer, from ceil(1 + b·ln(g/(2δ))) (Wilson et al. 2020) upwards, whose OpenDP map
      gives δ <= its δ share. With no component to pay for, selection gets all of ε and δ.
    * Gaussian (pure accounting): the components together must convert to (ε_rest, δ_rest), ε_rest =
      ε minus the selection's and selectors' shares, δ_rest = δ minus the selection's δ share. The total
      ρ is the largest (found by bracketing and regula falsi) whose OpenDP zCDP → (ε, δ) conversion gives
      ε <= ε_rest at δ_rest; each component gets ρ/k and σ from its map (starting at σ = d_in/√(2ρ_i)).
      Cost = Σ Laplace map ε + selectors' and selection's map (ε, δ) + the OpenDP conversion of the
      components' summed ρ at δ_rest.
    * zCDP accounting (`mechanism` is then ignored: every component is discrete Gaussian): partition
      selection is Gaussian (make_gaussian_threshold) and gets half of δ as its approximate-zCDP δ; the
      rest of δ, δ_conv, is for converting. The query's ρ is the largest whose conversion at δ_conv is
      <= ε, split equally (in ρ) over components, selectors and selection. Cost = (Σ map ρ, selection's
      map δ), with epsilon = the OpenDP conversion of that ρ at δ − that δ: the query alone is
      (epsilon, δ)-DP.
    * The cost never exceeds (epsilon, delta) (converted, under zCDP); that is checked, not assumed.
    * `allocated`: the cost is what the shares allocate, not what each part's map spends — the same
      for every sensitivity and group limit, and at least each one's map. Bounds chosen per query
      charge this before choosing (the values at every candidate then fit in it); under zCDP the
      selection's δ is then its half of δ (its ρ is not raised by what its threshold leaves).

    Impossible requests raise InvalidParameter. Results are cached: the same request is a lookup.
    """
    if not isinstance(mechanism, Mechanism):
        try:
            mechanism = Mechanism(mechanism)
        except ValueError:
            raise InvalidParameter(
                f"unknown noise mechanism {mechanism!r}: use laplace or gaussian"
            ) from None
    accounting = _accounting(accounting)
    check_positive("epsilon", epsilon)
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 <= delta < 1:
        raise InvalidParameter(f"delta must be a number >= 0 and < 1, not {delta!r}")
    frozen = tuple((sensitivity, max_groups) for sensitivity, max_groups in components)
    for sensitivity, max_groups in frozen:
        check_unit_limits(sensitivity, max_groups)
    requests = tuple(selectors)
    for request in requests:
        if not isinstance(request, QuantileRequest | ModeRequest):
            raise InvalidParameter(f"unknown selection request {request!r}")
    if selection_groups is not None:
        check_unit_limits(1, selection_groups)
        if delta == 0:
            raise InvalidParameter(
                "partition selection for GROUP BY keys without public_values needs delta > 0: "
                "set defaults.delta in the policy",
                hint="or declare public_values for the GROUP BY columns: their keys need no selection",
            )
    if accounting == Accounting.ZCDP:
        if delta == 0 and (frozen or requests):
            raise InvalidParameter(
                "zCDP accounting needs delta > 0 to convert ρ into (ε, δ): set defaults.delta in the policy",
                hint="or use pure accounting with mechanism: laplace, which needs no delta",
            )
        mechanism = Mechanism.GAUSSIAN
    elif mechanism == Mechanism.GAUSSIAN and frozen and delta == 0:
        raise InvalidParameter(
            "the gaussian mechanism needs delta > 0: set defaults.delta in the policy",
            hint="or use mechanism: laplace, which needs no delta",
        )
    asked = tuple(choices)
    return _plan(
        mechanism,
        accounting,
        float(epsilon),
        float(delta),
        frozen,
        selection_groups,
        requests,
        asked,
        allocated,
    )


@lru_cache(maxsize=4096)
def _plan(
    mechanism: Mechanism,
    accounting: Accounting,
    epsilon: float,
    delta: float,
    components: tuple[tuple[int, int], ...],
    selection_groups: int | None,
    requests: tuple[SelectorRequest, ...],
    asked: tuple[BoundRequest, ...] = (),
    allocated: bool = False,
) -> QueryNoise:
    if accounting == Accounting.ZCDP:
        return _plan_zcdp(epsilon, delta, components, selection_groups, requests, asked, allocated)
    k = len(components)
    shares = k + _request_shares(requests) + (1 if selection_groups is not None else 0)
    if shares == 0:
        return QueryNoise((), None, Cost.ZERO)
    part = _weighted_part(epsilon, shares, len(asked))
    share = value_parts(shares, len(asked)) * part if asked else even_share(epsilon, shares)
    selectors = _selectors(requests, Accounting.PURE, share)
    cost = Cost.ZERO
    for selector in selectors:
        cost = cost + Cost(selector.epsilon)
    choices = _choices(asked, Accounting.PURE, part, laplace_noise(1, 1, share).error95() if asked else 1.0)
    for choice in choices:
        cost = cost + Cost(choice.epsilon)

    if mechanism == Mechanism.LAPLACE:
        columns = tuple(laplace_noise(s, g, share) for s, g in components)
        selection = None if selection_groups is None else pure_selection(selection_groups, share, delta)
        for column in columns:
            cost = cost + Cost(column.epsilon)
        if selection is not None:
            cost = cost + Cost(selection.epsilon, selection.delta)
    else:
        selection = None
        epsilon_rest, delta_rest = epsilon, delta
        pure_shares = _request_shares(requests) + (1 if selection_groups is not None else 0)
        pure_parts = [share] * pure_shares + [part] * len(asked)
        if selection_groups is not None:
            delta_share = delta if k == 0 else delta / 2.0
            selection = pure_selection(selection_groups, share, delta_share)
            delta_rest = remainder(delta, delta_share)
            cost = cost + Cost(selection.epsilon, selection.delta)
        if pure_parts:
            epsilon_rest = remainder(epsilon, sum_up(pure_parts))
        columns = ()
        if k:
            rho = rho_for(epsilon_rest, delta_rest)
            columns = tuple(gaussian_noise(s, g, even_share(rho, k)) for s, g in components)
            total_rho = sum_up([column.rho for column in columns])
            cost = cost + Cost(zcdp_to_approx_dp(total_rho, delta_rest), delta_rest)

    if not (cost.epsilon <= epsilon and cost.delta <= delta):
        raise AssertionError(f"planned cost {cost} exceeds the requested (ε={epsilon!r}, δ={delta!r})")
    if allocated:
        spends_delta = selection_groups is not None or (mechanism != Mechanism.LAPLACE and k > 0)
        cost = Cost(epsilon, delta if spends_delta else 0.0)
    return QueryNoise(columns, selection, cost, selectors, choices=choices)


@lru_cache(maxsize=1024)
def pure_selection(max_groups: int, epsilon: float, delta: float) -> SelectionSpec:
    """Partition selection within (ε, δ) under pure accounting: Laplace thresholding, or Gaussian
    thresholding when its threshold is lower (docs/privacy.md §5).

    A person counts once in each of up to g groups: Laplace noise is sized for their L1, g, Gaussian
    noise for their L2, √g, so from a few groups on (4 at ε = 0.125 and δ = 5e-8; the threshold is
    2.6× lower at g = 16) the Gaussian shows groups of far fewer persons. Its cost, δ-approximate
    ρ-zCDP, is converted into (ε, δ): ρ is the most that converts into ε with half of δ, and the
    threshold spends at most the other half; the spec then carries the converted (ε, δ), which is
    what a pure-accounting plan adds up."""
    laplace = partition_selection(max_groups, epsilon, delta)
    if max_groups == 1:
        return laplace
    half = delta / 2.0
    gaussian = gaussian_partition_selection(max_groups, rho_for(epsilon, half), half)
    if gaussian.threshold >= laplace.threshold:
        return laplace
    converted = zcdp_to_approx_dp(gaussian.rho, half)
    total_delta = sum_up([gaussian.delta, half])
    if not (converted <= epsilon and total_delta <= delta):  # rounding: keep the one that fits
        return laplace
    return dataclasses.replace(gaussian, epsilon=converted, delta=total_delta)


def _is_interval_end(request: SelectorRequest) -> bool:
    return isinstance(request, QuantileRequest) and request.end != 0


def _request_shares(requests: tuple[SelectorRequest, ...]) -> int:
    """The shares the selector requests take: one each, but the two ends of a quantile's interval
    (dp_interval_low/high) one together: asking for an interval costs one more share, as one more
    released value would."""
    ends = sum(1 for r in requests if _is_interval_end(r))
    return len(requests) - ends // 2


def _selectors(requests: tuple[SelectorRequest, ...], accounting: Accounting, share: float) -> tuple:
    """Each request's selector at its share (an interval end at half of one: see _request_shares;
    halving a float is exact, so a pair costs at most one share)."""
    return tuple(selector_for(r, accounting, share / 2 if _is_interval_end(r) else share) for r in requests)


def _weighted_part(total: float, values: int, choices: int) -> float:
    """The largest part p whose upward-rounded sum over `values` shares of w·p and `choices` shares of
    p is <= total, w = value_parts(values, choices)."""
    weight = value_parts(values, choices)
    part = even_share(total, weight * values + choices)
    while sum_up([weight * part] * values + [part] * choices) > total:
        part = math.nextafter(part, 0.0)
    return part


def _choices(
    asked: tuple[BoundRequest, ...], accounting: Accounting, budget: float, unit_error: float
) -> tuple[BoundChoice | DistinctChoice, ...]:
    """The bound choices, each paid for by `budget`; k aims at leaving as many persons above it as
    a released value of sensitivity 1 has rows of 95% error (`unit_error`), and ℓ at the most distinct
    values less that error per unit of ℓ in each public group."""
    return tuple(
        distinct_choice(a.candidates, a.weight, unit_error * a.cells, accounting, budget)
        if a.kind == "distinct"
        else bound_choice(
            a.kind,
            a.candidates,
            max(1, round(unit_error * a.spread * a.cells)),
            accounting,
            budget,
            a.quartile,
            a.median,
            a.half,
            a.cells > 1,
            a.decile,
            a.floor,
            a.lower,
            a.resolved,
            a.selected,
            a.means,
        )
        for a in asked
    )


def _plan_zcdp(
    epsilon: float,
    delta: float,
    components: tuple[tuple[int, int], ...],
    selection_groups: int | None,
    requests: tuple[SelectorRequest, ...],
    asked: tuple[BoundRequest, ...],
    allocated: bool,
) -> QueryNoise:
    values = len(components) + _request_shares(requests) + (1 if selection_groups is not None else 0)
    if values == 0:
        return QueryNoise((), None, Cost.ZERO, (), Accounting.ZCDP)
    # In parts: value_parts(…) per released value, one per choice of a bound (see _plan).
    weight = value_parts(values, len(asked)) if asked else 1
    shares = weight * values + len(asked) if asked else values
    # Partition selection's δ is spent for sure (up to half of δ); the rest converts ρ into ε.
    selection = None
    native_delta = 0.0
    spent_rho: list[float] = []
    if selection_groups is None:
        part = even_share(rho_for(epsilon, delta), shares)
    else:
        delta_selection = delta / 2.0
        part = even_share(rho_for(epsilon, remainder(delta, delta_selection)), shares)
        selection = gaussian_partition_selection(selection_groups, weight * part, delta_selection)
        native_delta = selection.delta
        spent_rho.append(selection.rho)
        if shares > weight and not allocated:
            # Its integer threshold spends less δ than half: what is left converts into more ρ, which
            # the other values share.
            total = rho_for(epsilon, remainder(delta, native_delta))
            part = max(part, even_share(remainder(total, selection.rho), shares - weight))
    share = weight * part
    columns = tuple(gaussian_noise(s, g, share) for s, g in components)
    selectors = _selectors(requests, Accounting.ZCDP, share)
    unit_error = gaussian_noise(1, 1, share).error95() if asked else 1.0
    choices = _choices(asked, Accounting.ZCDP, part, unit_error)
    rho = sum_up(spent_rho + [c.rho for c in columns] + [s.rho for s in selectors] + [c.rho for c in choices])
    converted = zcdp_to_approx_dp(rho, remainder(delta, native_delta))
    cost = Cost(converted, native_delta, rho)
    if not (converted <= epsilon and native_delta < delta):
        raise AssertionError(f"planned cost {cost} exceeds the requested (ε={epsilon!r}, δ={delta!r})")
    if allocated:
        allocated_delta = delta / 2.0 if selection_groups is not None else 0.0
        allocated_rho = sum_up([part] * shares)
        cost = Cost(
            zcdp_to_approx_dp(allocated_rho, remainder(delta, allocated_delta)),
            allocated_delta,
            allocated_rho,
        )
        if not (cost.epsilon <= epsilon and rho <= allocated_rho and native_delta <= allocated_delta):
            raise AssertionError(f"allocated cost {cost} does not cover the plan or exceeds the request")
    return QueryNoise(columns, selection, cost, selectors, Accounting.ZCDP, delta, choices)
