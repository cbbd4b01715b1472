"""What one statement is: session command, transaction control, cursor, EXPLAIN, catalog or engine query.

`route` classifies one statement (the session splits simple queries first) from its text and the
names of the exposed tables alone. It never runs SQL, never sees data or a session, and forwards
nothing to the real database: a query that reads a relation which is neither exposed nor a catalog
relation goes to the ENGINE, whose rejection names it.

It holds the hand-written parser of PostgreSQL's session, transaction and cursor commands, one
method per command; the lexer, the relations a query reads, the set_config recognition, PREPARE,
EXECUTE and LOCK (prepared.py) and COPY with its options (copy_to.py) live in their own modules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator

from dpproxy.errors import (
    NotSupported,
    PolicyViolation,
    SyntaxProblem,
    UndefinedParameter,
)
from dpproxy.wire.router.copy_to import CopyReader
from dpproxy.wire.router.lexer import (
    LexError,
    Token,
    TokenKind,
    quote_identifier,
)
from dpproxy.wire.router.limits import checked_tokens
from dpproxy.wire.router.prepared import PreparedReader
from dpproxy.wire.router.relations import is_catalog_relation, relations_read
from dpproxy.wire.router.set_config import SettingCallReader
from dpproxy.wire.router.statement import (
    ALLOWED,
    MAX_PARAMETERS,
    Kind,
    Statement,
)

_WRITES = {
    "insert": "INSERT",
    "update": "UPDATE",
    "delete": "DELETE",
    "merge": "MERGE",
    "upsert": "UPSERT",
    "replace": "REPLACE",
    "create": "CREATE",
    "drop": "DROP",
    "alter": "ALTER",
    "truncate": "TRUNCATE",
    "grant": "GRANT",
    "revoke": "REVOKE",
    "comment": "COMMENT",
    "security": "SECURITY LABEL",
    "reindex": "REINDEX",
    "cluster": "CLUSTER",
    "refresh": "REFRESH MATERIALIZED VIEW",
    "import": "IMPORT FOREIGN SCHEMA",
    "reassign": "REASSIGN OWNED",
}

_UNSUPPORTED = {
    "listen": "LISTEN",
    "notify": "NOTIFY",
    "unlisten": "UNLISTEN",
    "vacuum": "VACUUM",
    "analyze": "ANALYZE",
    "analyse": "ANALYZE",
    "call": "CALL",
    "do": "DO",
    "load": "LOAD",
    "checkpoint": "CHECKPOINT",
}

_QUERY_STARTS = {"select", "with", "values", "table"}

# Settings whose values PostgreSQL quotes as identifiers when it flattens a SET list (GUC_LIST_QUOTE).
_LIST_QUOTE_SETTINGS = frozenset(
    {
        "search_path",
        "temp_tablespaces",
        "session_preload_libraries",
        "shared_preload_libraries",
        "local_preload_libraries",
    }
)


def route(sql: str, exposed: Collection[str]) -> Statement:
    """Classify one statement (the session splits simple queries first), or raise DPProxyError.

    `exposed` holds the names of the policy's tables, as analysts write them (public schema).
    A statement past the limits of dpproxy.sql.limits is refused (54001) before anything else.
    """
    return _route(sql, frozenset(exposed), nested=False)


def _route(sql: str, exposed: frozenset[str], *, nested: bool) -> Statement:
    try:
        tokens = checked_tokens(sql, strict=True)
    except LexError as exc:
        raise SyntaxProblem(f"{exc}", hint="close every quote, string and comment") from None
    offset = next((t.start for t in tokens if t.kind is not TokenKind.OP or t.text != ";"), 0)
    text, tokens = _strip_statement(sql, tokens)
    if any(t.kind is TokenKind.OP and t.text == ";" for t in tokens):
        raise SyntaxProblem(
            "cannot insert multiple commands into a prepared statement",
            hint="send one statement at a time, or use the simple query protocol",
        )
    # Describe sizes a statement's parameter list by its highest $n, in the engine and the catalog:
    # `SELECT $100000000` must not have them build lists of 10⁸ types for one Parse message.
    highest = max((int(t.text[1:]) for t in tokens if t.kind is TokenKind.PARAM), default=0)
    if highest > MAX_PARAMETERS:
        raise UndefinedParameter(
            f"there is no parameter ${highest}", hint=f"a statement takes at most {MAX_PARAMETERS} parameters"
        )
    if not tokens:
        return Statement(Kind.EMPTY, text, "")
    try:
        return _Router(text, tokens, exposed, nested).route()
    except SyntaxProblem as error:  # a position in `text`, which starts `offset` characters into `sql`
        if error.position is not None:
            error.position += offset
        raise


def _strip_statement(sql: str, tokens: list[Token]) -> tuple[str, list[Token]]:
    """The statement without surrounding blanks and semicolons, and its tokens (read once, from
    `sql`), placed in it. Semicolons left inside mean several statements, which `_route` refuses."""
    first, last = 0, len(tokens)
    while first < last and tokens[first].kind is TokenKind.OP and tokens[first].text == ";":
        first += 1
    while last > first and tokens[last - 1].kind is TokenKind.OP and tokens[last - 1].text == ";":
        last -= 1
    if first == last:
        return "", []
    offset = tokens[first].start
    kept = tokens[first:last]
    if offset:
        kept = [dataclasses.replace(t, start=t.start - offset, end=t.end - offset) for t in kept]
    return sql[offset : tokens[last - 1].end], kept


class _Router(PreparedReader, CopyReader):
    def __init__(self, sql: str, tokens: list[Token], exposed: frozenset[str], nested: bool) -> None:
        super().__init__(sql, tokens)
        self.exposed = exposed
        # Routing the statement inside EXPLAIN, COPY (…), DECLARE or PREPARE: one that holds a
        # statement itself is named, not read, since none of them may be nested (and reading
        # EXPLAIN EXPLAIN … would recurse once per word).
        self.nested = nested

    def inner(self, sql: str) -> Statement:
        """The statement inside this one (EXPLAIN's, COPY's, DECLARE's or PREPARE's)."""
        return _route(sql, self.exposed, nested=True)

    def holder(self, kind: Kind, tag: str) -> Statement | None:
        """A statement holding another, inside another: its kind, which the outer one refuses."""
        return Statement(kind, self.sql, tag) if self.nested else None

    # -- dispatch ------------------------------------------------------------------------------

    def route(self) -> Statement:
        first = self.tokens[0]
        if first.kind is TokenKind.OP and first.text == "(":
            return self.query()
        if first.kind is not TokenKind.IDENT:
            self.syntax_error(first)
        word = first.value
        if word in _QUERY_STARTS:
            return self.query()
        handler = {
            "set": self.set,
            "reset": self.reset,
            "show": self.show,
            "discard": self.discard,
            "deallocate": self.deallocate,
            "begin": self.begin,
            "start": self.begin,
            "commit": self.commit,
            "end": self.commit,
            "rollback": self.rollback,
            "abort": self.rollback,
            "savepoint": self.savepoint,
            "release": self.release,
            "declare": self.declare,
            "fetch": self.fetch,
            "move": self.fetch,
            "close": self.close,
            "explain": self.explain,
            "copy": self.copy,
            "prepare": self.prepare,
            "execute": self.execute,
            "lock": self.lock,
        }.get(word)
        if handler is not None:
            return handler()
        if word in _WRITES:
            raise PolicyViolation(
                f"dpproxy is read-only: {_WRITES[word]} is not allowed",
                hint=ALLOWED,
            )
        if word in _UNSUPPORTED:
            raise NotSupported(f"{_UNSUPPORTED[word]} is not supported by dpproxy", hint=ALLOWED)
        self.syntax_error(first)
        raise AssertionError("unreachable")

    # -- session commands ----------------------------------------------------------------------

    def set(self) -> Statement:
        self.expect("set")
        if self.at_word("session") and self._next_is("characteristics"):
            self.pos += 2
            self.expect("as")
            self.expect("transaction")
            name, value = self.transaction_mode()
            return Statement(Kind.SESSION, self.sql, "SET", "set", f"default_{name}", value)
        local = False
        if self.accept("local"):
            local = True
        elif self.at_word("session") and not self._next_is("authorization"):
            self.pos += 1
        if self.at_word("role") or (self.at_word("session") and self._next_is("authorization")):
            raise NotSupported(
                "SET ROLE and SET SESSION AUTHORIZATION are not supported: you are always the analyst you "
                "logged in as",
                hint="reconnect as another analyst instead",
            )
        if self.accept("transaction"):
            if self.accept("snapshot"):
                raise NotSupported("SET TRANSACTION SNAPSHOT is not supported", hint=ALLOWED)
            name, value = self.transaction_mode()
            return Statement(Kind.SESSION, self.sql, "SET", "set", name, value, local=True)
        if self.at_word("time") and self._next_is("zone"):
            self.pos += 2
            value = self.zone_value()
            return Statement(Kind.SESSION, self.sql, "SET", "set", "timezone", value, local=local)
        if self.accept("schema"):
            value = self.set_values("search_path")
            return Statement(Kind.SESSION, self.sql, "SET", "set", "search_path", value, local=local)
        if self.accept("names"):
            value = None if self.at_end() else self.set_values("client_encoding")
            return Statement(Kind.SESSION, self.sql, "SET", "set", "client_encoding", value, local=local)
        if self.at_word("xml") and self._next_is("option"):
            self.pos += 2
            value = self.name()
            return Statement(Kind.SESSION, self.sql, "SET", "set", "xmloption", value, local=local)
        name = self.setting_name()
        if self.at_end():
            self.syntax_error(None)
        token = self.peek()
        assert token is not None
        if token.is_word("to") or (token.kind is TokenKind.OP and token.text == "="):
            self.pos += 1
        elif token.is_word("from") and self._next_is("current"):
            raise NotSupported("SET … FROM CURRENT is not supported", hint="give the value instead")
        else:
            self.syntax_error(token)
        if self.accept("default"):
            self.expect_end()
            return Statement(Kind.SESSION, self.sql, "SET", "set", name, None, local=local)
        value = self.set_values(name)
        return Statement(Kind.SESSION, self.sql, "SET", "set", name, value, local=local)

    def _next_is(self, word: str) -> bool:
        token = self.peek(1)
        return token is not None and token.is_word(word)

    def setting_name(self) -> str:
        parts = [self.name()]
        while (token := self.peek()) is not None and token.kind is TokenKind.OP and token.text == ".":
            self.pos += 1
            parts.append(self.name())
        return ".".join(parts).lower()

    def set_values(self, name: str) -> str:
        """The comma-separated SET values, flattened as PostgreSQL's flatten_set_variable_args does."""
        values = []
        while True:
            token = self.peek()
            if token is None:
                self.syntax_error(None)
            assert token is not None
            if token.kind is TokenKind.OP and token.text in "+-" and (nxt := self.peek(1)) is not None:
                if nxt.kind is not TokenKind.NUMBER:
                    self.syntax_error(nxt)
                self.pos += 2
                values.append(("number", ("-" if token.text == "-" else "") + nxt.value))
            elif token.kind is TokenKind.NUMBER:
                self.pos += 1
                values.append(("number", token.value))
            elif token.kind in (TokenKind.STRING, TokenKind.QUOTED, TokenKind.IDENT):
                # A string, a quoted or bare word: PostgreSQL's grammar makes all of them strings.
                self.pos += 1
                values.append(("string", token.value))
            else:
                self.syntax_error(token)
            if self.at_end():
                break
            token = self.peek()
            if token is not None and token.kind is TokenKind.OP and token.text == ",":
                self.pos += 1
                continue
            self.syntax_error(token)
        quote = name in _LIST_QUOTE_SETTINGS
        return ", ".join(quote_identifier(v) if quote and kind == "string" else v for kind, v in values)

    def zone_value(self) -> str | None:
        if self.accept("local", "default"):
            self.expect_end()
            return None
        token = self.peek()
        if token is not None and token.is_word("interval"):
            self.pos += 1
            token = self.peek()
            if token is None or token.kind is not TokenKind.STRING:
                self.syntax_error(token)
            assert token is not None
            self.pos = len(self.tokens)  # an optional interval qualifier follows; PostgreSQL ignores it
            return token.value
        return self.set_values("timezone")

    def transaction_mode(self) -> tuple[str, str]:
        """The first mode of SET TRANSACTION / SESSION CHARACTERISTICS (all are accepted)."""
        if self.accept("isolation"):
            self.expect("level")
            if self.accept("serializable"):
                result = ("transaction_isolation", "serializable")
            elif self.accept("repeatable"):
                self.expect("read")
                result = ("transaction_isolation", "repeatable read")
            else:
                self.expect("read")
                level = self.expect("committed", "uncommitted").value
                result = ("transaction_isolation", f"read {level}")
        elif self.accept("read"):
            mode = self.expect("only", "write").value
            result = ("transaction_read_only", "on" if mode == "only" else "off")
        elif self.accept("not"):
            self.expect("deferrable")
            result = ("transaction_deferrable", "off")
        else:
            self.expect("deferrable")
            result = ("transaction_deferrable", "on")
        # Further modes (", READ ONLY" …) are accepted and have no effect on a read-only proxy.
        while not self.at_end():
            self.pos += 1
        return result

    def reset(self) -> Statement:
        self.expect("reset")
        return self._last(Kind.SESSION, "RESET", "reset", self.spoken_setting())

    def show(self) -> Statement:
        self.expect("show")
        return self._last(Kind.SESSION, "SHOW", "show", self.spoken_setting())

    def spoken_setting(self) -> str:
        """The setting SHOW and RESET name: TIME ZONE, SESSION AUTHORIZATION and TRANSACTION
        ISOLATION LEVEL in words, as PostgreSQL's grammar spells them, else a setting name."""
        if self.at_word("time") and self._next_is("zone"):
            self.pos += 2
            return "timezone"
        if self.at_word("session") and self._next_is("authorization"):
            self.pos += 2
            return "session_authorization"
        if self.at_word("transaction") and self._next_is("isolation"):
            self.pos += 2
            self.expect("level")
            return "transaction_isolation"
        return self.setting_name()

    def discard(self) -> Statement:
        self.expect("discard")
        what = self.expect("all", "plans", "sequences", "temp", "temporary").value
        what = "temp" if what == "temporary" else what
        return self._last(Kind.SESSION, f"DISCARD {what.upper()}", "discard", what)

    def deallocate(self) -> Statement:
        self.expect("deallocate")
        self.accept("prepare")
        return self._all_or_name(Kind.SESSION, "DEALLOCATE", "DEALLOCATE ALL", "deallocate")

    def _all_or_name(self, kind: Kind, tag: str, tag_all: str, action: str) -> Statement:
        """The rest of `DEALLOCATE [PREPARE]` or `CLOSE`: ALL, or one name."""
        if self.accept("all"):
            return self._last(kind, tag_all, action, "all")
        return self._last(kind, tag, action, self.name())

    def _last(self, kind: Kind, tag: str, action: str, name: str) -> Statement:
        """A command whose last word names what it acts on (a setting, a savepoint, a cursor, a
        prepared statement, ALL): nothing may follow."""
        self.expect_end()
        return Statement(kind, self.sql, tag, action, name)

    # -- transactions --------------------------------------------------------------------------

    def begin(self) -> Statement:
        if self.accept("start"):
            self.expect("transaction")
            tag = "START TRANSACTION"
        else:
            self.expect("begin")
            self.accept("work", "transaction")
            tag = "BEGIN"
        # Transaction modes (ISOLATION LEVEL …, READ ONLY, DEFERRABLE) are accepted: every
        # transaction through dpproxy is read-only, and the engine answers each query on its own.
        while not self.at_end():
            token = self.peek()
            assert token is not None
            if token.kind is TokenKind.IDENT or (token.kind is TokenKind.OP and token.text == ","):
                self.pos += 1
                continue
            self.syntax_error(token)
        return Statement(Kind.TRANSACTION, self.sql, tag, "begin")

    def commit(self) -> Statement:
        self.pos += 1
        if self.at_word("prepared"):
            raise NotSupported("two-phase commit (COMMIT PREPARED) is not supported", hint=ALLOWED)
        self.accept("work", "transaction")
        self.no_chain()
        return Statement(Kind.TRANSACTION, self.sql, "COMMIT", "commit")

    def no_chain(self) -> None:
        if self.accept("and"):
            if self.accept("no"):
                self.expect("chain")
            else:
                self.expect("chain")
                raise NotSupported(
                    "AND CHAIN is not supported", hint="send BEGIN after the COMMIT or ROLLBACK"
                )
        self.expect_end()

    def rollback(self) -> Statement:
        self.pos += 1
        if self.at_word("prepared"):
            raise NotSupported("two-phase commit (ROLLBACK PREPARED) is not supported", hint=ALLOWED)
        self.accept("work", "transaction")
        if self.accept("to"):
            self.accept("savepoint")
            return self._last(Kind.TRANSACTION, "ROLLBACK", "rollback_to", self.name())
        self.no_chain()
        return Statement(Kind.TRANSACTION, self.sql, "ROLLBACK", "rollback")

    def savepoint(self) -> Statement:
        self.expect("savepoint")
        return self._last(Kind.TRANSACTION, "SAVEPOINT", "savepoint", self.name())

    def release(self) -> Statement:
        self.expect("release")
        self.accept("savepoint")
        return self._last(Kind.TRANSACTION, "RELEASE", "release", self.name())

    # -- cursors -------------------------------------------------------------------------------

    def declare(self) -> Statement:
        if (held := self.holder(Kind.CURSOR, "DECLARE CURSOR")) is not None:
            return held
        self.expect("declare")
        name = self.name()
        hold = False
        while True:
            if self.accept("binary"):
                raise NotSupported(
                    "BINARY cursors are not supported", hint="declare the cursor without BINARY"
                )
            if self.accept("asensitive", "insensitive", "scroll"):
                continue
            if self.accept("no"):
                self.expect("scroll")
                continue
            break
        self.expect("cursor")
        if self.accept("with"):
            self.expect("hold")
            hold = True
        elif self.accept("without"):
            self.expect("hold")
        self.expect("for")
        inner_sql = self.rest()
        if not inner_sql:
            self.syntax_error(None)
        inner = self.inner(inner_sql)
        if inner.kind not in (Kind.ENGINE, Kind.CATALOG):
            raise SyntaxProblem(
                "DECLARE … CURSOR FOR needs a query (SELECT)", hint="declare the cursor for a SELECT"
            )
        return Statement(Kind.CURSOR, self.sql, "DECLARE CURSOR", "declare", name, hold=hold, inner=inner)

    def fetch(self) -> Statement:
        verb = self.tokens[0].value
        self.pos = 1
        count: int | None = 1
        backwards = "FETCH and MOVE only go forward through a dpproxy cursor (NEXT, FORWARD, a count or ALL)"
        token = self.peek()
        if token is not None and token.kind is TokenKind.NUMBER:
            count = self._count(token)
            self.pos += 1
        elif self.accept("next"):
            count = 1
        elif self.accept("all"):
            count = None
        elif self.accept("forward"):
            token = self.peek()
            if token is not None and token.kind is TokenKind.NUMBER:
                count = self._count(token)
                self.pos += 1
            elif self.accept("all"):
                count = None
        elif self.at_word("prior", "first", "last", "absolute", "relative", "backward"):
            raise NotSupported(backwards, hint="declare a new cursor to read the rows again")
        elif token is not None and token.kind is TokenKind.OP and token.text in "+-":
            raise NotSupported(backwards, hint="use a positive count")
        self.accept("from", "in")
        name = self.name()
        self.expect_end()
        tag = verb.upper()
        return Statement(Kind.CURSOR, self.sql, tag, verb, name, count=count)

    def _count(self, token: Token) -> int:
        if not token.value.isdigit():
            self.syntax_error(token)
        return int(token.value)

    def close(self) -> Statement:
        self.expect("close")
        return self._all_or_name(Kind.CURSOR, "CLOSE CURSOR", "CLOSE CURSOR ALL", "close")

    # -- EXPLAIN -------------------------------------------------------------------------------

    def explain(self) -> Statement:
        if (held := self.holder(Kind.EXPLAIN, "EXPLAIN")) is not None:
            return held
        self.expect("explain")
        analyze = False
        token = self.peek()
        if token is not None and token.kind is TokenKind.OP and token.text == "(":
            options: list[list[str]] = [[]]
            for token, depth in self._parenthesized_tokens():
                if token.kind is TokenKind.OP and token.text in ("(", ")"):
                    continue
                if token.kind is TokenKind.OP and token.text == "," and depth == 1:
                    options.append([])
                else:
                    options[-1].append(token.value.lower())
            for option in options:
                if option and option[0] in ("analyze", "analyse"):
                    analyze = option[1:] not in (["false"], ["off"], ["0"])
        else:
            while self.at_word("analyze", "analyse", "verbose"):
                analyze = analyze or self.peek().value != "verbose"  # type: ignore[union-attr]
                self.pos += 1
        if analyze:
            raise NotSupported(
                "EXPLAIN ANALYZE is not supported: it would run the query on the data",
                hint="EXPLAIN without ANALYZE shows how dpproxy rewrites the query and what it costs",
            )
        inner_sql = self.rest()
        if not inner_sql:
            self.syntax_error(None)
        inner = self.inner(inner_sql)
        if inner.kind is not Kind.ENGINE:
            raise NotSupported(
                "EXPLAIN is supported for queries on exposed tables only",
                hint="EXPLAIN a SELECT that reads an exposed table",
            )
        return Statement(Kind.EXPLAIN, self.sql, "EXPLAIN", inner=inner)

    # -- helpers shared with the PREPARE and COPY readers --------------------------------------

    def _parenthesized_tokens(self) -> Iterator[tuple[Token, int]]:
        """Reads from the '(' at the current token to its matching ')', or to the end when none
        comes: each token, consumed, with the depth of the parentheses around it once read (1
        directly inside, 0 for the matching ')', which ends the walk)."""
        depth = 0
        while (token := self.peek()) is not None:
            self.pos += 1
            if token.kind is TokenKind.OP and token.text == "(":
                depth += 1
            elif token.kind is TokenKind.OP and token.text == ")":
                depth -= 1
            yield token, depth
            if depth == 0:
                return

    def _parenthesized_text(self) -> str:
        """The text between a '(' at the current token and its matching ')', which is consumed."""
        opening = self.peek()
        assert opening is not None
        for token, depth in self._parenthesized_tokens():
            if depth == 0:
                return self.sql[opening.end : token.start].strip()
        self.syntax_error(None)
        raise AssertionError("unreachable")

    # -- queries -------------------------------------------------------------------------------

    def query(self) -> Statement:
        calls = SettingCallReader(self.sql, self.tokens).setting_calls()
        if calls is not None:
            return Statement(Kind.SESSION, self.sql, "SELECT", "set_config", calls=calls)
        relations = relations_read(self.sql, self.tokens)
        exposed, catalog, other = [], [], []
        for schema, name in relations:
            if schema in (None, "public") and name in self.exposed:
                exposed.append(name)
            elif is_catalog_relation(schema, name):
                catalog.append(name)
            else:
                other.append(name)
        if exposed and catalog:
            raise NotSupported(
                f"a query cannot read both exposed tables ({', '.join(sorted(set(exposed)))}) and catalog "
                f"relations ({', '.join(sorted(set(catalog)))})",
                hint="query the catalog and the data in separate statements",
            )
        kind = Kind.ENGINE if exposed or other else Kind.CATALOG
        return Statement(kind, self.sql, "SELECT")
