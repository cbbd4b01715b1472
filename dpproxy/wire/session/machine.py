"""The state machine of one client connection: startup, authentication, simple and extended query.

A Session is fed frontend messages (`start`, then `handle`) and answers with backend messages; it
never touches a socket (the server moves bytes) and never decides what a statement is (the router
does). It owns what PostgreSQL keeps per backend: the phase, the transaction status (I/T/E), the
settings (dpproxy/wire/settings.py: SET/RESET/SHOW with transaction semantics), prepared
statements, portals and cursors (portals.py), the analyst and the session's `dpproxy.epsilon`,
which notices reach the client (client_min_messages) and the statement_timeout of engine queries.
Session commands (commands.py), transaction control and cursors are answered by the session;
catalog statements go to the shadow catalog, queries on exposed tables to the engine, EXPLAIN to
`engine.explain`. Calls that may block (engine, catalog, budget, routing of long text) run in the
server's worker threads through `EngineCatalogAuth.run_blocking`.

Each statement an analyst sends after authentication gets an audit record (dpproxy.audit): made
when it arrives, named by dpproxy.audit.CURRENT while it runs (the engine fills in what it knows
and the ledger writes it with any charge), finished with its status and SQLSTATE once its answer
is queued, then handed to `EngineCatalogAuth.observe`. A record holds the statement as sent, its
parameters apart, and the number of rows released, never a row.

Nothing reaches the engine or the catalog before authentication succeeds (a failure is logged, as
PostgreSQL logs it). Errors a client sees are DPProxyErrors rendered here once; any other exception
becomes a fixed internal-error message, its text (which could hold a value) only in the log.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from types import MappingProxyType

from dpproxy.audit import CURRENT, StatementRecord, Status, new_session_id
from dpproxy.backends import STATEMENT_TIMEOUT, Cancellation
from dpproxy.errors import (
    ActiveTransaction,
    BackendUnavailable,
    DPProxyError,
    InFailedTransaction,
    InternalError,
    NoActiveTransaction,
    NotSupported,
    ProtocolViolation,
    UndefinedDatabase,
    UnknownAnalyst,
    failure,
)
from dpproxy.policy import AnalystPolicy
from dpproxy.results import ResultStream
from dpproxy.sql.bounds import SessionBounds
from dpproxy.sql.clock import CLOCK, Clock, session_clock
from dpproxy.wire import codec
from dpproxy.wire.auth import AuthExchange
from dpproxy.wire.catalog import SessionInfo
from dpproxy.wire.codec import (
    BackendMessage,
    CommandComplete,
    DataRow,
    ErrorResponse,
    ParameterStatus,
    ReadyForQuery,
    RowDescription,
)
from dpproxy.wire.router import Kind, Statement, statement_offsets
from dpproxy.wire.session.commands import SessionCommands
from dpproxy.wire.session.portals import PortalCommands
from dpproxy.wire.session.records import (
    Outcome,
    Phase,
    Portal,
    PreparedStatement,
    TransactionStatus,
    expand_formats,
)
from dpproxy.wire.session.shared import EngineCatalogAuth
from dpproxy.wire.settings import (
    EPSILON_SETTING,
    REPORTED,
    SESSION_DEFAULTS,
    SessionSettings,
    canonical,
    notice_visible,
    parse_options,
    session_bounds,
    timeout_ms,
    zone,
)
from dpproxy.wire.types import TEXT_OID, TextFormat, WireColumn, encoder, wire_column

log = logging.getLogger("dpproxy.wire")

_PACK_I = struct.Struct("!i").pack
_PACK_H = struct.Struct("!h").pack
_NULL_CELL = _PACK_I(-1)


class _EncodedRows(codec.BackendMessage):
    """DataRow messages already encoded, one batch of a streamed answer."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def encode(self) -> bytes:
        return self.data


INTERNAL_ERROR = "internal error in dpproxy; the operator's log has the details"


def _warning(error: DPProxyError) -> ErrorResponse:
    return codec.error_from(error, severity="WARNING")


# The SQLSTATE recorded for a statement whose client went away while its answer was sent.
_CONNECTION_LOST = BackendUnavailable.sqlstate  # connection_failure


def client_address(peer: object) -> str:
    """A client's address as audit records show it: "host:port" ("[host]:port" for IPv6)."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = str(peer[0]), peer[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return str(peer) if peer else ""


class Session(SessionCommands, PortalCommands):
    """One connection's protocol state. `start()` the startup packet, then `handle()` each message;
    both return the backend messages to send. `closing` turns True when the connection must end."""

    def __init__(
        self,
        shared: EngineCatalogAuth,
        process_id: int,
        secret_key: int,
        *,
        client: str = "",
        encrypted: bool = False,
    ) -> None:
        self.shared, self.encrypted = shared, encrypted  # encrypted: the connection went through TLS
        # For audit records: the client's "host:port", this session's random id, its statement count.
        self.client = client
        self.session_id = new_session_id()
        self._statement_count = 0
        self._clock: Clock | None = None  # now() of the current transaction (dpproxy.sql.clock)
        self.engine = shared.engine
        self.process_id = process_id
        self.secret_key = secret_key
        self.phase = Phase.STARTUP
        self.closing = False
        self.user = ""
        self.database = ""
        self.analyst: AnalystPolicy | None = None
        self.status = TransactionStatus.IDLE
        self._startup_parameters: dict[str, str] = {}
        self._exchange: AuthExchange | None = None
        self._settings = SessionSettings(SESSION_DEFAULTS, self._check_epsilon)
        self._reported: dict[str, str] = {}
        self._statements: dict[str, PreparedStatement] = {}
        self._portals: dict[str, Portal] = {}
        self._skipping = False  # after an error in the extended protocol, until Sync
        self._cancel: Cancellation | None = None
        self._abandoned = False  # the client disconnected while a statement was being handled
        self._text_format_key: tuple[str, str] | None = None
        self._text_format = TextFormat()
        # Set by the server: writes messages to the client now and waits until the socket drains
        # (flow control). With it, large private answers are streamed batch by batch; without it
        # (a Session driven directly), every answer is collected whole and returned.
        self.send_now: Callable[[list[BackendMessage]], Awaitable[None]] | None = None

    # -- entry points -------------------------------------------------------------------------------

    @property
    def authenticated(self) -> bool:
        return self.phase is Phase.READY

    def abandon(self) -> None:
        """The client went away: cancel the query running now and any this connection still starts
        (the rest of a multi-statement Query). Called from a thread of its own, like cancel_running."""
        self._abandoned = True
        self.cancel_running()

    def cancel_running(self) -> None:
        """Interrupt the query running now, if any (CancelRequest, shutdown). Thread-safe enough:
        called on the event loop thread; Cancellation.cancel is itself thread-safe."""
        cancel = self._cancel
        if cancel is not None:
            cancel.cancel()

    @property
    def busy(self) -> bool:
        return self._cancel is not None

    async def start(self, startup: codec.StartupMessage) -> list[BackendMessage]:
        out: list[BackendMessage] = []
        if startup.major != 3:
            return self._fatal(
                out,
                NotSupported(
                    f"unsupported frontend protocol {startup.major}.{startup.minor}: "
                    "server supports 3.0 to 3.0"
                ),
            )
        unrecognized = tuple(sorted(k for k in startup.parameters if k.startswith("_pq_.")))
        if startup.minor > 0 or unrecognized:
            out.append(codec.NegotiateProtocolVersion(0, unrecognized))
        parameters = {k: v for k, v in startup.parameters.items() if not k.startswith("_pq_.")}
        user = parameters.pop("user", "")
        if not user:
            return self._fatal(out, UnknownAnalyst("no PostgreSQL user name specified in startup packet"))
        if parameters.pop("replication", "false").lower() not in ("false", "off", "no", "0"):
            return self._fatal(out, NotSupported("replication connections are not supported"))
        self.user = user
        self.database = parameters.pop("database", "") or user
        self._startup_parameters = parameters
        try:  # (a refusal: cleartext passwords are asked for over TLS only)
            self._exchange = self.shared.authenticator.start(user, encrypted=self.encrypted)
        except DPProxyError as refused:
            return self._fatal(out, refused)
        self.phase = Phase.AUTHENTICATING
        out.append(self._exchange.start())
        return out

    async def handle(self, message: codec.FrontendMessage) -> list[BackendMessage]:
        out: list[BackendMessage] = []
        try:
            if isinstance(message, codec.Terminate) and self.phase in (Phase.AUTHENTICATING, Phase.READY):
                self._close()
            elif self.phase is Phase.AUTHENTICATING:
                await self._authenticate(message, out)
            elif self.phase is Phase.READY:
                await self._ready(message, out)
            elif self.phase is Phase.STARTUP:
                self._fatal(out, ProtocolViolation("expected a startup message"))
        except ProtocolViolation as error:
            self._fatal(out, error)
        except DPProxyError as error:
            if self.phase is not Phase.READY:
                self._fatal(out, error)
            else:
                out.append(codec.error_from(error))
        except Exception as unexpected:
            # Its type and place only: the text of an unexpected exception could hold a value.
            log.error("internal error in session %d: %s", self.process_id, failure(unexpected))
            if self.phase is not Phase.READY:
                self._fatal(out, InternalError(INTERNAL_ERROR))
            else:
                # The text of an unexpected exception could hold a value: it stays in the log.
                out.append(codec.error_from(InternalError(INTERNAL_ERROR)))
                if isinstance(message, codec.EXTENDED):
                    self._after_error(extended=True)
                elif not isinstance(message, codec.Sync):
                    self._after_error(extended=False)
                    out.append(ReadyForQuery(self.status.value))
        return out

    def _fatal(self, out: list[BackendMessage], error: DPProxyError) -> list[BackendMessage]:
        out.append(codec.error_from(error, severity="FATAL"))
        self._close()
        return out

    def _close(self) -> None:
        """The session is over (Terminate, or a FATAL error): the server closes the connection once
        it has sent what this message answered."""
        self.closing = True
        self.phase = Phase.CLOSED

    # -- authentication -------------------------------------------------------------------------

    async def _authenticate(self, message: codec.FrontendMessage, out: list[BackendMessage]) -> None:
        if not isinstance(message, codec.AuthenticationResponse):
            raise ProtocolViolation(f"expected password response, got {type(message).__name__}")
        exchange = self._exchange
        assert exchange is not None
        step = await exchange.respond(message, self.shared.run_blocking)
        if step.reply is not None:
            out.append(step.reply)
        if not step.finished:
            return
        if not exchange.authenticated:
            log.warning("password authentication failed for user %r from %s", self.user, self.client)
            self._fatal(out, exchange.failure())
            return
        self.analyst = self.engine.analyst(self.user)
        self._exchange = None
        out.append(codec.AuthenticationOk())
        served = self.shared.database
        if served is not None and self.database != served:
            # As PostgreSQL: the database is looked up once the client has authenticated.
            self._fatal(
                out,
                UndefinedDatabase(
                    f'database "{self.database}" does not exist',
                    hint=f'this server serves the database "{served}": connect to it (dbname={served})',
                ),
            )
            return
        self._settings = SessionSettings(
            {**SESSION_DEFAULTS, "session_authorization": self.user}, self._check_epsilon
        )
        for name, value in self._startup_items():
            try:
                self._apply_setting(name, value, local=False, startup=True)
            except DPProxyError as error:
                self._fatal(out, error)
                return
        self.phase = Phase.READY
        self._report(out, force=True)
        out.append(codec.BackendKeyData(self.process_id, self.secret_key))
        out.append(ReadyForQuery(self.status.value))

    def _startup_items(self) -> list[tuple[str, str]]:
        items: list[tuple[str, str]] = []
        for name, value in self._startup_parameters.items():
            if name == "options":
                items.extend(parse_options(value))
            else:
                items.append((name.lower(), value))
        return items

    # -- dispatch -------------------------------------------------------------------------------

    async def _ready(self, message: codec.FrontendMessage, out: list[BackendMessage]) -> None:
        if isinstance(message, codec.Sync):
            self._sync(out)
            return
        if self._skipping:
            return
        if isinstance(message, codec.Query):
            await self._simple_query(message.sql, out)
        elif isinstance(message, codec.EXTENDED):
            try:
                await self._extended(message, out)
            except DPProxyError as error:
                out.append(codec.error_from(error))
                self._after_error(extended=True)
        elif isinstance(message, codec.Undecodable):
            out.append(codec.error_from(message.error))
            if message.type_code == "Q":
                self._after_error(extended=False)
                out.append(ReadyForQuery(self.status.value))
            elif message.type_code in "PBDEC":
                self._after_error(extended=True)
        elif isinstance(message, codec.FunctionCall):
            out.append(
                codec.error_from(
                    NotSupported("the function call protocol is not supported", hint="call functions in SQL")
                )
            )
            out.append(ReadyForQuery(self.status.value))
        elif isinstance(message, (codec.CopyData, codec.CopyDone, codec.CopyFail)):
            pass  # as PostgreSQL: left over from a failed COPY, ignored
        else:
            raise ProtocolViolation(f"unexpected {type(message).__name__} message after startup")

    def _after_error(self, *, extended: bool) -> None:
        if self.status is TransactionStatus.IN_BLOCK:
            self.status = TransactionStatus.FAILED
        if extended:
            self._skipping = True

    def _sync(self, out: list[BackendMessage]) -> None:
        self._skipping = False
        if self.status is TransactionStatus.IDLE:
            self._end_implicit_transaction()
        self._report(out)
        out.append(ReadyForQuery(self.status.value))

    def _end_implicit_transaction(self) -> None:
        # Outside a transaction block, portals live until the end of the implicit transaction.
        for name in [n for n, p in self._portals.items() if not p.holdable]:
            del self._portals[name]

    # -- audit records --------------------------------------------------------------------------

    @contextmanager
    def _audited(
        self, text: str, parameters: Sequence[object] = (), statement: Statement | None = None
    ) -> Iterator[StatementRecord]:
        """The audit record of one statement, CURRENT while the block runs (and so in the worker
        threads it calls), finished and observed when the block ends: refused or failed by the
        DPProxyError (or, with XX000, any other exception) that leaves it, or recorded inside."""
        self._statement_count += 1
        record = StatementRecord(
            self.user,
            text,
            tuple(parameters),
            client=self.client,
            session_id=self.session_id,
            statement_id=self._statement_count,
        )
        if statement is not None:
            self._note_kind(record, statement)
        token = CURRENT.set(record)
        # now() is the start of the transaction (of this statement outside a block), in the TimeZone.
        self._clock = session_clock(self._clock, record.at, self.status, self._current_text_format().timezone)
        clock = CLOCK.set(self._clock)
        try:
            yield record
        except BaseException as error:
            record.failed(error)
            raise
        finally:
            CLOCK.reset(clock)
            CURRENT.reset(token)
            if not record.kind:
                record.kind = "query"  # refused before the engine knew what it was
            record.finish()
            self.shared.observe(record)

    @staticmethod
    def _note_kind(record: StatementRecord, statement: Statement) -> None:
        # The engine names its own statements (private, public, constant, empty).
        if statement.kind is not Kind.ENGINE and not record.kind:
            record.kind = statement.kind.value

    @staticmethod
    def _note_answer(record: StatementRecord, outcome: Outcome) -> None:
        if outcome.stream is not None:
            record.rows = outcome.stream.rows
        elif outcome.counted:
            record.rows = len(outcome.rows)

    # -- simple query ---------------------------------------------------------------------------

    async def _simple_query(self, sql: str, out: list[BackendMessage]) -> None:
        try:
            texts = await self.shared.split(sql)
        except DPProxyError as error:
            with self._audited(sql) as record:
                record.error(error.sqlstate, error.message)
            out.append(codec.error_from(error))
            self._after_error(extended=False)
            out.append(ReadyForQuery(self.status.value))
            return
        if not texts:
            out.append(codec.EmptyQueryResponse())
            out.append(ReadyForQuery(self.status.value))
            return
        implicit_block = len(texts) > 1 and self.status is TransactionStatus.IDLE
        if implicit_block:
            self._settings.begin()
        failed = False
        for text, offset in zip(texts, statement_offsets(sql, texts), strict=True):
            with self._audited(text) as record:
                try:
                    statement = await self.shared.route(text)
                    self._note_kind(record, statement)
                    self._check_not_aborted(statement)
                    outcome = await self._run(
                        statement, [], in_implicit_block=implicit_block, stream=self.send_now is not None
                    )
                    if outcome.stream is not None:
                        assert outcome.columns is not None
                        out.append(RowDescription(outcome.columns, (0,) * len(outcome.columns)))
                        await self._send_stream(outcome, (0,) * len(outcome.columns), out)
                    else:
                        sending = time.perf_counter()
                        self._send_outcome(outcome, out)
                        record.add_stage("wire", time.perf_counter() - sending)
                    self._note_answer(record, outcome)
                except DPProxyError as error:
                    record.error(error.sqlstate, error.message)
                    if error.position is not None:  # counted from the query string's start, as PostgreSQL
                        error.position += offset
                    out.append(codec.error_from(error))
                    self._after_error(extended=False)
                    failed = True
            if failed:
                break
        if implicit_block and self.status is TransactionStatus.IDLE:
            # Statements of one Query string form one transaction, as in PostgreSQL.
            if failed:
                self._settings.rollback()
            else:
                self._settings.commit()
        if self.status is TransactionStatus.IDLE:
            self._end_implicit_transaction()
        self._report(out)
        out.append(ReadyForQuery(self.status.value))

    def _send_outcome(self, outcome: Outcome, out: list[BackendMessage]) -> None:
        if outcome.empty:
            out.append(codec.EmptyQueryResponse())
            return
        out.extend(self._visible(outcome.notices))
        if outcome.copy is not None:
            self._append_copy(outcome, out)
            return
        if outcome.columns is not None:
            formats = expand_formats(outcome.formats, len(outcome.columns))
            out.append(RowDescription(outcome.columns, formats))
            self._append_rows(outcome.columns, formats, outcome.rows, out)
        out.append(CommandComplete(self._tag(outcome, len(outcome.rows))))
        self._report(out)

    async def _send_stream(self, outcome: Outcome, formats: Sequence[int], out: list[BackendMessage]) -> None:
        """A streamed private answer: each released batch as DataRows, written at once (after
        whatever `out` already holds) and drained before the next batch is asked for, so neither
        the answer nor its encoding is ever held whole; then the notice (its 95% figures cover the
        whole answer, so they come last) and "SELECT n". A client that stops reading holds the
        backend query back (TCP flow control); one that goes away stops it (Session.abandon)."""
        stream = outcome.stream
        assert stream is not None and outcome.columns is not None and self.send_now is not None
        exhausted = False
        record = CURRENT.get()
        sending = time.perf_counter()
        engine_before = _engine_seconds(record)
        try:
            while True:
                batch = await self.shared.run_blocking(next, stream, None)
                if batch is None:
                    exhausted = True
                    break
                out.append(_EncodedRows(self._encode_rows(outcome.columns, formats, batch)))
                try:
                    await self.send_now(out)
                except (ConnectionError, OSError):
                    # The client is gone: stop the query (its charge stands) and end the connection.
                    self.closing = True
                    self._abandoned = True
                    if record is not None:
                        record.status, record.sqlstate = Status.FAILED, _CONNECTION_LOST
                    return
                finally:
                    out.clear()
        finally:
            if not exhausted:
                await self.shared.run_blocking(stream.close)
            self._end_stream(outcome)
            if record is not None:
                engine = _engine_seconds(record) - engine_before
                record.add_stage("wire", max(0.0, time.perf_counter() - sending - engine))
        summary = stream.summary
        if summary is not None and summary.notice:
            out.extend(self._visible([codec.notice(summary.notice)]))
        out.append(CommandComplete(self._tag(outcome, stream.rows)))
        self._report(out)

    def _end_stream(self, outcome: Outcome) -> None:
        """A streamed answer was sent (or stopped): its statement_timeout no longer runs."""
        if outcome.cancel is not None:
            outcome.cancel.disarm()
        self._cancel = None

    def _append_copy(self, outcome: Outcome, out: list[BackendMessage]) -> None:
        """COPY … TO STDOUT: CopyOutResponse, one CopyData per line, CopyDone, then "COPY n"."""
        assert outcome.copy is not None
        out.append(codec.CopyOutResponse(outcome.copy_width, outcome.copy_format))
        out.extend(codec.CopyOutData(line) for line in outcome.copy)
        out.append(codec.CopyOutDone())
        out.append(CommandComplete(self._tag(outcome, len(outcome.rows))))
        self._report(out)

    def _visible(self, notices: Sequence[ErrorResponse]) -> list[ErrorResponse]:
        """The notices client_min_messages lets through (SET, or -c client_min_messages=… at startup)."""
        level = self._settings.get("client_min_messages")
        return [n for n in notices if notice_visible(n.severity, level)]

    @staticmethod
    def _tag(outcome: Outcome, count: int) -> str:
        return f"{outcome.tag} {count}" if outcome.counted else outcome.tag

    def _append_rows(
        self,
        columns: Sequence[WireColumn],
        formats: Sequence[int],
        rows: Sequence[Sequence[object]],
        out: list[BackendMessage],
    ) -> None:
        text_format = self._current_text_format()
        encoders = [encoder(c.type_oid, f, text_format) for c, f in zip(columns, formats, strict=True)]
        width = len(encoders)
        for row in rows:
            if len(row) != width:
                raise InternalError(INTERNAL_ERROR)
            out.append(DataRow([None if v is None else enc(v) for enc, v in zip(encoders, row, strict=True)]))

    def _encode_rows(
        self, columns: Sequence[WireColumn], formats: Sequence[int], rows: Sequence[Sequence[object]]
    ) -> bytes:
        """A batch of rows as the bytes of their DataRow messages, encoded in one pass (a streamed
        answer's batch: no message object per row). The same bytes `_append_rows` would send."""
        text_format = self._current_text_format()
        encoders = [encoder(c.type_oid, f, text_format) for c, f in zip(columns, formats, strict=True)]
        width = len(encoders)
        head = _PACK_H(width)
        pack = _PACK_I
        messages: list[bytes] = []
        for row in rows:
            if len(row) != width:
                raise InternalError(INTERNAL_ERROR)
            cells = [head]
            for encode, value in zip(encoders, row, strict=True):
                if value is None:
                    cells.append(_NULL_CELL)
                else:
                    data = encode(value)
                    cells.append(pack(len(data)))
                    cells.append(data)
            body = b"".join(cells)
            messages.append(b"D" + pack(len(body) + 4) + body)
        return b"".join(messages)

    def _current_text_format(self) -> TextFormat:
        key = (self._settings.get("extra_float_digits") or "1", self._settings.get("timezone") or "UTC")
        if key != self._text_format_key:
            self._text_format = TextFormat(int(key[0]), zone(key[1]))
            self._text_format_key = key
        return self._text_format

    def _report(self, out: list[BackendMessage], *, force: bool = False) -> None:
        """ParameterStatus for each GUC_REPORT setting whose value the client has not seen yet."""
        for name in REPORTED:
            value = self._settings.get(name) or ""
            if force or self._reported.get(name) != value:
                self._reported[name] = value
                out.append(ParameterStatus(canonical(name), value))

    def _check_not_aborted(self, statement: Statement) -> None:
        if self.status is not TransactionStatus.FAILED:
            return
        if statement.kind is Kind.TRANSACTION and statement.action in ("commit", "rollback", "rollback_to"):
            return
        raise InFailedTransaction(
            "current transaction is aborted, commands ignored until end of transaction block",
            hint="send ROLLBACK (or ROLLBACK TO a savepoint) to continue",
        )

    # -- running one statement ------------------------------------------------------------------

    async def _run(
        self,
        statement: Statement,
        parameters: Sequence[object],
        *,
        in_implicit_block: bool = False,
        stream: bool = False,
    ) -> Outcome:
        """Run one statement. `stream`: the caller sends a private answer released in batches
        (Outcome.stream, see _send_stream) rather than wanting its rows whole."""
        kind = statement.kind
        if kind is Kind.ENGINE:
            return await self._run_engine(statement.sql, parameters, stream=stream)
        if kind is Kind.CATALOG:
            return await self._run_catalog(statement.sql, parameters)
        if kind is Kind.SESSION:
            return await self._session_command(statement, parameters)
        if kind is Kind.TRANSACTION:
            return self._transaction_command(statement)
        if kind is Kind.CURSOR:
            return await self._cursor_command(statement, parameters, in_implicit_block)
        if kind is Kind.EXPLAIN:
            return await self._explain(statement, parameters)
        if kind is Kind.COPY:
            return await self._copy(statement, parameters)
        if kind is Kind.PREPARED:
            return await self._prepared_command(statement, parameters)
        if kind is Kind.EMPTY:
            return Outcome("", empty=True)
        raise NotSupported(f"{statement.tag or 'this statement'} is not supported")

    @property
    def _epsilon(self) -> float | None:
        value = self._settings.get(EPSILON_SETTING)
        return float(value) if value else None

    @property
    def _bounds(self) -> SessionBounds | None:
        """What the session set for its plans (SET dpproxy.max_rows_per_unit …), if anything."""
        return session_bounds(self._settings.get)

    async def _run_engine(self, sql: str, parameters: Sequence[object], *, stream: bool = False) -> Outcome:
        cancel = Cancellation()
        self._cancel = cancel
        if self._abandoned:
            cancel.cancel()
        # statement_timeout, as PostgreSQL: from the statement's start, planning included (a query
        # cancelled before its first backend statement is not charged; one cancelled after is).
        timeout = timeout_ms(self._settings.get("statement_timeout") or "0")
        if timeout:
            cancel.cancel_after(timeout / 1000, STATEMENT_TIMEOUT)
        streamed = False
        try:
            result = await self.shared.run_blocking(
                self.engine.execute,
                sql,
                list(parameters),
                analyst=self.user,
                epsilon=self._epsilon,
                bounds=self._bounds,
                cancel=cancel,
                stream=stream,
                record=CURRENT.get(),
            )
            if isinstance(result, ResultStream):
                # Sent batch by batch by the caller, which disarms the timeout once it is sent.
                streamed = True
                columns = tuple(wire_column(c.name, c.type) for c in result.columns)
                return Outcome("SELECT", columns, [], counted=True, stream=result, cancel=cancel)
        finally:
            if not streamed:
                cancel.disarm()
                self._cancel = None
        columns = tuple(wire_column(c.name, c.type) for c in result.columns)
        notices = [codec.notice(result.notice)] if result.notice else []
        return Outcome("SELECT", columns, list(result.rows), notices, counted=True)

    def session_info(self) -> SessionInfo:
        settings = self._settings.all()
        # current_setting('dpproxy.epsilon') reads what SHOW shows: the ε the next query will use.
        settings[EPSILON_SETTING] = self._effective_epsilon()
        return SessionInfo(
            user=self.user,
            database=self.database,
            application_name=self._settings.get("application_name") or "",
            backend_pid=self.process_id,
            settings=MappingProxyType(settings),
        )

    async def _run_catalog(self, sql: str, parameters: Sequence[object]) -> Outcome:
        result = await self.shared.run_blocking(
            self.shared.catalog.execute, sql, list(parameters), self.session_info()
        )
        return Outcome(result.tag, tuple(result.columns), list(result.rows))

    async def _explain(self, statement: Statement, parameters: Sequence[object]) -> Outcome:
        inner = statement.inner
        if inner is None or inner.kind not in (Kind.ENGINE, Kind.CATALOG):
            raise NotSupported("EXPLAIN is available for SELECT queries only")
        epsilon = self._epsilon

        def render() -> str:
            return self.engine.explain(
                inner.sql, list(parameters), epsilon=epsilon, bounds=self._bounds
            ).render()

        text = await self.shared.run_blocking(render)
        rows: list[tuple[object, ...]] = [(line,) for line in text.splitlines()]
        return Outcome("EXPLAIN", (WireColumn("QUERY PLAN", TEXT_OID),), rows)

    # -- transactions ---------------------------------------------------------------------------

    def _transaction_command(self, statement: Statement) -> Outcome:
        action, tag = statement.action, statement.tag
        outcome = Outcome(tag)
        status = self.status
        if action == "begin":
            if status is TransactionStatus.IDLE:
                self.status = TransactionStatus.IN_BLOCK
                self._settings.begin()
            else:
                already = ActiveTransaction("there is already a transaction in progress")
                outcome.notices.append(_warning(already))
        elif action in ("commit", "rollback"):
            if status is TransactionStatus.IDLE:
                outcome.notices.append(_warning(NoActiveTransaction("there is no transaction in progress")))
            else:
                committed = action == "commit" and status is TransactionStatus.IN_BLOCK
                self._end_transaction(committed=committed)
                if action == "commit" and not committed:
                    outcome.tag = "ROLLBACK"
        elif action in ("savepoint", "release", "rollback_to"):
            verb = {
                "savepoint": "SAVEPOINT",
                "release": "RELEASE SAVEPOINT",
                "rollback_to": "ROLLBACK TO SAVEPOINT",
            }
            if status is TransactionStatus.IDLE:
                raise NoActiveTransaction(f"{verb[action]} can only be used in transaction blocks")
            name = statement.name or ""
            if action == "savepoint":
                self._settings.savepoint(name)
            elif action == "release":
                self._settings.release(name)
            else:
                self._settings.rollback_to(name)
                self.status = TransactionStatus.IN_BLOCK
        else:
            raise NotSupported(f"{tag or 'this transaction command'} is not supported")
        return outcome

    def _end_transaction(self, *, committed: bool) -> None:
        if committed:
            self._settings.commit()
        else:
            self._settings.rollback()
        self.status = TransactionStatus.IDLE
        for name in [n for n, p in self._portals.items() if not p.holdable]:
            del self._portals[name]


def _engine_seconds(record: StatementRecord | None) -> float:
    """The seconds a record's engine stages (plan, backend, noise) add up to so far."""
    if record is None:
        return 0.0
    stages = record.stages
    return stages.get("plan", 0.0) + stages.get("backend", 0.0) + stages.get("noise", 0.0)
