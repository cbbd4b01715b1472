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


def test_batches_are_cut_by_released_rows_never_by_the_backends_batches(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A backend batch ends after a fixed number of groups, hidden ones included: sent at those
    ends, the pauses a client sees in a streamed answer counted the groups partition selection hid
    (one person alone in a group, D against D′; an adversarial review read it over the wire)."""
    import functools

    import duckdb

    import dpproxy.engine.streaming as streaming

    monkeypatch.setattr(streaming, "STREAM_BATCH_ROWS", 2)
    policy = parse_policy(
        "version: 1\ndefaults: {epsilon: 1.0, delta: 1.0e-6, replay: false}\n"
        "analysts: {alice: {epsilon: 1000, delta: 0.5}}\n"
        "tables:\n  t:\n    privacy_unit: pid\n    contribution_bounds: fixed\n"
        "    max_groups_per_unit: 1\n    max_rows_per_unit: 1\n"
        "    columns: {pid: {type: integer}, k: {type: varchar}}\n"
    )
    sizes = []
    for lone in (False, True):
        path = tmp_path / f"d{int(lone)}.duckdb"
        with duckdb.connect(str(path)) as con:
            con.execute("CREATE TABLE t (pid INTEGER, k VARCHAR)")
            rows = [(g * 100 + i, k) for g, k in enumerate("abcde") for i in range(60)]
            con.executemany("INSERT INTO t VALUES (?, ?)", rows + ([(9999, "c5")] if lone else []))
        engine = Engine.open(policy, str(path), tmp_path / f"l{int(lone)}.sqlite")
        backend = engine.backend_or_fail()
        backend.stream = functools.partial(backend.stream, batch_rows=2)  # type: ignore[method-assign]
        answer = engine.execute("SELECT k, COUNT(*) FROM t GROUP BY k", analyst="alice", stream=True)
        batches = [len(batch) for batch in answer]
        assert sum(batches) == 5  # the lone person's group is hidden
        sizes.append(batches)
        engine.close()
    assert sizes[0] == sizes[1] == [2, 2, 1]
