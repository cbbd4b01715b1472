"""What an attacker on the console's port could try, and what stops it.

Guessing passwords faster than the per-address limit by sending the guesses at once; error pages
without the headers every page carries; routes reachable without a login; markup written by an
analyst (statement text, parameters) rendered into the audit page.
"""

from __future__ import annotations

import json
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dpproxy.audit import StatementRecord, Status
from dpproxy.budget import open_ledger
from dpproxy.console.auth import MAX_FAILURES
from dpproxy.policy import load_policy
from dpproxy.privacy.accounting import Cost
from tests.console.consoles import OWNER, Client, served

POLICY = Path(__file__).resolve().parent.parent.parent / "policies" / "demo.yaml"
MARKUP = "<script>alert(1)</script><img src=x onerror=alert(2)>\"'"


@pytest.fixture(scope="module")
def console():
    policy = load_policy(POLICY)
    with open_ledger(":memory:") as ledger:
        charged = StatementRecord("alice", f"SELECT COUNT(*) FROM patients -- {MARKUP}", (MARKUP, 1))
        ledger.commit(ledger.reserve("alice", Cost(0.5, 0.0), Cost(10.0, 1e-5), record=charged))
        refused = StatementRecord("bob", MARKUP, (MARKUP,), client=MARKUP, kind="query")
        refused.error("42601")
        assert refused.status is Status.REFUSED
        refused.finish()
        ledger.audit_write([refused])
        with served(policy, ledger, failure_delay=0.2) as running:
            yield running


def test_guesses_sent_at_once_are_limited_like_guesses_sent_one_by_one():
    """The limit of MAX_FAILURES failed logins a minute must hold when the guesses arrive together:
    otherwise a brute force sends hundreds in parallel and each is checked."""
    policy = load_policy(POLICY)
    with open_ledger(":memory:") as ledger, served(policy, ledger, failure_delay=0.5) as running:
        attempts = 4 * MAX_FAILURES

        def guess(number: int) -> int:
            return Client(running.url).login(OWNER, f"guess-{number}").status

        with ThreadPoolExecutor(attempts) as pool:
            statuses = list(pool.map(guess, range(attempts)))
        checked = statuses.count(401)
        assert statuses.count(429) == attempts - checked
        assert checked <= MAX_FAILURES, f"{checked} passwords checked in parallel, not {MAX_FAILURES}"


def test_a_good_login_after_failures_still_works_and_does_not_count_as_one():
    policy = load_policy(POLICY)
    with open_ledger(":memory:") as ledger, served(policy, ledger, failure_delay=0) as running:
        client = Client(running.url)
        for _ in range(MAX_FAILURES - 1):
            assert client.login(OWNER, "wrong").status == 401
        for _ in range(3):  # successes are not failures
            assert client.login().status == 303
        assert client.login(OWNER, "wrong").status == 401
        assert client.login(OWNER, "wrong").status == 429


def test_error_answers_carry_the_same_headers_as_pages(console):
    client = Client(console.url)
    for path, form, headers, status in (
        ("/no-such-page", None, None, 404),
        ("/static/../app.py", None, None, 404),
        ("/login", {"name": OWNER, "password": "x"}, {"Origin": "http://evil.example"}, 403),
    ):
        answer = client.request(path, form, headers)
        assert answer.status == status
        assert answer.headers.get("cache-control") == "no-store", path
        assert answer.headers.get("x-frame-options") == "DENY", path
        assert "frame-ancestors 'none'" in answer.headers.get("content-security-policy", ""), path


def test_every_page_but_login_and_static_files_needs_a_login(console):
    from dpproxy.console import Console

    app = Console(load_policy(POLICY), console.console.ledger).app()
    paths = {r.resource.canonical for r in app.router.routes() if r.method == "GET"}
    assert paths == {
        "/",
        "/login",
        "/budgets",
        "/audit",
        "/policy",
        "/planner",
        "/planner.json",
        "/static/{name}",
    }
    client = Client(console.url)
    for path in paths - {"/login", "/static/{name}"}:
        answer = client.request(path)
        assert answer.status in (303, 401), path
        assert "alice" not in answer.body and "patients" not in answer.body, path
        if answer.status == 303:
            assert answer.headers["location"] == "/login"
    assert client.request("/static/console.css").status == 200
    assert client.request("/static/%2e%2e%2fapp.py").status == 404


def test_analysts_markup_is_shown_as_text(console):
    client = Client(console.url)
    assert client.login().status == 303
    page = client.request("/audit").body
    assert "<script>alert(1)" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    filtered = client.request("/audit?analyst=" + urllib.parse.quote(MARKUP)).body
    assert "<script>alert(1)" not in filtered
    planned = client.request("/planner.json?table=" + urllib.parse.quote(MARKUP))
    assert planned.headers["content-type"].startswith("application/json")
    assert MARKUP not in json.loads(planned.body).get("problem", "")
