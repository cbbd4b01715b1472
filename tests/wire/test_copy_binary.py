"""Binary COPY through the wire server: `COPY (…) TO STDOUT (FORMAT binary)` as psycopg, Polars (both
engines), connectorx and ADBC's PostgreSQL driver send it, on DuckDB and on PostgreSQL.

A binary COPY is only another encoding of the rows the same SELECT releases: the tests compare its
bytes, CopyData message by CopyData message, with what a real PostgreSQL 15 sends for the same COPY
of the same values (a public table's rows, and a private aggregate's released values re-encoded by
PostgreSQL), and check that it is charged, noticed and refused exactly as the text COPY is.

The tools' SQL, seen on the wire (connectorx 0.4.6, adbc-driver-postgresql 1.13, Polars 2.1):
connectorx Parses the query (to describe it), then `COPY (query) TO STDOUT WITH BINARY`; its pandas
destination first Parses `SELECT count(*) FROM (query) AS CXTMPTAB_COUNT` too, which a private
aggregate cannot answer yet (issue 20, item 1). ADBC reads `SELECT version()`, pg_attribute and
pg_type once per connection, then in a transaction Parses the query and runs
`COPY (query) TO STDOUT (FORMAT binary)`.
"""

from __future__ import annotations

import datetime as dt
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator, Sequence
from decimal import Decimal
from pathlib import Path

import duckdb
import psycopg
import pytest
import yaml

from tests.conftest import PgCluster, demo_database
from tests.wire.proxy import Proxy, notices_of, running_proxy, write_policy
from tests.wire.raw import RawClient, bind, cstr, msg, parse

# --- a public table of every type, on both backends ------------------------------------------------

UTC = dt.UTC
TYPES = ["int4", "int8", "numeric", "float8", "text", "date", "timestamp", "timestamptz", "bool"]
TYPED_ROWS: list[tuple[object, ...]] = [
    (
        1,
        9007199254740993,
        Decimal("1234567.89"),
        0.1,
        "plain",
        dt.date(2024, 2, 29),
        dt.datetime(2024, 2, 29, 13, 45, 1, 123456),
        dt.datetime(2024, 2, 29, 11, 45, 1, 500000, tzinfo=UTC),
        True,
    ),
    (
        2,
        -(2**63),
        Decimal("-0.05"),
        -1.5e300,
        "tab\there, ünïcode, 'quotes' and \\",
        dt.date(1999, 12, 31),
        dt.datetime(1970, 1, 1),
        dt.datetime(1969, 7, 20, 20, 17, 40, tzinfo=UTC),
        False,
    ),
    (3, None, None, None, None, None, None, None, None),
    (4, 0, Decimal("0.00"), 5e-324, "", dt.date(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59), None, None),
]
_PG_TYPED = (
    "CREATE TABLE typed (i integer, b bigint, n numeric(12,2), f double precision, t text, d date, "
    "ts timestamp, tz timestamptz, ok boolean)"
)
_DUCK_TYPED = (
    "CREATE TABLE typed (i INTEGER, b BIGINT, n DECIMAL(12,2), f DOUBLE, t VARCHAR, d DATE, "
    "ts TIMESTAMP, tz TIMESTAMPTZ, ok BOOLEAN)"
)
TYPED_COPY = "COPY (SELECT i, b, n, f, t, d, ts, tz, ok FROM typed ORDER BY i) TO STDOUT (FORMAT binary)"

PRIVATE = (
    "SELECT sex, smoker, COUNT(*) AS n, SUM(income) AS total, AVG(age) AS mean_age "
    "FROM patients GROUP BY sex, smoker ORDER BY sex, smoker"
)
PRIVATE_TYPES = ["text", "bool", "int8", "numeric", "numeric"]
PUBLIC = "SELECT zip, city, population FROM zip_info ORDER BY zip LIMIT 50"

BINARY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)


def _policy(path: Path) -> Path:
    write_policy(path)
    policy = yaml.safe_load(path.read_text())
    policy["tables"]["typed"] = {"public": True}
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def typed_pg(pg_cluster: PgCluster, demo_duckdb: Path) -> Iterator[str]:
    """A database of its own: the demo data and the typed table (demo_pg_dsn must stay unchanged)."""
    with demo_database(pg_cluster, demo_duckdb, "copybin") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(_PG_TYPED)
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO typed VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)", TYPED_ROWS)
        yield dsn


@pytest.fixture(scope="module")
def duck_proxy(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    tmp = tmp_path_factory.mktemp("copybin-duck")
    backend = tmp / "demo.duckdb"
    shutil.copyfile(demo_duckdb, backend)
    with duckdb.connect(str(backend)) as conn:
        conn.execute(_DUCK_TYPED)
        conn.executemany("INSERT INTO typed VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", TYPED_ROWS)
    with running_proxy(_policy(tmp / "policy.yaml"), str(backend), tmp / "ledger.sqlite") as proxy:
        yield proxy


@pytest.fixture(scope="module")
def pg_proxy(typed_pg: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    tmp = tmp_path_factory.mktemp("copybin-pg")
    with running_proxy(_policy(tmp / "policy.yaml"), typed_pg, tmp / "ledger.sqlite") as proxy:
        yield proxy


@pytest.fixture(params=["duckdb", "postgres"])
def proxy(request: pytest.FixtureRequest) -> Proxy:
    return request.getfixturevalue("duck_proxy" if request.param == "duckdb" else "pg_proxy")


def copy_messages(conn: psycopg.Connection, sql: str) -> list[bytes]:
    """The payload of each CopyData message, as sent."""
    with conn.cursor().copy(sql) as copy:
        return [bytes(block) for block in copy]


def copy_rows(conn: psycopg.Connection, sql: str, types: Sequence[str]) -> list[tuple[object, ...]]:
    with conn.cursor().copy(sql) as copy:
        copy.set_types(list(types))
        return list(copy.rows())


# --- psycopg: typed values, and PostgreSQL's bytes ---------------------------------------------------


def test_a_public_table_copies_as_postgresql_copies_it(proxy: Proxy, typed_pg: str) -> None:
    with psycopg.connect(typed_pg, autocommit=True) as real:
        expected = copy_messages(real, TYPED_COPY)
    with proxy.connect(autocommit=True) as conn:
        notices = notices_of(conn)
        before = proxy.spent()
        assert copy_messages(conn, TYPED_COPY) == expected
        assert copy_rows(conn, TYPED_COPY, TYPES) == TYPED_ROWS
        # The header rides with the first tuple, the trailer alone, as PostgreSQL's CopyTo sends them.
        assert expected[0].startswith(BINARY_HEADER) and expected[-1] == b"\xff\xff" and len(expected) == 5
        assert proxy.spent() == before and notices == []  # public rows are free
        # No rows: the header and the trailer in one message; the old spellings of the format too.
        for sql in (
            "COPY (SELECT i FROM typed WHERE i > 10) TO STDOUT (FORMAT binary)",
            "COPY (SELECT i, t FROM typed ORDER BY i) TO STDOUT WITH BINARY",
            "COPY BINARY typed (i, t) TO STDOUT",
        ):
            with psycopg.connect(typed_pg, autocommit=True) as real:
                assert copy_messages(conn, sql) == copy_messages(real, sql), sql


def decode(conn: psycopg.Connection, messages: list[bytes], types: Sequence[str]) -> list[tuple[object, ...]]:
    """The tuples of a binary COPY, each field read by psycopg's binary loader of its type."""
    data = b"".join(messages)
    assert data.startswith(BINARY_HEADER) and data.endswith(b"\xff\xff")
    loaders = []
    for name in types:
        oid = conn.adapters.types[name].oid
        loaders.append(conn.adapters.get_loader(oid, psycopg.pq.Format.BINARY)(oid, conn))  # type: ignore[misc]
    rows, at = [], len(BINARY_HEADER)
    while (count := struct.unpack_from("!h", data, at)[0]) != -1:
        assert count == len(types)
        at += 2
        row: list[object] = []
        for loader in loaders:
            (length,) = struct.unpack_from("!i", data, at)
            at += 4
            row.append(None if length == -1 else loader.load(data[at : at + length]))
            at += max(length, 0)
        rows.append(tuple(row))
    assert at + 2 == len(data)
    return rows


def test_a_private_aggregate_is_its_released_rows_in_binary(proxy: Proxy, typed_pg: str) -> None:
    with proxy.connect(autocommit=True) as conn:
        notices = notices_of(conn)
        before = proxy.spent()
        text = copy_messages(conn, f"COPY ({PRIVATE}) TO STDOUT")
        text_cost = proxy.spent() - before
        messages = copy_messages(conn, f"COPY ({PRIVATE}) TO STDOUT (FORMAT binary)")
        binary_cost = proxy.spent() - before - text_cost
        rows = copy_rows(conn, f"COPY ({PRIVATE}) TO STDOUT (FORMAT BINARY)", PRIVATE_TYPES)
        released = decode(conn, messages, PRIVATE_TYPES)
    # Charged as the text COPY (and the SELECT) is, with the same notice.
    assert text_cost == pytest.approx(0.5) and binary_cost == pytest.approx(text_cost)
    assert len(notices) == 3 and len({re.sub(r"[\d.]+", "#", n) for n in notices}) == 1
    assert len(text) == 6 and len(messages) == 7 and len(rows) == len(released) == 6
    for answer in (rows, released):
        assert [r[:2] for r in answer] == [(s, b) for s in "FMX" for b in (False, True)]
        assert sum(r[2] for r in answer) == pytest.approx(3000, abs=300)  # type: ignore[misc]
    # PostgreSQL writes the same released values, given as text, to the same bytes.
    values = ", ".join(["(%s::text, %s::bool, %s::int8, %s::numeric, %s::numeric)"] * len(released))
    with psycopg.connect(typed_pg, autocommit=True) as real:
        sql = psycopg.ClientCursor(real).mogrify(
            f"COPY (SELECT * FROM (VALUES {values}) v) TO STDOUT (FORMAT binary)",
            [v for row in released for v in row],
        )
        assert copy_messages(real, sql) == messages


def test_copy_out_response_announces_binary_in_the_extended_protocol(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        raw.send(
            parse(
                "", "COPY (SELECT zip, city, population FROM zip_info ORDER BY zip LIMIT 2) TO STDOUT BINARY"
            ),
            bind("", ""),
            msg("D", b"P" + cstr("")),
            msg("E", cstr("") + b"\x00\x00\x00\x00"),
            msg("S"),
        )
        messages = raw.read_until("Z")
    assert [kind for kind, _ in messages] == ["1", "2", "n", "H", "d", "d", "d", "c", "C", "Z"]
    assert messages[3][1] == b"\x01\x00\x03\x00\x01\x00\x01\x00\x01"  # binary, three columns in binary
    assert messages[4][1].startswith(BINARY_HEADER) and messages[6][1] == b"\xff\xff"
    assert messages[8][1] == b"COPY 2\x00"


@pytest.mark.parametrize(
    ("sql", "sqlstate", "hint"),
    [
        # What may be copied is what may be selected: raw rows of a protected table are refused.
        ("COPY BINARY patients TO STDOUT", "42501", "SELECT COUNT(*) FROM patients"),
        ("COPY (SELECT age FROM patients) TO STDOUT (FORMAT binary)", "42501", "aggregate"),
        ("COPY BINARY patients FROM STDIN", "42501", "COPY (SELECT …) TO STDOUT"),
        # The options of a text layout, which PostgreSQL refuses in binary (same SQLSTATE and message).
        ("COPY (SELECT 1) TO STDOUT (FORMAT binary, DELIMITER ',')", "42601", "leave out DELIMITER"),
        ("COPY (SELECT 1) TO STDOUT (FORMAT binary, NULL '')", "42601", "leave out DELIMITER"),
        ("COPY (SELECT 1) TO STDOUT (FORMAT binary, HEADER)", "0A000", "leave out DELIMITER"),
        ("COPY (SELECT 1) TO STDOUT (FORMAT binary, QUOTE '\"')", "0A000", "FORMAT csv"),
        ("COPY BINARY zip_info TO STDOUT (FORMAT csv)", "42601", "FORMAT once"),
        ("COPY (SELECT 1) TO STDOUT WITH BINARY CSV", "42601", "FORMAT once"),
    ],
)
def test_binary_copy_refusals(duck_proxy: Proxy, typed_pg: str, sql: str, sqlstate: str, hint: str) -> None:
    with duck_proxy.connect(autocommit=True) as conn:
        before = duck_proxy.spent()
        with pytest.raises(psycopg.Error) as raised:
            copy_messages(conn, sql)
        assert raised.value.sqlstate == sqlstate
        assert hint in (raised.value.diag.message_hint or ""), raised.value.diag.message_hint
        assert duck_proxy.spent() == before
    if sqlstate != "42501":  # PostgreSQL's own answer to the same options
        with psycopg.connect(typed_pg, autocommit=True) as real, pytest.raises(psycopg.Error) as theirs:
            copy_messages(real, sql)
        assert theirs.value.sqlstate == sqlstate
        if "BINARY mode" in (theirs.value.diag.message_primary or ""):
            assert raised.value.diag.message_primary == theirs.value.diag.message_primary


# --- the real tools: Polars (connectorx and ADBC engines), ADBC's DB-API -----------------------------


def _uri(proxy: Proxy) -> str:
    return f"postgresql://alice:alice-demo@127.0.0.1:{proxy.port}/demo?sslmode=disable"


def _read(tool: str, query: str, uri: str) -> dict[str, list[object]]:
    """The query's answer as the tool reads it, column by column."""
    if tool == "adbc-dbapi":
        dbapi = pytest.importorskip("adbc_driver_postgresql.dbapi")
        with dbapi.connect(uri) as conn, conn.cursor() as cur:
            cur.execute(query)
            return cur.fetch_arrow_table().to_pydict()  # type: ignore[no-any-return]
    pl = pytest.importorskip("polars")
    pytest.importorskip("connectorx" if tool == "connectorx" else "adbc_driver_postgresql")
    frame = pl.read_database_uri(query, uri, engine=tool)
    return {name: frame[name].to_list() for name in frame.columns}


@pytest.mark.parametrize("tool", ["connectorx", "adbc", "adbc-dbapi"])
def test_arrow_tools_read_public_and_private_answers(proxy: Proxy, tool: str) -> None:
    with proxy.connect(autocommit=True) as conn:
        truth = conn.execute(PUBLIC).fetchall()
    before = proxy.spent()
    public = _read(tool, PUBLIC, _uri(proxy))
    assert list(zip(*public.values(), strict=True)) == truth
    assert proxy.spent() == before
    private = _read(tool, PRIVATE, _uri(proxy))
    # Described through a prepared statement, then copied: charged once, as the SELECT.
    assert proxy.spent() == pytest.approx(before + 0.5)
    assert list(private) == ["sex", "smoker", "n", "total", "mean_age"]
    assert list(zip(private["sex"], private["smoker"], strict=True)) == [
        (s, b) for s in "FMX" for b in (False, True)
    ]
    assert sum(private["n"]) == pytest.approx(3000, abs=300)  # type: ignore[arg-type]
    # An AVG is NULL where its noisy count is below 1 (the few patients of sex X may give one).
    assert all(isinstance(Decimal(str(v)), Decimal) for v in private["total"])
    assert all(v is None or isinstance(Decimal(str(v)), Decimal) for v in private["mean_age"])
    # Raw rows of a protected table are refused, the tool's error carrying dpproxy's message.
    with pytest.raises(Exception, match="raw rows of the protected table"):
        _read(tool, "SELECT age, sex FROM patients", _uri(proxy))
    assert proxy.spent() == pytest.approx(before + 0.5)


def test_tools_that_wrap_a_private_query_read_its_released_rows(proxy: Proxy) -> None:
    """connectorx's pandas result counts the rows first (`SELECT count(*) FROM (q) AS CXTMPTAB_COUNT`)
    and DuckDB's postgres_query selects from `(q)`: both are answered from the released rows of q,
    each charged as q alone (replay is off here: with it on, the repeat is free)."""
    pytest.importorskip("connectorx")
    before = proxy.spent()
    # In a process of its own: connectorx's pandas path holds the GIL while it waits for its
    # connections, which this process's server thread would need to accept them.
    script = (
        "import connectorx, sys; f = connectorx.read_sql(sys.argv[1], sys.argv[2], return_type='pandas'); "
        "print(list(f.columns), len(f))"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script, _uri(proxy), PRIVATE], capture_output=True, text=True, timeout=120
    )
    assert ran.stdout.strip() == "['sex', 'smoker', 'n', 'total', 'mean_age'] 6", ran.stderr
    assert proxy.spent() == pytest.approx(before + 1.0)  # the count probe's release, then the COPY's
    with proxy.connect(autocommit=True) as conn:
        rows = conn.execute(
            f'SELECT "sex", "n" FROM ({PRIVATE}) AS t WHERE n > %s ORDER BY n DESC',
            [-(10**9)],  # every released row: a noisy count may be 0 or below
        ).fetchall()
    assert [r[1] for r in rows] == sorted((r[1] for r in rows), reverse=True) and {r[0] for r in rows} == set(
        "FMX"
    )
    assert proxy.spent() == pytest.approx(before + 1.5)
