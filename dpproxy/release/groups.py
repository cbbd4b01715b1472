"""Which groups are released, chosen without looking at their values.

Every combination of public keys is released (zero-filled where no row has it); keys that are not
public go through DP partition selection on each group's noisy count of units. The groups come out
with their true values, in no meaningful order: post_process puts released rows in canonical order
(and ORDER BY … LIMIT k keeps the k first by their noisy values: post-processing).

This module never adds noise to values and never orders or shows groups: it only chooses them. What
the notice says about the groups not shown (`hidden_groups_notes`) is a function of the plan and of
the number of groups released, never of the groups that were not (docs/privacy.md §5).
"""

from __future__ import annotations

import itertools

from dpproxy.privacy import NoiseSpec, QueryNoise, SelectionSpec
from dpproxy.release.exact import ExactGroups
from dpproxy.release.left_out import hidden_note
from dpproxy.results import hidden_groups_note
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
        histograms = histograms if query.histograms else []
        groups = ExactGroups(keys, components, units, histograms, counted_at=exact.counted_at)
    else:
        assert noise.selection is not None
        groups = exact.subset(noise.selection.select(exact.units), noise.hidden is not None)
    return groups


def selection_threshold(query: PrivateQuery, noise: QueryNoise) -> tuple[int, int] | None:
    """Partition selection's threshold τ in persons (a group is released when its count of persons
    plus the selection's noise reaches τ) and the fewest persons from which a group is released with
    probability >= 95%: τ + w, w the least integer with P(Z >= −w) >= 95% (the noise is symmetric, so
    P(|Z| <= w) >= 90% gives it). None when no key goes through selection. Functions of the plan only.
    """
    spec = noise.selection
    if not query.keys or not query.needs_selection or not isinstance(spec, SelectionSpec):
        return None
    noise_of_selection = NoiseSpec(
        mechanism=spec.mechanism,
        sensitivity=1,
        max_groups=1,
        scale=spec.scale,
        d_in=1.0,
        epsilon=0.0,
        rho=0.0,
    )
    return spec.threshold, spec.threshold + int(noise_of_selection.error_at(0.10))


def hidden_groups_notes(
    query: PrivateQuery, noise: QueryNoise, released: int, present: int | None = None
) -> tuple[str, ...]:
    """The notice's sentence about the groups partition selection may have hidden: its threshold (of
    the plan), and, when no group was released, that this is why the answer is empty. `released`:
    the number of groups released, which the answer shows anyway. A count of hidden groups is a
    function of the data (docs/privacy.md §5, "What an answer says about hidden groups"): said only
    when the analyst asked for it and paid (noise.hidden), noisy, from `present` (ExactGroups.present)."""
    figures = selection_threshold(query, noise)
    if figures is None:
        return ()
    said = hidden_groups_note(*figures, released=released)
    if noise.hidden is not None and present is not None:
        said += "; " + hidden_note(present, noise.hidden, released)
    return (said,)
