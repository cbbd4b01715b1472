"""Canonical order: the order of released rows depends on released values only, never on the backend.

A backend returns groups in its hash-aggregate order, which depends on the whole table (groups never
released included); were it kept, the order of the answer would leak data, and LIMIT without ORDER BY
would choose which groups are shown by it. So released rows are sorted by group key (ascending, NULLs
last) before HAVING, a stable ORDER BY and OFFSET/LIMIT. The tests: any permutation of the backend's
rows gives the identical answer (noise made deterministic), and neighbouring databases (one group
more, released or not) give answers whose common groups appear in the same relative order (real
noise, real partition selection).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Sequence
from decimal import Decimal

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dpproxy.engine import Engine, Plan
from dpproxy.policy import parse_policy
from dpproxy.release import canonical_key, post_process
from dpproxy.sql.query import ComponentKind
from tests.release.stubs import NoNoise

POLICY = """
version: 1
defaults: {epsilon: 1.0, delta: 1.0e-6}
tables:
  t:
    privacy_unit: pid
    max_rows_per_unit: 2
    max_groups_per_unit: 3
    contribution_bounds: fixed  # the backend's rows are built for the fixed limits' layout
    columns:
      pid: {type: integer, summable: false}
      grp: {type: text}
      n: {type: integer, lower: 0, upper: 10}
      y: {type: numeric, lower: 0, upper: 100, scale: 2}
      d: {type: date}
      b: {type: boolean}
      pub: {type: text, public_values: [c, a, b]}
      flag: {type: boolean, public_values: [true, false]}
"""

ENGINE = Engine(parse_policy(POLICY), None)

SELECT = "SELECT grp, n, y, d, b, COUNT(*) AS c, AVG(y) AS a FROM t GROUP BY grp, n, y, d, b"
# Without and with ORDER BY (ties on b and on the counts: a stable sort must keep key order), LIMIT
# and OFFSET, HAVING.
QUERIES = [
    SELECT,
    SELECT + " LIMIT 3",
    SELECT + " LIMIT 4 OFFSET 2",
    SELECT + " ORDER BY b NULLS FIRST, c",
    SELECT + " ORDER BY a DESC LIMIT 3",
    # The k largest counts: the first k by their released values, as any ORDER BY … LIMIT.
    SELECT + " ORDER BY c DESC LIMIT 3",
    SELECT + " HAVING COUNT(*) > 3 ORDER BY c LIMIT 5",
    SELECT + " ORDER BY d DESC NULLS LAST, grp OFFSET 1",
]
PLANS = {sql: ENGINE.plan(sql, epsilon=1.0) for sql in QUERIES}


@dataclasses.dataclass(frozen=True)
class AtLeast:
    """Partition selection without noise: the groups with at least `threshold` units."""

    threshold: int

    def select(self, units: Sequence[int]) -> list[int]:
        return [i for i, u in enumerate(units) if u >= self.threshold]


def deterministic(plan: Plan) -> Plan:
    noise = dataclasses.replace(
        plan.noise, columns=tuple(NoNoise(c) for c in plan.noise.columns), selection=AtLeast(3)
    )
    return dataclasses.replace(plan, noise=noise)


# Keys of every kind, as a backend returns them (numeric as int or Decimal, dates as dates), and NULLs.
keys = st.tuples(
    st.one_of(st.none(), st.sampled_from(["", "A", "a", "b", "ab", "é", "Z"])),
    st.one_of(st.none(), st.integers(0, 10)),
    st.one_of(
        st.none(), st.integers(0, 3), st.sampled_from([Decimal("0.5"), Decimal("2.25"), Decimal("100")])
    ),
    st.one_of(st.none(), st.dates(dt.date(1999, 12, 30), dt.date(2000, 1, 3))),
    st.one_of(st.none(), st.booleans()),
)


def _same_key(key: tuple[object, ...]) -> tuple[object, ...]:
    """Keys equal as SQL values (1 and 1.00) are one group: what uniqueness is judged on."""
    return tuple(Decimal(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in key)


groups = st.lists(
    st.tuples(keys, st.integers(0, 6), st.integers(0, 6)),
    min_size=0,
    max_size=12,
    unique_by=lambda g: _same_key(g[0]),
)


def backend_rows(plan: Plan, drawn: list[tuple[tuple[object, ...], int, int]]) -> list[tuple[object, ...]]:
    """The main statement's rows for drawn groups (key, rows, units): components, then units."""
    rows = []
    for key, count, units in drawn:
        # Counts of rows and values; the centred sum of y: each value one grid step above the centre.
        assert {c.kind for c in plan.query.components} <= {
            ComponentKind.ROWS,
            ComponentKind.VALUES,
            ComponentKind.CENTRED_SUM,
        }
        rows.append((*key, *(count for _ in plan.query.components), units))
    return rows


@settings(max_examples=60, deadline=None)
@given(drawn=groups, order=st.randoms(use_true_random=False), which=st.sampled_from(QUERIES))
def test_the_release_is_the_same_for_every_order_of_the_backends_rows(drawn, order, which) -> None:
    plan = deterministic(PLANS[which])
    rows = backend_rows(plan, drawn)
    shuffled = list(rows)
    order.shuffle(shuffled)
    first = ENGINE.release(plan, [rows])
    again = ENGINE.release(plan, [shuffled])
    assert first.rows == again.rows
    assert [c.error95 for c in first.columns] == [c.error95 for c in again.columns]


def released_inputs(drawn):
    """post_process's inputs for drawn groups, as release_aggregates would give them (no noise)."""
    keys = [key for key, _count, _units in drawn]
    aggregates = [
        [count, None if count == 0 else Decimal(50) + Decimal(1) / count] for _key, count, _u in drawn
    ]
    return keys, aggregates


@settings(max_examples=60, deadline=None)
@given(drawn=groups, order=st.randoms(use_true_random=False), which=st.sampled_from(QUERIES))
def test_post_process_is_the_same_for_every_order_of_the_released_groups(drawn, order, which) -> None:
    query = PLANS[which].query
    key_types = [k.type for k in query.keys]
    aggregate_types = [a.result_type for a in query.aggregates]
    keys, aggregates = released_inputs(drawn)
    pairs = list(zip(keys, aggregates, strict=True))
    order.shuffle(pairs)
    expected = post_process(query.post_processing, key_types, aggregate_types, keys, aggregates)
    shuffled = post_process(
        query.post_processing, key_types, aggregate_types, [k for k, _ in pairs], [a for _, a in pairs]
    )
    assert shuffled == expected


def test_canonical_order_sorts_by_key_ascending_with_nulls_last() -> None:
    query = PLANS[SELECT].query
    keys = [
        (None, 1, 1, dt.date(2000, 1, 1), True),
        ("b", None, 1, dt.date(2000, 1, 1), True),
        ("b", 2, Decimal("0.5"), None, False),
        ("b", 2, Decimal("0.5"), dt.date(2000, 1, 2), None),
        ("b", 2, Decimal("0.5"), dt.date(2000, 1, 2), True),
        ("b", 2, Decimal("0.5"), dt.date(2000, 1, 2), False),
        ("a", 10, 3, dt.date(1999, 1, 1), False),
        ("a", 9, 3, dt.date(1999, 1, 1), False),
        ("B", 9, 3, dt.date(1999, 1, 1), False),
    ]
    rows = post_process(
        query.post_processing,
        [k.type for k in query.keys],
        [a.result_type for a in query.aggregates],
        keys,
        [[i, Decimal(i)] for i in range(len(keys))],
    )
    assert [row[:5] for row in rows] == [
        ("B", 9, Decimal(3), dt.date(1999, 1, 1), False),
        ("a", 9, Decimal(3), dt.date(1999, 1, 1), False),
        ("a", 10, Decimal(3), dt.date(1999, 1, 1), False),
        ("b", 2, Decimal("0.5"), dt.date(2000, 1, 2), False),
        ("b", 2, Decimal("0.5"), dt.date(2000, 1, 2), True),
        ("b", 2, Decimal("0.5"), dt.date(2000, 1, 2), None),
        ("b", 2, Decimal("0.5"), None, False),
        ("b", None, Decimal(1), dt.date(2000, 1, 1), True),
        (None, 1, Decimal(1), dt.date(2000, 1, 1), True),
    ]


def test_canonical_order_ties_of_order_by_keep_key_order_and_limit_takes_the_first_keys() -> None:
    keys = [
        ("c", 1, 1, None, True),
        ("a", 1, 1, None, True),
        ("b", 1, 1, None, False),
        ("d", 1, 1, None, None),
    ]
    counts = [[5, Decimal(1)], [7, Decimal(1)], [5, Decimal(1)], [5, Decimal(1)]]

    def run(sql: str) -> list[str]:
        query = ENGINE.plan(sql, epsilon=1.0).query
        types = ([k.type for k in query.keys], [a.result_type for a in query.aggregates])
        return [row[0] for row in post_process(query.post_processing, *types, keys, counts)]

    assert run(SELECT + " LIMIT 2") == ["a", "b"]
    assert run(SELECT + " ORDER BY c") == ["b", "c", "d", "a"]
    assert run(SELECT + " ORDER BY c DESC LIMIT 2") == ["a", "b"]
    assert run(SELECT + " ORDER BY b LIMIT 3 OFFSET 1") == ["a", "c", "d"]


def test_canonical_order_of_public_keys_ignores_the_order_values_are_declared_in() -> None:
    plan = deterministic(ENGINE.plan("SELECT pub, flag, COUNT(*) FROM t GROUP BY pub, flag", epsilon=1.0))
    result = ENGINE.release(plan, [[("b", True, 4, 4), ("c", False, 2, 2)]])
    assert [row[:2] for row in result.rows] == [
        ("a", False),
        ("a", True),
        ("b", False),
        ("b", True),
        ("c", False),
        ("c", True),
    ]
    assert [row[2] for row in result.rows] == [0, 0, 0, 4, 2, 0]


def test_canonical_key_is_total_and_never_compares_across_kinds() -> None:
    numbers = [Decimal("NaN"), None, Decimal("-1.5"), Decimal(2), Decimal("Infinity")]
    assert sorted(numbers, key=lambda v: canonical_key((v,)))[:3] == [
        Decimal("-1.5"),
        Decimal(2),
        Decimal("Infinity"),
    ]
    floats = sorted([math.nan, None, 1.0, -math.inf], key=lambda v: canonical_key((v,)))
    assert floats[:2] == [-math.inf, 1.0] and math.isnan(floats[2]) and floats[3] is None
    # Kinds one column never mixes after conversion still sort without a TypeError.
    mixed = [
        None,
        "1",
        1,
        dt.date(2000, 1, 1),
        True,
        dt.datetime(2000, 1, 1),
        dt.datetime(2000, 1, 1, tzinfo=dt.UTC),
    ]
    assert sorted(mixed, key=lambda v: canonical_key((v,)))[-1] is None


# --- neighbouring databases, with real noise ------------------------------------------------------

CROWD = 2000  # units in each common group: released for sure (the threshold is below 200)
# Orders that depend on keys only: two releases draw different noise, so an ORDER BY on noisy
# values may differ between them whatever the backend did.
NEIGHBOUR_QUERIES = [SELECT, SELECT + " LIMIT 3", SELECT + " ORDER BY b NULLS FIRST, d DESC LIMIT 4"]


@settings(max_examples=25, deadline=None)
@given(
    common=st.lists(keys, min_size=2, max_size=8, unique_by=_same_key),
    extra=keys,
    extra_units=st.sampled_from([1, CROWD]),
    orders=st.tuples(st.randoms(use_true_random=False), st.randoms(use_true_random=False)),
    which=st.sampled_from(NEIGHBOUR_QUERIES),
)
def test_canonical_order_of_common_groups_is_the_same_on_neighbouring_databases(
    common, extra, extra_units, orders, which
) -> None:
    """D and D' differ by one group (one unit alone in it: never released but with probability δ;
    or a crowd: released), and the backend returns each in an unrelated order. The groups both
    answers show appear in the same relative order."""
    plan = ENGINE.plan(which, epsilon=1.0)
    assume(_same_key(extra) not in {_same_key(k) for k in common})
    rows = backend_rows(plan, [(key, CROWD, CROWD) for key in common])
    neighbour = [*rows, *backend_rows(plan, [(extra, extra_units, extra_units)])]
    orders[0].shuffle(rows)
    orders[1].shuffle(neighbour)
    shown = [row[:5] for row in ENGINE.release(plan, [rows]).rows]
    shown_neighbour = [row[:5] for row in ENGINE.release(plan, [neighbour]).rows]
    both = set(shown) & set(shown_neighbour)
    assert [k for k in shown if k in both] == [k for k in shown_neighbour if k in both]
    if "LIMIT" not in which:
        assert len(shown) == len(common) and set(shown) <= set(shown_neighbour)


KEYS_POLICY = """
version: 1
defaults: {epsilon: 1.0, delta: 1.0e-6, max_epsilon: 1000}
analysts: {alice: {epsilon: 100000, delta: 0.5}}
tables:
  t:
    privacy_unit: pid
    max_groups_per_unit: 1
    max_rows_per_unit: 1
    columns:
      pid: {type: integer}
      z: {type: numeric, summable: false}
      f: {type: double precision, summable: false}
      x: {type: integer, lower: 0, upper: 100}
"""


def test_keys_past_28_digits_and_nan_keys_stay_their_own_groups(tmp_path) -> None:
    """canonical_value strips a numeric key's trailing zeros without rounding it to 28 digits (two
    keys that differ past them were one dictionary slot, and tied in every sort, so the backend's
    order showed), and every NaN double is one key (a NaN is found in a dict only by identity, so its
    group lost its quantile's histogram)."""
    import duckdb

    path = tmp_path / "keys.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE t (pid INTEGER, z DECIMAL(38, 30), f DOUBLE, x INTEGER)")
        rows = [
            (
                p,
                "1.000000000000000000000000000010" if p % 2 else "1.000000000000000000000000000020",
                p % 3,
                90,
            )
            for p in range(400)
        ]
        rows = [(p, z, math.nan if f == 0 else float(f), x if f else 10) for p, z, f, x in rows]
        con.executemany("INSERT INTO t VALUES (?, ?::DECIMAL(38, 30), ?, ?)", rows)
    engine = Engine.open(parse_policy(KEYS_POLICY), str(path), tmp_path / "ledger.sqlite")
    try:
        answer = engine.execute(
            "SELECT z, COUNT(*), MEDIAN(x) FROM t GROUP BY z", analyst="alice", epsilon=500
        )
        assert [r[0] for r in answer.rows] == [
            Decimal("1.00000000000000000000000000001"),
            Decimal("1.00000000000000000000000000002"),
        ]
        assert all(abs(r[1] - 200) < 5 and abs(r[2] - 90) <= 10 for r in answer.rows)
        answer = engine.execute(
            "SELECT f, COUNT(*), MEDIAN(x) FROM t GROUP BY f", analyst="alice", epsilon=500
        )
        nan = [r for r in answer.rows if isinstance(r[0], float) and math.isnan(r[0])]
        assert len(nan) == 1 and answer.rows[-1] is nan[0]  # one group, sorted last
        assert abs(nan[0][2] - 10) <= 10  # its own rows' median, not a draw from an empty histogram
    finally:
        engine.close()
