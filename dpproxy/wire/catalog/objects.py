"""What the shadow holds beyond PostgreSQL's built-in catalog: the exposed tables, the roles and
the database, with the OIDs a fresh PostgreSQL would give them, and the server's version string.

Names and numbers only: nothing here reads the built-in catalog, builds the database or runs SQL.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpproxy.wire.settings import SERVER_VERSION
from dpproxy.wire.types import wire_type

if TYPE_CHECKING:
    from dpproxy.engine import ExposedTable

# version()'s answer.
VERSION_STRING = f"PostgreSQL {SERVER_VERSION} on x86_64-pc-linux-gnu, compiled by dpproxy"

BOOTSTRAP_ROLE_OID = 10  # "dpproxy": owns the database, the catalog and the exposed tables
OWNER_NAME = "dpproxy"
ANALYST_ROLE_OID = 16384  # the session's analyst, granted SELECT on the exposed tables only
DATABASE_OID = 16385
FIRST_TABLE_OID = 16386
TABLE_OID_STRIDE = 5  # relation, its array type, its row type: a fresh PostgreSQL's spacing
CATALOG_NAMESPACE_OID = 11
PUBLIC_NAMESPACE_OID = 2200


@dataclass(frozen=True)
class ShadowTable:
    """An exposed table as the shadow shows it, with the OIDs it was given."""

    name: str
    oid: int
    rowtype_oid: int
    arraytype_oid: int
    columns: tuple[tuple[str, int], ...]  # (column, pg_type OID)


def shadow_tables(exposed: Iterable[ExposedTable]) -> tuple[ShadowTable, ...]:
    """OIDs for the exposed tables in policy order: 16386, 16391, … as in a fresh PostgreSQL."""
    tables = []
    for i, table in enumerate(exposed):
        oid = FIRST_TABLE_OID + TABLE_OID_STRIDE * i
        columns = tuple((name, wire_type(pg_type).oid) for name, pg_type in table.columns)
        tables.append(ShadowTable(table.name, oid, oid + 2, oid + 1, columns))
    return tuple(tables)
