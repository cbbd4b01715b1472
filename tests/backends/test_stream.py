"""`Backend.stream` on DuckDB and PostgreSQL: the rows of `run`, in batches, with the same refusals,
cancellation and time limit, and a connection freed as soon as the caller stops reading."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from dpproxy.backends import Backend, BackendError, Cancellation, QueryCancelled
from dpproxy.backends.duckdb import DuckDBBackend
from dpproxy.backends.postgres import PostgresBackend

SETUP = [
    "CREATE TABLE numbers AS SELECT i::INTEGER AS n, (i % 7)::NUMERIC(10, 0) AS k FROM generate_series(1, 2500) AS t(i)"
]
# Slow on both engines: a cross join far too large to finish within the tests' time limits.
SLOW = "SELECT count(*) FROM numbers a, numbers b, numbers c, numbers d"


def open_backend(kind: str, request: pytest.FixtureRequest, timeout_ms: int | None) -> Backend:
    if kind == "duckdb":
        return DuckDBBackend.from_statements(SETUP, statement_timeout_ms=timeout_ms)
    dsn = request.getfixturevalue("pg_dsn")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in SETUP:
            conn.execute(statement)
    # One pooled connection: a stream that kept it would starve every later query.
    return PostgresBackend(dsn, max_size=1, acquire_timeout_s=3, statement_timeout_ms=timeout_ms or 0)


@pytest.fixture(params=["duckdb", "postgres"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    with open_backend(request.param, request, 1_000) as opened:
        yield opened


def test_stream_yields_the_rows_of_run_in_batches(backend: Backend) -> None:
    sql = "SELECT n, k FROM numbers ORDER BY n"
    batches = list(backend.stream(sql, batch_rows=1000))
    assert [len(b) for b in batches] == [1000, 1000, 500]
    assert [row for batch in batches for row in batch] == backend.run(sql)
    assert batches[0][6] == (7, 0) and type(batches[0][6][1]) is int  # numeric(10, 0) as int, as run


def test_a_stream_closed_early_frees_its_connection(backend: Backend) -> None:
    for _ in range(3):  # a pool of one connection: each stream must give it back
        stream = backend.stream("SELECT n FROM numbers ORDER BY n", batch_rows=100)
        assert next(stream)[0] == (1,)
        stream.close()
    assert backend.run("SELECT count(*) FROM numbers") == [(2500,)]


def test_stream_runs_one_select_only(backend: Backend) -> None:
    with pytest.raises(BackendError):
        list(backend.stream("SELECT 1; SELECT 2"))
    assert backend.run("SELECT 1") == [(1,)]


def test_the_time_limit_counts_the_backends_work_not_the_readers(backend: Backend) -> None:
    batches = []
    for batch in backend.stream("SELECT n FROM numbers ORDER BY n", batch_rows=1000):
        batches.append(batch)
        time.sleep(0.6)  # 1.8 s of reading in all, over the 1 s limit
    assert sum(len(b) for b in batches) == 2500


def test_the_time_limit_stops_a_slow_stream(backend: Backend) -> None:
    began = time.monotonic()
    with pytest.raises(QueryCancelled) as caught:
        list(backend.stream(SLOW))
    assert caught.value.started and "time limit" in caught.value.reason
    assert time.monotonic() - began < 10


def test_a_cancel_stops_a_stream_between_batches_and_while_it_runs(backend: Backend) -> None:
    cancel = Cancellation()
    cancel.cancel()
    with pytest.raises(QueryCancelled) as caught:
        list(backend.stream("SELECT n FROM numbers", cancel=cancel))
    assert not caught.value.started

    cancel = Cancellation()
    stream = backend.stream("SELECT n FROM numbers ORDER BY n", cancel=cancel, batch_rows=100)
    assert len(next(stream)) == 100
    cancel.cancel()
    with pytest.raises(QueryCancelled) as caught:
        next(stream)
    assert caught.value.started

    cancel = Cancellation()
    threading.Timer(0.2, cancel.cancel).start()
    with pytest.raises(QueryCancelled) as caught:
        list(backend.stream(SLOW, cancel=cancel))
    assert caught.value.started and caught.value.reason == "user request"
    assert backend.run("SELECT count(*) FROM numbers") == [(2500,)]
