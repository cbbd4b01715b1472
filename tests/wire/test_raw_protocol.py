"""The protocol message by message: startup parameters, Describe before Bind, portals suspended
by a row limit, error recovery until Sync, binary formats, malformed and random input, negotiation
packets, timeouts, TLS and a hundred concurrent connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import struct
from pathlib import Path

import psycopg
import pytest

from dpproxy.wire import codec
from tests.wire.proxy import ALICE, Proxy, private_copy, running_proxy, self_signed_certificate, write_policy
from tests.wire.raw import (
    SYNC,
    RawClient,
    bind,
    cstr,
    data_row,
    describe,
    error_fields,
    execute,
    kinds,
    msg,
    parse,
    row_names,
)

# --- raw protocol --------------------------------------------------------------------------------------


def test_startup_reports_parameters_and_a_cancel_key(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        messages = raw.login()
        assert messages[0] == ("R", struct.pack("!i", 0))  # AuthenticationOk
        assert messages[-1] == ("Z", b"I")
        assert raw.parameters["server_version"] == "15.0 (dpproxy 0.1)"
        assert raw.parameters["server_version"].split()[0] == "15.0"
        expected = {
            "server_encoding": "UTF8",
            "client_encoding": "UTF8",
            "DateStyle": "ISO, MDY",
            "TimeZone": "UTC",
            "integer_datetimes": "on",
            "standard_conforming_strings": "on",
            "IntervalStyle": "postgres",
            "is_superuser": "off",
            "session_authorization": "alice",
            "application_name": "",
        }
        assert expected.items() <= raw.parameters.items()
        assert raw.key is not None and raw.key[0] > 0


def test_describe_before_bind_runs_nothing(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        before = duck_proxy.spent()
        raw.send(
            parse("s1", "SELECT sex, COUNT(*), AVG(income) FROM patients WHERE age > $1 GROUP BY sex"),
            describe("S", "s1"),
            SYNC,
        )
        messages = raw.read_until("Z")
        assert kinds(messages) == "1tTZ"
        assert struct.unpack("!hI", messages[1][1]) == (1, 23)  # $1 inferred as integer (age)
        assert row_names(messages[2][1]) == ["sex", "count", "avg"]
        assert duck_proxy.spent() == before
        # Bind and Execute run it, once.
        raw.send(bind("", "s1", (b"30",)), execute(""), SYNC)
        messages = raw.read_until("Z")
        assert kinds(messages) == "2NDDDCZ"
        assert duck_proxy.spent() == pytest.approx(before + 0.5)


def test_execute_with_a_row_limit_suspends_the_portal(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        raw.send(
            parse("", "SELECT department, COUNT(*) FROM visits GROUP BY department ORDER BY department"),
            bind("p", ""),
            describe("P", "p"),
            execute("p", 3),
            msg("H"),  # Flush: the answers so far arrive without a Sync
        )
        messages = [raw.read() for _ in range(8)]
        assert kinds(messages) == "12TNDDDs"
        raw.send(execute("p", 0), SYNC)
        messages = raw.read_until("Z")
        assert kinds(messages) == "DDDDDCZ"
        assert messages[-2][1] == cstr("SELECT 8")
        # After Sync the portal is gone (the implicit transaction ended).
        raw.send(execute("p", 0), SYNC)
        messages = raw.read_until("Z")
        assert kinds(messages) == "EZ" and error_fields(messages[0][1])["C"] == "34000"


def test_an_error_skips_messages_until_sync(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        raw.send(
            parse("", "SELECT patient_id FROM patients"),
            bind("", ""),
            execute(""),
            parse("", "SELECT 1"),
            SYNC,
        )
        messages = raw.read_until("Z")
        assert kinds(messages) == "EZ" and error_fields(messages[0][1])["C"] == "42501"
        # The connection works again after Sync.
        raw.send(parse("", "SELECT 1 AS one"), bind("", ""), execute(""), SYNC)
        assert kinds(raw.read_until("Z")) == "12DCZ"
        # In a transaction block, an error leaves it failed until ROLLBACK.
        raw.send(msg("Q", cstr("BEGIN")))
        assert raw.read_until("Z")[-1] == ("Z", b"T")
        raw.send(msg("Q", cstr("SELECT no_such_column FROM zip_info")))
        assert raw.read_until("Z")[-1] == ("Z", b"E")
        raw.send(msg("Q", cstr("SELECT 1")))
        messages = raw.read_until("Z")
        assert error_fields(messages[0][1])["C"] == "25P02" and messages[-1] == ("Z", b"E")
        raw.send(msg("Q", cstr("ROLLBACK")))
        assert raw.read_until("Z")[-1] == ("Z", b"I")


def test_binary_parameters_and_results(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        raw.send(
            parse(
                "", "SELECT zip, population FROM zip_info WHERE population > $1 ORDER BY zip LIMIT 2", (20,)
            ),
            msg(
                "B",
                cstr("")
                + cstr("")
                + struct.pack("!hh", 1, 1)
                + struct.pack("!hiq", 1, 8, 0)
                + struct.pack("!hh", 1, 1),
            ),
            execute(""),
            SYNC,
        )
        messages = raw.read_until("Z")
        assert kinds(messages) == "12DDCZ"
        zip_code, population = data_row(messages[2][1])
        assert zip_code is not None and population is not None and len(population) == 4  # int4, binary
        assert struct.unpack("!i", population)[0] > 0


def test_empty_query_and_unsupported_messages(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        raw.send(msg("Q", cstr("")))
        assert kinds(raw.read_until("Z")) == "IZ"
        raw.send(msg("Q", cstr(" ; -- nothing\n")))
        assert kinds(raw.read_until("Z")) == "IZ"
        raw.send(msg("F", struct.pack("!i", 1234) + struct.pack("!hhh", 0, 0, 0)))
        messages = raw.read_until("Z")
        assert error_fields(messages[0][1])["C"] == "0A000"
        raw.send(msg("d", b"stray copy data"), msg("c"), msg("Q", cstr("SELECT 1")))
        assert kinds(raw.read_until("Z")) == "TDCZ"
        raw.send(msg("X"))
        assert raw.closed()


@pytest.mark.parametrize(
    ("name", "payload"),
    [
        ("unknown message type", msg("!", b"xyz")),
        ("negative length", b"Q" + struct.pack("!i", -5)),
        ("length below four", b"Q" + struct.pack("!i", 2)),
        ("oversized message", b"Q" + struct.pack("!i", 2**31 - 1) + b"SELECT"),
        ("bad Bind counts", msg("B", cstr("") + cstr("") + struct.pack("!h", -3))),
        ("unterminated string", msg("Q", b"SELECT 1")),
        (
            "bad format code",
            msg("B", cstr("") + cstr("") + struct.pack("!hh", 1, 7) + struct.pack("!hh", 0, 0)),
        ),
    ],
)
def test_malformed_input_closes_only_that_connection(duck_proxy: Proxy, name: str, payload: bytes) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        raw.send(payload)
        kind, body = raw.read()
        assert kind == "E" and error_fields(body)["S"] == "FATAL" and error_fields(body)["C"] == "08P01", name
        assert raw.closed()
    with duck_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_malformed_startup_and_truncated_messages(duck_proxy: Proxy) -> None:
    for packet in (
        struct.pack("!i", 100_000) + struct.pack("!i", codec.PROTOCOL_3_0),  # startup packet too long
        struct.pack("!ii", 8, 1234),  # unknown protocol 0.1234
        struct.pack("!ii", 12, codec.PROTOCOL_3_0) + b"user",  # no terminator
    ):
        with RawClient(duck_proxy.port) as raw:
            raw.send(packet)
            kind, body = raw.read()
            assert kind == "E" and error_fields(body)["S"] == "FATAL"
            assert raw.closed()
    # A client that hangs up in the middle of a message, before and after authenticating.
    for authenticated in (False, True):
        with RawClient(duck_proxy.port) as raw:
            if authenticated:
                raw.login()
                raw.send(b"Q" + struct.pack("!i", 100) + b"SELECT")
            else:
                raw.send(struct.pack("!i", 60) + b"\x00\x03")
    with duck_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_random_bytes_after_startup_never_kill_the_server(duck_proxy: Proxy) -> None:
    rng = random.Random(20240601)
    for _ in range(40):
        with RawClient(duck_proxy.port) as raw:
            raw.login()
            raw.sock.settimeout(2)
            blob = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
            if rng.random() < 0.5:  # a plausible type byte makes the fuzz reach the decoders
                blob = (
                    rng.choice(b"QPBDECSHXpdcfF").to_bytes(1, "big") + struct.pack("!i", len(blob) + 4) + blob
                )
            with contextlib.suppress(OSError):
                raw.send(blob, SYNC)
                with contextlib.suppress(ConnectionError, OSError):
                    while raw.read()[0] != "Z":
                        pass
    with duck_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SELECT COUNT(*) FROM visits").fetchone()[0] > 0  # type: ignore[index]


def test_unauthenticated_clients_never_reach_the_engine(duck_proxy: Proxy) -> None:
    before = duck_proxy.spent()
    with RawClient(duck_proxy.port) as raw:
        raw.startup(ALICE)
        assert raw.read()[0] == "R"
        raw.send(msg("Q", cstr("SELECT COUNT(*) FROM patients")))
        kind, body = raw.read()
        assert kind == "E" and error_fields(body)["C"] == "08P01"
        assert raw.closed()
    assert duck_proxy.spent() == before


def test_negotiation_packets_and_protocol_versions(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.send(
            struct.pack("!ii", 8, codec.GSSENC_REQUEST_CODE), struct.pack("!ii", 8, codec.SSL_REQUEST_CODE)
        )
        answers = raw.sock.recv(2)
        answers += raw.sock.recv(2 - len(answers))
        assert answers == b"NN"  # no GSSAPI, no TLS configured: the client goes on in clear
        raw.startup(ALICE)
        assert raw.read()[0] == "R"
    # A newer minor version (3.2) and a protocol extension are answered with what the server speaks.
    with RawClient(duck_proxy.port) as raw:
        body = (
            struct.pack("!i", (3 << 16) | 2)
            + cstr("user")
            + cstr(ALICE)
            + cstr("_pq_.fancy")
            + cstr("1")
            + b"\x00"
        )
        raw.send(struct.pack("!i", len(body) + 4) + body)
        kind, body = raw.read()
        assert kind == "v" and body == struct.pack("!ii", 0, 1) + cstr("_pq_.fancy")
        assert raw.read()[0] == "R"
    # Protocol 2 is refused.
    with RawClient(duck_proxy.port) as raw:
        raw.send(struct.pack("!ii", 8, 2 << 16))
        kind, body = raw.read()
        assert kind == "E" and error_fields(body)["C"] == "0A000"
        assert raw.closed()


def test_startup_options_and_client_encoding(duck_proxy: Proxy) -> None:
    options = "-c search_path=public -c dpproxy.epsilon=0.3 --application_name=from\\\\ options"
    with psycopg.connect(duck_proxy.dsn(options=f"'{options}'"), autocommit=True) as conn:
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.3",)
        assert conn.execute("SHOW search_path").fetchone() == ("public",)
        assert conn.info.parameter_status("application_name") == "from options"
    for bad, message in (
        ("client_encoding=LATIN1", 'client_encoding "LATIN1" is not supported'),
        ("options='-c dpproxy.epsilon=50'", "outside the range the policy allows"),
        ("options='-c server_version=9.6'", 'parameter "server_version" cannot be changed'),
    ):
        with pytest.raises(psycopg.OperationalError) as caught:
            psycopg.connect(duck_proxy.dsn() + " " + bad)
        assert message in str(caught.value)
    with psycopg.connect(duck_proxy.dsn(client_encoding="UTF8"), autocommit=True) as conn:
        assert conn.info.encoding == "utf-8"


def test_extended_protocol_corner_cases(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.login()
        raw.send(parse("two", "SELECT 1; SELECT 2"), SYNC)
        messages = raw.read_until("Z")
        assert error_fields(messages[0][1])["C"] == "42601"
        # SHOW described before it runs; a named statement cannot be parsed twice; Close is idempotent.
        raw.send(
            parse("show", "SHOW dpproxy.epsilon"), describe("S", "show"), parse("show", "SELECT 1"), SYNC
        )
        messages = raw.read_until("Z")
        assert kinds(messages) == "1tTEZ" and row_names(messages[2][1]) == ["dpproxy.epsilon"]
        assert error_fields(messages[3][1])["C"] == "42P05"
        raw.send(
            msg("C", b"S" + cstr("show")), msg("C", b"S" + cstr("show")), msg("C", b"P" + cstr("nope")), SYNC
        )
        assert kinds(raw.read_until("Z")) == "333Z"
        raw.send(bind("", "show"), SYNC)
        messages = raw.read_until("Z")
        assert error_fields(messages[0][1])["C"] == "26000"
        # Wrong number of parameters.
        raw.send(parse("", "SELECT COUNT(*) FROM patients WHERE age > $1"), bind("", "", ()), SYNC)
        messages = raw.read_until("Z")
        assert kinds(messages) == "1EZ" and error_fields(messages[1][1])["C"] == "08P01"
        # A bad parameter value is an ordinary error.
        raw.send(bind("", "", (b"not a number",)), SYNC)
        messages = raw.read_until("Z")
        assert error_fields(messages[0][1])["C"] == "22P02"
        # An empty statement executes to EmptyQueryResponse.
        raw.send(parse("", ""), bind("", ""), describe("P", ""), execute(""), SYNC)
        assert kinds(raw.read_until("Z")) == "12nIZ"


def test_idle_and_startup_timeouts(demo_duckdb: Path, tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "policy.yaml")
    backend = private_copy(demo_duckdb, tmp_path)
    with running_proxy(
        policy, backend, tmp_path / "l.sqlite", idle_timeout=0.5, startup_timeout=0.5
    ) as proxy:
        with RawClient(proxy.port) as raw:
            raw.login()
            kind, body = raw.read()  # nothing sent: the server gives up on the idle session
            assert kind == "E" and error_fields(body)["C"] == "57P05"
            assert raw.closed()
        with RawClient(proxy.port) as raw:
            raw.startup(ALICE)
            assert raw.read()[0] == "R"  # and then never answers the authentication request
            kind, body = raw.read()
            assert kind == "E" and error_fields(body)["S"] == "FATAL"
            assert raw.closed()


def test_tls_when_a_certificate_is_configured(demo_duckdb: Path, tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    cert, key = self_signed_certificate(tmp_path)
    policy = write_policy(tmp_path / "policy.yaml")
    backend = private_copy(demo_duckdb, tmp_path)
    with running_proxy(policy, backend, tmp_path / "l.sqlite", tls_cert=cert, tls_key=key) as proxy:
        with psycopg.connect(proxy.dsn(sslmode="require"), autocommit=True) as conn:
            assert conn.pgconn.ssl_in_use
            assert conn.execute("SELECT COUNT(*) FROM patients").fetchone()[0] > 0  # type: ignore[index]
        with psycopg.connect(proxy.dsn(sslmode="disable"), autocommit=True) as conn:
            assert not conn.pgconn.ssl_in_use
        # Bytes sent after SSLRequest, before the handshake, are refused (CVE-2021-23214).
        with RawClient(proxy.port) as raw:
            raw.send(struct.pack("!ii", 8, codec.SSL_REQUEST_CODE) + msg("Q", cstr("SELECT 1")))
            reply = raw.sock.recv(1)
            assert reply in (b"E", b"")


def test_a_hundred_concurrent_connections(duck_proxy: Proxy) -> None:
    async def one(i: int) -> int:
        async with await psycopg.AsyncConnection.connect(duck_proxy.dsn(), autocommit=True) as conn:
            cur = await conn.execute("SELECT COUNT(*) FROM patients WHERE age > %s", [i % 50])
            (count,) = await cur.fetchone()  # type: ignore[misc]
            return count

    async def main() -> list[int]:
        return await asyncio.gather(*(one(i) for i in range(100)))

    before = duck_proxy.spent()
    counts = asyncio.run(main())
    assert len(counts) == 100 and all(isinstance(c, int) for c in counts)
    assert duck_proxy.spent() == pytest.approx(before + 50)
