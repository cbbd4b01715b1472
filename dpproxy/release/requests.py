"""What a query asks of the exponential mechanism: its selector requests, in one fixed order.

This module owns the order in which a query's quantiles and modes are requested: plan_query_noise
returns one selector per request in that order (QueryNoise.selectors), and the release finds each
aggregate's selector by its place in it.

It never sees rows, values or noise: only the query's declared aggregates and limits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dpproxy.privacy import ModeRequest, QuantileRequest, SelectorRequest
from dpproxy.sql.postprocess.intervals import interval_slots
from dpproxy.sql.query import AggregateKind, PrivateQuery
from dpproxy.sql.rewrite.row_pipeline import histogram_rows


@dataclass(frozen=True)
class Selectors:
    """Which exponential-mechanism release (QueryNoise.selectors, in request order) serves what."""

    requests: tuple[SelectorRequest, ...]
    by_aggregate: dict[int, int]  # aggregate index -> selector index
    # aggregate index -> selector indexes of its interval's (low, high) ends: quantiles whose
    # dp_interval_low/high the query reads, each end a pick of its own (QuantileSpec.shift)
    interval_ends: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)


def selectors(query: PrivateQuery, rows: int = -1, groups: int = -1) -> Selectors:
    """The selector requests of a query, in a fixed order the plan and the release share. With
    bounds chosen per query, quantiles and modes count the rows a person keeps at candidate `rows`
    of k in each of their first `groups` of g (dpproxy.sql.rewrite.row_pipeline.histogram_rows; -1:
    the ceilings, as the plan reserves): what one person moves in one group's histogram, and in how
    many groups."""
    requests: list[SelectorRequest] = []
    by_aggregate: dict[int, int] = {}
    r, g = query.max_rows, query.max_groups
    ranks = histogram_rows(query)
    if ranks is not None:
        r, chosen_g = ranks.at(rows, groups)
        g = chosen_g if chosen_g is not None else g
    for a, aggregate in enumerate(query.aggregates):
        if aggregate.kind is AggregateKind.QUANTILE:
            assert aggregate.alpha is not None
            histogram = query.histograms[aggregate.histogram]
            by_aggregate[a] = len(requests)
            fine = histogram.fine_candidates if histogram.fine else 0
            requests.append(QuantileRequest(aggregate.alpha, histogram.candidates, r, g, fine))
        elif aggregate.kind is AggregateKind.MODE:
            histogram = query.histograms[aggregate.histogram]
            by_aggregate[a] = len(requests)
            requests.append(ModeRequest(histogram.candidates, r, g))
    # Last, so that the indexes above are those of a query that reads no interval.
    interval_ends: dict[int, tuple[int, int]] = {}
    for a in sorted({a for a, _ in interval_slots(query.post_processing)}):
        aggregate = query.aggregates[a]
        if aggregate.kind is not AggregateKind.QUANTILE:
            continue
        assert aggregate.alpha is not None and 0 < aggregate.alpha < 1
        histogram = query.histograms[aggregate.histogram]
        interval_ends[a] = (len(requests), len(requests) + 1)
        for end in (-1, 1):
            requests.append(QuantileRequest(aggregate.alpha, histogram.candidates, r, g, end=end))
    return Selectors(tuple(requests), by_aggregate, interval_ends)
