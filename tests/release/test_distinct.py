"""COUNT(DISTINCT x) per person (dpproxy.release.distinct) and the choice of ℓ (DistinctChoice)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from dpproxy.privacy import Accounting
from dpproxy.privacy.bounds import DISTINCT_GRID, distinct_choice
from dpproxy.release.distinct import carried_per_group

CAPS = (1, 2, 3, 4, 8)


def carried_values(pairs: Iterable[tuple[int, str]], caps: Sequence[int]) -> list[int]:
    """M(ℓ) of one group for each ℓ in `caps`."""
    return carried_per_group({(): list(pairs)}, caps).get((), [0] * len(caps))


# (person, value) pairs of a handful of persons and values: small enough to check by brute force.
pairs_of = st.sets(st.tuples(st.integers(0, 5), st.sampled_from("abcdefgh")), max_size=24)


def brute_force(pairs: set[tuple[int, str]], cap: int) -> int:
    """The most values given to persons holding them, each person at most `cap`, by trying every
    set of values and every assignment."""
    values = sorted({v for _, v in pairs})
    holders = {v: [p for p, w in pairs if w == v] for v in values}
    for size in range(len(values), 0, -1):
        for chosen in itertools.combinations(values, size):
            for owners in itertools.product(*(holders[v] for v in chosen)):
                if all(owners.count(p) <= cap for p in set(owners)):
                    return size
    return 0


@settings(max_examples=150, deadline=None)
@given(pairs_of)
def test_the_count_is_the_largest_assignment(pairs: set[tuple[int, str]]) -> None:
    found = carried_values(sorted(pairs), CAPS)
    assert found == [brute_force(pairs, cap) for cap in CAPS]
    # Never above the true count of values, and never falling as ℓ grows.
    assert all(m <= len({v for _, v in pairs}) for m in found)
    assert found == sorted(found)


@settings(max_examples=300, deadline=None)
@given(pairs_of, st.integers(0, 5))
def test_one_person_moves_the_count_by_at_most_l(pairs: set[tuple[int, str]], person: int) -> None:
    without = {(p, v) for p, v in pairs if p != person}
    for cap, a, b in zip(CAPS, carried_values(pairs, CAPS), carried_values(without, CAPS), strict=True):
        assert 0 <= a - b <= cap


# (group, person, value) triples: a person's ℓ is shared among the groups they hold values in.
triples_of = st.sets(
    st.tuples(st.sampled_from("xyz"), st.integers(0, 5), st.sampled_from("abcdef")), max_size=30
)


def by_group(triples: set[tuple[str, int, str]]) -> dict[tuple[object, ...], list[tuple[object, object]]]:
    found: dict[tuple[object, ...], list[tuple[object, object]]] = {}
    for g, p, v in sorted(triples):
        found.setdefault((g,), []).append((p, v))
    return found


@settings(max_examples=300, deadline=None)
@given(triples_of, st.integers(0, 5))
def test_one_person_moves_every_group_together_by_at_most_l(
    triples: set[tuple[str, int, str]], person: int
) -> None:
    full = carried_per_group(by_group(triples), CAPS, salt=7)
    less = carried_per_group(by_group({t for t in triples if t[1] != person}), CAPS, salt=7)
    for j, cap in enumerate(CAPS):
        moved = [abs(full[key][j] - less.get(key, [0] * len(CAPS))[j]) for key in full]
        assert sum(moved) <= cap
    # Each group's count is never above its true number of values.
    for key, counts in full.items():
        assert max(counts) <= len({v for g, _, v in triples if (g,) == key})


def test_a_value_held_by_many_persons_needs_one_of_them() -> None:
    # 100 persons each fly to the same 5 destinations and one of their own: at ℓ = 1 every
    # destination finds a person, and 95 persons carry their own one.
    pairs = [(p, d) for p in range(100) for d in "ABCDE"] + [(p, f"own{p}") for p in range(100)]
    assert carried_values(pairs, (1, 2)) == [100, 105]
    assert carried_values([], (1, 2)) == [0, 0]


@given(
    st.lists(st.integers(0, 10_000), min_size=5, max_size=5),
    st.lists(st.floats(-1, 1), min_size=5, max_size=5),
)
def test_the_choice_scores_move_by_at_most_the_grid(counts: list[int], moves: list[float]) -> None:
    # A person moves every M(ℓ_j) by at most weight·ℓ_j (weight 3): the floored scores move by at most
    # DISTINCT_GRID, whatever the counts.
    choice = distinct_choice((1, 2, 4, 8, 16), 3, 7.5, Accounting.PURE, 0.1)
    neighbour = [
        max(0, m + int(move * 3 * bound))
        for m, move, bound in zip(counts, moves, choice.candidates, strict=True)
    ]
    for x, y in zip(choice.scores(counts), choice.scores(neighbour), strict=True):
        assert abs(x - y) <= DISTINCT_GRID


def test_the_choice_stops_where_the_count_saturates() -> None:
    # Every value carried from ℓ = 2 on: larger ℓ only adds noise.
    choice = distinct_choice((1, 2, 4, 8, 16, 32), 1, 7.5, Accounting.PURE, 0.5)
    picks = [choice.candidates[choice.select([600, 1000, 1000, 1000, 1000, 1000])] for _ in range(400)]
    assert picks.count(2) >= 340  # about 94% of the draws (7 standard deviations above 85%)
    # Carriers: 16 values, one per plane, carried at ℓ = 1.
    picks = [choice.candidates[choice.select([16] * 6)] for _ in range(400)]
    assert picks.count(1) >= 340


@settings(max_examples=150, deadline=None)
@given(pairs_of, pairs_of)
def test_groups_apart_are_counted_apart(first: set[tuple[int, str]], second: set[tuple[int, str]]) -> None:
    # Persons of one group only (x: 0…5, y: 10…15) keep their whole ℓ there: each group's count is
    # the one it has alone, read off the one flow of both.
    groups = {("x",): sorted(first), ("y",): sorted((p + 10, v) for p, v in second)}
    together = carried_per_group(groups, CAPS, salt=3)
    assert together.get(("x",), [0] * len(CAPS)) == carried_values(sorted(first), CAPS)
    assert together.get(("y",), [0] * len(CAPS)) == carried_values(sorted(second), CAPS)


# Integer group keys with -1 and -2, whose Python hashes are equal (so are those of any tuple that
# differs only there): the salted order of a person's pairs ties between such groups.
colliding_of = st.sets(
    st.tuples(st.sampled_from([-1, -2, 3]), st.integers(0, 5), st.sampled_from([-1, -2, 7])), max_size=30
)


@settings(max_examples=200, deadline=None)
@given(colliding_of, st.randoms(use_true_random=False))
def test_the_counts_are_a_function_of_the_pairs_not_of_the_backends_row_order(
    triples: set[tuple[int, int, int]], shuffler
) -> None:
    """The backend returns the row pipeline's rows in an order that depends on every person's rows:
    each person's share of ℓ among their groups must not (an adversarial review moved 20 persons'
    capacity from one group to another with one row of someone else, L1 41 against ℓ = 1)."""

    def arranged(order: list[tuple[int, int, int]]) -> dict[tuple[object, ...], list[tuple[object, object]]]:
        found: dict[tuple[object, ...], list[tuple[object, object]]] = {}
        for g, p, v in order:
            found.setdefault((g,), []).append((p, v))
        return found

    rows = sorted(triples)
    reference = carried_per_group(arranged(rows), CAPS, salt=11)
    shuffled = list(rows)
    shuffler.shuffle(shuffled)
    assert carried_per_group(arranged(shuffled), CAPS, salt=11) == reference


def test_a_tie_between_two_groups_follows_the_pairs_themselves() -> None:
    # The adversarial review's case: persons 100…119 hold their own value in both groups -1 and -2;
    # at ℓ = 1 each can be counted in one only. Which one must not depend on which group the
    # backend listed first.
    pairs = {(-1,): [(p, p) for p in range(100, 120)], (-2,): [(p, p) for p in range(100, 120)]}
    swapped = {(-2,): pairs[(-2,)], (-1,): pairs[(-1,)]}
    assert carried_per_group(pairs, (1,), salt=5) == carried_per_group(swapped, (1,), salt=5)
