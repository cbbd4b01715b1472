"""What the router decides: the kinds of statement and the Statement record the session acts on.

This module holds data only: it never reads SQL (the classifier does) and never acts on a
statement (the session does).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# A Bind message counts its values in 16 bits: no $n above this can ever be given a value.
MAX_PARAMETERS = 65535


class Kind(StrEnum):
    EMPTY = "empty"
    SESSION = "session"
    TRANSACTION = "transaction"
    CURSOR = "cursor"
    EXPLAIN = "explain"
    CATALOG = "catalog"
    ENGINE = "engine"
    COPY = "copy"  # COPY (query) TO STDOUT: the inner query's rows in COPY's text, CSV or binary format
    PREPARED = "prepared"  # SQL-level PREPARE and EXECUTE (DEALLOCATE is a SESSION command)


# A constant argument as text (None for NULL), or the number of the $n parameter that gives it.
Argument = str | int | None


@dataclass(frozen=True)
class SettingCall:
    """set_config(name, value, is_local) or current_setting(name [, missing_ok]) of a SELECT that calls
    nothing else. The session runs these: set_config changes its settings, which the shadow catalog
    can read but never change, and current_setting must see a change made earlier in the same row."""

    function: str  # "set_config" | "current_setting"
    arguments: tuple[Argument, ...]
    label: str  # the result column's name: the function's, or the AS label


@dataclass(frozen=True)
class CopyOptions:
    """The options of COPY … TO STDOUT, checked and defaulted as PostgreSQL does for its format."""

    format: str = "text"  # "text" | "csv" | "binary" (which takes none of the options below)
    delimiter: str = "\t"
    null: str = "\\N"
    header: bool = False
    quote: str = '"'
    escape: str = '"'
    force_quote: tuple[str, ...] = ()  # column names whose non-NULL values are always quoted (CSV)
    force_quote_all: bool = False  # FORCE_QUOTE *


@dataclass(frozen=True)
class Statement:
    kind: Kind
    sql: str  # this one statement, without the trailing ';'
    tag: str  # CommandComplete verb (the session appends row counts where PostgreSQL does)
    action: str | None = None  # SESSION: set|reset|show|discard|deallocate|set_config; TRANSACTION:
    # begin|commit|rollback|savepoint|release|rollback_to; CURSOR: declare|fetch|move|close
    name: str | None = None  # setting (lowercased), cursor, savepoint or prepared statement name; 'all'
    value: str | None = None  # SET value as PostgreSQL reports it; None for DEFAULT
    local: bool = False  # SET LOCAL, SET TRANSACTION …
    hold: bool = False  # DECLARE … WITH HOLD
    count: int | None = None  # FETCH/MOVE count; None means ALL
    inner: Statement | None = None  # DECLARE … FOR <inner>, EXPLAIN <inner>
    calls: tuple[SettingCall, ...] = ()  # SESSION set_config: the SELECT list, in order
    copy: CopyOptions | None = None  # COPY: how the inner query's rows are written
    type_names: tuple[str, ...] = ()  # PREPARE name (types): each a wire type name (int4, text …)
    arguments: tuple[Argument, ...] = ()  # EXECUTE name (arguments): constants as text, or $n


# The hint of every refusal: what dpproxy does answer.
ALLOWED = (
    "dpproxy answers queries (SELECT) on the exposed tables, catalog queries and session commands "
    "(SET, SHOW, RESET, BEGIN, COMMIT, ROLLBACK, DECLARE/FETCH/CLOSE, PREPARE/EXECUTE/DEALLOCATE, EXPLAIN, "
    "COPY (SELECT …) TO STDOUT)"
)
