"""Fixtures of the ledger tests: `store` (parametrised over SQLite and PostgreSQL) and `ledger`."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpproxy.budget import Ledger
from tests.budget.stores import Store
from tests.conftest import PgCluster, create_database, drop_database


@pytest.fixture(scope="package")
def ledger_database(pg_cluster: PgCluster) -> Iterator[str]:
    """One database for this package's store tests (a fresh one per test would cost half a second each)."""
    name = create_database(pg_cluster, prefix="ledger")
    try:
        yield pg_cluster.dsn(name)
    finally:
        drop_database(pg_cluster, name)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        opened = Store("sqlite", str(tmp_path / "ledger.sqlite3"))
    else:
        # A table of its own (and so advisory lock keys of its own): tests share the database.
        opened = Store(
            "postgres", request.getfixturevalue("ledger_database"), f"ledger_{uuid.uuid4().hex[:10]}"
        )
    yield opened
    opened.close_all()


@pytest.fixture
def ledger(store: Store) -> Ledger:
    return store.open()
