"""COPY … TO STDOUT read for the classifier: its query, its direction and target, and its options.

`COPY (query) TO STDOUT` and `COPY [BINARY] table [(columns)] TO STDOUT` (which psql's \\copy sends
too) are read into the query they run and COPY TO's options, checked as PostgreSQL's
ProcessCopyOptions checks them (same SQLSTATEs, same messages); COPY FROM and COPY to a server file or
program are refused. This module only reads tokens: the session runs the query and writes the rows in
COPY's text, CSV or binary format (session/copyout.py).
"""

from __future__ import annotations

from typing import TypedDict

from dpproxy.errors import InvalidParameter, NotSupported, PolicyViolation, SyntaxProblem
from dpproxy.wire.router.lexer import TokenKind, quote_identifier
from dpproxy.wire.router.part import ClassifierPart
from dpproxy.wire.router.statement import CopyOptions, Kind, Statement


class CopyReader(ClassifierPart):
    """COPY, mixed into the classifier (classify.py), which provides the helpers declared below."""

    def copy(self) -> Statement:
        """COPY (query) TO STDOUT and COPY table [(columns)] TO STDOUT, which psql's \\copy sends too.

        The table form is `SELECT columns FROM table`, routed like any query (so a protected
        table is refused as SELECT * is). COPY FROM, and COPY to a server file or program, are refused.
        """
        if (held := self.holder(Kind.COPY, "COPY")) is not None:
            return held
        self.expect("copy")
        binary = self.accept("binary")  # COPY BINARY table TO …, the pre-7.3 spelling of FORMAT binary
        token = self.peek()
        if not binary and token is not None and token.kind is TokenKind.OP and token.text == "(":
            inner_sql = self._parenthesized_text()
            inner = self.inner(inner_sql)
            if inner.kind not in (Kind.ENGINE, Kind.CATALOG):
                raise SyntaxProblem(
                    "COPY (…) TO needs a query (SELECT) inside the parentheses",
                    hint="write COPY (SELECT …) TO STDOUT",
                )
        else:
            inner = self.inner(self._copy_table_query())
        direction = self.expect("to", "from").value
        if direction == "from":
            raise PolicyViolation(
                "dpproxy is read-only: COPY FROM is not allowed",
                hint="export with COPY (SELECT …) TO STDOUT or psql's \\copy (SELECT …) TO 'file'",
            )
        if self.at_word("program") or ((t := self.peek()) is not None and t.kind is TokenKind.STRING):
            raise PolicyViolation(
                "COPY to a file or program on the server is not allowed",
                hint="COPY … TO STDOUT sends the rows to you; psql's \\copy … TO 'file' writes your file",
            )
        self.expect("stdout")
        options = self._copy_options({"format": "binary"} if binary else {})
        return Statement(Kind.COPY, self.sql, "COPY", "copy", inner=inner, copy=options)

    def _copy_table_query(self) -> str:
        parts = [quote_identifier(self.name())]
        while (token := self.peek()) is not None and token.kind is TokenKind.OP and token.text == ".":
            self.pos += 1
            parts.append(quote_identifier(self.name()))
        columns = "*"
        token = self.peek()
        if token is not None and token.kind is TokenKind.OP and token.text == "(":
            self.pos += 1
            names = [quote_identifier(self.name())]
            while self._accept_op(","):
                names.append(quote_identifier(self.name()))
            if not self._accept_op(")"):
                self.syntax_error(self.peek())
            columns = ", ".join(names)
        return f"SELECT {columns} FROM {'.'.join(parts)}"

    def _copy_options(self, given: dict[str, object]) -> CopyOptions:

        def put(name: str, value: object) -> None:
            if name in given:
                raise SyntaxProblem("conflicting or redundant options", hint=f"give {name.upper()} once")
            given[name] = value

        self.accept("with")
        if self._accept_op("("):  # (option [value], …), PostgreSQL 9.0's syntax
            while True:
                name = self.name().lower()
                put(name, self._copy_option_value())
                if self._accept_op(")"):
                    break
                if not self._accept_op(","):
                    self.syntax_error(self.peek())
        else:  # the older syntax, which psql's \\copy passes on as written: CSV HEADER DELIMITER ','
            while not self.at_end():
                word = self.name().lower()
                if word in ("binary", "csv"):
                    put("format", word)
                elif word == "header":
                    put("header", True)
                elif word in ("delimiter", "null", "quote", "escape", "encoding"):
                    self.accept("as")
                    put(word, self._copy_string())
                elif word == "force":
                    if self.accept("not"):
                        self.expect("null")
                        put("force_not_null", True)
                    else:
                        self.expect("quote")
                        put("force_quote", self._copy_columns())
                elif word == "oids":
                    raise NotSupported("COPY … OIDS is not supported", hint="remove OIDS")
                else:
                    raise SyntaxProblem(f'option "{word}" not recognized', hint=_COPY_OPTIONS)
        self.expect_end()
        return _copy_options(given)

    def _copy_option_value(self) -> object:
        """An option's value in the parenthesized syntax: a word, string, number, list, * or nothing."""
        token = self.peek()
        if token is None or (token.kind is TokenKind.OP and token.text in (",", ")")):
            return True
        if token.kind is TokenKind.OP and token.text == "*":
            self.pos += 1
            return "*"
        if token.kind is TokenKind.OP and token.text == "(":
            return self._copy_columns()
        if token.kind in (TokenKind.IDENT, TokenKind.QUOTED, TokenKind.STRING, TokenKind.NUMBER):
            self.pos += 1
            return token.value
        self.syntax_error(token)
        raise AssertionError("unreachable")

    def _copy_string(self) -> str:
        token = self.peek()
        if token is None or token.kind is not TokenKind.STRING:
            self.syntax_error(token)
        self.pos += 1
        return token.value  # type: ignore[union-attr]

    def _copy_columns(self) -> tuple[str, ...] | str:
        if self._accept_op("*"):
            return "*"
        parenthesized = self._accept_op("(")
        names = [self.name()]
        while self._accept_op(","):
            names.append(self.name())
        if parenthesized and not self._accept_op(")"):
            self.syntax_error(self.peek())
        return tuple(names)


# -- COPY's options --------------------------------------------------------------------------------

_COPY_FORMATS = "use FORMAT text (the default), FORMAT csv or FORMAT binary"
_COPY_BINARY = "FORMAT binary writes typed values with their lengths: leave out DELIMITER, NULL and HEADER"
_COPY_OPTIONS = "COPY … TO STDOUT takes FORMAT, DELIMITER, NULL, HEADER, QUOTE, ESCAPE, FORCE_QUOTE, ENCODING"
_COPY_TO_OPTIONS = ("format", "delimiter", "null", "header", "quote", "escape", "force_quote", "encoding")
_COPY_FROM_ONLY = {"force_not_null", "force_null", "freeze", "default", "on_error"}
_TRUE = {"true", "on", "1", "yes"}
_FALSE = {"false", "off", "0", "no"}


def _copy_boolean(name: str, value: object) -> bool:
    if value is True:
        return True
    text = str(value).lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise SyntaxProblem(f"{name} requires a Boolean value")


def _copy_character(name: str, value: object, *, what: str) -> str:
    text = value if isinstance(value, str) and value is not True else None
    if text is None:
        raise SyntaxProblem(f"{name} requires a string value")
    if len(text.encode()) != 1:
        raise InvalidParameter(f"COPY {what} must be a single one-byte character")
    return text


def _copy_options(given: dict[str, object]) -> CopyOptions:
    """COPY TO's options checked as PostgreSQL's ProcessCopyOptions checks them."""
    for name in given:
        if name in _COPY_FROM_ONLY:
            raise NotSupported(f"COPY {name.upper()} cannot be used with COPY TO", hint=_COPY_OPTIONS)
        if name not in _COPY_TO_OPTIONS:
            raise SyntaxProblem(f'option "{name}" not recognized', hint=_COPY_OPTIONS)
    fmt = str(given.get("format", "text")).lower()
    if fmt not in ("text", "csv", "binary"):
        raise SyntaxProblem(f'COPY format "{fmt}" not recognized', hint=_COPY_FORMATS)
    csv = fmt == "csv"
    if fmt == "binary":  # PostgreSQL's checks, in its order: each option is a text/CSV layout's
        for option in ("delimiter", "null"):
            if option in given:
                raise SyntaxProblem(f"cannot specify {option.upper()} in BINARY mode", hint=_COPY_BINARY)
        if "header" in given and _copy_boolean("header", given["header"]):
            raise NotSupported("cannot specify HEADER in BINARY mode", hint=_COPY_BINARY)
    if "encoding" in given:
        encoding = "".join(c for c in str(given["encoding"]).lower() if c.isalnum())
        if encoding not in ("utf8", "unicode", "sqlascii"):
            raise NotSupported(f'COPY ENCODING "{given["encoding"]}" is not supported', hint="use UTF8")
    delimiter = (
        _copy_character("delimiter", given["delimiter"], what="delimiter")
        if "delimiter" in given
        else ("," if csv else "\t")
    )
    null_value = given.get("null", "" if csv else "\\N")
    if not isinstance(null_value, str):
        raise SyntaxProblem("null requires a string value")
    header = _copy_boolean("header", given["header"]) if "header" in given else False
    if delimiter in ("\r", "\n"):
        raise InvalidParameter("COPY delimiter cannot be newline or carriage return")
    if "\r" in null_value or "\n" in null_value:
        raise InvalidParameter("COPY null representation cannot use newline or carriage return")
    if not csv and delimiter in "\\.abcdefghijklmnopqrstuvwxyz0123456789":
        raise InvalidParameter(f'COPY delimiter cannot be "{delimiter}"')
    if delimiter in null_value:
        raise InvalidParameter("COPY delimiter must not appear in the NULL specification")
    return CopyOptions(
        format=fmt,
        delimiter=delimiter,
        null=null_value,
        header=header,
        **_csv_quoting(given, csv=csv, delimiter=delimiter, null_value=null_value),
    )


class _Quoting(TypedDict):
    """CSV's quoting options, keyed by their `CopyOptions` fields."""

    quote: str
    escape: str
    force_quote: tuple[str, ...]
    force_quote_all: bool


def _csv_quoting(given: dict[str, object], *, csv: bool, delimiter: str, null_value: str) -> _Quoting:
    """QUOTE, ESCAPE and FORCE_QUOTE, which only CSV takes, checked against the delimiter and the NULL
    text as ProcessCopyOptions checks them (after the other options)."""
    for option in ("quote", "escape", "force_quote"):
        if option in given and not csv:
            raise NotSupported(f"COPY {option.upper()} requires CSV mode", hint="add FORMAT csv")
    quote = _copy_character("quote", given["quote"], what="quote") if "quote" in given else '"'
    escape = _copy_character("escape", given["escape"], what="escape") if "escape" in given else quote
    if csv and delimiter == quote:
        raise InvalidParameter("COPY delimiter and quote must be different")
    if csv and quote in null_value:
        raise InvalidParameter("CSV quote character must not appear in the NULL specification")
    force = given.get("force_quote", ())
    return {
        "quote": quote,
        "escape": escape,
        "force_quote": force if isinstance(force, tuple) else (),
        "force_quote_all": force == "*",
    }
