"""Every setting a wire session knows: its name, default, validation and whether it is reported.

`SETTINGS` is the one table. The session keeps values with PostgreSQL's transaction semantics
(`SessionSettings`, below) and answers SET, RESET, SHOW and set_config() from them; the shadow
catalog reads the same names and defaults for current_setting() and pg_settings. dpproxy's own
settings, `dpproxy.epsilon` and `dpproxy.budget`, are named here too, but their values come from
the policy and the ledger, which only the engine knows: the session supplies them.

This module knows settings and nothing else: it never sees a socket, a protocol message, SQL text,
the engine or the catalog. What a value change must tell the client (ParameterStatus) is the
session's to send; which settings call for it is said here (`Setting.reported`).
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
import zoneinfo
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

from dpproxy import __version__
from dpproxy.errors import (
    CantChangeParameter,
    InvalidParameter,
    InvalidSavepoint,
    NotSupported,
    PolicyViolation,
    UndefinedObject,
)
from dpproxy.sql.bounds import SessionBounds

PG_VERSION = "15.0"
SERVER_VERSION = f"{PG_VERSION} (dpproxy {'.'.join(__version__.split('.')[:2])})"
SERVER_VERSION_NUM = "150000"

EPSILON_SETTING = "dpproxy.epsilon"
BUDGET_SETTING = "dpproxy.budget"
# The contribution bounds a session fixes instead of each query choosing them (docs/privacy.md §3):
# "chosen" (the default) or a whole number, capped at the policy's ceiling when a query uses it.
ROWS_SETTING = "dpproxy.max_rows_per_unit"
GROUPS_SETTING = "dpproxy.max_groups_per_unit"
BOUND_SETTINGS = (ROWS_SETTING, GROUPS_SETTING)
# Accuracy first: the largest ± at 95% accepted on each COUNT and SUM (dpproxy.engine.accuracy).
TARGET_SETTING = "dpproxy.target_error"
# What bounding removed, estimated from a value's share of each query's ε (dpproxy.release.left_out).
ESTIMATE_SETTING = "dpproxy.estimate_left_out"
# The settings of dpproxy's own an analyst may SET and RESET besides dpproxy.epsilon.
PLAN_SETTINGS = (*BOUND_SETTINGS, TARGET_SETTING, ESTIMATE_SETTING)

# A transaction's modes: what SET TRANSACTION chose in this block, else the session's defaults
# (SET SESSION CHARACTERISTICS), as PostgreSQL starts each transaction. Every transaction through
# dpproxy is read-only and each query is answered on its own, so the modes only need to read back
# as they were set (pgjdbc's getTransactionIsolation, DBeaver's connection settings).
TRANSACTION_MODES = ("transaction_deferrable", "transaction_isolation", "transaction_read_only")


# ---------------------------------------------------------------------------------------------
# Validation: a new value checked as PostgreSQL would, and returned as SHOW will show it
# ---------------------------------------------------------------------------------------------

# As PostgreSQL's clean_encoding_name: case and anything but letters and digits do not count, so
# 'utf-8', "UTF8", Unicode and asyncpg's quoted "'utf-8'" all name UTF8.
_UTF8_NAMES = {"utf8", "unicode", "sqlascii"}
_DATE_ORDERS = ("MDY", "DMY", "YMD")
_Number = TypeVar("_Number", int, float)


def invalid_value(name: str, value: str, hint: str | None = None) -> InvalidParameter:
    """PostgreSQL's 22023 for a value a setting cannot take, naming the setting as SHOW spells it."""
    return InvalidParameter(f'invalid value for parameter "{canonical(name)}": "{value}"', hint=hint)


# A number as PostgreSQL's settings spell one: ASCII digits only (Python's int() and float() would
# also take "٣" and "1_0"); infinity and NaN are read, as PostgreSQL reads them, and refused later.
_NUMBER = re.compile(r"[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE)
_WHOLE = re.compile(r"[0-9]+")


def number_value(name: str, value: str, parse: Callable[[str], _Number], hint: str) -> _Number:
    """A setting's value read as a number by `parse` (int, float), else invalid_value's error."""
    text = value.strip()
    try:
        if not _NUMBER.fullmatch(text):
            raise ValueError(text)
        return parse(text)
    except ValueError:
        raise invalid_value(name, value, hint=hint) from None


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
        raise invalid_value("timezone", value) from None
    return "UTC" if tz is dt.UTC else value.strip()


def _check_extra_float_digits(value: str) -> str:
    digits = number_value("extra_float_digits", value, int, "write an integer")
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
            raise invalid_value(name, value, hint="write " + ", ".join(_ISOLATION_LEVELS))
        return level

    return check


def _check_boolean(name: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        word = value.strip().lower()
        if word in ("on", "true", "yes", "1", "t", "y"):
            return "on"
        if word in ("off", "false", "no", "0", "f", "n"):
            return "off"
        raise invalid_value(name, value, hint="write on or off")

    return check


# client_min_messages, as PostgreSQL ranks its levels for the client (LOG below NOTICE there).
CLIENT_MESSAGE_LEVELS = (
    "debug5",
    "debug4",
    "debug3",
    "debug2",
    "debug1",
    "log",
    "notice",
    "warning",
    "error",
)
_MESSAGE_LEVEL_ALIASES = {"debug": "debug2", "info": "notice"}
# The rank of a notice's severity, against the levels above: INFO is always sent, as in PostgreSQL.
_SEVERITY_RANK = {"DEBUG": 0, "LOG": 5, "NOTICE": 6, "WARNING": 7, "ERROR": 8}


def _check_client_min_messages(value: str) -> str:
    level = value.strip().lower()
    level = _MESSAGE_LEVEL_ALIASES.get(level, level)
    if level not in CLIENT_MESSAGE_LEVELS:
        raise invalid_value(
            "client_min_messages", value, hint="Available values: " + ", ".join(CLIENT_MESSAGE_LEVELS) + "."
        )
    return level


def notice_visible(severity: str, client_min_messages: str | None) -> bool:
    """Whether a notice of `severity` (NOTICE, WARNING, …) reaches a client at this level."""
    if severity.upper() == "INFO":
        return True
    rank = _SEVERITY_RANK.get(severity.upper(), _SEVERITY_RANK["NOTICE"])
    level = (client_min_messages or "notice").lower()
    threshold = CLIENT_MESSAGE_LEVELS.index(level) if level in CLIENT_MESSAGE_LEVELS else 6
    return rank >= threshold


# statement_timeout's units, as PostgreSQL reads a time setting whose base unit is ms.
_TIME_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
_TIME_VALUE = re.compile(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([a-z]*)\s*")
_MAX_TIMEOUT_MS = 2_147_483_647


def timeout_ms(value: str) -> int:
    """A time setting's value in milliseconds (after its check: always valid)."""
    match = _TIME_VALUE.fullmatch(value)
    if match is None:
        return 0
    return round(float(match[1]) * _TIME_UNITS_MS[match[2] or "ms"])


def _check_bound(name: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        text = value.strip().lower()
        if text in ("chosen", "default"):
            return "chosen"
        if _WHOLE.fullmatch(text) and 1 <= int(text) <= 100_000:
            return str(int(text))
        raise invalid_value(
            name,
            value,
            hint="write a whole number from 1 (the policy's ceiling caps it), or chosen: each query "
            "chooses its bound privately",
        )

    return check


def _check_target(value: str) -> str:
    text = value.strip().lower()
    if text in ("off", "default", ""):
        return "off"
    target = float(text) if _NUMBER.fullmatch(text) else math.nan
    if not (math.isfinite(target) and target > 0):
        raise invalid_value(
            TARGET_SETTING,
            value,
            hint="write the largest ± at 95% you accept on each COUNT and SUM (a number > 0), or off",
        )
    return f"{target:g}"


def target_value(text: str | None) -> float | None:
    """dpproxy.target_error as the engine takes it: None when off."""
    return float(text) if text and text != "off" else None


def bound_value(text: str | None) -> int | None:
    """A bound setting's value as the engine takes it: None when each query chooses."""
    return int(text) if text and _WHOLE.fullmatch(text) else None


def session_bounds(get: Callable[[str], str | None]) -> SessionBounds | None:
    """What a session set for its plans — fixed contribution bounds, a target ± — from its
    settings (`get`: a setting's value by name), None when nothing."""
    rows, groups = bound_value(get(ROWS_SETTING)), bound_value(get(GROUPS_SETTING))
    target = target_value(get(TARGET_SETTING))
    estimate = get(ESTIMATE_SETTING) == "on"
    if rows is None and groups is None and target is None and not estimate:
        return None
    return SessionBounds(rows, groups, target, estimate)


def _check_timeout(name: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        match = _TIME_VALUE.fullmatch(value)
        if match is None or (match[2] and match[2] not in _TIME_UNITS_MS):
            raise invalid_value(
                name, value, hint='Valid units for this parameter are "us", "ms", "s", "min", "h", and "d".'
            )
        milliseconds = round(float(match[1]) * _TIME_UNITS_MS[match[2] or "ms"])
        if not 0 <= milliseconds <= _MAX_TIMEOUT_MS:
            raise InvalidParameter(
                f'{milliseconds} ms is outside the valid range for parameter "{name}" '
                f"(0 .. {_MAX_TIMEOUT_MS})"
            )
        # As SHOW shows it: the largest unit that divides the value exactly.
        if milliseconds == 0:
            return "0"
        for unit in ("d", "h", "min", "s"):
            size = int(_TIME_UNITS_MS[unit])
            if milliseconds % size == 0:
                return f"{milliseconds // size}{unit}"
        return f"{milliseconds}ms"

    return check


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    name: str  # as PostgreSQL spells it: SHOW's column, ParameterStatus, pg_settings
    default: str
    # Held by every session from its start: SHOW ALL lists it and RESET returns to the default. The
    # others have a fixed value that SHOW, current_setting() and pg_settings read until a session
    # SETs one (anything may be SET: a setting dpproxy does not know is stored as given).
    per_session: bool = True
    read_only: bool = False  # SET and RESET refuse it (55P02); a startup value equal to the default passes
    reported: bool = False  # GUC_REPORT: sent as ParameterStatus at startup and whenever it changes
    check: Callable[[str], str] | None = None  # validates a new value, returns it as SHOW shows it


# Alphabetical by lower-case name: ParameterStatus messages go out in this order.
SETTINGS: tuple[Setting, ...] = (
    Setting("application_name", "", reported=True),
    Setting("array_nulls", "on", per_session=False),
    Setting("backslash_quote", "safe_encoding", per_session=False),
    Setting("block_size", "8192", read_only=True),
    Setting("bytea_output", "hex"),
    Setting("client_encoding", "UTF8", reported=True, check=_check_client_encoding),
    Setting("client_min_messages", "notice", check=_check_client_min_messages),
    Setting("DateStyle", "ISO, MDY", reported=True, check=_check_datestyle),
    # SQLAlchemy's table reflection reads it.
    Setting("default_table_access_method", "heap", per_session=False),
    Setting("default_tablespace", "", per_session=False),
    Setting("default_text_search_config", "pg_catalog.simple", per_session=False),
    Setting(GROUPS_SETTING, "chosen", check=_check_bound(GROUPS_SETTING)),
    Setting(ROWS_SETTING, "chosen", check=_check_bound(ROWS_SETTING)),
    Setting(TARGET_SETTING, "off", check=_check_target),
    Setting(ESTIMATE_SETTING, "off", check=_check_boolean(ESTIMATE_SETTING)),
    Setting("default_transaction_deferrable", "off", check=_check_boolean("default_transaction_deferrable")),
    Setting(
        "default_transaction_isolation",
        "read committed",
        check=_check_isolation("default_transaction_isolation"),
    ),
    Setting(
        "default_transaction_read_only",
        "off",
        reported=True,
        check=_check_boolean("default_transaction_read_only"),
    ),
    Setting("escape_string_warning", "on"),
    Setting("extra_float_digits", "1", check=_check_extra_float_digits),
    Setting(
        "idle_in_transaction_session_timeout",
        "0",
        check=_check_timeout("idle_in_transaction_session_timeout"),
    ),
    Setting("in_hot_standby", "off", read_only=True, reported=True),
    Setting("integer_datetimes", "on", read_only=True, reported=True),
    Setting("IntervalStyle", "postgres", reported=True, check=_check_intervalstyle),
    Setting("is_superuser", "off", read_only=True, reported=True),
    Setting("jit", "on", per_session=False),
    Setting("lc_collate", "C", read_only=True),
    Setting("lc_ctype", "C", read_only=True),
    Setting("lc_messages", "C"),
    Setting("lc_monetary", "C"),
    Setting("lc_numeric", "C"),
    Setting("lc_time", "C"),
    Setting("lock_timeout", "0", check=_check_timeout("lock_timeout")),
    Setting("max_connections", "100", per_session=False),
    Setting("max_function_args", "100", per_session=False),
    Setting("max_identifier_length", "63", read_only=True),
    Setting("max_index_keys", "32", per_session=False),
    Setting("password_encryption", "scram-sha-256", per_session=False),
    Setting("row_security", "on", per_session=False),
    Setting("search_path", '"$user", public'),
    Setting("server_encoding", "UTF8", read_only=True, reported=True),
    Setting("server_version", SERVER_VERSION, read_only=True, reported=True),
    Setting("server_version_num", SERVER_VERSION_NUM, read_only=True),
    # The analyst who logged in: given its value at authentication, never changed by SET or RESET.
    Setting("session_authorization", "", reported=True),
    Setting("ssl", "off", per_session=False),
    Setting("standard_conforming_strings", "on", reported=True, check=_check_standard_conforming_strings),
    Setting("statement_timeout", "0", check=_check_timeout("statement_timeout")),
    Setting("temp_tablespaces", "", per_session=False),
    Setting("TimeZone", "UTC", reported=True, check=_check_timezone),
    Setting("timezone_abbreviations", "Default", per_session=False),
    Setting("transaction_deferrable", "off", check=_check_boolean("transaction_deferrable")),
    Setting("transaction_isolation", "read committed", check=_check_isolation("transaction_isolation")),
    Setting("transaction_read_only", "off", check=_check_boolean("transaction_read_only")),
    Setting("work_mem", "4MB", per_session=False),
    Setting("xmloption", "content", per_session=False),
)

_BY_NAME: Mapping[str, Setting] = {s.name.lower(): s for s in SETTINGS}

# Every setting's default, by lower-case name (setting names are case-insensitive).
DEFAULTS: Mapping[str, str] = MappingProxyType({name: s.default for name, s in _BY_NAME.items()})
# What a session holds from its start (before authentication gives session_authorization its value).
SESSION_DEFAULTS: Mapping[str, str] = MappingProxyType(
    {name: s.default for name, s in _BY_NAME.items() if s.per_session}
)
REPORTED: tuple[str, ...] = tuple(name for name, s in _BY_NAME.items() if s.reported)
READ_ONLY: frozenset[str] = frozenset(name for name, s in _BY_NAME.items() if s.read_only)

# A setting name as SET's grammar reads one: identifiers separated by dots.
_SETTING_NAME = re.compile(
    r"[a-z_\u0080-\uffff][a-z0-9_$\u0080-\uffff]*(?:\.[a-z_\u0080-\uffff][a-z0-9_$\u0080-\uffff]*)*"
)


def canonical(name: str) -> str:
    """PostgreSQL's spelling of a lower-case setting name (DateStyle, TimeZone …): SHOW's header."""
    setting = _BY_NAME.get(name)
    return setting.name if setting is not None else name


def is_setting_name(name: str) -> bool:
    """Whether SET could name this (lower-case) setting: identifiers separated by dots."""
    return _SETTING_NAME.fullmatch(name) is not None


def checked_value(name: str, value: str, *, startup: bool, check_epsilon: Callable[[str], str]) -> str:
    """SET's checks of a new value for a lower-case `name`: the value as SHOW will show it, or the
    error PostgreSQL (or dpproxy's policy) gives. `startup`: a startup parameter, which may repeat a
    read-only setting's default. `check_epsilon` checks dpproxy.epsilon against the policy."""
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
        return check_epsilon(value)
    if name.startswith("dpproxy.") and name not in PLAN_SETTINGS:
        raise UndefinedObject(
            f'unrecognized configuration parameter "{name}"',
            hint="dpproxy's settings are dpproxy.epsilon, dpproxy.max_rows_per_unit, "
            "dpproxy.max_groups_per_unit, dpproxy.target_error, dpproxy.estimate_left_out (SET/SHOW) "
            "and dpproxy.budget (SHOW)",
        )
    setting = _BY_NAME.get(name)
    if setting is None:
        return value
    if setting.read_only:
        if startup and value == setting.default:
            return value
        raise CantChangeParameter(f'parameter "{canonical(name)}" cannot be changed')
    return setting.check(value) if setting.check is not None else value


def check_resettable(name: str) -> None:
    """RESET's refusals, for a lower-case `name`."""
    if name in READ_ONLY or name in ("role", "session_authorization", BUDGET_SETTING):
        raise CantChangeParameter(f'parameter "{canonical(name)}" cannot be changed')
    if name.startswith("dpproxy.") and name != EPSILON_SETTING and name not in PLAN_SETTINGS:
        raise UndefinedObject(f'unrecognized configuration parameter "{name}"')


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


# ---------------------------------------------------------------------------------------------
# One session's values
# ---------------------------------------------------------------------------------------------


class SessionSettings:
    """Setting values with PostgreSQL's transaction semantics: SET lasts for the session (undone
    by ROLLBACK), SET LOCAL until the end of the transaction; savepoints snapshot both."""

    def __init__(self, baseline: Mapping[str, str], check_epsilon: Callable[[str], str]) -> None:
        self.baseline = dict(baseline)  # defaults and startup parameters: what RESET returns to
        self.session = dict(self.baseline)
        self.local: dict[str, str] = {}
        self._check_epsilon = check_epsilon
        self._transaction: tuple[dict[str, str], dict[str, str]] | None = None
        self._savepoints: list[tuple[str, dict[str, str], dict[str, str]]] = []

    # -- SET, RESET, SHOW ------------------------------------------------------------------------

    def apply(self, name: str, value: str, *, local: bool, in_block: bool, startup: bool = False) -> str:
        """SET: check the value as PostgreSQL would, store it, and return it as SHOW will show it.

        `startup`: a startup parameter, which becomes part of the baseline RESET returns to.
        `in_block`: a transaction block is open (SET LOCAL outside one lasts for its statement only).
        """
        name = name.lower()
        value = checked_value(name, value, startup=startup, check_epsilon=self._check_epsilon)
        if startup:
            self.baseline[name] = value
            self.session[name] = value
        else:
            # A transaction's own modes last for that transaction only, however they are SET.
            local = local or name in TRANSACTION_MODES
            if local and not in_block:
                # As PostgreSQL: SET LOCAL outside a block lasts for its own statement only.
                return value
            self.set(name, value, local=local)
        return value

    def reset_setting(self, name: str, *, local: bool, in_block: bool) -> None:
        """RESET (or set_config with a NULL value) of a lower-case `name`."""
        check_resettable(name)
        if local and not in_block:
            return
        self.reset(name, local=local)

    def value(self, name: str) -> str | None:
        """A lower-case setting as SHOW and current_setting() read it (not dpproxy.epsilon, whose
        value the policy decides); None when no one knows it."""
        found = self.get(name)
        # What current_setting() reads in the catalog, SHOW reads too.
        return found if found is not None else DEFAULTS.get(name)

    # -- storage ---------------------------------------------------------------------------------

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

    # -- transactions ----------------------------------------------------------------------------

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
