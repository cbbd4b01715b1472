"""What every backend does alike, on DuckDB and PostgreSQL: the values it returns, the tables it
lists, concurrent queries, and the errors and writes it refuses.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime
from decimal import Decimal

import psycopg
import pytest

from dpproxy.backends import Backend, BackendError
from dpproxy.backends.duckdb import DuckDBBackend
from dpproxy.backends.postgres import PostgresBackend
from dpproxy.policy import ColumnType
from tests.backends.people import EXPECTED_TYPES, SETUP


@pytest.fixture(params=["duckdb", "postgres"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "duckdb":
        opened: Backend = DuckDBBackend.from_statements(SETUP)
    else:
        pg_dsn = request.getfixturevalue("pg_dsn")
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for statement in SETUP:
                conn.execute(statement)
        opened = PostgresBackend(pg_dsn, max_size=5)
    with opened:
        yield opened


def test_run_returns_python_values(backend: Backend) -> None:
    rows = backend.run("SELECT id, small, name, born, score, big, active, seen FROM people ORDER BY id")
    assert rows[0] == (
        1,
        7,
        "ann",
        date(1980, 2, 29),
        Decimal("1234.50"),
        5000000000,
        True,
        datetime(2024, 1, 2, 3, 4, 5),
    )
    assert rows[2] == (3, None, None, None, None, None, None, None)
    assert isinstance(rows[0], tuple)
    assert [type(v) for v in rows[1][:7]] == [int, int, str, date, Decimal, int, bool]


def test_sums_of_integers_are_exact_ints_and_sums_of_numerics_exact_decimals(backend: Backend) -> None:
    [(big_sum, id_sum, rows, score_sum)] = backend.run(
        "SELECT sum(big), sum(id), count(*), sum(score) FROM people"
    )
    assert (big_sum, id_sum, rows) == (10000000001, 6, 3)
    assert type(big_sum) is int and type(id_sum) is int and type(rows) is int
    assert score_sum == Decimal("1234.75") and isinstance(score_sum, Decimal)


def test_timestamptz_values_are_aware_datetimes(backend: Backend) -> None:
    if isinstance(backend, DuckDBBackend):
        pytest.importorskip("pytz", reason="DuckDB needs pytz to return TIMESTAMPTZ values")
    [(moment,)] = backend.run("SELECT CAST('2024-01-01 10:00:00+02' AS timestamptz)")
    assert moment.utcoffset() is not None
    assert moment == datetime(2024, 1, 1, 8, 0, tzinfo=UTC)


def test_empty_result_is_an_empty_list(backend: Backend) -> None:
    assert backend.run("SELECT id FROM people WHERE id > 100") == []


def test_tables_lists_columns_in_order_with_normalised_types(backend: Backend) -> None:
    tables = backend.tables()
    assert set(tables) == {"people", "people_view"}
    people = tables["people"]
    assert [c.name for c in people] == [
        *("id", "small", "name", "born", "score", "big", "active", "weight", "height"),
        *("note", "seen", "seen_tz", "tags"),
    ]
    by_name = {c.name: c for c in people}
    for name, expected in EXPECTED_TYPES.items():
        assert by_name[name].type == expected, name
    note_type = by_name["note"].type
    assert note_type is not None and note_type.is_text
    score_sql_type = by_name["score"].sql_type.lower().replace(" ", "")
    assert score_sql_type in ("numeric(12,2)", "decimal(12,2)")
    assert [(c.name, c.type) for c in tables["people_view"]] == [
        ("id", ColumnType.INTEGER),
        ("name", ColumnType.VARCHAR),
    ]


def test_tables_of_another_schema(backend: Backend) -> None:
    notes = backend.tables("other")
    assert list(notes) == ["notes"]
    note_id, body = notes["notes"]
    assert (note_id.name, note_id.type) == ("note_id", ColumnType.BIGINT)
    assert body.name == "body" and body.type is not None and body.type.is_text
    assert backend.tables("no_such_schema") == {}


def test_concurrent_queries_from_many_threads(backend: Backend) -> None:
    threads = 20
    start = threading.Barrier(threads)

    def work(i: int) -> list[list[tuple]]:
        start.wait()
        return [
            backend.run(f"SELECT count(*), sum(id) + {i} FROM people WHERE id >= {k}") for k in range(1, 4)
        ]

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(work, range(threads)))
    for i, result in enumerate(results):
        assert result == [[(3, 6 + i)], [(2, 5 + i)], [(1, 3 + i)]]


def test_errors_are_backend_errors(backend: Backend) -> None:
    with pytest.raises(BackendError):
        backend.run("SELECT no_such_column FROM people")
    with pytest.raises(BackendError):
        backend.run("SELECT 1; SELECT 2")
    # The backend is still usable after failures.
    assert backend.run("SELECT count(*) FROM people") == [(3,)]


def test_writes_are_refused(backend: Backend) -> None:
    for statement in (
        "INSERT INTO people (id) VALUES (99)",
        "UPDATE people SET name = 'eve'",
        "DELETE FROM people",
        "CREATE TABLE evil (x integer)",
        "DROP TABLE people",
    ):
        with pytest.raises(BackendError):
            backend.run(statement)
    assert backend.run("SELECT count(*), count(*) FILTER (WHERE name = 'eve') FROM people") == [(3, 0)]
    assert "evil" not in backend.tables()
