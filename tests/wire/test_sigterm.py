"""SIGTERM on `dpproxy serve`: a clean shutdown keeps the ledger exact, and a running query is
cancelled after the grace period.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import psycopg
import pytest

from dpproxy.engine import Engine
from tests.wire.proxy import (
    ALICE,
    REPO,
    LockablePeople,
    Proxy,
    notices_of,
    run_in_thread,
    start_serve,
    write_policy,
)

# --- SIGTERM: a clean shutdown keeps the ledger exact ------------------------------------------------------


def test_sigterm_finishes_cleanly_and_the_ledger_matches_answers(tmp_path: Path, demo_duckdb: Path) -> None:
    policy = write_policy(tmp_path / "policy.yaml")
    ledger = tmp_path / "ledger.sqlite"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    process, port = start_serve(
        [
            "--policy",
            str(policy),
            "--backend",
            str(demo_duckdb),
            "--ledger",
            str(ledger),
            "--shutdown-grace",
            "2",
        ],
        env,
    )
    try:
        reported = 0.0
        proxy = Proxy(port, None, "duckdb")  # type: ignore[arg-type]
        with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
            notices = notices_of(conn)
            for sql in (
                "SELECT COUNT(*) FROM patients",
                "SELECT AVG(age) FROM patients",
                "SELECT COUNT(*) FROM visits",
            ):
                conn.execute(sql)
            reported = sum(float(re.search(r"spent ε=([0-9.e-]+)", n)[1]) for n in notices)  # type: ignore[index]
            assert len(notices) == 3
            idle = psycopg.connect(proxy.dsn(), autocommit=True)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
            # The idle session was told why it is closed.
            with pytest.raises(psycopg.OperationalError):
                idle.execute("SELECT 1")
            idle.close()
    finally:
        if process.poll() is None:
            process.kill()
    with Engine.open(policy, None, ledger) as engine:
        assert engine.budget(ALICE).spent.epsilon == pytest.approx(reported)


def test_sigterm_cancels_a_running_query_after_the_grace_period(
    people: LockablePeople, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.sqlite"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    args = ["--policy", str(people.policy), "--backend", people.dsn, "--ledger", str(ledger)]
    # The clients of these tests connect to "demo"; serve answers to the backing database's name otherwise.
    process, port = start_serve([*args, "--shutdown-grace", "1", "--database", "demo"], env)
    try:
        proxy = Proxy(port, None, "postgres")  # type: ignore[arg-type]
        with people.locked(), psycopg.connect(proxy.dsn(), autocommit=True) as conn:
            worker, outcome = run_in_thread(conn, "SELECT COUNT(*) FROM people")
            people.wait_until_blocked()
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            worker.join(30)
            # Still blocked when the grace period ended: cancelled, and charged since it had started.
            assert isinstance(outcome.get("error"), psycopg.errors.QueryCanceled)
            assert process.wait(timeout=30) == 0
            assert time.monotonic() - started >= 1.0
    finally:
        if process.poll() is None:
            process.kill()
    with Engine.open(people.policy, None, ledger) as engine:
        assert engine.budget(ALICE).spent.epsilon == pytest.approx(0.5)
