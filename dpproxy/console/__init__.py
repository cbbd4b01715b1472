"""The data owners' console: a read-only web page on budgets, the audit log, the policy and accuracy.

The package's parts: `auth` (owners' passwords against the policy's verifiers, sessions, the limit
on failed logins), `pages` (what the pages show: spending charts, the policy's view), `planner` (the
± the proxy would report, from a plan made without data), `app` (the aiohttp application and its
Jinja2 templates) and `server` (serving it on a thread of its own or in the foreground).

It reads the policy and the ledger it is given and plans without a backend: it never opens the
backing database, so no page can show a protected value; nor does it show a password or verifier.
README: Operating dpproxy, Console.
"""

from __future__ import annotations

from dpproxy.console.app import Console
from dpproxy.console.server import DEFAULT_PORT, BackgroundConsole, run_console

__all__ = ["DEFAULT_PORT", "BackgroundConsole", "Console", "run_console"]
