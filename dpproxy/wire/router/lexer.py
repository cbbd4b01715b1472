"""PostgreSQL's lexical structure: tokens, the statements of a simple query, identifiers as written.

This module turns text into tokens (comments dropped, quotes and strings resolved), splits a simple
query into its statements, and quotes identifiers as PostgreSQL's quote_identifier does. It knows
no grammar beyond that: what a statement means is the classifier's business, and it never sees a
session, the catalog or data.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum

from dpproxy.errors import SyntaxProblem


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
_KEEPS_TRAILING_SIGNS = re.compile(r"[~!@#%^&|`?]")
_OCTAL = re.compile(r"[0-7]{1,3}")
_HEX = re.compile(r"[0-9A-Fa-f]{1,2}")


def tokenize(sql: str, *, strict: bool = True) -> list[Token]:
    """PostgreSQL's lexical structure: comments dropped, quotes and strings resolved.

    strict: raise LexError on an unterminated string, quoted identifier or comment; otherwise the
    rest of the text becomes one last token (split_statements must not fail on bad SQL).
    """
    return list(lex(sql, strict=strict))


def lex(sql: str, *, strict: bool = True) -> Iterator[Token]:
    """The tokens of `sql` one at a time, as `tokenize` reads them: a caller may stop early (the
    statement limits do, dpproxy.wire.router.limits). Linear in the length of the text."""
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
            # PostgreSQL drops trailing + and - from a multi-character operator unless it also
            # contains one of ~ ! @ # % ^ & | ` ?, so that `a=-1` is `a = -1`.
            run_end = end
            if end - start > 1 and not _KEEPS_TRAILING_SIGNS.search(sql, start, end):
                while end - start > 1 and sql[end - 1] in "+-":
                    end -= 1
            text = sql[start:end]
            yield Token(TokenKind.OP, text, text, start, end)
            # The signs dropped are one operator each (as reading the run again from each would
            # find, in quadratic time on a long run).
            for k in range(end, run_end):
                yield Token(TokenKind.OP, sql[k], sql[k], k, k + 1)
            i = run_end
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
    stop = _STOPS[quote, backslash]  # the next quote (or backslash): the text between is kept as is
    while (found := stop.search(sql, j)) is not None:
        k = found.start()
        out.append(sql[j:k])
        if sql[k] == "\\":
            if k + 1 < n:
                out.append(_backslash_escape(sql, k))
                j = k + _backslash_length(sql, k)
            else:
                out.append("\\")
                j = n
            continue
        if k + 1 < n and sql[k + 1] == quote:
            out.append(quote)
            j = k + 2
            continue
        return k + 1, "".join(out)
    out.append(sql[j:])
    if strict:
        what = "quoted identifier" if quote == '"' else "quoted string"
        raise LexError(f"unterminated {what}")
    return n, "".join(out)


_STOPS = {
    ("'", False): re.compile("'"),
    ("'", True): re.compile(r"['\\]"),
    ('"', False): re.compile('"'),
}


_SIMPLE_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _backslash_length(sql: str, j: int) -> int:
    # Matched in place: a slice of the rest of the text per escape would make lexing quadratic.
    c = sql[j + 1]
    if c in "01234567":
        m = _OCTAL.match(sql, j + 1)
        return 1 + len(m.group()) if m else 2
    if c == "x":
        m = _HEX.match(sql, j + 2)
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
            m = _OCTAL.match(sql, j + 1)
            return chr(int(m.group(), 8)) if m else c
        if c == "x":
            m = _HEX.match(sql, j + 2)
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
    return split_tokens(sql, tokenize(sql, strict=False))


def statement_offsets(sql: str, statements: Sequence[str]) -> list[int]:
    """Where each of `split_statements(sql)` starts in `sql` (errors' positions count from there)."""
    offsets, searched = [], 0
    for statement in statements:
        offsets.append(max(sql.find(statement, searched), 0))
        searched = offsets[-1] + len(statement)
    return offsets


def split_tokens(sql: str, tokens: Iterable[Token]) -> list[str]:
    """`split_statements` from the text's tokens, already read (leniently)."""
    statements: list[str] = []
    begin: int | None = None
    last_end = 0
    for token in tokens:
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


class TokenReader:
    """A position in one statement's tokens, with the helpers a hand-written parser needs."""

    def __init__(self, sql: str, tokens: list[Token]) -> None:
        self.sql = sql
        self.tokens = tokens
        self.pos = 0

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

    def _accept_op(self, op: str) -> bool:
        """Step over the operator or punctuation `op` ("(", ",", "::" …) if it comes next."""
        token = self.peek()
        if token is not None and token.kind is TokenKind.OP and token.text == op:
            self.pos += 1
            return True
        return False

    def at_end(self) -> bool:
        return self.pos >= len(self.tokens)

    def rest(self) -> str:
        token = self.peek()
        return self.sql[token.start :] if token is not None else ""

    def syntax_error(self, token: Token | None) -> None:
        where = f'at or near "{token.text}"' if token is not None else "at end of input"
        position = token.start + 1 if token is not None else len(self.sql) + 1
        raise SyntaxProblem(f"syntax error {where}", position=position)

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
