"""The state machine of one client connection: startup, authentication, simple and extended query.

A Session is fed frontend messages (`start`, then `handle`) and answers with backend messages; it
never touches a socket (the server moves bytes) and never decides what a statement is (the router
does). It owns what PostgreSQL keeps per backend: settings (SET/RESET/SHOW, with transaction
semantics), the transaction status (I/T/E), prepared statements, portals and cursors, the analyst
and the session's `dpproxy.epsilon`. Session commands, transaction control and cursors are
answered here; catalog statements go to the shadow catalog, queries on exposed tables to the
engine, EXPLAIN to `engine.explain`. Calls that may block (engine, catalog, budget, routing of long
text) run in the server's worker threads through `SessionServices.run_blocking`.

Nothing reaches the engine or the catalog before authentication succeeds. Errors a client sees are
DPProxyErrors rendered here once; any other exception becomes a fixed internal-error message, and
its text (which could hold a value) goes only to the operator's log.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import math
import re
import zoneinfo
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from dpproxy import __version__
from dpproxy.backends import Cancellation
from dpproxy.engine import Engine
from dpproxy.errors import (
    ActiveTransaction,
    CantChangeParameter,
    DPProxyError,
    DuplicateCursor,
    DuplicatePreparedStatement,
    InFailedTransaction,
    InternalError,
    InvalidBinary,
    InvalidCursorName,
    InvalidName,
    InvalidParameter,
    InvalidSavepoint,
    InvalidStatementName,
    InvalidText,
    NoActiveTransaction,
    NotSupported,
    NullValueNotAllowed,
    ObjectNotInState,
    PolicyViolation,
    ProtocolViolation,
    SyntaxProblem,
    UndefinedObject,
    UndefinedParameter,
    UnknownAnalyst,
)
from dpproxy.policy import AnalystPolicy
from dpproxy.sql.types import boolean_from_text
from dpproxy.wire import codec
from dpproxy.wire.auth import Authenticator, AuthExchange
from dpproxy.wire.catalog import DEFAULT_SETTINGS as CATALOG_SETTINGS
from dpproxy.wire.catalog import SessionInfo, ShadowCatalog
from dpproxy.wire.codec import (
    BackendMessage,
    CommandComplete,
    DataRow,
    ErrorResponse,
    ParameterStatus,
    ReadyForQuery,
    RowDescription,
)
from dpproxy.wire.router import (
    Argument,
    Kind,
    SettingCall,
    Statement,
    route,
    split_statements,
)
from dpproxy.wire.types import (
    TEXT_OID,
    TextFormat,
    WireColumn,
    decoder,
    encoder,
    float_text,
    pg_type_of,
    wire_column,
    wire_type,
)

log = logging.getLogger("dpproxy.wire")

RunBlocking = Callable[..., Awaitable[Any]]

PG_VERSION = "15.0"
SERVER_VERSION = f"{PG_VERSION} (dpproxy {'.'.join(__version__.split('.')[:2])})"
SERVER_VERSION_NUM = "150000"

INTERNAL_ERROR = "internal error in dpproxy; the operator's log has the details"


# ---------------------------------------------------------------------------------------------
# Errors raised here (SQLSTATEs as PostgreSQL uses them)
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------

# Settings with PostgreSQL-like defaults, by lowercase name. Anything else may be SET freely.
DEFAULT_SETTINGS: dict[str, str] = {
    "application_name": "",
    "block_size": "8192",
    "bytea_output": "hex",
    "client_encoding": "UTF8",
    "client_min_messages": "notice",
    "datestyle": "ISO, MDY",
    "default_transaction_deferrable": "off",
    "default_transaction_isolation": "read committed",
    "default_transaction_read_only": "off",
    "escape_string_warning": "on",
    "extra_float_digits": "1",
    "idle_in_transaction_session_timeout": "0",
    "in_hot_standby": "off",
    "integer_datetimes": "on",
    "intervalstyle": "postgres",
    "is_superuser": "off",
    "lc_collate": "C",
    "lc_ctype": "C",
    "lc_messages": "C",
    "lc_monetary": "C",
    "lc_numeric": "C",
    "lc_time": "C",
    "lock_timeout": "0",
    "max_identifier_length": "63",
    "search_path": '"$user", public',
    "server_encoding": "UTF8",
    "server_version": SERVER_VERSION,
    "server_version_num": SERVER_VERSION_NUM,
    "standard_conforming_strings": "on",
    "statement_timeout": "0",
    "timezone": "UTC",
    "transaction_deferrable": "off",
    "transaction_isolation": "read committed",
    "transaction_read_only": "off",
}

# A transaction's modes: what SET TRANSACTION chose in this block, else the session's defaults
# (SET SESSION CHARACTERISTICS), as PostgreSQL starts each transaction. Every transaction through
# dpproxy is read-only and each query is answered on its own, so the modes only need to read back
# as they were set (pgjdbc's getTransactionIsolation, DBeaver's connection settings).
TRANSACTION_MODES = ("transaction_deferrable", "transaction_isolation", "transaction_read_only")

# PostgreSQL's spelling of settings whose names are not all lowercase (SHOW headers, ParameterStatus).
CANONICAL_NAMES = {"datestyle": "DateStyle", "intervalstyle": "IntervalStyle", "timezone": "TimeZone"}

# GUC_REPORT settings: sent as ParameterStatus at startup and whenever they change.
REPORTED = (
    "application_name",
    "client_encoding",
    "datestyle",
    "default_transaction_read_only",
    "in_hot_standby",
    "integer_datetimes",
    "intervalstyle",
    "is_superuser",
    "server_encoding",
    "server_version",
    "session_authorization",
    "standard_conforming_strings",
    "timezone",
)

READ_ONLY = frozenset(
    {
        "block_size",
        "in_hot_standby",
        "integer_datetimes",
        "is_superuser",
        "lc_collate",
        "lc_ctype",
        "max_identifier_length",
        "server_encoding",
        "server_version",
        "server_version_num",
    }
)

# The catalog's fixed values (pg_settings, current_setting()) of settings a session cannot change.
_CATALOG_SETTINGS = {name.lower(): value for name, value in CATALOG_SETTINGS.items()}

EPSILON_SETTING = "dpproxy.epsilon"
BUDGET_SETTING = "dpproxy.budget"
# As PostgreSQL's clean_encoding_name: case and anything but letters and digits do not count, so
# 'utf-8', "UTF8", Unicode and asyncpg's quoted "'utf-8'" all name UTF8.
_UTF8_NAMES = {"utf8", "unicode", "sqlascii"}
_DATE_ORDERS = ("MDY", "DMY", "YMD")


def _canonical(name: str) -> str:
    return CANONICAL_NAMES.get(name, name)


def _invalid_value(name: str, value: str, hint: str | None = None) -> InvalidParameter:
    return InvalidParameter(f'invalid value for parameter "{_canonical(name)}": "{value}"', hint=hint)


def _check_client_encoding(value: str) -> str:
    # SQL_ASCII means "no conversion": bytes pass through, which is what UTF8 text needs.
    if "".join(c for c in value.lower() if c.isascii() and c.isalnum()) not in _UTF8_NAMES:
        raise InvalidParameter(
            f'dpproxy speaks UTF8 only: client_encoding "{value}" is not supported',
            hint="set client_encoding to UTF8 (PGCLIENTENCODING=UTF8)",
        )
    return "UTF8"


def _check_datestyle(value: str) -> str:
    parts = [p.strip().upper() for p in value.split(",") if p.strip()]
    order = next((p for p in parts if p in _DATE_ORDERS or p in ("US", "NONEURO", "EURO", "EUROPEAN")), "MDY")
    order = {"US": "MDY", "NONEURO": "MDY", "EURO": "DMY", "EUROPEAN": "DMY"}.get(order, order)
    styles = [p for p in parts if p not in _DATE_ORDERS and p not in ("US", "NONEURO", "EURO", "EUROPEAN")]
    if any(s != "ISO" for s in styles) or not parts:
        raise NotSupported(
            f'dpproxy writes dates in ISO style only: DateStyle "{value}" is not supported',
            hint="SET DateStyle = 'ISO, MDY'",
        )
    return f"ISO, {order}"


_OFFSET = re.compile(r"([+-]?)(\d{1,2})(?::?(\d{2}))?")


@functools.lru_cache(maxsize=256)
def zone(name: str) -> dt.tzinfo:
    """The tzinfo of a TimeZone setting; ValueError when PostgreSQL would not know it either."""
    text = name.strip()
    if text.upper() in ("UTC", "GMT", "Z", "ZULU", "UCT", "UNIVERSAL", "ETC/UTC", "ETC/GMT"):
        return dt.UTC
    match = _OFFSET.fullmatch(text)
    if match:
        hours, minutes = int(match[2]), int(match[3] or 0)
        if hours > 15 or minutes > 59:
            raise ValueError(name)
        offset = dt.timedelta(hours=hours, minutes=minutes)
        return dt.timezone(-offset if match[1] == "-" else offset)
    try:
        return zoneinfo.ZoneInfo(text)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        pass
    # PostgreSQL matches zone names without regard to case.
    folded = {n.lower(): n for n in zoneinfo.available_timezones()}
    if text.lower() in folded:
        return zoneinfo.ZoneInfo(folded[text.lower()])
    raise ValueError(name)


def _check_timezone(value: str) -> str:
    try:
        tz = zone(value)
    except ValueError:
        raise _invalid_value("timezone", value) from None
    return "UTC" if tz is dt.UTC else value.strip()


def _check_extra_float_digits(value: str) -> str:
    try:
        digits = int(value.strip())
    except ValueError:
        raise InvalidParameter(
            f'invalid value for parameter "extra_float_digits": "{value}"', hint="write an integer"
        ) from None
    if not -15 <= digits <= 3:
        raise InvalidParameter(
            f'{digits} is outside the valid range for parameter "extra_float_digits" (-15 .. 3)'
        )
    return str(digits)


def _check_intervalstyle(value: str) -> str:
    if value.strip().lower() != "postgres":
        raise NotSupported(f'IntervalStyle "{value}" is not supported', hint="SET IntervalStyle = postgres")
    return "postgres"


def _check_standard_conforming_strings(value: str) -> str:
    if value.strip().lower() not in ("on", "true", "1", "yes"):
        raise NotSupported(
            "standard_conforming_strings cannot be turned off",
            hint="write backslash escapes as E'…' strings",
        )
    return "on"


_ISOLATION_LEVELS = ("serializable", "repeatable read", "read committed", "read uncommitted")


def _check_isolation(name: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        level = " ".join(value.lower().split())
        if level not in _ISOLATION_LEVELS:
            raise _invalid_value(name, value, hint="write " + ", ".join(_ISOLATION_LEVELS))
        return level

    return check


def _check_boolean(name: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        word = value.strip().lower()
        if word in ("on", "true", "yes", "1", "t", "y"):
            return "on"
        if word in ("off", "false", "no", "0", "f", "n"):
            return "off"
        raise _invalid_value(name, value, hint="write on or off")

    return check


_CHECKS: dict[str, Callable[[str], str]] = {
    "client_encoding": _check_client_encoding,
    "datestyle": _check_datestyle,
    "timezone": _check_timezone,
    "extra_float_digits": _check_extra_float_digits,
    "intervalstyle": _check_intervalstyle,
    "standard_conforming_strings": _check_standard_conforming_strings,
    "transaction_read_only": _check_boolean("transaction_read_only"),
    "default_transaction_read_only": _check_boolean("default_transaction_read_only"),
    "transaction_deferrable": _check_boolean("transaction_deferrable"),
    "default_transaction_deferrable": _check_boolean("default_transaction_deferrable"),
    "transaction_isolation": _check_isolation("transaction_isolation"),
    "default_transaction_isolation": _check_isolation("default_transaction_isolation"),
}


def parse_options(text: str) -> list[tuple[str, str]]:
    """The `-c name=value` / `--name=value` pairs of a startup `options` string (backslash escapes)."""
    words: list[str] = []
    current: list[str] = []
    escaped = False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char.isspace():
            if current:
                words.append("".join(current))
                current = []
        else:
            current.append(char)
    if current:
        words.append("".join(current))
    pairs: list[tuple[str, str]] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "-c" and i + 1 < len(words):
            word, i = words[i + 1], i + 1
        elif word.startswith("-c") or word.startswith("--"):
            word = word[2:]
        else:
            raise InvalidParameter(
                f'invalid command-line argument for server process: "{word}"',
                hint="use -c name=value in options",
            )
        name, equals, value = word.partition("=")
        if not equals:
            raise InvalidParameter(f'invalid command-line argument for server process: "{word}"')
        pairs.append((name.replace("-", "_").lower(), value))
        i += 1
    return pairs


@dataclass
class _Settings:
    """Setting values with PostgreSQL's transaction semantics: SET lasts for the session (undone
    by ROLLBACK), SET LOCAL until the end of the transaction; savepoints snapshot both."""

    baseline: dict[str, str]  # defaults and startup parameters: what RESET returns to
    session: dict[str, str] = field(default_factory=dict)
    local: dict[str, str] = field(default_factory=dict)
    _transaction: tuple[dict[str, str], dict[str, str]] | None = None
    _savepoints: list[tuple[str, dict[str, str], dict[str, str]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.session = dict(self.baseline)

    def get(self, name: str) -> str | None:
        value = self.local.get(name)
        if value is None and name in TRANSACTION_MODES:
            value = self.session.get(f"default_{name}")
        return value if value is not None else self.session.get(name)

    def all(self) -> dict[str, str]:
        merged = {**self.session, **self.local}
        for name in TRANSACTION_MODES:
            merged[name] = self.get(name) or merged.get(name, "")
        return merged

    def set(self, name: str, value: str, *, local: bool) -> None:
        if local:
            self.local[name] = value
        else:
            self.session[name] = value
            self.local.pop(name, None)

    def reset(self, name: str, *, local: bool = False) -> None:
        if name in self.baseline:
            self.set(name, self.baseline[name], local=local)
        else:
            self.session.pop(name, None)
            self.local.pop(name, None)

    def reset_all(self) -> None:
        self.session = dict(self.baseline)
        self.local.clear()

    def snapshot(self) -> tuple[dict[str, str], dict[str, str]]:
        return dict(self.session), dict(self.local)

    def restore(self, snapshot: tuple[dict[str, str], dict[str, str]]) -> None:
        self.session, self.local = dict(snapshot[0]), dict(snapshot[1])

    def begin(self) -> None:
        self._transaction = (dict(self.session), dict(self.local))
        self._savepoints.clear()

    def commit(self) -> None:
        self.local.clear()
        self._transaction = None
        self._savepoints.clear()

    def rollback(self) -> None:
        if self._transaction is not None:
            self.session = self._transaction[0]
        self.local.clear()
        self._transaction = None
        self._savepoints.clear()

    def savepoint(self, name: str) -> None:
        self._savepoints.append((name, dict(self.session), dict(self.local)))

    def _find(self, name: str, verb: str) -> int:
        for i in range(len(self._savepoints) - 1, -1, -1):
            if self._savepoints[i][0] == name:
                return i
        raise InvalidSavepoint(f'savepoint "{name}" does not exist', hint=f"{verb} a savepoint made earlier")

    def release(self, name: str) -> None:
        del self._savepoints[self._find(name, "release") :]

    def rollback_to(self, name: str) -> None:
        i = self._find(name, "roll back to")
        _, session, local = self._savepoints[i]
        self.session, self.local = dict(session), dict(local)
        del self._savepoints[i + 1 :]


# set_config(text, text, boolean) and current_setting(text, boolean): a $n argument's type.
_BOOL_OID = 16
_SETTING_ARGUMENT_TYPES = {
    "set_config": (TEXT_OID, TEXT_OID, _BOOL_OID),
    "current_setting": (TEXT_OID, _BOOL_OID),
}


# A setting name as SET's grammar reads one: identifiers separated by dots.
_SETTING_NAME = re.compile(
    r"[a-z_\u0080-\uffff][a-z0-9_$\u0080-\uffff]*(?:\.[a-z_\u0080-\uffff][a-z0-9_$\u0080-\uffff]*)*"
)


def _setting_parameter_types(calls: Sequence[SettingCall], given: tuple[int, ...]) -> tuple[int, ...]:
    """The types of a set_config statement's parameters: the client's, else the argument's."""
    inferred: dict[int, int] = {}
    for call in calls:
        for argument, oid in zip(call.arguments, _SETTING_ARGUMENT_TYPES[call.function], strict=False):
            if isinstance(argument, int):
                inferred.setdefault(argument, oid)
    count = max([*inferred, len(given)], default=0)
    return tuple(
        given[i] if i < len(given) and given[i] else inferred.get(i + 1, TEXT_OID) for i in range(count)
    )


def _bound(argument: Argument, parameters: Sequence[object]) -> object:
    """A set_config argument's value: the constant, or the parameter's."""
    if not isinstance(argument, int):
        return argument
    if not 1 <= argument <= len(parameters):
        raise UndefinedParameter(f"there is no parameter ${argument}")
    return parameters[argument - 1]


def _as_text(value: object) -> str:
    """A value as text, as PostgreSQL casts it (a boolean is true or false)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _as_boolean(value: object) -> bool:
    """A boolean argument: a decoded parameter, or text as PostgreSQL's boolean input reads it."""
    if isinstance(value, bool):
        return value
    parsed = boolean_from_text(_as_text(value))
    if parsed is None:
        raise InvalidText(f'invalid input syntax for type boolean: "{value}"')
    return parsed


# ---------------------------------------------------------------------------------------------
# Shared services
# ---------------------------------------------------------------------------------------------

_ROUTE_CACHE_SIZE = 1024
_CACHEABLE_TEXT = 8192  # longer statements are routed and described each time
_INLINE_SPLIT = 4096  # longer query strings are split in a worker thread


class SessionServices:
    """What all sessions of one server share: engine, catalog, authenticator and worker threads.

    Routing and describing are pure functions of the text (and the policy): their results are
    cached here, touched only from the event loop thread, so repeated statements skip sqlglot.
    """

    def __init__(
        self,
        engine: Engine,
        catalog: ShadowCatalog,
        run_blocking: RunBlocking,
        authenticator: Authenticator | None = None,
    ) -> None:
        self.engine = engine
        self.catalog = catalog
        self.run_blocking = run_blocking
        self.authenticator = authenticator or Authenticator(engine.policy)
        self.exposed = frozenset(t.name for t in engine.exposed_tables())
        self._routes: OrderedDict[str, Statement] = OrderedDict()
        self._descriptions: OrderedDict[tuple[str, tuple[Any, ...]], Any] = OrderedDict()

    async def split(self, sql: str) -> list[str]:
        if len(sql) <= _INLINE_SPLIT:
            return split_statements(sql)
        return await self.run_blocking(split_statements, sql)  # type: ignore[no-any-return]

    async def route(self, sql: str) -> Statement:
        cached = self._routes.get(sql)
        if cached is not None:
            self._routes.move_to_end(sql)
            return cached
        statement: Statement = await self.run_blocking(route, sql, self.exposed)
        if len(sql) <= _CACHEABLE_TEXT:
            self._routes[sql] = statement
            if len(self._routes) > _ROUTE_CACHE_SIZE:
                self._routes.popitem(last=False)
        return statement

    async def describe(self, sql: str, parameter_types: tuple[Any, ...]) -> Any:
        key = (sql, parameter_types)
        cached = self._descriptions.get(key)
        if cached is not None:
            self._descriptions.move_to_end(key)
            return cached
        description = await self.run_blocking(self.engine.describe, sql, list(parameter_types))
        if len(sql) <= _CACHEABLE_TEXT:
            self._descriptions[key] = description
            if len(self._descriptions) > _ROUTE_CACHE_SIZE:
                self._descriptions.popitem(last=False)
        return description


# ---------------------------------------------------------------------------------------------
# Statements, portals, outcomes
# ---------------------------------------------------------------------------------------------


class TransactionStatus(StrEnum):
    IDLE = "I"
    IN_BLOCK = "T"
    FAILED = "E"


class Phase(StrEnum):
    STARTUP = "startup"
    AUTHENTICATING = "authenticating"
    READY = "ready"
    CLOSED = "closed"


@dataclass
class Outcome:
    """What running one statement produced, before it is encoded for the client."""

    tag: str
    columns: tuple[WireColumn, ...] | None = None  # None: no result set (CommandComplete only)
    rows: list[tuple[object, ...]] = field(default_factory=list)
    notices: list[ErrorResponse] = field(default_factory=list)
    empty: bool = False  # an empty query string: EmptyQueryResponse
    formats: tuple[int, ...] = ()  # result formats chosen by the statement itself (BINARY cursors)
    counted: bool = False  # tag takes the row count ("SELECT n", "FETCH n")


# A prepared statement's result columns when they depend on a cursor (FETCH): resolved late.
_FROM_CURSOR = "from cursor"


@dataclass
class PreparedStatement:
    name: str
    statement: Statement
    parameter_oids: tuple[int, ...]
    columns: tuple[WireColumn, ...] | str | None  # str: _FROM_CURSOR


@dataclass
class Portal:
    """A Bind's portal or a DECLAREd cursor (they share one namespace, as in PostgreSQL)."""

    name: str
    prepared: PreparedStatement | None
    parameters: list[object]
    formats: tuple[int, ...]
    columns: tuple[WireColumn, ...] | None
    holdable: bool = False
    cursor: bool = False
    outcome: Outcome | None = None
    position: int = 0
    done: bool = False


def _expand_formats(formats: Sequence[int], count: int) -> tuple[int, ...]:
    if not formats:
        return (0,) * count
    if len(formats) == 1:
        return (formats[0],) * count
    return tuple(formats)


def _is_binary_cursor(statement: Statement) -> bool:
    # The router decides what a statement is; it refuses BINARY cursors today, and a `binary`
    # flag on Statement, if it comes, is honoured here.
    return bool(getattr(statement, "binary", False))


# ---------------------------------------------------------------------------------------------
# The session
# ---------------------------------------------------------------------------------------------


class Session:
    """One connection's protocol state. `start()` the startup packet, then `handle()` each message;
    both return the backend messages to send. `closing` turns True when the connection must end."""

    def __init__(self, services: SessionServices, process_id: int, secret_key: int) -> None:
        self.services = services
        self.engine = services.engine
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
        self._settings = _Settings(dict(DEFAULT_SETTINGS))
        self._reported: dict[str, str] = {}
        self._statements: dict[str, PreparedStatement] = {}
        self._portals: dict[str, Portal] = {}
        self._skipping = False  # after an error in the extended protocol, until Sync
        self._cancel: Cancellation | None = None
        self._text_format_key: tuple[str, str] | None = None
        self._text_format = TextFormat()

    # -- entry points -------------------------------------------------------------------------------

    @property
    def authenticated(self) -> bool:
        return self.phase is Phase.READY

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
        self._exchange = self.services.authenticator.start(user)
        self.phase = Phase.AUTHENTICATING
        out.append(self._exchange.start())
        return out

    async def handle(self, message: codec.FrontendMessage) -> list[BackendMessage]:
        out: list[BackendMessage] = []
        try:
            if self.phase is Phase.AUTHENTICATING:
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
        except Exception:
            log.exception("internal error in session %d", self.process_id)
            if self.phase is not Phase.READY:
                self._fatal(out, InternalError(INTERNAL_ERROR))
            else:
                # The text of an unexpected exception could hold a value: it stays in the log.
                out.append(ErrorResponse("ERROR", "XX000", INTERNAL_ERROR))
                if isinstance(message, codec.EXTENDED):
                    self._after_error(extended=True)
                elif not isinstance(message, codec.Sync):
                    self._after_error(extended=False)
                    out.append(ReadyForQuery(self.status.value))
        return out

    def _fatal(self, out: list[BackendMessage], error: DPProxyError) -> list[BackendMessage]:
        out.append(codec.error_from(error, severity="FATAL"))
        self.closing = True
        self.phase = Phase.CLOSED
        return out

    # -- authentication -------------------------------------------------------------------------

    async def _authenticate(self, message: codec.FrontendMessage, out: list[BackendMessage]) -> None:
        if isinstance(message, codec.Terminate):
            self.closing = True
            self.phase = Phase.CLOSED
            return
        if not isinstance(message, codec.AuthenticationResponse):
            raise ProtocolViolation(f"expected password response, got {type(message).__name__}")
        exchange = self._exchange
        assert exchange is not None
        step = await exchange.respond(message, self.services.run_blocking)
        if step.reply is not None:
            out.append(step.reply)
        if not step.finished:
            return
        if not exchange.authenticated:
            self._fatal(out, exchange.failure())
            return
        self.analyst = self.engine.analyst(self.user)
        self._exchange = None
        out.append(codec.AuthenticationOk())
        self._settings = _Settings({**DEFAULT_SETTINGS, "session_authorization": self.user})
        for name, value in self._startup_items():
            try:
                self._apply_setting(name, value, local=False, baseline=True)
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
        if isinstance(message, codec.Terminate):
            self.closing = True
            self.phase = Phase.CLOSED
            return
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

    # -- simple query ---------------------------------------------------------------------------

    async def _simple_query(self, sql: str, out: list[BackendMessage]) -> None:
        try:
            texts = await self.services.split(sql)
        except DPProxyError as error:
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
        for text in texts:
            try:
                statement = await self.services.route(text)
                self._check_not_aborted(statement)
                outcome = await self._run(statement, [], in_implicit_block=implicit_block)
                self._send_outcome(outcome, out)
            except DPProxyError as error:
                out.append(codec.error_from(error))
                self._after_error(extended=False)
                failed = True
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
        out.extend(outcome.notices)
        if outcome.columns is not None:
            formats = _expand_formats(outcome.formats, len(outcome.columns))
            out.append(RowDescription(outcome.columns, formats))
            self._append_rows(outcome.columns, formats, outcome.rows, out)
        out.append(CommandComplete(self._tag(outcome, len(outcome.rows))))
        self._report(out)

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
                out.append(ParameterStatus(_canonical(name), value))

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
        self, statement: Statement, parameters: Sequence[object], *, in_implicit_block: bool = False
    ) -> Outcome:
        kind = statement.kind
        if kind is Kind.ENGINE:
            return await self._run_engine(statement.sql, parameters)
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
        if kind is Kind.EMPTY:
            return Outcome("", empty=True)
        raise NotSupported(f"{statement.tag or 'this statement'} is not supported")

    @property
    def _epsilon(self) -> float | None:
        value = self._settings.get(EPSILON_SETTING)
        return float(value) if value else None

    async def _run_engine(self, sql: str, parameters: Sequence[object]) -> Outcome:
        cancel = Cancellation()
        self._cancel = cancel
        try:
            result = await self.services.run_blocking(
                self.engine.execute,
                sql,
                list(parameters),
                analyst=self.user,
                epsilon=self._epsilon,
                cancel=cancel,
            )
        finally:
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
        result = await self.services.run_blocking(
            self.services.catalog.execute, sql, list(parameters), self.session_info()
        )
        return Outcome(result.tag, tuple(result.columns), list(result.rows))

    async def _explain(self, statement: Statement, parameters: Sequence[object]) -> Outcome:
        inner = statement.inner
        if inner is None or inner.kind not in (Kind.ENGINE, Kind.CATALOG):
            raise NotSupported("EXPLAIN is available for SELECT queries only")
        epsilon = self._epsilon

        def render() -> str:
            return self.engine.explain(inner.sql, list(parameters), epsilon=epsilon).render()

        text = await self.services.run_blocking(render)
        rows: list[tuple[object, ...]] = [(line,) for line in text.splitlines()]
        return Outcome("EXPLAIN", (WireColumn("QUERY PLAN", TEXT_OID),), rows)

    # -- session commands ------------------------------------------------------------------------

    async def _session_command(self, statement: Statement, parameters: Sequence[object] = ()) -> Outcome:
        action = statement.action
        if action == "set_config":
            return self._setting_functions(statement.calls, parameters)
        # Setting names are case-insensitive; prepared statement names are not.
        name = (statement.name or "").lower() if action != "deallocate" else statement.name or ""
        if action == "set":
            if name:
                if statement.value is None:
                    self._reset_setting(name, local=statement.local)
                else:
                    self._apply_setting(name, statement.value, local=statement.local)
            return Outcome(statement.tag or "SET")
        if action == "reset":
            if name == "all":
                self._settings.reset_all()
            else:
                self._reset_setting(name, local=False)
            return Outcome(statement.tag or "RESET")
        if action == "show":
            return await self._show(name, statement.tag or "SHOW")
        if action == "discard":
            return self._discard(name, statement.tag)
        if action == "deallocate":
            if name.lower() == "all" and statement.tag.endswith("ALL"):
                self._statements = {k: v for k, v in self._statements.items() if not k}
            elif name in self._statements and name:
                del self._statements[name]
            else:
                raise InvalidStatementName(f'prepared statement "{name}" does not exist')
            return Outcome(statement.tag or "DEALLOCATE")
        raise NotSupported(f"{statement.tag or 'this session command'} is not supported")

    def _apply_setting(self, name: str, value: str, *, local: bool, baseline: bool = False) -> str:
        """SET: check the value as PostgreSQL would, store it, and return it as SHOW will show it."""
        name = name.lower()
        if name in ("role", "session_authorization"):
            raise PolicyViolation(
                f"dpproxy sessions cannot change {name}: the analyst is the user who logged in",
                hint="connect as the other analyst instead",
            )
        if name == BUDGET_SETTING:
            raise CantChangeParameter(
                f'parameter "{name}" cannot be changed', hint="SHOW dpproxy.budget reports the budget"
            )
        if name == EPSILON_SETTING:
            value = self._check_epsilon(value)
        elif name.startswith("dpproxy."):
            raise UndefinedObject(
                f'unrecognized configuration parameter "{name}"',
                hint="dpproxy's settings are dpproxy.epsilon (SET/SHOW) and dpproxy.budget (SHOW)",
            )
        elif name in READ_ONLY:
            if baseline and value == DEFAULT_SETTINGS.get(name):
                return value
            raise CantChangeParameter(f'parameter "{_canonical(name)}" cannot be changed')
        else:
            check = _CHECKS.get(name)
            if check is not None:
                value = check(value)
        if baseline:
            self._settings.baseline[name] = value
            self._settings.session[name] = value
        else:
            # A transaction's own modes last for that transaction only, however they are SET.
            local = local or name in TRANSACTION_MODES
            if local and self.status is TransactionStatus.IDLE:
                # As PostgreSQL: SET LOCAL outside a block lasts for its own statement only.
                return value
            self._settings.set(name, value, local=local)
        return value

    def _reset_setting(self, name: str, *, local: bool) -> None:
        if name in READ_ONLY or name in ("role", "session_authorization", BUDGET_SETTING):
            raise CantChangeParameter(f'parameter "{_canonical(name)}" cannot be changed')
        if name.startswith("dpproxy.") and name != EPSILON_SETTING:
            raise UndefinedObject(f'unrecognized configuration parameter "{name}"')
        if local and self.status is TransactionStatus.IDLE:
            return
        self._settings.reset(name, local=local)

    def _check_epsilon(self, value: str) -> str:
        try:
            epsilon = float(value.strip())
        except ValueError:
            raise InvalidParameter(
                f'invalid value for parameter "dpproxy.epsilon": "{value}"', hint="write a number such as 0.2"
            ) from None
        if not math.isfinite(epsilon):
            raise InvalidParameter(f'invalid value for parameter "dpproxy.epsilon": "{value}"')
        return float_text(self.engine.query_epsilon(epsilon, self.analyst))

    async def _show(self, name: str, tag: str) -> Outcome:
        if name == "all":
            settings = self._settings.all()
            settings[EPSILON_SETTING] = self._effective_epsilon()
            rows: list[tuple[object, ...]] = [
                (_canonical(n), settings[n], "")
                for n in sorted(settings, key=lambda n: _canonical(n).lower())
            ]
            columns = tuple(WireColumn(c, TEXT_OID) for c in ("name", "setting", "description"))
            return Outcome(tag, columns, rows)
        if name == BUDGET_SETTING:
            status = await self.services.run_blocking(self.engine.budget, self.user)
            left = status.remaining
            row = (
                float_text(status.spent.epsilon),
                float_text(left.epsilon),
                float_text(status.spent.delta),
                float_text(left.delta),
            )
            names = ("epsilon_spent", "epsilon_remaining", "delta_spent", "delta_remaining")
            return Outcome(tag, tuple(WireColumn(n, TEXT_OID) for n in names), [row])
        value = self._setting_value(name)
        return Outcome(tag, (WireColumn(_canonical(name), TEXT_OID),), [(value,)])

    def _setting_value(self, name: str, *, missing_ok: bool = False) -> str | None:
        """One setting as SHOW and current_setting() read it; None when unknown and `missing_ok`."""
        if name == EPSILON_SETTING:
            return self._effective_epsilon()
        found = self._settings.get(name)
        if found is None:
            # What current_setting() reads in the catalog, SHOW reads too.
            found = _CATALOG_SETTINGS.get(name)
        if found is None and not missing_ok:
            hint = "SHOW dpproxy.budget reports the budget" if name == BUDGET_SETTING else None
            raise UndefinedObject(f'unrecognized configuration parameter "{name}"', hint=hint)
        return found

    # -- SELECT set_config(…) -------------------------------------------------------------------

    def _setting_functions(self, calls: Sequence[SettingCall], parameters: Sequence[object]) -> Outcome:
        """`SELECT set_config(…), current_setting(…) …`, run here, left to right, as PostgreSQL does.

        set_config(name, value, is_local) is SET as a function: the same names, checks and errors
        (dpproxy.epsilon within the policy's limits, dpproxy.budget and read-only settings refused),
        and it returns the new value as SHOW shows it. Done anywhere else (the shadow catalog, which
        cannot change a session), it would change nothing while answering as if it had. A failing
        call undoes the statement's earlier ones: a statement's effects are all or nothing.
        """
        saved = self._settings.snapshot()
        row: list[object] = []
        try:
            for call in calls:
                arguments = [_bound(argument, parameters) for argument in call.arguments]
                if call.function == "set_config":
                    row.append(self._set_config(*arguments))
                else:
                    row.append(self._current_setting(*arguments))
        except DPProxyError:
            self._settings.restore(saved)
            raise
        columns = tuple(WireColumn(call.label, TEXT_OID) for call in calls)
        return Outcome("SELECT", columns, [tuple(row)], counted=True)

    def _set_config(self, name: object, value: object, is_local: object) -> str | None:
        if name is None:
            raise NullValueNotAllowed("SET requires parameter name")
        setting = _as_text(name).lower()
        if not _SETTING_NAME.fullmatch(setting):
            # SET could not name it either; it would only store a key nothing reads.
            raise InvalidName(f'invalid configuration parameter name "{name}"')
        local = _as_boolean(is_local) if is_local is not None else False
        if value is None:  # as PostgreSQL: a NULL value resets the setting
            self._reset_setting(setting, local=local)
            return self._setting_value(setting, missing_ok=True)
        return self._apply_setting(setting, _as_text(value), local=local)

    def _current_setting(self, name: object, missing_ok: object = False) -> str | None:
        if name is None or missing_ok is None:  # strict, as in PostgreSQL
            return None
        return self._setting_value(_as_text(name).lower(), missing_ok=_as_boolean(missing_ok))

    def _effective_epsilon(self) -> str:
        epsilon = self._epsilon
        return float_text(epsilon if epsilon is not None else self.engine.query_epsilon(None, self.analyst))

    def _discard(self, name: str, tag: str) -> Outcome:
        if name in ("all", ""):
            if self.status is not TransactionStatus.IDLE:
                raise ActiveTransaction("DISCARD ALL cannot run inside a transaction block")
            self._settings.reset_all()
            self._portals.clear()
            self._statements = {k: v for k, v in self._statements.items() if not k}
            return Outcome(tag or "DISCARD ALL")
        return Outcome(tag or f"DISCARD {name.upper()}")

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
                outcome.notices.append(
                    codec.notice(
                        "there is already a transaction in progress", severity="WARNING", code="25001"
                    )
                )
        elif action in ("commit", "rollback"):
            if status is TransactionStatus.IDLE:
                outcome.notices.append(
                    codec.notice("there is no transaction in progress", severity="WARNING", code="25P01")
                )
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
        if message.statement and message.statement in self._statements:
            raise DuplicatePreparedStatement(f'prepared statement "{message.statement}" already exists')
        texts = await self.services.split(message.sql)
        if len(texts) > 1:
            raise SyntaxProblem("cannot insert multiple commands into a prepared statement")
        statement = await self.services.route(texts[0] if texts else "")
        self._check_not_aborted(statement)
        oids, columns = await self._describe_statement(statement, message.parameter_oids)
        self._statements[message.statement] = PreparedStatement(message.statement, statement, oids, columns)

    async def _describe_statement(
        self, statement: Statement, given: tuple[int, ...]
    ) -> tuple[tuple[int, ...], tuple[WireColumn, ...] | str | None]:
        """Parameter types and result columns of a statement, without running it."""
        kind = statement.kind
        if kind is Kind.SESSION and statement.action == "set_config":
            columns = tuple(WireColumn(call.label, TEXT_OID) for call in statement.calls)
            return _setting_parameter_types(statement.calls, given), columns
        if kind is Kind.ENGINE:
            return await self._describe_engine(statement.sql, given, with_columns=True)
        if kind is Kind.CATALOG:
            oids, columns = await self.services.run_blocking(
                self.services.catalog.describe, statement.sql, list(given), self.session_info()
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
                    oids, _ = await self.services.run_blocking(
                        self.services.catalog.describe, inner.sql, list(given), self.session_info()
                    )
                    return tuple(oids), None
            if statement.action == "fetch":
                return given, _FROM_CURSOR
            return given, None
        if kind is Kind.SESSION and statement.action == "show":
            name = (statement.name or "").lower()
            if name == "all":
                return given, tuple(WireColumn(c, TEXT_OID) for c in ("name", "setting", "description"))
            if name == BUDGET_SETTING:
                names = ("epsilon_spent", "epsilon_remaining", "delta_spent", "delta_remaining")
                return given, tuple(WireColumn(n, TEXT_OID) for n in names)
            return given, (WireColumn(_canonical(name), TEXT_OID),)
        return given, None

    async def _describe_engine(
        self, sql: str, given: tuple[int, ...], *, with_columns: bool
    ) -> tuple[tuple[int, ...], tuple[WireColumn, ...] | None]:
        requested = tuple(pg_type_of(oid) if oid else None for oid in given)
        description = await self.services.describe(sql, requested)
        oids = tuple(
            given[i] if i < len(given) and given[i] else wire_type(t).oid
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
        formats = _expand_formats(message.parameter_formats, len(values))
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
            out.append(RowDescription(columns, _expand_formats(formats, len(columns))))

    async def _execute(self, message: codec.Execute, out: list[BackendMessage]) -> None:
        portal = self._portals.get(message.portal)
        if portal is None:
            raise InvalidCursorName(f'portal "{message.portal}" does not exist')
        if portal.outcome is None:
            assert portal.prepared is not None
            self._check_not_aborted(portal.prepared.statement)
            outcome = await self._run(portal.prepared.statement, portal.parameters)
            portal.outcome = outcome
            if outcome.empty:
                portal.done = True
                out.append(codec.EmptyQueryResponse())
                return
            out.extend(outcome.notices)
            if portal.columns is None or (
                outcome.columns is not None and len(outcome.columns) != len(portal.columns)
            ):
                portal.columns = outcome.columns
        outcome = portal.outcome
        if outcome.empty:
            out.append(codec.EmptyQueryResponse())
            return
        if outcome.columns is None or portal.columns is None:
            out.append(CommandComplete(outcome.tag))
            self._report(out)
            return
        rows = outcome.rows
        start = portal.position
        end = len(rows) if message.max_rows == 0 else min(len(rows), start + message.max_rows)
        formats = _expand_formats(portal.formats, len(portal.columns))
        self._append_rows(portal.columns, formats, rows[start:end], out)
        portal.position = end
        if end < len(rows):
            out.append(codec.PortalSuspended())
            return
        # The count of a portal run in several Executes is that of the whole portal.
        out.append(CommandComplete(self._tag(outcome, end if not portal.done else 0)))
        portal.done = True
