"""What a statement is: the one place that decides where SQL from a client goes (DESIGN §2).

    SET, SHOW, RESET, DISCARD, DEALLOCATE                → SESSION, answered by the session
    SELECT set_config(…) [, current_setting(…) …]        → SESSION (set_config: SET as a function)
    BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE          → TRANSACTION
    DECLARE … CURSOR, FETCH, MOVE, CLOSE                 → CURSOR
    EXPLAIN <query on exposed tables>                    → EXPLAIN (engine.explain, never the database)
    a query reading catalog relations, or no relation    → CATALOG (the shadow catalog)
    a query reading any other relation                   → ENGINE (which refuses what is not exposed)
    anything else                                        → refused with a SQLSTATE

This module owns the lexer that splits a simple query into statements and the classification of
one statement. It never runs SQL and never sees data: a decision depends only on the query text and
the names of the exposed tables. Where sqlglot cannot parse a query (clients send catalog SQL it does
not know, such as ``OPERATOR(pg_catalog.~)``), relations are found by a scan of the tokens. A query
that reads a relation which is neither exposed nor a catalog relation goes to the ENGINE, whose
rejection names it; nothing is ever forwarded to the real database from here.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum

import sqlglot
from sqlglot import exp

from dpproxy.errors import DPProxyError, NotSupported, PolicyViolation, SyntaxProblem, UndefinedParameter

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


# ---------------------------------------------------------------------------------------------
# Lexer
# ---------------------------------------------------------------------------------------------


class TokenKind(StrEnum):
    IDENT = "ident"  # unquoted identifier or keyword; value folded to lower case
    QUOTED = "quoted"  # "quoted identifier"; value unescaped, case kept
    STRING = "string"  # '…', E'…', U&'…', B'…', X'…', $tag$…$tag$; value unescaped
    NUMBER = "number"
    PARAM = "param"  # $1
    OP = "op"  # operator characters, :: and the punctuation ( ) [ ] , ; . :


@dataclass(frozen=True)
class Token:
    kind: TokenKind
    text: str  # as written
    value: str  # folded / unescaped
    start: int
    end: int

    def is_word(self, *words: str) -> bool:
        return self.kind is TokenKind.IDENT and self.value in words


class LexError(Exception):
    """Unterminated quote, string or comment (strict lexing only)."""


_OP_CHARS = set("+-*/<>=~!@#%^&|`?")
_IDENT_START = re.compile(r"[A-Za-z_\u0080-\uffff]")
_IDENT_REST = re.compile(r"[A-Za-z0-9_$\u0080-\uffff]*")
_NUMBER = re.compile(r"(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d+)?|0[xXoObB][0-9A-Fa-f_]+")
_DOLLAR_TAG = re.compile(r"\$([A-Za-z_\u0080-\uffff][A-Za-z0-9_\u0080-\uffff]*)?\$")
_PARAM = re.compile(r"\$\d+")


def tokenize(sql: str, *, strict: bool = True) -> list[Token]:
    """PostgreSQL's lexical structure: comments dropped, quotes and strings resolved.

    strict: raise LexError on an unterminated string, quoted identifier or comment; otherwise the
    rest of the text becomes one last token (split_statements must not fail on bad SQL).
    """
    return list(_lex(sql, strict))


def _lex(sql: str, strict: bool) -> Iterator[Token]:
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c.isspace():
            i += 1
            continue
        if sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        if sql.startswith("/*", i):
            i = _skip_block_comment(sql, i, strict)
            continue
        start = i
        # String prefixes: E'…' (backslash escapes), U&'…', B'…', X'…', N'…'.
        if c in "eE" and i + 1 < n and sql[i + 1] == "'":
            end, value = _scan_quoted(sql, i + 1, "'", backslash=True, strict=strict)
            yield Token(TokenKind.STRING, sql[start:end], value, start, end)
            i = end
            continue
        if c in "uU" and sql.startswith("&'", i + 1):
            end, value = _scan_quoted(sql, i + 2, "'", backslash=False, strict=strict)
            yield Token(TokenKind.STRING, sql[start:end], _unicode_unescape(value), start, end)
            i = end
            continue
        if c in "uU" and sql.startswith('&"', i + 1):
            end, value = _scan_quoted(sql, i + 2, '"', backslash=False, strict=strict)
            yield Token(TokenKind.QUOTED, sql[start:end], _unicode_unescape(value), start, end)
            i = end
            continue
        if c in "bBxXnN" and i + 1 < n and sql[i + 1] == "'":
            end, value = _scan_quoted(sql, i + 1, "'", backslash=False, strict=strict)
            yield Token(TokenKind.STRING, sql[start:end], value, start, end)
            i = end
            continue
        if c == "'":
            end, value = _scan_quoted(sql, i, "'", backslash=False, strict=strict)
            yield Token(TokenKind.STRING, sql[start:end], value, start, end)
            i = end
            continue
        if c == '"':
            end, value = _scan_quoted(sql, i, '"', backslash=False, strict=strict)
            yield Token(TokenKind.QUOTED, sql[start:end], value, start, end)
            i = end
            continue
        if c == "$":
            m = _PARAM.match(sql, i)
            if m:
                yield Token(TokenKind.PARAM, m.group(), m.group(), start, m.end())
                i = m.end()
                continue
            m = _DOLLAR_TAG.match(sql, i)
            if m:
                tag = m.group()
                close = sql.find(tag, m.end())
                if close < 0:
                    if strict:
                        raise LexError("unterminated dollar-quoted string")
                    yield Token(TokenKind.STRING, sql[start:], sql[m.end() :], start, n)
                    return
                end = close + len(tag)
                yield Token(TokenKind.STRING, sql[start:end], sql[m.end() : close], start, end)
                i = end
                continue
        if _IDENT_START.match(c):
            m = _IDENT_REST.match(sql, i + 1)
            end = m.end() if m else i + 1
            text = sql[start:end]
            yield Token(TokenKind.IDENT, text, text.lower(), start, end)
            i = end
            continue
        m = _NUMBER.match(sql, i)
        if m and (c.isdigit() or c == "."):
            # A number glued to letters (123abc) is a syntax error in PostgreSQL; keep the number.
            yield Token(TokenKind.NUMBER, m.group(), m.group().replace("_", ""), start, m.end())
            i = m.end()
            continue
        if c == ":" and sql.startswith("::", i):
            yield Token(TokenKind.OP, "::", "::", start, i + 2)
            i += 2
            continue
        if c in _OP_CHARS:
            end = i
            while end < n and sql[end] in _OP_CHARS:
                if sql.startswith("--", end) or sql.startswith("/*", end):
                    break
                end += 1
            text = sql[start:end]
            # PostgreSQL drops trailing + and - from a multi-character operator unless it also
            # contains one of ~ ! @ # % ^ & | ` ?, so that `a=-1` is `a = -1`.
            if len(text) > 1 and not set(text) & set("~!@#%^&|`?"):
                while len(text) > 1 and text[-1] in "+-":
                    text = text[:-1]
            end = start + len(text)
            yield Token(TokenKind.OP, text, text, start, end)
            i = end
            continue
        # ( ) [ ] , ; . : and anything unexpected: one character each.
        yield Token(TokenKind.OP, c, c, start, i + 1)
        i += 1


def _skip_block_comment(sql: str, i: int, strict: bool) -> int:
    depth, i, n = 0, i, len(sql)
    while i < n:
        if sql.startswith("/*", i):
            depth += 1
            i += 2
        elif sql.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    if strict:
        raise LexError("unterminated /* comment")
    return n


def _scan_quoted(sql: str, i: int, quote: str, *, backslash: bool, strict: bool) -> tuple[int, str]:
    """From the opening quote at i: (index after the closing quote, unescaped content)."""
    out: list[str] = []
    j, n = i + 1, len(sql)
    while j < n:
        c = sql[j]
        if backslash and c == "\\" and j + 1 < n:
            out.append(_backslash_escape(sql, j))
            j += _backslash_length(sql, j)
            continue
        if c == quote:
            if j + 1 < n and sql[j + 1] == quote:
                out.append(quote)
                j += 2
                continue
            return j + 1, "".join(out)
        out.append(c)
        j += 1
    if strict:
        what = "quoted identifier" if quote == '"' else "quoted string"
        raise LexError(f"unterminated {what}")
    return n, "".join(out)


_SIMPLE_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _backslash_length(sql: str, j: int) -> int:
    c = sql[j + 1]
    if c in "01234567":
        m = re.match(r"[0-7]{1,3}", sql[j + 1 :])
        return 1 + len(m.group()) if m else 2
    if c == "x":
        m = re.match(r"[0-9A-Fa-f]{1,2}", sql[j + 2 :])
        return 2 + (len(m.group()) if m else 0)
    if c == "u":
        return 6
    if c == "U":
        return 10
    return 2


def _backslash_escape(sql: str, j: int) -> str:
    c = sql[j + 1]
    try:
        if c in "01234567":
            m = re.match(r"[0-7]{1,3}", sql[j + 1 :])
            return chr(int(m.group(), 8)) if m else c
        if c == "x":
            m = re.match(r"[0-9A-Fa-f]{1,2}", sql[j + 2 :])
            return chr(int(m.group(), 16)) if m else "x"
        if c == "u":
            return chr(int(sql[j + 2 : j + 6], 16))
        if c == "U":
            return chr(int(sql[j + 2 : j + 10], 16))
    except ValueError:
        return c
    return _SIMPLE_ESCAPES.get(c, c)


def _unicode_unescape(value: str) -> str:
    def repl(m: re.Match[str]) -> str:
        if m.group() == "\\\\":
            return "\\"
        return chr(int(m.group()[2:] if m.group()[1] == "+" else m.group()[1:], 16))

    return re.sub(r"\\\\|\\\+[0-9A-Fa-f]{6}|\\[0-9A-Fa-f]{4}", repl, value)


# ---------------------------------------------------------------------------------------------
# Splitting a simple query
# ---------------------------------------------------------------------------------------------


def split_statements(sql: str) -> list[str]:
    """The statements of a simple query, in order, without their ';' and surrounding blanks.

    Semicolons inside strings ('…', E'…', $tag$…$tag$), quoted identifiers and comments (-- and
    nested /* */) do not split; statements holding nothing but blanks and comments are dropped.
    An unterminated string or comment runs to the end (the statement then fails when routed).
    """
    statements: list[str] = []
    begin: int | None = None
    last_end = 0
    for token in tokenize(sql, strict=False):
        if token.kind is TokenKind.OP and token.text == ";":
            if begin is not None:
                statements.append(sql[begin:last_end])
            begin = None
            continue
        if begin is None:
            begin = token.start
        last_end = token.end
    if begin is not None:
        statements.append(sql[begin:last_end])
    return statements


# ---------------------------------------------------------------------------------------------
# Routing
# ---------------------------------------------------------------------------------------------

CATALOG_SCHEMAS = frozenset({"pg_catalog", "information_schema"})

_ALLOWED = (
    "dpproxy answers queries (SELECT) on the exposed tables, catalog queries and session commands "
    "(SET, SHOW, RESET, BEGIN, COMMIT, ROLLBACK, DECLARE/FETCH/CLOSE, EXPLAIN)"
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
    "copy": "COPY",
    "listen": "LISTEN",
    "notify": "NOTIFY",
    "unlisten": "UNLISTEN",
    "vacuum": "VACUUM",
    "analyze": "ANALYZE",
    "analyse": "ANALYZE",
    "lock": "LOCK",
    "prepare": "PREPARE",
    "execute": "EXECUTE",
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


def _words(text: str) -> list[str]:
    return text.split()


# Keywords that quote_identifier() quotes (PostgreSQL's reserved, type-function-name and column-name
# keywords); unreserved keywords are left bare, as PostgreSQL does.
QUOTED_KEYWORDS = frozenset(
    _words(
        """all analyse analyze and any array as asc asymmetric authorization between bigint binary bit
    boolean both case cast char character check coalesce collate collation column concurrently
    constraint create cross current_catalog current_date current_role current_schema current_time
    current_timestamp current_user dec decimal default deferrable desc distinct do else end except
    exists extract false fetch float for foreign freeze from full grant greatest group grouping having
    ilike in initially inner inout int integer intersect interval into is isnull join json json_array
    json_arrayagg json_object json_objectagg lateral leading least left like limit localtime
    localtimestamp national natural nchar none normalize not notnull null nullif numeric offset on only
    or order out outer overlaps overlay placing position precision primary real references returning
    right row select session_user setof similar smallint some substring symmetric system_user table
    tablesample then time timestamp to trailing treat trim true union unique user using values varchar
    variadic verbose when where window with xmlattributes xmlconcat xmlelement xmlexists xmlforest
    xmlnamespaces xmlparse xmlpi xmlroot xmlserialize xmltable"""
    )
)


def quote_identifier(name: str) -> str:
    """PostgreSQL's quote_identifier: bare when it would read back as the same name, else quoted."""
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", name) and name not in QUOTED_KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def route(sql: str, exposed: Collection[str]) -> Statement:
    """Classify one statement (the session splits simple queries first), or raise DPProxyError.

    `exposed` holds the names of the policy's tables, as analysts write them (public schema).
    """
    text = _strip_statement(sql)
    try:
        tokens = tokenize(text)
    except LexError as exc:
        raise SyntaxProblem(f"{exc}", hint="close every quote, string and comment") from None
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
    return _Router(text, tokens, frozenset(exposed)).route()


def _strip_statement(sql: str) -> str:
    """The statement without surrounding blanks and trailing semicolons."""
    statements = split_statements(sql)
    if len(statements) <= 1:
        return statements[0] if statements else ""
    return sql.strip().rstrip(";").strip()


class _Router:
    def __init__(self, sql: str, tokens: list[Token], exposed: frozenset[str]) -> None:
        self.sql = sql
        self.tokens = tokens
        self.exposed = exposed
        self.pos = 0

    # -- token helpers -----------------------------------------------------------------------

    def peek(self, offset: int = 0) -> Token | None:
        i = self.pos + offset
        return self.tokens[i] if i < len(self.tokens) else None

    def at_word(self, *words: str) -> bool:
        token = self.peek()
        return token is not None and token.is_word(*words)

    def accept(self, *words: str) -> bool:
        if self.at_word(*words):
            self.pos += 1
            return True
        return False

    def expect(self, *words: str) -> Token:
        token = self.peek()
        if token is None or not token.is_word(*words):
            self.syntax_error(token)
        self.pos += 1
        return token  # type: ignore[return-value]

    def at_end(self) -> bool:
        return self.pos >= len(self.tokens)

    def rest(self) -> str:
        token = self.peek()
        return self.sql[token.start :] if token is not None else ""

    def syntax_error(self, token: Token | None) -> None:
        where = f'at or near "{token.text}"' if token is not None else "at end of input"
        raise SyntaxProblem(f"syntax error {where}")

    def expect_end(self) -> None:
        if not self.at_end():
            self.syntax_error(self.peek())

    def name(self) -> str:
        """An identifier: unquoted folded to lower case, quoted kept as written."""
        token = self.peek()
        if token is None or token.kind not in (TokenKind.IDENT, TokenKind.QUOTED):
            self.syntax_error(token)
        self.pos += 1
        return token.value  # type: ignore[union-attr]

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
        }.get(word)
        if handler is not None:
            return handler()
        if word in _WRITES:
            raise PolicyViolation(
                f"dpproxy is read-only: {_WRITES[word]} is not allowed",
                hint=_ALLOWED,
            )
        if word in _UNSUPPORTED:
            raise NotSupported(f"{_UNSUPPORTED[word]} is not supported by dpproxy", hint=_ALLOWED)
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
                raise NotSupported("SET TRANSACTION SNAPSHOT is not supported", hint=_ALLOWED)
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
        if self.at_word("time") and self._next_is("zone"):
            self.pos += 2
            name = "timezone"
        elif self.at_word("session") and self._next_is("authorization"):
            self.pos += 2
            name = "session_authorization"
        elif self.at_word("transaction") and self._next_is("isolation"):
            self.pos += 3
            name = "transaction_isolation"
        else:
            name = self.setting_name()
        self.expect_end()
        return Statement(Kind.SESSION, self.sql, "RESET", "reset", name)

    def show(self) -> Statement:
        self.expect("show")
        if self.at_word("time") and self._next_is("zone"):
            self.pos += 2
            name = "timezone"
        elif self.at_word("transaction") and self._next_is("isolation"):
            self.pos += 2
            self.expect("level")
            name = "transaction_isolation"
        elif self.at_word("session") and self._next_is("authorization"):
            self.pos += 2
            name = "session_authorization"
        else:
            name = self.setting_name()
        self.expect_end()
        return Statement(Kind.SESSION, self.sql, "SHOW", "show", name)

    def discard(self) -> Statement:
        self.expect("discard")
        what = self.expect("all", "plans", "sequences", "temp", "temporary").value
        what = "temp" if what == "temporary" else what
        self.expect_end()
        return Statement(Kind.SESSION, self.sql, f"DISCARD {what.upper()}", "discard", what)

    def deallocate(self) -> Statement:
        self.expect("deallocate")
        self.accept("prepare")
        if self.accept("all"):
            self.expect_end()
            return Statement(Kind.SESSION, self.sql, "DEALLOCATE ALL", "deallocate", "all")
        name = self.name()
        self.expect_end()
        return Statement(Kind.SESSION, self.sql, "DEALLOCATE", "deallocate", name)

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
            raise NotSupported("two-phase commit (COMMIT PREPARED) is not supported", hint=_ALLOWED)
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
            raise NotSupported("two-phase commit (ROLLBACK PREPARED) is not supported", hint=_ALLOWED)
        self.accept("work", "transaction")
        if self.accept("to"):
            self.accept("savepoint")
            name = self.name()
            self.expect_end()
            return Statement(Kind.TRANSACTION, self.sql, "ROLLBACK", "rollback_to", name)
        self.no_chain()
        return Statement(Kind.TRANSACTION, self.sql, "ROLLBACK", "rollback")

    def savepoint(self) -> Statement:
        self.expect("savepoint")
        name = self.name()
        self.expect_end()
        return Statement(Kind.TRANSACTION, self.sql, "SAVEPOINT", "savepoint", name)

    def release(self) -> Statement:
        self.expect("release")
        self.accept("savepoint")
        name = self.name()
        self.expect_end()
        return Statement(Kind.TRANSACTION, self.sql, "RELEASE", "release", name)

    # -- cursors -------------------------------------------------------------------------------

    def declare(self) -> Statement:
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
        inner = route(inner_sql, self.exposed)
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
        if self.accept("all"):
            self.expect_end()
            return Statement(Kind.CURSOR, self.sql, "CLOSE CURSOR ALL", "close", "all")
        name = self.name()
        self.expect_end()
        return Statement(Kind.CURSOR, self.sql, "CLOSE CURSOR", "close", name)

    # -- EXPLAIN -------------------------------------------------------------------------------

    def explain(self) -> Statement:
        self.expect("explain")
        analyze = False
        token = self.peek()
        if token is not None and token.kind is TokenKind.OP and token.text == "(":
            depth = 0
            options: list[list[str]] = [[]]
            while (token := self.peek()) is not None:
                self.pos += 1
                if token.kind is TokenKind.OP and token.text == "(":
                    depth += 1
                elif token.kind is TokenKind.OP and token.text == ")":
                    depth -= 1
                    if depth == 0:
                        break
                elif token.kind is TokenKind.OP and token.text == "," and depth == 1:
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
        inner = route(inner_sql, self.exposed)
        if inner.kind is not Kind.ENGINE:
            raise NotSupported(
                "EXPLAIN is supported for queries on exposed tables only",
                hint="EXPLAIN a SELECT that reads an exposed table",
            )
        return Statement(Kind.EXPLAIN, self.sql, "EXPLAIN", inner=inner)

    # -- queries -------------------------------------------------------------------------------

    def query(self) -> Statement:
        calls = self.setting_calls()
        if calls is not None:
            return Statement(Kind.SESSION, self.sql, "SELECT", "set_config", calls=calls)
        relations = _relations(self.sql, self.tokens)
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

    # -- SELECT set_config(…) ---------------------------------------------------------------------

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

    def _accept_op(self, text: str) -> bool:
        token = self.peek()
        if token is not None and token.kind is TokenKind.OP and token.text == text:
            self.pos += 1
            return True
        return False

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


# ---------------------------------------------------------------------------------------------
# Relations read by a query
# ---------------------------------------------------------------------------------------------


def _relations(sql: str, tokens: Sequence[Token]) -> list[tuple[str | None, str]]:
    """(schema or None, relation) for every relation the query reads; CTE names excluded.

    Raises for writes hidden in a query (data-modifying WITH, SELECT INTO) and row locks.
    """
    _check_query_tokens(tokens)
    try:
        trees = sqlglot.parse(_for_sqlglot(tokens, sql), read="postgres")
    except Exception:  # sqlglot raises several error types on what it cannot parse
        return _scan_relations(tokens)
    if len(trees) != 1 or trees[0] is None:
        return _scan_relations(tokens)
    tree = trees[0]
    if tree.find(exp.Insert, exp.Update, exp.Delete, exp.Merge):
        raise PolicyViolation(
            "dpproxy is read-only: data-modifying statements are not allowed", hint=_ALLOWED
        )
    if not isinstance(tree, (exp.Query, exp.Subquery, exp.Values)):
        return _scan_relations(tokens)
    if tree.find(exp.Into):
        raise PolicyViolation("dpproxy is read-only: SELECT … INTO is not allowed", hint=_ALLOWED)
    if tree.find(exp.Lock):
        raise NotSupported("row locking (FOR UPDATE / FOR SHARE) is not supported", hint=_ALLOWED)
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    found: list[tuple[str | None, str]] = []
    for table in tree.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            continue  # a table function such as generate_series(…) or unnest(…)
        name = table.this
        schema = table.args.get("db")
        schema_name = _ident_value(schema) if isinstance(schema, exp.Identifier) else None
        relation = _ident_value(name)
        if schema_name is None and relation in ctes:
            continue
        found.append((schema_name, relation))
    return found


def _ident_value(identifier: exp.Identifier) -> str:
    return identifier.this if identifier.quoted else identifier.this.lower()


def _check_query_tokens(tokens: Sequence[Token]) -> None:
    """Writes inside a query, found without a parser (a data-modifying WITH cannot hide from it)."""
    for i, token in enumerate(tokens):
        if token.kind is not TokenKind.IDENT:
            continue
        previous = tokens[i - 1] if i else None
        after_paren = previous is not None and previous.kind is TokenKind.OP and previous.text == "("
        if token.value in ("insert", "update", "delete", "merge") and after_paren:
            raise PolicyViolation(
                "dpproxy is read-only: data-modifying statements are not allowed", hint=_ALLOWED
            )


def _for_sqlglot(tokens: Sequence[Token], sql: str) -> str:
    """The query with the constructs sqlglot cannot parse replaced by equivalent text.

    OPERATOR(schema.op) becomes the bare operator and COLLATE clauses are dropped: neither changes
    which relations the query reads.
    """
    out: list[str] = []
    i, last = 0, 0
    while i < len(tokens):
        token = tokens[i]
        if token.is_word("operator") and i + 1 < len(tokens) and tokens[i + 1].text == "(":
            close = next((j for j in range(i + 2, len(tokens)) if tokens[j].text == ")"), None)
            if close is not None:
                out.append(sql[last : token.start])
                out.append(" " + tokens[close - 1].text + " ")
                last = tokens[close].end
                i = close + 1
                continue
        if token.is_word("collate") and i + 1 < len(tokens):
            j = i + 1
            while j + 2 < len(tokens) and tokens[j + 1].text == ".":
                j += 2
            out.append(sql[last : token.start])
            last = tokens[j].end
            i = j + 1
            continue
        i += 1
    out.append(sql[last:])
    return "".join(out)


_CLAUSE_ENDS = frozenset(
    {
        "where",
        "group",
        "having",
        "order",
        "limit",
        "offset",
        "fetch",
        "window",
        "union",
        "intersect",
        "except",
        "for",
        "on",
        "using",
        "returning",
        "into",
        "select",
        "values",
    }
)
_JOIN_WORDS = frozenset({"join", "cross", "natural", "inner", "left", "right", "full", "outer", "lateral"})


def _scan_relations(tokens: Sequence[Token]) -> list[tuple[str | None, str]]:
    """Relations in FROM and JOIN positions, found from tokens alone (for SQL sqlglot cannot parse).

    A name after FROM, JOIN or a comma of a FROM list is a relation unless a parenthesis or a
    function call follows; WITH names are CTEs. Conservative: what looks like a relation counts.
    """
    ctes = _cte_names(tokens)
    found: list[tuple[str | None, str]] = []
    # A stack of "in a FROM list" flags, one per parenthesis depth.
    in_from = [False]
    expect_relation = False
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.kind is TokenKind.OP and token.text in ("(", "["):
            in_from.append(False)
            expect_relation = False
            i += 1
            continue
        if token.kind is TokenKind.OP and token.text in (")", "]"):
            if len(in_from) > 1:
                in_from.pop()
            i += 1
            continue
        if token.kind is TokenKind.IDENT and token.value == "from":
            in_from[-1] = True
            expect_relation = True
            i += 1
            continue
        if token.kind is TokenKind.IDENT and token.value in _JOIN_WORDS:
            if token.value == "join":
                in_from[-1] = True
                expect_relation = True
            i += 1
            continue
        if token.kind is TokenKind.IDENT and token.value in _CLAUSE_ENDS:
            in_from[-1] = False
            expect_relation = False
            i += 1
            continue
        if token.kind is TokenKind.OP and token.text == "," and in_from[-1]:
            expect_relation = True
            i += 1
            continue
        if expect_relation and token.kind in (TokenKind.IDENT, TokenKind.QUOTED):
            j, parts = i, [token.value]
            while (
                j + 2 < len(tokens)
                and tokens[j + 1].text == "."
                and tokens[j + 2].kind
                in (
                    TokenKind.IDENT,
                    TokenKind.QUOTED,
                )
            ):
                parts.append(tokens[j + 2].value)
                j += 2
            following = tokens[j + 1] if j + 1 < len(tokens) else None
            is_call = following is not None and following.text == "("
            if not is_call and not (token.kind is TokenKind.IDENT and token.value == "only"):
                schema = parts[-2] if len(parts) >= 2 else None
                if not (schema is None and parts[-1] in ctes):
                    found.append((schema, parts[-1]))
            expect_relation = token.kind is TokenKind.IDENT and token.value == "only"
            i = j + 1
            continue
        expect_relation = False
        i += 1
    return found


def _cte_names(tokens: Sequence[Token]) -> set[str]:
    names: set[str] = set()
    for i, token in enumerate(tokens):
        if token.kind in (TokenKind.IDENT, TokenKind.QUOTED) and i + 1 < len(tokens):
            nxt = tokens[i + 1]
            prev = tokens[i - 1] if i else None
            starts = prev is not None and (prev.is_word("with", "recursive") or prev.text == ",")
            if starts and (nxt.is_word("as") or nxt.text == "("):
                names.add(token.value)
    return names


def is_catalog_relation(schema: str | None, name: str) -> bool:
    """A relation the shadow catalog answers for: pg_catalog.*, information_schema.*, unqualified pg_*."""
    return schema in CATALOG_SCHEMAS or (schema is None and name.startswith("pg_"))


__all__ = [
    "MAX_PARAMETERS",
    "DPProxyError",
    "Kind",
    "SettingCall",
    "Statement",
    "Token",
    "TokenKind",
    "UndefinedParameter",
    "quote_identifier",
    "route",
    "split_statements",
    "tokenize",
]
