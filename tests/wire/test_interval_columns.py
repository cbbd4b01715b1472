"""dp_interval_low/high and the hidden-groups notice over the wire, with psycopg, on DuckDB: what a
BI tool's driver sees — the interval columns' type OIDs from Describe before Bind (the extended
protocol) and from the answer, their values around the released ones, a refusal's SQLSTATE and
message, and the NOTICE of an answer partition selection left empty.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.wire.raw import SYNC, RawClient, describe, kinds, parse
from tests.wire.test_clients import Served, Truth, compute_truth, serving

INT4, INT8, NUMERIC, FLOAT8, VARCHAR = 23, 20, 1700, 701, 1043


@pytest.fixture(scope="module")
def served(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("intervals-duck")
    truth: Truth = compute_truth(demo_duckdb, directory)
    backend = directory / "demo.duckdb"  # a copy: DuckDB will not open one file twice in a process
    shutil.copyfile(demo_duckdb, backend)
    with serving(str(backend), "duckdb", directory, truth) as running:
        yield running


def test_interval_columns_over_the_simple_protocol(served: Served) -> None:
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        cursor = conn.execute(
            "SELECT diagnosis, COUNT(*), dp_interval_low(COUNT(*)), dp_interval_high(COUNT(*)), "
            "AVG(income) AS mean, dp_interval_low(mean), dp_interval_high(ROUND(mean, 2)) "
            "FROM patients GROUP BY diagnosis"
        )
        rows = cursor.fetchall()
        assert cursor.description is not None
        assert [(c.name, c.type_code) for c in cursor.description] == [
            ("diagnosis", VARCHAR),
            ("count", INT8),
            ("dp_interval_low", INT8),
            ("dp_interval_high", INT8),
            ("mean", NUMERIC),
            ("dp_interval_low", NUMERIC),
            ("dp_interval_high", NUMERIC),
        ]
    assert len(rows) == 6
    for _, count, low, high, mean, mean_low, mean_high in rows:
        assert 0 <= low <= count <= high
        assert high - count == count - low or low == 0  # the column's ±, clamped at 0
        assert 0 <= mean_low <= mean <= mean_high <= 500000


def row_types(body: bytes) -> list[tuple[str, int]]:
    """A RowDescription's column names and type OIDs."""
    (count,) = struct.unpack_from("!h", body)
    columns, pos = [], 2
    for _ in range(count):
        end = body.index(b"\x00", pos)
        (oid,) = struct.unpack_from("!I", body, end + 1 + 6)
        columns.append((body[pos:end].decode(), oid))
        pos = end + 1 + 18
    return columns


SQL = (
    "SELECT sex, dp_interval_low(COUNT(*)), dp_interval_high(AVG(age)::float8), "
    "dp_interval_low(COUNT(*)::int) FROM patients WHERE age > {} GROUP BY sex"
)
TYPES = [("sex", VARCHAR), ("dp_interval_low", INT8), ("dp_interval_high", FLOAT8), ("dp_interval_low", INT4)]


def test_describe_before_bind_gives_the_interval_types(served: Served) -> None:
    """Parse then Describe of the statement (no Bind yet: JDBC and BI tools ask so), at the
    protocol level (psycopg's libpq calls would block this process's own server)."""
    spent = served.spent()
    with RawClient(served.port) as raw:
        raw.login()
        raw.send(parse("s", SQL.format("$1")), describe("S", "s"), SYNC)
        messages = raw.read_until("Z")
    assert kinds(messages) == "1tTZ"
    assert row_types(dict(messages)["T"]) == TYPES
    assert served.spent() == spent  # described, not run


def test_psycopg_extended_protocol_gives_the_same_types(served: Served) -> None:
    spent = served.spent()
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        cursor = conn.execute(SQL.format("%s"), [30])
        assert [(c.name, c.type_code) for c in cursor.description or ()] == TYPES
        rows = cursor.fetchall()
    assert [r[0] for r in rows] == ["F", "M", "X"]
    for _, low, high_avg, low_int in rows:
        assert isinstance(low, int) and isinstance(high_avg, float) and low == low_int >= 0
        assert 0 <= high_avg <= 120  # within the column's bounds
    assert served.spent() > spent


def test_a_refusal_names_the_aggregate(served: Served) -> None:
    spent = served.spent()
    with (
        psycopg.connect(served.dsn(), autocommit=True) as conn,
        pytest.raises(psycopg.errors.FeatureNotSupported) as caught,
    ):
        conn.execute("SELECT sex, dp_interval_low(MAX(income)) FROM patients GROUP BY sex")
    assert caught.value.sqlstate == "0A000"
    assert caught.value.diag.message_primary is not None
    assert "dp_interval_low(MAX(income))" in caught.value.diag.message_primary
    assert "exponential mechanism" in caught.value.diag.message_primary
    assert served.spent() == spent


def test_an_empty_answer_notice_says_why(served: Served) -> None:
    notices: list[str] = []
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
        rows = conn.execute("SELECT zip, COUNT(*) FROM patients WHERE age > 119 GROUP BY zip").fetchall()
    assert rows == []
    [notice] = notices
    assert "persons are not shown" in notice
    assert "no group reached it, so the answer is empty" in notice
    assert "public_values in the policy" in notice
