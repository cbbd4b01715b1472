"""Prometheus metrics (`serve --metrics-port`): scraped over HTTP and parsed as Prometheus parses them.

What an operator would notice: the statement counters match what clients sent (by kind and outcome),
refusals are counted by SQLSTATE, each stage's latency histogram fills, the sessions gauge follows the
connections, the backend connection gauges are there, and each analyst's budget gauges equal what
`dpproxy budget show` prints — in one process and summed over `--workers 2`.
"""

from __future__ import annotations

import contextlib
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dpproxy.audit import StatementRecord, Status
from dpproxy.cli import main
from dpproxy.engine import Engine
from dpproxy.metrics import BudgetCollector, Metrics, start_endpoint
from dpproxy.privacy import Cost
from dpproxy.wire.server import BackgroundServer, ServerConfig
from tests.wire.proxy import ALICE, REPO, Proxy, private_copy, start_serve, write_policy

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of a scrape, by (name, sorted labels)."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        return parse(response.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def budget_show(policy: Path, ledger: str) -> dict[str, tuple[float, float]]:
    """(ε spent, ε left) per analyst, as `dpproxy budget show` prints them."""
    result = CliRunner().invoke(main, ["budget", "show", "--policy", str(policy), "--ledger", ledger])
    assert result.exit_code == 0, result.output
    shown = {}
    for line in result.output.splitlines()[2:-1]:
        cells = [cell.strip() for cell in line.split("|")]
        shown[cells[0]] = (float(cells[1]), float(cells[2]))
    return shown


def assert_budgets_match(samples: Samples, policy: Path, ledger: str) -> None:
    shown = budget_show(policy, ledger)
    assert set(shown) == {"alice", "bob"}
    for analyst, (spent, left) in shown.items():
        # budget show rounds to six significant digits (spent up, left down).
        assert value(samples, "dpproxy_budget_epsilon_spent", analyst=analyst) == pytest.approx(
            spent, rel=1e-5
        )
        assert value(samples, "dpproxy_budget_epsilon_remaining", analyst=analyst) == pytest.approx(
            left, rel=1e-5
        )
    assert value(samples, "dpproxy_budget_epsilon_spent", analyst=ALICE) > 0


def send_some_statements(proxy: Proxy) -> None:
    """3 private answers (distinct, none replayed), 2 refusals of raw rows (42501), 1 syntax error."""
    with proxy.connect(autocommit=True) as conn:
        for age in (30, 40, 50):
            conn.execute("SELECT COUNT(*) FROM patients WHERE age > %s", (age,)).fetchall()
        for _ in range(2):
            with pytest.raises(psycopg.Error) as refused:
                conn.execute("SELECT * FROM patients")
            assert refused.value.sqlstate == "42501"
        with pytest.raises(psycopg.Error) as syntax:
            conn.execute("SELEC 1")
        assert syntax.value.sqlstate == "42601"


def assert_counts(samples: Samples) -> None:
    assert value(samples, "dpproxy_statements_total", kind="private", status="ok") == 3
    refused = sum(
        v
        for (name, labels), v in samples.items()
        if name == "dpproxy_statements_total" and ("status", "refused") in labels
    )
    assert refused == 3
    assert value(samples, "dpproxy_statement_errors_total", status="refused", sqlstate="42501") == 2
    assert value(samples, "dpproxy_statement_errors_total", status="refused", sqlstate="42601") == 1
    for stage in ("plan", "backend", "noise", "wire"):
        assert value(samples, "dpproxy_stage_seconds_count", stage=stage) >= 3, stage
    assert value(samples, "dpproxy_statement_seconds_count", kind="private") == 3
    assert value(samples, "dpproxy_statement_seconds_bucket", kind="private", le="+Inf") == 3


@contextlib.contextmanager
def proxy_with_metrics(policy: Path, backend: str, ledger: Path) -> Iterator[tuple[Proxy, int]]:
    engine = Engine.open(policy, backend, ledger)
    metrics = Metrics()
    server = BackgroundServer(engine, ServerConfig(port=0), metrics=metrics)
    server.start()
    metrics.registry.register(BudgetCollector(lambda: server.server.engine))
    endpoint = start_endpoint(metrics.registry, "127.0.0.1", 0)
    try:
        yield (
            Proxy(server.port, engine, "postgres" if backend.startswith("postgres") else "duckdb"),
            endpoint.port,
        )
    finally:
        endpoint.close()
        server.stop()


@pytest.mark.parametrize("backend_kind", ["duckdb", "postgres"])
def test_scraped_metrics_count_what_clients_sent(
    backend_kind: str, demo_duckdb: Path, demo_pg_dsn: str, tmp_path: Path
) -> None:
    policy = write_policy(tmp_path / "policy.yaml")
    backend = private_copy(demo_duckdb, tmp_path) if backend_kind == "duckdb" else demo_pg_dsn
    ledger = tmp_path / "ledger.sqlite"
    with proxy_with_metrics(policy, backend, ledger) as (proxy, port):
        assert value(scrape(port), "dpproxy_statements_total", kind="private", status="ok") == 0
        send_some_statements(proxy)
        with proxy.connect(autocommit=True), proxy.connect(autocommit=True):
            samples = scrape(port)
            assert value(samples, "dpproxy_sessions") == 2
        assert_counts(samples)
        assert_budgets_match(samples, policy, str(ledger))
        # The backend's connections: PostgreSQL's pool, DuckDB's cursors (read once a second).
        usage = {
            s: value(samples, "dpproxy_backend_connections", state=s) for s in ("in_use", "idle", "waiting")
        }
        assert usage["in_use"] == 0 and usage["waiting"] == 0
        assert usage["idle"] >= 1
        assert value(scrape(port), "dpproxy_sessions") == 0


def test_labels_never_carry_what_an_analyst_wrote() -> None:
    """Kinds and SQLSTATEs are closed sets: anything else is counted as `other`."""
    metrics = Metrics()
    record = StatementRecord(
        ALICE, "SELECT 1", kind="weird kind; DROP", status=Status.REFUSED, sqlstate="x'; --"
    )
    record.cost = Cost(0.0)
    record.finish()
    metrics.observe(record)
    samples = parse(generate_latest(metrics.registry).decode())
    assert value(samples, "dpproxy_statements_total", kind="other", status="refused") == 1
    assert value(samples, "dpproxy_statement_errors_total", status="refused", sqlstate="other") == 1
    assert "DROP" not in generate_latest(metrics.registry).decode()


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def test_workers_metrics_are_summed_over_every_worker(demo_pg_dsn: str, tmp_path: Path) -> None:
    from tests.wire.test_workers import WORKERS, connections_on_every_worker

    policy = write_policy(tmp_path / "policy.yaml")
    ledger = str(tmp_path / "ledger.sqlite")
    args = ["--policy", str(policy), "--backend", demo_pg_dsn, "--ledger", ledger, "--database", "demo"]
    process, port = start_serve(
        [*args, "--workers", str(WORKERS), "--shutdown-grace", "1", "--metrics-port", "0"], _env()
    )
    try:
        assert process.stdout is not None
        match = re.search(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", process.stdout.readline())
        assert match is not None
        metrics_port = int(match[1])
        proxy = Proxy(port, None, "postgres")  # type: ignore[arg-type]
        connections = connections_on_every_worker(proxy, 2)
        assert value(scrape(metrics_port), "dpproxy_sessions") == 2 * WORKERS
        for number, conn in enumerate(connections):  # every worker answers some
            conn.execute("SELECT COUNT(*) FROM patients WHERE age > %s", (number,)).fetchall()
            with pytest.raises(psycopg.Error):
                conn.execute("SELECT * FROM patients")
        for conn in connections:
            conn.close()
        samples = scrape(metrics_port)
        assert value(samples, "dpproxy_statements_total", kind="private", status="ok") == len(connections)
        assert value(samples, "dpproxy_statement_errors_total", status="refused", sqlstate="42501") == len(
            connections
        )
        assert value(samples, "dpproxy_statement_seconds_count", kind="private") == len(connections)
        # Each worker's pool holds at least one idle connection; the gauges are summed over workers,
        # each read once a second in its worker (a scrape may come before a worker's first reading).
        idle = value(samples, "dpproxy_backend_connections", state="idle")
        for _ in range(50):
            if idle >= WORKERS:
                break
            time.sleep(0.1)
            idle = value(scrape(metrics_port), "dpproxy_backend_connections", state="idle")
        assert idle >= WORKERS
        assert_budgets_match(samples, policy, ledger)
        deadline_samples = samples
        for _ in range(50):  # sessions end as the workers see the connections close
            deadline_samples = scrape(metrics_port)
            if value(deadline_samples, "dpproxy_sessions") == 0:
                break
            time.sleep(0.1)
        assert value(deadline_samples, "dpproxy_sessions") == 0
        process.terminate()
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
