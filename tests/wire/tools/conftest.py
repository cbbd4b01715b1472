"""Fixtures for the BI-tool replay tests: one dpproxy wire server per backend (the demo data on
DuckDB and on PostgreSQL) for the whole package, the truth about the demo data, and ToolReplay.java
compiled once against Debian's pgjdbc.

The servers, the policy (budgets large enough for every tool's sequence, replay of repeats off so
each query's charge shows) and the truth come from tests/wire/test_clients.py: these tests add the
SQL the tools send, not another way of serving.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.wire.test_clients import (
    Served,
    Truth,
    compile_with_pgjdbc,
    compute_truth,
    serving,
)

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def tools_truth(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory) -> Truth:
    return compute_truth(demo_duckdb, tmp_path_factory.mktemp("tools-truth"))


@pytest.fixture(scope="session")
def tools_duck(
    demo_duckdb: Path, tools_truth: Truth, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("tools-duck")
    backend = directory / "demo.duckdb"  # a copy: demo_pg_dsn holds the shared file open
    shutil.copyfile(demo_duckdb, backend)
    with serving(str(backend), "duckdb", directory, tools_truth) as served:
        yield served


@pytest.fixture(scope="session")
def tools_pg(
    demo_pg_dsn: str, tools_truth: Truth, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    with serving(demo_pg_dsn, "postgres", tmp_path_factory.mktemp("tools-pg"), tools_truth) as served:
        yield served


@pytest.fixture(params=["duckdb", "postgres"])
def served(request: pytest.FixtureRequest) -> Served:
    """The demo served over each backend: every tool test runs on both."""
    return request.getfixturevalue("tools_duck" if request.param == "duckdb" else "tools_pg")


@pytest.fixture(scope="session")
def replay_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ToolReplay.java compiled once per session against Debian's pgjdbc."""
    return compile_with_pgjdbc(HERE / "ToolReplay.java", tmp_path_factory.mktemp("tool-replay-classes"))
