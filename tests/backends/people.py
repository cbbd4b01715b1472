"""The `people` test database, built the same on DuckDB and PostgreSQL, and its columns' types."""

from __future__ import annotations

from dpproxy.policy import ColumnType

# Valid on both engines. `notes` lives in another schema; `people_view` is a view.
SETUP = [
    """CREATE TABLE people (
        id integer PRIMARY KEY, small smallint, name varchar(20), born date, score numeric(12,2),
        big bigint, active boolean, weight real, height double precision, note text,
        seen timestamp, seen_tz timestamptz, tags integer[]
    )""",
    """INSERT INTO people VALUES
        (1, 7, 'ann', DATE '1980-02-29', 1234.50, 5000000000, true, 1.5, 2.25, 'a',
         TIMESTAMP '2024-01-02 03:04:05', NULL, NULL),
        (2, -3, 'bob', DATE '1999-12-31', 0.25, 5000000001, false, 2.5, 3.5, NULL, NULL, NULL, NULL),
        (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)""",
    "CREATE VIEW people_view AS SELECT id, name FROM people",
    "CREATE SCHEMA other",
    "CREATE TABLE other.notes (note_id bigint, body text)",
]


EXPECTED_TYPES = {
    "id": ColumnType.INTEGER,
    "small": ColumnType.SMALLINT,
    "name": ColumnType.VARCHAR,
    "born": ColumnType.DATE,
    "score": ColumnType.NUMERIC,
    "big": ColumnType.BIGINT,
    "active": ColumnType.BOOLEAN,
    "weight": ColumnType.REAL,
    "height": ColumnType.DOUBLE,
    "seen": ColumnType.TIMESTAMP,
    "seen_tz": ColumnType.TIMESTAMPTZ,
    "tags": None,
}
