"""Counts, sums and averages are released column by column with numpy: the same values as the
group-by-group computation (Decimal arithmetic), and AVG error bars that still cover the exact span
the interval arithmetic bounds, narrowed to the test inversion's (release.pivot; never below it,
never above the group-by-group figure but for a float's rounding).

The noise here is zero and the "true" components are chosen to be what noisy ones can be: negative
or tiny counts, sums far outside what the bounds allow, magnitudes beyond where int64 and float64 are
exact (those groups take the group-by-group path), so every branch of the release is exercised.
"""

from __future__ import annotations

import dataclasses
import math
import random
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from dpproxy.engine import Engine, Plan
from dpproxy.policy import parse_policy
from dpproxy.privacy import QueryNoise, component_alpha
from dpproxy.release import ExactGroups, aggregates, release_aggregates
from dpproxy.release.aggregates import fine_components
from dpproxy.release.pivot import mean_spans, ratio_noise
from dpproxy.release.spans import Span
from dpproxy.sql.query import FINE, AggregateKind
from tests.release.stubs import NoNoise

POLICY = """
version: 1
defaults: {epsilon: 1.0, delta: 1.0e-6, mechanism: MECHANISM}
tables:
  t:
    privacy_unit: pid
    max_rows_per_unit: 1
    max_groups_per_unit: 1
    contribution_bounds: fixed  # components are handed to the release as the fixed limits give them
    columns:
      pid: {type: integer, summable: false}
      y: {type: numeric, lower: -20.5, upper: 100, scale: 2}
      n: {type: integer, lower: 0, upper: 10}
      f: {type: double precision, lower: 0, upper: 1}
"""
SQL = "SELECT COUNT(*), SUM(y), AVG(y), SUM(n), AVG(n), COUNT(y), SUM(f), AVG(f) FROM t"


def plan_for(mechanism: str) -> Plan:
    return Engine(parse_policy(POLICY.replace("MECHANISM", mechanism)), None).plan(SQL, epsilon=1.0)


def components_for(plan: Plan, rng: random.Random, groups: int, huge: bool) -> list[list[int]]:
    """Components as noisy values can be: every regime, including ones beyond float64's exact range
    (those groups go group by group) and, when `huge`, beyond int64 (the whole answer does)."""
    regimes = [0, 1, 2, 3, 5] + ([4] if huge else [])
    rows = []
    for g in range(groups):
        regime = regimes[g % len(regimes)]
        count = [
            rng.randint(-30, 3),  # at or below 0: the AVG span is the column's bounds
            rng.randint(1, 60),  # near the noise level
            rng.randint(100, 10**6),  # large groups
            rng.randint(10**13, 10**15),  # beyond the numpy path's exact range
            rng.randint(-(10**6), 10**6),
            rng.randint(1, 5),
        ][regime]
        row = []
        for component in plan.query.components:
            if component.kind.value in ("rows", "values"):
                row.append(count)
            else:
                spread = max(abs(count), 1) * 12_000
                if regime == 3:
                    spread = count * 4_000  # within int64's safe range, beyond float64's exact one
                elif regime == 4:
                    spread = 10**19  # beyond int64: the whole answer is exact Python ints
                elif regime == 5:
                    spread *= 1000  # far outside what the bounds allow
                row.append(rng.randint(-spread, spread))
        rows.append(row)
    return rows


def exact_avg_distance(plan: Plan, a: int, row: list[int], released: Decimal) -> Fraction:
    """The exact distance from the released AVG to the farther end of the span the error bar must
    cover: (centre + mean offset) / 10^s over the noisy components' bounds, or the column's bounds."""
    aggregate = plan.query.aggregates[a]
    assert aggregate.interval is not None
    centred, count = aggregate.components
    e_s, e_n = (Fraction(own_error(plan, plan.noise, i, component_alpha(2))) for i in (centred, count))
    lo, hi = aggregate.interval.on_grid(aggregate.scale)
    low, high = Fraction(lo - aggregate.centre), Fraction(hi - aggregate.centre)
    span = (low, high)
    if row[count] - e_n >= 1:
        ends = [
            Fraction(row[centred] + ds * e_s) / (row[count] + dn * e_n) for ds in (-1, 1) for dn in (-1, 1)
        ]
        means = (max(min(ends), low), min(max(ends), high))
        span = means if means[0] <= means[1] else span
    if row[count] >= 1:  # narrowed to the test inversion's span (release.pivot)
        pivot = ratio_noise(plan.noise, aggregate.components, fine_components(plan.query))
        floats = [np.array([float(row[i])]) for i in (centred, count)]
        inverted = pivot.span(*floats, (float(e_s), float(e_n)), float(low), float(high))
        span = (max(span[0], Fraction(inverted[0][0])), min(span[1], Fraction(inverted[1][0])))
    unit = Fraction(10) ** aggregate.scale
    ends_value = [(aggregate.centre + end) / unit for end in span]
    return max(Fraction(released) - ends_value[0], ends_value[1] - Fraction(released))


def own_error(plan: Plan, noise: QueryNoise, c: int, alpha: float) -> float:
    """Component c's error at level 1 − alpha on its own grid, as the release rounds a fine one's."""
    error = noise.columns[c].error_at(alpha)
    return math.ceil(error / FINE + 0.5) if c in fine_components(plan.query) else error


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_columns_at_once_release_what_group_by_group_does(mechanism: str) -> None:
    plan = plan_for(mechanism)
    noise = dataclasses.replace(plan.noise, columns=tuple(NoNoise(c) for c in plan.noise.columns))
    rng = random.Random(11)
    kinds = [a.kind for a in plan.query.aggregates]
    assert kinds.count(AggregateKind.AVG) == 3
    for size, huge in ((1, False), (7, True), (600, False)):
        rows = components_for(plan, rng, size, huge)
        # Scaled per person, on the fine grid: the release brings them back to these values.
        fine = fine_components(plan.query)
        noisy = [[FINE * v if i in fine else v for i, v in enumerate(row)] for row in rows]
        released = release_aggregates(
            plan.query, ExactGroups([(g,) for g in range(size)], noisy, [0] * size), noise
        )
        alpha2 = [own_error(plan, noise, c, component_alpha(2)) for c in range(len(noise.columns))]
        for g, row in enumerate(rows):
            for a, aggregate in enumerate(plan.query.aggregates):
                value, error = released.aggregates[g][a], released.group_errors[g][a]
                if aggregate.kind is AggregateKind.AVG:
                    offsets = Span(
                        *(Decimal(x - aggregate.centre) for x in aggregate.interval.on_grid(aggregate.scale))
                    )
                    pivot = ratio_noise(noise, aggregate.components, fine_components(plan.query))
                    ends = mean_spans(aggregate, offsets, [row], pivot, alpha2)[0]
                    expected, expected_error = aggregates._average(aggregate, offsets, row, alpha2, ends)
                    if expected is None:  # a noisy count below 1: NULL, as AVG over no values
                        assert value is None and error is None and row[aggregate.components[1]] < 1
                        continue
                    # The same number, spelled the same (PostgreSQL's numeric has no −0: nor have we).
                    assert value == expected and str(value) == str(expected if expected else abs(expected)), (
                        g,
                        a,
                    )
                    assert type(value) is type(expected) and isinstance(error, float)
                    assert exact_avg_distance(plan, a, row, value) <= Fraction(error)
                    if isinstance(value, Decimal):
                        assert (
                            error <= expected_error <= math.nextafter(error, math.inf)
                        )  # one step tighter at most
                    else:  # a float's ± also covers its rounding: a few ulps more at most
                        assert error <= expected_error + 3 * math.ulp(max(abs(value), expected_error))
                elif aggregate.kind is AggregateKind.SUM:
                    expected = aggregates._sum(aggregate, row)
                    assert value == expected and type(value) is type(expected) and str(value) == str(expected)
                    assert error is None
                else:
                    assert value == max(0, row[aggregate.components[0]]) and type(value) is int
                    assert error is None
        known = [e[2] for e in released.group_errors if e[2] is not None]
        # Every group's AVG NULL: the notice's figure is the column's whole range, as for no group.
        whole = float(plan.query.aggregates[2].interval.hi - plan.query.aggregates[2].interval.lo)
        assert released.errors[2] == (max(known) if known else whole)
