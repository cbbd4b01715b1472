"""The shadow catalog: catalog and table-free queries answered without the data (docs/architecture.md).

Clients browse a database before they query it: psql's \\dt and \\d, drivers' type lookups,
SQLAlchemy's Inspector, JDBC's DatabaseMetaData, BI tools' schema sync. dpproxy answers them here,
from an embedded, locked-down, in-memory DuckDB that holds only what the policy exposes: empty
tables named as the policy names them (schema `public`) and a PostgreSQL 15 catalog
(pg_catalog, information_schema) describing them. It holds no row of any exposed table, so no
statistic (reltuples, pg_stats, sizes) can describe real data, and no object outside the policy:
another table, schema, database or analyst of the real server does not exist here.

It must never query the data backend or the real database (the one exception: the exposed tables'
declared keys and indexes, read once at start by `open_catalog`), never hold a row of an exposed table,
and never show DuckDB's internals. Nor may it answer as if it had done what it cannot do: a
function that would act is refused by name with what to do instead, never answered with a made-up
value.

    interface    ShadowCatalog, SessionInfo, CatalogResult: what the session sees
    shadow       DuckDBShadowCatalog: the database, running a query, PostgreSQL's shape of results
    translator   PostgreSQL catalog SQL → SQL DuckDB runs
    typer        the names and types PostgreSQL would give a query's columns and parameters
    refusals     the functions refused by name (DuckDB's own, and PostgreSQL's that would act)
    functions    what PostgreSQL functions return and take, and name their columns
    pg_types     PostgreSQL types inside DuckDB, type names, array literals
    build        building the database: built-in rows, exposed tables, lookups, macros, views
    builtin      PostgreSQL 15's built-in catalog as dumped in data/pg15.json (by dump_pg15.py)
    objects      what the shadow holds beyond the built-in catalog: the exposed tables' OIDs, roles
    structure    the exposed tables' keys, NOT NULL columns and plain indexes: what is shown of them
    data/        pg15.json, macros.sql (functions as DuckDB macros), views.sql (computed relations)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpproxy.wire.catalog.interface import CatalogResult, SessionInfo, ShadowCatalog
from dpproxy.wire.catalog.objects import VERSION_STRING, shadow_tables
from dpproxy.wire.catalog.pg_types import parse_pg_array
from dpproxy.wire.catalog.shadow import DuckDBShadowCatalog, RegValue
from dpproxy.wire.catalog.structure import ExposedStructure, expose_structure, read_structure
from dpproxy.wire.settings import SERVER_VERSION

if TYPE_CHECKING:
    from dpproxy.engine import Engine


def open_catalog(engine: Engine) -> ShadowCatalog:
    """The shadow catalog of an engine's policy: its exposed tables' structure, never their data.

    Their keys, NOT NULL columns and plain indexes are read from the backing database here, once,
    through the engine's backend (structure.py says what is shown); nothing else ever is."""
    return DuckDBShadowCatalog(engine.exposed_tables(), structure=read_structure(engine))


__all__ = [
    "SERVER_VERSION",
    "VERSION_STRING",
    "CatalogResult",
    "DuckDBShadowCatalog",
    "ExposedStructure",
    "RegValue",
    "SessionInfo",
    "ShadowCatalog",
    "expose_structure",
    "open_catalog",
    "parse_pg_array",
    "shadow_tables",
]
