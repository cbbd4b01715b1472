"""Prepared statements, portals and cursors: the extended query protocol and DECLARE/FETCH/MOVE/CLOSE.

Parse, Bind, Describe, Execute and Close keep prepared statements and portals, which SQL-level
PREPARE and EXECUTE share (one namespace, as in PostgreSQL); COPY … TO STDOUT runs its query here
and hands the rows to copyout.py to format; DECLARE makes a
cursor, a portal of the same namespace (as in PostgreSQL) that FETCH and MOVE page through. A
statement is run once, when first executed (a cursor's when declared), and its released rows are
kept: paging never runs, nor charges, a private query again. Parameters are decoded here, with the
session's text format; describing a statement asks the engine or the catalog without running it.
It never touches a socket; messages come decoded and leave as codec objects.

Audit: a portal's first Execute is one statement (its record has the Parse text and the Bind
values apart), and so is a Parse that is refused; Bind, Describe, later Executes of a suspended
portal and Close are not statements of their own.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from dpproxy.errors import (
    DPProxyError,
    DuplicateCursor,
    DuplicatePreparedStatement,
    InvalidBinary,
    InvalidCursorName,
    InvalidStatementName,
    NoActiveTransaction,
    NotSupported,
    ObjectNotInState,
    ProtocolViolation,
    SyntaxProblem,
    TooManyInSession,
    UndefinedParameter,
)
from dpproxy.wire import codec
from dpproxy.wire.codec import BackendMessage, CommandComplete, RowDescription
from dpproxy.wire.router import Kind, Statement
from dpproxy.wire.session.commands import BUDGET_COLUMNS, setting_parameter_types
from dpproxy.wire.session.copyout import copy_lines
from dpproxy.wire.session.records import (
    FROM_CURSOR,
    Outcome,
    Portal,
    PreparedStatement,
    TransactionStatus,
    expand_formats,
)
from dpproxy.wire.settings import BUDGET_SETTING, canonical
from dpproxy.wire.types import (
    BY_NAME,
    BY_OID,
    TEXT_OID,
    WireColumn,
    decoder,
    pg_type_of,
    wire_column,
    wire_type,
)

if TYPE_CHECKING:
    from dpproxy.audit import StatementRecord
    from dpproxy.wire.session.shared import EngineCatalogAuth

# Named prepared statements one session may keep, and named portals and cursors (each holds its
# parsed statement or its rows in the memory every session of the server shares).
SESSION_LIMIT = 1000


def _is_binary_cursor(statement: Statement) -> bool:
    # The router decides what a statement is; it refuses BINARY cursors today, and a `binary`
    # flag on Statement, if it comes, is honoured here.
    return bool(getattr(statement, "binary", False))


class PortalCommands:
    """Mixed into Session (machine.py), whose prepared statements and portals it keeps. From
    Session it uses `_run` and `_check_not_aborted` to run a statement, `_current_text_format` to
    decode parameters, `session_info` to describe catalog statements, `_append_rows`, `_tag`
    and `_report` to send rows, tags and settings' changes, and `_send_stream` (with `send_now`)
    to send a private answer released in batches."""

    shared: EngineCatalogAuth
    status: TransactionStatus
    _statements: dict[str, PreparedStatement]
    _portals: dict[str, Portal]
    send_now: Callable[[list[BackendMessage]], Awaitable[None]] | None
    _audited: Callable[..., AbstractContextManager[StatementRecord]]
    _note_kind: Callable[[StatementRecord, Statement], None]
    _note_answer: Callable[[StatementRecord, Outcome], None]

    def _room(self, kept: dict[str, Any], name: str, what: str, drop: str) -> None:
        """Refuse (54000) a new named `what` beyond SESSION_LIMIT of them: one analyst's session
        could otherwise fill the memory every session of the server shares."""
        if name and name not in kept and len(kept) >= SESSION_LIMIT:
            raise TooManyInSession(
                f"this session already keeps {len(kept)} {what}, the most one session may",
                hint=f"{drop} the ones no longer needed",
            )

    # -- cursors --------------------------------------------------------------------------------

    async def _cursor_command(
        self, statement: Statement, parameters: Sequence[object], in_implicit_block: bool
    ) -> Outcome:
        action, name = statement.action, statement.name or ""
        if action == "declare":
            return await self._declare(statement, parameters, in_implicit_block)
        if action == "close":
            if name.lower() == "all" and statement.tag.upper().endswith("ALL"):
                for cursor in [n for n, p in self._portals.items() if p.cursor]:
                    del self._portals[cursor]
            elif name in self._portals:
                del self._portals[name]
            else:
                raise InvalidCursorName(f'cursor "{name}" does not exist')
            return Outcome(statement.tag or "CLOSE CURSOR")
        if action in ("fetch", "move"):
            portal = self._portals.get(name)
            if portal is None or portal.outcome is None:
                raise InvalidCursorName(f'cursor "{name}" does not exist')
            count = statement.count
            if count is not None and count < 0:
                raise ObjectNotInState(
                    "cursor can only scan forward", hint="fetch forward, or declare a new cursor"
                )
            rows = portal.outcome.rows
            end = len(rows) if count is None else min(len(rows), portal.position + count)
            taken = rows[portal.position : end]
            portal.position = end
            if action == "move":
                return Outcome(f"MOVE {len(taken)}")
            return Outcome("FETCH", portal.columns, taken, formats=portal.formats, counted=True)
        raise NotSupported(f"{statement.tag or 'this cursor command'} is not supported")

    async def _declare(
        self, statement: Statement, parameters: Sequence[object], in_implicit_block: bool
    ) -> Outcome:
        name = statement.name or ""
        inner = statement.inner
        if name in self._portals:
            raise DuplicateCursor(f'cursor "{name}" already exists')
        self._room(self._portals, name, "portals and cursors", "CLOSE")
        if not statement.hold and self.status is TransactionStatus.IDLE and not in_implicit_block:
            raise NoActiveTransaction(
                "DECLARE CURSOR can only be used in transaction blocks",
                hint="run it after BEGIN, or declare it WITH HOLD",
            )
        if inner is None or inner.kind not in (Kind.ENGINE, Kind.CATALOG):
            raise NotSupported("a cursor can only be declared for a SELECT query")
        # The private query runs (and is charged) once; FETCH pages through its released rows.
        outcome = await self._run(inner, parameters)
        binary = _is_binary_cursor(statement)
        self._portals[name] = Portal(
            name,
            None,
            [],
            (1,) if binary else (),
            outcome.columns,
            holdable=statement.hold,
            cursor=True,
            outcome=outcome,
        )
        return Outcome(statement.tag or "DECLARE CURSOR", notices=outcome.notices)

    # -- COPY … TO STDOUT, PREPARE and EXECUTE ----------------------------------------------------

    async def _copy(self, statement: Statement, parameters: Sequence[object]) -> Outcome:
        """The inner query's answer, run (and charged) once as the SELECT would be, written as COPY."""
        inner, options = statement.inner, statement.copy
        assert inner is not None and options is not None
        outcome = await self._run(inner, parameters)
        columns = outcome.columns or ()
        lines = copy_lines(columns, outcome.rows, options, self._current_text_format())
        return Outcome(
            "COPY",
            None,
            outcome.rows,
            outcome.notices,
            counted=True,
            copy=lines,
            copy_width=len(columns),
            copy_format=1 if options.format == "binary" else 0,
        )

    async def _prepared_command(self, statement: Statement, parameters: Sequence[object]) -> Outcome:
        """SQL-level PREPARE and EXECUTE, over the same prepared statements as Parse and Bind."""
        name = statement.name or ""
        if statement.action == "prepare":
            inner = statement.inner
            assert inner is not None
            if name in self._statements:
                raise DuplicatePreparedStatement(f'prepared statement "{name}" already exists')
            self._room(self._statements, name, "prepared statements", "DEALLOCATE")
            given = tuple(BY_NAME[t].oid for t in statement.type_names)
            oids, columns = await self._describe_statement(inner, given)
            self._statements[name] = PreparedStatement(name, inner, oids, columns, inner.sql)
            return Outcome("PREPARE")
        prepared = self._statements.get(name)
        if prepared is None or not name:
            raise InvalidStatementName(f'prepared statement "{name}" does not exist')
        oids = prepared.parameter_oids
        if len(statement.arguments) != len(oids):
            raise SyntaxProblem(
                f'wrong number of parameters for prepared statement "{name}"',
                hint=f"expected {len(oids)} parameters but got {len(statement.arguments)}",
            )
        text_format = self._current_text_format()
        values: list[object] = []
        for argument, oid in zip(statement.arguments, oids, strict=True):
            if argument is None:
                values.append(None)
            elif isinstance(argument, int):
                if not 1 <= argument <= len(parameters):
                    raise UndefinedParameter(f"there is no parameter ${argument}")
                values.append(parameters[argument - 1])
            else:
                values.append(decoder(oid if oid in BY_OID else TEXT_OID, 0, text_format)(argument.encode()))
        self._check_not_aborted(prepared.statement)
        return await self._run(prepared.statement, values)

    # -- extended query -------------------------------------------------------------------------

    async def _extended(self, message: codec.FrontendMessage, out: list[BackendMessage]) -> None:
        if isinstance(message, codec.Parse):
            await self._parse(message)
            out.append(codec.ParseComplete())
        elif isinstance(message, codec.Bind):
            self._bind(message)
            out.append(codec.BindComplete())
        elif isinstance(message, codec.Describe):
            self._describe(message, out)
        elif isinstance(message, codec.Execute):
            await self._execute(message, out)
        elif isinstance(message, codec.Close):
            if message.kind == "S":
                self._statements.pop(message.name, None)
            else:
                self._portals.pop(message.name, None)
            out.append(codec.CloseComplete())
        # Flush: the server writes whatever is pending whenever it waits for input.

    async def _parse(self, message: codec.Parse) -> None:
        try:
            await self._prepare(message)
        except Exception:
            # A refused Parse is a statement the analyst sent: recorded (a successful one is
            # recorded when executed).
            with self._audited(message.sql):
                raise

    async def _prepare(self, message: codec.Parse) -> None:
        if message.statement and message.statement in self._statements:
            raise DuplicatePreparedStatement(f'prepared statement "{message.statement}" already exists')
        self._room(self._statements, message.statement, "prepared statements", "Close (or DEALLOCATE)")
        texts = await self.shared.split(message.sql)
        if len(texts) > 1:
            raise SyntaxProblem("cannot insert multiple commands into a prepared statement")
        try:
            statement = await self.shared.route(texts[0] if texts else "")
            self._check_not_aborted(statement)
            oids, columns = await self._describe_statement(statement, message.parameter_oids)
        except DPProxyError as error:
            if error.position is not None and texts:  # from the start of the Parse message's text
                error.position += message.sql.find(texts[0])
            raise
        self._statements[message.statement] = PreparedStatement(
            message.statement, statement, oids, columns, message.sql
        )

    async def _describe_statement(
        self, statement: Statement, given: tuple[int, ...]
    ) -> tuple[tuple[int, ...], tuple[WireColumn, ...] | str | None]:
        """Parameter types and result columns of a statement, without running it."""
        kind = statement.kind
        if kind is Kind.SESSION and statement.action == "set_config":
            columns = tuple(WireColumn(call.label, TEXT_OID) for call in statement.calls)
            return setting_parameter_types(statement.calls, given), columns
        if kind is Kind.ENGINE:
            return await self._describe_engine(statement.sql, given, with_columns=True)
        if kind is Kind.CATALOG:
            oids, columns = await self.shared.run_blocking(
                self.shared.catalog.describe, statement.sql, list(given), self.session_info()
            )
            return tuple(oids), tuple(columns)
        if kind is Kind.EXPLAIN:
            inner = statement.inner
            oids = given
            if inner is not None and inner.kind is Kind.ENGINE:
                oids, _ = await self._describe_engine(inner.sql, given, with_columns=False)
            return oids, (WireColumn("QUERY PLAN", TEXT_OID),)
        if kind is Kind.CURSOR:
            inner = statement.inner
            if statement.action == "declare" and inner is not None:
                if inner.kind is Kind.ENGINE:
                    oids, _ = await self._describe_engine(inner.sql, given, with_columns=False)
                    return oids, None
                if inner.kind is Kind.CATALOG:
                    oids, _ = await self.shared.run_blocking(
                        self.shared.catalog.describe, inner.sql, list(given), self.session_info()
                    )
                    return tuple(oids), None
            if statement.action == "fetch":
                return given, FROM_CURSOR
            return given, None
        if kind is Kind.COPY:
            inner = statement.inner
            if inner is not None and inner.kind is Kind.ENGINE:
                oids, _ = await self._describe_engine(inner.sql, given, with_columns=False)
                return oids, None
            return given, None
        if kind is Kind.PREPARED:
            if statement.action == "execute":
                prepared = self._statements.get(statement.name or "")
                if prepared is not None:
                    return given, self._statement_columns(prepared)
            return given, None
        if kind is Kind.SESSION and statement.action == "show":
            name = (statement.name or "").lower()
            if name == "all":
                return given, tuple(WireColumn(c, TEXT_OID) for c in ("name", "setting", "description"))
            if name == BUDGET_SETTING:
                return given, tuple(WireColumn(n, TEXT_OID) for n in BUDGET_COLUMNS)
            return given, (WireColumn(canonical(name), TEXT_OID),)
        return given, None

    async def _describe_engine(
        self, sql: str, given: tuple[int, ...], *, with_columns: bool
    ) -> tuple[tuple[int, ...], tuple[WireColumn, ...] | None]:
        requested = tuple(pg_type_of(oid) if oid else None for oid in given)
        description = await self.shared.describe(sql, requested)
        oids = tuple(
            given[i]
            if i < len(given) and given[i]
            else wire_type(t).array_oid or wire_type(t).oid
            if i in description.arrays
            else wire_type(t).oid
            for i, t in enumerate(description.parameter_types)
        )
        if len(given) > len(oids):
            oids += given[len(oids) :]
        columns = tuple(wire_column(c.name, c.type) for c in description.columns) if with_columns else None
        return oids, columns

    def _statement_columns(self, prepared: PreparedStatement) -> tuple[WireColumn, ...] | None:
        columns = prepared.columns
        if isinstance(columns, str):  # FETCH: the cursor's columns, if it exists now
            cursor = self._portals.get(prepared.statement.name or "")
            return cursor.columns if cursor is not None else None
        return columns

    def _bind(self, message: codec.Bind) -> None:
        prepared = self._statements.get(message.statement)
        if prepared is None:
            if message.statement:
                raise InvalidStatementName(f'prepared statement "{message.statement}" does not exist')
            raise InvalidStatementName("unnamed prepared statement does not exist")
        self._check_not_aborted(prepared.statement)
        oids = prepared.parameter_oids
        values = message.parameters
        if len(values) != len(oids):
            raise ProtocolViolation(
                f"bind message supplies {len(values)} parameters, but prepared statement "
                f'"{prepared.name}" requires {len(oids)}'
            )
        if len(message.parameter_formats) not in (0, 1, len(values)):
            raise ProtocolViolation(
                f"bind message has {len(message.parameter_formats)} parameter formats "
                f"but {len(values)} parameters"
            )
        formats = expand_formats(message.parameter_formats, len(values))
        text_format = self._current_text_format()
        parameters: list[object] = []
        for i, (raw, oid, fmt) in enumerate(zip(values, oids, formats, strict=True)):
            if raw is None:
                parameters.append(None)
                continue
            try:
                parameters.append(decoder(oid, fmt, text_format)(raw))
            except InvalidBinary as error:
                raise InvalidBinary(
                    f"incorrect binary data format in bind parameter {i + 1}", hint=error.message
                ) from None
        if message.portal and message.portal in self._portals:
            raise DuplicateCursor(f'portal "{message.portal}" already exists')
        self._room(self._portals, message.portal, "portals and cursors", "Close")
        columns = self._statement_columns(prepared)
        count = len(columns) if columns is not None else 0
        if len(message.result_formats) not in (0, 1, count):
            raise ProtocolViolation(
                f"bind message has {len(message.result_formats)} result formats but query has {count} columns"
            )
        self._portals[message.portal] = Portal(
            message.portal, prepared, parameters, message.result_formats, columns
        )

    def _describe(self, message: codec.Describe, out: list[BackendMessage]) -> None:
        if message.kind == "S":
            prepared = self._statements.get(message.name)
            if prepared is None:
                raise InvalidStatementName(f'prepared statement "{message.name}" does not exist')
            out.append(codec.ParameterDescription(prepared.parameter_oids))
            columns = self._statement_columns(prepared)
            # Formats are not known before Bind: a statement's description says text.
            self._describe_columns(columns, (), out)
            return
        portal = self._portals.get(message.name)
        if portal is None:
            raise InvalidCursorName(f'portal "{message.name}" does not exist')
        self._describe_columns(portal.columns, portal.formats, out)

    @staticmethod
    def _describe_columns(
        columns: tuple[WireColumn, ...] | None, formats: Sequence[int], out: list[BackendMessage]
    ) -> None:
        if columns is None:
            out.append(codec.NoData())
        else:
            out.append(RowDescription(columns, expand_formats(formats, len(columns))))

    async def _execute(self, message: codec.Execute, out: list[BackendMessage]) -> None:
        portal = self._portals.get(message.portal)
        if portal is None:
            raise InvalidCursorName(f'portal "{message.portal}" does not exist')
        if portal.outcome is None:
            assert portal.prepared is not None
            prepared = portal.prepared
            with self._audited(
                prepared.text or prepared.statement.sql, portal.parameters, prepared.statement
            ) as record:
                sending = await self._execute_first(portal, message, out)
                if portal.outcome is not None:
                    self._note_answer(record, portal.outcome)
                    if sending is not None:
                        record.add_stage("wire", time.perf_counter() - sending)
            return
        await self._execute_again(portal, message, out)

    async def _execute_first(
        self, portal: Portal, message: codec.Execute, out: list[BackendMessage]
    ) -> float | None:
        """A portal's first Execute runs its statement. Returns when the answer started to be queued
        (None for a streamed answer, which times itself)."""
        assert portal.prepared is not None
        self._check_not_aborted(portal.prepared.statement)
        # An Execute for all rows streams a large private answer; one with a row limit keeps the
        # released rows for the portal's later Executes.
        stream = message.max_rows == 0 and self.send_now is not None
        outcome = await self._run(portal.prepared.statement, portal.parameters, stream=stream)
        sending = time.perf_counter()
        portal.outcome = outcome
        if outcome.empty:
            portal.done = True
            out.append(codec.EmptyQueryResponse())
            return sending
        out.extend(self._visible(outcome.notices))
        if outcome.copy is not None:
            portal.done = True
            self._append_copy(outcome, out)
            return sending
        if portal.columns is None or (
            outcome.columns is not None and len(outcome.columns) != len(portal.columns)
        ):
            portal.columns = outcome.columns
        if outcome.stream is not None:
            portal.done = True
            if portal.columns is None:
                # Described as returning no rows: as below, the rows are not sent.
                await self.shared.run_blocking(outcome.stream.close)
                self._end_stream(outcome)
                out.append(CommandComplete(outcome.tag))
                return sending
            formats = expand_formats(portal.formats, len(portal.columns))
            await self._send_stream(outcome, formats, out)
            portal.position = 0  # the rows were not kept: a finished portal completes with none
            return None
        await self._execute_again(portal, message, out)
        return sending

    async def _execute_again(self, portal: Portal, message: codec.Execute, out: list[BackendMessage]) -> None:
        """An Execute of a portal whose statement has run: its next rows (or its completion)."""
        outcome = portal.outcome
        assert outcome is not None
        if outcome.empty:
            out.append(codec.EmptyQueryResponse())
            return
        if outcome.copy is not None:  # as PostgreSQL: a finished portal completes with no rows
            out.append(CommandComplete("COPY 0"))
            return
        if outcome.columns is None or portal.columns is None:
            out.append(CommandComplete(outcome.tag))
            self._report(out)
            return
        rows = outcome.rows
        start = portal.position
        end = len(rows) if message.max_rows == 0 else min(len(rows), start + message.max_rows)
        formats = expand_formats(portal.formats, len(portal.columns))
        self._append_rows(portal.columns, formats, rows[start:end], out)
        portal.position = end
        if end < len(rows):
            out.append(codec.PortalSuspended())
            return
        # The count of a portal run in several Executes is that of the whole portal.
        out.append(CommandComplete(self._tag(outcome, end if not portal.done else 0)))
        portal.done = True
