"""The proxies the wire tests share: one over DuckDB and one over PostgreSQL per test module, and
`proxy`, a test run once over each."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import yaml

from tests.wire.proxy import LockablePeople, Proxy, private_copy, running_proxy, write_policy


@pytest.fixture(scope="module")
def duck_proxy(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    tmp = tmp_path_factory.mktemp("wire-duck")
    backend = private_copy(demo_duckdb, tmp)
    with running_proxy(write_policy(tmp / "policy.yaml"), backend, tmp / "ledger.sqlite") as proxy:
        yield proxy


@pytest.fixture(scope="module")
def pg_proxy(demo_pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    tmp = tmp_path_factory.mktemp("wire-pg")
    with running_proxy(write_policy(tmp / "policy.yaml"), demo_pg_dsn, tmp / "ledger.sqlite") as proxy:
        yield proxy


@pytest.fixture(params=["duckdb", "postgres"])
def proxy(request: pytest.FixtureRequest) -> Proxy:
    return request.getfixturevalue("duck_proxy" if request.param == "duckdb" else "pg_proxy")


@pytest.fixture
def people(pg_cluster, tmp_path: Path) -> Iterator[LockablePeople]:
    from tests.conftest import create_database, drop_database

    name = create_database(pg_cluster, prefix="people")
    dsn = pg_cluster.dsn(name)
    try:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("CREATE TABLE people (person_id integer, age integer)")
            admin.execute("INSERT INTO people SELECT i, i % 90 FROM generate_series(1, 200) i")
        policy = write_policy(tmp_path / "people.yaml")
        spec = yaml.safe_load(policy.read_text())
        columns = {"person_id": {"type": "integer"}, "age": {"type": "integer", "lower": 0, "upper": 100}}
        spec["tables"] = {"people": {"privacy_unit": "person_id", "columns": columns}}
        policy.write_text(yaml.safe_dump(spec))
        yield LockablePeople(dsn, policy)
    finally:
        drop_database(pg_cluster, name)
