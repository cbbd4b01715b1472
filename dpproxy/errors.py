"""Errors a user can see, each with the PostgreSQL SQLSTATE it is sent with.

Errors are raised where the fault is found and rendered once, at the edge (CLI or wire server).
A message must say what is wrong and what is allowed instead, naming the table, column or clause
at fault. It must never contain a value read from a protected table: messages are built only from
the query text, the policy and the budget. Unexpected exceptions never reach a user, and reach the
operator's log only as `failure` renders them: their type and place, never their text.
"""

from __future__ import annotations

import traceback


class DPProxyError(Exception):
    """Base class: an error with a SQLSTATE, a message and an optional hint."""

    sqlstate = "XX000"
    # Raised by the post-processing of released values (over_released): shown as it is, after the
    # charge, since it depends on released values alone.
    after_release = False

    def __init__(self, message: str, *, hint: str | None = None, position: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        # Where in the statement the fault is: a 1-based character offset (ErrorResponse's P field,
        # from which psql prints LINE n: and a caret), or None.
        self.position = position

    def add_hint(self, text: str) -> DPProxyError:
        """The error with `text` after its hint (as its hint when it has none)."""
        self.hint = text if self.hint is None else f"{self.hint}; {text}"
        return self

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nHINT: {self.hint}"


def over_released(error: DPProxyError) -> DPProxyError:
    """An error of the SELECT list, HAVING or ORDER BY over released values (a cast or integer
    arithmetic that leaves its type: 22003): a function of released values and the query text, so
    the analyst reads it as PostgreSQL words it, told that the answer was charged."""
    error.after_release = True
    return error.add_hint("the answer was released and charged; compute the rest in your client")


class PolicyViolation(DPProxyError):
    """The policy forbids this access: raw rows, unexposed tables or columns, the unit as a key."""

    sqlstate = "42501"  # insufficient_privilege


class NotSupported(DPProxyError):
    """SQL that dpproxy does not support (yet)."""

    sqlstate = "0A000"  # feature_not_supported


class SyntaxProblem(DPProxyError):
    sqlstate = "42601"  # syntax_error


class UndefinedTable(DPProxyError):
    sqlstate = "42P01"


class UndefinedColumn(DPProxyError):
    sqlstate = "42703"


class UnresolvedColumn(UndefinedColumn):
    """A column none of a query's own tables has: a typo, or, in a subquery, a name of the
    enclosing query (a correlated subquery)."""


class UndefinedFunction(DPProxyError):
    sqlstate = "42883"


class GroupingError(DPProxyError):
    """A column outside GROUP BY and aggregates, or an aggregate where none is allowed."""

    sqlstate = "42803"


class DatatypeMismatch(DPProxyError):
    sqlstate = "42804"


class InvalidText(DPProxyError):
    """A constant in the query text does not parse as the type it is used as."""

    sqlstate = "22P02"


class InvalidParameter(DPProxyError):
    """A bind parameter or a per-query setting (such as epsilon) is missing or out of range."""

    sqlstate = "22023"  # invalid_parameter_value


class BudgetExhausted(DPProxyError):
    """The analyst's privacy budget cannot pay for this query. Nothing was run or charged."""

    # configuration_limit_exceeded: the one documented code for an exhausted budget.
    sqlstate = "53400"


class UnknownAnalyst(DPProxyError):
    sqlstate = "28000"  # invalid_authorization_specification


class TLSRequired(DPProxyError):
    """The only method the server may ask for sends the password in cleartext: over TLS only."""

    sqlstate = "28000"  # invalid_authorization_specification, as PostgreSQL's hostssl-only refusal


class PolicyError(DPProxyError):
    """The policy file is invalid. Carries every problem found, not only the first."""

    sqlstate = "F0000"  # config_file_error

    def __init__(self, problems: list[str], *, source: str = "policy") -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{source}: {len(self.problems)} problem(s):\n{lines}")


class QueryCanceled(DPProxyError):
    """The client cancelled the query (CancelRequest), or the server is shutting down."""

    sqlstate = "57014"  # query_canceled


class BackendUnavailable(DPProxyError):
    """The backing database could not be reached. No query ran, nothing was charged."""

    sqlstate = "08006"  # connection_failure


class PublicSubqueryFailed(DPProxyError):
    """A subquery over public tables, run on its own before a private query, failed in the database.

    It read public tables only, so its failure says nothing about protected data; the database's
    text is still not shown (it is for operators). Nothing was charged.
    """

    sqlstate = "22000"  # data_exception

    def __init__(self, subquery: str) -> None:
        super().__init__(
            f"the subquery ({subquery}) over public tables failed in the backing database; nothing was "
            "charged",
            hint="run the subquery on its own to see why (e.g. a division by zero or a cast of its rows)",
        )


class PublicQueryFailed(DPProxyError):
    """A query over public tables only failed in the database. Its failure says nothing about
    protected data, but the database's text is still not shown (it is for operators), and a query
    over public tables spends no budget."""

    sqlstate = "XX000"

    def __init__(self) -> None:
        super().__init__(
            "the query over public tables could not be completed by the backing database; nothing was "
            "charged",
            hint="check its casts and divisions against the tables' values (a division by zero, a cast of "
            "text to a number)",
        )


class PrivateQueryFailed(DPProxyError):
    """The backing database failed while running a private query.

    The database's own text is never shown: it could depend on protected data. The message is
    fixed, and the query's budget stays spent, since whether it failed may depend on the data.
    """

    sqlstate = "XX000"
    FIXED_MESSAGE = (
        "the private query could not be completed by the backing database; "
        "its privacy cost has been charged. Contact the operator if this persists."
    )

    def __init__(self) -> None:
        super().__init__(self.FIXED_MESSAGE)


# -- the rest of what the wire server and the analyzer answer, as PostgreSQL names them ----------
# Grouped by SQLSTATE class; each class is defined here and nowhere else.


class AmbiguousColumn(DPProxyError):
    sqlstate = "42702"  # ambiguous_column


class InvalidSchema(DPProxyError):
    sqlstate = "3F000"  # invalid_schema_name


class UndefinedObject(DPProxyError):
    """A type, role, schema or setting that does not exist."""

    sqlstate = "42704"  # undefined_object


class UndefinedParameter(DPProxyError):
    sqlstate = "42P02"  # undefined_parameter


class DuplicateCursor(DPProxyError):
    sqlstate = "42P03"  # duplicate_cursor


class DuplicatePreparedStatement(DPProxyError):
    sqlstate = "42P05"  # duplicate_prepared_statement


class InvalidName(DPProxyError):
    sqlstate = "42602"  # invalid_name


class NoBinaryOutput(UndefinedFunction):
    """A result column asked for in binary has no binary format (aclitem), as in PostgreSQL."""


class SubqueryCardinality(DPProxyError):
    """A scalar subquery over public tables returned several rows."""

    sqlstate = "21000"  # cardinality_violation


class SubqueryTooLarge(DPProxyError):
    """An IN subquery over public tables returned more values than a private query may inline."""

    sqlstate = "54000"  # program_limit_exceeded


class TooManyInSession(DPProxyError):
    """A session keeping more prepared statements, or more portals and cursors, than
    dpproxy.wire.session.portals.SESSION_LIMIT: each holds memory of the server all sessions share."""

    sqlstate = "54000"  # program_limit_exceeded


class StatementTooComplex(DPProxyError):
    """A statement larger or more deeply nested than dpproxy plans (dpproxy.sql.limits): refused
    before it is parsed or analysed, so that no statement can hold a worker for long."""

    sqlstate = "54001"  # statement_too_complex


class ValueOutOfRange(DPProxyError):
    sqlstate = "22003"  # numeric_value_out_of_range


class NullValueNotAllowed(DPProxyError):
    sqlstate = "22004"  # null_value_not_allowed


class InvalidDatetime(DPProxyError):
    sqlstate = "22007"  # invalid_datetime_format


class DatetimeFieldOverflow(DPProxyError):
    sqlstate = "22008"  # datetime_field_overflow


class CharacterNotInRepertoire(DPProxyError):
    sqlstate = "22021"  # character_not_in_repertoire


class InvalidBinary(DPProxyError):
    """A binary parameter is not in the type's binary format."""

    sqlstate = "22P03"  # invalid_binary_representation


class ActiveTransaction(DPProxyError):
    sqlstate = "25001"  # active_sql_transaction


class NoActiveTransaction(DPProxyError):
    sqlstate = "25P01"  # no_active_sql_transaction


class InFailedTransaction(DPProxyError):
    sqlstate = "25P02"  # in_failed_sql_transaction


class InvalidStatementName(DPProxyError):
    sqlstate = "26000"  # invalid_sql_statement_name


class AuthenticationFailed(DPProxyError):
    """Wrong password, unknown analyst or no credential: one message for all, by design."""

    sqlstate = "28P01"  # invalid_password

    def __init__(self, user: str) -> None:
        super().__init__(f'password authentication failed for user "{user}"')


class InvalidCursorName(DPProxyError):
    sqlstate = "34000"  # invalid_cursor_name


class UndefinedDatabase(DPProxyError):
    """The startup packet names a database other than the one the server serves."""

    sqlstate = "3D000"  # invalid_catalog_name


class InvalidSavepoint(DPProxyError):
    sqlstate = "3B001"  # invalid_savepoint_specification


class ObjectNotInState(DPProxyError):
    sqlstate = "55000"  # object_not_in_prerequisite_state


class CantChangeParameter(DPProxyError):
    sqlstate = "55P02"  # cant_change_runtime_param


class ProtocolViolation(DPProxyError):
    """The peer broke the framing or message layout; the connection is closed after the error."""

    sqlstate = "08P01"  # protocol_violation


class InternalError(DPProxyError):
    """A fault inside dpproxy itself (never one of the backend's: those are PrivateQueryFailed)."""

    sqlstate = "XX000"  # internal_error


class _FixedMessage(DPProxyError):
    """An error whose message is always the same: PostgreSQL's own words for it."""

    text = ""

    def __init__(self) -> None:
        super().__init__(self.text)


class AdminShutdown(_FixedMessage):
    """The server closes the connection: it is stopping, or the session was idle at a reload."""

    sqlstate = "57P01"  # admin_shutdown
    text = "terminating connection due to administrator command"


class CannotConnectNow(_FixedMessage):
    sqlstate = "57P03"  # cannot_connect_now
    text = "the database system is shutting down"


class TooManyConnections(_FixedMessage):
    sqlstate = "53300"  # too_many_connections
    text = "sorry, too many clients already"


class IdleSessionTimeout(_FixedMessage):
    sqlstate = "57P05"  # idle_session_timeout
    text = "terminating connection due to idle-session timeout"


class AuthenticationTimeout(_FixedMessage):
    """The client did not finish authenticating in time."""

    sqlstate = BackendUnavailable.sqlstate  # connection_failure, as PostgreSQL says
    text = "canceling authentication due to timeout"


def _every_class(base: type[DPProxyError]) -> list[type[DPProxyError]]:
    found = [base]
    for sub in base.__subclasses__():
        found += _every_class(sub)
    return found


# The first class defined for each SQLSTATE that takes a message as DPProxyError does: what an error
# raised under that code elsewhere (a macro's error() in the catalog, dpproxy:42P01:…) is read back
# as. Classes that write their own message (PolicyError, AdminShutdown, …) are not read back.
_BY_SQLSTATE: dict[str, type[DPProxyError]] = {}
for _cls in _every_class(DPProxyError):
    if _cls.__init__ is DPProxyError.__init__:
        _BY_SQLSTATE.setdefault(_cls.sqlstate, _cls)


def lookup(sqlstate: str, default: type[DPProxyError]) -> type[DPProxyError]:
    """The error class of `sqlstate` (the first defined for it that takes a message), else `default`."""
    return _BY_SQLSTATE.get(sqlstate, default)


def failure(error: BaseException) -> str:
    """An unexpected exception as it may be logged: its type and where it was raised (the innermost
    frame of dpproxy's, else the last), never its message — a driver's message can quote data."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if "/dpproxy/" in f.filename.replace("\\", "/")] or frames
    if not ours:
        return type(error).__name__
    frame = ours[-1]
    where = frame.filename.replace("\\", "/")
    where = "dpproxy/" + where.rsplit("/dpproxy/", 1)[1] if "/dpproxy/" in where else where.rsplit("/", 1)[-1]
    return f"{type(error).__name__} at {where}:{frame.lineno} in {frame.name}"
