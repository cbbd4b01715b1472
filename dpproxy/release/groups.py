"""Which groups are released, chosen without looking at their values.

Every combination of public keys is released (zero-filled where no row has it); keys that are not
public go through DP partition selection on each group's noisy count of units; a top-k query then
keeps the groups its report-noisy-top-k selection picks. The groups come out with their true values,
in no meaningful order: post_process puts released rows in canonical order.

This module never adds noise to values and never orders or shows groups: it only chooses them.
"""

from __future__ import annotations

import itertools

from dpproxy.privacy import QueryNoise
from dpproxy.release.exact import ExactGroups
from dpproxy.release.requests import selectors
from dpproxy.sql.query import PrivateQuery


def choose_groups(query: PrivateQuery, exact: ExactGroups, noise: QueryNoise) -> ExactGroups:
    """The released groups with their true values (zeros for absent ones), in no meaningful order:
    post_process puts released rows in canonical order."""
    if not query.keys:
        return exact
    if not query.needs_selection:
        domains = [k.public_values or () for k in query.keys]
        found = {key: i for i, key in enumerate(exact.keys)}
        zeros = [0] * len(query.components)
        empty = [[0] * h.candidates for h in query.histograms]
        keys, components, units, histograms = [], [], [], []
        for key in itertools.product(*domains):
            i = found.get(key)
            keys.append(key)
            components.append(exact.components[i] if i is not None else zeros)
            units.append(exact.units[i] if i is not None else 0)
            histograms.append(exact.histograms[i] if i is not None and exact.histograms else empty)
        groups = ExactGroups(keys, components, units, histograms if query.histograms else [])
    else:
        assert noise.selection is not None
        groups = exact.subset(noise.selection.select(exact.units))
    plan = selectors(query)
    if plan.top_k is not None and query.top_k is not None:
        component_index, _k = query.top_k
        spec = noise.selectors[plan.top_k]
        groups = groups.subset(spec.select([row[component_index] for row in groups.components]))
    return groups
