"""Issue 20 B4/B5/B8 through the wire, on both backends: now() at the transaction's start and in the
session's TimeZone, MIN/MAX of a date with a declared range (Django's `Max()`, dbt's freshness),
FILTER, and existence probes (Django's `.exists()`, Great Expectations' and connection tests'
`SELECT 1 FROM t LIMIT 1`), through psycopg."""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo

import psycopg
import pytest

from tests.wire.test_clients import Served
from tests.wire.test_probes import duck_served, pg_served, served, truth

__all__ = ["duck_served", "pg_served", "served", "truth"]


def _constants(conn: psycopg.Connection, sql: str) -> list[str]:
    """The constants the analysis folded into a statement, read from its EXPLAIN."""
    lines = [row[0] for row in conn.execute(f"EXPLAIN {sql}").fetchall()]
    text = next(line for line in lines if line.startswith("query:"))
    return re.findall(r"CAST\('([^']*)' AS (?:DATE|TIMESTAMPTZ)\)", text)


def test_now_is_the_transaction_start_in_the_session_time_zone(served: Served) -> None:
    sql = "SELECT COUNT(*) FROM visits WHERE visit_date > current_date - 30 AND visit_date <= now()"
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        conn.execute("SET TimeZone = 'Pacific/Kiritimati'")  # UTC+14: another date than UTC's most of the day
        today = dt.datetime.now(zoneinfo.ZoneInfo("Pacific/Kiritimati")).date()
        (since, now) = _constants(conn, sql)
        assert since == (today - dt.timedelta(days=30)).isoformat()
        with conn.transaction():
            first = _constants(conn, sql)
            assert _constants(conn, sql) == first  # one instant for the whole block
        assert _constants(conn, sql)[1] != first[1]  # a new transaction, a new instant
        assert now != first[1]


def test_max_of_a_date_needs_its_range_and_filter_is_answered(served: Served) -> None:
    before = served.spent()
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        # The demo policy declares no range for visit_date: the data owner is told what to add.
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
            conn.execute('SELECT MAX("visits"."visit_date") AS "visit_date__max" FROM "visits"')
        assert '"visit_date"' in str(caught.value) and "lower: 2000-01-01" in (
            caught.value.diag.message_hint or ""
        )
        assert served.spent() == before
        cur = conn.execute("SELECT COUNT(*) FILTER (WHERE cost > 100) AS costly, COUNT(*) FROM visits")
        assert [(d.name, d.type_code) for d in cur.description or ()] == [("costly", 20), ("count", 20)]
        ((costly, count),) = cur.fetchall()
        assert costly >= 0 and count >= 0
    assert served.spent() > before


@pytest.mark.parametrize(
    ("sql", "rows"),
    [
        ("SELECT 1 FROM public.patients LIMIT 1", [(1,)]),
        ('SELECT 1 AS "a" FROM "visits" WHERE "visits"."cost" > 10 LIMIT 1', [(1,)]),
        ("SELECT 1 FROM patients WHERE 1 = 0 LIMIT 1", []),
    ],
)
def test_existence_probes_are_free_and_data_independent(served: Served, sql: str, rows: list) -> None:
    before = served.spent()
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        for prepare in (False, True):
            assert conn.execute(sql, prepare=prepare).fetchall() == rows
        assert notices == []
    assert served.spent() == before
