"""Authentication over the wire (one failure message for a wrong password and an unknown user,
SCRAM by default, cleartext and md5 only when the policy enables them) and cancel requests that
interrupt a blocked private query.
"""

from __future__ import annotations

import struct
from pathlib import Path

import psycopg
import pytest
import yaml

from dpproxy.engine import Engine
from dpproxy.policy import load_policy
from dpproxy.scram import make_verifier
from dpproxy.wire.auth import md5_password
from dpproxy.wire.server import BackgroundServer, ServerConfig
from tests.wire.proxy import (
    ALICE,
    ALICE_PASSWORD,
    LockablePeople,
    Proxy,
    private_copy,
    run_in_thread,
    running_proxy,
    self_signed_certificate,
    write_policy,
)
from tests.wire.raw import RawClient, error_fields, msg

# --- psycopg: authentication and cancel ----------------------------------------------------------------


def _auth_error(dsn: str) -> psycopg.OperationalError:
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(dsn)
    return caught.value


def test_wrong_password_and_unknown_user_fail_identically(
    duck_proxy: Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="dpproxy.wire"):
        wrong = _auth_error(duck_proxy.dsn(password="not-her-password"))
        unknown = _auth_error(duck_proxy.dsn(user="mal\x1bory", password="whatever"))
    assert 'password authentication failed for user "alice"' in str(wrong)
    assert str(unknown) == str(wrong).replace('"alice"', '"mal\x1bory"')
    # Each failure is in the operator's log, as PostgreSQL logs it (a name an analyst wrote, escaped).
    failed = [r.getMessage() for r in caplog.records if "authentication failed" in r.getMessage()]
    assert len(failed) == 2 and "'alice' from 127.0.0.1:" in failed[0] and "'mal\\x1bory'" in failed[1]


def test_analyst_without_password_cannot_connect(tmp_path: Path, demo_duckdb: Path) -> None:
    policy = write_policy(tmp_path / "policy.yaml", alice={"password": None})
    with running_proxy(policy, private_copy(demo_duckdb, tmp_path), tmp_path / "ledger.sqlite") as proxy:
        assert 'password authentication failed for user "alice"' in str(_auth_error(proxy.dsn()))
        with psycopg.connect(proxy.dsn(user="bob", password="bob-demo")) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)


def test_cleartext_and_md5_only_when_the_policy_enables_them(tmp_path: Path, demo_duckdb: Path) -> None:
    md5 = md5_password(ALICE_PASSWORD, ALICE)
    assert md5 == "md5" + __import__("hashlib").md5(b"alice-demoalice").hexdigest()
    cert, key = self_signed_certificate(tmp_path)
    for methods in (["password"], ["md5", "scram-sha-256"]):
        policy = write_policy(
            tmp_path / "policy.yaml",
            server={"auth_methods": methods},
            alice={"md5_password": md5} if "md5" in methods else None,
        )
        backend = private_copy(demo_duckdb, tmp_path)
        tls = {"tls_cert": cert, "tls_key": key} if methods == ["password"] else {}
        with running_proxy(policy, backend, tmp_path / f"{methods[0]}.sqlite", **tls) as proxy:
            if methods == ["password"]:
                # A cleartext password is asked for over TLS only (an adversarial review logged in
                # with one sent in the clear): without TLS, 28000 and no password prompt.
                with RawClient(proxy.port) as raw:
                    raw.startup(ALICE)
                    kind, body = raw.read()
                    assert kind == "E" and error_fields(body)["C"] == "28000"
                    assert "only over TLS" in error_fields(body)["M"]
                assert "only over TLS" in str(_auth_error(proxy.dsn(sslmode="disable")))
            else:
                with RawClient(proxy.port) as raw:
                    raw.startup(ALICE)
                    kind, body = raw.read()
                    assert kind == "R" and struct.unpack("!i", body[:4])[0] == 5
            with psycopg.connect(proxy.dsn(sslmode="require" if tls else "prefer")) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
                assert conn.pgconn.ssl_in_use == bool(tls)
            wrong = proxy.dsn(password="wrong", sslmode="require" if tls else "prefer")
            assert "password authentication failed" in str(_auth_error(wrong))
            # bob has no md5 hash: he gets the next method listed (SCRAM) and still logs in.
            if methods[0] == "md5":
                with psycopg.connect(proxy.dsn(user="bob", password="bob-demo")) as conn:
                    assert conn.execute("SELECT 1").fetchone() == (1,)


def _scram_salt(port: int, user: str) -> tuple[str, str]:
    """The salt and iteration count the server's first SCRAM message gives `user`."""
    with RawClient(port) as raw:
        raw.startup(user)
        raw.read()  # AuthenticationSASL
        first = b"n,,n=,r=abcdefghijkl"
        raw.send(msg("p", b"SCRAM-SHA-256\x00" + struct.pack("!i", len(first)) + first))
        kind, body = raw.read()
        assert kind == "R" and struct.unpack("!i", body[:4])[0] == 11  # SASLContinue
        fields = dict(part.split("=", 1) for part in body[4:].decode().split(","))
        return fields["s"], fields["i"]


def test_unknown_names_keep_their_decoy_salt_across_a_reload(tmp_path: Path, demo_duckdb: Path) -> None:
    """An unknown name gets a decoy salt, stable per name, keyed by a secret kept in the ledger: a
    reload that adds an analyst changes no name's salt (keyed by the credentials, every unknown
    name's changed and the real ones' did not: an adversarial review told them apart so), and the
    decoy's iteration count is the default one, whatever the policy's analysts use."""
    policy = write_policy(tmp_path / "policy.yaml")
    engine = Engine.open(policy, private_copy(demo_duckdb, tmp_path), tmp_path / "ledger.sqlite")
    names = [ALICE, "bob", "mallory", "canary"]
    with BackgroundServer(engine, ServerConfig(port=0)) as server:
        before = {name: _scram_salt(server.port, name) for name in names}
        assert before["mallory"] != before["canary"] and before["mallory"][1] == "4096"
        grown = yaml.safe_load(policy.read_text())
        grown["analysts"]["dave"] = {"password": make_verifier("dave-pw", iterations=8192), "epsilon": 1.0,
                                     "delta": 1e-6}  # fmt: skip
        (tmp_path / "grown.yaml").write_text(yaml.safe_dump(grown, sort_keys=False))
        server.reload(load_policy(tmp_path / "grown.yaml"))
        assert {name: _scram_salt(server.port, name) for name in names} == before
        assert _scram_salt(server.port, "dave")[1] == "8192" and _scram_salt(server.port, "erin")[1] == "4096"
    engine = Engine.open(policy, private_copy(demo_duckdb, tmp_path), tmp_path / "ledger.sqlite")
    with BackgroundServer(engine, ServerConfig(port=0)) as server:  # a restart on the same ledger
        assert {name: _scram_salt(server.port, name) for name in names} == before


def test_default_policy_offers_only_scram(duck_proxy: Proxy) -> None:
    with RawClient(duck_proxy.port) as raw:
        raw.startup(ALICE)
        kind, body = raw.read()
        assert (kind, body) == ("R", struct.pack("!i", 10) + b"SCRAM-SHA-256\x00\x00")
        # A client answering with a cleartext password gets a protocol error, not a session.
        raw.send(msg("p", ALICE_PASSWORD.encode() + b"\x00"))
        kind, body = raw.read()
        assert kind == "E" and error_fields(body)["C"] == "08P01"
        assert raw.closed()


def test_cancel_interrupts_a_blocked_private_query(people: LockablePeople, tmp_path: Path) -> None:
    with running_proxy(people.policy, people.dsn, tmp_path / "ledger.sqlite") as proxy:
        with people.locked(), proxy.connect(autocommit=True) as conn:
            worker, outcome = run_in_thread(conn, "SELECT COUNT(*) FROM people")
            people.wait_until_blocked()
            conn.cancel_safe()
            worker.join(20)
            assert isinstance(outcome.get("error"), psycopg.errors.QueryCanceled)
            assert "charged" in str(outcome["error"])
        # The query had reached the data: its cost stays spent. The session goes on.
        assert proxy.spent() == pytest.approx(0.5)
        with proxy.connect(autocommit=True) as conn:
            assert conn.execute("SELECT COUNT(*) FROM people").fetchone()[0] > 0  # type: ignore[index]
