"""Refined quantiles: the second pass of a quantile whose column's grid is finer than its K coarse
candidates (docs/privacy.md, quantiles).

Per released group, a first report-noisy-max over the coarse histogram (QuantileSpec at its coarse
share) picks a coarse bin; that pick is released to this module only and sets a window (the bin and
Histogram.WINDOW_RADIUS bins on each side), public from then on. A second statement counts the same
bounded rows per sub-bin inside the windows (dpproxy.sql.rewrite.row_pipeline.refinement_statement,
emitted with the plan: this module only writes the window's bin numbers into it);
the second pick (QuantileSpec.refined) then scores the partition made of the coarse bins outside the
window and the sub-bins inside it, with global ranks (the coarse counts below a sub-bin come from the
first pass, which counted the same rows), and the middle of the picked bin is released.

This module owns the two picks, the second statement's window list and the released values of
refined quantiles. It never shows a count or a first pick: only the second pick's value leaves it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal

from dpproxy.errors import InvalidParameter
from dpproxy.privacy import QuantileSpec, QueryNoise
from dpproxy.release.exact import ExactGroups, canonical_values
from dpproxy.release.requests import selectors
from dpproxy.sql.datetimes import from_epoch_grid
from dpproxy.sql.query import AggregateKind, PrivateQuery
from dpproxy.sql.rewrite.row_pipeline import RefinementStatement
from dpproxy.sql.types import PgType

Runner = Callable[[str], Sequence[Sequence[object]]]


def refined_aggregates(query: PrivateQuery, noise: QueryNoise) -> dict[int, QuantileSpec]:
    """The quantile aggregates released in two picks, with their (coarse) spec."""
    chosen_by = selectors(query).by_aggregate
    found: dict[int, QuantileSpec] = {}
    for a, aggregate in enumerate(query.aggregates):
        if aggregate.kind is not AggregateKind.QUANTILE or a not in chosen_by:
            continue
        spec = noise.selectors[chosen_by[a]]
        if isinstance(spec, QuantileSpec) and spec.refined is not None:
            found[a] = spec
    return found


def refine_quantiles(
    query: PrivateQuery,
    refinements: Mapping[int, RefinementStatement],
    groups: ExactGroups,
    noise: QueryNoise,
    run: Runner | None,
) -> dict[tuple[int, int], object]:
    """The released value of every refined quantile, by (group, aggregate): both picks, and the
    second statement of each refined histogram (emitted with the plan: `refinements`, by histogram)
    run through `run` for the windows of the first picks."""
    refined = refined_aggregates(query, noise)
    if not refined or not groups.keys:
        return {}
    if run is None:
        raise InvalidParameter("internal: a refined quantile needs its second statement run")
    n_keys = len(query.keys)
    # First picks, then the union of their windows per histogram.
    picks: dict[tuple[int, int], int] = {}
    bins: dict[int, set[int]] = {}
    for a, spec in refined.items():
        h = query.aggregates[a].histogram
        histogram = query.histograms[h]
        for g in range(len(groups.keys)):
            centre = spec.select(groups.histograms[g][h])
            picks[g, a] = centre
            bins.setdefault(h, set()).update(histogram.window(centre))
    index = {key: g for g, key in enumerate(groups.keys)}  # keys are canonical already (exact_groups)
    fine: dict[int, dict[tuple[int, int], list[int]]] = {}  # [h][(group, coarse bin)] sub-bin counts
    for h, window_bins in sorted(bins.items()):
        histogram = query.histograms[h]
        counts = fine.setdefault(h, {})
        for row in run(refinements[h].sql(sorted(window_bins))):
            g = index.get(canonical_values(row[:n_keys]))
            if g is None:
                continue
            # …, the coarse bin, the sub-bin, the count at the k the histograms hold (ExactGroups).
            coarse, sub = int(row[n_keys]), int(row[n_keys + 1])  # type: ignore[call-overload]
            count = int(row[n_keys + 2 + groups.counted_at])  # type: ignore[call-overload]
            counts.setdefault((g, coarse), [0] * histogram.fine)[sub] += count
    values: dict[tuple[int, int], object] = {}
    for (g, a), centre in picks.items():
        aggregate = query.aggregates[a]
        h = aggregate.histogram
        histogram = query.histograms[h]
        window = histogram.window(centre)
        partition: list[tuple[int, int | None]] = []
        scores_of: list[int] = []
        for j, count in enumerate(groups.histograms[g][h]):
            if j in window:
                sub_counts = fine[h].get((g, j), [0] * histogram.fine)
                partition.extend((j, s) for s in range(histogram.fine))
                scores_of.extend(sub_counts)
            else:
                partition.append((j, None))
                scores_of.append(count)
        second = refined[a].refined
        assert second is not None
        second = dataclasses.replace(second, candidates=len(scores_of))
        coarse, sub = partition[second.select(scores_of)]
        discrete = not aggregate.result_type.is_float
        value = histogram.bin_value(coarse, sub, discrete=discrete)
        values[g, a] = _typed(value, aggregate.result_type)
    return values


def _typed(value: Decimal, result_type: PgType) -> object:
    if result_type.is_temporal:
        return from_epoch_grid(value, result_type)  # a date or time on its epoch grid
    if result_type.is_float:
        return float(value)
    if result_type.is_integer:
        return int(value)
    return value
