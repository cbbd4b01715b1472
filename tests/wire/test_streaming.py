"""Large private answers over the wire: streamed batch by batch, on DuckDB and PostgreSQL.

A GROUP BY over keys released by partition selection is released as the backend's rows arrive, in
canonical key order, and written to the client a batch at a time: RowDescription first, the DataRows,
then the notice (its 95% figures cover the whole answer) and "SELECT n" with the total. The
extended protocol streams an Execute for all rows and still pages an Execute with a row limit
(PortalSuspended); cursors keep working; a client that goes away mid-answer stops the backend query
and stays charged; free replay stores an answer only up to Engine.REPLAY_MAX_ROWS rows.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import psycopg
import pytest
import yaml

from tests.wire.proxy import DEMO_POLICY, Proxy, running_proxy
from tests.wire.raw import SYNC, RawClient, bind, cstr, data_row, execute, kinds, msg, parse

GROUPS = 20_000  # zips in `people`, 3 persons each
CROWD = 150_000  # zips in `crowd`: an answer larger than the socket buffers
EPSILON = 50.0  # per query: partition selection then keeps nearly every group of 3 persons

TABLE = {
    "privacy_unit": "person_id",
    "max_groups_per_unit": 1,
    "max_rows_per_unit": 1,
    "columns": {
        "person_id": {"type": "integer"},
        "zip": {"type": "varchar"},
        "amount": {"type": "integer", "lower": 0, "upper": 100},
    },
}


def setup_sql(table: str, groups: int) -> list[str]:
    return [
        f"CREATE TABLE {table} (person_id INTEGER PRIMARY KEY, zip VARCHAR, amount INTEGER)",
        f"INSERT INTO {table} SELECT i, 'z' || lpad(CAST(i % {groups} AS VARCHAR), 6, '0'), i % 101 "
        f"FROM generate_series(0, {3 * groups - 1}) AS t(i)",
    ]


def policy_file(path: Path) -> Path:
    policy = yaml.safe_load(DEMO_POLICY.read_text())
    policy["analysts"]["alice"].update({"epsilon": 1.0e6, "delta": 0.5})
    policy["defaults"].update({"max_epsilon": 100.0, "replay": True})
    policy["tables"] = {"people": TABLE, "crowd": TABLE}
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def duck_streaming(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    tmp = tmp_path_factory.mktemp("stream-duck")
    with duckdb.connect(str(tmp / "data.duckdb")) as conn:
        for statement in setup_sql("people", GROUPS) + setup_sql("crowd", CROWD):
            conn.execute(statement)
    with running_proxy(policy_file(tmp / "policy.yaml"), str(tmp / "data.duckdb"), tmp / "l.sqlite") as proxy:
        yield proxy


@pytest.fixture(scope="module")
def pg_streaming(pg_cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    from tests.pgcluster import create_database, drop_database

    tmp = tmp_path_factory.mktemp("stream-pg")
    name = create_database(pg_cluster, prefix="stream")
    dsn = pg_cluster.dsn(name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in setup_sql("people", GROUPS) + setup_sql("crowd", CROWD):
                conn.execute(statement)
            conn.execute("ANALYZE")
        with running_proxy(policy_file(tmp / "policy.yaml"), dsn, tmp / "l.sqlite") as proxy:
            proxy.backing_dsn = dsn  # type: ignore[attr-defined]
            yield proxy
    finally:
        drop_database(pg_cluster, name)


@pytest.fixture(params=["duckdb", "postgres"])
def proxy(request: pytest.FixtureRequest) -> Proxy:
    return request.getfixturevalue("duck_streaming" if request.param == "duckdb" else "pg_streaming")


def connect(proxy: Proxy, **kwargs: object) -> psycopg.Connection:
    conn = psycopg.connect(proxy.dsn(), **kwargs)  # type: ignore[arg-type]
    conn.execute(f"SET dpproxy.epsilon = {EPSILON}")
    conn.commit()
    return conn


def login(client: RawClient) -> None:
    client.login()
    client.send(msg("Q", cstr(f"SET dpproxy.epsilon = {EPSILON}")))
    client.read_until("Z")


def zips(rows: list[tuple]) -> list[str]:
    return [row[0] for row in rows]


def test_a_large_answer_is_sent_in_key_order_with_its_total_and_notice_last(proxy: Proxy) -> None:
    before = proxy.spent()
    with RawClient(proxy.port) as client:
        login(client)
        client.send(msg("Q", cstr("SELECT zip, COUNT(*) AS n, AVG(amount) AS a FROM people GROUP BY zip")))
        messages = client.read_until("Z")
    sequence = kinds(messages)
    rows = [data_row(body) for kind, body in messages if kind == "D"]
    # RowDescription first, every DataRow, then the notice, "SELECT n" with the total, ReadyForQuery.
    assert sequence == "T" + "D" * len(rows) + "NCZ"
    assert 0.95 * GROUPS < len(rows) <= GROUPS
    keys = [row[0] for row in rows]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)  # canonical order: by zip
    notice = messages[-3][1].decode(errors="replace")
    assert f"spent ε={EPSILON:g}" in notice and "n ±" in notice and "a ±" in notice
    assert messages[-2][1] == cstr(f"SELECT {len(rows)}")
    assert proxy.spent() == pytest.approx(before + EPSILON)


def test_psycopg_streams_fetches_and_limits(proxy: Proxy) -> None:
    with connect(proxy, autocommit=True) as conn:
        before = proxy.spent()
        streamed = list(conn.cursor().stream("SELECT zip, COUNT(*) FROM people GROUP BY zip"))
        assert zips(streamed) == sorted(zips(streamed)) and len(streamed) > 0.95 * GROUPS
        cur = conn.execute("SELECT zip, SUM(amount) AS s FROM people GROUP BY zip")
        fetched = cur.fetchall()
        assert cur.rowcount == len(fetched) > 0.95 * GROUPS
        assert zips(fetched) == sorted(zips(fetched))
        # LIMIT without ORDER BY: the first keys in order (the rest of the answer is never read).
        first = conn.execute("SELECT zip, COUNT(*) FROM people GROUP BY zip LIMIT 5 OFFSET 2").fetchall()
        assert len(first) == 5 and zips(first) == sorted(zips(first)) and zips(first)[0] <= "z000009"
        assert proxy.spent() == pytest.approx(before + 3 * EPSILON)


def test_an_execute_with_a_row_limit_still_pages_the_portal(proxy: Proxy) -> None:
    before = proxy.spent()
    with RawClient(proxy.port) as client:
        login(client)
        client.send(msg("Q", cstr("BEGIN")))
        client.read_until("Z")
        client.send(parse("", "SELECT zip, COUNT(*) AS c FROM people GROUP BY zip"), bind("p", ""))
        client.send(execute("p", 7000), SYNC)
        first = client.read_until("Z")
        assert kinds(first) == "12N" + "D" * 7000 + "sZ"  # the notice, a page, PortalSuspended
        keys = [data_row(body)[0] for kind, body in first if kind == "D"]
        while True:
            client.send(execute("p", 7000), SYNC)
            page = client.read_until("Z")
            keys += [data_row(body)[0] for kind, body in page if kind == "D"]
            if "C" in kinds(page):
                assert page[-2][1] == cstr(f"SELECT {len(keys)}")  # the count of the whole portal
                break
            assert kinds(page) == "D" * 7000 + "sZ"
    assert 0.95 * GROUPS < len(keys) <= GROUPS and keys == sorted(keys)
    assert proxy.spent() == pytest.approx(before + EPSILON)  # run (and charged) once


def test_a_server_side_cursor_pages_a_large_answer(proxy: Proxy) -> None:
    with connect(proxy) as conn, conn.cursor(name="zips") as cur:
        before = proxy.spent()
        cur.execute("SELECT zip, COUNT(*) AS total FROM people GROUP BY zip")
        first = cur.fetchmany(5000)
        rest = cur.fetchall()
        assert len(first) == 5000 and zips(first + rest) == sorted(zips(first + rest))
        assert proxy.spent() == pytest.approx(before + EPSILON)


def test_a_client_that_goes_away_mid_answer_stops_the_query_and_is_charged(proxy: Proxy) -> None:
    before = proxy.spent()
    with RawClient(proxy.port) as client:
        login(client)
        client.send(msg("Q", cstr("SELECT zip, COUNT(*) AS gone FROM crowd GROUP BY zip")))
        assert client.read()[0] == "T" and client.read()[0] == "D"
    deadline = time.monotonic() + 20
    while proxy.spent() < before + EPSILON and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proxy.spent() == pytest.approx(before + EPSILON)  # the statement was sent: charged
    if proxy.backend == "postgres":
        with psycopg.connect(proxy.backing_dsn, autocommit=True) as conn:  # type: ignore[attr-defined]
            while time.monotonic() < deadline:
                (left,) = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%gone%' AND state <> 'idle'"
                    " AND pid <> pg_backend_pid()"
                ).fetchone()  # type: ignore[misc]
                if left == 0:
                    break
                time.sleep(0.1)
            assert left == 0  # no open cursor left on the backend
    with connect(proxy, autocommit=True) as conn:  # the proxy and its backend serve on
        assert conn.execute("SELECT COUNT(*) FROM people").fetchone()[0] > 0  # type: ignore[index]


def test_replay_stores_a_streamed_answer_up_to_a_size(proxy: Proxy) -> None:
    sql = f"SELECT zip, COUNT(*) AS again_{proxy.backend} FROM people GROUP BY zip"
    with connect(proxy, autocommit=True) as conn:
        first = conn.execute(sql).fetchall()
        spent = proxy.spent()
        assert conn.execute(sql).fetchall() == first  # stored: the same answer, free
        assert proxy.spent() == spent
        proxy.engine.REPLAY_MAX_ROWS = 1000  # type: ignore[misc]
        try:
            bigger = sql.replace("again", "big")
            conn.execute(bigger).fetchall()
            spent = proxy.spent()
            with contextlib.suppress(psycopg.Error):
                conn.execute(bigger).fetchall()
            assert proxy.spent() == pytest.approx(spent + EPSILON)  # too large to store: charged again
        finally:
            del proxy.engine.REPLAY_MAX_ROWS  # type: ignore[misc]
