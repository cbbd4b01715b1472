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
    [cookie] = [c for c in answer.set_cookie if c.startswith("dpproxy_console=")]
    assert any(c.startswith('dpproxy_login=""') for c in answer.set_cookie)  # the form's token, spent
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
    assert Client.sessions(answer) == []
    assert client.login("nobody", OWNER_PASSWORD).status == 401
    assert client.request("/budgets").status == 303


def test_a_cross_site_form_post_is_refused(console):
    client = Client(console.url)
    answer = client.request(
        "/login", {"name": OWNER, "password": OWNER_PASSWORD}, {"Origin": "http://evil.example"}
    )
    assert answer.status == 403 and Client.sessions(answer) == []


def test_too_many_failures_from_one_address_are_refused_for_a_while():
    policy = load_policy(POLICY)
    with open_ledger(":memory:") as ledger, served(policy, ledger, failure_delay=0) as running:
        client = Client(running.url)
        for _ in range(MAX_FAILURES):
            assert client.login(OWNER, "wrong").status == 401
        refused = client.login()  # even the right password, until the minute has passed
        assert refused.status == 429 and "Too many failed logins" in refused.body
        assert Client.sessions(refused) == []


def test_a_login_post_needs_the_token_of_a_login_form_this_browser_loaded(console):
    """Login CSRF: another site can make a browser post the login form (without an Origin header in
    older browsers) to log it in under the attacker's name; it cannot send the form's cookie."""
    client = Client(console.url)
    form = {"name": OWNER, "password": OWNER_PASSWORD}
    for token in (None, "", "forged-token"):
        posted = client.request("/login", form if token is None else {**form, "token": token})
        assert posted.status == 403 and Client.sessions(posted) == []
        assert "did not come from this console" in posted.body
    other = Client(console.url)  # a token from someone else's form, without its cookie
    other_form = other.request("/login").body
    other_token = other_form.split('name="token" value="')[1].split('"')[0]
    assert Client.sessions(client.request("/login", {**form, "token": other_token})) == []
    assert client.request("/budgets").status == 303
    assert client.login().status == 303  # the form first, then the post: logged in


def test_failures_for_one_name_do_not_lock_out_other_owners_behind_one_address():
    """Behind a reverse proxy every owner has the proxy's address: five wrong passwords for one name
    (or for names nobody has) must not lock out the others."""
    text = POLICY.read_text().replace(
        "  session_minutes: 60\n",
        f"    dave:\n      password: {_verifier('dave-pass')}\n  session_minutes: 60\n",
    )
    policy = parse_policy(text, "two-owners.yaml")
    with open_ledger(":memory:") as ledger, served(policy, ledger, failure_delay=0) as running:
        client = Client(running.url)
        for _ in range(MAX_FAILURES):
            assert client.login("dave", "wrong").status == 401
            assert client.login("nobody", "wrong").status == 401
        assert client.login("dave", "dave-pass").status == 429
        for name in ("nobody", "dave"):  # an owner and a made-up name are counted alike
            assert client.login(name, "wrong").status == 429
        assert client.login("someone-else", "wrong").status == 401
        assert client.login().status == 303  # carol is not locked out


def test_the_count_of_failures_never_tells_which_names_are_owners() -> None:
    """Every name is counted on its own, owner or not: five failures with made-up names do not make
    a sixth made-up name 429 while an owner's name still gets 401."""
    from dpproxy.console.auth import Failures

    failures = Failures(limit=2, window=60)
    for name in ("admin", "root"):
        assert failures.claim(("10.0.0.1", name)) and failures.claim(("10.0.0.1", name))
        assert not failures.claim(("10.0.0.1", name))
    assert failures.claim(("10.0.0.1", "carol")) and failures.claim(("10.0.0.1", "bob"))
    crowded = Failures(limit=2, window=60)
    crowded.MAX_KEYS = 3
    assert all(crowded.claim(("a", str(n))) for n in range(3))
    assert not crowded.claim(("a", "carol"))  # a flood delays a new name; it cannot reset a count
    assert crowded.claim(("a", "0")) and not crowded.claim(("a", "0"))


def test_a_reload_that_changes_an_owners_password_logs_them_out(console):
    client = Client(console.url)
    assert client.login().status == 303 and client.request("/policy").status == 200
    original = console.console.policy
    text = POLICY.read_text()
    old = text.split("console:")[1].split("password: ")[1].split("\n")[0]
    try:
        console.console.set_policy(parse_policy(text.replace(old, _verifier("new-pass")), "reloaded.yaml"))
        assert client.request("/policy").status == 303
        assert client.login().status == 401  # the old password no longer works
        assert client.login(OWNER, "new-pass").status == 303
    finally:
        console.console.set_policy(original)
    assert client.request("/policy").status == 303  # and back: the session of the new password ends


def test_a_session_opened_with_a_verifier_the_policy_no_longer_has_is_refused():
    """A login checked against the old policy while a reload happened: the session it opens must not
    outlive the password change."""
    policy = load_policy(POLICY)
    with open_ledger(":memory:") as ledger:
        console = Console(policy, ledger)
        assert policy.console is not None
        token = console.sessions.open(OWNER, 60, "SCRAM-SHA-256$4096:the-old-one")
        assert console.sessions.owner(token, policy.console) is None
        good = console.sessions.open(OWNER, 60, policy.console.owners[0].password)
        assert console.sessions.owner(good, policy.console) == OWNER


def _verifier(password: str) -> str:
    from dpproxy import scram

    return '"' + scram.make_verifier(password) + '"'


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
