"""The console's web application: routes, login, and rendering each page.

This module owns the aiohttp application a data owner's browser talks to: the login form and its
cookie (HttpOnly, SameSite=Strict, expiring), the read-only pages (budgets, audit log, policy,
accuracy planner) rendered server-side by Jinja2 with autoescaping, the planner's JSON endpoint, and
the headers every answer carries (no caching, a strict Content-Security-Policy). Only the login and
logout forms are POSTs; every other route is a GET that changes nothing.

It must never show a protected value, a password or a verifier: pages are built from the policy
(dpproxy.console.pages strips credentials), the ledger's costs and statement texts, and plans made
without a backend (dpproxy.console.planner).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from importlib.resources import files
from typing import Any

import jinja2
from aiohttp import web

from dpproxy import __version__
from dpproxy.audit import KINDS, STORED_STATUSES, parse_moment
from dpproxy.budget import Ledger
from dpproxy.console import auth, pages, planner
from dpproxy.policy import DATASET, Policy

log = logging.getLogger("dpproxy.console")

# Seconds a wrong password waits before its answer (per attempt, on top of MAX_FAILURES a minute).
FAILURE_DELAY = 1.0
AUDIT_LIMIT = 500  # audit rows a page shows
AUDIT_FOLD = 240  # statements longer than this many characters are folded (the whole text a click away)

_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # "no-referrer" would make browsers send Origin: null
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Console:
    """The console of one serving process: the policy it shows (swapped by `set_policy` on reload),
    the ledger it reads, and the logins it holds."""

    def __init__(
        self,
        policy: Policy,
        ledger: Ledger,
        *,
        failure_delay: float = FAILURE_DELAY,
        enforced_unique: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        self._policy = _with_console(policy)
        self.ledger = ledger
        # What the backing database enforces unique (read by the serving engine at start; empty for
        # `dpproxy console`, which has no backend): the planner's plans see it as the proxy's do.
        self.enforced_unique = dict(enforced_unique or {})
        self.sessions = auth.Sessions()
        self.failures = auth.Failures()
        self.failure_delay = failure_delay
        root = files("dpproxy.console")
        self.templates = jinja2.Environment(
            loader=jinja2.FunctionLoader(lambda name: (root / "templates" / name).read_text("utf-8")),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.static = {name: (root / "static" / name).read_bytes() for name in ("console.css", "planner.js")}

    @property
    def policy(self) -> Policy:
        return self._policy

    def set_policy(self, policy: Policy) -> None:
        """Show `policy` from now on (a reload). Owners it no longer lists, or lists with another
        password, are logged out; a policy
        without a `console:` section is refused (ValueError) and the running one stays."""
        _with_console(policy)
        assert policy.console is not None
        self._policy = policy
        self.sessions.close_stale(policy.console)

    def app(self) -> web.Application:
        application = web.Application(middlewares=[self._headers], client_max_size=64 * 1024)
        application.add_routes(
            [
                web.get("/", self._page(self.budgets_page)),
                web.get("/login", self.login_form),
                web.post("/login", self.login),
                web.post("/logout", self.logout),
                web.get("/budgets", self._page(self.budgets_page)),
                web.get("/audit", self._page(self.audit_page)),
                web.get("/policy", self._page(self.policy_page)),
                web.get("/planner", self._page(self.planner_page)),
                web.get("/planner.json", self._page(self.planner_json)),
                web.get("/static/{name}", self.static_file),
            ]
        )
        return application

    # -- plumbing ----------------------------------------------------------------------------------

    @web.middleware
    async def _headers(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as error:  # 403, 404, 405 …: the same headers as every page
            error.headers.update(_HEADERS)
            raise
        response.headers.update(_HEADERS)
        return response

    def _page(self, handler: Callable[[web.Request, str], Awaitable[web.StreamResponse]]) -> Handler:
        @functools.wraps(handler)
        async def guarded(request: web.Request) -> web.StreamResponse:
            owner = self._owner(request)
            if owner is None:
                if request.path.endswith(".json"):
                    return web.json_response({"problem": "log in first"}, status=401)
                return _redirect("/login")
            return await handler(request, owner)

        return guarded

    def _owner(self, request: web.Request) -> str | None:
        console = self.policy.console
        assert console is not None
        return self.sessions.owner(request.cookies.get(auth.COOKIE), console)

    def render(self, template: str, status: int = 200, **context: Any) -> web.Response:
        text = self.templates.get_template(template).render(version=__version__, **context)
        return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")

    async def static_file(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.static:
            raise web.HTTPNotFound()
        kind = "text/css" if name.endswith(".css") else "text/javascript"
        return web.Response(body=self.static[name], content_type=kind)

    # -- login -------------------------------------------------------------------------------------

    async def login_form(self, request: web.Request) -> web.StreamResponse:
        if self._owner(request) is not None:
            return _redirect("/budgets")
        return self.login_page(request, 200, None, "")

    def login_page(self, request: web.Request, status: int, error: str | None, name: str) -> web.Response:
        """The login form with a fresh token in its hidden field and in a cookie (auth.login_token)."""
        token = auth.login_token()
        response = self.render("login.html", status, error=error, name=name, token=token)
        _set_cookie(response, request, auth.LOGIN_COOKIE, token, auth.LOGIN_MINUTES, "/login")
        return response

    async def login(self, request: web.Request) -> web.StreamResponse:
        _same_origin(request)
        form = await request.post()
        name = str(form.get("name", ""))[:200]
        password = str(form.get("password", ""))[:1024]
        if not auth.tokens_agree(request.cookies.get(auth.LOGIN_COOKIE), str(form.get("token", ""))):
            error = "The login form had expired or did not come from this console: log in again."
            return self.login_page(request, 403, error, name)
        console = self.policy.console
        assert console is not None
        address = request.remote or "?"
        key = (address, name)
        if not self.failures.claim(key):  # counted as failed until the password is found right
            error = "Too many failed logins for this name from your address: wait a minute."
            return self.login_page(request, 429, error, name)
        loop = asyncio.get_running_loop()
        good = bool(password) and await loop.run_in_executor(
            None, auth.check_password, console, name, password
        )
        if not good:
            log.warning("console: failed login from %s", address)
            await asyncio.sleep(self.failure_delay)
            return self.login_page(request, 401, "Wrong name or password.", name)
        self.failures.forgive(key)
        try:  # an operator action in the audit log: who logged in, from where
            await loop.run_in_executor(
                None,
                functools.partial(
                    self.ledger.audit_operator, DATASET, f"console login from {address}", by=name
                ),
            )
        except Exception as error:  # the login stands; only its audit row is missing
            log.warning("console: could not audit a login: %s", type(error).__name__)
        verifier = console.owner(name)
        assert verifier is not None
        token = self.sessions.open(name, console.session_minutes, verifier.password)
        response = _redirect("/budgets")
        response.del_cookie(auth.LOGIN_COOKIE, path="/login", samesite="Strict")
        _set_cookie(response, request, auth.COOKIE, token, console.session_minutes, "/")
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        _same_origin(request)
        self.sessions.close(request.cookies.get(auth.COOKIE))
        response = _redirect("/login")
        response.del_cookie(auth.COOKIE, path="/", samesite="Strict")
        return response

    # -- pages -------------------------------------------------------------------------------------

    async def budgets_page(self, request: web.Request, owner: str) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        shown = await loop.run_in_executor(None, pages.budgets, self.policy, self.ledger)
        return self.render(
            "budgets.html",
            owner=owner,
            page="budgets",
            budgets=shown,
            accounting=self.policy.defaults.accounting,
        )

    async def audit_page(self, request: web.Request, owner: str) -> web.StreamResponse:
        query = request.query
        keys = ("analyst", "kind", "status", "since", "until")
        filters = {key: query.get(key, "").strip()[:64] for key in keys}
        if "kind" not in query:  # psql's and the BI tools' catalog queries crowd out the rest
            filters["kind"] = "!catalog"
        problem = None
        entries: list[Any] = []
        try:
            since = parse_moment(filters["since"])
            until = parse_moment(filters["until"])
        except ValueError:
            problem = "Write since and until as dates (2025-01-31) or dates and times (2025-01-31T14:00)."
            since = until = None
        status = filters["status"] or None
        if status is not None and status not in STORED_STATUSES:
            problem = f"Status is one of {', '.join(STORED_STATUSES)}."
        kind = filters["kind"] or None
        if kind is not None and kind.removeprefix("!") not in KINDS:
            problem = f"Kind is one of {', '.join(KINDS)}."
        if problem is None:
            loop = asyncio.get_running_loop()
            read = functools.partial(
                self.ledger.audit_entries,
                analyst=filters["analyst"] or None,
                since=since,
                until=until,
                status=status,
                limit=AUDIT_LIMIT,
                kind=kind,
            )
            entries = await loop.run_in_executor(None, read)
        return self.render(
            "audit.html",
            owner=owner,
            page="audit",
            filters=filters,
            statuses=STORED_STATUSES,
            kinds=KINDS,
            fold=AUDIT_FOLD,
            analysts=[a.name for a in self.policy.analysts],
            entries=entries,
            limit=AUDIT_LIMIT,
            problem=problem,
        )

    async def policy_page(self, request: web.Request, owner: str) -> web.StreamResponse:
        policy = self.policy
        return self.render(
            "policy.html",
            owner=owner,
            page="policy",
            source=policy.source,
            defaults=policy.defaults,
            auth_methods=", ".join(m.value for m in policy.server.auth_methods),
            tables=pages.table_views(policy),
            analysts=pages.analyst_views(policy),
        )

    def _estimate(self, request: web.Request) -> tuple[dict[str, str], planner.Estimate | None]:
        policy = self.policy
        tables = planner.plannable_tables(policy)
        query = request.query
        table = query.get("table") or (tables[0].name if tables else "")
        known = policy.table(table)
        column = query.get("column", "*")
        if known is not None and column not in ("*", "") and known.column(column) is None:
            column = "*"
        form = {
            "table": table,
            "column": column,
            "aggregate": (query.get("aggregate") or "COUNT").upper(),
            "epsilon": query.get("epsilon") or f"{policy.defaults.epsilon:g}",
            "rows": query.get("rows") or str(planner.DEFAULT_ROWS),
        }
        try:
            epsilon = float(form["epsilon"])
            rows = int(form["rows"])
            if not math.isfinite(epsilon) or rows < 1:
                raise ValueError
        except ValueError:
            return form, planner.Estimate("", 0.0, problem="ε is a number and rows a whole number above 0")
        if not tables:
            return form, None
        return form, planner.estimate(
            policy, table, column, form["aggregate"], epsilon, min(rows, 10**12), self.enforced_unique
        )

    async def planner_page(self, request: web.Request, owner: str) -> web.StreamResponse:
        form, estimate = self._estimate(request)
        policy = self.policy
        return self.render(
            "planner.html",
            owner=owner,
            page="planner",
            form=form,
            estimate=estimate,
            error_text=planner.error_text,
            tables=planner.plannable_tables(policy),
            aggregates=planner.AGGREGATES,
            low=policy.defaults.min_epsilon,
            high=policy.defaults.max_epsilon,
        )

    async def planner_json(self, request: web.Request, owner: str) -> web.StreamResponse:
        _, estimate = self._estimate(request)
        if estimate is None:
            return web.json_response({"problem": "the policy has no protected table"})
        return web.json_response(estimate.as_json())


def _with_console(policy: Policy) -> Policy:
    """`policy`, refused (ValueError) when it has no `console:` section to log in with."""
    if policy.console is None or not policy.console.owners:
        raise ValueError(
            f"the policy {policy.source} has no `console:` section listing owners, so nobody could log in "
            "to the console; add one (README: Policy reference, console)"
        )
    return policy


def _set_cookie(
    response: web.Response, request: web.Request, name: str, value: str, minutes: int, path: str
) -> None:
    """A cookie scripts cannot read and other sites' requests do not carry, expiring in `minutes`."""
    response.set_cookie(
        name, value, max_age=minutes * 60, path=path, httponly=True, samesite="Strict", secure=request.secure
    )


def _redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def _same_origin(request: web.Request) -> None:
    """Refuse a form posted from another site (SameSite=Strict already keeps the cookie from it)."""
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        raise web.HTTPForbidden(text="cross-site form posts are refused")
