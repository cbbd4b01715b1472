"""The sensitivity certificate shared by the certificate tests: one plan, D and each neighbour."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from dpproxy.engine import Plan
from dpproxy.release import ExactGroups

# Runs one statement on D (without=None) or on D minus one person.
Runner = Callable[[str, "int | None"], Sequence[tuple]]


def measure(plan: Plan, run: Runner, without: int | None = None) -> ExactGroups:
    return plan.measure(*(run(sql, without) for sql in plan.statements))


def by_key(m: ExactGroups) -> dict[tuple, tuple[list[int], int, list[list[int]]]]:
    histograms = m.histograms or [[] for _ in m.keys]
    return {k: (c, u, h) for k, c, u, h in zip(m.keys, m.components, m.units, histograms, strict=True)}


def certify(plan: Plan, run: Runner, persons: int | Iterable[int]) -> None:
    """Every released value moves by at most its sensitivity when one person is removed; over the
    query's groups by at most max_groups × that (L1); no person changes more than max_groups groups;
    each histogram of a group moves by at most max_rows counts (L1 over its candidates); a group key
    is spelled the same on both (the spelling is released, with no noise).

    `persons`: the persons to remove one at a time (a count n means persons 0…n−1)."""
    measured = measure(plan, run)
    full = by_key(measured)
    spelled = {key: repr(key) for key in measured.keys}
    sensitivities = plan.sensitivities
    g, r = plan.query.max_groups, plan.query.max_rows
    empty = ([0] * len(sensitivities), 0, [[0] * h.candidates for h in plan.query.histograms])
    for unit in range(persons) if isinstance(persons, int) else persons:
        measured_neighbour = measure(plan, run, unit)
        neighbour = by_key(measured_neighbour)
        for key in measured_neighbour.keys:
            # Equal keys must be spelled alike (-0.0 and 0.0 are equal, and printed differently).
            assert key not in spelled or spelled[key] == repr(key), (plan.query.text, "key spelling", key)
        l1 = [0] * len(sensitivities)
        changed = 0
        for key in set(full) | set(neighbour):
            (a, units_a, hist_a), (b, units_b, hist_b) = full.get(key, empty), neighbour.get(key, empty)
            hist_a = hist_a or empty[2]
            hist_b = hist_b or empty[2]
            assert abs(units_a - units_b) <= 1, (plan.query.text, key, "unit count moved by more than 1")
            moved_histograms = [
                sum(abs(x - y) for x, y in zip(ha, hb, strict=True))
                for ha, hb in zip(hist_a, hist_b, strict=True)
            ]
            if a != b or units_a != units_b or any(moved_histograms):
                changed += 1
            for i, sensitivity in enumerate(sensitivities):
                delta = abs(a[i] - b[i])
                assert delta <= sensitivity, (plan.query.text, key, i, delta, sensitivity)
                l1[i] += delta
            for h, moved in enumerate(moved_histograms):
                assert moved <= r, (plan.query.text, key, "histogram", h, moved, r)
        assert changed <= g, (plan.query.text, unit, changed, g)
        for i, sensitivity in enumerate(sensitivities):
            assert l1[i] <= g * sensitivity, (plan.query.text, i, l1[i], g, sensitivity)
