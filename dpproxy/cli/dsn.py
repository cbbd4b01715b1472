"""What a backend address says and how it may be shown: the database name `serve` answers to by
default, and a DSN or Spark Connect URL with its password or token masked (never printed in clear).
"""

from __future__ import annotations

import os
import re
from pathlib import Path


def served_database(backend: str) -> str:
    """The database name `serve` answers to by default: the PostgreSQL DSN's dbname (else libpq's
    default, the user name), `spark` for a Spark Connect URL (which names no database), or a DuckDB
    file's name without its extension."""
    from dpproxy.backends import _PG_KEYWORDS, _PG_URL

    if _is_spark(backend):
        return SPARK_DATABASE

    if _PG_URL.match(backend) or _PG_KEYWORDS.search(backend):
        import getpass

        import psycopg

        try:
            params = psycopg.conninfo.conninfo_to_dict(backend)
        except psycopg.Error:
            params = {}
        return str(
            params.get("dbname")
            or os.environ.get("PGDATABASE")
            or params.get("user")
            or os.environ.get("PGUSER")
            or getpass.getuser()
        )
    return Path(backend.removeprefix("duckdb:")).stem


SPARK_DATABASE = "spark"  # what `serve --backend sc://…` answers to without --database


def _is_spark(backend: str) -> bool:
    return backend.strip().lower().startswith("sc://")


def _shown_backend(backend: str) -> str:
    """A backend DSN as it may be printed: a PostgreSQL password or a Spark token masked."""
    if _is_spark(backend):
        from dpproxy.backends.spark import mask_url

        return mask_url(backend)
    if _PG_DSN.match(backend) or "=" in backend:
        return mask_dsn(backend)
    return backend


_PG_DSN = re.compile(r"^postgres(ql)?://", re.IGNORECASE)


def mask_dsn(dsn: str) -> str:
    """A DSN as it may be shown: its password replaced by ***, whatever form it was written in."""
    import psycopg

    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "the PostgreSQL database (its DSN could not be parsed)"
    if "password" not in params:
        return dsn
    if _URL_PASSWORD.match(dsn):
        return _URL_PASSWORD.sub(r"\1***@", dsn, count=1)
    params["password"] = "***"
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


def mask_password(text: str, dsn: str) -> str:
    """`text` (a driver's error, which may quote the DSN) with the DSN's password replaced by ***."""
    from dpproxy.backends.postgres import mask_password as masked

    return masked(text, dsn)


_URL_PASSWORD = re.compile(r"^(postgres(?:ql)?://[^:@/]*:)[^@/]*@", re.IGNORECASE)
