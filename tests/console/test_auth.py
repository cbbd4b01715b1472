"""Logging in to the console: the verifier from the policy, the cookie's rules, refusals and logout."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dpproxy.budget import open_ledger
from dpproxy.console import Console
from dpproxy.console.auth import MAX_FAILURES, check_password
from dpproxy.policy import load_policy, parse_policy
from tests.console.consoles import OWNER, OWNER_PASSWORD, Client, served

POLICY = Path(__file__).resolve().parent.parent.parent / "policies" / "demo.yaml"


@pytest.fixture(scope="module")
def console():
    policy = load_policy(POLICY)
    with open_ledger(":memory:") as ledger, served(policy, ledger) as running:
        yield running


def test_the_owner_logs_in_with_an_httponly_strict_cookie_and_out_again(console):
    client = Client(console.url)
    assert client.request("/budgets").status == 303  # not logged in: to the login page
    answer = client.login()
    assert answer.status == 303 and answer.headers["location"] == "/budgets"
    [cookie] = answer.set_cookie
    parts = [p.strip().lower() for p in cookie.split(";")]
    assert parts[0].startswith("dpproxy_console=") and len(parts[0]) > 40
    assert "httponly" in parts and "samesite=strict" in parts and "path=/" in parts
    assert "max-age=3600" in parts  # the demo policy's session_minutes: 60
    page = client.request("/budgets")
    assert page.status == 200 and "alice" in page.body and OWNER in page.body
    assert page.headers["cache-control"] == "no-store"
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert client.request("/logout", {}).status == 303
    assert client.request("/budgets").status == 303
    assert client.request("/planner.json").status == 401


def test_a_login_is_an_operator_action_in_the_audit_log() -> None:
    policy = load_policy(POLICY)
    with open_ledger(":memory:") as ledger, served(policy, ledger) as running:
        assert Client(running.url).login().status == 303
        assert Client(running.url).login(OWNER, "not-the-password").status == 401  # logged, not audited
        (login,) = [e for e in ledger.audit_entries() if e.kind == "operator"]
    assert login.statement.startswith("console login from 127.0.0.1")
    assert (login.client, login.status) == (f"operator {OWNER}", "ok")


def test_a_wrong_password_gets_the_login_page_again_with_401(console):
    client = Client(console.url)
    started = time.monotonic()
    answer = client.login(OWNER, "not-the-password")
    assert time.monotonic() - started >= 0.05  # the delay on every failure
    assert answer.status == 401 and "Wrong name or password." in answer.body
    assert answer.set_cookie == []
    assert client.login("nobody", OWNER_PASSWORD).status == 401
    assert client.request("/budgets").status == 303


def test_a_cross_site_form_post_is_refused(console):
    client = Client(console.url)
    answer = client.request(
        "/login", {"name": OWNER, "password": OWNER_PASSWORD}, {"Origin": "http://evil.example"}
    )
    assert answer.status == 403 and answer.set_cookie == []


def test_too_many_failures_from_one_address_are_refused_for_a_while():
    policy = load_policy(POLICY)
    with open_ledger(":memory:") as ledger, served(policy, ledger, failure_delay=0) as running:
        client = Client(running.url)
        for _ in range(MAX_FAILURES):
            assert client.login(OWNER, "wrong").status == 401
        refused = client.login()  # even the right password, until the minute has passed
        assert refused.status == 429 and "Too many failed logins" in refused.body
        assert refused.set_cookie == []


def test_passwords_are_checked_against_the_verifier():
    console = load_policy(POLICY).console
    assert check_password(console, OWNER, OWNER_PASSWORD)
    assert not check_password(console, OWNER, OWNER_PASSWORD + "x")
    assert not check_password(console, "alice", "alice-demo")  # analysts are not owners


def test_a_policy_without_a_console_section_cannot_be_served():
    policy = parse_policy("version: 1\ntables: {t: {public: true}}\n", "plain.yaml")
    with open_ledger(":memory:") as ledger, pytest.raises(ValueError, match="no `console:` section"):
        Console(policy, ledger)


def test_a_reload_that_drops_an_owner_logs_them_out(console):
    client = Client(console.url)
    client.login()
    assert client.request("/policy").status == 200
    original = console.console.policy
    text = POLICY.read_text().replace("    carol:\n", "    dave:\n")
    try:
        console.console.set_policy(parse_policy(text, "reloaded.yaml"))
        assert client.request("/policy").status == 303
    finally:
        console.console.set_policy(original)
