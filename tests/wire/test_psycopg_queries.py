"""psycopg 3 against the wire server (the demo data on DuckDB and on PostgreSQL): private answers
with their notices and charges, simple and extended queries, pipelines, binary results, cursors,
EXPLAIN, session settings, transactions and error recovery, and raw rows refused.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import psycopg
import pytest

from tests.wire.proxy import Proxy, notices_of

# --- psycopg: queries -------------------------------------------------------------------------------


def test_dp_count_answers_with_a_notice_and_charges_the_budget(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        notices = notices_of(conn)
        before = proxy.spent()
        (count,) = conn.execute("SELECT COUNT(*) FROM patients").fetchone()  # type: ignore[misc]
        assert isinstance(count, int) and 2500 < count < 3500  # 3000 patients, noised
        assert proxy.spent() == pytest.approx(before + 0.5)
        assert len(notices) == 1 and "spent ε=0.5" in notices[0] and "count ±" in notices[0]
        assert conn.info.parameter_status("server_version") == "15.0 (dpproxy 0.1)"
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_simple_query_protocol_runs_each_statement(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        notices = notices_of(conn)
        cur = psycopg.ClientCursor(conn)  # the simple query protocol: one Query message
        cur.execute(
            "SET application_name = 'wire tests'; SELECT COUNT(*) AS n FROM visits; "
            "SELECT zip, city FROM zip_info ORDER BY zip LIMIT 2"
        )
        assert cur.statusmessage == "SET" and cur.description is None
        assert cur.nextset()
        assert [d.name for d in cur.description] == ["n"] and cur.fetchone()[0] > 0  # type: ignore[index,union-attr]
        assert cur.nextset()
        assert len(cur.fetchall()) == 2 and cur.statusmessage == "SELECT 2"
        assert not cur.nextset()
        assert len(notices) == 1  # only the private query has a cost
        assert conn.info.parameter_status("application_name") == "wire tests"
        # A failing statement stops the rest of the string.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            cur.execute("SELECT COUNT(*) FROM visits; SELECT patient_id FROM patients; SELECT 1")


def test_prepared_statements_with_parameters(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        sql = "SELECT COUNT(*) FROM patients WHERE age > %s AND sex = %s"
        for age in (20, 40, 60):
            (count,) = conn.execute(sql, [age, "F"], prepare=True).fetchone()  # type: ignore[misc]
            assert isinstance(count, int)
        # A date parameter and a LIMIT parameter, inferred without types.
        rows = conn.execute(
            "SELECT department, COUNT(*) FROM visits WHERE visit_date >= %s GROUP BY department "
            "ORDER BY department LIMIT %s",
            [dt.date(2020, 1, 1), 3],
            prepare=True,
        ).fetchall()
        assert [r[0] for r in rows] == ["cardiology", "dermatology", "emergency"]
        # A date_trunc unit or a date_part field as a parameter (prepared before it is bound):
        # analysed with a unit, not with any text.
        for sql in (
            "SELECT date_trunc(%s, visit_date) AS m, COUNT(*) FROM visits GROUP BY 1 ORDER BY 1",
            "SELECT date_trunc(%s::varchar, visit_date) AS m, COUNT(*) FROM visits GROUP BY 1 ORDER BY 1",
        ):
            rows = conn.execute(sql, ["year"], prepare=True).fetchall()
            assert rows and all(m.month == 1 and m.day == 1 for m, _ in rows), sql
        rows = conn.execute(
            "SELECT date_part(%s::text, visit_date), COUNT(*) FROM visits GROUP BY 1", ["quarter"]
        ).fetchall()
        assert sorted(int(q) for q, _ in rows) == [1, 2, 3, 4]
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SELECT date_trunc(%s, visit_date), COUNT(*) FROM visits GROUP BY 1", ["fortnight"])
        # psycopg's IN list: `= ANY(%s)` with a Python list, of text or of integers; an empty list
        # admits no row, as PostgreSQL's empty array does.
        sql = "SELECT department, COUNT(*) FROM visits WHERE department = ANY(%s) GROUP BY 1 ORDER BY 1"
        rows = conn.execute(sql, [["cardiology", "oncology", "nowhere"]]).fetchall()
        assert [r[0] for r in rows] == ["cardiology", "oncology"]  # public values it admits
        (n,) = conn.execute(
            "SELECT COUNT(*) FROM visits WHERE duration_minutes = ANY(%s::int[])", [[10, 20, 30]]
        ).fetchone()  # type: ignore[misc]
        assert isinstance(n, int)
        (none,) = conn.execute("SELECT COUNT(*) FROM visits WHERE department = ANY(%s)", [[]]).fetchone()  # type: ignore[misc]
        assert abs(none) < 100  # no row admitted: a noisy count of nothing


def test_pipeline_mode_and_deallocate(duck_proxy: Proxy) -> None:
    with duck_proxy.connect(autocommit=True) as conn:
        with conn.pipeline():
            first = conn.execute("SELECT COUNT(*) FROM patients WHERE sex = %s", ["F"])
            second = conn.execute("SELECT zip FROM zip_info ORDER BY zip LIMIT %s", [3])
            third = conn.execute("SHOW dpproxy.epsilon")
        assert first.fetchone()[0] > 0 and len(second.fetchall()) == 3  # type: ignore[index]
        assert third.fetchone() == ("0.5",)
        conn.execute("SELECT COUNT(*) FROM visits WHERE cost > %s", [100], prepare=True)
        conn.execute("DEALLOCATE ALL")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            conn.execute("DEALLOCATE no_such_statement")


def test_binary_results_match_text_results(proxy: Proxy) -> None:
    sql = "SELECT zip, city, state, population FROM zip_info ORDER BY zip LIMIT 20"
    with proxy.connect(autocommit=True) as conn:
        text_rows = conn.execute(sql).fetchall()
        binary_rows = conn.cursor(binary=True).execute(sql).fetchall()
        assert binary_rows == text_rows and len(text_rows) == 20
        cur = conn.cursor(binary=True)
        cur.execute(
            "SELECT sex, smoker, COUNT(*), AVG(income), SUM(age) FROM patients GROUP BY sex, smoker "
            "ORDER BY sex, smoker"
        )
        rows = cur.fetchall()
        assert [(r[0], r[1]) for r in rows] == [(s, b) for s in "FMX" for b in (False, True)]
        # An AVG is NULL where its noisy count is below 1 (the few patients of sex X may give one).
        assert all(isinstance(r[2], int) and (r[3] is None or isinstance(r[3], Decimal)) for r in rows)
        assert sum(isinstance(r[3], Decimal) for r in rows) >= 4
        assert [d.type_code for d in cur.description] == [1043, 16, 20, 1700, 20]  # type: ignore[union-attr]


def test_server_side_cursor_fetches_in_pages(proxy: Proxy) -> None:
    with proxy.connect() as conn:
        notices = notices_of(conn)
        before = proxy.spent()
        with conn.cursor(name="departments") as cur:
            cur.execute("SELECT department, COUNT(*) FROM visits GROUP BY department ORDER BY department")
            first = cur.fetchmany(3)
            rest = cur.fetchall()
        conn.commit()
        assert [r[0] for r in first + rest] == sorted(
            [
                "cardiology",
                "dermatology",
                "emergency",
                "general",
                "neurology",
                "oncology",
                "orthopedics",
                "pediatrics",
            ]
        )
        assert proxy.spent() == pytest.approx(before + 0.5)  # run once, charged once
        assert len(notices) == 1
    # A holdable cursor outlives its transaction, in autocommit mode too.
    with proxy.connect(autocommit=True) as conn, conn.cursor(name="held", withhold=True) as cur:
        cur.execute("SELECT state, population FROM zip_info ORDER BY zip LIMIT 7")
        assert len(cur.fetchmany(5)) == 5 and len(cur.fetchall()) == 2


def test_declare_and_fetch_in_sql(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute("DECLARE c CURSOR FOR SELECT department, COUNT(*) FROM visits GROUP BY department")
        assert len(conn.execute("FETCH 5 FROM c").fetchall()) == 5
        conn.execute("MOVE 1 IN c")
        assert len(conn.execute("FETCH ALL FROM c").fetchall()) == 2
        assert conn.execute("FETCH NEXT FROM c").fetchall() == []
        conn.execute("CLOSE c")
        with pytest.raises(psycopg.errors.InvalidCursorName):
            conn.execute("FETCH 1 FROM c")
        conn.execute("ROLLBACK")
        # Outside a transaction block, only a holdable cursor may be declared.
        with pytest.raises(psycopg.errors.NoActiveSqlTransaction):
            conn.execute("DECLARE d CURSOR FOR SELECT COUNT(*) FROM patients")


def test_explain_shows_the_plan_and_costs_nothing(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        before = proxy.spent()
        cur = conn.execute("EXPLAIN SELECT AVG(income) FROM patients")
        assert [d.name for d in cur.description] == ["QUERY PLAN"]  # type: ignore[union-attr]
        text = "\n".join(r[0] for r in cur.fetchall())
        assert "cost: ε=0.5" in text
        assert proxy.spent() == before


# --- psycopg: session settings and transactions ------------------------------------------------------


def test_set_and_show_dpproxy_settings(duck_proxy: Proxy) -> None:
    with duck_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.5",)
        conn.execute("SET dpproxy.epsilon = 0.2")
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.2",)
        notices = notices_of(conn)
        before = duck_proxy.spent()
        conn.execute("SELECT COUNT(*) FROM patients")
        assert duck_proxy.spent() == pytest.approx(before + 0.2)
        assert "spent ε=0.2" in notices[0]
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            conn.execute("SET dpproxy.epsilon = 5")
        assert "outside the range the policy allows" in str(caught.value)
        for text, hint in (("lots", "write a number such as 0.2"), ("infinity", None)):
            with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
                conn.execute(f"SET dpproxy.epsilon = '{text}'")
            assert (
                caught.value.diag.message_primary
                == f'invalid value for parameter "dpproxy.epsilon": "{text}"'
            )
            assert caught.value.diag.message_hint == hint
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.2",)
        conn.execute("RESET dpproxy.epsilon")
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.5",)
        cur = conn.execute("SHOW dpproxy.budget")
        assert [d.name for d in cur.description] == [  # type: ignore[union-attr]
            "epsilon_spent",
            "epsilon_remaining",
            "delta_spent",
            "delta_remaining",
            "budget",
        ]
        spent, remaining, _, _, which = cur.fetchone()  # type: ignore[misc]
        assert which == "analyst" and cur.fetchone() is None  # no data-set budget in this policy
        assert float(spent) == pytest.approx(duck_proxy.spent())
        assert float(spent) + float(remaining) == pytest.approx(1000.0)
        with pytest.raises(psycopg.errors.CantChangeRuntimeParam):
            conn.execute("SET dpproxy.budget = 100")
        with pytest.raises(psycopg.errors.UndefinedObject):
            conn.execute("SHOW dpproxy.nothing")


def test_a_session_can_fix_the_contribution_bounds(duck_proxy: Proxy) -> None:
    """SET dpproxy.max_rows_per_unit / max_groups_per_unit fix the bounds each query would choose
    (within the policy's ceilings, capped at them), spending nothing on the choice; RESET and
    `chosen` go back to choosing."""
    with duck_proxy.connect(autocommit=True) as conn:
        notices = notices_of(conn)
        assert conn.execute("SHOW dpproxy.max_rows_per_unit").fetchone() == ("chosen",)
        conn.execute("SELECT department, COUNT(*) FROM visits GROUP BY department")
        assert "contribution bounds of this query: at most" in notices[-1] and "(chosen" in notices[-1]
        conn.execute("SET dpproxy.max_rows_per_unit = 2")
        conn.execute("SET dpproxy.max_groups_per_unit = 1000")  # capped at the ceiling when used
        assert conn.execute("SHOW dpproxy.max_rows_per_unit").fetchone() == ("2",)
        conn.execute(
            "SELECT department, COUNT(*), COUNT(DISTINCT patient_id) FROM visits GROUP BY department"
        )
        assert (
            "at most 2 row(s) per person (set; ceiling 5), counted in at most 3 group(s) (set: the ceiling)"
            in notices[-1]
        )
        text = "\n".join(r[0] for r in conn.execute("EXPLAIN SELECT COUNT(*) FROM visits").fetchall())
        assert "chosen among" not in text  # nothing to choose: no ε spent on it
        for bad in ("0", "-1", "many", "2.5"):
            with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
                conn.execute(f"SET dpproxy.max_rows_per_unit = '{bad}'")
            assert 'invalid value for parameter "dpproxy.max_rows_per_unit"' in str(caught.value)
        conn.execute("SET dpproxy.max_rows_per_unit = chosen")
        conn.execute("RESET dpproxy.max_groups_per_unit")
        assert conn.execute("SHOW dpproxy.max_groups_per_unit").fetchone() == ("chosen",)


def test_a_session_can_ask_what_bounding_removed(duck_proxy: Proxy) -> None:
    """SET dpproxy.estimate_left_out = on: each query with bounds chosen per query also says about
    how many rows' worth its k took (a noisy estimate, in its ε); EXPLAIN lists it; RESET stops it."""
    with duck_proxy.connect(autocommit=True) as conn:
        notices = notices_of(conn)
        sql = "SELECT department, COUNT(*) FROM visits WHERE cost > 0 GROUP BY department"
        assert conn.execute("SHOW dpproxy.estimate_left_out").fetchone() == ("off",)
        conn.execute(sql)
        assert not any("what bounding removed" in n for n in notices)
        conn.execute("SET dpproxy.estimate_left_out = on")
        assert conn.execute("SHOW dpproxy.estimate_left_out").fetchone() == ("on",)
        spent = duck_proxy.spent()
        conn.execute(sql)
        assert duck_proxy.spent() - spent == pytest.approx(0.5)  # the query's ε, as without it
        assert "; what bounding removed" in notices[-1], notices
        text = "\n".join(r[0] for r in conn.execute(f"EXPLAIN {sql}").fetchall())
        assert "what bounding removed: the rows' worth k takes below the ceiling" in text
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            conn.execute("SET dpproxy.estimate_left_out = 'sometimes'")
        assert caught.value.diag.message_primary == (
            'invalid value for parameter "dpproxy.estimate_left_out": "sometimes"'
        )
        assert caught.value.diag.message_hint == "write on or off"
        conn.execute("RESET dpproxy.estimate_left_out")
        notices.clear()
        conn.execute(sql)
        assert not any("what bounding removed" in n for n in notices)
    # A BI tool sets it in its connection URL, as a startup option.
    with duck_proxy.connect(autocommit=True, options="-c dpproxy.estimate_left_out=on") as conn:
        notices = notices_of(conn)
        assert conn.execute("SHOW dpproxy.estimate_left_out").fetchone() == ("on",)
        conn.execute(sql)
        assert "; what bounding removed" in notices[-1], notices


def test_session_settings_are_answered_locally(duck_proxy: Proxy) -> None:
    with duck_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SHOW server_version").fetchone() == ("15.0 (dpproxy 0.1)",)
        assert conn.execute("SHOW DateStyle").fetchone() == ("ISO, MDY",)
        assert conn.execute("SHOW standard_conforming_strings").fetchone() == ("on",)
        conn.execute("SET extra_float_digits = 3")
        conn.execute("SET TIME ZONE 'Europe/Paris'")
        assert conn.info.parameter_status("TimeZone") == "Europe/Paris"
        conn.execute("SET search_path TO public")
        assert conn.execute("SHOW search_path").fetchone() == ("public",)
        conn.execute("SET statement_timeout = 0")
        names = {row[0] for row in conn.execute("SHOW ALL").fetchall()}
        assert {"DateStyle", "TimeZone", "dpproxy.epsilon", "search_path"} <= names
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SET TIME ZONE 'Nowhere/Never'")
        with pytest.raises(psycopg.errors.CantChangeRuntimeParam):
            conn.execute("SET server_version = '9.6'")
        conn.execute("RESET ALL")
        assert conn.execute("SHOW TimeZone").fetchone() == ("UTC",)
        conn.execute("DISCARD ALL")


def test_transactions_and_error_recovery(duck_proxy: Proxy) -> None:
    with duck_proxy.connect() as conn:  # not autocommit: psycopg sends BEGIN
        conn.execute("SET application_name = 'before'")
        conn.commit()
        conn.execute("SET application_name = 'inside'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT age FROM patients")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute("SELECT COUNT(*) FROM patients")
        conn.rollback()
        # ROLLBACK undid the SET made in the failed transaction, as PostgreSQL does.
        assert conn.execute("SHOW application_name").fetchone() == ("before",)
        conn.execute("SAVEPOINT s1")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # not exposed
            conn.execute("SELECT COUNT(*) FROM no_such_table")
        conn.execute("ROLLBACK TO SAVEPOINT s1")
        assert conn.execute("SELECT COUNT(*) FROM visits").fetchone()[0] > 0  # type: ignore[index]
        conn.commit()
    with duck_proxy.connect(autocommit=True) as conn, conn.transaction():
        conn.execute("SET LOCAL application_name = 'local'")
        assert conn.execute("SHOW application_name").fetchone() == ("local",)


def test_raw_rows_of_a_protected_table_are_refused(proxy: Proxy) -> None:
    with proxy.connect(autocommit=True) as conn:
        before = proxy.spent()
        for sql in ("SELECT * FROM patients", "SELECT patient_id, income FROM patients WHERE age > 90"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
                conn.execute(sql)
            assert caught.value.sqlstate == "42501"
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM patients")
        assert proxy.spent() == before
        assert conn.execute("SELECT COUNT(*) FROM zip_info").fetchone()[0] == 2000  # type: ignore[index]


def test_catalog_queries_reach_the_catalog(duck_proxy: Proxy) -> None:
    with duck_proxy.connect(autocommit=True) as conn:
        (version,) = conn.execute("SELECT version()").fetchone()  # type: ignore[misc]
        assert version.startswith("PostgreSQL 15.0")
        assert conn.execute("SELECT 1 + 1").fetchone() == (2,)
