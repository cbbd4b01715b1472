"""A streamed release (dpproxy.release.stream) gives the answer `Engine.release` gives, batch by batch.

The backend returns a streamed query's rows sorted in canonical key order; each batch is released on
its own (partition selection and noise are per group) and HAVING, OFFSET and LIMIT are counted over
the whole answer. The tests: with noise made deterministic, every split of the sorted rows into
batches releases exactly the rows, in the order, and the 95% figures of `Engine.release` (with a
LIMIT, those of the groups up to the row that met it, whatever the batches); rows out
of canonical order are refused rather than released; and which queries stream at all.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpproxy.engine import Engine
from dpproxy.engine.plan import answer_columns
from dpproxy.policy import parse_policy
from dpproxy.release import canonical_values
from dpproxy.release.stream import StreamedRelease, StreamOrderError, streamable
from tests.release.test_canonical_order import (
    ENGINE,
    PLANS,
    POLICY,
    QUERIES,
    SELECT,
    backend_rows,
    deterministic,
    groups,
)

STREAMED = [sql for sql in QUERIES if "ORDER BY" not in sql]


def canonical_rows(plan, rows):
    """The main statement's rows as the backend returns them for a streamed query: by key."""
    processor = StreamedRelease(plan.query, plan.noise).processor
    n, blank = len(plan.query.keys), [None] * processor.n_aggregates
    return sorted(
        rows, key=lambda row: processor.canonical(processor.released(canonical_values(row[:n]), blank))
    )


@settings(max_examples=60, deadline=None)
@given(drawn=groups, cuts=st.lists(st.integers(0, 12), max_size=4), which=st.sampled_from(STREAMED))
def test_every_split_into_batches_releases_what_the_whole_answer_releases(drawn, cuts, which) -> None:
    plan = deterministic(PLANS[which])
    rows = canonical_rows(plan, backend_rows(plan, drawn))
    whole = ENGINE.release(plan, [rows])
    bounds = sorted({0, len(rows), *(min(c, len(rows)) for c in cuts)})
    stream = StreamedRelease(plan.query, plan.noise)
    released = []
    for start, end in itertools.pairwise(bounds):
        released.extend(stream.release(rows[start:end]))
        if stream.done:
            break
    assert released == whole.rows
    if "LIMIT" not in which:
        assert answer_columns(plan, stream.errors()) == whole.columns
    # A LIMIT stops reading early: the figures, and the count of groups released, cover the released
    # groups up to the row that met it, whatever the batches (their ends depend on how many groups
    # the backend returned, hidden ones too, which no answer may tell): as from one batch.
    one = StreamedRelease(plan.query, plan.noise)
    one.release(rows)
    assert answer_columns(plan, stream.errors()) == answer_columns(plan, one.errors())
    assert stream.groups == one.groups


def test_rows_out_of_canonical_key_order_are_refused() -> None:
    plan = deterministic(PLANS[SELECT])
    drawn = [(("b", 1, 1, None, True), 5, 5), (("a", 1, 1, None, True), 5, 5)]
    rows = backend_rows(plan, drawn)  # "b" before "a"
    with pytest.raises(StreamOrderError):
        StreamedRelease(plan.query, plan.noise).release(rows)
    stream = StreamedRelease(plan.query, plan.noise)
    stream.release(rows[:1])
    with pytest.raises(StreamOrderError):  # across batches too
        stream.release(rows[1:])


def test_which_queries_stream() -> None:
    def streams(sql: str) -> bool:
        plan = ENGINE.plan(sql, epsilon=1.0)
        return streamable(plan.query, len(plan.statements))

    assert streams(SELECT)
    assert streams(SELECT + " HAVING COUNT(*) > 3 LIMIT 5")
    assert not streams(SELECT + " ORDER BY c")  # sorted on released values: held whole
    assert not streams(SELECT + " ORDER BY c DESC LIMIT 3")  # the k largest: sorted, held whole
    assert not streams("SELECT pub, COUNT(*) FROM t GROUP BY pub")  # public keys: zero-filled, all
    assert not streams("SELECT COUNT(*) FROM t")  # one row
    assert not streams("SELECT grp, MEDIAN(n) FROM t GROUP BY grp")  # a histogram statement
    assert not streams("SELECT grp, COUNT(DISTINCT n) FROM t GROUP BY grp")  # two statements
    # Bounds chosen per query: the choice needs every group's counts before any group is released.
    chosen = Engine(
        parse_policy(POLICY.replace("contribution_bounds: fixed", "contribution_bounds: chosen")), None
    )
    plan = chosen.plan(SELECT, epsilon=1.0)
    assert plan.chooses_bounds and not streamable(plan.query, len(plan.statements))
