"""Prometheus metrics for operators (`serve --metrics-port P`): what was asked and how it ended, how
long each stage took, sessions, backend connections, and each analyst's budget.

This module owns the metric names and labels, the hook that counts each finished statement (from its
`dpproxy.audit.StatementRecord`), the collector that reads budgets from the ledger at scrape time, and
the HTTP endpoint. With one process the metrics live in memory; with `--workers N`
(dpproxy.wire.workers) each worker writes its counters and gauges to prometheus_client's
multiprocess files in a private directory and the supervisor, which serves /metrics, sums them.

A label never holds a value read from the data or written by an analyst: labels are the statement's
kind and outcome, a SQLSTATE, a stage name, a connection state, and analyst names (from the policy).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dpproxy.audit import StatementRecord, Status

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from dpproxy.engine import Engine

__all__ = [
    "STAGES",
    "BudgetCollector",
    "Metrics",
    "MetricsEndpoint",
    "multiprocess_registry",
    "start_endpoint",
]

log = logging.getLogger("dpproxy.metrics")

STAGES = ("plan", "backend", "noise", "wire")  # StatementRecord.stages
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_KIND = re.compile(r"^[a-z_]{1,32}$")
_SQLSTATE = re.compile(r"^[0-9A-Z]{5}$")
POOL_STATES = ("in_use", "idle", "waiting")


def _kind(text: str) -> str:
    return text if _KIND.match(text) else "other"


class Metrics:
    """The counters, histograms and gauges one server process updates. In a worker process started
    with PROMETHEUS_MULTIPROC_DIR set, prometheus_client writes them to files the supervisor reads."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.statements = Counter(
            "dpproxy_statements",
            "Statements analysts sent, by kind and outcome (ok, refused, failed).",
            ["kind", "status"],
            registry=r,
        )
        self.errors = Counter(
            "dpproxy_statement_errors",
            "Statements answered with an error, by outcome (refused: before any data was read; "
            "failed: after) and SQLSTATE.",
            ["status", "sqlstate"],
            registry=r,
        )
        self.stage_seconds = Histogram(
            "dpproxy_stage_seconds",
            "Seconds each statement spent in each stage: plan (parse, analyse, rewrite, plan the noise), "
            "backend, noise (release and post-processing), wire (encoding and sending).",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.statement_seconds = Histogram(
            "dpproxy_statement_seconds",
            "Seconds from a statement's arrival to its answer, by kind.",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.sessions = Gauge(
            "dpproxy_sessions",
            "Authenticated client connections.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.backend_connections = Gauge(
            "dpproxy_backend_connections",
            "Connections to the backing database by state: in_use, idle, waiting (callers queued for one). "
            "PostgreSQL: the pool; DuckDB: its cursors.",
            ["state"],
            registry=r,
            multiprocess_mode="livesum",
        )

    def observe(self, record: StatementRecord) -> None:
        """Count one finished statement (an EngineCatalogAuth hook: cheap, never raises)."""
        try:
            kind = _kind(record.kind or "unknown")
            self.statements.labels(kind, record.status.value).inc()
            if record.status is not Status.OK:
                sqlstate = (
                    record.sqlstate if record.sqlstate and _SQLSTATE.match(record.sqlstate) else "other"
                )
                self.errors.labels(record.status.value, sqlstate).inc()
            for stage, seconds in record.stages.items():
                if stage in STAGES:
                    self.stage_seconds.labels(stage).observe(seconds)
            if record.duration is not None:
                self.statement_seconds.labels(kind).observe(record.duration)
        except Exception as error:  # metrics must never break a session
            log.error("could not count a statement in the metrics: %s", type(error).__name__)

    def backend_usage(self, usage: dict[str, int]) -> None:
        """Set the backend connection gauges from Backend.usage()."""
        for state in POOL_STATES:
            self.backend_connections.labels(state).set(usage.get(state, 0))


class BudgetCollector(Collector):
    """Each analyst's budget, read from the ledger at scrape time, as `dpproxy budget show` computes it:
    ε spent (ρ converted at the analyst's δ under zCDP), ε left, the ε budget, δ spent and δ budget.

    `engine()` gives the engine whose policy names the analysts (it changes on a policy reload)."""

    def __init__(self, engine: Callable[[], Engine | None]) -> None:
        self._engine = engine

    def collect(self) -> Iterator[GaugeMetricFamily]:
        engine = self._engine()
        if engine is None or engine.ledger is None:
            return
        families = {
            "spent": GaugeMetricFamily(
                "dpproxy_budget_epsilon_spent",
                "ε spent by each analyst (as `dpproxy budget show`).",
                labels=["analyst"],
            ),
            "left": GaugeMetricFamily(
                "dpproxy_budget_epsilon_remaining", "ε left to each analyst.", labels=["analyst"]
            ),
            "limit": GaugeMetricFamily(
                "dpproxy_budget_epsilon_limit", "Each analyst's ε budget.", labels=["analyst"]
            ),
            "delta": GaugeMetricFamily(
                "dpproxy_budget_delta_spent", "δ spent by each analyst.", labels=["analyst"]
            ),
            "delta_limit": GaugeMetricFamily(
                "dpproxy_budget_delta_limit", "Each analyst's δ budget.", labels=["analyst"]
            ),
        }
        try:
            statuses = [engine.budget(analyst.name) for analyst in engine.policy.analysts]
            shared = engine.data_set_budget()  # labelled analyst="*": all analysts together
            for status in [*statuses, *([shared] if shared is not None else [])]:
                families["spent"].add_metric([status.analyst], status.epsilon_spent)
                families["left"].add_metric([status.analyst], status.remaining.epsilon)
                families["limit"].add_metric([status.analyst], status.limit.epsilon)
                families["delta"].add_metric([status.analyst], status.spent.delta)
                families["delta_limit"].add_metric([status.analyst], status.limit.delta)
        except Exception as error:  # an unreachable ledger: the other metrics are still served
            log.warning("could not read the budgets from the ledger: %s", type(error).__name__)
            return
        yield from families.values()


def multiprocess_registry(directory: str) -> CollectorRegistry:
    """The supervisor's registry: the sum of every worker's metrics files in `directory`."""
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)
    return registry


class MetricsEndpoint:
    """The HTTP server answering GET /metrics (prometheus_client's, on its own daemon thread)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_endpoint(registry: CollectorRegistry, host: str, port: int) -> MetricsEndpoint:
    """Serve `registry` on http://host:port/metrics (port 0: a free port, see .port)."""
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsEndpoint(server, thread)
