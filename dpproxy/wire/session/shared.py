"""What all sessions of one server share: the engine, the shadow catalog, the authenticator that
admits analysts, and the worker threads every blocking call runs in.

Routing and describing are pure functions of the text (and the policy): their results are cached
here, touched only from the event loop thread, so repeated statements skip sqlglot. This module
holds no session's state and never reads or writes a protocol message.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from dpproxy.audit import StatementRecord
from dpproxy.engine import Engine
from dpproxy.sql.limits import too_deep
from dpproxy.wire.auth import Authenticator
from dpproxy.wire.catalog import ShadowCatalog
from dpproxy.wire.router import Statement, route, split_statements
from dpproxy.wire.router.limits import checked_split

RunBlocking = Callable[..., Awaitable[Any]]


def _refusing_deep_recursion(run_blocking: RunBlocking) -> RunBlocking:
    """Every blocking call (routing, the catalog, the engine) with a RecursionError turned into
    54001 (dpproxy.sql.limits): a statement too deeply nested, never an internal error."""

    async def run(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return await run_blocking(function, *args, **kwargs)
        except RecursionError:
            raise too_deep() from None

    return run


_ROUTE_CACHE_SIZE = 1024
_CACHEABLE_TEXT = 8192  # longer statements are routed and described each time
_INLINE_SPLIT = 4096  # longer query strings are split in a worker thread


class EngineCatalogAuth:
    """The engine, the shadow catalog and the authenticator, reached through the worker threads
    (`run_blocking`), with the routing and describing caches in front of them."""

    def __init__(
        self,
        engine: Engine,
        catalog: ShadowCatalog,
        run_blocking: RunBlocking,
        authenticator: Authenticator | None = None,
        *,
        database: str | None = None,
    ) -> None:
        self.engine = engine
        # The one database name this server answers to (ServerConfig.database): a startup packet
        # naming another is refused with 3D000, and current_database() returns it. None: any name.
        self.database = database
        self.catalog = catalog
        self.run_blocking = _refusing_deep_recursion(run_blocking)
        if authenticator is None:  # decoy credentials keyed by a secret kept in the ledger, if any
            secret = engine.ledger.secret("mock-credentials") if engine.ledger is not None else None
            authenticator = Authenticator(engine.policy, secret)
        self.authenticator = authenticator
        self.exposed = frozenset(t.name for t in engine.exposed_tables())
        self._routes: OrderedDict[str, Statement] = OrderedDict()
        self._descriptions: OrderedDict[tuple[str, tuple[Any, ...]], Any] = OrderedDict()
        # Called on the event loop's thread with each finished statement's record (metrics): each
        # must be cheap and must not raise.
        self.hooks: list[Callable[[StatementRecord], None]] = []

    def observe(self, record: StatementRecord) -> None:
        """A statement has finished (answered, refused or failed) and its answer was sent."""
        self.engine.audit(record)  # queued for the audit log's thread: the loop never waits
        for hook in self.hooks:
            hook(record)

    async def split(self, sql: str) -> list[str]:
        """The statements of a query string (a Query or a Parse message), refused (54001) past the
        length and number of tokens one may have (dpproxy.sql.limits), before it is split."""
        if len(sql) <= _INLINE_SPLIT:
            return split_statements(sql)
        return await self.run_blocking(checked_split, sql)  # type: ignore[no-any-return]

    async def route(self, sql: str) -> Statement:
        cached = self._routes.get(sql)
        if cached is not None:
            self._routes.move_to_end(sql)
            return cached
        statement: Statement = await self.run_blocking(route, sql, self.exposed)
        if len(sql) <= _CACHEABLE_TEXT:
            self._routes[sql] = statement
            if len(self._routes) > _ROUTE_CACHE_SIZE:
                self._routes.popitem(last=False)
        return statement

    async def describe(self, sql: str, parameter_types: tuple[Any, ...]) -> Any:
        key = (sql, parameter_types)
        cached = self._descriptions.get(key)
        if cached is not None:
            self._descriptions.move_to_end(key)
            return cached
        description = await self.run_blocking(self.engine.describe, sql, list(parameter_types))
        if len(sql) <= _CACHEABLE_TEXT:
            self._descriptions[key] = description
            if len(self._descriptions) > _ROUTE_CACHE_SIZE:
                self._descriptions.popitem(last=False)
        return description
