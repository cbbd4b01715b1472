"""PREPARE, EXECUTE and LOCK: the statements that name others or tables, read for the classifier.

`PREPARE name [(type, …)] AS statement` and `EXECUTE name [(argument, …)]` share their prepared
statements with the extended protocol's Parse and Bind; `LOCK [TABLE] name [, …] IN ACCESS SHARE
MODE`, which pg_dump sends for each table it dumps, is accepted inside a transaction block and
changes nothing (dpproxy is read-only and holds no lock on the backing database). This module only
reads tokens: the session acts on the Statement it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from dpproxy.errors import NotSupported, SyntaxProblem, UndefinedObject
from dpproxy.wire.router.lexer import TokenKind
from dpproxy.wire.router.part import ClassifierPart
from dpproxy.wire.router.statement import ALLOWED, Argument, Kind, Statement

T = TypeVar("T")
STRING = TokenKind.STRING


class PreparedReader(ClassifierPart):
    """PREPARE, EXECUTE and LOCK, mixed into the classifier (classify.py), which provides the
    helpers declared below."""

    def prepare(self) -> Statement:
        """PREPARE name [(type, …)] AS statement: a named prepared statement, shared with Parse's."""
        if (held := self.holder(Kind.PREPARED, "PREPARE")) is not None:
            return held
        self.expect("prepare")
        if self.at_word("transaction"):
            raise NotSupported("two-phase commit (PREPARE TRANSACTION) is not supported", hint=ALLOWED)
        name = self.name()
        types = self._parenthesized_list(self._type_name)
        self.expect("as")
        inner_sql = self.rest()
        if not inner_sql:
            self.syntax_error(None)
        inner = self.inner(inner_sql)
        if inner.kind not in (Kind.ENGINE, Kind.CATALOG) and inner.action != "set_config":
            raise SyntaxProblem(
                "PREPARE … AS needs a query (SELECT)", hint="prepare a SELECT; run session commands directly"
            )
        return Statement(
            Kind.PREPARED, self.sql, "PREPARE", "prepare", name, inner=inner, type_names=tuple(types)
        )

    def _parenthesized_list(self, item: Callable[[], T]) -> list[T]:
        """`(item, item, …)` if the next token opens a parenthesis, else nothing."""
        items: list[T] = []
        if self._accept_op("("):
            while True:
                items.append(item())
                if self._accept_op(")"):
                    break
                if not self._accept_op(","):
                    self.syntax_error(self.peek())
        return items

    def _type_name(self) -> str:
        """A parameter type of PREPARE, as the wire type it names (int4, text, timestamptz …)."""
        words: list[str] = []
        while (token := self.peek()) is not None:
            if token.kind is TokenKind.OP and token.text in (",", ")"):
                break
            if token.kind is TokenKind.OP and token.text == "(":  # a modifier: varchar(20), numeric(10,2)
                self._parenthesized_text()
                continue
            if token.kind is TokenKind.OP and token.text in (".", "[", "]"):
                words.append(token.text)
            elif token.kind in (TokenKind.IDENT, TokenKind.QUOTED):
                words.append(token.value)
            else:
                self.syntax_error(token)
            self.pos += 1
        written = " ".join(words).replace(" . ", ".").removeprefix("pg_catalog.")
        if not written:
            self.syntax_error(self.peek())
        found = _TYPE_NAMES.get(written)
        if found is None:
            raise UndefinedObject(
                f'type "{written}" does not exist',
                hint="parameter types dpproxy takes: " + ", ".join(sorted(set(_TYPE_NAMES.values()))),
            )
        return found

    def execute(self) -> Statement:
        """EXECUTE name [(argument, …)]: each argument a constant (or $n), typed by the statement."""
        self.expect("execute")
        name = self.name()
        arguments = self._parenthesized_list(self._argument)
        self.expect_end()
        return Statement(Kind.PREPARED, self.sql, "EXECUTE", "execute", name, arguments=tuple(arguments))

    def _argument(self) -> Argument:
        token = self.peek()
        if token is None:
            self.syntax_error(None)
        assert token is not None
        value: Argument
        sign = ""
        if token.kind is TokenKind.OP and token.text in ("+", "-"):
            sign = "-" if token.text == "-" else ""
            self.pos += 1
            token = self.peek()
            if token is None or token.kind is not TokenKind.NUMBER:
                self.syntax_error(token)
            assert token is not None
        if token.kind is TokenKind.NUMBER:
            value = sign + token.value
        elif token.kind is TokenKind.STRING:
            value = token.value
        elif token.kind is TokenKind.PARAM:
            value = int(token.text[1:])
        elif token.is_word("null"):
            value = None
        elif token.is_word("true", "false"):
            value = token.value
        elif token.kind is TokenKind.IDENT and (nxt := self.peek(1)) is not None and nxt.kind is STRING:
            self.pos += 1  # a typed literal, DATE '2024-01-01': the statement's parameter type decides
            value = nxt.value
            token = nxt
        else:
            raise NotSupported(
                "EXECUTE takes constants as its arguments",
                hint="write each argument as a literal, e.g. EXECUTE q(42, 'text', DATE '2024-01-01')",
            )
        self.pos += 1
        if self._accept_op("::"):  # a cast: the statement's parameter type decides
            self._type_name_tokens()
        return value

    def _type_name_tokens(self) -> None:
        while (token := self.peek()) is not None:
            if token.kind is TokenKind.OP and token.text in (",", ")"):
                return
            if token.kind is TokenKind.OP and token.text == "(":
                self._parenthesized_text()
                continue
            self.pos += 1

    def lock(self) -> Statement:
        """LOCK [TABLE] [ONLY] name [*] [, …] [IN ACCESS SHARE MODE] [NOWAIT]: pg_dump's, for each table
        it dumps. Accepted in ACCESS SHARE mode only, which blocks no reader: dpproxy never writes, and
        holds no lock on the backing database (each query is answered on its own)."""
        self.expect("lock")
        self.accept("table")
        while True:
            self.accept("only")
            self.name()
            while self._accept_op("."):
                self.name()
            self._accept_op("*")
            if not self._accept_op(","):
                break
        mode = "ACCESS EXCLUSIVE"  # PostgreSQL's default
        if self.accept("in"):
            words: list[str] = []
            while (token := self.peek()) is not None and not token.is_word("mode"):
                words.append(self.name().upper())
            self.expect("mode")
            mode = " ".join(words)
        self.accept("nowait")
        self.expect_end()
        if mode != "ACCESS SHARE":
            raise NotSupported(
                f"LOCK … IN {mode} MODE is not supported: dpproxy is read-only and takes no locks",
                hint="LOCK TABLE … IN ACCESS SHARE MODE (what pg_dump sends) is accepted and changes nothing",
            )
        return Statement(Kind.SESSION, self.sql, "LOCK TABLE", "lock")


# PREPARE's parameter types, as written (lower case, pg_catalog. dropped) → the wire type's name.
_TYPE_NAMES = {
    **{n: "int2" for n in ("smallint", "int2")},
    **{n: "int4" for n in ("integer", "int", "int4")},
    **{n: "int8" for n in ("bigint", "int8")},
    **{n: "numeric" for n in ("numeric", "decimal")},
    **{n: "float4" for n in ("real", "float4")},
    **{n: "float8" for n in ("double precision", "float8", "float")},
    **{n: "text" for n in ("text", "name", "unknown")},
    **{n: "varchar" for n in ("varchar", "character varying")},
    **{n: "bpchar" for n in ("char", "character", "bpchar")},
    **{n: "bool" for n in ("boolean", "bool")},
    "date": "date",
    **{n: "timestamp" for n in ("timestamp", "timestamp without time zone")},
    **{n: "timestamptz" for n in ("timestamptz", "timestamp with time zone")},
    # Catalog types, for prepared catalog queries (pg_dump's getColumnACLs(pg_catalog.oid)).
    **{n: n for n in ("oid", "regclass", "regtype", "regproc", "regprocedure", "regnamespace", "regrole")},
}
