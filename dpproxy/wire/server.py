"""The wire server: asyncio accept loop, TLS negotiation, cancel requests, timeouts and shutdown.

This module owns sockets and threads: it reads bytes, frames them with the codec, feeds them to
one Session per connection and writes the answers back, flushing whenever it would wait for the
client (which also honours Flush). Engine and catalog calls run in a dedicated thread pool, so the
event loop never blocks and one slow query does not delay other connections. It never interprets
SQL and never answers a client itself beyond the pre-startup handshake (SSLRequest → 'S' or 'N',
GSSENCRequest → 'N') and fatal errors; everything else is the session's.

Robustness promises: unauthenticated clients never reach the engine or the catalog (the session
guarantees it; the server additionally bounds their messages to a few KiB and their time to
`startup_timeout`); malformed, truncated or oversized input closes that connection only, after an
08P01 error when there is still someone to tell; SIGTERM stops accepting, lets running queries
finish for `shutdown_grace` seconds, then cancels them (a private query that had started is
charged, one that had not is not: the engine's cancellation decides) and closes the engine.

One Server is one process's share of the service: wire/workers.py runs several, each accepting on
the same inherited listening sockets; their sessions' process ids name the worker, so a cancel
request that lands on the wrong one is forwarded (`forward_cancel`) to the owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hmac
import logging
import os
import signal
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from dpproxy.engine import Engine
from dpproxy.errors import (
    AdminShutdown,
    AuthenticationTimeout,
    CannotConnectNow,
    DPProxyError,
    IdleSessionTimeout,
    ProtocolViolation,
    TooManyConnections,
    failure,
)
from dpproxy.logs import statement_logged
from dpproxy.policy import Policy
from dpproxy.wire import codec
from dpproxy.wire.catalog import ShadowCatalog, open_catalog
from dpproxy.wire.codec import (
    MAX_AUTH_MESSAGE_LENGTH,
    ErrorResponse,
    FrontendDecoder,
)
from dpproxy.wire.loop_thread import LoopThread
from dpproxy.wire.reload import Reloads, policy_text, problems_of
from dpproxy.wire.session import EngineCatalogAuth, Session
from dpproxy.wire.session.machine import client_address

if TYPE_CHECKING:
    from dpproxy.metrics import Metrics

log = logging.getLogger("dpproxy.wire")

_READ_SIZE = 65536
_WRITE_HIGH_WATER = 256 * 1024
_WATCH_BUFFER = 1024 * 1024  # pipelined bytes read while a statement runs, at most
_USAGE_INTERVAL = 1.0  # seconds between readings of the backend's connections (metrics)


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 6432  # 0: any free port (see Server.port)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    idle_timeout: float = 3600.0  # seconds a connection may wait between messages; 0 disables
    startup_timeout: float = 30.0  # seconds from connect to authenticated
    shutdown_grace: float = 10.0  # seconds running queries get to finish on SIGTERM
    max_message_length: int = codec.DEFAULT_MAX_MESSAGE_LENGTH  # after authentication
    workers: int = 64  # threads for engine and catalog calls (per process: see wire/workers.py)
    max_connections: int = 1000
    # Connections one client address may have that have not logged in yet: idle sockets from one
    # host cannot take every slot of max_connections from analysts (each waits startup_timeout).
    max_pending_per_address: int = 256  # a quarter of max_connections: pools log in many at once
    # The database name clients must connect to (3D000 otherwise), which current_database()
    # returns; None accepts any name (and echoes it). `dpproxy serve --database` sets it.
    database: str | None = None

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("give both a TLS certificate and its key, or neither")
        if self.workers < 1 or self.max_connections < 1:
            raise ValueError("workers and max_connections must be at least 1")


@dataclass(frozen=True)
class Operations:
    """What `serve` adds for the people who run it (picklable: each worker process gets it)."""

    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None  # serve Prometheus metrics on http://host:port/metrics (0: any port)
    log_format: str = "text"  # dpproxy.logs
    log_level: str = "warning"
    policy_file: Path | None = None  # re-read on SIGHUP (None: SIGHUP is not handled)
    status_file: Path | None = None  # where each reload's outcome is written (wire/reload.py)
    ledger: str | None = None  # where operator actions (reloads) are audited: the ledger `serve` uses


class _Connection:
    """One client connection: its streams, its session once started, and whether it is idle."""

    __slots__ = ("address", "authenticated", "idle", "reader", "session", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.session: Session | None = None
        self.idle = False  # waiting for the client's next message
        self.authenticated = False
        peer = writer.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)


class _ConnectionClosed(Exception):
    pass


CancelForward = Callable[[int, codec.CancelRequest], None]


class Server:
    """A PostgreSQL protocol server over one Engine. It owns the engine once started: `shutdown`
    closes the catalog; `close_engine` (called by `serve`, `run_server`, BackgroundServer) the engine.

    As one of several worker processes (wire/workers.py): `listen` are the listening sockets the
    workers share (instead of binding config.host/port), `slot` is (this worker's index, the number
    of workers): every session's process id is ≡ index (mod count), so a CancelRequest that lands on
    another worker is handed to `forward_cancel(owner index, request)`, and the owner checks the
    secret key (`cancel_request`).

    `reload(policy)` serves a new policy to new connections (SIGHUP; see wire/reload.py): a new
    engine on the same backend and ledger, a new shadow catalog and authenticator. Sessions already
    connected finish under the policy they started with; analysts' spending is the ledger's, kept.
    `metrics` (dpproxy.metrics) counts every statement, the sessions and the backend's connections."""

    def __init__(
        self,
        engine: Engine,
        config: ServerConfig,
        *,
        catalog: ShadowCatalog | None = None,
        listen: Sequence[socket.socket] = (),
        slot: tuple[int, int] = (0, 1),
        forward_cancel: CancelForward | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        index, count = slot
        if not 0 <= index < count:
            raise ValueError("a worker slot is (index, count) with 0 <= index < count")
        self.engine = engine
        self.metrics = metrics
        # Shared states of earlier policies, kept until their last session ends (then their
        # catalog is closed); the backend and ledger are the current engine's, closed once.
        self._retired: list[EngineCatalogAuth] = []
        self._reloading = asyncio.Lock()
        self._usage_task: asyncio.Task[None] | None = None
        self.metrics_port: int | None = None  # where run_server serves the metrics, once started
        self.config = config
        self._catalog = catalog
        self._listen = tuple(listen)
        self._slot = slot
        self._forward_cancel = forward_cancel
        self._executor = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="dpproxy-worker")
        self._ssl: ssl.SSLContext | None = None
        if config.tls_cert is not None and config.tls_key is not None:
            self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._ssl.minimum_version = ssl.TLSVersion.TLSv1_2
            self._ssl.load_cert_chain(config.tls_cert, config.tls_key)
        self._servers: list[asyncio.Server] = []
        self._shared: EngineCatalogAuth | None = None
        self._connections: set[_Connection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sessions: dict[int, Session] = {}
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._catalog is None:
            self._catalog = await self.run_blocking(open_catalog, self.engine)
        self._shared = EngineCatalogAuth(
            self.engine, self._catalog, self.run_blocking, database=self.config.database
        )
        self._shared.hooks.append(statement_logged)
        if self.metrics is not None:
            self._shared.hooks.append(self.metrics.observe)
            self._usage_task = asyncio.ensure_future(self._read_usage())
        if self._listen:
            for sock in self._listen:
                self._servers.append(
                    await asyncio.start_server(self._accept, sock=sock, limit=_READ_SIZE, backlog=512)
                )
        else:
            self._servers.append(
                await asyncio.start_server(
                    self._accept, self.config.host, self.config.port, limit=_READ_SIZE, backlog=512
                )
            )

    @property
    def port(self) -> int:
        assert self._servers and self._servers[0].sockets
        return int(self._servers[0].sockets[0].getsockname()[1])

    @property
    def addresses(self) -> list[tuple[str, int]]:
        assert self._servers
        return [tuple(s.getsockname()[:2]) for server in self._servers for s in server.sockets]  # type: ignore[misc]

    async def run_blocking(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`function(*args, **kwargs)` in a worker thread, in a copy of the caller's context (so the
        statement being handled, dpproxy.audit.CURRENT, tags what is logged there)."""
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        return await loop.run_in_executor(
            self._executor, functools.partial(context.run, function, *args, **kwargs)
        )

    async def _read_usage(self) -> None:
        """Keep the metrics' backend connection gauges current (a worker's values are summed by the
        supervisor, so each process sets its own)."""
        assert self.metrics is not None
        while not self._stopping:
            backend = self.engine.backend
            if backend is not None:
                # A closed or failing backend: the gauges keep their last values.
                with contextlib.suppress(Exception):
                    self.metrics.backend_usage(backend.usage())
            await asyncio.sleep(_USAGE_INTERVAL)

    # -- policy reload --------------------------------------------------------------------------

    async def reload(self, policy: Policy) -> None:
        """Serve `policy` to new connections, after the checks `serve` makes at start (its tables and
        columns against the live schema): a PolicyError (or BackendUnavailable) if it fails them, and
        then nothing changed. Reloads run one at a time."""
        async with self._reloading:
            current = self._shared
            assert current is not None
            # The same backend, ledger and audit log (whose writer outlives every reload).
            engine = await self.run_blocking(self.engine.with_policy, policy)
            catalog = await self.run_blocking(open_catalog, engine)
            shared = EngineCatalogAuth(engine, catalog, self.run_blocking, database=self.config.database)
            shared.hooks.extend(current.hooks)
            engine.make_current()  # sessions on earlier policies are held to its limits too
            self.engine, self._catalog, self._shared = engine, catalog, shared
            self._retired.append(current)
            self._close_unused_catalogs()

    async def reload_file(self, path: Path, reloads: Reloads | None = None) -> bool:
        """Re-read the policy file at `path` and serve it (`reload`); a policy with any problem is
        refused and the running one stays. The outcome is logged (and recorded in `reloads`)."""
        try:
            _, policy = await self.run_blocking(policy_text, path)
            await self.reload(policy)
        except Exception as error:  # any problem refuses the policy; the running one stays
            problems = problems_of(error)
            if reloads is not None:
                reloads.refused(problems)
            else:
                log.error("policy %s refused: %s", path, "; ".join(problems), extra={"problems": problems})
            return False
        if reloads is not None:
            reloads.accepted(policy)
        return True

    def _close_unused_catalogs(self) -> None:
        in_use = {id(c.session.shared) for c in self._connections if c.session is not None}
        for shared in list(self._retired):
            if id(shared) not in in_use:
                self._retired.remove(shared)
                with contextlib.suppress(Exception):
                    shared.catalog.close()

    async def shutdown(self) -> None:
        """Stop accepting; let running queries finish for the grace period; then cancel them and
        close every connection. Idle clients are told why (57P01) before their connection closes."""
        self._stopping = True
        for server in self._servers:
            server.close()
        self._terminate_idle()
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=self.config.shutdown_grace)
            if pending:
                log.warning("cancelling %d running queries after the shutdown grace period", len(pending))
                for connection in list(self._connections):
                    if connection.session is not None:
                        _cancel_in_background(connection.session)
                _, pending = await asyncio.wait(pending, timeout=max(5.0, self.config.shutdown_grace))
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.wait(pending, timeout=5.0)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), timeout=5.0)
        # Worker threads finish what they run (a cancelled query returns promptly); one that does
        # not is left behind after a while: closing the engine then ends it, and the ledger keeps
        # its reservation spent.
        waiter = threading.Thread(target=self._executor.shutdown, kwargs={"wait": True}, daemon=True)
        waiter.start()
        deadline = asyncio.get_running_loop().time() + max(10.0, self.config.shutdown_grace)
        while waiter.is_alive() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        if self._catalog is not None:
            with contextlib.suppress(Exception):
                self._catalog.close()
        for shared in self._retired:
            with contextlib.suppress(Exception):
                shared.catalog.close()
        self._retired.clear()
        if self._usage_task is not None:
            self._usage_task.cancel()

    def close_engine(self) -> None:
        self.engine.close()

    def _terminate_idle(self) -> None:
        for connection in list(self._connections):
            if connection.idle or connection.session is None:
                self._send_fatal(connection, codec.error_from(AdminShutdown(), severity="FATAL"))
                connection.writer.close()

    @staticmethod
    def _send_fatal(connection: _Connection, message: ErrorResponse) -> None:
        with contextlib.suppress(Exception):
            if not connection.writer.is_closing():
                connection.writer.write(message.encode())

    # -- connections ----------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connection = _Connection(reader, writer)
        pending = sum(not c.authenticated and c.address == connection.address for c in self._connections)
        if (
            self._stopping
            or len(self._connections) >= self.config.max_connections
            or pending >= self.config.max_pending_per_address
        ):
            refusal = CannotConnectNow() if self._stopping else TooManyConnections()
            self._send_fatal(connection, codec.error_from(refusal, severity="FATAL"))
            writer.close()
            return
        self._connections.add(connection)
        self._tasks.add(task)  # type: ignore[arg-type]
        try:
            await self._serve_connection(connection)
        except (_ConnectionClosed, ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, TimeoutError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception as error:  # its message may quote data: type and place only
            log.error("connection handler failed: %s", failure(error))
        finally:
            session = connection.session
            if session is not None:
                self._sessions.pop(session.process_id, None)
                if session.busy:
                    _cancel_in_background(session)
            if connection.authenticated and self.metrics is not None:
                self.metrics.sessions.dec()
            self._connections.discard(connection)
            self._tasks.discard(task)  # type: ignore[arg-type]
            if self._retired and session is not None and not session.busy:
                self._close_unused_catalogs()
            with contextlib.suppress(Exception):
                writer.close()

    async def _read_more(
        self, connection: _Connection, decoder: FrontendDecoder, timeout: float | None
    ) -> None:
        """Wait for more bytes from the client (after flushing what is pending)."""
        connection.idle = True
        try:
            if self._stopping:
                raise _ConnectionClosed
            if timeout is not None:
                data = await asyncio.wait_for(connection.reader.read(_READ_SIZE), timeout)
            else:
                data = await connection.reader.read(_READ_SIZE)
        finally:
            connection.idle = False
        if not data:
            raise _ConnectionClosed
        decoder.feed(data)

    async def _serve_connection(self, connection: _Connection) -> None:
        loop = asyncio.get_running_loop()
        writer = connection.writer
        decoder = FrontendDecoder()
        deadline = loop.time() + self.config.startup_timeout

        def startup_left() -> float:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError
            return left

        # Before the startup packet: SSL and GSSAPI negotiation, or a cancel request.
        ssl_answered = gss_answered = encrypted = False
        try:
            while True:
                message = decoder.next_message()
                if message is None:
                    await self._read_more(connection, decoder, startup_left())
                    continue
                if isinstance(message, codec.SSLRequest):
                    if ssl_answered:
                        raise ProtocolViolation("SSL negotiation was already done on this connection")
                    ssl_answered = True
                    if self._ssl is None:
                        writer.write(b"N")
                        continue
                    if decoder.pending:
                        # Bytes sent before the handshake would be read as if they were encrypted.
                        raise ProtocolViolation("received unencrypted data after SSL request")
                    writer.write(b"S")
                    await writer.drain()
                    await writer.start_tls(self._ssl, ssl_handshake_timeout=startup_left())
                    gss_answered = encrypted = True
                    continue
                if isinstance(message, codec.GSSENCRequest):
                    if gss_answered:
                        raise ProtocolViolation("GSSAPI negotiation was already done on this connection")
                    gss_answered = True
                    writer.write(b"N")
                    continue
                if isinstance(message, codec.CancelRequest):
                    self._route_cancel(message)
                    return
                assert isinstance(message, codec.StartupMessage)
                break
        except ProtocolViolation as error:
            # A peer that cannot frame a startup packet gets no more than the error.
            self._send_fatal(connection, codec.error_from(error, severity="FATAL"))
            await self._drain_quietly(writer)
            return

        assert self._shared is not None
        process_id, secret_key = self._new_key()
        peer = client_address(writer.get_extra_info("peername"))
        session = Session(self._shared, process_id, secret_key, client=peer, encrypted=encrypted)
        connection.session = session
        decoder.startup = False
        decoder.max_length = MAX_AUTH_MESSAGE_LENGTH
        out = bytearray()

        async def send_now(messages: list[codec.BackendMessage]) -> None:
            # A streamed answer's batch: after whatever is pending, written now, drained (flow control).
            if writer.is_closing():
                raise ConnectionResetError("the client connection is closed")
            for reply in messages:
                out.extend(reply.encode())
            writer.write(bytes(out))
            out.clear()
            await writer.drain()

        session.send_now = send_now
        for reply in await session.start(message):
            out += reply.encode()
        authenticated = False
        try:
            while not session.closing:
                try:
                    message = decoder.next_message()
                except ProtocolViolation as error:
                    out += codec.error_from(error, severity="FATAL").encode()
                    break
                if message is None:
                    if out:
                        writer.write(bytes(out))
                        out.clear()
                        await writer.drain()
                    if not authenticated:
                        timeout: float | None = startup_left()
                    else:
                        timeout = self.config.idle_timeout or None
                    try:
                        await self._read_more(connection, decoder, timeout)
                    except TimeoutError:
                        if authenticated:
                            out += codec.error_from(IdleSessionTimeout(), severity="FATAL").encode()
                        else:
                            out += codec.error_from(AuthenticationTimeout(), severity="FATAL").encode()
                        break
                    except _ConnectionClosed:
                        if self._stopping:
                            out += codec.error_from(AdminShutdown(), severity="FATAL").encode()
                        break
                    continue
                if authenticated and isinstance(message, (codec.Query, codec.Execute)):
                    replies = await self._handle_watching(connection, decoder, session, message)
                else:
                    replies = await session.handle(message)
                for reply in replies:
                    out += reply.encode()
                if not authenticated and session.authenticated:
                    authenticated = connection.authenticated = True
                    decoder.max_length = self.config.max_message_length
                    self._sessions[process_id] = session
                    if self.metrics is not None:
                        self.metrics.sessions.inc()
                if len(out) > _WRITE_HIGH_WATER:
                    writer.write(bytes(out))
                    out.clear()
                    await writer.drain()
        finally:
            if out and not writer.is_closing():
                writer.write(bytes(out))
                await self._drain_quietly(writer)

    async def _handle_watching(
        self, connection: _Connection, decoder: FrontendDecoder, session: Session, message: Any
    ) -> list[codec.BackendMessage]:
        """session.handle(message), watching the socket meanwhile: a client that disconnects has
        its running query cancelled (a private query that had started stays charged, as any cancel).
        Bytes the client pipelines meanwhile are kept for the decoder, up to _WATCH_BUFFER."""
        handling = asyncio.ensure_future(session.handle(message))
        reader = connection.reader
        while not handling.done():
            if decoder.pending > _WATCH_BUFFER:
                break  # enough pipelined input: stop reading, so TCP pushes back on the client
            reading = asyncio.ensure_future(reader.read(_READ_SIZE))
            await asyncio.wait({handling, reading}, return_when=asyncio.FIRST_COMPLETED)
            if not reading.done():
                reading.cancel()
            try:
                data: bytes | None = await reading
            except asyncio.CancelledError:
                data = None
            except (ConnectionError, OSError, ssl.SSLError):
                data = b""
            if data is None:
                continue
            if not data:
                # The peer closed (or reset) the connection: nobody is waiting for this answer.
                threading.Thread(target=session.abandon, name="dpproxy-cancel", daemon=True).start()
                break
            decoder.feed(data)
        return await handling

    @staticmethod
    async def _drain_quietly(writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.drain(), timeout=5.0)

    def _new_key(self) -> tuple[int, int]:
        index, count = self._slot
        while True:
            process_id = int.from_bytes(os.urandom(4), "big") & 0x7FFFFFFF
            process_id -= (process_id - index) % count  # ≡ index (mod count): names this worker
            if process_id > 0 and process_id not in self._sessions:
                break
        secret_key = int.from_bytes(os.urandom(4), "big", signed=True)
        return process_id, secret_key

    def _route_cancel(self, request: codec.CancelRequest) -> None:
        index, count = self._slot
        owner = request.process_id % count
        if owner != index and self._forward_cancel is not None:
            self._forward_cancel(owner, request)
        else:
            self.cancel_request(request)

    def cancel_request(self, request: codec.CancelRequest) -> None:
        """Cancel the session's running query if the request names one of this server's sessions
        with its secret key; otherwise do nothing (PostgreSQL never answers a cancel request)."""
        session = self._sessions.get(request.process_id)
        if session is None:
            log.debug("cancel request for unknown process %d", request.process_id)
            return
        expected = struct.pack("!i", session.secret_key)
        if hmac.compare_digest(struct.pack("!i", request.secret_key), expected):
            _cancel_in_background(session)


def _cancel_in_background(session: Session) -> None:
    # Interrupting a backend query can block (PostgreSQL's cancel opens a connection): never on
    # the event loop, and never queued behind the busy worker threads it is meant to relieve.
    threading.Thread(target=session.cancel_running, name="dpproxy-cancel", daemon=True).start()


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


async def serve(
    engine: Engine,
    config: ServerConfig,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[Server], None] | None = None,
    operations: Operations | None = None,
    on_reload: Callable[[Policy], None] | None = None,
) -> None:
    """Serve until `stop` is set (forever without one), then shut down and close the engine.

    `operations`: serve metrics (in this process's memory, budgets read from the ledger at scrape
    time) and, on SIGHUP (in the main thread only), re-read `policy_file` (Server.reload_file);
    `on_reload(policy)` is then called with each accepted policy (the console shows it)."""
    from dpproxy.metrics import BudgetCollector, Metrics, start_endpoint

    ops = operations or Operations()
    metrics = Metrics() if ops.metrics_port is not None else None
    server = Server(engine, config, metrics=metrics)
    endpoint = None
    reloads: Reloads | None = None
    pending: set[asyncio.Future[bool]] = set()
    try:
        await server.start()
        if metrics is not None and ops.metrics_port is not None:
            metrics.registry.register(BudgetCollector(lambda: server.engine))
            endpoint = start_endpoint(metrics.registry, ops.metrics_host, ops.metrics_port)
            server.metrics_port = endpoint.port
        if ops.policy_file is not None:
            policy_file = ops.policy_file
            reloads = Reloads(policy_file, ops.status_file, engine.policy, ops.ledger)

            async def hangup() -> bool:
                accepted = await server.reload_file(policy_file, reloads)
                if accepted and on_reload is not None:
                    try:
                        on_reload(server.engine.policy)
                    except Exception as error:
                        log.error("could not hand the reloaded policy on: %s", failure(error))
                return accepted

            def on_hangup() -> None:
                future = asyncio.ensure_future(hangup())
                pending.add(future)
                future.add_done_callback(pending.discard)

            with contextlib.suppress(RuntimeError, ValueError):  # not the main thread: no signals
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_hangup)
        if ready is not None:
            ready(server)
        await (stop.wait() if stop is not None else asyncio.Event().wait())
        if pending:
            await asyncio.wait(set(pending), timeout=60)
        await server.shutdown()
    finally:
        if endpoint is not None:
            endpoint.close()
        if reloads is not None:
            reloads.remove()
        server.close_engine()


def run_server(
    engine: Engine,
    config: ServerConfig,
    *,
    ready: Callable[[Server], None] | None = None,
    operations: Operations | None = None,
    on_reload: Callable[[Policy], None] | None = None,
) -> int:
    """Serve in the calling thread until SIGTERM or SIGINT; returns the exit status (0). SIGHUP
    reloads the policy when `operations` names its file (then `on_reload(policy)`)."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(engine, config, stop=stop, ready=ready, operations=operations, on_reload=on_reload)

    asyncio.run(main())
    return 0


class BackgroundServer(LoopThread):
    """A server on its own event loop thread: for tests, benchmarks and embedding.

    >>> with BackgroundServer(engine, ServerConfig(port=0)) as server:   # doctest: +SKIP
    ...     psycopg.connect(f"host=127.0.0.1 port={server.port} user=alice password=…")
    """

    def __init__(
        self,
        engine: Engine,
        config: ServerConfig,
        *,
        catalog: ShadowCatalog | None = None,
        slot: tuple[int, int] = (0, 1),
        forward_cancel: CancelForward | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__("dpproxy-server", target=self._run)
        self.server = Server(
            engine, config, catalog=catalog, slot=slot, forward_cancel=forward_cancel, metrics=metrics
        )
        self._started = threading.Event()
        self._error: BaseException | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.server.start())
        except BaseException as error:
            self._error = error
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()

    def start(self) -> Self:
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error
        return self

    @property
    def port(self) -> int:
        return self.server.port

    def cancel_request(self, request: codec.CancelRequest) -> None:
        """Server.cancel_request from any thread (as a forwarded cancel request arrives)."""
        self._loop.call_soon_threadsafe(self.server.cancel_request, request)

    def reload(self, policy: Policy) -> None:
        """Server.reload from any thread; raises what it raises (PolicyError: nothing changed)."""
        asyncio.run_coroutine_threadsafe(self.server.reload(policy), self._loop).result(timeout=120)

    def run(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(*args)` through Server.run_blocking, called from the server's event loop."""

        async def call() -> Any:
            return await self.server.run_blocking(function, *args)

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout=120)

    def stop(self) -> None:
        if self._thread.is_alive():
            future = asyncio.run_coroutine_threadsafe(self.server.shutdown(), self._loop)
            try:
                future.result(timeout=60)
            finally:
                self._end_loop(timeout=10)
        self.server.close_engine()


__all__ = [
    "BackgroundServer",
    "DPProxyError",
    "Operations",
    "Server",
    "ServerConfig",
    "run_server",
    "serve",
]
