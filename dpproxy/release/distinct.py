"""COUNT(DISTINCT x) of a column that is not the privacy unit: the most values persons can carry.

One person can hold many values of x, and a count of the values they hold moves by all of them when
they join. Bounding each person to ℓ values bounds that, and which ℓ values matters: a person who
keeps values at random (or by a hash) leaves out values that others could have kept, and small ℓ
then counts far too few. Here a value is counted when it can be *given* to one of the persons who
hold it, each person given at most ℓ values: M(ℓ), the largest such assignment — a maximum flow
from the persons (capacity ℓ each) to the values they hold (capacity 1 each). Adding or removing a
person changes the largest assignment by at most their ℓ units of flow, so M(ℓ) has sensitivity ℓ,
whatever the others hold (Knop & Steinke 2023; docs/privacy.md §3). M(ℓ) is never above the true
count, and reaches it as soon as there are persons enough to carry every value: on the real-data
benchmarks at ℓ = 1 or 2 for airports, carriers, genres, years, lecturers and hours, where keeping a
person's first ℓ values by a hash needed ℓ = 32 to 256 for the same count.

Per group, a person's ℓ is shared among the groups they hold values in: their (group, value) pairs
are put in an order of their own (a salted hash of the person, the group's key and the value; equal
hashes by the key and value as spelled, never by the backend's row order), and
their capacity in a group at ℓ is how many of their first ℓ pairs fall in it — about in proportion
to what they hold there, never more in all than ℓ, and growing with ℓ (so M_g grows with ℓ too).
Each group's count moves by at most the person's capacity there, so the counts of all groups
together by at most ℓ (L1), as k bounds a person's rows in the whole query. The groups are one flow
network (each group's persons and values apart): a maximum flow of it is a maximum flow of each
group, read off per group.

This module computes M_g(ℓ) for every candidate ℓ (from the row pipeline's rows: each person's
distinct values per group); the choice of ℓ is dpproxy.privacy.bounds.DistinctChoice's. Nothing
here is shown to an analyst.
"""

from __future__ import annotations

import secrets
from collections.abc import Hashable, Mapping, Sequence
from itertools import repeat

import numpy as np

Key = tuple[object, ...]


def carried_per_group(
    groups: Mapping[Key, Sequence[tuple[Hashable, Hashable]]], caps: Sequence[int], salt: int | None = None
) -> dict[Key, list[int]]:
    """M_g(ℓ) of each group (by its key) for each ℓ in `caps` (ascending), each person's ℓ shared
    among their groups by the order of their pairs salted with `salt` (random when None; see the
    module docstring)."""
    salt = secrets.randbits(64) if salt is None else salt
    keys = list(groups)
    person_ids: dict[Hashable, int] = {}
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # per group: persons, cells, hashes
    spelled: list[str] = []  # each pair's group key and value, spelled: the order among equal hashes
    cell_group: list[int] = []
    for g, key in enumerate(keys):
        if not groups[key]:
            continue
        persons, held_values = zip(*groups[key], strict=True)
        value_ids: dict[Hashable, int] = {}
        cells = [value_ids.setdefault(v, len(value_ids)) for v in held_values]
        hashed = map(hash, zip(repeat(salt), persons, repeat(key), held_values))
        spelled += [repr((key, v)) for v in held_values]
        parts.append(
            (
                np.array([person_ids.setdefault(p, len(person_ids)) for p in persons], dtype=np.int64),
                len(cell_group) + np.array(cells, dtype=np.int64),
                np.fromiter(hashed, dtype=np.int64, count=len(cells)),
            )
        )
        cell_group += [g] * len(value_ids)
    if not parts:
        return {key: [0] * len(caps) for key in keys}
    groups_of_cells = np.array(cell_group, dtype=np.int64)
    person, cell, hashes = (np.concatenate(column) for column in zip(*parts, strict=True))
    # One slot per (person, group) they hold values in; one pair per (slot, value), kept once.
    _, first = np.unique(person * len(cell_group) + cell, return_index=True)
    person, cell, hashes = person[first], cell[first], hashes[first]
    # Python's hash ties for some distinct pairs (hash(-1) == hash(-2), and so every tuple differing
    # only there): ties are broken by the pair itself, never by where the backend's rows put it —
    # that order depends on other persons' rows (an adversarial review moved 20 persons' capacity
    # between two groups with one row of someone else).
    _, tie = np.unique(np.array(spelled, dtype=object)[first], return_inverse=True)
    slot_ids, slot_of_pair = np.unique(person * len(keys) + groups_of_cells[cell], return_inverse=True)
    slots = len(slot_ids)
    pairs = np.stack([slot_of_pair.ravel(), cell], axis=1)
    values = np.bincount(groups_of_cells, minlength=len(keys))
    held = np.bincount(pairs[:, 0], minlength=slots)  # values a person holds in a group
    # Each person's pairs in their salted order: rank = place among the person's pairs.
    order = np.lexsort((tie.ravel(), hashes, person))
    starts = np.searchsorted(person[order], person[order], side="left")
    rank = np.empty(len(pairs), dtype=np.int64)
    rank[order] = np.arange(len(pairs)) - starts
    network = _Network(pairs, slots, groups_of_cells, len(keys))
    found = []
    for cap in caps:
        capacity = np.bincount(pairs[:, 0], weights=rank < cap, minlength=slots).astype(np.int64)
        if found and (found[-1] == values).all():
            found.append(values)  # every value carried already: more capacity carries no more
        elif (capacity >= held).all():
            found.append(values)  # every person can take every value they hold
        else:
            found.append(network.carried(capacity))
    return {key: [int(m[g]) for m in found] for g, key in enumerate(keys)}


class _Network:
    """source → (person, group) [capacity: theirs there] → (group, value) [1] → sink [1], built once
    in compressed rows (the capacities of the source's edges change with ℓ, nothing else)."""

    def __init__(self, pairs: np.ndarray, slots: int, cell_group: np.ndarray, groups: int) -> None:
        cells = len(cell_group)
        self.sink = slots + cells + 1
        self.slots, self.cell_group, self.groups = slots, cell_group, groups
        pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]  # by slot, then value: rows in order
        # Row 0 (the source) has an edge to each slot; slot rows to their values; value rows to the sink.
        per_row = np.concatenate(
            [[slots], np.bincount(pairs[:, 0], minlength=slots), np.ones(cells, np.int64), [0]]
        )
        indptr = np.concatenate([[0], np.cumsum(per_row)]).astype(np.int32)
        indices = np.concatenate([1 + np.arange(slots), slots + 1 + pairs[:, 1], np.full(cells, self.sink)])
        data = np.ones(len(indices), np.int32)
        shape = (self.sink + 1, self.sink + 1)
        # SciPy is imported where a count of distinct values needs it, not with the package: its
        # sparse graphs cost every process a quarter of a second at start (the CLI, each worker).
        from scipy.sparse import csr_matrix

        self.graph = csr_matrix((data, indices.astype(np.int32), indptr), shape=shape)

    def carried(self, capacity: np.ndarray) -> np.ndarray:
        """The values carried in each group at these (person, group) capacities."""
        from scipy.sparse.csgraph import maximum_flow

        self.graph.data[: self.slots] = capacity
        result = maximum_flow(self.graph, 0, self.sink, method="dinic")
        if self.groups == 1:
            return np.array([result.flow_value], dtype=np.int64)
        # The flow is antisymmetric: the sink's row holds minus what each value sends it.
        flow = result.flow
        row = slice(flow.indptr[self.sink], flow.indptr[self.sink + 1])
        into_sink = np.zeros(len(self.cell_group), dtype=np.int64)
        into_sink[flow.indices[row] - self.slots - 1] = -flow.data[row]
        return np.bincount(self.cell_group, weights=into_sink, minlength=self.groups).astype(np.int64)
