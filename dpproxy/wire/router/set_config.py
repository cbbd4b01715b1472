"""`SELECT set_config(…) [, current_setting(…) …]`: recognised so that the session runs it as SET.

What clients send to change a setting through a query: pg_dump's
`SELECT pg_catalog.set_config('search_path', '', false)`, asyncpg's
`SELECT current_setting('jit') AS cur, set_config('jit', 'off', false) AS new`, applications'
`SELECT set_config('app.tenant', $1, false)`. This module only recognises that shape and its
arguments (constants or parameters); it never changes a setting (the session does) and never
decides where any other query goes (the classifier does).
"""

from __future__ import annotations

from dpproxy.wire.router.lexer import QUOTED_KEYWORDS, TokenKind, TokenReader
from dpproxy.wire.router.statement import Argument, SettingCall


class SettingCallReader(TokenReader):
    """Reads the calls of one SELECT, if it calls set_config and current_setting only."""

    def setting_calls(self) -> tuple[SettingCall, ...] | None:
        """The calls of `SELECT set_config(…) [AS label] [, current_setting(…) …]`, or None.

        What clients send to change a setting through a query: pg_dump's
        `SELECT pg_catalog.set_config('search_path', '', false)`, asyncpg's
        `SELECT current_setting('jit') AS cur, set_config('jit', 'off', false) AS new`, applications'
        `SELECT set_config('app.tenant', $1, false)`. Arguments must be constants or parameters, so
        that the session can run the calls itself with SET's rules; any other use of set_config goes
        where the rest of the query goes, and is refused there.
        """
        if not self.tokens[0].is_word("select"):
            return None
        self.pos = 1
        calls: list[SettingCall] = []
        while True:
            call = self._setting_call()
            if call is None:
                return None
            calls.append(call)
            if self.at_end():
                break
            if not self._accept_op(","):
                return None
        if not any(call.function == "set_config" for call in calls):
            return None  # current_setting alone reads, and the catalog answers it
        return tuple(calls)

    def _function_name(self) -> str | None:
        """set_config or current_setting, optionally qualified by pg_catalog."""
        token, dot = self.peek(), self.peek(1)
        if (
            token is not None
            and token.kind in (TokenKind.IDENT, TokenKind.QUOTED)
            and token.value == "pg_catalog"
            and dot is not None
            and dot.text == "."
        ):
            self.pos += 2
            token = self.peek()
        if token is None or token.kind not in (TokenKind.IDENT, TokenKind.QUOTED):
            return None
        if token.value not in _SETTING_FUNCTIONS:
            return None
        self.pos += 1
        return token.value

    def _setting_call(self) -> SettingCall | None:
        function = self._function_name()
        if function is None or not self._accept_op("("):
            return None
        kinds = _SETTING_FUNCTIONS[function]
        arguments: list[Argument] = []
        while True:
            if len(arguments) == len(kinds):
                return None
            argument = self._constant_argument(kinds[len(arguments)])
            if argument is False:
                return None
            arguments.append(argument)
            if self._accept_op(")"):
                break
            if not self._accept_op(","):
                return None
        if len(arguments) < (3 if function == "set_config" else 1):
            return None
        label = function
        token = self.peek()
        if self.accept("as"):
            token = self.peek()
            if token is None or token.kind not in (TokenKind.IDENT, TokenKind.QUOTED):
                return None
            label = token.value
            self.pos += 1
        elif token is not None and token.kind in (TokenKind.IDENT, TokenKind.QUOTED):
            if token.kind is TokenKind.IDENT and token.value in QUOTED_KEYWORDS:
                return None  # FROM, WHERE …: not a label, so not a query this method reads
            label = token.value
            self.pos += 1
        return SettingCall(function, tuple(arguments), label)

    def _constant_argument(self, kind: str) -> Argument | bool:
        """A string, NULL, $n or (for a boolean) TRUE/FALSE, with an optional cast to the argument's
        own type; False for anything else. A number is not text to PostgreSQL either: there
        set_config('x', 1, false) is a call of a function that does not exist."""
        token = self.peek()
        if token is None:
            return False
        value: Argument
        if token.kind is TokenKind.STRING and token.text[0] not in "bBxX":  # not a bit string
            value = token.value
        elif token.kind is TokenKind.PARAM and int(token.text[1:]) >= 1:
            value = int(token.text[1:])
        elif token.is_word("null"):
            value = None
        elif kind == "boolean" and token.is_word("true", "false"):
            value = token.value
        else:
            return False
        self.pos += 1
        if not self._accept_op("::"):
            return value
        if self.at_word("pg_catalog") and (dot := self.peek(1)) is not None and dot.text == ".":
            self.pos += 2
        if self.accept("character"):
            type_name = "varchar" if self.accept("varying") else "character"
        else:
            type_token = self.peek()
            if type_token is None or type_token.kind is not TokenKind.IDENT:
                return False
            type_name = type_token.value
            self.pos += 1
        return value if type_name in _CASTS[kind] else False


# The functions `SELECT set_config(…)` may call, with the kind of each argument.
_SETTING_FUNCTIONS = {
    "set_config": ("text", "text", "boolean"),
    "current_setting": ("text", "boolean"),
}
# Casts an argument may carry: to its own type, which changes nothing.
_CASTS = {
    "text": frozenset({"text", "varchar", "name"}),
    "boolean": frozenset({"bool", "boolean"}),
}
