"""Session commands: SET, RESET, SHOW, DISCARD, DEALLOCATE, and SELECT set_config(…) run as SET.

Setting names, defaults and checks are dpproxy/wire/settings.py's; this module turns the router's
Statement into changes of the session's settings and into the Outcome the client is sent.
set_config() runs here rather than in the shadow catalog, which can read a session's settings but
never change them: answered there, it would change nothing while answering as if it had.
It never touches a socket or encodes a message, and reaches the engine only for dpproxy.epsilon's
limits and dpproxy.budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dpproxy.errors import (
    ActiveTransaction,
    DPProxyError,
    InvalidName,
    InvalidStatementName,
    InvalidText,
    NoActiveTransaction,
    NotSupported,
    NullValueNotAllowed,
    UndefinedObject,
    UndefinedParameter,
)
from dpproxy.results import BudgetStatus, remaining_figure, spent_figure
from dpproxy.sql.types import boolean_from_text
from dpproxy.wire.router import Argument, SettingCall, Statement
from dpproxy.wire.session.records import Outcome, Portal, PreparedStatement, TransactionStatus
from dpproxy.wire.settings import (
    BUDGET_SETTING,
    EPSILON_SETTING,
    SessionSettings,
    canonical,
    invalid_value,
    is_setting_name,
    number_value,
)
from dpproxy.wire.types import TEXT_OID, WireColumn, float_text

if TYPE_CHECKING:
    from dpproxy.engine import Engine
    from dpproxy.policy import AnalystPolicy
    from dpproxy.wire.session.shared import EngineCatalogAuth


# set_config(text, text, boolean) and current_setting(text, boolean): a $n argument's type.
_BOOL_OID = 16
_SETTING_ARGUMENT_TYPES = {
    "set_config": (TEXT_OID, TEXT_OID, _BOOL_OID),
    "current_setting": (TEXT_OID, _BOOL_OID),
}


def setting_parameter_types(calls: Sequence[SettingCall], given: tuple[int, ...]) -> tuple[int, ...]:
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


class SessionCommands:
    """SET, RESET, SHOW, DISCARD, DEALLOCATE and set_config(), mixed into Session (machine.py),
    whose state they read and change: its settings and transaction status, and for DISCARD ALL and
    DEALLOCATE its prepared statements and portals. `_epsilon` is Session's."""

    engine: Engine
    shared: EngineCatalogAuth
    user: str
    analyst: AnalystPolicy | None
    status: TransactionStatus
    _settings: SessionSettings
    _statements: dict[str, PreparedStatement]
    _portals: dict[str, Portal]
    _epsilon: float | None

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
        if action == "lock":  # pg_dump's LOCK TABLE … IN ACCESS SHARE MODE: nothing to hold
            if self.status is TransactionStatus.IDLE:
                raise NoActiveTransaction("LOCK TABLE can only be used in transaction blocks")
            return Outcome(statement.tag)
        if action == "deallocate":
            if name.lower() == "all" and statement.tag.endswith("ALL"):
                self._statements = {k: v for k, v in self._statements.items() if not k}
            elif name in self._statements and name:
                del self._statements[name]
            else:
                raise InvalidStatementName(f'prepared statement "{name}" does not exist')
            return Outcome(statement.tag or "DEALLOCATE")
        raise NotSupported(f"{statement.tag or 'this session command'} is not supported")

    def _apply_setting(self, name: str, value: str, *, local: bool, startup: bool = False) -> str:
        """SET: check the value as PostgreSQL would, store it, and return it as SHOW will show it;
        `startup`: a startup parameter, part of what RESET returns to."""
        in_block = self.status is not TransactionStatus.IDLE
        return self._settings.apply(name, value, local=local, in_block=in_block, startup=startup)

    def _reset_setting(self, name: str, *, local: bool) -> None:
        self._settings.reset_setting(name, local=local, in_block=self.status is not TransactionStatus.IDLE)

    def _check_epsilon(self, value: str) -> str:
        epsilon = number_value(EPSILON_SETTING, value, float, "write a number such as 0.2")
        if not math.isfinite(epsilon):
            raise invalid_value(EPSILON_SETTING, value)
        return float_text(self.engine.query_epsilon(epsilon, self.analyst))

    async def _show(self, name: str, tag: str) -> Outcome:
        if name == "all":
            settings = self._settings.all()
            settings[EPSILON_SETTING] = self._effective_epsilon()
            rows: list[tuple[object, ...]] = [
                (canonical(n), settings[n], "") for n in sorted(settings, key=lambda n: canonical(n).lower())
            ]
            columns = tuple(WireColumn(c, TEXT_OID) for c in ("name", "setting", "description"))
            return Outcome(tag, columns, rows)
        if name == BUDGET_SETTING:
            status = await self.shared.run_blocking(self.engine.budget, self.user)
            rows = [_budget_row(status, "analyst")]
            if status.shared is not None:  # the data set's budget, all analysts together
                rows.append(_budget_row(status.shared, "data set"))
            return Outcome(tag, tuple(WireColumn(n, TEXT_OID) for n in BUDGET_COLUMNS), rows)
        value = self._setting_value(name)
        return Outcome(tag, (WireColumn(canonical(name), TEXT_OID),), [(value,)])

    def _setting_value(self, name: str, *, missing_ok: bool = False) -> str | None:
        """One setting as SHOW and current_setting() read it; None when unknown and `missing_ok`."""
        if name == EPSILON_SETTING:
            return self._effective_epsilon()
        found = self._settings.value(name)
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
        if not is_setting_name(setting):
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


# SHOW dpproxy.budget's columns: one row for the analyst's budget, one for the data set's if any.
BUDGET_COLUMNS = ("epsilon_spent", "epsilon_remaining", "delta_spent", "delta_remaining", "budget")


def _budget_row(status: BudgetStatus, which: str) -> tuple[object, ...]:
    left, limit = status.remaining, status.limit
    # Six significant digits, spent rounded up and remaining down (results.budget_figure).
    return (
        spent_figure(status.epsilon_spent, limit.epsilon),
        remaining_figure(left.epsilon, limit.epsilon),
        spent_figure(status.spent.delta, limit.delta),
        remaining_figure(left.delta, limit.delta),
        which,
    )
