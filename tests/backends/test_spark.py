"""The Spark backend against a real local Spark Connect server: cancel and time limits that stop the
Spark job, a wrong token and an unreachable server at startup, a missing table, result types, the
token kept out of every message and log line, and only SELECT sent.

All tests share the session's server (`spark_server`, marked SPARK); the slow queries read views of a
three-way cross join of 2000 rows (8e9 rows: minutes on the test server), created once in the Spark
database `slow_tests`, so that a cancel or a time limit is what ends them.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import socket
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from sqlglot import exp

from dpproxy.backends import (
    USER_REQUEST,
    BackendError,
    BackendUnreachable,
    Cancellation,
    QueryCancelled,
    open_backend,
)
from dpproxy.backends.spark import SparkBackend, connect_session
from dpproxy.cli import main, spark_demo_policy
from dpproxy.engine import Engine
from dpproxy.errors import PolicyError, QueryCanceled
from dpproxy.sql.public import backend_sql
from dpproxy.sql.rowexpr.typed import typed_node
from dpproxy.sql.types import PgType
from tests.conftest import SPARK, SparkServer

pytestmark = SPARK

SLOW_DATABASE = "slow_tests"
PEOPLE_COLUMNS = {"person_id": {"type": "integer"}, "age": {"type": "integer", "lower": 0, "upper": 100}}


@pytest.fixture(scope="module")
def slow_url(spark_server: SparkServer) -> str:
    """The server's URL, with `slow_tests.people` (2000 rows) and the endless `slow`, `slow_public`."""
    session = connect_session(spark_server.url)
    try:
        session.sql(f"CREATE DATABASE IF NOT EXISTS {SLOW_DATABASE}").collect()
        session.sql(
            f"CREATE OR REPLACE VIEW {SLOW_DATABASE}.people AS SELECT CAST(id AS INT) AS person_id, "
            "CAST(id % 90 AS INT) AS age FROM range(2000)"
        ).collect()
        for name, columns in (("slow", "a.person_id, b.age"), ("slow_public", "a.age")):
            session.sql(
                f"CREATE OR REPLACE VIEW {SLOW_DATABASE}.{name} AS SELECT {columns} FROM "
                f"{SLOW_DATABASE}.people a, {SLOW_DATABASE}.people b, {SLOW_DATABASE}.people c"
            ).collect()
    finally:
        session.stop()
    return spark_server.url


def slow_policy(path: Path) -> Path:
    table = {"schema": SLOW_DATABASE, "privacy_unit": "person_id", "columns": PEOPLE_COLUMNS}
    spec = {
        "version": 1,
        "defaults": {"replay": False},
        "analysts": {"alice": {"epsilon": 10, "delta": 1.0e-5}},
        "tables": {
            "people": table,
            "slow": table,
            "slow_public": {"public": True, "schema": SLOW_DATABASE},
        },
    }
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture
def slow_engine(slow_url: str, tmp_path: Path) -> Iterator[Engine]:
    with Engine.open(slow_policy(tmp_path / "policy.yaml"), slow_url, tmp_path / "ledger.sqlite") as engine:
        yield engine


ENDLESS = f"SELECT COUNT(*) FROM {SLOW_DATABASE}.slow"


def cancelled_jobs(server: SparkServer) -> int:
    """How many Spark tasks the server log says were killed because their job was cancelled."""
    return server.log.read_text(errors="replace").count("SPARK_JOB_CANCELLED")


def started_jobs(server: SparkServer) -> int:
    return server.log.read_text(errors="replace").count("DAGScheduler: Got job")


class TimedCancellation(Cancellation):
    """A Cancellation that notes when it was fired (`fired_at`, time.monotonic)."""

    fired_at: float | None = None

    def cancel(self, reason: str = USER_REQUEST, hint: str | None = None) -> None:
        self.fired_at = self.fired_at or time.monotonic()
        super().cancel(reason, hint)


def cancel_once_running(server: SparkServer) -> TimedCancellation:
    """A Cancellation fired once the server has started a new Spark job (so that the cancel has a
    running job to stop, not only a query being planned)."""
    cancel, before = TimedCancellation(), started_jobs(server)

    def fire() -> None:
        assert wait_for(lambda: started_jobs(server) > before, 60), "the Spark job never started"
        cancel.cancel()

    threading.Thread(target=fire, daemon=True).start()
    return cancel


def wait_for(condition: object, seconds: float = 15) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


# --- cancel and time limits ---------------------------------------------------------------------


def test_a_cancel_interrupts_the_spark_job(slow_url: str, spark_server: SparkServer) -> None:
    with open_backend(slow_url, statement_timeout_s=0) as backend:
        killed_before = cancelled_jobs(spark_server)
        cancel = cancel_once_running(spark_server)
        with pytest.raises(QueryCancelled) as caught:
            backend.run(ENDLESS, cancel=cancel)
        assert caught.value.started and caught.value.reason == "user request"
        assert cancel.fired_at is not None and time.monotonic() - cancel.fired_at < 10
        # interruptTag cancelled the job on the server: its tasks were killed, not left running.
        assert wait_for(lambda: cancelled_jobs(spark_server) > killed_before)
        assert backend.run("SELECT 1") == [(1,)]


def test_a_cancelled_private_query_is_57014_and_stays_charged(
    slow_engine: Engine, spark_server: SparkServer
) -> None:
    cancel = cancel_once_running(spark_server)
    with pytest.raises(QueryCanceled) as caught:
        slow_engine.execute("SELECT COUNT(*) FROM slow", analyst="alice", cancel=cancel)
    assert caught.value.sqlstate == "57014"
    assert (
        caught.value.message == "canceling statement due to user request; its privacy cost has been charged"
    )
    assert slow_engine.budget("alice").spent.epsilon == pytest.approx(0.5)
    # A cancel before the query is sent: nothing reached the data, nothing is charged.
    early = Cancellation()
    early.cancel()
    with pytest.raises(QueryCanceled) as caught:
        slow_engine.execute("SELECT COUNT(*) FROM people", analyst="alice", cancel=early)
    assert caught.value.message.endswith("nothing was charged")
    assert slow_engine.budget("alice").spent.epsilon == pytest.approx(0.5)


def test_the_backend_time_limit_stops_spark_queries_with_57014(slow_url: str, tmp_path: Path) -> None:
    backend = open_backend(slow_url, statement_timeout_s=0.8)
    assert isinstance(backend, SparkBackend)
    with Engine.open(slow_policy(tmp_path / "policy.yaml"), backend, tmp_path / "ledger.sqlite") as engine:
        started = time.monotonic()
        with pytest.raises(QueryCanceled) as caught:
            engine.execute("SELECT COUNT(*) FROM slow", analyst="alice")
        assert time.monotonic() - started < 10
        assert caught.value.sqlstate == "57014"
        assert caught.value.message == (
            "canceling statement due to dpproxy's time limit on backend queries (0.8 s); "
            "its privacy cost has been charged"
        )
        assert "dpproxy serve --backend-timeout" in (caught.value.hint or "")
        assert engine.budget("alice").spent.epsilon == pytest.approx(0.5)
        # A public query is stopped the same way, with nothing to charge.
        with pytest.raises(QueryCanceled) as caught:
            engine.execute("SELECT COUNT(*) FROM slow_public", analyst="alice")
        assert caught.value.message == (
            "canceling statement due to dpproxy's time limit on backend queries (0.8 s)"
        )
        assert engine.budget("alice").spent.epsilon == pytest.approx(0.5)


# --- startup failures -----------------------------------------------------------------------------


def serve(tmp_path: Path, backend: str) -> tuple[int, str, float]:
    """`dpproxy serve` over the Spark demo policy: its exit status, all it printed, and its time."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(spark_demo_policy("demo"))
    started = time.monotonic()
    result = CliRunner().invoke(
        main,
        ["serve", "--policy", str(policy), "--backend", backend, "--port", "0",
         "--ledger", str(tmp_path / "ledger.sqlite")],
    )  # fmt: skip
    return result.exit_code, result.stdout + result.stderr, time.monotonic() - started


def test_a_wrong_token_fails_startup_without_showing_it(
    spark_server: SparkServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "not-the-token-4b1d"
    with pytest.raises(BackendUnreachable) as caught:
        open_backend(spark_server.url_with(token=wrong))
    message = str(caught.value)
    assert message.startswith(f"could not connect to Spark Connect server at localhost:{spark_server.port}: ")
    assert "the server refused the token" in message and "Invalid authentication token" in message
    code, printed, _ = serve(tmp_path, spark_server.url_with(token=wrong))
    assert code == 1
    assert (
        printed.startswith("ERROR 08006: could not connect to Spark Connect server")
        and "refused the token" in printed
    )
    # No token at all: refused the same way.
    with pytest.raises(BackendUnreachable, match="No authentication token provided"):
        open_backend(spark_server.url_with())
    for text in (message, printed, caplog.text):
        assert wrong not in text and spark_server.token not in text


def test_an_unreachable_server_fails_fast(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        url = f"sc://localhost:{port}/;token=secret-token-77"
        started = time.monotonic()
        with pytest.raises(BackendUnreachable) as caught:
            open_backend(url)
        assert time.monotonic() - started < 5
        assert str(caught.value).startswith(
            f"could not connect to Spark Connect server at localhost:{port}: no Spark Connect server answered"
        )
        code, printed, seconds = serve(tmp_path, url)
    assert code == 1 and seconds < 8
    assert "ERROR 08006: could not connect to Spark Connect server" in printed
    assert "secret-token-77" not in str(caught.value) + printed
    assert "Traceback" not in printed and "RETRIES_EXCEEDED" not in printed


def test_a_missing_table_is_named_at_startup(spark_demo_url: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(spark_demo_policy("demo").replace("  visits:\n", "  visit_log:\n"))
    with pytest.raises(PolicyError) as caught:
        Engine.open(policy, spark_demo_url, None)
    assert caught.value.sqlstate == "F0000"
    assert "visit_log" in caught.value.message and "against the backend" in caught.value.message


# --- results --------------------------------------------------------------------------------------


def test_result_types_are_the_python_values_of_every_backend(spark_server: SparkServer) -> None:
    with open_backend(spark_server.url) as backend:
        rows = backend.run(
            "SELECT CAST('12345678901234567890.123456789' AS DECIMAL(38,9)) AS exact, "
            "CAST('98765432109876543210987' AS DECIMAL(38,0)) AS whole, CAST(7 AS BIGINT) AS n, 0.25D AS f, "
            "DATE'2024-02-29' AS d, TIMESTAMP'2024-02-29 23:59:59.123456' AS instant, "
            "TIMESTAMP_NTZ'2024-02-29 23:59:59.123456' AS local, true AS yes, CAST(NULL AS DECIMAL(10,2)) AS none, "
            "CAST(NULL AS INT) AS no_int, 'é' AS text"
        )
    assert rows == [
        (
            Decimal("12345678901234567890.123456789"),
            98765432109876543210987,
            7,
            0.25,
            dt.date(2024, 2, 29),
            dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=dt.UTC),
            dt.datetime(2024, 2, 29, 23, 59, 59, 123456),
            True,
            None,
            None,
            "é",
        )
    ]
    row = rows[0]
    assert type(row[1]) is int and type(row[2]) is int and type(row[0]) is Decimal and type(row[7]) is bool


def test_decimal_arithmetic_keeps_its_scale_as_on_the_other_backends(spark_server: SparkServer) -> None:
    # Spark's default would cut the product's scale to 6 places (0.000000): PostgreSQL and DuckDB
    # give 1E-8, and a WHERE y * y > 0 counted other rows on Spark.
    with open_backend(spark_server.url) as backend:
        rows = backend.run(
            "SELECT CAST('0.0001' AS DECIMAL(38,10)) * CAST('0.0001' AS DECIMAL(38,10)) AS product, "
            "CAST('0.0000000004' AS DECIMAL(38,10)) + CAST('0.0000000004' AS DECIMAL(38,10)) AS total"
        )
    assert rows == [(Decimal("1E-8"), Decimal("8E-10"))]


def test_floor_ceil_and_sign_of_doubles_mean_what_postgresql_means(spark_server: SparkServer) -> None:
    # Spark's FLOOR and CEIL of a double are BIGINTs (NaN became 0, 1e19 was capped) and its SIGN
    # of NaN is NaN: spelled for Spark (dpproxy.sql.numbers), they give PostgreSQL's doubles.
    def double(text: str) -> exp.Expression:
        return typed_node(
            exp.Cast(this=exp.Literal.string(text), to=exp.DataType.build("DOUBLE")), PgType.FLOAT8
        )

    columns = []
    for value in ("NaN", "1e19", "-2.5", "Infinity"):
        for function in (exp.Floor, exp.Ceil, exp.Sign):
            columns.append(typed_node(function(this=double(value)), PgType.FLOAT8))
    sql = backend_sql(exp.select(*columns), "spark")
    with open_backend(spark_server.url) as backend:
        [row] = backend.run(sql)
    expected = [math.nan, math.nan, 0.0, 1e19, 1e19, 1.0, -3.0, -2.0, -1.0, math.inf, math.inf, 1.0]
    assert [repr(float(v)) for v in row] == [repr(v) for v in expected]


# --- what the backend sends, and what it lets out -------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TABLE {db}.stolen AS SELECT 1 AS x",
        "INSERT INTO {db}.people_copy SELECT 1",
        "DROP VIEW {db}.people",
        "SELECT 1; CREATE TABLE {db}.stolen (x INT)",
        "SET spark.sql.ansi.enabled=false",
    ],
)
def test_only_one_select_is_sent(slow_url: str, sql: str) -> None:
    with open_backend(slow_url) as backend:
        with pytest.raises(BackendError, match="exactly one SELECT"):
            backend.run(sql.format(db=SLOW_DATABASE))
        assert set(backend.tables(SLOW_DATABASE)) == {"people", "slow", "slow_public"}
        assert backend.run("SELECT current_timezone(), 1 = 1") == [("UTC", True)]


def test_spark_errors_print_nothing_and_never_the_token(
    spark_server: SparkServer, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    with open_backend(spark_server.url) as backend:
        for sql in ("SELECT * FROM demo.no_such_table", "SELECT raise_error('secret value 42')"):
            with pytest.raises(BackendError) as caught:
                backend.run(sql)
            assert spark_server.token not in str(caught.value)
            assert len(str(caught.value).splitlines()) == 1  # one line for the operator, no stack trace
    out, err = capfd.readouterr()
    for text in (out, err, caplog.text):
        assert spark_server.token not in text
        assert "secret value 42" not in text and "JVM stacktrace" not in text and "Traceback" not in text


def test_only_the_channels_own_failure_to_connect_counts_as_unreachable() -> None:
    """An unreachable server's query is not charged, so the classification must not read the data:
    an error whose text quotes "Connection refused" or "UNAVAILABLE" (a value in a failing query's
    message) is the query's failure, charged; so is an UNAVAILABLE that may come after the query ran."""
    import enum

    from dpproxy.backends.spark import _unreachable

    class Code(enum.Enum):
        UNAVAILABLE = 14
        INTERNAL = 13
        UNAUTHENTICATED = 16

    class Grpc(Exception):
        def __init__(self, code: Code, text: str) -> None:
            super().__init__(text)
            self.status = code

        def getGrpcStatusCode(self) -> Code:  # pyspark's name
            return self.status

    down = Grpc(Code.UNAVAILABLE, "failed to connect to all addresses; last error: Connection refused")
    assert _unreachable(down) and _unreachable(Grpc(Code.UNAUTHENTICATED, "bad token"))
    retried = RuntimeError("[RETRIES_EXCEEDED] The maximum number of retries has been exceeded.")
    retried.__cause__ = down
    assert _unreachable(retried)
    assert not _unreachable(retried, sent=True)  # the query may have run before the server went away
    assert _unreachable(Grpc(Code.UNAUTHENTICATED, "bad token"), sent=True)
    for charged in (
        Grpc(Code.INTERNAL, "value 'Connection refused UNAVAILABLE failed to connect' is not a number"),
        Grpc(Code.UNAVAILABLE, "Socket closed"),  # the server went away, perhaps while running it
        RuntimeError("UNAVAILABLE: failed to connect to all addresses"),  # text alone
    ):
        assert not _unreachable(charged)
