"""JSON-lines logs (`serve --log-format json`): every line a JSON object with time, level, logger,
message and process, and the session id and statement id of the statement being handled — also on
lines written in the worker threads a statement runs in — and never the statement's text.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dpproxy.audit import CURRENT, StatementRecord
from dpproxy.engine import Engine
from dpproxy.logs import configure
from dpproxy.wire.server import BackgroundServer, ServerConfig
from tests.wire.proxy import ALICE, REPO, Proxy, private_copy, start_serve, write_policy

FIELDS = {"time", "level", "logger", "message", "process", "session_id", "statement_id"}


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_lines_written_in_worker_threads_carry_the_statement(
    demo_duckdb: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    configure("json", "info")
    engine = Engine.open(write_policy(tmp_path / "policy.yaml"), private_copy(demo_duckdb, tmp_path), None)
    with BackgroundServer(engine, ServerConfig(port=0)) as server:
        record = StatementRecord(ALICE, "SELECT 1", session_id="feedc0de", statement_id=7)

        async def handled() -> None:  # what the session does: CURRENT set while the statement runs
            token = CURRENT.set(record)
            try:
                await server.server.run_blocking(
                    logging.getLogger("dpproxy.engine").warning, "in a worker thread"
                )
            finally:
                CURRENT.reset(token)

        asyncio.run_coroutine_threadsafe(handled(), server._loop).result(timeout=30)
        server.run(logging.getLogger("dpproxy.engine").warning, "outside any statement")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.strip()]
    inside = [line for line in lines if line["message"] == "in a worker thread"]
    outside = [line for line in lines if line["message"] == "outside any statement"]
    assert len(inside) == 1 and len(outside) == 1
    assert set(inside[0]) >= FIELDS
    assert (inside[0]["session_id"], inside[0]["statement_id"]) == ("feedc0de", 7)
    assert (outside[0]["session_id"], outside[0]["statement_id"]) == (None, None)
    assert inside[0]["level"] == "WARNING" and inside[0]["logger"] == "dpproxy.engine"


def test_serve_writes_json_lines_tagged_with_session_and_statement(demo_duckdb: Path, tmp_path: Path) -> None:
    import os

    policy = write_policy(tmp_path / "policy.yaml")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    args = ["--policy", str(policy), "--backend", private_copy(demo_duckdb, tmp_path)]
    args += ["--ledger", str(tmp_path / "ledger.sqlite"), "--database", "demo", "--workers", "1"]
    process, port = start_serve([*args, "--log-format", "json", "--log-level", "info"], env)
    try:
        with psycopg.connect(Proxy(port, None, "duckdb").dsn(), autocommit=True) as conn:  # type: ignore[arg-type]
            conn.execute("SELECT COUNT(*) FROM patients WHERE age > 41").fetchall()
            with pytest.raises(psycopg.Error):
                conn.execute("SELECT name FROM patients WHERE diagnosis = 'marker-7731'")
        process.terminate()
        assert process.wait(timeout=60) == 0
        assert process.stderr is not None
        err = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = [line for line in err.splitlines() if line.startswith("{")]
    records = [json.loads(line) for line in lines]
    statements = [r for r in records if r["logger"] == "dpproxy.statements"]
    assert [(r["kind"], r["status"], r["sqlstate"]) for r in statements] == [
        ("private", "ok", None),
        ("query", "refused", "42501"),
    ]
    for r in statements:
        assert set(r) >= FIELDS
        assert r["session_id"] and r["session_id"] == statements[0]["session_id"]
        assert r["process"] == process.pid
    assert [r["statement_id"] for r in statements] == [1, 2]
    assert "marker-7731" not in err  # the statement's text (and its constants) are never logged
