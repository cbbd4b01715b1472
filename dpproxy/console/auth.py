"""Logging data owners in to the console: password checks, sessions and the brake on guessing.

This module owns checking a submitted password against an owner's SCRAM-SHA-256 verifier from the
policy's `console:` section (SaltedPassword from the verifier's salt and iterations, then ClientKey
and StoredKey, compared in constant time), the sessions a login opens (a random token, kept in
memory, that expires and ends when the owner's password changes), the login form's token (so
that another site cannot log a browser in under its attacker's name), and the limit on failed
logins per client address and name tried.

It must never store, log or show a password or a verifier's fields; a session token is only ever
sent in the cookie that carries it.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass

from dpproxy import scram
from dpproxy.policy import ConsolePolicy

COOKIE = "dpproxy_console"
LOGIN_COOKIE = "dpproxy_login"  # the login form's token (login_token), sent back only to /login
LOGIN_MINUTES = 30  # how long a login form stays good
# Failed logins allowed per client address and name within FAILURE_WINDOW seconds before it must wait.
MAX_FAILURES = 5
FAILURE_WINDOW = 60.0

# Checked when the name is unknown, so that a wrong name takes as long as a wrong password.
_DECOY = scram.parse_verifier(scram.make_verifier(secrets.token_urlsafe(16)))


def check_password(console: ConsolePolicy, name: str, password: str) -> bool:
    """True when `password` is the password of owner `name` (constant time in the password)."""
    owner = console.owner(name)
    verifier = scram.parse_verifier(owner.password) if owner is not None else _DECOY
    return verifier.matches(password) and owner is not None


@dataclass(frozen=True)
class Session:
    owner: str
    expires: float  # time.monotonic()
    # The owner's verifier at login (in memory only): a reload that changes the password ends it.
    verifier: str


def login_token() -> str:
    """A fresh token for the login form: sent in a SameSite=Strict cookie and in the form's hidden
    field, and a login is accepted only when both agree. Another site can make a browser post the
    form but can neither read nor set the cookie, so it cannot log the browser in to its own account
    (login CSRF), even from a browser that sends no Origin header."""
    return secrets.token_urlsafe(24)


def tokens_agree(cookie: str | None, field: str | None) -> bool:
    return bool(cookie) and bool(field) and secrets.compare_digest(str(cookie), str(field))


class Sessions:
    """Open logins by token. Thread-safe; tokens live in memory only (a restart logs everyone out)."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, owner: str, minutes: int, verifier: str) -> str:
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._expire()
            self._sessions[token] = Session(owner, time.monotonic() + minutes * 60, verifier)
        return token

    def owner(self, token: str | None, console: ConsolePolicy) -> str | None:
        """The owner a live session token belongs to, or None. A session ends when it expires, when
        `console` (the current policy's) no longer lists its owner, or when the owner's verifier is
        not the one they logged in with (their password was changed by a reload), so a login checked
        against the old policy while the reload happened cannot outlive it either."""
        if not token:
            return None
        with self._lock:
            session = self._sessions.get(token)
            if session is None:
                return None
            current = console.owner(session.owner)
            if session.expires <= time.monotonic() or current is None or current.password != session.verifier:
                del self._sessions[token]
                return None
            return session.owner

    def close(self, token: str | None) -> None:
        if token:
            with self._lock:
                self._sessions.pop(token, None)

    def close_stale(self, console: ConsolePolicy) -> None:
        """Log out every session whose owner `console` no longer lists, or lists with another
        password (after a policy reload)."""
        with self._lock:
            for token, session in list(self._sessions.items()):
                current = console.owner(session.owner)
                if current is None or current.password != session.verifier:
                    del self._sessions[token]

    def _expire(self) -> None:
        now = time.monotonic()
        for token in [t for t, s in self._sessions.items() if s.expires <= now]:
            del self._sessions[token]


class Failures:
    """Failed logins per (client address, name tried) in the last FAILURE_WINDOW seconds.

    Keyed by the name as well as the address: behind a reverse proxy every owner has the proxy's
    address, and five wrong passwords for one name would otherwise lock every owner out. Guessing is
    still limited per name and address, and every name is counted alike, owner or not, so that the
    answers (401, then 429) never tell which names are owners. At most MAX_KEYS keys are counted at
    once: past that, during a flood of made-up names, a name not yet counted is refused (429) until
    the window has passed (a flood can delay logins; it cannot reset an owner's count)."""

    MAX_KEYS = 10_000

    def __init__(self, limit: int = MAX_FAILURES, window: float = FAILURE_WINDOW) -> None:
        self.limit = limit
        self.window = window
        self._seen: dict[str | tuple[str, str], deque[float]] = {}
        self._lock = threading.Lock()

    def claim(self, key: str | tuple[str, str]) -> bool:
        """Count an attempt as failed before its password is checked, unless its key is blocked
        (False): attempts sent at once are limited as attempts sent one by one. `forgive` it if good."""
        with self._lock:
            recent = self._recent(key)
            if recent is None or len(recent) >= self.limit:
                return False
            recent.append(time.monotonic())
            return True

    def forgive(self, key: str | tuple[str, str]) -> None:
        """Take back the attempt last claimed for `key` (its password was right)."""
        with self._lock:
            recent = self._seen.get(key)
            if recent:
                recent.pop()

    def _recent(self, key: str | tuple[str, str]) -> deque[float] | None:
        """The key's attempts within the window; None when it is not counted and there is no room."""
        cutoff = time.monotonic() - self.window
        if key not in self._seen and len(self._seen) >= self.MAX_KEYS:
            for quiet in [k for k, times in self._seen.items() if not times or times[-1] <= cutoff]:
                del self._seen[quiet]
            if len(self._seen) >= self.MAX_KEYS:
                return None
        seen = self._seen.setdefault(key, deque())
        while seen and seen[0] <= cutoff:
            seen.popleft()
        return seen
