"""Text and binary encodings against PostgreSQL itself: floats, numerics, dates, timestamps, arrays
and vectors as PostgreSQL writes them, and parameters as it reads them.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from collections.abc import Iterator
from decimal import Decimal

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpproxy.errors import DPProxyError
from dpproxy.wire import types

# --- text and binary encodings against PostgreSQL itself ------------------------------------------------


@pytest.fixture(scope="module")
def pg_raw(pg_cluster) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        yield conn


def _pg_output(conn: psycopg.Connection, sql: str, param: str, fmt: int) -> bytes:
    result = conn.pgconn.exec_params(sql.encode(), [param.encode()], result_format=fmt)
    assert result.status == psycopg.pq.ExecStatus.TUPLES_OK, result.error_message
    value = result.get_value(0, 0)
    assert value is not None
    return bytes(value)


_floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [0.0, -0.0, 1e15, 1e14, 123456789012345.0, 1e-4, 1e-5, 0.1, 1 / 3, 1e300, 5e-324, 2.5e-310, 100.0]
)


@given(value=_floats)
def test_float_output_is_postgresql_s(pg_raw: psycopg.Connection, value: float) -> None:
    text = repr(value)
    assert types.encoder(701, 0)(value) == _pg_output(pg_raw, "SELECT $1::float8", text, 0)
    assert types.encoder(701, 1)(value) == _pg_output(pg_raw, "SELECT $1::float8", text, 1)
    single = struct.unpack("!f", struct.pack("!f", value))[0] if abs(value) < 3.4e38 else 1.5
    if math.isfinite(single):
        assert types.encoder(700, 0)(single) == _pg_output(pg_raw, "SELECT $1::float4", repr(single), 0)


_decimals = st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(
    lambda d: abs(d.adjusted()) < 120
) | st.sampled_from(
    [Decimal("0"), Decimal("-0.00"), Decimal("1E+3"), Decimal("0.0001"), Decimal("12345.6789")]
)


@given(value=_decimals)
def test_numeric_output_is_postgresql_s(pg_raw: psycopg.Connection, value: Decimal) -> None:
    text = format(value, "f")
    assert types.encoder(1700, 0)(value) == _pg_output(pg_raw, "SELECT $1::numeric", text, 0)
    binary = _pg_output(pg_raw, "SELECT $1::numeric", text, 1)
    assert types.encoder(1700, 1)(value) == binary
    assert types.decoder(1700, 1)(binary) == value


def test_special_numerics_and_floats_match_postgresql(pg_raw: psycopg.Connection) -> None:
    for text in ("NaN", "Infinity", "-Infinity"):
        for fmt in (0, 1):
            assert types.encoder(1700, fmt)(Decimal(text)) == _pg_output(
                pg_raw, "SELECT $1::numeric", text, fmt
            )
            assert types.encoder(701, fmt)(float(text)) == _pg_output(pg_raw, "SELECT $1::float8", text, fmt)


_datetimes = st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31))


@given(value=_datetimes)
def test_dates_and_timestamps_match_postgresql(pg_raw: psycopg.Connection, value: dt.datetime) -> None:
    text = value.isoformat(sep=" ")
    for fmt in (0, 1):
        assert types.encoder(1114, fmt)(value) == _pg_output(pg_raw, "SELECT $1::timestamp", text, fmt)
        assert types.encoder(1082, fmt)(value.date()) == _pg_output(pg_raw, "SELECT $1::date", text[:10], fmt)
        aware = value.replace(tzinfo=dt.UTC)
        assert types.encoder(1184, fmt)(aware) == _pg_output(
            pg_raw, "SELECT $1::timestamptz", text + "+00", fmt
        )
    assert types.decoder(1114, 1)(types.encoder(1114, 1)(value)) == value


def test_timestamptz_follows_the_session_time_zone(pg_raw: psycopg.Connection) -> None:
    from dpproxy.wire.settings import zone

    value = dt.datetime(2024, 7, 1, 12, 30, 15, 250000, tzinfo=dt.UTC)
    for name in ("Europe/Paris", "Asia/Kolkata", "America/St_Johns", "UTC"):
        pg_raw.execute(f"SET TimeZone = '{name}'")
        expected = _pg_output(pg_raw, "SELECT $1::timestamptz", "2024-07-01 12:30:15.25+00", 0)
        assert types.encoder(1184, 0, types.TextFormat(1, zone(name)))(value) == expected
    pg_raw.execute("SET TimeZone = 'UTC'")


def test_text_arrays_and_vectors_match_postgresql(pg_raw: psycopg.Connection) -> None:
    value = ["a", "b c", "", None, "NULL", 'x"y', "back\\slash", "{}"]
    result = pg_raw.pgconn.exec_(
        b"SELECT ARRAY['a', 'b c', '', NULL, 'NULL', 'x\"y', 'back\\slash', '{}']::text[]"
    )
    assert types.encoder(1009, 0)(value) == bytes(result.get_value(0, 0))  # type: ignore[arg-type]
    result = pg_raw.pgconn.exec_params(b"SELECT '{1,2,3}'::oid[]", [], result_format=1)
    assert types.encoder(1028, 1)([1, 2, 3]) == bytes(result.get_value(0, 0))  # type: ignore[arg-type]
    assert types.decoder(1028, 1)(bytes(result.get_value(0, 0))) == [1, 2, 3]  # type: ignore[arg-type]
    result = pg_raw.pgconn.exec_params(b"SELECT '1 2'::int2vector", [], result_format=0)
    assert types.encoder(22, 0)([1, 2]) == bytes(result.get_value(0, 0))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("oid", "text", "value"),
    [
        (16, "t", True),
        (16, " yes ", True),
        (16, "of", False),
        (16, "0", False),
        (21, "-32768", -32768),
        (23, " 42 ", 42),
        (20, "9223372036854775807", 2**63 - 1),
        (701, "1e-3", 0.001),
        (701, "-Infinity", -math.inf),
        (1700, "12.50", Decimal("12.50")),
        (1082, "2024-02-29", dt.date(2024, 2, 29)),
        (1114, "2024-02-29 10:11:12.5", dt.datetime(2024, 2, 29, 10, 11, 12, 500000)),
        (1184, "2024-02-29 10:11:12+02", dt.datetime(2024, 2, 29, 8, 11, 12, tzinfo=dt.UTC)),
        (25, "any text", "any text"),
        (1009, '{a,"b,c",NULL}', ["a", "b,c", None]),
    ],
)
def test_text_parameters_decode_as_postgresql_reads_them(oid: int, text: str, value: object) -> None:
    assert types.decoder(oid, 0)(text.encode()) == value


@pytest.mark.parametrize(
    ("oid", "text", "sqlstate"),
    [
        (16, "o", "22P02"),
        (21, "32768", "22003"),
        (23, "4.5", "22P02"),
        (23, "1_000", "22P02"),
        (1700, "12,5", "22P02"),
        (1082, "29/02/2024", "22007"),
    ],
)
def test_bad_text_parameters_are_refused_with_postgresql_s_codes(oid: int, text: str, sqlstate: str) -> None:
    with pytest.raises(DPProxyError) as caught:
        types.decoder(oid, 0)(text.encode())
    assert caught.value.sqlstate == sqlstate and text in caught.value.message


def test_binary_parameters_round_trip_and_reject_bad_lengths() -> None:
    samples = {
        16: True,
        21: -5,
        23: 123456,
        20: -(2**40),
        700: 1.5,
        701: -2.25,
        1700: Decimal("-1234.000500"),
        1082: dt.date(1999, 12, 31),
        1114: dt.datetime(1970, 1, 1, 0, 0, 1),
        1184: dt.datetime(2038, 1, 19, 3, 14, 8, tzinfo=dt.UTC),
        25: "héllo",
        1028: [1, 2, None],
    }
    for oid, value in samples.items():
        assert types.decoder(oid, 1)(types.encoder(oid, 1)(value)) == value, oid
    for oid in (16, 21, 23, 20, 701, 1082, 1114):
        with pytest.raises(DPProxyError) as caught:
            types.decoder(oid, 1)(b"\x00\x01\x02")
        assert caught.value.sqlstate == "22P03"
