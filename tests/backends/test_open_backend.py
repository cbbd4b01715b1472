"""Opening a backend from a DSN: the forms accepted, and what an unknown or missing one gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dpproxy.backends import BackendUnreachable, open_backend
from dpproxy.backends.postgres import PostgresBackend


def test_open_backend_rejects_unknown_forms_with_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match="postgresql://") as caught:
        open_backend("mysql://root:secret@db/app")
    assert "duckdb:" in str(caught.value)
    assert "secret" not in str(caught.value)


def test_open_backend_missing_duckdb_file(tmp_path: Path) -> None:
    with pytest.raises(BackendUnreachable):
        open_backend(str(tmp_path / "missing.duckdb"))
    assert not (tmp_path / "missing.duckdb").exists()


def test_open_backend_libpq_keyword_string(pg_cluster: Any) -> None:
    dsn = f"host={pg_cluster.host} port={pg_cluster.port} user={pg_cluster.superuser} dbname=postgres"
    with open_backend(dsn) as backend:
        assert isinstance(backend, PostgresBackend)
        assert backend.run("SELECT 1 + 1") == [(2,)]
