"""Step 1½ of a release with bounds chosen per query: choose k, g and ℓ privately from the
candidates' counts (dpproxy.privacy.bounds), keep the values at those bounds, and say what was chosen.

The choices are drawn here, from counts of persons per candidate that the main statement computed
(ExactGroups.candidates); the chosen bounds are released (the notice says them). Nothing else of the
counts leaves this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpproxy.privacy import QueryNoise
from dpproxy.privacy.bounds import DistinctChoice
from dpproxy.release.exact import ExactGroups
from dpproxy.sql.bounds import distinct_bounds
from dpproxy.sql.query import AggregateKind, PrivateQuery


@dataclass(frozen=True)
class ChosenBounds:
    """The candidates chosen (indexes into PrivateQuery.bounds) and the bounds they are."""

    rows_index: int
    groups_index: int
    rows: int  # k: a person's rows in the whole query
    groups: int | None  # g: the groups a person counts in (None: no count of units is released)
    row_ceiling: int
    group_ceiling: int
    rows_chosen: bool  # False: one candidate (the session set it, or nothing else fits the ceiling)
    groups_chosen: bool
    # k's rule kept it at or above a quarter of the ceiling (BoundChoice.floor): the notice says so,
    # as it is why k may sit far above every person's rows when the ceiling is generous.
    rows_floored: bool = False

    def note(self) -> str:
        """The notice's sentence."""

        def how(value: int, chosen: bool, ceiling: int, floored: bool = False) -> str:
            said = "chosen" if chosen else "set"
            if chosen and floored:
                said = "chosen, not below a quarter of the ceiling without a WHERE"
            return f" ({said}; ceiling {ceiling})" if value < ceiling else f" ({said}: the ceiling)"

        text = "contribution bounds of this query: at most "
        text += f"{self.rows} row(s) per person"
        text += how(self.rows, self.rows_chosen, self.row_ceiling, self.rows_floored)
        if self.groups is not None:
            text += f", counted in at most {self.groups} group(s)"
            text += how(self.groups, self.groups_chosen, self.group_ceiling)
        return text


def choose_bounds(
    query: PrivateQuery, exact: ExactGroups, noise: QueryNoise
) -> tuple[ExactGroups, ChosenBounds]:
    """The values at privately chosen bounds, and the bounds (one draw per choice the plan holds)."""
    bounds, found = query.bounds, exact.candidates
    assert bounds is not None and found is not None
    rows, groups = len(bounds.rows) - 1, max(0, len(bounds.groups) - 1)
    floored = False
    for choice in noise.choices:
        if isinstance(choice, DistinctChoice):
            continue  # ℓ: choose_distinct
        if choice.kind == "rows":
            rows = choice.select(found.above, found.persons)
            floored = choice.floored
        else:
            groups = choice.select(found.wider, found.persons)
    resolved = exact.resolve(query, rows, groups if bounds.groups else None)
    chosen = ChosenBounds(
        rows,
        groups,
        bounds.rows[rows],
        bounds.groups[groups] if bounds.groups else None,
        bounds.row_cap,
        bounds.group_cap,
        bounds.choose_rows,
        bounds.choose_groups,
        floored,
    )
    return resolved, chosen


def choose_distinct(
    query: PrivateQuery, exact: ExactGroups, noise: QueryNoise
) -> tuple[ExactGroups, int, str]:
    """The COUNT(DISTINCT x) values at a privately chosen ℓ (DistinctChoice, from M(ℓ_j) summed over
    the groups and the query's COUNT(DISTINCT …)s), its index into distinct_bounds, and the notice's
    sentence."""
    caps = distinct_bounds(query)
    index = len(caps) - 1
    for choice in noise.choices:
        if isinstance(choice, DistinctChoice):
            totals = [sum(counts[j] for counts in exact.carried.values()) for j in range(len(caps))]
            index = choice.select(totals)
    counted = ", ".join(a.text for a in query.aggregates if a.kind is AggregateKind.COUNT_DISTINCT)
    said = "chosen" if len(caps) > 1 else "set"
    ceiling = f"{said}; ceiling {caps[-1]}" if index < len(caps) - 1 else f"{said}: the ceiling"
    groups = " in all groups together" if query.keys else ""
    note = (
        f"{counted}: each person counted for at most {caps[index]} distinct value(s){groups} ({ceiling}); a "
        "value is counted when some person holding it can be given it, so the count is never above the truth"
    )
    return exact.carrying(index), index, note
