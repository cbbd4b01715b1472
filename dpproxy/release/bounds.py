"""Step 1½ of a release with bounds chosen per query: choose k, g and ℓ privately from the
candidates' counts (dpproxy.privacy.bounds), keep the values at those bounds, choose the groups
(step 2, dpproxy.release.groups), and say what was chosen.

The choices are drawn here, from counts of persons per candidate that the main statement computed
(ExactGroups.candidates); the chosen bounds are released (the notice says them). Over keys that are
not public, k may be drawn after partition selection (`choose_bounds`), its aim read from how many
groups selection released. Nothing else of the counts leaves this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dpproxy.privacy import QueryNoise
from dpproxy.privacy.bounds import BoundChoice, DistinctChoice
from dpproxy.release.exact import ExactGroups
from dpproxy.release.groups import choose_groups
from dpproxy.release.left_out import removed_note
from dpproxy.sql.bounds import counts_every_row, distinct_bounds, fixed_limits, reads_rows
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
    # What k below the ceiling does to the query's aggregates (`bounding_effects`): the notice says
    # it, since the ± is the noise's alone.
    effects: tuple[str, ...] = ()
    # No value released depends on k (dpproxy.sql.bounds.reads_rows): the notice speaks of groups only.
    rows_read: bool = True
    # k counts only the rows whose values are not all NULL or 0 (dpproxy.sql.bounds.counts_every_row).
    every_row: bool = True
    # The averages' and spreads' own k, when the query has two (dpproxy.sql.bounds.mean_components):
    # `rows` is then the other aggregates' k, `effects` what it does to them.
    mean_rows: int | None = None
    mean_floored: bool = False
    mean_effects: tuple[str, ...] = ()
    # With two k's, what each bounds, in the notice's words (`families`): ("counts and sums", "averages").
    families: tuple[str, str] = ("", "")
    # SET dpproxy.estimate_left_out = on: the notice's sentence on what k removed (release.left_out).
    removed: str = ""

    def note(self) -> str:
        """The notice's sentence; empty when it has nothing to say (persons counted over the whole
        table: neither k nor g bounds anything released)."""
        if not self.rows_read and self.groups is None:
            return ""

        def how(value: int, chosen: bool, ceiling: int, floored: bool = False) -> str:
            said = "chosen" if chosen else "set"
            if chosen and floored:
                said = "chosen, not below a quarter of the ceiling without a WHERE"
            return f" ({said}; ceiling {ceiling})" if value < ceiling else f" ({said}: the ceiling)"

        text = "contribution bounds of this query: "
        if self.rows_read:
            text += f"at most {self.rows} row(s) per person"
            if not self.every_row:
                text += " that add to a value (not all NULL or 0)"
            if self.mean_rows is not None:
                text += f" for {self.families[0]}"
            text += how(self.rows, self.rows_chosen, self.row_ceiling, self.rows_floored)
            if self.mean_rows is not None:
                text += f", at most {self.mean_rows} for {self.families[1]}"
                text += how(self.mean_rows, self.rows_chosen, self.row_ceiling, self.mean_floored)
        if self.groups is not None:
            text += ", counted in at most " if self.rows_read else "each person counted in at most "
            text += f"{self.groups} group(s)" + how(self.groups, self.groups_chosen, self.group_ceiling)
        rows = "row(s)" if self.every_row else "such row(s)"
        if self.mean_rows == self.rows:  # one sentence for both, each effect once
            if self.rows < self.row_ceiling:
                text += effects_clause((*self.effects, *self.mean_effects), self.rows, "", rows)
            return text
        if self.rows < self.row_ceiling:
            text += effects_clause(self.effects, self.rows, "", rows)
        if self.mean_rows is not None and self.mean_rows < self.row_ceiling:
            text += effects_clause(self.mean_effects, self.mean_rows, "", rows)
        return text


# What a bound k below the ceiling does, per kind of aggregate (dpproxy.sql.rewrite.per_group scales
# a heavier person's contributions by k/rows; quantiles and modes keep their first k rows).
_EFFECTS: tuple[tuple[Callable[[AggregateKind], bool], str], ...] = (
    (
        lambda kind: kind in (AggregateKind.COUNT, AggregateKind.COUNT_VALUES, AggregateKind.SUM),
        "counts and sums can miss what such persons have beyond that",
    ),
    (
        lambda kind: kind.is_mean,
        "averages and spreads weigh such persons as {k} rows",
    ),
    (
        lambda kind: kind in (AggregateKind.QUANTILE, AggregateKind.MODE),
        "quantiles and modes read their first {k} rows only",
    ),
)


def fixed_bounds_notes(query: PrivateQuery) -> tuple[str, ...]:
    """With fixed limits (no bounds chosen per query; persons bounded), the notice's sentence: the
    limits, and what they do to a heavier person's rows in a group. A function of the policy and the
    query's text, said whether or not anyone has more rows, so it costs nothing."""
    if not fixed_limits(query):
        return ()
    r = query.max_rows
    text = "contribution bounds of this query (fixed by the policy): at most "
    text += f"{r} row(s) per person in a group"
    if query.keys:
        text += f", in at most {query.max_groups} group(s)"
    return (text + effects_clause(bounding_effects(query), r, " in a group"),)


def effects_clause(effects: tuple[str, ...], k: int, where: str, rows: str = "row(s)") -> str:
    """The notice's clause on what a bound of k rows (`where`: per group, or "" in all) does to a
    heavier person's rows, from `bounding_effects`; "" when it does nothing the query reads."""
    if not effects:
        return ""
    there = " there" if where else ""
    return (
        f"; a person with more than {k} {rows}{where} counts as {k}{there}: "
        + ", ".join(effect.format(k=k) for effect in effects)
        + " (not in the ±, which is the noise's)"
    )


def bounding_effects(query: PrivateQuery, means: bool | None = None) -> tuple[str, ...]:
    """What bounding a person's rows at k below the ceiling does to the query's aggregates, in the
    notice's words ({k} for k): a function of the query's text, said whether or not any person has more rows
    (that would be a fact of the data). COUNT(DISTINCT …) is bounded by g and ℓ, not by k. `means`:
    of the averages and spreads alone (True) or of the others (False), for a query with two k's."""
    kinds = {a.kind for a in query.aggregates if means is None or a.kind.is_mean == means}
    return tuple(said for affected, said in _EFFECTS if any(affected(kind) for kind in kinds))


# Each kind's word in the notice of a query with two k's (`families`).
_FAMILY_WORDS = (
    ((AggregateKind.COUNT, AggregateKind.COUNT_VALUES), "counts"),
    ((AggregateKind.SUM,), "sums"),
    ((AggregateKind.QUANTILE,), "quantiles"),
    ((AggregateKind.MODE,), "modes"),
    ((AggregateKind.AVG,), "averages"),
    (tuple(kind for kind in AggregateKind if kind.is_spread), "spreads"),
)


def families(query: PrivateQuery) -> tuple[str, str]:
    """What each of a query's two k's bounds, in the notice's words: ("counts and sums", "averages")."""
    kinds = {a.kind for a in query.aggregates}
    said = [(word, kinds_of[0].is_mean) for kinds_of, word in _FAMILY_WORDS if kinds & set(kinds_of)]

    def listed(words: list[str]) -> str:
        return " and ".join([", ".join(words[:-1]), words[-1]] if len(words) > 2 else words)

    return (
        listed([word for word, means in said if not means]),
        listed([word for word, means in said if means]),
    )


def choose_bounds(
    query: PrivateQuery,
    exact: ExactGroups,
    noise: QueryNoise,
    noise_at: Callable[[int, int, int, int | None], QueryNoise],
    values: int = -1,
) -> tuple[ExactGroups, ChosenBounds, QueryNoise]:
    """The groups released (release.groups.choose_groups) with their values at privately chosen
    bounds, the bounds (one draw per choice the plan holds), and the noise for those values
    (`noise_at(k, g, ℓ, the averages' own k or None)`, indexes into the query's bounds and `values`
    into ℓ's: Plan.noise_at).

    A k drawn after partition selection (BoundChoice.after_selection: counts and sums over keys
    that are not public) is drawn once the groups are: g first, then the groups selection releases
    (reading the units counted at g, never anything at k), then k aiming at m persons above per
    released group. The mechanisms are the plan's, each reading what it read before; only k's aim
    is fixed later, from selection's output, already drawn (docs/privacy.md §3)."""
    bounds, found = query.bounds, exact.candidates
    assert bounds is not None and found is not None
    rows, groups = len(bounds.rows) - 1, max(0, len(bounds.groups) - 1)
    means: int | None = None  # the averages' own k (sql.bounds.mean_components), when planned
    floored = mean_floored = False
    rows_choices: list[BoundChoice] = []
    for choice in noise.choices:
        if isinstance(choice, DistinctChoice):
            continue  # ℓ: choose_distinct
        if choice.kind == "rows":
            rows_choices.append(choice)
        else:
            groups = choice.select(found.wider, found.persons)
    released: Sequence[int] | None = None
    selection = None
    for rows_choice in rows_choices:
        if rows_choice.after_selection:  # planned only for keys that go through selection
            selection = noise_at(len(bounds.rows) - 1, groups, values, None).selection  # it reads g alone
            assert selection is not None
            released = selection.select(exact.units_at(groups if bounds.groups else None))
            rows_choice = rows_choice.for_released_groups(len(released))
        picked = rows_choice.select(found.above, found.persons)
        if rows_choice.means:
            means, mean_floored = picked, rows_choice.floored
        else:
            rows, floored = picked, rows_choice.floored
    resolved = exact.resolve(query, rows, groups if bounds.groups else None, means)
    noise = noise_at(rows, groups, values, means)
    if released is None:
        kept = choose_groups(query, resolved, noise)
    elif noise.selection != selection:
        raise AssertionError("partition selection must not depend on the chosen k")
    else:
        kept = resolved.subset(released, noise.hidden is not None)
    removed = ""
    if noise.estimate is not None:  # at the lower k, which removes more
        lower, label = rows, ""
        if means is not None and bounds.rows[means] != bounds.rows[rows]:
            lower = min(rows, means)  # candidates ascend
            label = f" for {families(query)[1 if lower == means else 0]}"
        removed = removed_note(found, lower, bounds.rows[lower], bounds.row_cap, noise.estimate, label)
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
        bounding_effects(query, None if means is None else False),
        reads_rows(query),
        counts_every_row(query),
        None if means is None else bounds.rows[means],
        mean_floored,
        () if means is None else bounding_effects(query, True),
        families(query),
        removed,
    )
    return kept, chosen, noise


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
