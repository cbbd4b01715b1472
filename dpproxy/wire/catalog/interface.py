"""What the session asks of the shadow catalog, and what it gets back.

The interface only: `ShadowCatalog`, the `SessionInfo` a query is answered for, and the
`CatalogResult` it produces. The implementation is shadow.py; nothing here knows DuckDB or SQL.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dpproxy.wire.types import WireColumn


@dataclass(frozen=True)
class SessionInfo:
    """What the catalog needs to know of the session asking."""

    user: str  # the analyst: current_user, session_user, the one login role in pg_roles
    database: str  # current_database(), the one row of pg_database
    application_name: str = ""
    backend_pid: int = 0
    # For current_setting() and pg_settings, over the defaults of dpproxy/wire/settings.py.
    settings: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CatalogResult:
    columns: tuple[WireColumn, ...]
    rows: list[tuple[Any, ...]]
    tag: str  # CommandComplete, e.g. "SELECT 3"


class ShadowCatalog(ABC):
    """Answers catalog and table-free queries. Thread-safe: called from worker threads."""

    @abstractmethod
    def execute(self, sql: str, params: Sequence[object], session: SessionInfo) -> CatalogResult:
        """Run one SELECT. `params` are Python values as decoded (str for text, lists for arrays);
        text the query needs as another type is converted as PostgreSQL would."""

    @abstractmethod
    def describe(
        self, sql: str, param_oids: Sequence[int], session: SessionInfo
    ) -> tuple[list[int], list[WireColumn]]:
        """(parameter type OIDs, result columns) of a statement, without running it.

        A parameter the client sent with OID 0 gets the type PostgreSQL would infer from its
        context, or text when nothing says otherwise."""

    @abstractmethod
    def close(self) -> None: ...
