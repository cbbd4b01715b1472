"""How the certificates read a neighbour on DuckDB (tests/certify.NeighbourReader): through a second
connection, optimizer off and statements prepared, D untouched; a read that fails unoptimized is
made again as users' DuckDB makes it, so an error only the optimizer avoids is never taken for one
a person decides."""

from __future__ import annotations

import duckdb
import pytest

from tests.certify import NeighbourReader, certification_duckdb, insert_rows, rows_without
from tests.sql.language import schema
from tests.sql.language.databases import Loaded

# A cast that fails on 'x' in a column nobody reads: DuckDB's optimizer drops it, unoptimized it runs.
PRUNED_CAST = "WITH a AS (SELECT CAST(s AS INTEGER) AS bad, pid FROM t) SELECT COUNT(*), SUM(pid) FROM a"


@pytest.fixture
def table() -> duckdb.DuckDBPyConnection:
    conn = certification_duckdb()
    conn.execute("CREATE TABLE t (pid INTEGER, s VARCHAR)")
    insert_rows(conn, "duckdb", "t", [(1, "1"), (2, "x"), (2, "2"), (3, None)])
    return conn


def test_a_neighbour_is_read_without_the_person_and_d_is_untouched(table) -> None:
    reader = NeighbourReader(table)
    delete = [("DELETE FROM t WHERE pid = ?", 2)]
    sql = "SELECT COUNT(*), SUM(pid) FROM t"
    assert rows_without(table, reader, delete, sql) == [(2, 4)]
    assert rows_without(table, reader, delete, sql) == [(2, 4)]  # prepared, executed again
    assert rows_without(table, reader, [("DELETE FROM t WHERE pid = ?", 1)], sql) == [(3, 7)]
    assert table.execute(sql).fetchall() == [(4, 8)]


def test_a_read_only_the_optimizer_can_make_is_made_optimized(table) -> None:
    reader = NeighbourReader(table)
    with pytest.raises(duckdb.ConversionException):
        reader.conn.execute(PRUNED_CAST).fetchall()  # unoptimized, the unused cast runs
    assert rows_without(table, reader, [("DELETE FROM t WHERE pid = ?", 3)], PRUNED_CAST) == [(3, 5)]
    # The optimizer is off again, and a statement that fails optimized too still fails.
    assert reader.conn.execute("SELECT current_setting('enable_optimizer')").fetchall() == [(False,)]
    with pytest.raises(duckdb.ConversionException):
        rows_without(
            table, reader, [("DELETE FROM t WHERE pid = ?", 3)], "SELECT SUM(CAST(s AS INTEGER)) FROM t"
        )


def test_the_language_databases_read_such_a_statement_on_every_neighbour() -> None:
    loaded = Loaded("duckdb", certification_duckdb())
    loaded.load(schema.adversarial(1))
    sql = (
        "WITH a AS (SELECT CAST(diagnosis AS INTEGER) AS bad, patient_id FROM patients) "
        "SELECT COUNT(*) FROM a WHERE patient_id IS NOT NULL"
    )
    with pytest.raises(duckdb.ConversionException):
        loaded.neighbours.conn.execute(sql).fetchall()  # type: ignore[union-attr]
    (total,) = loaded.run(sql)[0]
    for person in loaded.db.patient_ids:  # type: ignore[union-attr]
        (rows,) = loaded.conn.execute(
            "SELECT COUNT(*) FROM patients WHERE patient_id = ?", [person]
        ).fetchone()
        assert loaded.run(sql, person) == [(total - rows,)]
    assert (
        loaded.run("SELECT COUNT(*) FROM patients")
        == loaded.conn.execute("SELECT COUNT(*) FROM patients").fetchall()
    )
