"""The private choice of a query's bounds (dpproxy.privacy.bounds): every score moves by at most the
sensitivity the noise is calibrated for when one person is added, for each rule (k for counts, k at
the persons' upper quartile for averages and spreads, k per public group, k at a tenth of the persons
for quantiles of a whole table, g at the median); which rule a query gets; and where the rules land.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpproxy.engine import Engine
from dpproxy.policy import parse_policy
from dpproxy.privacy.accounting import Accounting
from dpproxy.privacy.bounds import bound_choice, value_parts
from dpproxy.sql.bounds import keeps_rows_by_condition

CANDIDATES = (1, 2, 4, 8, 16, 32, 64, 100)


def counts_of(rows: list[int]) -> tuple[list[int], int]:
    """(above_j per candidate, persons) for persons with these numbers of rows."""
    return [sum(n > k for n in rows) for k in CANDIDATES], len(rows)


@given(rows=st.lists(st.integers(1, 120), max_size=40), added=st.integers(1, 120), quartile=st.booleans())
def test_adding_a_person_moves_every_score_by_at_most_the_calibrated_sensitivity(
    rows: list[int], added: int, quartile: bool
) -> None:
    choice = bound_choice("rows", CANDIDATES, 5, Accounting.PURE, 0.1, quartile)
    before = choice.scores(*counts_of(rows))
    after = choice.scores(*counts_of([*rows, added]))
    # The rule for counts is scored in tenths (at most a tenth of the persons above k): 10.
    sensitivity = 3 if quartile else 10
    assert max(abs(a - b) for a, b in zip(before, after, strict=True)) <= sensitivity
    # The noise is calibrated for it: the same ε as a rule of sensitivity 1 at that many times the scale.
    assert choice.epsilon <= 0.1 and abs(choice.scale - sensitivity * unit_scale()) <= 1e-9 * choice.scale


def unit_scale() -> float:
    """Report-noisy-max's scale at ε = 0.1 for scores of sensitivity 1 (the median of groups)."""
    return bound_choice("groups", CANDIDATES, 5, Accounting.PURE, 0.1).scale


@given(
    counts=st.lists(st.integers(1, 120), max_size=40),
    added=st.integers(1, 120),
    kind=st.sampled_from(["rows", "half", "lower", "groups"]),
)
def test_the_quantile_scores_move_by_at_most_their_calibrated_sensitivity(
    counts: list[int], added: int, kind: str
) -> None:
    """The median of groups (sensitivity 1), the upper quartile of rows (3), their median (1) and
    their lower quartile (3), in the interval form; the noise is calibrated for it."""
    choice = bound_choice("groups" if kind == "groups" else "rows", CANDIDATES, 5, Accounting.PURE, 0.1,
                          kind != "groups", half=kind in ("half", "lower"), lower=kind == "lower")  # fmt: skip
    before = choice.scores(*counts_of(counts))
    after = choice.scores(*counts_of([*counts, added]))
    sensitivity = 3 if kind in ("rows", "lower") else 1
    assert max(abs(a - b) for a, b in zip(before, after, strict=True)) <= sensitivity
    assert abs(choice.scale - sensitivity * unit_scale()) <= 1e-9 * choice.scale


def test_persons_who_share_one_count_get_that_count_not_a_uniform_pick() -> None:
    """One group per person (a plane flies for one airline), one row per person: every candidate at
    or above the shared count once scored alike, and the choice was uniform among them."""
    for kind, shared in (("groups", 1), ("rows", 1), ("groups", 4), ("rows", 16)):
        choice = bound_choice(kind, CANDIDATES, 5, Accounting.PURE, 0.25, kind == "rows")
        above, persons = counts_of([shared] * 3000)
        picked = [CANDIDATES[choice.select(above, persons)] for _ in range(100)]
        assert picked.count(shared) >= 99, (kind, shared, picked)


def test_the_quartile_rule_lands_at_the_upper_quartile_of_the_persons_rows() -> None:
    rng = random.Random(7)
    rows = [rng.randint(1, 12) for _ in range(1500)] + [rng.randint(13, 100) for _ in range(500)]
    above, persons = counts_of(rows)
    choice = bound_choice("rows", CANDIDATES, 5, Accounting.PURE, 1.0, True)
    picked = [CANDIDATES[choice.select(above, persons)] for _ in range(200)]
    # A quarter of 2,000 persons have more than 12 rows: 8 leaves 25.5% above, 16 about 21%.
    assert sum(k in (8, 16) for k in picked) >= 190
    counts = bound_choice("rows", CANDIDATES, 5, Accounting.PURE, 1.0)
    assert [CANDIDATES[counts.select(above, persons)] for _ in range(50)].count(100) >= 45


def test_the_lower_quartile_rule_lands_at_the_lower_quartile_of_the_persons_rows() -> None:
    """Averages per group: three quarters of the persons above k."""
    rng = random.Random(7)
    small, middle, large = (
        [rng.randint(a, b) for _ in range(n)] for a, b, n in ((1, 3, 450), (10, 14, 300), (40, 60, 1250))
    )
    above, persons = counts_of([*small, *middle, *large])
    choice = bound_choice("rows", CANDIDATES, 5, Accounting.PURE, 1.0, True, half=True, lower=True)
    picked = [CANDIDATES[choice.select(above, persons)] for _ in range(200)]
    # 1,550 of 2,000 persons have more than 8 rows, 1,250 more than 16: the lower quartile is in (8, 16].
    assert picked.count(16) >= 190
    # Half of them have more than 32 rows, none more than 64: the median rule picks 64.
    median = bound_choice("rows", CANDIDATES, 5, Accounting.PURE, 1.0, True, half=True)
    assert sum(CANDIDATES[median.select(above, persons)] == 64 for _ in range(50)) >= 45


POLICY = """
version: 1
defaults: {epsilon: 1.0, delta: 1.0e-6}
tables:
  t:
    privacy_unit: pid
    max_rows_per_unit: 100
    columns:
      pid: {type: integer}
      x: {type: integer, lower: 0, upper: 10}
      name: {type: text}
"""


def chosen(engine: Engine, sql: str, kind: str = "rows", means: bool | None = None):
    """The plan's choice of k ("rows") or g ("groups") for `sql`; of a query with two k's
    (sql.bounds.mean_components), its averages' (`means`) or its other aggregates'."""
    choices = engine.plan(sql).noise.choices
    (choice,) = [c for c in choices if c.kind == kind and (means is None or c.means == means)]
    return choice


def test_a_query_of_averages_and_spreads_only_aims_at_the_quartile() -> None:
    engine = Engine(parse_policy(POLICY), None)

    def rows_choice(sql: str):
        return chosen(engine, sql)

    assert rows_choice("SELECT AVG(x), STDDEV(x) FROM t").quartile
    assert not rows_choice("SELECT AVG(x), STDDEV(x) FROM t").half
    # Averages per group: three quarters of the persons above k, as each group's noise weighs more
    # beside its smaller sum than the whole query's does (the module docstring); quantiles per group,
    # which keep each person's first k rows instead of reweighting them, half.
    grouped = rows_choice("SELECT x, AVG(x) FROM t GROUP BY x")
    assert grouped.quartile and grouped.half and grouped.lower
    # An average beside a quantile has its own k (sql.bounds.mean_components), each by its own rule.
    assert chosen(engine, "SELECT x, AVG(x), MEDIAN(x) FROM t GROUP BY x", means=True).lower
    beside = chosen(engine, "SELECT x, AVG(x), MEDIAN(x) FROM t GROUP BY x", means=False)
    assert beside.half and not beside.lower
    assert rows_choice("SELECT name, AVG(x) FROM t GROUP BY name").half  # private keys
    # …but over at most 4 public groups each group's sum is a large share of the query's: the
    # whole table's aim, a quarter of the persons.
    few = rows_choice("SELECT x, AVG(x) FROM t WHERE x BETWEEN 1 AND 4 GROUP BY x")
    assert few.quartile and not few.half
    assert rows_choice("SELECT x, AVG(x) FROM t WHERE x BETWEEN 1 AND 5 GROUP BY x").half
    # …and so do shares per group, whose noise outweighs what reweighting moves.
    shares = rows_choice("SELECT x, AVG(CASE WHEN x > 5 THEN 1 ELSE 0 END) FROM t GROUP BY x")
    assert shares.quartile and shares.half
    assert not chosen(engine, "SELECT x, COUNT(*), AVG(x) FROM t GROUP BY x", means=False).quartile
    beside_a_count = chosen(engine, "SELECT x, COUNT(*), AVG(x) FROM t GROUP BY x", means=True)
    assert beside_a_count.quartile and beside_a_count.half and beside_a_count.lower
    assert (
        "aiming at three quarters of the persons"
        in engine.explain("SELECT x, AVG(x) FROM t GROUP BY x").render()
    )
    assert "aiming at half the persons" in engine.explain("SELECT x, MEDIAN(x) FROM t GROUP BY x").render()
    # A share (an argument in [0, 1]) keeps the rule for counts: its per-person values spread widely.
    assert not rows_choice("SELECT AVG(CASE WHEN x > 5 THEN 1 ELSE 0 END) FROM t").quartile
    assert not rows_choice("SELECT AVG(x), AVG(CASE WHEN x > 5 THEN 1 ELSE 0 END) FROM t").quartile
    assert not chosen(engine, "SELECT COUNT(*), AVG(x) FROM t", means=False).quartile
    assert chosen(engine, "SELECT COUNT(*), AVG(x) FROM t", means=True).decile  # as AVG(x) alone
    assert not rows_choice("SELECT SUM(x) FROM t").quartile
    assert "aiming at a quarter of the persons" in engine.explain("SELECT AVG(x), STDDEV(x) FROM t").render()
    # Spreads alone aim at half the persons (three quarters over many groups): their noise grows with
    # k times the squared range (engine/plan._spreads_only).
    assert "aiming at half the persons" in engine.explain("SELECT STDDEV(x) FROM t").render()
    spreads = rows_choice("SELECT x, VAR_POP(x), STDDEV(x) FROM t WHERE x BETWEEN 1 AND 4 GROUP BY x")
    assert spreads.quartile and spreads.half and not spreads.lower
    assert rows_choice("SELECT x, STDDEV(x) FROM t GROUP BY x").lower
    # AVGs alone over a whole table aim at a tenth (what reweighting moves is most of their error).
    assert not rows_choice("SELECT AVG(x) FROM t").quartile


def test_choices_take_about_a_sixth_of_the_budget() -> None:
    assert [value_parts(values, 1) for values in (1, 2, 3, 5, 6)] == [5, 3, 2, 1, 1]
    assert value_parts(1, 2) == 10  # k and g beside one value: a twelfth each
    assert value_parts(3, 2) == 4  # k and g beside an AVG's two values and partition selection


GROUPED = """
version: 1
defaults: {epsilon: 1.0, delta: 1.0e-6}
tables:
  t:
    privacy_unit: pid
    max_rows_per_unit: 100
    max_groups_per_unit: 20
    columns:
      pid: {type: integer}
      kind: {type: text, public_values: [a, b, c]}
      free: {type: text}
"""


def test_g_is_the_median_for_partition_selection_and_a_tenth_where_counts_of_persons_are_released() -> None:
    engine = Engine(parse_policy(GROUPED), None)

    def groups_choice(sql: str):
        return chosen(engine, sql, "groups")

    # Public keys: g sizes COUNT(DISTINCT pid)'s noise against what it drops, as k does for rows.
    public = groups_choice("SELECT kind, COUNT(DISTINCT pid) FROM t GROUP BY kind")
    assert not public.median and public.scores([0, 3, 9], 10) == [
        -public.target,
        3 - public.target,
        -abs(9 - public.target),
    ]
    # Partition selection's threshold grows with g: the median of the persons' group counts.
    selected = groups_choice("SELECT free, COUNT(*) FROM t GROUP BY free")
    # Candidates (b_0, b_1, b_2) with 9, 5 and 0 of 10 persons wider: the median lies in (b_0, b_1].
    assert selected.median and selected.scores([9, 5, 0], 10) == [-8, 0, 0]
    assert "about" in engine.explain("SELECT kind, COUNT(DISTINCT pid) FROM t GROUP BY kind").render()
    # Persons per group through partition selection: a person cut out of a group is missing from its
    # count, so g aims at a tenth of the persons with more groups (k's decile score, no floor):
    # candidates 1, 2, 4, 8, 16, 20 with 9, 5, 1, 0, 0, 0 of 10 persons wider: 4 leaves the tenth.
    counted = groups_choice("SELECT free, COUNT(DISTINCT pid) FROM t GROUP BY free")
    assert counted.decile and not counted.median and not counted.floor
    # Scored in tenths: noised for 10, as k's rules in tenths are, at the same budget.
    tenths = bound_choice("rows", counted.candidates, 5, Accounting.PURE, counted.epsilon, decile=True)
    assert counted.scale == pytest.approx(tenths.scale)
    assert counted.scale * counted.epsilon == pytest.approx(10 * selected.scale * selected.epsilon)
    assert counted.candidates == (1, 2, 4, 8, 16, 20)
    assert counted.scores([9, 5, 1, 0, 0, 0], 10) == [-40, -20, 0, -5, -10, -10]
    assert "aiming at a tenth of the persons with more groups" in (
        engine.explain("SELECT free, COUNT(DISTINCT pid) FROM t GROUP BY free").render()
    )
    # …and no k is chosen: no value it releases depends on a person's rows (sql.bounds.reads_rows),
    # so the whole budget goes to g, the counts and the selection.
    choices = engine.plan("SELECT free, COUNT(DISTINCT pid) FROM t GROUP BY free").noise.choices
    assert [c.kind for c in choices] == ["groups"]
    assert [c.kind for c in engine.plan("SELECT free, COUNT(*) FROM t GROUP BY free").noise.choices] == [
        "rows",
        "groups",
    ]


@given(
    rows=st.lists(st.integers(1, 120), max_size=40),
    added=st.integers(1, 120),
    target=st.integers(1, 60),
    decile=st.booleans(),
    resolved=st.booleans(),
    kind=st.sampled_from(["rows", "groups"]),
    floor=st.booleans(),
)
def test_the_rules_scored_in_tenths_move_every_score_by_at_most_ten(
    rows: list[int], added: int, target: int, decile: bool, resolved: bool, kind: str, floor: bool
) -> None:
    """Per public group −|10·above_j − min(10·m·G, persons)|, for quantiles of a whole table
    −|10·above_j − persons| (the aim raised to the choice's resolution, up to half the persons,
    when `resolved`), candidates below a quarter of the ceiling at a constant: adding a person moves
    a score by at most 10, and the noise is calibrated for 10."""
    # At ε = 1 a resolved aim is half the persons up to 15 of them, the resolution (7.8 persons
    # above) from 16 to 77, the tenth beyond: the lists here reach the first two.
    budget = 1.0 if resolved else 0.1
    # g is scored in tenths only at a tenth (`decile`, with its `median` off), k by either rule; the
    # floor off reaches the first candidates, whose "previous" count is every person.
    if kind == "groups" and not decile:
        return
    choice = bound_choice(kind, CANDIDATES, target, Accounting.PURE, budget, capped=not decile, decile=decile,
                          resolved=resolved and kind == "rows", median=False, floor=floor)  # fmt: skip
    assert not (decile and resolved and kind == "rows") or choice.resolution == 78
    before = choice.scores(*counts_of(rows))
    after = choice.scores(*counts_of([*rows, added]))
    assert max(abs(a - b) for a, b in zip(before, after, strict=True)) <= 10
    unit = unit_scale() * 0.1 / budget
    assert choice.epsilon <= budget and abs(choice.scale - 10 * unit) <= 1e-9 * choice.scale


def test_the_rule_per_public_group_stays_within_a_tenth_of_the_persons_and_a_quarter_of_the_ceiling() -> None:
    rng = random.Random(11)
    # 2,000 persons, rows spread from 1 to 100: 20 above 98, about 200 above 90, 720 above 64.
    rows = [rng.randint(1, 100) for _ in range(2000)]
    above, persons = counts_of(rows)

    def picks(target: int) -> list[int]:
        choice = bound_choice("rows", CANDIDATES, target, Accounting.PURE, 1.0, capped=True)
        return [CANDIDATES[choice.select(above, persons)] for _ in range(100)]

    # About 100 persons above: k = 100 leaves none, 64 leaves 720 (more than a tenth): 100.
    assert picks(100).count(100) >= 95
    # 700 persons aimed at: 64 has about as many above but more than a tenth of the persons: 100.
    assert picks(700).count(100) >= 95
    # With fewer heavy persons a lower bound is reached, but never one below 100 / 4.
    light = [rng.randint(1, 20) for _ in range(1900)] + [rng.randint(21, 100) for _ in range(100)]
    above, persons = counts_of(light)
    choice = bound_choice("rows", CANDIDATES, 2000, Accounting.PURE, 1.0, capped=True)
    picked = [CANDIDATES[choice.select(above, persons)] for _ in range(100)]
    assert picked.count(32) >= 95, picked  # 16 is below a quarter of 100 however many it leaves above
    # Under a WHERE the ceiling does not say how many rows a person has in the query: no floor.
    # A tenth of the persons with 17 to 20 rows, the others 1 to 16; the aim at 2000 persons above
    # capped at a tenth of them.
    few = [rng.randint(1, 16) for _ in range(1800)] + [rng.randint(17, 20) for _ in range(200)]
    above, persons = counts_of(few)
    floored, unfloored = (
        bound_choice("rows", CANDIDATES, 2000, Accounting.PURE, 1.0, capped=True, floor=floor)
        for floor in (True, False)
    )
    assert {CANDIDATES[floored.select(above, persons)] for _ in range(100)} <= {32, 64, 100}
    # 16 leaves the tenth above, 8 more than half of them, 32 none: 16.
    assert [CANDIDATES[unfloored.select(above, persons)] for _ in range(100)].count(16) >= 95


def test_counts_over_public_keys_aim_at_m_persons_above_per_group() -> None:
    engine = Engine(parse_policy(POLICY), None)

    def rows_choice(sql: str):
        return chosen(engine, sql)

    whole = rows_choice("SELECT COUNT(*) FROM t")
    per_x = rows_choice("SELECT x, COUNT(*) FROM t GROUP BY x")  # 11 public keys
    # Every rule for counts leaves at most a tenth of the persons above k; m per group with public keys.
    assert whole.capped and not whole.per_group and not whole.floor and per_x.per_group
    # The same share of ε, so the same m: m per group for each of the 11 groups.
    assert abs(per_x.target - 11 * whole.target) <= 11
    narrowed = rows_choice("SELECT x, SUM(x) FROM t WHERE x BETWEEN 1 AND 3 GROUP BY x")
    assert narrowed.capped and abs(narrowed.target - 3 * whole.target) <= 3
    # The floor at a quarter of the ceiling holds where the query reads every row of the table.
    assert per_x.floor and not narrowed.floor
    assert (
        "so many per public group released" in engine.explain("SELECT x, COUNT(*) FROM t GROUP BY x").render()
    )


def test_the_rule_for_quantiles_of_a_whole_table_aims_at_a_tenth_of_the_persons() -> None:
    rng = random.Random(12)
    # 2,000 persons, a tenth of them heavy (33 to 100 rows), the others 1 to 32: k = 32 leaves
    # the tenth above, whatever m is (the target is not read).
    rows = [rng.randint(1, 32) for _ in range(1800)] + [rng.randint(33, 100) for _ in range(200)]
    above, persons = counts_of(rows)
    for target in (1, 5, 5000):
        choice = bound_choice("rows", CANDIDATES, target, Accounting.PURE, 1.0, decile=True)
        picked = [CANDIDATES[choice.select(above, persons)] for _ in range(100)]
        assert picked.count(32) >= 95, picked
    # Light persons all: never below a quarter of the ceiling (100 / 4), however few are above (the
    # candidates from 32 up then tie: none leaves anyone above).
    light = [rng.randint(1, 4) for _ in range(2000)]
    choice = bound_choice("rows", CANDIDATES, 5, Accounting.PURE, 1.0, decile=True)
    assert all(CANDIDATES[choice.select(*counts_of(light))] >= 32 for _ in range(100))


def test_with_fewer_persons_than_the_choice_tells_apart_k_aims_at_its_resolution_up_to_half() -> None:
    """A tenth of 300 persons is 30, fewer than the choice at ε = 0.1 tells apart: the resolved rule
    aims at that many persons above (at most half of them); with 20,000 persons it is the tenth."""
    rng = random.Random(13)
    plain, resolved = (
        bound_choice("rows", CANDIDATES, 5, Accounting.PURE, 0.1, decile=True, floor=False, resolved=r)
        for r in (False, True)
    )
    assert resolved.resolved and not plain.resolved
    # ceil(2 · scale · ln(7 rivals)), in tenths of a person: a constant of the noise and candidates.
    assert resolved.resolution == math.ceil(2 * resolved.scale * math.log(len(CANDIDATES) - 1))
    # 300 persons: a tenth have 65 to 100 rows, a further 30% 17 to 64, the rest 1 to 16.
    rows = [rng.randint(65, 100) for _ in range(30)] + [rng.randint(17, 64) for _ in range(90)]
    rows += [rng.randint(1, 16) for _ in range(180)]
    above, persons = counts_of(rows)

    def best(choice) -> int:
        scores = choice.scores(above, persons)
        return CANDIDATES[scores.index(max(scores))]

    # In tenths of a person: the tenth (300) is below the resolution (about 78 persons), which is
    # below half the persons (1,500).
    assert persons < resolved.resolution < 5 * persons
    assert best(plain) == 64  # 30 persons above 64: the tenth
    # The aim is the resolution: the candidate leaving nearest that many persons above.
    nearest = min(CANDIDATES, key=lambda k: abs(10 * sum(n > k for n in rows) - resolved.resolution))
    assert best(resolved) == nearest < 64
    # 100 persons, 1 to 100 rows each: the resolution is more than half of them, so half (50 above).
    few = list(range(1, 101))
    scores = resolved.scores(*counts_of(few))
    assert CANDIDATES[scores.index(max(scores))] == 64  # 36 above 64 and 68 above 32: 64 is nearer 50
    # Many persons: a tenth is more than the resolution, and the scores are the plain rule's.
    many = [rng.randint(1, 100) for _ in range(20_000)]
    assert resolved.scores(*counts_of(many)) == plain.scores(*counts_of(many))


def test_quantiles_and_averages_of_a_whole_table_and_private_groups_aim_at_a_tenth_of_the_persons() -> None:
    engine = Engine(parse_policy(POLICY), None)

    def rows_choice(sql: str):
        return chosen(engine, sql)

    assert rows_choice("SELECT MEDIAN(x) FROM t").decile
    assert rows_choice("SELECT MEDIAN(x), percentile_cont(0.9) WITHIN GROUP (ORDER BY x) FROM t").decile
    assert rows_choice("SELECT MEDIAN(x) FROM t WHERE x > 2").decile
    # So do AVGs alone over a whole table (none of a share, no spread): engine.plan._whole_table_averages.
    assert rows_choice("SELECT AVG(x) FROM t").decile
    assert rows_choice("SELECT AVG(x), AVG(x + 1) FROM t WHERE x > 2").decile
    assert not rows_choice("SELECT AVG(x), STDDEV(x) FROM t").decile
    assert not rows_choice("SELECT AVG(CASE WHEN x > 5 THEN 1 ELSE 0 END) FROM t").decile
    assert not rows_choice("SELECT x, AVG(x) FROM t GROUP BY x").decile
    assert "aiming at a tenth of the persons (k at least a quarter of the ceiling)" in (
        engine.explain("SELECT AVG(x) FROM t").render()
    )
    # A private key (partition selection) releases a number of groups not known before the data is
    # read: a tenth of the persons, whatever the aggregates but averages and spreads, until
    # selection has released its groups (after_selection: the next test).
    assert rows_choice("SELECT name, COUNT(*) FROM t GROUP BY name").decile
    assert rows_choice("SELECT name, COUNT(*) AS n FROM t GROUP BY name ORDER BY n DESC LIMIT 3").decile
    assert rows_choice("SELECT name, SUM(x), MEDIAN(x) FROM t GROUP BY name").decile
    assert not rows_choice("SELECT name, AVG(x) FROM t GROUP BY name").decile
    # Per group, the persons' median rows (as averages); beside a count or an average, their rules.
    assert not rows_choice("SELECT x, MEDIAN(x) FROM t GROUP BY x").decile
    assert not rows_choice("SELECT name, MEDIAN(x) FROM t GROUP BY name").decile
    assert not rows_choice("SELECT MEDIAN(x), COUNT(*) FROM t").decile
    # A share over a whole table keeps the counts' rule (at twice m): beside a count, one choice.
    assert not chosen(engine, "SELECT COUNT(*), AVG(CASE WHEN x > 5 THEN 1 ELSE 0 END) FROM t").quartile
    # Both families aim at a tenth there: one choice, not two paid for one aim.
    assert chosen(engine, "SELECT MEDIAN(x), AVG(x) FROM t").decile
    # An AVG beside COUNT(DISTINCT unit) (bounded by g, not k) aims as an AVG alone.
    assert chosen(engine, "SELECT COUNT(DISTINCT pid), AVG(x) FROM t").decile
    assert not rows_choice("SELECT COUNT(*) FROM t").decile
    # Without a GROUP BY the tenth gives way to what the choice tells apart (a small table, a WHERE).
    assert rows_choice("SELECT AVG(x) FROM t WHERE x > 2").resolved
    assert rows_choice("SELECT MEDIAN(x) FROM t").resolved
    assert not rows_choice("SELECT name, COUNT(*) FROM t GROUP BY name").resolved
    assert "persons where a tenth is fewer (about what the choice's noise moves it by), at most half" in (
        engine.explain("SELECT AVG(x) FROM t WHERE x > 2").render()
    )
    assert "aiming at a tenth of the persons (k at least a quarter of the ceiling)" in (
        engine.explain("SELECT MEDIAN(x) FROM t").render()
    )
    assert "aiming at a tenth of the persons (no floor under a WHERE or an aggregate's condition)" in (
        engine.explain("SELECT MEDIAN(x) FROM t WHERE x > 2").render()
    )


def test_the_notice_says_when_k_was_kept_at_a_quarter_of_the_ceiling() -> None:
    """A generous ceiling keeps k far above every person's rows where the rule has a floor: the
    notice says so, so that the analyst knows why (and that SET dpproxy.max_rows_per_unit can set it)."""
    from dpproxy.release.bounds import ChosenBounds

    assert bound_choice("rows", CANDIDATES, 5, Accounting.PURE, 1.0, capped=True).floored
    assert bound_choice("rows", CANDIDATES, 5, Accounting.PURE, 1.0, decile=True).floored
    assert not bound_choice("rows", CANDIDATES, 5, Accounting.PURE, 1.0, capped=True, floor=False).floored
    assert not bound_choice("rows", CANDIDATES, 5, Accounting.PURE, 1.0).floored  # the rule for counts
    assert not bound_choice("rows", (32, 64, 100), 5, Accounting.PURE, 1.0, capped=True).floored
    floored = ChosenBounds(0, 0, 32, 2, 100, 4, True, True, rows_floored=True).note()
    assert floored == (
        "contribution bounds of this query: at most 32 row(s) per person (chosen, not below a quarter of "
        "the ceiling without a WHERE; ceiling 100), counted in at most 2 group(s) (chosen; ceiling 4)"
    )
    assert "quarter" not in ChosenBounds(0, 0, 32, None, 100, 1, True, False).note()


def test_candidates_that_leave_no_one_above_do_not_tie_with_the_one_that_leaves_a_few() -> None:
    """The flights' counts per airline name: 294 planes above 256 rows, 2 above 512, none above 575,
    and an aim at about 112 persons above. |10·above − aim| alone scores 512 (2 above) and 1,000
    (none) 20 apart, a tie under the choice's noise, so k was 512 or 1,000 alike; the interval term
    sets 1,000 apart, since (512, 1000] lies wholly above the aim."""
    candidates = (64, 128, 256, 512, 1000)
    rows = [100] * 3000 + [200] * 700 + [300] * 294 + [575] * 2
    above, persons = [sum(n > k for n in rows) for k in candidates], len(rows)
    choice = bound_choice("rows", candidates, 112, Accounting.PURE, 1.0, capped=True)
    scores = choice.scores(above, persons)
    assert scores[3] - scores[4] >= 10 * 50  # 512 over 1,000 by more than 50 persons
    assert sum(candidates[choice.select(above, persons)] == 512 for _ in range(100)) >= 95


def test_with_fewer_persons_than_m_k_does_not_collapse_to_the_smallest_candidate() -> None:
    """The rule for counts aims at m persons above k, but never at more than a tenth of them: 14
    planes of 25 to 40 flights under a WHERE (m about 15) had every candidate leave fewer than m
    above, the smallest scored best, and k = 1 released 17 ± 8 for 342 flights (an accuracy audit)."""
    rows = [25 + i for i in range(14)]
    choice = bound_choice("rows", CANDIDATES, 15, Accounting.PURE, 0.1, floor=False)
    scores = choice.scores(*counts_of(rows))
    best = CANDIDATES[scores.index(max(scores))]
    assert best >= 32 and scores[0] < max(scores)


@pytest.mark.parametrize(
    ("sql", "condition"),
    [
        ("SELECT COUNT(*) FROM t", False),
        ("SELECT AVG(x) FROM t", False),
        ("SELECT SUM(x) FROM t", False),
        # A share counts every row (1.0 or 0.0), and a COUNT(*) beside a condition counts every row.
        ("SELECT AVG(CASE WHEN x > 5 THEN 1.0 ELSE 0.0 END) FROM t", False),
        ("SELECT COUNT(*), SUM(CASE WHEN x > 5 THEN 1 ELSE 0 END) FROM t", False),
        # An aggregate's own condition acts as a WHERE.
        ("SELECT COUNT(*) FILTER (WHERE x > 5) FROM t", True),
        ("SELECT COUNT(CASE WHEN x > 5 THEN 1 END) FROM t", True),
        ("SELECT SUM(CASE WHEN x > 5 THEN 1 ELSE 0 END) FROM t", True),
        ("SELECT SUM(x) FILTER (WHERE name = 'a') FROM t", True),
        ("SELECT AVG(x) FILTER (WHERE name = 'a') FROM t", True),
        ("SELECT AVG(CASE WHEN name IS NULL THEN NULL ELSE x END) FROM t", True),
        # An analyst's own guard is theirs, even when it looks like the clipping's below.
        ("SELECT AVG(CASE WHEN x IS NULL THEN NULL ELSE CASE WHEN x > 5 THEN x END END) FROM t", True),
        ("SELECT AVG(CASE WHEN name IS NULL THEN NULL ELSE GREATEST(x, 1) END) FROM t", True),
        # The value ranges' clipping passes a NULL through: it adds no condition (engine/clipping.py).
        ("SELECT AVG(CASE WHEN x IS NULL THEN NULL ELSE LEAST(GREATEST(x, 1), 9) END) FROM t", False),
        (
            "SELECT AVG(CASE WHEN (CASE WHEN name = 'a' THEN x END) IS NULL THEN NULL "
            "ELSE LEAST(GREATEST((CASE WHEN name = 'a' THEN x END), 1), 9) END) FROM t",
            True,
        ),
    ],
)
def test_an_aggregates_own_condition_drops_ks_floor_as_a_where_does(sql: str, condition: bool) -> None:
    """k's floor at a quarter of the ceiling speaks of all a person's rows: it holds without a WHERE
    unless an aggregate keeps rows by a condition of its own (sql/bounds.keeps_rows_by_condition);
    an AVG clipped to a range chosen per query keeps the floor its EXPLAIN promised (a review found
    the clipping's CASE dropped it)."""
    engine = Engine(parse_policy(POLICY), None)
    assert keeps_rows_by_condition(engine.analyze(sql)) is condition
    if sql.startswith("SELECT AVG(") and "1.0" not in sql:  # AVGs alone over a whole table: k's tenth
        assert chosen(engine, sql).floor is not condition


@given(
    rows=st.lists(st.integers(1, 120), max_size=40),
    added=st.integers(1, 120),
    released=st.integers(0, 30),
    floor=st.booleans(),
)
def test_k_over_keys_that_are_not_public_is_drawn_after_selection_at_m_per_released_group(
    rows: list[int], added: int, released: int, floor: bool
) -> None:
    """A count or sum per key that is not public chooses k once partition selection has released its
    groups (release.bounds.choose_bounds), by the public keys' rule for that many groups: about m
    persons above per released group, at most a tenth of the persons, with the same candidates,
    floor and noise as planned (so the same cost); each score still moves by at most 10."""
    planned = bound_choice(
        "rows", CANDIDATES, 7, Accounting.PURE, 0.1, decile=True, floor=floor, selected=True
    )
    assert planned.after_selection and planned.decile
    drawn = planned.for_released_groups(released)
    public = bound_choice(
        "rows", CANDIDATES, 7 * max(1, released), Accounting.PURE, 0.1, capped=True, floor=floor
    )
    assert not drawn.after_selection and not drawn.decile and drawn.per_group and drawn.capped
    assert (drawn.scale, drawn.epsilon, drawn.floor, drawn.target) == (
        planned.scale,
        planned.epsilon,
        floor,
        public.target,
    )
    before, after = drawn.scores(*counts_of(rows)), drawn.scores(*counts_of([*rows, added]))
    assert before == public.scores(*counts_of(rows))
    assert max(abs(a - b) for a, b in zip(before, after, strict=True)) <= 10


def test_which_choices_of_k_wait_for_partition_selection() -> None:
    engine = Engine(parse_policy(POLICY), None)
    assert chosen(engine, "SELECT name, COUNT(*) FROM t GROUP BY name").after_selection
    assert chosen(engine, "SELECT name, SUM(x) FROM t WHERE x > 2 GROUP BY name").after_selection
    assert chosen(
        engine, "SELECT name, COUNT(*) AS n FROM t GROUP BY name ORDER BY n DESC LIMIT 3"
    ).after_selection
    # Averages keep their own rule; beside a quantile, a count keeps the plan's tenth (unmeasured);
    # beside an average it has its own k, which waits (sql.bounds.mean_components); public keys and
    # whole tables have no selection to wait for.
    assert not chosen(engine, "SELECT name, AVG(x) FROM t GROUP BY name").after_selection
    assert not chosen(engine, "SELECT name, COUNT(*), MEDIAN(x) FROM t GROUP BY name").after_selection
    assert chosen(engine, "SELECT name, COUNT(*), MEDIAN(x) FROM t GROUP BY name").decile
    assert chosen(engine, "SELECT name, COUNT(*), AVG(x) FROM t GROUP BY name", means=False).after_selection
    assert not chosen(
        engine, "SELECT name, COUNT(*), AVG(x) FROM t GROUP BY name", means=True
    ).after_selection
    assert not chosen(engine, "SELECT x, COUNT(*) FROM t GROUP BY x").after_selection
    assert not chosen(engine, "SELECT COUNT(*) FROM t").after_selection
    assert not chosen(engine, "SELECT MEDIAN(x) FROM t").after_selection
    # Nothing else waits: g and the planned noise are the plan's.
    assert (
        not chosen(engine, "SELECT name, COUNT(*) FROM t GROUP BY name")
        .for_released_groups(4)
        .after_selection
    )
    assert "person(s) per group partition selection releases (drawn after it), at most a tenth" in (
        engine.explain("SELECT name, COUNT(*) FROM t GROUP BY name").render()
    )
