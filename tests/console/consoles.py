"""A console served on a free port for the tests, and an HTTP client that shows cookies and redirects."""

from __future__ import annotations

import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from dpproxy.budget import Ledger
from dpproxy.console import BackgroundConsole, Console
from dpproxy.policy import Policy

OWNER, OWNER_PASSWORD = "carol", "carol-demo"  # the demo policy's console owner


@contextmanager
def served(policy: Policy, ledger: Ledger, *, failure_delay: float = 0.05) -> Iterator[BackgroundConsole]:
    with BackgroundConsole(Console(policy, ledger, failure_delay=failure_delay), port=0) as console:
        yield console


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    set_cookie: list[str]
    body: str


class Client:
    """A browser-like client: keeps cookies, does not follow redirects (tests look at them)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect)

    def request(
        self, path: str, form: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> Answer:
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        request = urllib.request.Request(self.base + path.lstrip("/"), data=data, headers=headers or {})
        try:
            response = self.opener.open(request, timeout=30)
        except urllib.error.HTTPError as e:
            response = e
        body = response.read().decode()
        return Answer(
            response.status,
            {k.lower(): v for k, v in response.headers.items()},
            response.headers.get_all("Set-Cookie") or [],
            body,
        )

    @staticmethod
    def sessions(answer: Answer) -> list[str]:
        """The session cookies `answer` sets (the login form's own token cookie left out)."""
        return [c for c in answer.set_cookie if c.startswith("dpproxy_console=")]

    def login(self, name: str = OWNER, password: str = OWNER_PASSWORD) -> Answer:
        """Log in as a browser does: the form first (its token and cookie), then the post."""
        form = self.request("/login")
        if form.status == 303:  # logged in already: the login page sends the owner on; log out first
            self.request("/logout", {})
            form = self.request("/login")
        token = re.search(r'name="token" value="([^"]+)"', form.body)
        assert token is not None, form.body
        return self.request("/login", {"name": name, "password": password, "token": token.group(1)})
